"""``hx-fold-scales``' jaxpr stage (``passes/fold_scales_jaxpr.py``) and ``Pipeline.run_jaxpr``.

Under ``hx.install()`` a hand-written ``x @ hx.dequantize(qw)`` that is exactly
``hx.matmul_q``'s contract is rewritten in the jaxpr, before JAX lowers it: the
module must then be the one ``hx.matmul_q(x, qw)`` lowers to (up to names and
locations), wherever the dot sits (nested ``jit``, ``scan``, ``cond``,
explicit sharding), and every dot the stage must not touch is left to the MLIR
stage, whose result is checked too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hx_testing import without_locations
from jax import lax
from jax.sharding import PartitionSpec as P
from numerics import assert_within, dot_bound

import hxmlir as hx
from hxmlir.integration import installation as inst  # noqa: E402
from hxmlir.lowering.primitives import hx_matmul_q_p
from hxmlir.passes import parse_pipeline
from hxmlir.passes.fold_scales_jaxpr import fold_closed_jaxpr

pytestmark = pytest.mark.usefixtures("uninstalled")


def _data(m=4, k=8, n=3, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
  qw = hx.quantize(jnp.asarray(rng.standard_normal((k, n)), jnp.float32))
  return x, qw


def dequant_dot(x, qw):
  return x @ hx.dequantize(qw)


def _prims(closed) -> list[str]:
  """Primitive names of a closed jaxpr, sub-jaxprs included (pre-order)."""
  out = []
  for eqn in closed.jaxpr.eqns:
    out.append(eqn.primitive.name)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      out += _prims(jax.extend.core.ClosedJaxpr(sub, ()))
  return out


def _lo_jaxpr(f, *args):
  """The lo jaxpr JAX hands to the lowering for ``jax.jit(f)(*args)`` (captured by the hook)."""
  got = []
  inner = inst._jax.jax_lower_jaxpr_to_module

  def spy(*a, **k):
    got.append(a[1])
    return inner(*a, **k)
  inst._jax.wrap_lower_jaxpr_to_module(spy)
  try:
    jax.clear_caches()  # lower afresh
    jax.jit(f).lower(*args)
  finally:
    inst._jax.wrap_lower_jaxpr_to_module(inner)
  return got[0]


def _lowered_text(f, *args) -> str:
  with hx.installed():
    return without_locations(jax.jit(f).lower(*args).as_text())


# --- the rewrite itself ----------------------------------------------------------------

def test_rewrites_the_dot_and_drops_the_dequantize():
  x, qw = _data()
  closed = _lo_jaxpr(dequant_dot, x, qw)
  assert _prims(closed) == ["hx_dequantize", "dot_general"]
  new, n = fold_closed_jaxpr(closed)
  assert n == 1 and _prims(new) == ["hx_matmul_q"]
  eqn = new.jaxpr.eqns[0]
  old_dot = closed.jaxpr.eqns[1]
  assert eqn.primitive is hx_matmul_q_p
  assert eqn.outvars == old_dot.outvars and eqn.source_info is old_dot.source_info
  assert eqn.invars == [old_dot.invars[0], *closed.jaxpr.eqns[0].invars]
  # the jaxpr still evaluates to the same numbers
  got = jax.extend.core.jaxpr_as_fun(new)(x, qw.qvalue, qw.scale)[0]
  want = jax.extend.core.jaxpr_as_fun(closed)(x, qw.qvalue, qw.scale)[0]
  assert_within(got, want, 2 * dot_bound("mk,kn->mn", x, hx.dequantize(qw), extra=1))


def test_nothing_to_fold_returns_the_same_object():
  x, qw = _data()
  for f in (lambda x, qw: hx.matmul_q(x, qw), lambda x, qw: jnp.tanh(x) @ x.T):
    closed = _lo_jaxpr(f, x, qw)
    assert fold_closed_jaxpr(closed) == (closed, 0)


def test_a_dequantize_with_other_uses_stays():
  x, qw = _data()

  def f(x, qw):
    d = hx.dequantize(qw)
    return x @ d, d

  new, n = fold_closed_jaxpr(_lo_jaxpr(f, x, qw))
  assert n == 1 and sorted(_prims(new)) == ["hx_dequantize", "hx_matmul_q"]


@pytest.mark.parametrize("name, f", [
    # not hx.matmul_q's contract: each is left to the MLIR stage
    ("dequantized lhs", lambda x, qw: hx.dequantize(qw).T @ x.T),
    ("highest precision", lambda x, qw: jnp.matmul(x, hx.dequantize(qw),
                                                   precision=lax.Precision.HIGHEST)),
    ("transposed contraction", lambda x, qw: lax.dot_general(
        x.T, hx.dequantize(qw), (((0,), (0,)), ((), ())))),
    ("bf16 result", lambda x, qw: lax.dot_general(
        x, hx.dequantize(qw), (((1,), (0,)), ((), ())), preferred_element_type=jnp.bfloat16)),
])
def test_other_dots_are_left_alone(name, f):
  x, qw = _data()
  closed = _lo_jaxpr(f, x, qw)
  assert fold_closed_jaxpr(closed) == (closed, 0), name


# Dots outside hx.matmul_q's contract (lowering/schema.py) that JAX still lowers:
# the stage must leave each of them, and install must not change what they compute.
def _assert_left_alone_and_unchanged(*args):
  """The stage leaves ``dequant_dot(*args)`` as it is, and install does not change its result."""
  closed = _lo_jaxpr(dequant_dot, *args)
  assert fold_closed_jaxpr(closed) == (closed, 0)
  want = np.asarray(jax.jit(dequant_dot)(*args))
  with hx.installed():
    got = np.asarray(jax.jit(dequant_dot)(*args))
  x, qw = args
  assert_within(got, want, 2 * dot_bound("...mk,...kn->...mn", x, hx.dequantize(qw), extra=1))


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int8])
def test_dots_breaking_the_contract_on_dtype_are_left_alone(dtype):
  x, qw = _data()
  _assert_left_alone_and_unchanged(x.astype(dtype), qw)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_x_folds_with_a_convert(dtype):
  # the dot promotes a bf16/f16 x against the f32 weight; the stage writes the convert
  # hx.matmul_q itself makes (hxmlir.types.matmul_q_typing.DENSE_DTYPES), then the op
  x, qw = _data()
  xh = x.astype(dtype)
  new, n = fold_closed_jaxpr(_lo_jaxpr(dequant_dot, xh, qw))
  assert n == 1 and _prims(new) == ["convert_element_type", "hx_matmul_q"]
  assert _prims(_lo_jaxpr(hx.matmul_q, xh, qw)) == _prims(new)
  with hx.installed():
    got = jax.jit(dequant_dot)(xh, qw)
  assert got.dtype == jnp.float32
  assert_within(got, np.asarray(xh, np.float64) @ np.asarray(hx.dequantize(qw), np.float64),
                dot_bound("mk,kn->mn", np.asarray(xh, np.float32), hx.dequantize(qw), extra=1))


@pytest.mark.parametrize("xspec, wspec", [(P(), P("i")), (P(None, "i"), P())])
def test_dots_with_a_sharded_contraction_fold_and_compute_the_same(on_mesh, xspec, wspec):
  # a dot JAX accepts with a sharded contraction (its result replicated, the partial
  # sums added) is an hx.matmul_q of the same type (install never turns a
  # working program into a failing one)
  x, qw = _data(m=8, k=16, n=8)
  args = jax.device_put(x, xspec), hx.quantize(jax.device_put(hx.dequantize(qw), wspec))
  new, n = fold_closed_jaxpr(_lo_jaxpr(dequant_dot, *args))
  assert n == 1 and _prims(new) == ["hx_matmul_q"]
  want = np.asarray(jax.jit(dequant_dot)(*args))
  with hx.installed():
    got = np.asarray(jax.jit(dequant_dot)(*args))
  assert_within(got, want, 2 * dot_bound("mk,kn->mn", x, hx.dequantize(args[1]), extra=1))


def test_dots_with_symbolic_shapes_are_left_alone():
  _, qw = _data()
  xs = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 8"), jnp.float32)

  def f(x):
    return x @ hx.dequantize(qw)
  with hx.installed():
    exp = jax.export.export(jax.jit(f))(xs)
  x = jnp.asarray(np.random.default_rng(5).standard_normal((5, 8)), jnp.float32)
  assert_within(exp.call(x), jax.jit(f)(x),
                2 * dot_bound("mk,kn->mn", x, hx.dequantize(qw), extra=1))


def test_leading_dims_of_x_form_matmul_q():
  # f32[..., k] @ dequantize(q8[k, n]): one hx_matmul_q with dot_general's dims
  x, qw = _data()
  new, n = fold_closed_jaxpr(_lo_jaxpr(lambda x, qw: x[None, None] @ hx.dequantize(qw), x, qw))
  assert n == 1 and _prims(new).count("hx_matmul_q") == 1 and "hx_dequantize" not in _prims(new)
  (eqn,) = [e for e in new.jaxpr.eqns if e.primitive.name == "hx_matmul_q"]
  assert eqn.params == {"dimension_numbers": (((3,), (0,)), ((), ()))}


def test_left_alone_dots_are_still_folded_by_the_mlir_stage():
  x, qw = _data()
  text = _lowered_text(lambda x, qw: lax.dot_general(
      x.T, hx.dequantize(qw), (((0,), (0,)), ((), ()))), x, qw)
  assert '"hx.dequantize"' not in text and "stablehlo.convert" in text
  s = hx.stats()["hx-fold-scales"]
  assert s["into operand"] == 1 and s["matmul_q formed"] == 0


# --- end to end: what hx.matmul_q itself lowers to ----------------------------------------

def _same_as_direct(f, direct, *args):
  got, want = _lowered_text(f, *args), _lowered_text(direct, *args)
  name_f, name_d = f.__name__, direct.__name__
  assert got.replace(f"@jit_{name_f}", f"@jit_{name_d}") == want
  with hx.installed():
    a, b = jax.jit(f)(*args), jax.jit(direct)(*args)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  plain = np.asarray(jax.jit(f)(*args))  # not installed: dequantize, then dot
  # Both sum k products in f32, in different orders: each is within k * eps *
  # sum|x * w| of the exact value (Higham, Accuracy and Stability, section 3.1).
  x, w = np.asarray(args[0], np.float64), np.asarray(hx.dequantize(args[1]), np.float64)
  bound = 2 * x.shape[-1] * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w))
  assert np.all(np.abs(np.asarray(a) - plain) <= bound)


def test_folded_module_is_the_one_matmul_q_lowers_to():
  x, qw = _data(m=2, k=1024, n=512)  # large enough for the CPU streaming decomposition

  def direct(x, qw):
    return hx.matmul_q(x, qw)
  _same_as_direct(dequant_dot, direct, x, qw)
  jax.clear_caches()  # lower afresh, once
  hx.stats(reset=True)
  _lowered_text(dequant_dot, x, qw)
  s = hx.stats()["hx-fold-scales"]
  assert s["matmul_q formed"] == s["scales folded"] == s["rewrites"] == 1
  assert s["modules"] == 1 and s["seconds"] > 0


def test_nested_jit_scan_and_cond_are_rewritten_once_per_body():
  x, qw = _data()
  layer = jax.jit(dequant_dot)

  def model(x, qw, layer):
    y = layer(x, qw) @ jnp.ones((3, 8), jnp.float32)
    y = layer(y, qw)  # the same nested jaxpr, called twice

    def body(c, _):
      return c, layer(x, qw)
    _, ys = lax.scan(body, 0.0, None, length=2)
    z = lax.cond(ys.sum() > 0, lambda: dequant_dot(x, qw), lambda: -dequant_dot(x, qw))
    return y + ys.sum(0) + z

  def folded(x, qw):
    return model(x, qw, layer)

  closed = _lo_jaxpr(folded, x, qw)
  new, n = fold_closed_jaxpr(closed)
  # the nested jit's jaxpr is one object, rewritten once however often it is called
  assert n == 3 and "hx_dequantize" not in _prims(new) and "dot_general" in _prims(new)
  text = _lowered_text(folded, x, qw)
  assert '"hx.dequantize"' not in text
  assert text.count("func.func private @dequant_dot(") == 1
  with hx.installed():
    got = jax.jit(folded)(x, qw)
  np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(folded)(x, qw)),
                             rtol=1e-5, atol=1e-5)


def test_explicit_sharding_folds_to_the_same_sharded_matmul_q(on_mesh):
  x, qw = _data(m=8, k=8, n=4)
  xs = jax.device_put(x, P("i"))
  qws = hx.quantize(jax.device_put(hx.dequantize(qw), P(None, "j")))

  def direct(x, qw):
    return hx.matmul_q(x, qw)
  _same_as_direct(dequant_dot, direct, xs, qws)
  text = _lowered_text(dequant_dot, xs, qws)
  assert 'stablehlo.composite "hx.matmul_q"' in text and "sdy.sharding" in text


# --- which pipelines have a jaxpr stage ---------------------------------------------------

@pytest.mark.parametrize("pipeline, runs", [
    ("hx-fold-scales", True),
    ("hx-verify,hx-fold-scales", True),  # analyses do not end the stage
    ("hx-verify,hx-fold-scales,hx-decompose", True),
    ("hx-fold-scales{impl=reference}", False),  # a fixed decomposition: MLIR stage only
    ("hx-fold-scales{form-matmul-q=false}", False),
    ("hx-decompose,hx-fold-scales", False),  # must see the decomposed module
    ("canonicalize,hx-fold-scales", False),  # a native pass: MLIR only
    ("hx-verify", False),
])
def test_which_pipelines_run_the_jaxpr_stage(pipeline, runs):
  x, qw = _data()
  closed = _lo_jaxpr(dequant_dot, x, qw)
  new, stats, ran = parse_pipeline(pipeline).run_jaxpr(closed)
  assert [name for name, _ in ran] == (["hx-fold-scales"] if runs else [])
  assert (new is not closed) == runs
  assert stats == ({"hx-fold-scales": {"scales folded": 1, "matmul_q formed": 1}} if runs
                   else {})


def test_without_the_jaxpr_stage_the_mlir_stage_forms_the_reference_composite():
  x, qw = _data(m=2, k=1024, n=512)
  with hx.installed("hx-fold-scales{impl=reference}"):
    text = jax.jit(dequant_dot).lower(x, qw).as_text()
  assert 'stablehlo.composite "hx.matmul_q"' in text and "stablehlo.while" not in text
