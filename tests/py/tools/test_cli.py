"""``hxmlir run`` / ``demo`` / ``export`` command lines (hxmlir.tools.cli): paths and error messages.

A small artifact (``hx.matmul_q``: ``f32[2,3], q8[3,4] -> f32[2,4]``) stands in
for the demo model, so each case is one in-process ``cli.main`` call; every
error is one line on stderr naming the file, the argument and what was expected.
"""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hxmlir as hx
from hxmlir import export as hxe
from hxmlir import formats
from hxmlir.tools import cli, cli_common, demo, npzio


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """(dir, artifact path, inputs path, expected output) for hx.matmul_q."""
  d = tmp_path_factory.mktemp("cli")
  x = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3) - 2.5
  qw = hx.quantize(jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4) / 7 - 0.8)
  (d / "mm.hxa").write_bytes(bytes(hxe.export(hx.matmul_q)(x, qw).serialize()))
  np.savez(d / "in.npz", **npzio.flatten_values([x, qw]))
  return d, d / "mm.hxa", d / "in.npz", np.asarray(hx.matmul_q(x, qw))


def _err(capsys) -> str:
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


def _inputs(files, name: str, edit) -> str:
  d, _, inp, _ = files
  arrays = dict(np.load(inp))
  edit(arrays)
  np.savez(d / name, **arrays)
  return str(d / name)


# --- output paths -----------------------------------------------------------------------------

@pytest.mark.parametrize("name, written", [("nu", "nu.npz"), ("out.npz", "out.npz"),
                                           ("res.data", "res.data.npz")])
def test_run_reports_the_file_it_wrote(files, capsys, name, written):
  d, art, inp, want = files
  assert cli.main(["run", str(art), "--inputs", str(inp), "--output", str(d / name)]) == 0
  out, err = capsys.readouterr()
  assert out == "" and err.strip().endswith(f"-> {d / written}")
  with np.load(d / written) as z:
    np.testing.assert_array_equal(z["a0"], want)


def test_run_with_output_prints_its_status_line_on_stderr_alone(files, capsys):
  # it was printed on stdout, where nothing but the requested output goes (docs/cli.md)
  d, art, inp, _ = files
  assert cli.main(["run", str(art), "--inputs", str(inp), "--output", str(d / "o.npz")]) == 0
  out, err = capsys.readouterr()
  assert out == ""
  assert err == f"ran {art} on 2 arguments: float32[2,4] -> {d / 'o.npz'}\n"


def test_run_refuses_a_directory_as_output(files, capsys, tmp_path):
  _, art, inp, _ = files
  (tmp_path / "d.npz").mkdir()
  for out, named in ((tmp_path, tmp_path), (f"{tmp_path}/", f"{tmp_path}/"),
                     (tmp_path / "d", tmp_path / "d.npz")):
    assert cli.main(["run", str(art), "--inputs", str(inp), "--output", str(out)]) == 1
    assert (f"IsADirectoryError: --output {named}: is a directory; give an .npz file name"
            in _err(capsys))


def test_npz_path_appends_like_numpy_savez(tmp_path):
  assert cli_common.npz_path(str(tmp_path / "a"), "--inputs-out") == str(tmp_path / "a.npz")
  assert cli_common.npz_path(str(tmp_path / "a.npz"), "--inputs-out") == str(tmp_path / "a.npz")
  with pytest.raises(IsADirectoryError, match="--inputs-out .*: is a directory"):
    cli_common.npz_path(str(tmp_path), "--inputs-out")


# --- inputs that do not match the artifact -------------------------------------------------------

def _drop(key):
  return lambda a: a.pop(key)


@pytest.mark.parametrize("edit, message", [
    (_drop("a0"), r"argument 0 \(f32\[2,3\]\) is missing: no array 'a0'; matmul_q takes 2 "
                  r"arguments \(f32\[2,3\], q8\[3,4\]\) -> \(f32\[2,4\]\), named a0, "
                  r"a1.qvalue, a1.scale"),
    (_drop("a1.scale"), r"argument 1 \(q8\[3,4\]\) is missing: no array 'a1.scale'"),
    (lambda a: a.update(a2=np.ones(3, np.float32)), r"unexpected arrays \['a2'\]; matmul_q "
                                                    r"takes 2 arguments"),
    (lambda a: a.update(a0=np.array([["ab", "c", "d"]] * 2)),
     r"argument 0 \(f32\[2,3\]\): array 'a0' is <U2\[2,3\], expected float32\[2,3\]"),
    (lambda a: a.update(a0=a["a0"].astype(np.float64)),
     r"argument 0 \(f32\[2,3\]\): array 'a0' is float64\[2,3\], expected float32\[2,3\]"),
    (lambda a: a.update(a0=a["a0"].T),
     r"argument 0 \(f32\[2,3\]\): array 'a0' is float32\[3,2\], expected float32\[2,3\]"),
    (lambda a: a.update({"a1.qvalue": a["a1.qvalue"].astype(np.int32)}),
     r"argument 1 \(q8\[3,4\]\): array 'a1.qvalue' is int32\[3,4\], expected int8\[3,4\]"),
])
def test_run_names_the_argument_that_does_not_match(files, capsys, edit, message):
  _, art, _, _ = files
  path = _inputs(files, "bad.npz", edit)
  assert cli.main(["run", str(art), "--inputs", path]) == 1
  err = _err(capsys)
  assert err.startswith(f"hxmlir run: error: InputsError: --inputs {path}: ")
  assert re.search(message, err), err


