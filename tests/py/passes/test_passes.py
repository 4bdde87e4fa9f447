"""The pass framework: registry, pipeline parsing, running, diagnostics, and the
properties every pass has (idempotent; modules without hx ops untouched)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxlib.mlir import ir
from numerics import assert_matmul_close

import hxmlir as hx
from hxmlir.passes import (
  NATIVE_PASSES,
  PASS_REGISTRY,
  Diagnostics,
  HxPass,
  NativePass,
  PassError,
  PassResult,
  PipelineError,
  Severity,
  locations,
  ops,
  parse_pipeline,
  parsing,
)
from hxmlir.passes.verify import VerifyPass

OUR_PASSES = ("hx-verify", "hx-fold-scales", "hx-decompose")

DEQ_DOT = """
func.func @main(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %r = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<6xf32>) -> tensor<6x8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<6x8xf32>
  return %2 : tensor<6x8xf32>
}
"""

TWO_BAD = """func.func @main(%q: tensor<4x8xi8>, %s: tensor<8xf32>, %x: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.composite "hx.nothing" %x {decomposition = @id, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @id(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
"""


def parse(text: str, name: str = "test.mlir") -> ir.Operation:
  return parsing.parse_module(text, parsing.make_context(), name)


def asm(module: ir.Operation) -> str:
  return module.get_asm(enable_debug_info=True)


# --- registry ------------------------------------------------------------------

def test_registry_keys_are_pass_names():
  assert set(OUR_PASSES) <= set(PASS_REGISTRY)
  for key, getter in PASS_REGISTRY.items():
    cls = getter()
    assert issubclass(cls, HxPass)
    assert cls.name == key, f"registry key {key!r} maps to a pass named {cls.name!r}"
    assert cls.summary, f"{key} has no summary for --list-passes"
    cls()  # every option has a default


def test_registered_options_are_kebab_case_and_typed():
  for getter in PASS_REGISTRY.values():
    for key, f in getter().options().items():
      assert "_" not in key
      assert f.type in (bool, int, float, str, "bool", "int", "float", "str"), (key, f.type)


@pytest.mark.parametrize("name", NATIVE_PASSES)
def test_native_passes_listed_exist(name):
  (p,) = parse_pipeline(name).passes
  assert isinstance(p, NativePass) and p.text == name


# --- pipeline parsing ----------------------------------------------------------

def test_parse_mixed_pipeline_round_trips_to_string():
  text = "hx-verify,hx-fold-scales{form-matmul-q=false},canonicalize,func.func(cse),hx-decompose"
  pipe = parse_pipeline(text)
  kinds = [type(p).__name__ for p in pipe.passes]
  assert kinds == ["VerifyPass", "FoldScalesPass", "NativePass", "NativePass", "DecomposePass"]
  assert pipe.passes[1].form_matmul_q is False
  assert str(pipe) == text
  assert str(parse_pipeline(f"builtin.module({text})")) == text
  assert parse_pipeline("").passes == ()


def test_option_spellings():
  for text in ("hx-fold-scales{form_matmul_q=0}", "hx-fold-scales{form-matmul-q=FALSE}"):
    assert parse_pipeline(text).passes[0].form_matmul_q is False
  assert parse_pipeline("hx-fold-scales{form-matmul-q}").passes[0].form_matmul_q is True


def test_unknown_pass_lists_the_valid_ones():
  with pytest.raises(PipelineError) as e:
    parse_pipeline("hx-verify,hx-fold-scale")
  assert isinstance(e.value, ValueError)
  msg = str(e.value)
  assert "unknown pass 'hx-fold-scale' (did you mean 'hx-fold-scales'?)" in msg
  for name in (*PASS_REGISTRY, "canonicalize", "cse", "symbol-dce"):
    assert name in msg


@pytest.mark.parametrize("text, message", [
    ("hx-verify{strict=1}", "hx-verify: unknown option 'strict'; valid options: none"),
    ("hx-fold-scales{bogus=1}", "unknown option 'bogus'; valid options: form-matmul-q"),
    ("hx-fold-scales{form-matmul-q=2}", "option 'form-matmul-q' must be true or false, got '2'"),
    ("hx-fold-scales{form-matmul-q=true", "unbalanced brackets"),
    ("hx-verify,,cse", "empty pass name"),
    ("hx-verify,,", "empty pass name in pipeline 'hx-verify,,' (a stray ','?)"),
    (",", "empty pass name"),
    ("builtin.module(hx-verify,)", "empty pass name"),
    ("hx-verify,builtin.module(,cse)", "empty pass name"),
    ("canonicalize{bogus=1}", "canonicalize: bad option for MLIR pass 'canonicalize': no such "
     "option bogus (in 'canonicalize{bogus=1}')"),
    ("func.func(cse{x=1})", "cse: bad option for MLIR pass 'cse': no such option x"),
    ("canonicalize{max-iterations=abc}", "canonicalize: bad option for MLIR pass 'canonicalize': "
     "for the --max-iterations option: 'abc' value invalid"),
    ("hx-check-export{allow-targets=a,b}", "hx-check-export: option 'allow-targets' separates its "
     "values with ';', got 'a,b'; ',' separates passes (write allow-targets=a;b)"),
])
def test_bad_pipelines(text, message, capfd):
  # XLA, once initialised, renames LLVM's program (its option errors then start
  # "xla: "); the message must not depend on whether JAX ran first
  jax.jit(lambda x: x + 1)(jnp.ones(2)).block_until_ready()
  with pytest.raises(PipelineError) as e:
    parse_pipeline(text)
  assert message in str(e.value)
  assert "did you mean" not in str(e.value)
  assert capfd.readouterr().err == ""  # MLIR's option parser printed nothing of its own


def test_builtin_module_anchors_name_the_module():
  for text in ("builtin.module(hx-fold-scales)", " builtin.module( hx-fold-scales ) ",
               "builtin.module(builtin.module(hx-fold-scales))"):
    assert str(parse_pipeline(text)) == "hx-fold-scales"
  # what hx.install builds from an anchored pipeline: hx-verify put before it
  assert str(parse_pipeline("hx-verify,builtin.module(hx-fold-scales,cse)")) == \
      "hx-verify,hx-fold-scales,cse"
  assert parse_pipeline("builtin.module()").passes == ()


def test_install_accepts_an_anchored_pipeline():
  import hxmlir as hx
  hx.install("builtin.module(hx-fold-scales)")
  try:
    assert hx.is_installed()
  finally:
    hx.uninstall()


def test_list_options_show_their_separator():
  from hxmlir.passes.pipeline import option_help
  opts = PASS_REGISTRY["hx-check-export"]().options()
  assert option_help(opts["allow-targets"]) == "str, ';'-separated list (default '')"
  (p,) = parse_pipeline("hx-check-export{allow-targets=a_ffi;b_ffi}").passes
  assert p.allow_targets == "a_ffi;b_ffi"


# --- running -----------------------------------------------------------------

def test_run_reports_changed_and_stats():
  module = parse(DEQ_DOT)
  result = parse_pipeline("hx-verify,hx-fold-scales,hx-verify,cse").run(module)
  assert result.changed
  assert result.stats["hx-verify"] == {"composites checked": 2}  # dequantize, then matmul_q
  fold = result.stats["hx-fold-scales"]
  assert fold["scales folded"] == 1 and fold["matmul_q formed"] == 1
  assert result.stats["cse"] == {}
  names = [ops.composite_name(op) for op in ops.hx_composites(module)]
  assert names == ["hx.matmul_q"]


def test_run_accepts_ir_module_and_calls_after_pass():
  ctx = parsing.make_context()
  with ctx:
    module = ir.Module.parse(DEQ_DOT)
  seen = []
  parse_pipeline("hx-verify,canonicalize").run(
      module, after_pass=lambda name, op, secs: seen.append((name, op.name, secs >= 0)))
  assert seen == [("hx-verify", "builtin.module", True), ("canonicalize", "builtin.module", True)]


def test_pass_error_lists_every_problem_with_locations():
  module = parse(TWO_BAD, "two_bad.mlir")
  before = asm(module)
  with pytest.raises(PassError) as e:
    parse_pipeline("hx-verify,hx-decompose").run(module)
  err = e.value
  assert err.pass_name == "hx-verify"
  locs = [(d.severity, d.location) for d in err.diagnostics]
  assert locs == [(Severity.ERROR, "two_bad.mlir:2:8"), (Severity.ERROR, "two_bad.mlir:3:8")]
  assert "scale shape must be the value shape" in err.diagnostics[0].message
  assert "'hx.nothing' is not a known hx composite" in err.diagnostics[1].message
  text = str(err)
  assert text.splitlines()[0] == "hx-verify: 2 problems found"
  assert "two_bad.mlir:2:8: error: 'hx.dequantize' operand: scale shape" in text
  assert "two_bad.mlir:3:8: error: 'hx.nothing'" in text
  assert asm(module) == before  # hx-decompose never ran


@dataclass(frozen=True)
class _BreakPass(HxPass):
  name: ClassVar[str] = "test-break"
  summary: ClassVar[str] = "makes the IR invalid"

  def apply(self, module, diags: Diagnostics) -> PassResult:
    for op in ops.walk(module):
      if op.name == "stablehlo.dot_general":
        op.result.set_type(ir.RankedTensorType.get([3, 3], ir.F32Type.get()))
        return PassResult(changed=True)
    return PassResult()


def test_pass_that_breaks_the_ir_is_named(monkeypatch):
  monkeypatch.setitem(PASS_REGISTRY, "test-break", lambda: _BreakPass)
  with pytest.raises(PassError) as e:
    parse_pipeline("hx-verify,test-break,hx-verify").run(parse(DEQ_DOT))
  assert e.value.pass_name == "test-break"
  assert "invalid after this pass" in str(e.value)
  assert any("dot_general" in d.message or "type" in d.message for d in e.value.diagnostics)


def test_warnings_are_returned_not_raised(monkeypatch):
  @dataclass(frozen=True)
  class Warn(HxPass):
    name: ClassVar[str] = "test-warn"

    def apply(self, module, diags):
      diags.warning(module, "careful")
      diags.remark("x.py:1:2", "note this")
      return PassResult()

  monkeypatch.setitem(PASS_REGISTRY, "test-warn", lambda: Warn)
  result = parse_pipeline("test-warn").run(parse(DEQ_DOT, "w.mlir"))
  assert [(d.severity, d.location, d.message) for d in result.diagnostics] == [
      (Severity.WARNING, "w.mlir:1:1", "careful"), (Severity.REMARK, "x.py:1:2", "note this")]


# --- diagnostics carry the user's Python location -------------------------------

def test_locations_from_jax_point_at_the_users_line():
  x = jnp.ones((2, 6), "float32")
  qw = hx.quantize(jnp.ones((6, 5), "float32"))

  def f(x, qw):
    return hx.matmul_q(x, qw)
  line = inspect.getsourcelines(f)[1] + 1
  module = jax.jit(f).lower(x, qw).compiler_ir("stablehlo")
  (op,) = ops.hx_composites(module.operation)
  with module.context:
    op.attributes["version"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 99)
  with pytest.raises(PassError) as e:
    parse_pipeline("hx-verify").run(module)
  (d,) = e.value.diagnostics
  assert d.location.startswith(f"{__file__}:{line}:"), d.location
  assert d.message == "'hx.matmul_q' version 99 is not accepted; this code accepts 1, 2, 3, 4, 5"


def test_location_str_forms():
  with parsing.make_context():
    f = ir.Location.file("a.py", 3, 7)
    assert locations.location_str(f) == "a.py:3:7"
    assert locations.location_str(ir.Location.name("jit(f)/dot", f)) == "a.py:3:7"
    callsite = ir.Location.callsite(ir.Location.name("inner", ir.Location.file("b.py", 1, 2)),
                                    [f])
    assert locations.location_str(callsite) == "b.py:1:2"
    fused = ir.Location.fused([ir.Location.unknown(), ir.Location.file("c.py", 9, 1)])
    assert locations.location_str(fused) == "c.py:9:1"
    assert locations.location_str(ir.Location.unknown()) == "<unknown>"


def test_verify_checks_signature_of_unverified_ir():
  # The StableHLO verifier rejects mismatched decompositions at parse time; hx-verify
  # still checks, for IR built programmatically and not yet verified.
  module = parse(DEQ_DOT + """
func.func private @other(%q: tensor<6x8xi8>) -> tensor<6x8xf32> {
  %0 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}""")
  (op,) = ops.hx_composites(module)
  with module.context:
    op.attributes["decomposition"] = ir.FlatSymbolRefAttr.get("other")
  diags = Diagnostics()
  VerifyPass().apply(module, diags)
  assert [d.message for d in diags.errors] == [
      "'hx.dequantize' decomposition @other has signature (tensor<6x8xi8>) -> "
      "(tensor<6x8xf32>), but the composite has (tensor<6x8xi8>, tensor<6xf32>) -> "
      "(tensor<6x8xf32>)"]


# --- every pass: idempotent, and no hx ops means no change ---------------------

def _plain_modules():
  """JAX programs without hx ops (including dots of f32 values)."""
  x = jnp.arange(12.0, dtype="float32").reshape(3, 4)
  w = jnp.ones((4, 5), "float32")
  fns = [
      (lambda x, w: jnp.tanh(x @ w).sum(0), (x, w)),
      (lambda x, w: (x.astype(jnp.int8).astype(jnp.float32) + 2.0) @ w, (x, w)),
      (lambda x: jax.nn.softmax(x, axis=-1), (x,)),
      (lambda x: jax.lax.fori_loop(0, 3, lambda i, c: c * 2.0, x), (x,)),
      # attributes jaxlib's Python bindings cannot represent (complex dense constants)
      (lambda x: (jnp.complex64(1 + 2j) * x).real, (x,)),
      (lambda x: jnp.linalg.eigvals(x[:, :3]), (x,)),
  ]
  return [jax.jit(f).lower(*args).as_text(debug_info=True) for f, args in fns]


def _hx_modules():
  x = jnp.ones((2, 6), "float32")
  w = jnp.linspace(-1, 1, 30, dtype="float32").reshape(6, 5)

  def f(x, w):
    qw = hx.quantize(w)
    return hx.matmul_q(x, qw), x @ hx.dequantize(qw)

  def g(x, w):
    return hx.dequantize(hx.quantize(w)).T @ x.T

  def h(x, w):  # a complex constant next to hx ops (the symbol walks skip it)
    return (jnp.complex64(1 + 2j) * (x @ hx.dequantize(hx.quantize(w)))).imag
  return [jax.jit(f).lower(x, w).as_text(debug_info=True),
          jax.jit(g).lower(x, w).as_text(debug_info=True),
          jax.jit(h).lower(x, w).as_text(debug_info=True), DEQ_DOT]


def test_install_with_complex_constants_and_every_pass():
  x = jnp.ones((2, 6), "float32")
  w = jnp.linspace(-1, 1, 30, dtype="float32").reshape(6, 5)
  wd = np.asarray(hx.dequantize(hx.quantize(w)))
  with hx.installed("hx-verify,hx-fold-scales,hx-decompose"):
    y = jax.jit(lambda x, w: (jnp.complex64(1 + 2j) * hx.matmul_q(x, hx.quantize(w))).imag)(x, w)
    ev = jax.jit(jnp.linalg.eigvals)(jnp.diag(jnp.arange(1.0, 4.0)))
  assert_matmul_close(y, 2 * np.asarray(x), wd, extra=2)  # imag((1+2i) y) = 2 y
  np.testing.assert_array_equal(np.sort(np.asarray(ev).real), [1.0, 2.0, 3.0])


@pytest.mark.parametrize("name", OUR_PASSES)
def test_modules_without_hx_ops_are_byte_identical(name):
  for text in _plain_modules():
    module = parse(text)
    before = asm(module)
    assert not ops.has_hx_ops(module)
    result = parse_pipeline(name).run(module)
    assert not result.changed
    assert asm(module) == before


@pytest.mark.parametrize("name", OUR_PASSES)
def test_passes_are_idempotent(name):
  for text in _hx_modules():
    module = parse(text)
    parse_pipeline(name).run(module)
    once = asm(module)
    again = parse_pipeline(name).run(module)
    assert not again.changed, name
    assert asm(module) == once


def test_decompose_leaves_plain_stablehlo_with_same_values():
  from hx_testing import compile_and_run

  text = _hx_modules()[0]
  module = parse(text)
  result = parse_pipeline("hx-decompose").run(module)
  assert result.stats["hx-decompose"]["composites inlined"] == 3
  assert result.stats["hx-decompose"]["functions removed"] == 3
  assert not ops.has_hx_ops(module)
  assert all(op.name != "stablehlo.composite" for op in ops.walk(module))
  rng = np.random.default_rng(0)
  args = [rng.standard_normal((2, 6), np.float32), rng.standard_normal((6, 5), np.float32)]
  before = compile_and_run(text, args)
  after = compile_and_run(module.get_asm(), args)
  for b, a in zip(before, after):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("text, column", [
    ("hx-verify, bogus", 12),
    ("hx-verify,hx-fold-scales{form-matmul-q=1 nope=2}", 42),
    ("builtin.module(cse,nope)", 20),
])
def test_pipeline_error_columns(text, column):
  with pytest.raises(PipelineError) as e:
    parse_pipeline(text)
  assert e.value.column == column
