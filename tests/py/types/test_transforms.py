"""Quantized arrays under JAX's transformations: ``grad``/``jvp``/``vjp``, ``vmap``, ``scan``.

References are dense computations on ``dequantize``d values (straight-through:
quantization differentiates as the identity) or Python loops over the mapped
axis. Rank-1 matrices and tuples have their own files.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hx_testing import assert_same_q
from numerics import (
  EPS,
  assert_matmul_close,
  assert_sum_close,
  assert_within,
  dot_bound,
  elementwise_bound,
  matmul_grad_bounds,
)

import hxmlir as hx


@pytest.fixture
def w():
  return jnp.arange(12., dtype=jnp.float32).reshape(3, 4) / 12. - 0.3


@pytest.fixture
def xs():
  return jnp.arange(24., dtype=jnp.float32).reshape(4, 2, 3) - 7.


def roundtrip(x):
  return hx.dequantize(hx.quantize(x))


# --- reverse mode ------------------------------------------------------------------

def test_grad_straight_through_quantize_dequantize(x):
  np.testing.assert_array_equal(np.asarray(jax.grad(lambda x: jnp.sum(roundtrip(x)))(x)),
                                np.ones((2, 3), np.float32))
  # d/dx sum(rt(x)^2) = 2 rt(x): the identity's derivative at the quantized point
  g = jax.grad(lambda x: jnp.sum(roundtrip(x) ** 2))(x)
  want = 2 * np.asarray(roundtrip(x))
  # the scale (1/127 and the product) and the dequantize product round on each side
  assert_within(g, want, elementwise_bound(want, 6))


def test_grad_wrt_quantized_array_is_dense_f32(x):
  qx = hx.quantize(x)
  g = jax.grad(lambda q: jnp.sum(hx.dequantize(q) ** 2))(qx)
  assert not isinstance(g, hx.QArray)
  assert jax.typeof(g).str_short(short_dtypes=True) == "f32[2,3]"
  want = 2 * np.asarray(hx.dequantize(qx))
  assert_within(g, want, elementwise_bound(want, 2))  # the dequantize product, each side


def test_grad_matmul_q_both_operands_equal_dense_reference(x, w):
  qw = hx.quantize(w)

  def loss(x, qw):
    return jnp.sum(jnp.sin(hx.matmul_q(x, qw)) ** 2)

  def dense_loss(x, wd):
    return jnp.sum(jnp.sin(x @ wd) ** 2)

  gx, gw = jax.grad(loss, argnums=(0, 1))(x, qw)
  rx, rw = jax.grad(dense_loss, argnums=(0, 1))(x, hx.dequantize(qw))
  assert jax.typeof(gw).str_short(short_dtypes=True) == "f32[3,4]"
  # d/dy sum(sin(y)^2) = sin(2y): 2-Lipschitz, a few ulps to evaluate
  bx, bw = matmul_grad_bounds(x, hx.dequantize(qw), lambda y: np.sin(2 * y), lipschitz=2,
                              eval_err=4 * EPS)
  assert_within(gx, rx, bx)
  assert_within(gw, rw, bw)
  # and under jit, with the quantization itself inside the differentiated function
  gx2, gw2 = jax.jit(jax.grad(lambda x, w: loss(x, hx.quantize(w)), argnums=(0, 1)))(x, w)
  assert_within(gx2, rx, bx)
  assert_within(gw2, rw, bw)


def test_grad_matmul_q_batched_operands():
  rng = np.random.default_rng(3)
  xb = jnp.asarray(rng.standard_normal((2, 3, 5)), jnp.float32)
  qw = hx.quantize(jnp.asarray(rng.standard_normal((2, 5, 4)), jnp.float32))
  gx, gw = jax.grad(lambda x, q: jnp.sum(hx.matmul_q(x, q) ** 2), argnums=(0, 1))(xb, qw)
  rx, rw = jax.grad(lambda x, w: jnp.sum((x @ w) ** 2), argnums=(0, 1))(xb, hx.dequantize(qw))
  bx, bw = matmul_grad_bounds(xb, hx.dequantize(qw), lambda y: 2 * y, lipschitz=2)
  assert_within(gx, rx, bx)
  assert_within(gw, rw, bw)


def test_vjp_cotangent_of_quantized_input_is_dense(x, w):
  qw = hx.quantize(w)
  y, pullback = jax.vjp(hx.matmul_q, x, qw)
  ct = jnp.ones_like(y)
  gx, gw = pullback(ct)
  assert_matmul_close(gw, np.asarray(x).T, np.ones((2, 4), np.float32))
  assert_matmul_close(gx, np.ones((2, 4), np.float32), np.asarray(hx.dequantize(qw)).T, extra=1)


# --- forward mode -------------------------------------------------------------------

def test_jvp_tangent_of_q8_is_dense_f32(x):
  t = jnp.full_like(x, 0.25)
  qx, dq = jax.jvp(hx.quantize, (x,), (t,))
  assert isinstance(qx, hx.QArray)
  assert jax.typeof(dq).str_short(short_dtypes=True) == "f32[2,3]"
  np.testing.assert_array_equal(np.asarray(dq), np.asarray(t))  # straight through
  y, dy = jax.jvp(hx.dequantize, (qx,), (t,))
  np.testing.assert_array_equal(np.asarray(y), np.asarray(hx.dequantize(qx)))
  np.testing.assert_array_equal(np.asarray(dy), np.asarray(t))


def test_jvp_matmul_q_equals_dense_reference(x, w):
  qw = hx.quantize(w)
  wd = hx.dequantize(qw)
  tx = jnp.arange(6., dtype=jnp.float32).reshape(2, 3) / 6.
  tw = jnp.ones((3, 4), jnp.float32) / 3.
  y, dy = jax.jvp(hx.matmul_q, (x, qw), (tx, tw))
  ry, rdy = jax.jvp(jnp.matmul, (x, wd), (tx, tw))
  assert_within(y, ry, 2 * dot_bound("mk,kn->mn", x, wd, extra=1))
  # dy = tx @ wd + x @ tw: two sums of 3 terms added (one more rounding each)
  assert_within(dy, rdy, 2 * (dot_bound("mk,kn->mn", tx, wd, extra=2)
                              + dot_bound("mk,kn->mn", x, tw, extra=2)))
  # one operand's tangent only (the other a symbolic zero)
  _, dy_x = jax.jvp(lambda x: hx.matmul_q(x, qw), (x,), (tx,))
  assert_matmul_close(dy_x, tx, wd, extra=1)
  _, dy_w = jax.jvp(lambda q: hx.matmul_q(x, q), (qw,), (tw,))
  assert_matmul_close(dy_w, x, tw, extra=1)


def test_jacfwd_wrt_quantized_equals_jacrev(x, w):
  # jacfwd's basis is the dense f32 tangent space of the q8 (as for grad: straight-through)
  qw = hx.quantize(w)
  assert (qw.size, qw.ndim, qw.dtype) == (12, 2, jnp.float32)
  for f in (lambda q: hx.matmul_q(x[:, :3], q), lambda q: jnp.sum(hx.dequantize(q) ** 2)):
    jf, jr = jax.jacfwd(f)(qw), jax.jacrev(f)(qw)
    assert jf.shape == jr.shape
    # exact: products with one-hot basis entries, sums with exact zeros, factors of 2
    np.testing.assert_array_equal(np.asarray(jf), np.asarray(jr))
  np.testing.assert_array_equal(np.asarray(jax.jacfwd(lambda q: hx.matmul_q(x[:, :3], q))(qw)),
                                np.einsum("mk,nj->mnkj", np.asarray(x[:, :3]), np.eye(4)))


def test_jit_of_jvp(x):
  t = jnp.ones_like(x)
  y, dy = jax.jit(lambda x, t: jax.jvp(lambda x: roundtrip(x) ** 2, (x,), (t,)))(x, t)
  want = 2 * np.asarray(roundtrip(x))
  # the scale (1/127 and the product) and the dequantize product round on each side
  assert_within(dy, want, elementwise_bound(want, 6))


def test_linearize_and_linear_transpose_matmul_q(x, w):
  qw = hx.quantize(w)
  wd = np.asarray(hx.dequantize(qw))
  y, f_lin = jax.linearize(lambda x: hx.matmul_q(x, qw), x)
  tx = jnp.full_like(x, 0.5)
  assert_matmul_close(y, x, wd, extra=1)
  assert_matmul_close(f_lin(tx), tx, wd, extra=1)
  ct = jnp.ones((2, 4), jnp.float32)
  (gx,) = jax.linear_transpose(f_lin, x)(ct)  # uses MatmulQ.transpose
  assert_matmul_close(gx, np.ones((2, 4), np.float32), wd.T, extra=1)
  _, f_st = jax.linearize(roundtrip, x)
  np.testing.assert_array_equal(np.asarray(f_st(tx)), np.asarray(tx))


def test_checkpoint_grad_equals_plain_grad(x, w):
  def loss(x, w):
    return jnp.sum(hx.matmul_q(x, hx.quantize(w)) ** 2)

  expected = jax.grad(loss, argnums=(0, 1))(x, w)
  for g in (jax.grad(jax.checkpoint(loss), argnums=(0, 1))(x, w),
            jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1)))(x, w)):
    for a, b, bound in zip(g, expected, matmul_grad_bounds(
        x, hx.dequantize(hx.quantize(w)), lambda y: 2 * y, lipschitz=2)):
      assert_within(a, b, bound)


def test_second_order(x, w):
  qw = hx.quantize(w)
  wd = np.asarray(hx.dequantize(qw))
  h = jax.hessian(lambda x: jnp.sum(hx.matmul_q(x, qw) ** 2))(x)
  # d2/dx2 sum((x W)^2) = 2 delta_ij (W W^T)_kl
  expected = 2 * np.einsum("ij,kl->ikjl", np.eye(2), wd.astype(np.float64) @ wd.T)
  assert_within(h, expected,
                2 * np.einsum("ij,kl->ikjl", np.ones((2, 2)),
                              dot_bound("kn,ln->kl", wd, wd, extra=2)))


def test_control_flow_with_hi_values(x):
  qx = hx.quantize(x)
  doubled = jax.lax.fori_loop(0, 3, lambda i, q: hx.quantize(2 * hx.dequantize(q)), qx)
  # 3 steps of a dequantize product, a scale product and 127 * f32(1/127) != 1, one
  # step on the other side
  assert_same_q(doubled, hx.quantize(8 * hx.dequantize(qx)), scale_roundings=12)
  picked = jax.jit(lambda p, q: jax.lax.cond(p, lambda q: q,
                                             lambda q: hx.quantize(-hx.dequantize(q)), q))
  assert_same_q(picked(True, qx), qx)
  assert_same_q(picked(False, qx), hx.quantize(-x), scale_roundings=6)  # 2 scales, a product


# --- hi values closed over by jit (constants of the traced function) ---------------

def _consts():
  """Hi constants and a dense reading of each: ``(name, const, read, want)``."""
  x = jnp.array([[1., 2., 3.], [4., -5., 6.]], jnp.float32)
  qx = hx.quantize(x)
  r = hx.outer(jnp.array([1., 2.], jnp.float32), jnp.array([3., 4., 5.], jnp.float32))
  rd = np.outer([1., 2.], [3., 4., 5.])
  qd = np.asarray(hx.dequantize(qx))
  get = hx.get_tuple_element
  return [
      ("q8", qx, hx.dequantize, qd),
      ("q8 matmul", qx, lambda q: hx.matmul_q(jnp.eye(2, dtype=jnp.float32), q), qd),
      ("r1 factors", r, lambda r: hx.factors(r)[0][:, None] * hx.factors(r)[1], rd),
      ("r1 matmul", r, lambda r: hx.matmul_r1(jnp.eye(2, dtype=jnp.float32), r), rd),
      ("Tup{f32}", hx.make_tup(x), lambda t: get(t, 0), np.asarray(x)),
      ("Tup{f32,f32[]} last", hx.make_tup(x, 7.), lambda t: get(t, -1) + 0 * get(t, 0),
       np.full((2, 3), 7.)),
      ("Tup{Tup{f32}}", hx.make_tup(hx.make_tup(1., x)), lambda t: get(get(t, 0), 1),
       np.asarray(x)),
      ("Tup{q8}", hx.make_tup(qx, 2.), lambda t: hx.dequantize(get(t, 0)) * get(t, 1), 2 * qd),
      ("Tup{r1}", hx.make_tup(r), lambda t: hx.factors(get(t, 0))[0][:, None]
       * hx.factors(get(t, 0))[1], rd),
      ("Tup{Tup{q8},r1}", hx.make_tup(hx.make_tup(qx), r),
       lambda t: hx.dequantize(get(get(t, 0), 0)), qd),
  ]


@pytest.mark.parametrize("name, const, read, want", _consts(), ids=[c[0] for c in _consts()])
def test_jit_closing_over_hi_constants(name, const, read, want):
  y = jnp.ones(want.shape, jnp.float32)
  # each reading rounds at most once (a dequantize or factor product; products with
  # the ones and zeros of eye exact), and + 1 once more; want is the same reading
  bound = elementwise_bound(want, 2)
  assert_within(jax.jit(lambda: read(const))(), want, bound)
  assert_within(jax.jit(lambda y: read(const) + y)(y), want + 1,
                elementwise_bound(np.abs(want) + 1, 3))
  # the constant itself as the result, and its elements as results of their own
  back = jax.jit(lambda y: (const, read(const) * y))(y)
  assert jax.typeof(back[0]) == jax.typeof(const)
  assert_within(read(back[0]), want, bound)
  # and under grad: the constant carries no tangent
  g = jax.grad(lambda y: jnp.sum(read(const) * y))(y)
  assert_within(g, want, bound)


# --- vmap ----------------------------------------------------------------------------

def test_vmap_to_quantized_output(xs):
  qxs = jax.vmap(hx.quantize, out_axes=hx.QArraySpec())(xs)
  assert str(jax.typeof(qxs)) == "q8[4,2,3]"
  assert qxs.qvalue.shape == (4, 2, 3) and qxs.scale.shape == (4, 2)
  assert_same_q(qxs, hx.quantize(xs))  # per-row scales: a batch is one bigger q8


def test_vmap_hi_output_with_default_out_axes_says_which_spec(xs):
  # a mapped hi output with the default out_axes=0: the message gives the out_axes that fits
  with pytest.raises(TypeError, match=r"type q8\[4,2,3\] is mapped as QArraySpec\(\), which "
                     r"out_axes 0 does not fit; pass out_axes=hx\.QArraySpec\(\)"):
    jax.vmap(hx.quantize)(xs)
  with pytest.raises(TypeError, match=r"pass out_axes=hx\.QArraySpec\(\)"):
    jax.vmap(hx.make_qarray)(jnp.ones((4, 2, 3), jnp.int8), jnp.ones((4, 2), jnp.float32))
  with pytest.raises(TypeError, match=r"pass out_axes=hx\.Rank1Spec\(\)"):
    jax.vmap(hx.outer)(xs[:, 0], xs[:, 1])
  with pytest.raises(TypeError, match=r"pass out_axes=hx\.TupSpec\(\(0, hx\.QArraySpec\(\)\)\)"):
    jax.vmap(lambda x: hx.make_tup(x, hx.quantize(x)))(xs)


def test_vmap_mapped_axis_not_leading(xs):
  qxs = jax.vmap(hx.quantize, in_axes=1, out_axes=hx.QArraySpec())(xs)
  assert str(jax.typeof(qxs)) == "q8[2,4,3]"
  assert_same_q(qxs, hx.quantize(jnp.moveaxis(xs, 1, 0)))


def test_vmap_over_quantized_input_needs_spec_and_axis_size(xs):
  qxs = hx.quantize(xs)
  out = jax.vmap(hx.dequantize, in_axes=hx.QArraySpec(), axis_size=4)(qxs)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(hx.dequantize(qxs)))
  # a plain int is an array axis, not a spec for a q8
  with pytest.raises(TypeError, match=r"q8\[4,2,3\] is mapped with hx\.QArraySpec\(\), got 0"):
    jax.vmap(hx.dequantize, in_axes=0, axis_size=4)(qxs)
  with pytest.raises(ValueError, match=r"has size 4, but the mapped size is 3"):
    jax.vmap(hx.dequantize, in_axes=hx.QArraySpec(), axis_size=3)(qxs)


def test_vmap_quantized_in_and_out(xs):
  qxs = hx.quantize(xs)
  out = jax.vmap(lambda q: hx.quantize(2 * hx.dequantize(q)), in_axes=hx.QArraySpec(),
                 out_axes=hx.QArraySpec(), axis_size=4)(qxs)
  assert_same_q(out, hx.quantize(2 * hx.dequantize(qxs)))


@pytest.mark.parametrize("jit", [False, True])
def test_vmap_broadcasts_unmapped_quantized_output(xs, jit):
  """A q8 output that does not depend on the mapped input: ``size`` copies, as for arrays."""
  qw = hx.quantize(xs[0])

  def check(f, *args):
    out = (jax.jit(f) if jit else f)(*args)
    assert str(jax.typeof(out)) == "q8[4,2,3]"
    np.testing.assert_array_equal(np.asarray(out.qvalue), np.broadcast_to(qw.qvalue, (4, 2, 3)))
    np.testing.assert_array_equal(np.asarray(out.scale), np.broadcast_to(qw.scale, (4, 2)))

  spec = hx.QArraySpec()
  check(jax.vmap(lambda a: hx.quantize(xs[0]), out_axes=spec), jnp.ones(4))
  check(jax.vmap(lambda a, q: q, in_axes=(0, None), out_axes=spec), jnp.ones(4), qw)
  check(jax.vmap(lambda q: q, in_axes=None, out_axes=spec, axis_size=4), qw)
  # nested: the inner broadcast is mapped by the outer vmap (new axis behind the outer one)
  qws = hx.quantize(xs)
  out = jax.vmap(jax.vmap(lambda a, q: q, in_axes=(0, None), out_axes=spec),
                 in_axes=(0, spec), out_axes=spec)(jnp.ones((4, 5)), qws)
  assert str(jax.typeof(out)) == "q8[4,5,2,3]"
  np.testing.assert_array_equal(np.asarray(out.qvalue),
                                np.broadcast_to(np.asarray(qws.qvalue)[:, None], (4, 5, 2, 3)))
  np.testing.assert_array_equal(np.asarray(out.scale),
                                np.broadcast_to(np.asarray(qws.scale)[:, None], (4, 5, 2)))


def test_grad_and_jvp_through_broadcast_unmapped_output(x, w):
  # each of the 4 copies of quantize(w) contributes x @ w: the gradient sums them
  qspec = hx.QArraySpec()

  def loss(x, w):
    qws = jax.vmap(lambda a: hx.quantize(w), out_axes=qspec)(jnp.ones(4))
    return jnp.sum(hx.matmul_q(jnp.broadcast_to(x, (4, *x.shape)), qws))

  gx, gw = jax.grad(loss, argnums=(0, 1))(x, w)
  wd = np.asarray(hx.dequantize(hx.quantize(w)))
  assert_matmul_close(gx, np.ones((4, 2, 4)), wd, "bmn,kn->mk", extra=1)
  assert_matmul_close(gw, np.broadcast_to(x, (4, 2, 3)), np.ones((4, 2, 4)), "bmk,bmn->kn")
  _, t = jax.jvp(lambda w: hx.dequantize(jax.vmap(lambda a: hx.quantize(w), out_axes=qspec)(
      jnp.ones(3))), (w,), (jnp.ones_like(w),))
  np.testing.assert_array_equal(np.asarray(t), np.ones((3, 3, 4)))


def test_vmap_of_jit(xs):
  qxs = hx.quantize(xs)
  out = jax.vmap(jax.jit(hx.dequantize), in_axes=hx.QArraySpec(), axis_size=4)(qxs)
  assert jax.typeof(out).str_short(short_dtypes=True) == "f32[4,2,3]"
  np.testing.assert_array_equal(np.asarray(out), np.asarray(hx.dequantize(qxs)))
  qys = jax.vmap(jax.jit(hx.quantize), out_axes=hx.QArraySpec())(xs)
  assert_same_q(qys, qxs)


def test_jit_of_vmap(xs):
  f = jax.jit(jax.vmap(roundtrip))
  np.testing.assert_array_equal(np.asarray(f(xs)), np.asarray(roundtrip(xs)))


def test_vmap_of_grad(xs):
  g = jax.vmap(jax.grad(lambda x: jnp.sum(roundtrip(x) ** 2)))(xs)
  assert g.shape == (4, 2, 3)
  want = 2 * np.asarray(roundtrip(xs))
  # the scale (1/127 and the product) and the dequantize product round on each side
  assert_within(g, want, elementwise_bound(want, 6))


def test_vmap_of_grad_wrt_quantized(xs):
  qxs = hx.quantize(xs)
  g = jax.vmap(jax.grad(lambda q: jnp.sum(hx.dequantize(q) ** 2)), in_axes=hx.QArraySpec(),
               axis_size=4)(qxs)
  want = 2 * np.asarray(hx.dequantize(qxs))
  assert_within(g, want, elementwise_bound(want, 2))  # the dequantize product, each side


def test_grad_of_vmap(xs):
  g = jax.grad(lambda xs: jnp.sum(jax.vmap(roundtrip)(xs) ** 2))(xs)
  want = 2 * np.asarray(roundtrip(xs))
  # the scale (1/127 and the product) and the dequantize product round on each side
  assert_within(g, want, elementwise_bound(want, 6))


@pytest.mark.parametrize("in_axes", [(0, None), (None, "spec"), (0, "spec"), (1, "spec")])
def test_vmap_matmul_q(in_axes):
  rng = np.random.default_rng(4)
  b = 3
  xb = jnp.asarray(rng.standard_normal((b, 2, 5)), jnp.float32)
  wb = jnp.asarray(rng.standard_normal((b, 5, 4)), jnp.float32)
  qwb = hx.quantize(wb)
  ax, aw = in_axes
  x_arg = xb if ax == 0 else (jnp.moveaxis(xb, 0, 1) if ax == 1 else xb[0])
  w_arg = qwb if aw == "spec" else hx.quantize(wb[0])
  spec_w = hx.QArraySpec() if aw == "spec" else None
  out = jax.vmap(hx.matmul_q, in_axes=(ax, spec_w), axis_size=b)(x_arg, w_arg)
  wd = np.asarray(hx.dequantize(w_arg))
  xd = np.asarray(xb if ax is not None else jnp.broadcast_to(xb[0], xb.shape))
  wd = wd if aw == "spec" else np.broadcast_to(wd, (b, *wd.shape))
  assert_matmul_close(out, xd, wd, "bmk,bkn->bmn", extra=1)


def test_scan_of_vmap(xs):
  def body(c, x):  # x: f32[2,3], vmapped over its rows inside the loop
    q = jax.vmap(hx.quantize, out_axes=hx.QArraySpec())(x[:, None, :])
    return c + jnp.sum(hx.dequantize(q)), q

  total, qs = jax.lax.scan(body, jnp.float32(0.), xs)
  assert str(jax.typeof(qs)) == "q8[4,2,1,3]"
  assert_same_q(qs, hx.quantize(xs[:, :, None, :]), scale_roundings=4)  # a scale each side
  assert_sum_close(total, hx.dequantize(qs))


def test_nested_vmap(xs):
  xss = jnp.stack([xs, -xs])
  qss = jax.vmap(jax.vmap(hx.quantize, out_axes=hx.QArraySpec()),
                 out_axes=hx.QArraySpec())(xss)
  assert str(jax.typeof(qss)) == "q8[2,4,2,3]"
  assert_same_q(qss, hx.quantize(xss))


# --- scan -----------------------------------------------------------------------------

def test_scan_over_stacked_quantized(xs):
  qxs = hx.quantize(xs)

  def body(total, q):
    return total + jnp.sum(hx.dequantize(q)), jnp.max(hx.dequantize(q))

  total, maxes = jax.lax.scan(body, jnp.float32(0.), qxs, length=4)
  deq = np.asarray(hx.dequantize(qxs))
  assert_sum_close(total, deq)
  np.testing.assert_array_equal(np.asarray(maxes), deq.max(axis=(1, 2)))


def test_scan_hi_carry_and_stacked_hi_outputs(xs):
  def body(qtotal, x):
    return hx.quantize(hx.dequantize(qtotal) + x), hx.quantize(2 * x)

  qzero = hx.quantize(jnp.zeros((2, 3), jnp.float32))
  qtotal, qys = jax.lax.scan(body, qzero, xs)
  assert str(jax.typeof(qtotal)) == "q8[2,3]"
  assert str(jax.typeof(qys)) == "q8[4,2,3]"
  # the same loop, unrolled in Python (eagerly, op by op); XLA may compile the
  # scale's division by 127 differently in a loop body, hence 1-ulp slack there
  q = qzero
  for i in range(4):
    q, y = body(q, xs[i])
    np.testing.assert_array_equal(np.asarray(qys.qvalue[i]), np.asarray(y.qvalue))
    assert_within(qys.scale[i], y.scale, elementwise_bound(y.scale, 4))  # a scale each side
  # 4 steps of a dequantize product, a sum and a scale, on each side
  assert_same_q(qtotal, q, scale_roundings=24)
  # jitted, the same again
  jt, jys = jax.jit(lambda q, xs: jax.lax.scan(body, q, xs))(qzero, xs)
  assert_same_q(jt, qtotal, scale_roundings=24)
  assert_same_q(jys, qys, scale_roundings=4)


def test_scan_with_only_hi_xs_needs_length(xs):
  qxs = hx.quantize(xs)
  with pytest.raises(ValueError, match="must provide `length`"):
    jax.lax.scan(lambda c, q: (c, None), jnp.float32(0.), qxs)


def test_grad_through_scan_with_hi_carry(xs):
  def f(xs):
    def body(qtotal, x):
      return hx.quantize(hx.dequantize(qtotal) + x), hx.quantize(2 * x)
    qt, qys = jax.lax.scan(body, hx.quantize(jnp.zeros((2, 3), jnp.float32)), xs)
    return jnp.sum(hx.dequantize(qt)) + jnp.sum(hx.dequantize(qys))

  # straight through: d/dxs [sum(sum_t x_t) + sum(2 xs)] = 1 + 2
  # exact: cotangents 1 and 2 passed straight through and summed
  np.testing.assert_array_equal(np.asarray(jax.grad(f)(xs)), np.full((4, 2, 3), 3., np.float32))


def test_scan_matmul_q_over_stacked_weights(xs):
  qws = hx.quantize(jnp.swapaxes(xs, 1, 2))  # q8[4,3,2]
  h0 = jnp.ones((1, 3), jnp.float32)

  def body(h, qw):
    y = hx.matmul_q(h, qw)  # f32[1,2]
    return jnp.tile(y, (1, 2))[:, :3], y[0]

  h, ys = jax.lax.scan(body, h0, qws, length=4)
  hr = np.asarray(h0, np.float64)  # exact (float64) chain and its error bound
  err = np.zeros_like(hr)
  wd = np.asarray(hx.dequantize(qws))
  for i in range(4):
    # the carry's error passes through |W|, plus this step's rounding of the sum
    err = np.abs(err) @ np.abs(wd[i]) + dot_bound("mk,kn->mn", np.abs(hr) + err, wd[i], extra=1)
    y = hr @ wd[i]
    assert_within(ys[i], y[0], err[0])
    hr, err = np.tile(y, (1, 2))[:, :3], np.tile(err, (1, 2))[:, :3]
  assert_within(h, hr, err)
