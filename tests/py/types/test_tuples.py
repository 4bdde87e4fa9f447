"""Tuples ``Tup{...}`` as single JAX values: nesting, hi elements, and every transformation."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import assert_sum_close, assert_within, elementwise_bound

import hxmlir as hx

get = hx.get_tuple_element


@pytest.fixture
def tup():
  return hx.make_tup(jnp.arange(3., dtype=jnp.float32), 5.)


def short(v) -> str:
  return jax.typeof(v).str_short(short_dtypes=True)


def test_typeof_and_elements(tup):
  assert isinstance(tup, hx.HiTup)
  ty = jax.typeof(tup)
  assert isinstance(ty, hx.TupTy)
  assert str(ty) == repr(ty) == "Tup{f32[3],f32[]}"
  np.testing.assert_array_equal(np.asarray(get(tup, 0)), [0., 1., 2.])
  assert float(get(tup, 1)) == 5.0
  assert float(get(tup, -1)) == 5.0


def test_nested_and_hi_elements():
  nested = hx.make_tup(hx.make_tup(1., 2.), jnp.arange(2., dtype=jnp.float32))
  assert short(nested) == "Tup{Tup{f32[],f32[]},f32[2]}"
  assert float(jax.jit(lambda t: get(get(t, 0), 1))(nested)) == 2.0
  qx = hx.quantize(jnp.array([[1., 2., 3.], [4., -5., 6.]], jnp.float32))
  r = hx.outer(jnp.ones(4, jnp.float32), jnp.ones(2, jnp.float32))
  t = hx.make_tup(qx, 3., r)
  assert short(t) == "Tup{q8[2,3],f32[],r1[4,2]}"
  np.testing.assert_array_equal(np.asarray(hx.dequantize(get(t, 0))),
                                np.asarray(hx.dequantize(qx)))
  assert [a.str_short(short_dtypes=True) for a in jax.typeof(t).lo_ty()] == [
      "i8[2,3]", "f32[2]", "f32[]", "f32[4]", "f32[2]"]


def test_jaxpr_single_value_and_jit(tup):
  jaxpr = jax.jit(lambda a, b: hx.make_tup(b, a)).trace(jnp.ones(3, jnp.float32),
                                                         jnp.float32(2.)).jaxpr
  assert jaxpr.jaxpr.outvars[0].aval.str_short(short_dtypes=True) == "Tup{f32[],f32[3]}"
  assert len(jaxpr.jaxpr.outvars) == 1 and len(jaxpr.eqns) == 1
  # tuple argument, result and intermediate under jit
  swapped = jax.jit(lambda t: hx.make_tup(get(t, 1), get(t, 0)))(tup)
  assert short(swapped) == "Tup{f32[],f32[3]}"
  np.testing.assert_array_equal(np.asarray(get(swapped, 1)), [0., 1., 2.])
  out = jax.jit(lambda x: get(hx.make_tup(x, 2 * x), 1))(jnp.ones(2, jnp.float32))
  np.testing.assert_array_equal(np.asarray(out), [2., 2.])


def test_rebuilt_from_elements(tup):
  again = hx.HiTup((get(tup, 0), get(tup, 1)))
  assert jax.typeof(again) == jax.typeof(tup)


def test_bad_access(tup):
  with pytest.raises(IndexError, match=r"index 2 out of range for Tup\{f32\[3\],f32\[\]\}"):
    jax.jit(lambda t: get(t, 2)).trace(tup)
  with pytest.raises(TypeError, match=r"expects a tuple Tup\{\.\.\.\}, got f32\[3\]"):
    jax.jit(lambda x: get(x, 0)).trace(jnp.ones(3, jnp.float32))
  assert float(get(tup, np.int64(1))) == 5.0  # any static integer


@pytest.mark.parametrize("idx, got", [
    (1.0, "1.0 of type float"), (True, "True of type bool"), ("0", "'0' of type str"),
    (None, "None of type NoneType"),
])
def test_index_must_be_a_static_int(tup, idx, got):
  with pytest.raises(TypeError, match=r"hx\.get_tuple_element index must be a static Python int, "
                     r"got " + re.escape(got) + r" \(for Tup\{f32\[3\],f32\[\]\}\)"):
    get(tup, idx)


def test_traced_index_is_a_type_error(tup):
  with pytest.raises(TypeError, match=r"index must be a static Python int, got a traced i32\[\]"):
    jax.jit(lambda t, i: get(t, i)).trace(tup, 1)


# --- autodiff --------------------------------------------------------------------------

def test_grad_through_make_and_get():
  def f(a, b):
    t = hx.make_tup(a, b)
    return jnp.sum(get(t, 0) ** 2) + 3 * get(t, 1)

  ga, gb = jax.grad(f, argnums=(0, 1))(jnp.arange(3., dtype=jnp.float32), jnp.float32(2.))
  np.testing.assert_array_equal(np.asarray(ga), [0., 2., 4.])
  assert float(gb) == 3.0


def test_grad_wrt_tuple_is_tuple_of_tangents(tup):
  g = jax.grad(lambda t: jnp.sum(get(t, 0) ** 2) * get(t, 1))(tup)
  assert short(g) == "Tup{f32[3],f32[]}"
  np.testing.assert_array_equal(np.asarray(get(g, 0)), [0., 10., 20.])
  assert float(get(g, 1)) == 5.0  # sum(x^2) = 5


def test_grad_wrt_nested_tuple_unused_element_is_zero():
  t = hx.make_tup(hx.make_tup(jnp.float32(1.), jnp.float32(2.)), jnp.arange(2., dtype=jnp.float32))
  g = jax.grad(lambda t: get(get(t, 0), 1) * jnp.sum(get(t, 1)))(t)
  assert short(g) == "Tup{Tup{f32[],f32[]},f32[2]}"
  assert float(get(get(g, 0), 0)) == 0.0
  assert float(get(get(g, 0), 1)) == 1.0
  np.testing.assert_array_equal(np.asarray(get(g, 1)), [2., 2.])


def test_grad_wrt_tuple_holding_quantized():
  x = jnp.array([[1., 2., 3.], [4., -5., 6.]], jnp.float32)
  t = hx.make_tup(hx.quantize(x), jnp.float32(3.))
  g = jax.grad(lambda t: jnp.sum(hx.dequantize(get(t, 0)) ** 2) * get(t, 1))(t)
  assert short(g) == "Tup{f32[2,3],f32[]}"  # the q8 element's cotangent is dense
  deq = np.asarray(hx.dequantize(get(t, 0)))
  # 2 * deq * 3: the dequantize product and the product with 3, each side
  assert_within(get(g, 0), 6. * deq, elementwise_bound(6. * deq, 4))
  # sum(deq ** 2): the squares (rounded here in f32 too) summed in any order
  assert_sum_close(get(g, 1), deq ** 2, extra=2)
  # and grads chained through a tuple built inside: straight through quantize
  gx = jax.grad(lambda x: jnp.sum(hx.dequantize(get(hx.make_tup(1., hx.quantize(x)), 1))))(x)
  np.testing.assert_array_equal(np.asarray(gx), np.ones((2, 3), np.float32))


def test_jvp_with_tuple_tangents(tup):
  tangent = hx.make_tup(jnp.ones(3, jnp.float32), jnp.float32(0.5))
  y, dy = jax.jvp(lambda t: jnp.sum(get(t, 0) ** 2) * get(t, 1), (tup,), (tangent,))
  # d[sum(x^2) s] = 2 x . dx s + sum(x^2) ds = 2*3*5 + 5*0.5
  assert float(y) == 25.0 and float(dy) == 32.5
  t, dt = jax.jvp(lambda a: hx.make_tup(a, 2 * a), (jnp.float32(1.),), (jnp.float32(3.),))
  assert short(dt) == "Tup{f32[],f32[]}"
  assert (float(get(dt, 0)), float(get(dt, 1))) == (3.0, 6.0)


def test_linearize_and_transpose_through_tuples():
  def f(a):
    t = hx.make_tup(a, 2 * a)
    return get(t, 1) * 3 + get(t, 0)

  a = jnp.arange(3., dtype=jnp.float32)
  y, f_lin = jax.linearize(f, a)
  np.testing.assert_array_equal(np.asarray(y), 7 * np.arange(3.))
  np.testing.assert_array_equal(np.asarray(f_lin(jnp.ones(3, jnp.float32))), [7., 7., 7.])
  # transposition goes through MakeTup.transpose and GetTupElt.transpose
  (ga,) = jax.linear_transpose(f_lin, a)(jnp.ones(3, jnp.float32))
  np.testing.assert_array_equal(np.asarray(ga), [7., 7., 7.])


# --- vmap and scan -----------------------------------------------------------------------

def swap(t):
  return hx.make_tup(get(t, 1), get(t, 0))


def test_vmap_swap_with_per_component_specs(tup):
  out = jax.vmap(swap, in_axes=hx.TupSpec((0, None)), out_axes=hx.TupSpec((None, 0)),
                 axis_size=3)(tup)
  assert short(tup) == "Tup{f32[3],f32[]}"
  assert short(out) == "Tup{f32[],f32[3]}"
  assert float(get(out, 0)) == 5.0
  np.testing.assert_array_equal(np.asarray(get(out, 1)), [0., 1., 2.])
  # an unmapped element is broadcast to its out_axes entry, as JAX does for arrays
  out2 = jax.vmap(swap, in_axes=hx.TupSpec((0, None)), out_axes=hx.TupSpec((0, 0)),
                  axis_size=3)(tup)
  assert short(out2) == "Tup{f32[3],f32[3]}"
  np.testing.assert_array_equal(np.asarray(get(out2, 0)), [5., 5., 5.])
  np.testing.assert_array_equal(np.asarray(get(out2, 1)), [0., 1., 2.])


@pytest.mark.parametrize("jit", [False, True])
def test_vmap_broadcasts_unmapped_elements_to_out_axes(jit):
  """Elements (arrays, q8, r1, tuples) that do not depend on the mapped input."""
  qw = hx.quantize(jnp.array([[1., -2., 3.], [4., 5., -6.]], jnp.float32))
  r = hx.outer(jnp.array([1., 2.], jnp.float32), jnp.array([3., 4., 5.], jnp.float32))
  q_spec, r_spec = hx.QArraySpec(), hx.Rank1Spec()

  def f(a):
    return hx.make_tup(a, jnp.ones(2, jnp.float32), qw, hx.make_tup(r, 2 * a, qw))

  spec = hx.TupSpec((0, 1, q_spec, hx.TupSpec((r_spec, 0, q_spec))))
  vf = jax.vmap(f, out_axes=spec)
  out = (jax.jit(vf) if jit else vf)(jnp.arange(4., dtype=jnp.float32))
  assert short(out) == "Tup{f32[4],f32[2,4],q8[4,2,3],Tup{r1[4,2,3],f32[4],q8[4,2,3]}}"
  np.testing.assert_array_equal(np.asarray(get(out, 1)), np.ones((2, 4)))
  for q in (get(out, 2), get(get(out, 3), 2)):
    np.testing.assert_array_equal(np.asarray(q.qvalue), np.broadcast_to(qw.qvalue, (4, 2, 3)))
    np.testing.assert_array_equal(np.asarray(q.scale), np.broadcast_to(qw.scale, (4, 2)))
  col, row = hx.factors(get(get(out, 3), 0))
  np.testing.assert_array_equal(np.asarray(col), np.broadcast_to([1., 2.], (4, 2)))
  np.testing.assert_array_equal(np.asarray(row), np.broadcast_to([3., 4., 5.], (4, 3)))


@pytest.mark.parametrize("out_axes, msg", [
    (hx.TupSpec((0, 0)), r"type q8\[2,3\] is not mapped, which out_axes 0 does not fit; "
     r"its type maps with out_axes QArraySpec\(\)"),
    (hx.TupSpec((hx.QArraySpec(), 0)), r"type f32\[4\] is mapped as 0, which out_axes "
     r"QArraySpec\(\) does not fit"),
    (hx.TupSpec((0, hx.Rank1Spec())), r"type q8\[2,3\] is not mapped, which out_axes "
     r"Rank1Spec\(\) does not fit"),
])
def test_vmap_out_axes_that_do_not_fit_are_type_errors(out_axes, msg):
  qw = hx.quantize(jnp.ones((2, 3), jnp.float32))
  with pytest.raises(TypeError, match=msg):
    jax.vmap(lambda a: hx.make_tup(a, qw), out_axes=out_axes)(jnp.ones(4, jnp.float32))


def test_vmap_tuple_holding_quantized():
  xs = jnp.arange(24., dtype=jnp.float32).reshape(4, 2, 3) - 5.
  t = hx.make_tup(hx.quantize(xs), jnp.arange(4., dtype=jnp.float32))
  f = jax.vmap(lambda t: hx.dequantize(get(t, 0)) * get(t, 1),
               in_axes=hx.TupSpec((hx.QArraySpec(), 0)), axis_size=4)
  out = f(t)
  want = np.asarray(hx.dequantize(get(t, 0))) * np.arange(4.)[:, None, None]
  # the dequantize product each side, and the product with t1
  assert_within(out, want, elementwise_bound(want, 3))
  with pytest.raises(TypeError, match=r"hx\.TupSpec of 2 entries"):
    jax.vmap(swap, in_axes=hx.TupSpec((0,)), axis_size=4)(t)


def test_vmap_builds_tuple_out():
  a = jnp.arange(6., dtype=jnp.float32).reshape(3, 2)
  out = jax.vmap(lambda x: hx.make_tup(x, jnp.sum(x)), out_axes=hx.TupSpec((0, 0)))(a)
  assert short(out) == "Tup{f32[3,2],f32[3]}"
  np.testing.assert_array_equal(np.asarray(get(out, 1)), [1., 5., 9.])


def test_scan_tuple_carry_xs_and_ys():
  xs = hx.make_tup(jnp.arange(4., dtype=jnp.float32), jnp.arange(8., dtype=jnp.float32)
                   .reshape(4, 2))

  def body(carry, t):
    s, v = get(carry, 0), get(carry, 1)
    a, b = get(t, 0), get(t, 1)
    return hx.make_tup(s + a, v + b), hx.make_tup(a * 2, jnp.sum(b))

  c0 = hx.make_tup(jnp.float32(0.), jnp.zeros(2, jnp.float32))
  c, ys = jax.lax.scan(body, c0, xs, length=4)
  assert short(c) == "Tup{f32[],f32[2]}"
  assert short(ys) == "Tup{f32[4],f32[4]}"
  assert float(get(c, 0)) == 6.0
  np.testing.assert_array_equal(np.asarray(get(c, 1)), [12., 16.])
  np.testing.assert_array_equal(np.asarray(get(ys, 0)), [0., 2., 4., 6.])
  np.testing.assert_array_equal(np.asarray(get(ys, 1)), [1., 5., 9., 13.])


def test_scan_tuple_with_quantized_element():
  xs = jnp.arange(24., dtype=jnp.float32).reshape(4, 2, 3) - 5.
  stacked = hx.make_tup(hx.quantize(xs), jnp.arange(4., dtype=jnp.float32))

  def body(total, t):
    return total + jnp.sum(hx.dequantize(get(t, 0))) * get(t, 1), None

  total, _ = jax.lax.scan(body, jnp.float32(0.), stacked, length=4)
  deq = np.asarray(hx.dequantize(get(stacked, 0)))
  assert_sum_close(total, deq * np.arange(4.)[:, None, None], extra=1)
