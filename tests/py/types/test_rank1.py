"""Rank-1 matrices ``r1[*b, m, n]``: type, values, autodiff, vmap, scan and bad input.

References materialise the dense matrix ``col ⊗ row`` with numpy or
``jnp.outer``, which the hi primitives never do.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import (
  EPS,
  assert_einsum_close,
  assert_sum_close,
  assert_within,
  dot_bound,
  matmul_grad_bounds,
  polynomial_bound,
)

import hxmlir as hx


@pytest.fixture
def col():
  return jnp.arange(6., dtype=jnp.float32) / 6. - 0.2


@pytest.fixture
def row():
  return jnp.arange(5., dtype=jnp.float32) / 5. + 0.1


@pytest.fixture
def acts():
  return jnp.asarray(np.random.default_rng(5).standard_normal((3, 6)), jnp.float32)


def test_typeof_and_factors(col, row):
  r = hx.outer(col, row)
  assert isinstance(r, hx.Rank1)
  ty = jax.typeof(r)
  assert isinstance(ty, hx.Rank1Ty) and ty.shape == (6, 5)
  assert str(ty) == repr(ty) == "r1[6,5]"
  c, w = hx.factors(r)
  np.testing.assert_array_equal(np.asarray(c), np.asarray(col))
  np.testing.assert_array_equal(np.asarray(w), np.asarray(row))
  assert ty.to_tangent_aval().str_short(short_dtypes=True) == "f32[6,5]"
  assert [a.str_short(short_dtypes=True) for a in ty.lo_ty()] == ["f32[6]", "f32[5]"]


def test_jaxpr_single_value(acts, col, row):
  jaxpr = jax.jit(hx.matmul_r1).trace(acts, hx.outer(col, row)).jaxpr
  assert [v.aval.str_short(short_dtypes=True) for v in jaxpr.jaxpr.invars] == [
      "f32[3,6]", "r1[6,5]"]
  assert len(jaxpr.eqns) == 1
  text = str(jax.jit(lambda c, r: hx.factors(hx.outer(c, r))).trace(col, row).jaxpr)
  assert ":r1[6,5] = call_hi_primitive[_prim=Outer" in text


def test_matmul_r1_equals_dense(acts, col, row):
  r = hx.outer(col, row)
  assert_einsum_close(hx.matmul_r1(acts, r), "pm,m,n->pn", acts, col, row, extra=2)
  assert_einsum_close(jax.jit(hx.matmul_r1)(acts, r), "pm,m,n->pn", acts, col, row, extra=2)


def test_jit_rank1_argument_and_result(col, row):
  r = jax.jit(hx.outer)(col, row)
  assert str(jax.typeof(r)) == "r1[6,5]"
  c, w = jax.jit(hx.factors)(r)
  np.testing.assert_array_equal(np.asarray(c), np.asarray(col))
  np.testing.assert_array_equal(np.asarray(w), np.asarray(row))


def test_batched_rank1():
  rng = np.random.default_rng(6)
  cols = jnp.asarray(rng.standard_normal((2, 4)), jnp.float32)
  rows = jnp.asarray(rng.standard_normal((2, 3)), jnp.float32)
  xs = jnp.asarray(rng.standard_normal((2, 5, 4)), jnp.float32)
  r = hx.outer(cols, rows)
  assert str(jax.typeof(r)) == "r1[2,4,3]"
  assert_einsum_close(hx.matmul_r1(xs, r), "bpm,bm,bn->bpn", xs, cols, rows, extra=2)


# --- autodiff -----------------------------------------------------------------------

def test_grad_wrt_rank1_is_dense_and_matches_reference(acts, col, row):
  r = hx.outer(col, row)
  g = jax.grad(lambda x, r: jnp.sum(hx.matmul_r1(x, r) ** 2), argnums=1)(acts, r)
  assert jax.typeof(g).str_short(short_dtypes=True) == "f32[6,5]"
  dense_grad = jax.grad(lambda x, w: jnp.sum((x @ w) ** 2), argnums=1)
  gd = dense_grad(acts, jnp.outer(col, row))
  # 2 x^T (x (c r^T)): 6-term sums of 3 factors (8 roundings), 2y (1), 3-term sums of
  # 2 factors (4): depth 13, +1 for the reference's rounded outer product; two f32
  # evaluations: twice the bound
  assert_within(g, gd, 2 * polynomial_bound(lambda a, c, r: dense_grad(a, jnp.outer(c, r)),
                                            acts, col, row, depth=14))


def test_grad_wrt_dense_operand(acts, col, row):
  r = hx.outer(col, row)
  g = jax.grad(lambda x: jnp.sum(jnp.cos(hx.matmul_r1(x, r))))(acts)
  gd = jax.grad(lambda x: jnp.sum(jnp.cos(x @ jnp.outer(col, row))))(acts)
  # -sin(x W) W^T, W = c r^T: two products per term (extra 2), sin (1-Lipschitz) within a
  # few ulp; the bound is for two f32 evaluations
  bx, _ = matmul_grad_bounds(acts, np.outer(col, row), lambda y: -np.sin(y), 1.0,
                             eval_err=4 * EPS, extra=2)
  assert_within(g, gd, bx)


def test_grads_through_outer_land_on_factors(acts, col, row):
  def loss(c, w):
    return jnp.sum(hx.matmul_r1(acts, hx.outer(c, w)) ** 2)

  def dense(c, w):
    return jnp.sum((acts @ jnp.outer(c, w)) ** 2)

  gc, gw = jax.grad(loss, argnums=(0, 1))(col, row)
  assert jax.typeof(gc).str_short(short_dtypes=True) == "f32[6]"
  assert jax.typeof(gw).str_short(short_dtypes=True) == "f32[5]"
  rc, rw = jax.grad(dense, argnums=(0, 1))(col, row)
  bc, bw = _loss_grad_bounds(acts, col, row)
  assert_within(gc, rc, bc, "gc: ")
  assert_within(gw, rw, bw, "gw: ")
  gj = jax.jit(jax.grad(loss, argnums=(0, 1)))(col, row)
  assert_within(gj[0], rc, bc, "jit gc: ")


def _loss_grad_bounds(x, c, w):
  """Bounds on two f32 evaluations of the gradients of ``sum((x @ outer(c, w)) ** 2)``
  with respect to ``c`` and ``w``: ``y`` is a sum of ``m`` 3-factor terms (``m + 2``
  roundings), ``2 y`` one more, and each gradient sums ``p * n`` (or ``p * m``) 3-factor
  terms of it: :func:`polynomial_bound` of the gradient, depth ``m + p * max(m, n) + 6``,
  twice (two evaluations)."""
  p, m = np.shape(x)[-2:]
  depth = m + p * max(m, np.shape(w)[-1]) + 6

  def grad(i):
    return lambda a, c, w: jax.grad(lambda c, w: jnp.sum((a @ jnp.outer(c, w)) ** 2),
                                    argnums=i)(c, w)
  return tuple(2 * polynomial_bound(grad(i), x, c, w, depth=depth) for i in (0, 1))


def test_checkpoint_and_linearize(acts, col, row):
  def loss(c, w):
    return jnp.sum(hx.matmul_r1(acts, hx.outer(c, w)) ** 2)

  expected = jax.grad(loss, argnums=(0, 1))(col, row)
  got = jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1)))(col, row)
  for a, b, bound in zip(got, expected, _loss_grad_bounds(acts, col, row)):
    assert_within(a, b, bound)
  r = hx.outer(col, row)
  _, f_lin = jax.linearize(lambda x: hx.matmul_r1(x, r), acts)
  (gx,) = jax.linear_transpose(f_lin, acts)(jnp.ones((3, 5), jnp.float32))
  assert_einsum_close(gx, "pn,m,n->pm", np.ones((3, 5), np.float32), col, row, extra=2)


def test_jvp_outer_and_matmul_r1(acts, col, row):
  dc = jnp.ones_like(col)
  dw = jnp.full_like(row, 0.5)
  y, dy = jax.jvp(lambda c, w: hx.matmul_r1(acts, hx.outer(c, w)), (col, row), (dc, dw))
  ry, rdy = jax.jvp(lambda c, w: acts @ jnp.outer(c, w), (col, row), (dc, dw))
  assert_einsum_close(y, "pm,m,n->pn", acts, col, row, extra=2)
  assert_einsum_close(ry, "pm,m,n->pn", acts, col, row, extra=2)
  # dy = x (dc r^T) + x (c dw^T): two such einsums and their sum (extra 3 each)
  parts = [("pm,m,n->pn", acts, dc, row), ("pm,m,n->pn", acts, col, dw)]
  exact = sum(np.einsum(s, *(np.asarray(o, np.float64) for o in ops)) for s, *ops in parts)
  bound = sum(dot_bound(s, *ops, extra=3) for s, *ops in parts)
  assert_within(dy, exact, bound, "dy: ")
  assert_within(rdy, exact, bound, "reference dy: ")
  # tangent of r1 itself is dense
  r, dr = jax.jvp(hx.outer, (col, row), (dc, jnp.zeros_like(row)))
  assert jax.typeof(dr).str_short(short_dtypes=True) == "f32[6,5]"
  # exact: dc is ones, so each entry is 1 * row[j]
  np.testing.assert_array_equal(np.asarray(dr), np.outer(np.asarray(dc), np.asarray(row)))
  # a dense tangent for an r1 input
  t = jnp.ones((6, 5), jnp.float32)
  _, dy = jax.jvp(lambda r: hx.matmul_r1(acts, r), (r,), (t,))
  assert_einsum_close(dy, "pm,mn->pn", acts, t, extra=1)


# --- vmap and scan --------------------------------------------------------------------

def test_vmap_outer_and_matmul_r1(acts):
  rng = np.random.default_rng(7)
  cols = jnp.asarray(rng.standard_normal((4, 6)), jnp.float32)
  rows = jnp.asarray(rng.standard_normal((4, 5)), jnp.float32)
  rs = jax.vmap(hx.outer, out_axes=hx.Rank1Spec())(cols, rows)
  assert str(jax.typeof(rs)) == "r1[4,6,5]"
  out = jax.vmap(hx.matmul_r1, in_axes=(None, hx.Rank1Spec()), axis_size=4)(acts, rs)
  assert_einsum_close(out, "pm,bm,bn->bpn", acts, cols, rows, extra=2)
  # only one factor mapped, the other broadcast
  rs1 = jax.vmap(hx.outer, in_axes=(0, None), out_axes=hx.Rank1Spec())(cols, rows[0])
  c, w = hx.factors(rs1)
  np.testing.assert_array_equal(np.asarray(w), np.broadcast_to(np.asarray(rows[0]), (4, 5)))
  # only the activations mapped
  xs = jnp.stack([acts, 2 * acts])
  r = hx.outer(cols[0], rows[0])
  out = jax.vmap(hx.matmul_r1, in_axes=(0, None))(xs, r)
  assert_einsum_close(out, "bpm,m,n->bpn", xs, cols[0], rows[0], extra=2)
  with pytest.raises(TypeError, match=r"r1\[4,6,5\] is mapped with hx\.Rank1Spec\(\), got 0"):
    jax.vmap(hx.factors, in_axes=0, axis_size=4)(rs)


@pytest.mark.parametrize("jit", [False, True])
def test_vmap_broadcasts_unmapped_rank1_output(jit):
  r = hx.outer(jnp.array([1., 2.], jnp.float32), jnp.array([3., 4., 5.], jnp.float32))
  f = jax.vmap(lambda a: r, out_axes=hx.Rank1Spec())
  rs = (jax.jit(f) if jit else f)(jnp.ones(4))
  assert str(jax.typeof(rs)) == "r1[4,2,3]"
  col, row = hx.factors(rs)
  np.testing.assert_array_equal(np.asarray(col), np.broadcast_to([1., 2.], (4, 2)))
  np.testing.assert_array_equal(np.asarray(row), np.broadcast_to([3., 4., 5.], (4, 3)))
  # and its gradient lands on the factors, summed over the copies
  g = jax.grad(lambda c: jnp.sum(hx.matmul_r1(
      jnp.ones((4, 1, 2), jnp.float32),
      jax.vmap(lambda a: hx.outer(c, jnp.ones(3, jnp.float32)), out_axes=hx.Rank1Spec())(
          jnp.ones(4)))))(jnp.array([1., 2.], jnp.float32))
  # exact: sums of 12 products of ones
  np.testing.assert_array_equal(np.asarray(g), [12., 12.])
  with pytest.raises(TypeError, match=r"type r1\[2,3\] is not mapped, which out_axes "
                     r"QArraySpec\(\) does not fit; its type maps with out_axes Rank1Spec\(\)"):
    jax.vmap(lambda a: r, out_axes=hx.QArraySpec())(jnp.ones(4))


def test_vmap_of_grad_through_outer(acts):
  rng = np.random.default_rng(8)
  cols = jnp.asarray(rng.standard_normal((3, 6)), jnp.float32)
  rows = jnp.asarray(rng.standard_normal((3, 5)), jnp.float32)

  def loss(c, w):
    return jnp.sum(hx.matmul_r1(acts, hx.outer(c, w)) ** 2)

  g = jax.vmap(jax.grad(loss, argnums=(0, 1)))(cols, rows)
  rg = jax.vmap(jax.grad(lambda c, w: jnp.sum((acts @ jnp.outer(c, w)) ** 2),
                         argnums=(0, 1)))(cols, rows)
  for i in range(3):
    for a, b, bound in zip(g, rg, _loss_grad_bounds(acts, cols[i], rows[i])):
      assert_within(a[i], b[i], bound, f"example {i}: ")


def test_scan_over_stacked_rank1_and_rank1_carry(acts):
  rng = np.random.default_rng(9)
  cols = jnp.asarray(rng.standard_normal((4, 6)), jnp.float32)
  rows = jnp.asarray(rng.standard_normal((4, 6)), jnp.float32)
  rs = hx.outer(cols, rows)  # r1[4,6,6]

  def body(r, r_in):
    c_prev, _ = hx.factors(r)
    c, w = hx.factors(r_in)
    y = hx.matmul_r1(acts, r_in)
    return hx.outer(c_prev + c, w), y

  r0 = hx.outer(jnp.zeros(6, jnp.float32), jnp.zeros(6, jnp.float32))
  r_last, ys = jax.lax.scan(body, r0, rs, length=4)
  assert str(jax.typeof(r_last)) == "r1[6,6]"
  assert ys.shape == (4, 3, 6)
  c_last, w_last = hx.factors(r_last)
  assert_sum_close(c_last, cols, axis=0)
  np.testing.assert_array_equal(np.asarray(w_last), np.asarray(rows[-1]))
  assert_einsum_close(ys, "pm,bm,bn->bpn", acts, cols, rows, extra=2)


# --- bad input --------------------------------------------------------------------------

def test_outer_rejects_bad_factors(col, row):
  with pytest.raises(TypeError, match=r"hx\.outer expects f32\[\*b, m\] and f32\[\*b, n\] "
                     r"factors, got i32\[6\], f32\[5\]"):
    jax.jit(hx.outer).trace(jnp.ones(6, jnp.int32), row)
  with pytest.raises(TypeError, match=r"got f32\[\], f32\[5\]"):
    jax.jit(hx.outer).trace(jnp.float32(1.), row)
  with pytest.raises(TypeError, match=r"different batch dimensions: f32\[2,6\], f32\[3,5\]"):
    jax.jit(hx.outer).trace(jnp.ones((2, 6), jnp.float32), jnp.ones((3, 5), jnp.float32))


def test_inconsistent_factors_are_a_type_error(row):
  bad = hx.Rank1(jnp.ones((2, 6), jnp.float32), row)
  with pytest.raises(TypeError, match=r"hx\.Rank1 needs col: f32\[\*b, m\] and row: "
                     r"f32\[\*b, n\], got col: f32\[2,6\], row: f32\[5\]"):
    jax.typeof(bad)


def test_matmul_r1_rejects_bad_operands(col, row):
  r = hx.outer(col, row)
  with pytest.raises(TypeError, match=r"operand shapes do not match: f32\[3,5\] @ r1\[6,5\]"):
    jax.jit(hx.matmul_r1).trace(jnp.ones((3, 5), jnp.float32), r)
  with pytest.raises(TypeError, match=r"of equal rank: f32\[6\] @ r1\[6,5\]"):
    jax.jit(hx.matmul_r1).trace(jnp.ones((6,), jnp.float32), r)
  # a wrong dtype is named as such, whatever the ranks
  for bad in (jnp.ones((3, 6), jnp.int32), jnp.ones((3, 6), jnp.bfloat16), jnp.ones(6, jnp.int32)):
    with pytest.raises(TypeError, match=r"expects a dense f32 left operand: "
                       + re.escape(jax.typeof(bad).str_short(short_dtypes=True)) + r" @ r1\[6,5\]"):
      jax.jit(hx.matmul_r1).trace(bad, r)
  with pytest.raises(TypeError, match=r"rank-1 right operand r1\[m, n\]: f32\[3,6\] @ f32\[6,5\]"):
    jax.jit(hx.matmul_r1).trace(jnp.ones((3, 6), jnp.float32), jnp.ones((6, 5), jnp.float32))
  with pytest.raises(TypeError, match=r"hx\.factors expects a rank-1 matrix r1\[m, n\], "
                     r"got f32\[6,5\]"):
    jax.jit(hx.factors).trace(jnp.ones((6, 5), jnp.float32))


@pytest.mark.parametrize("transform", ["grad", "jvp", "linearize", "vjp"])
def test_factors_is_not_differentiable(col, row, transform):
  def f(c):
    return jnp.sum(hx.factors(hx.outer(c, row))[1])
  run = {"grad": lambda: jax.grad(f)(col),
         "jvp": lambda: jax.jvp(f, (col,), (col,)),
         "linearize": lambda: jax.linearize(f, col),
         "vjp": lambda: jax.vjp(jax.jit(f), col)}[transform]
  with pytest.raises(TypeError, match=r"hx\.factors is not differentiable: the tangent of "
                     r"r1\[6,5\] is a dense f32 array"):
    run()
  # factors of an r1 that carries no tangent are fine inside a differentiated function
  r = hx.outer(col, row)
  g = jax.grad(lambda c: jnp.sum(hx.factors(r)[0] * c))(col)
  np.testing.assert_array_equal(np.asarray(g), np.asarray(col))


def test_jacfwd_wrt_rank1_equals_jacrev(acts, col, row):
  r = hx.outer(col, row)
  assert (r.size, r.ndim, r.dtype) == (30, 2, jnp.float32)
  f = lambda r: hx.matmul_r1(acts, r)  # noqa: E731
  jf, jr = jax.jacfwd(f)(r), jax.jacrev(f)(r)
  assert jf.shape == (3, 5, 6, 5)
  # exact: each entry is acts[p, m] times a one-hot basis entry, summed with exact zeros
  np.testing.assert_array_equal(np.asarray(jf), np.asarray(jr))
  np.testing.assert_array_equal(np.asarray(jf),
                                np.einsum("pm,nj->pnmj", np.asarray(acts), np.eye(5)))