@pytest.mark.parametrize("content", [b"hello\n", b"\x93NUMPY" + b"\0" * 100, b"PK" + b"x" * 50])
def test_run_says_when_inputs_are_not_an_npz(files, capsys, tmp_path, content):
  _, art, _, _ = files
  (tmp_path / "in.npz").write_bytes(content)
  assert cli.main(["run", str(art), "--inputs", str(tmp_path / "in.npz")]) == 1
  err = _err(capsys)
  assert f"--inputs {tmp_path / 'in.npz'}: not an .npz file" in err
  # what it suggests works for an artifact of a function (it named `hxmlir export
  # --inputs-out`, which export refuses without --model)
  assert err.endswith("(write one with numpy.savez, keyed as `hxmlir inspect ARTIFACT` lists; "
                      "for a built-in model, `hxmlir export --model M --inputs-out NPZ` writes "
                      "its inputs)"), err


@pytest.mark.parametrize("content", [b"hello\n", b"a text file that is long enough\n" * 4,
                                     bytes(range(256)) * 4])
def test_run_says_when_the_artifact_is_not_an_hxmlir_artifact(files, capsys, tmp_path, content):
  _, _, inp, _ = files
  (tmp_path / "m.hxa").write_bytes(content)
  assert cli.main(["run", str(tmp_path / "m.hxa"), "--inputs", str(inp)]) == 1
  err = _err(capsys)
  assert err.startswith(f"hxmlir run: error: ArtifactError: {tmp_path / 'm.hxa'}: ")
  assert "not an hxmlir artifact" in err or "not a readable jax.export artifact" in err


@pytest.mark.parametrize("command", ["inspect", "run"])
def test_an_artifact_path_that_cannot_be_read_is_one_artifact_error(files, capsys, tmp_path,
                                                                     command):
  # a directory was "IsADirectoryError: [Errno 21] Is a directory: '/tmp'", a missing file
  # "FileNotFoundError: [Errno 2] ..."; GGUF paths say "GGUFError: ...: not a readable GGUF file"
  _, _, inp, _ = files
  give = ("an artifact written by `hxmlir export` or a GGUF checkpoint" if command == "inspect"
          else "an artifact written by `hxmlir export` (or hxmlir.export's serialize())")
  more = ["--inputs", str(inp)] if command == "run" else []
  for path, why in ((tmp_path, "it is a directory"),
                    (tmp_path / "none.hxa", "No such file or directory")):
    assert cli.main([command, str(path), *more]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"hxmlir {command}: error: ArtifactError: {path}: not a readable file "
                   f"({why}); give {give}\n")


# --- demo: options checked before the model is loaded ----------------------------------------

@pytest.fixture
def no_model(monkeypatch):
  def fail(*a, **k):
    raise AssertionError("the model was loaded before the command line was checked")
  monkeypatch.setattr(demo, "build_model", fail)
  monkeypatch.setattr(demo, "run_demo", fail)


def test_demo_out_must_be_a_directory(no_model, capsys, tmp_path):
  (tmp_path / "f").write_text("x")
  assert cli.main(["demo", "--out", str(tmp_path / "f")]) == 1
  assert f"NotADirectoryError: --out {tmp_path / 'f'}: not a directory" in _err(capsys)


@pytest.mark.parametrize("command", ["demo", "lower"])
@pytest.mark.parametrize("pipeline, message", [("bogus", "unknown pass 'bogus'"),
                                               ("hx-verify{nope=1}", "nope")])
def test_pipeline_is_checked_before_the_model_loads(no_model, capsys, command, pipeline, message):
  assert cli.main([command, "--pipeline", pipeline]) == 1
  err = _err(capsys)
  assert f"hxmlir {command}: error: PipelineError:" in err and message in err


# --- run without --output: the values ---------------------------------------------------------

