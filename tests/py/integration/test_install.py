"""hx.install(): the pass pipeline inside jax.jit, .lower(), .compile() and jax.export.

A test-only pass, ``test-negate-results`` (registered for these tests in
``PASS_REGISTRY``), negates every result of ``main``: its effect is visible
both in the IR and in the numbers, so each test can tell exactly which
lowerings went through the pipeline.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import plain_corpus
import pytest
from hx_testing import without_locations
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as func_dialect
from jaxlib.mlir.dialects import stablehlo

import hxmlir as hx
from hxmlir import _jax, targets
from hxmlir.integration import installation as inst  # noqa: E402
from hxmlir.passes import PASS_REGISTRY, PipelineError
from hxmlir.passes.base import HxPass, PassResult
from hxmlir.types import hiprim


@dataclass(frozen=True)
class NegateResults(HxPass):
  """Test pass: negates each floating-point result of ``main``."""
  name: ClassVar[str] = "test-negate-results"

  def apply(self, module, diags):
    n = 0
    for op in module.regions[0].blocks[0].operations:
      if isinstance(op, func_dialect.FuncOp) and op.sym_name.value == "main":
        ret = op.regions[0].blocks[0].operations[-1]
        with ir.InsertionPoint(ret), ret.location:
          for i, v in enumerate(ret.operands):
            if isinstance(ir.RankedTensorType(v.type).element_type, ir.FloatType):
              ret.operands[i] = stablehlo.negate(v)
              n += 1
    return PassResult(changed=n > 0, stats={"results negated": n})


NEGATE = NegateResults.name


@pytest.fixture(autouse=True)
def clean(uninstalled, monkeypatch):
  """Each test starts and ends uninstalled, with the test pass registered and fresh stats."""
  monkeypatch.setitem(PASS_REGISTRY, NEGATE, lambda: NegateResults)
  yield
  hx.uninstall()
  inst._pipelines.clear()  # parsed pipelines that hold the test pass


def _x():
  return jnp.asarray(np.random.default_rng(0).standard_normal((4, 8)), jnp.float32)


def _w():
  return jnp.asarray(np.random.default_rng(1).standard_normal((8, 3)), jnp.float32)


def qmlp(x, w):
  """Plain-array signature, hx ops inside: f32[4,8], f32[8,3] -> f32[4,3]."""
  return jnp.tanh(hx.matmul_q(x, hx.quantize(w)))


def _ref(x, w):
  return np.asarray(qmlp(x, w))  # eager: no lowering through jit's module path


# --- the hook sees every path -------------------------------------------------

def test_jit_lower_compile_and_export_see_the_processed_module():
  x, w = _x(), _w()
  ref = _ref(x, w)
  f = jax.jit(qmlp)
  np.testing.assert_array_equal(f(x, w), ref)
  hx.install(NEGATE)
  np.testing.assert_array_equal(f(x, w), -ref)  # the same jit object: no stale executable
  lowered = f.lower(x, w)
  assert "stablehlo.negate" in lowered.as_text()
  np.testing.assert_array_equal(lowered.compile()(x, w), -ref)
  exp = jax.export.export(f)(x, w)
  assert "stablehlo.negate" in exp.mlir_module()
  hx.uninstall()
  np.testing.assert_array_equal(f(x, w), ref)
  assert "stablehlo.negate" not in f.lower(x, w).as_text()
  # The artifact keeps the processed module. (Called while installed, the module
  # that embeds it would go through the pipeline again, like any other.)
  np.testing.assert_array_equal(exp.call(x, w), -ref)


def test_stats_count_modules_rewrites_and_time():
  x, w = _x(), _w()
  hx.install(NEGATE)
  jax.jit(lambda x, w: qmlp(x, w)).lower(x, w)  # new functions: JAX's caches miss
  jax.jit(lambda x: x + 1.0).lower(x)  # plain: skipped
  s = hx.stats()
  assert s[NEGATE]["modules"] == 1 and s[NEGATE]["rewrites"] == 1
  assert s[NEGATE]["results negated"] == 1 and s[NEGATE]["seconds"] > 0
  assert s["hx-verify"]["modules"] == 1 and s["hx-verify"]["rewrites"] == 0
  assert s["total"]["modules"] == 2 and s["total"]["skipped"] == 1
  assert hx.stats(reset=True) == s and hx.stats() == {}


def test_export_lowering_runs_the_export_pipeline(monkeypatch):
  """Lowering for jax.export is told apart: its pipeline gets hx-check-export (here a stand-in)."""
  monkeypatch.setattr(inst, "CHECK_EXPORT_PASS", NEGATE)
  x, w = _x(), _w()
  ref = _ref(x, w)
  hx.install("hx-verify")
  assert inst.current_pipeline() == "hx-verify"
  assert inst.current_pipeline(for_export=True) == f"hx-verify,{NEGATE}"
  np.testing.assert_array_equal(jax.jit(qmlp)(x, w), ref)
  assert "stablehlo.negate" not in jax.jit(qmlp).lower(x, w).as_text()
  exp = jax.export.export(jax.jit(qmlp))(x, w)
  np.testing.assert_array_equal(exp.call(x, w), -ref)


def test_export_pipeline_ends_with_check_export_when_registered():
  hx.install()
  pipe = inst.current_pipeline(for_export=True)
  if "hx-check-export" in PASS_REGISTRY:
    assert pipe == "hx-verify,hx-fold-scales,hx-check-export"
  else:
    assert pipe == "hx-verify,hx-fold-scales"
  assert inst.current_pipeline() == "hx-verify,hx-fold-scales"


def _triton(name):
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0
  return jax.jit(lambda x: pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), name=name,
      compiler_params=pltriton.CompilerParams())(x))


def test_export_checks_plain_modules_on_targets_hxmlir_allowed():
  """A plain module calling the Triton target (on JAX's list only thanks to hxmlir) is
  checked by hx-check-export -- registered kernels pass unchanged, others are refused --
  while the same kernels lowered for execution, or exported without install, are untouched."""
  if "hx-check-export" not in PASS_REGISTRY:
    pytest.skip("hx-check-export is not registered")
  k = targets.register_kernel(targets.TRITON, "hx_test_plus_one", 1, ("cuda",), owner="test")
  y = jnp.ones((8, 128), jnp.float32)
  try:
    hx.install()
    assert targets.TRITON in inst._widened_targets()
    ours = jax.export.export(_triton(k.ir_name), platforms=["cuda"])(y)
    assert k.ir_name in ours.mlir_module()
    s = hx.stats()
    assert s["hx-check-export"]["modules"] == 1 and "hx-verify" not in s  # checked only
    with pytest.raises(hx.VerificationError, match="'someone_elses' is not registered"):
      jax.export.export(_triton("someone_elses"), platforms=["cuda"])(y)
    hx.uninstall()
    with pytest.raises(ValueError, match="custom calls whose targets have no compatibility"):
      jax.export.export(_triton(k.ir_name), platforms=["cuda"])(y)  # JAX's own check again
  finally:
    hx.uninstall()
    targets.unregister_kernel(k)


# --- install / uninstall semantics ----------------------------------------------

def test_install_is_idempotent_and_uninstall_restores_jax():
  original = _jax.current_lower_jaxpr_to_module()
  hx.uninstall()  # without install: no-op
  assert not hx.is_installed() and _jax.current_lower_jaxpr_to_module() is original
  hx.install(NEGATE)
  hx.install(NEGATE)
  assert hx.is_installed() and _jax.current_lower_jaxpr_to_module() is not original
  x, w = _x(), _w()
  np.testing.assert_array_equal(jax.jit(qmlp)(x, w), -_ref(x, w))  # negated once, not twice
  hx.uninstall()
  assert not hx.is_installed() and _jax.current_lower_jaxpr_to_module() is original
  hx.uninstall()
  assert _jax.current_lower_jaxpr_to_module() is original


def test_uninstall_restores_the_export_allow_list():
  """The stand-in for JAX's allow-list goes while nothing is installed, JAX's own set is back."""
  before = _jax.export_allowed_custom_call_targets()
  hx.install()
  with hx.installed():
    assert _jax.export_allowed_custom_call_targets() >= before
  hx.uninstall()
  assert _jax.export_allowed_custom_call_targets() == before
  assert _jax.jax_stable_custom_call_targets() == before


def test_import_patches_vmap_matchaxis_for_good_and_hands_arrays_to_jax(monkeypatch):
  """What importing hxmlir changes in JAX for good (docs/passes.md): ``vmap``'s
  ``matchaxis`` is hxmlir's wrapper, before install and after uninstall, since hi types
  map under vmap without install. Every call on arrays reaches JAX's own rule with the
  same arguments and gives its result or its error."""
  hx.install()
  hx.uninstall()
  assert _jax.current_matchaxis() is hiprim._matchaxis
  calls = []

  def spy(*args):
    calls.append(args)
    return _jax.jax_matchaxis(*args)
  monkeypatch.setattr(hiprim, "jax_matchaxis", spy)
  x = jnp.arange(6.0).reshape(2, 3)
  rows, c = jax.vmap(lambda r, c: (r * 2, c), in_axes=(0, None), out_axes=(1, 0))(x, 1.0)
  np.testing.assert_array_equal(rows, (2 * x).T)
  np.testing.assert_array_equal(c, [1.0, 1.0])
  assert len(calls) == 2
  with pytest.raises(ValueError, match="got axis spec None but output was batched on axis 0"):
    jax.vmap(lambda r: r, out_axes=None)(x)
  assert len(calls) == 3
  _jax.unpatch_matchaxis(hiprim._matchaxis)  # JAX alone gives the same answers
  try:
    assert _jax.current_matchaxis() is _jax.jax_matchaxis
    rows2, c2 = jax.vmap(lambda r, c: (r * 2, c), in_axes=(0, None), out_axes=(1, 0))(x, 1.0)
    np.testing.assert_array_equal(rows2, rows)
    np.testing.assert_array_equal(c2, c)
  finally:
    _jax.patch_matchaxis(hiprim._matchaxis)
  assert _jax.current_matchaxis() is hiprim._matchaxis


def test_reinstall_replaces_the_pipeline():
  x, w = _x(), _w()
  hx.install(NEGATE)
  hx.install("hx-verify")
  np.testing.assert_array_equal(jax.jit(qmlp)(x, w), _ref(x, w))
  assert inst.current_pipeline() == "hx-verify"


def test_verify_flag():
  hx.install(NEGATE)
  assert inst.current_pipeline() == f"hx-verify,{NEGATE}"
  hx.install(NEGATE, verify=False)
  assert inst.current_pipeline() == NEGATE
  hx.install(verify=False)
  assert inst.current_pipeline() == "hx-fold-scales"
  hx.install(f"{NEGATE},hx-verify")  # already there: kept where the user put it
  assert inst.current_pipeline() == f"{NEGATE},hx-verify"


def test_bad_pipeline_raises_and_changes_nothing():
  hx.install("hx-verify")
  with pytest.raises(PipelineError, match="hx-fold-scales"):  # the message lists valid passes
    hx.install("hx-verify,hx-fold-scalez")
  assert inst.current_pipeline() == "hx-verify"
  with pytest.raises(TypeError, match="pipeline must be a string"):
    hx.install(["hx-verify"])
  # the pass framework's own parser decides: empty elements are errors here too
  for bad in ("hx-verify,,", ",", "hx-fold-scales,"):
    with pytest.raises(PipelineError, match="empty pass name"):
      hx.install(bad)
    with pytest.raises(PipelineError, match="empty pass name"):
      hx.installed(bad).__enter__()
  assert inst.current_pipeline() == "hx-verify"
  hx.install("builtin.module(hx-fold-scales{impl=reference})")
  assert inst.current_pipeline() == "hx-verify,hx-fold-scales{impl=reference}"


def test_installed_context_manager_nests_and_restores():
  x, w = _x(), _w()
  ref = _ref(x, w)
  f = jax.jit(qmlp)
  with hx.installed(NEGATE):
    assert hx.is_installed()
    np.testing.assert_array_equal(f(x, w), -ref)
    with hx.installed("hx-verify"):
      np.testing.assert_array_equal(f(x, w), ref)
    np.testing.assert_array_equal(f(x, w), -ref)
  assert not hx.is_installed()
  np.testing.assert_array_equal(f(x, w), ref)
  hx.install("hx-verify")
  with hx.installed(NEGATE):  # a block overrides the process-wide setting
    np.testing.assert_array_equal(f(x, w), -ref)
  assert inst.current_pipeline() == "hx-verify"

  @hx.installed(NEGATE)
  def run():
    return f(x, w)

  np.testing.assert_array_equal(run(), -ref)


def test_bad_pipeline_in_context_manager_raises_before_the_block():
  with pytest.raises(PipelineError):
    with hx.installed("nonsense-pass"):
      raise AssertionError("block must not run")
  assert not hx.is_installed()


def test_wrapper_added_after_ours_survives_uninstall():
  seen = []
  hx.install(NEGATE)
  ours = _jax.current_lower_jaxpr_to_module()

  def theirs(*args, **kwargs):
    seen.append(args[0])
    return ours(*args, **kwargs)

  _jax.wrap_lower_jaxpr_to_module(theirs)
  try:
    hx.uninstall()
    assert _jax.current_lower_jaxpr_to_module() is theirs
    x, w = _x(), _w()
    np.testing.assert_array_equal(jax.jit(lambda x, w: qmlp(x, w))(x, w), _ref(x, w))
    assert seen  # lowered through their wrapper and ours, which passed it through
    hx.install(NEGATE)  # back in the chain once, not twice
    np.testing.assert_array_equal(jax.jit(qmlp)(x, w), -_ref(x, w))
    hx.uninstall()
  finally:
    _jax.wrap_lower_jaxpr_to_module(inst._inner or _jax.jax_lower_jaxpr_to_module)
    inst._inner = None


# --- threads ---------------------------------------------------------------------

def test_threads_jit_at_once_each_with_its_own_setting():
  """Two threads share one ``installed`` object (entered in both at once), a third runs
  plain; all lower the same and fresh functions concurrently."""
  x, w = _x(), _w()
  ref = _ref(x, w)
  f = jax.jit(qmlp)
  ctx = hx.installed(NEGATE)
  out: dict[str, list] = {"on": [], "on2": [], "off": []}
  start = threading.Barrier(len(out))
  errors = []

  def worker(key):
    try:
      start.wait()
      for i in range(5):
        g = jax.jit(lambda x, w, i=i: qmlp(x, w) + 0.0 * i)  # fresh lowerings
        if key == "off":
          out[key] += [np.asarray(f(x, w)), np.asarray(g(x, w))]
        else:
          with ctx:
            out[key] += [np.asarray(f(x, w)), np.asarray(g(x, w))]
          assert not hx.is_installed()
    except Exception as e:  # noqa: BLE001  (reported below)
      errors.append(e)

  threads = [threading.Thread(target=worker, args=(k,)) for k in out]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors
  for key, got in out.items():
    assert len(got) == 10
    for a in got:
      np.testing.assert_array_equal(a, ref if key == "off" else -ref)
  assert not hx.is_installed()
  assert _jax.current_lower_jaxpr_to_module() is _jax.jax_lower_jaxpr_to_module


def test_process_wide_install_reaches_other_threads():
  x, w = _x(), _w()
  hx.install(NEGATE)
  got = []
  t = threading.Thread(target=lambda: got.append(np.asarray(jax.jit(qmlp)(x, w))))
  t.start()
  t.join()
  np.testing.assert_array_equal(got[0], -_ref(x, w))


# --- verification failures ------------------------------------------------------------

def _bad(x):
  a = lax.composite(lambda x: x * 2.0, name="hx.bogus", version=1)(x)
  b = lax.composite(lambda x: x * 3.0, name="hx.dequantize", version=9)(x)
  return a + b


def test_verification_error_lists_every_problem_with_its_source_line():
  src, first = inspect.getsourcelines(_bad)
  line_a = first + next(i for i, s in enumerate(src) if "hx.bogus" in s)
  line_b = first + next(i for i, s in enumerate(src) if "version=9" in s)
  x = _x()
  hx.install()
  with pytest.raises(hx.VerificationError) as info:
    jax.jit(_bad)(x)
  e = info.value
  msg = str(e)
  assert e.pass_name == "hx-verify" and e.module_name == "jit(_bad)"
  assert len(e.diagnostics) >= 2
  assert f"test_install.py:{line_a}:" in msg and "'hx.bogus' is not a known hx composite" in msg
  assert f"test_install.py:{line_b}:" in msg and "version 9 is not accepted" in msg
  assert all(line.startswith("  ") for line in msg.splitlines()[1:])
  # still installed and usable
  assert hx.is_installed()
  w = _w()
  # exact: verification leaves the module as JAX emitted it (as in the tests above)
  np.testing.assert_array_equal(jax.jit(qmlp)(x, w), _ref(x, w))
  with pytest.raises(hx.VerificationError):  # and it keeps checking
    jax.jit(_bad).lower(x)


@dataclass(frozen=True)
class Crash(HxPass):
  """Test pass with a bug."""
  name: ClassVar[str] = "test-crash"

  def apply(self, module, diags):
    return 1 // 0


def test_a_crashing_pass_is_named_and_the_plugin_stays_usable(monkeypatch):
  monkeypatch.setitem(PASS_REGISTRY, Crash.name, lambda: Crash)
  x, w = _x(), _w()
  hx.install(Crash.name)
  with pytest.raises(RuntimeError, match=r"pass test-crash failed on module jit\(qmlp\) "
                     r"with ZeroDivisionError") as info:
    jax.jit(qmlp).lower(x, w)
  assert isinstance(info.value.__cause__, ZeroDivisionError)
  assert hx.stats()["hx-verify"]["modules"] == 1  # the passes before it ran
  hx.install("hx-verify")
  np.testing.assert_array_equal(jax.jit(qmlp)(x, w), _ref(x, w))  # exact, as above


def test_verify_false_lets_the_bad_module_through():
  hx.install(verify=False)
  assert "hx.bogus" in jax.jit(_bad).lower(_x()).as_text()


# --- what the default pipeline does to hand-written dequantize-then-dot ------------

def dequant_dot(x, qw):
  return x @ hx.dequantize(qw)


def test_hand_written_dequantize_dot_is_folded_with_equal_results():
  x, w = _x(), _w()
  qw = hx.quantize(w)
  plain_text = jax.jit(dequant_dot).lower(x, qw).as_text()
  plain = np.asarray(jax.jit(dequant_dot)(x, qw))
  with hx.installed():
    text = jax.jit(dequant_dot).lower(x, qw).as_text()
    folded = np.asarray(jax.jit(dequant_dot)(x, qw))
  assert '"hx.dequantize"' in plain_text and "hx.matmul_q" not in plain_text
  assert text != plain_text
  main = text.split("func.func private")[0]
  assert '"hx.dequantize"' not in main  # the full dequantized weight is gone from main
  assert 'stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2' in main
  # f32 sums in a different order: |error| <= k * eps * sum|x * s * q| (k = 8 here)
  bound = 8 * np.finfo(np.float32).eps * (np.abs(np.asarray(x)) @ np.abs(np.asarray(w)))
  assert np.all(np.abs(folded - plain) <= bound + 1e-7)
  s = hx.stats()
  assert s["hx-fold-scales"]["rewrites"] >= 1


def test_folded_matmul_q_streams_on_cpu_like_the_lowering():
  """Under install, a hand-written dequantize-then-dot lowered for CPU becomes the
  same hx.matmul_q the CPU lowering emits: a call of the native CPU kernel, or
  without it a streaming decomposition; neither holds the dequantized weight
  (temp memory far below the f32 weight's bytes)."""
  rng = np.random.default_rng(3)
  k, n = 1024, 512  # above matmul_q.streaming.SMALL_WEIGHT: the CPU rule streams (m = 2)
  x = jnp.asarray(rng.standard_normal((2, k)), jnp.float32)
  qw = hx.quantize(jnp.asarray(rng.standard_normal((k, n)), jnp.float32))
  with hx.installed():
    folded = jax.jit(dequant_dot).lower(x, qw)
    direct = jax.jit(hx.matmul_q).lower(x, qw)
    for lowered in (folded, direct):
      text = lowered.as_text()
      assert 'stablehlo.composite "hx.matmul_q"' in text
      assert ("stablehlo.custom_call @hx_matmul_q_cpu_v1(" if hx.cpu_kernel_info().active
              else "stablehlo.while") in text
    temp = folded.compile().memory_analysis().temp_size_in_bytes
    assert temp <= k * n * 4 // 8
    np.testing.assert_array_equal(np.asarray(jax.jit(dequant_dot)(x, qw)),
                                  np.asarray(jax.jit(hx.matmul_q)(x, qw)))
  # lowered for several platforms at once, the fold is hx.matmul_q's own lowering:
  # one composite per platform, each with that platform's decomposition
  with hx.installed():
    texts = [without_locations(jax.export.export(jax.jit(f), platforms=("cpu", "tpu"))(x, qw)
                                .mlir_module()) for f in (dequant_dot, hx.matmul_q)]
  assert texts[0].count('stablehlo.composite "hx.matmul_q"') == 2
  assert texts[0].replace("@jit_dequant_dot", "@jit_matmul_q") == texts[1]


# --- plain JAX: byte-identical ----------------------------------------------------------

CASES = plain_corpus.cases()


def test_corpus_is_large_and_varied():
  names = {c.name for c in CASES}
  assert len(CASES) >= 30
  assert {"cond", "scan_rnn", "custom_vjp_grad", "pallas_interpret_add",
          "pure_callback", "shard_map_psum", "sharded_matmul"} <= names


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plain_function_lowers_byte_identically(case):
  """Lowered text (with debug locations) and exported module: before, installed, after."""
  # JAX's trace caches are keyed on install()'s state too, so a trace cached by an earlier
  # test (e.g. jnp.where inside an interpreted Pallas kernel) would carry that test's
  # locations into one of the three lowerings only: start from empty caches
  jax.clear_caches()
  f = jax.jit(case.fn)
  texts, seen = [], None
  for on in (False, True, False):  # one call site: the locations' tracebacks agree
    if on:
      hx.install()
    texts.append((f.lower(*case.args).as_text(debug_info=True),
                  jax.export.export(f)(*case.args).mlir_module() if case.exportable else None))
    if on:
      seen = hx.stats()["total"]
      hx.uninstall()
  assert seen["modules"] >= 1 and seen["skipped"] == seen["modules"]  # seen, left alone
  assert texts[1] == texts[0]
  assert texts[2] == texts[0]