def test_run_prints_the_result_values(files, capsys):
  _, art, inp, want = files
  assert cli.main(["run", str(art), "--inputs", str(inp)]) == 0
  out, err = capsys.readouterr()
  assert out == f"a0: f32[2,4]\n{np.array2string(want)}\n"  # the results alone
  assert err == f"ran {art} on 2 arguments: float32[2,4]\n"


def test_run_prints_hi_results_per_component_and_summarises_large_ones(capsys, tmp_path):
  x = np.arange(6, dtype=np.float32).reshape(2, 3) / 5 - 0.4
  fns = {"q": hx.quantize,
         "tup": lambda x: hx.make_tup(x[0], hx.outer(x[0], x[1])),
         "big": lambda x: jnp.tile(x, (200, 10))}   # f32[400,30]: 12000 > numpy's threshold
  np.savez(tmp_path / "in.npz", a0=x)
  printed = {}
  for name, fn in fns.items():
    (tmp_path / f"{name}.hxa").write_bytes(bytes(hxe.export(fn, platforms=["cpu"])(x).serialize()))
    assert cli.main(["run", str(tmp_path / f"{name}.hxa"), "--inputs", str(tmp_path / "in.npz")]) == 0
    printed[name] = capsys.readouterr().out
  q = hx.quantize(x)
  assert printed["q"] == (f"a0: q8[2,3]\na0.qvalue: i8[2,3]\n{np.array2string(np.asarray(q.qvalue))}\n"
                          f"a0.scale: f32[2]\n{np.array2string(np.asarray(q.scale))}\n")
  assert printed["tup"] == (f"a0: Tup{{f32[3],r1[3,3]}}\na0.0: f32[3]\n{np.array2string(x[0])}\n"
                            f"a0.1.col: f32[3]\n{np.array2string(x[0])}\n"
                            f"a0.1.row: f32[3]\n{np.array2string(x[1])}\n")
  big = printed["big"].splitlines()
  assert big[0] == "a0: f32[400,30]"
  assert "\n".join(big[1:]) == np.array2string(np.tile(x, (200, 10)))
  # summarised: 3 + 3 rows around a "..." row, each row 3 + 3 values around "..."
  assert len(big) < 20 and " ... " in big[1] and any(ln.strip() == "..." for ln in big), big


@pytest.mark.parametrize("name", sorted(n for n, f in formats.FORMATS.items() if f.offset))
def test_offset_formats_cross_run_and_inspect_with_their_offset(capsys, tmp_path, name):
  # hxmlir run failed on every u4o/q8o artifact ("zip() argument 2 is longer than
  # argument 1"): the .npz keys had no .offset
  f = formats.FORMATS[name]
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((2, 64)).astype(np.float32))
  q = hx.make_qarray(formats.store(jnp.asarray(rng.integers(0, 16, (64, 32)).astype(np.uint8)
                                               if f.pack == 2 else
                                               rng.integers(-128, 128, (64, 32)).astype(np.int8)), f),
                     jnp.asarray(rng.uniform(0.01, 0.1, (64, 1)).astype(f.scale_dtype)),
                     jnp.asarray(rng.uniform(-1, 1, (64, 1)).astype(f.scale_dtype)))

  def fn(x, q):
    return hx.matmul_q(x, q), q

  art = tmp_path / "f.hxa"
  art.write_bytes(bytes(hxe.export(fn, platforms=["cpu"])(x, q).serialize()))
  assert cli.main(["inspect", str(art), "--json"]) == 0
  info = json.loads(capsys.readouterr().out)
  keys = ["a1.qvalue", "a1.scale", "a1.offset"]
  assert [e["npz_keys"] for e in info["inputs"]] == [["a0"], keys]
  assert [e["npz_keys"] for e in info["outputs"]] == [["a0"], keys]
  assert cli.main(["inspect", str(art)]) == 0
  assert "(npz: a1.qvalue, a1.scale, a1.offset)" in capsys.readouterr().out
  np.savez(tmp_path / "in.npz", **npzio.flatten_values([x, q]))
  assert cli.main(["run", str(art), "--inputs", str(tmp_path / "in.npz"),
                   "--output", str(tmp_path / "out.npz")]) == 0, capsys.readouterr().err
  got = np.load(tmp_path / "out.npz")
  want_y, want_q = jax.jit(fn)(x, q)
  np.testing.assert_array_equal(got["a0"], want_y)
  for k, c in zip(keys, hx.qarray_parts(want_q), strict=True):
    np.testing.assert_array_equal(npzio.typed(got[k], c.dtype), np.asarray(c))
  back = npzio.unflatten_values({"a0": got["a0"], **{k: got[k] for k in keys}})
  assert jax.typeof(back[0]) == jax.typeof(want_y) and jax.typeof(back[1]) == jax.typeof(q)
