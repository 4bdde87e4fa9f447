"""``vmap`` of ``lax.scan`` / ``while_loop`` / ``fori_loop`` / ``cond`` / ``switch`` with hi values.

Every case is checked, eagerly and under ``jit``, against a Python loop over the
batch running the same function on one example at a time.
Batched q8 values are stacked from their per-example components, so the loop and
the ``vmap`` see bitwise the same inputs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hxmlir as hx

QS = hx.QArraySpec()
B, T = 3, 4
X = jnp.arange(B * 4 * 8, dtype=jnp.float32).reshape(B, 4, 8) / 10 - 3
PRED = jnp.array([True, False, True])
F32_EPS = float(np.finfo(np.float32).eps)


def _stack_q(qs):
  """A batched ``q8[B, ...]`` stacked from per-example ``q8[...]`` values."""
  return hx.QArray(jnp.stack([q.qvalue for q in qs]), jnp.stack([q.scale for q in qs]))


def _take(v, b):
  """Example ``b`` of a batched value (``None``: not batched, passed as it is)."""
  if isinstance(v, hx.QArray):
    return hx.QArray(v.qvalue[b], v.scale[b])
  return v[b]


def _leaves(v):
  if isinstance(v, hx.QArray):
    return [v.qvalue, v.scale]
  if isinstance(v, hx.Rank1):
    return [v.col, v.row]
  if isinstance(v, hx.HiTup):
    return [a for e in v.elts for a in _leaves(e)]
  if isinstance(v, (tuple, list)):
    return [a for e in v for a in _leaves(e)]
  return [v]


def _check_against_loop(f, args, in_axes, out_axes=0, atol=0.0, axis_size=None):
  """``vmap(f)`` (eager and jit) equals ``f`` looped over the batch, leaf by leaf."""
  size = axis_size or B
  loop = [f(*[a if ax is None else _take(a, b) for a, ax in zip(args, in_axes)])
          for b in range(size)]
  want = [np.stack(z) for z in zip(*map(_leaves, loop))]
  vf = jax.vmap(f, in_axes=in_axes, out_axes=out_axes, axis_size=axis_size)
  for g in (vf, jax.jit(vf)):
    got = _leaves(g(*args))
    assert len(got) == len(want)
    for a, w in zip(got, want):
      np.testing.assert_allclose(np.asarray(a), w, rtol=0, atol=atol)


QX = _stack_q([hx.quantize(X[b]) for b in range(B)])


def _double(q):
  return hx.quantize(hx.dequantize(q) * 2)


# --- scan --------------------------------------------------------------------------

def test_scan_batched_q8_const():
  def f(q, x):
    return jax.lax.scan(lambda c, _: (c + hx.dequantize(q).sum() * x, None), jnp.zeros(()),
                        None, length=2)[0]
  _check_against_loop(f, (QX, jnp.arange(B, dtype=jnp.float32)), (QS, 0))


def test_scan_batched_q8_carry():
  def f(q):
    return hx.dequantize(jax.lax.scan(lambda q, _: (_double(q), None), q, None, length=T)[0])
  _check_against_loop(f, (QX,), (QS,), axis_size=B)


def test_scan_q8_built_in_body_from_batched_input():
  def f(x):
    def body(c, _):
      q = hx.quantize(c)
      return hx.dequantize(q) + 1, q
    c, ys = jax.lax.scan(body, x, None, length=T)
    return c, hx.dequantize(ys)
  _check_against_loop(f, (X,), (0,))


def test_scan_batched_q8_xs_and_q8_ys_out_of_vmap():
  xs = jnp.arange(B * T * 4 * 8, dtype=jnp.float32).reshape(B, T, 4, 8) / 7 - 2
  qxs = _stack_q([_stack_q([hx.quantize(xs[b, t]) for t in range(T)]) for b in range(B)])

  def f(qx):  # q8[T,4,8] scanned; q8 ys returned as a hi value
    return jax.lax.scan(lambda c, q: (c + hx.dequantize(q), _double(q)), jnp.zeros((4, 8)), qx,
                        length=T)  # JAX needs length= to scan over hi xs
  _check_against_loop(f, (qxs,), (QS,), out_axes=(0, QS), axis_size=B)


def test_scan_tup_r1_carry():
  def f(x):
    def body(t, _):
      col, row = hx.factors(hx.get_tuple_element(t, 1))
      return hx.make_tup(hx.get_tuple_element(t, 0) + 1, hx.outer(col * 2, row)), None
    t = jax.lax.scan(body, hx.make_tup(x, hx.outer(x[0], x[1])), None, length=3)[0]
    return hx.get_tuple_element(t, 0), hx.factors(hx.get_tuple_element(t, 1))
  _check_against_loop(f, (X,), (0,))


# --- while_loop / fori_loop ----------------------------------------------------------

def _plus_one(q):
  return hx.quantize(hx.dequantize(q) + 1)


def test_while_loop_q8_carry():
  def f(q):
    return hx.dequantize(jax.lax.while_loop(lambda c: c[0] < 2,
                                            lambda c: (c[0] + 1, _plus_one(c[1])), (0, q))[1])
  _check_against_loop(f, (QX,), (QS,), axis_size=B)


def test_while_loop_batched_predicate_q8_carry():
  def f(q, n):
    return hx.dequantize(jax.lax.while_loop(lambda c: c[0] < n,
                                            lambda c: (c[0] + 1, _plus_one(c[1])), (0, q))[1])
  _check_against_loop(f, (QX, jnp.array([0, 1, 3])), (QS, 0))


@pytest.mark.parametrize("batched_n", [False, True])
def test_fori_loop_q8_carry(batched_n):
  def f(q, n):
    return hx.dequantize(jax.lax.fori_loop(0, n, lambda i, q: _plus_one(q), q))
  ns = jnp.array([0, 2, 1]) if batched_n else 2
  _check_against_loop(f, (QX, ns), (QS, 0 if batched_n else None), axis_size=B)


# --- vmap(grad) through scan ---------------------------------------------------------

W = jnp.ones((8, 8)) / 8


def _tanh_scan(x, qw):
  return jax.lax.scan(lambda c, _: (jnp.tanh(hx.matmul_q(c, qw)), None), x, None, length=2)[0].sum()


def _grad_tol(x):
  # two tanh(x @ w) layers and their transposes, |w| <= 1/8 * 8 = 1 per row: a few ulp
  # of the largest partial sum, per reduction of length 8
  return 64 * F32_EPS * float(jnp.abs(x).sum(-1).max() + 1)


def test_vmap_grad_scan_wrt_batched_activation():
  x2 = X[:, :2]
  qw = hx.quantize(W)
  _check_against_loop(jax.grad(_tanh_scan), (x2, qw), (0, None), atol=_grad_tol(x2))


def test_vmap_grad_scan_wrt_batched_q8_weight():
  x2 = X[:, :2]
  qws = _stack_q([hx.quantize(W * (b + 1)) for b in range(B)])
  _check_against_loop(jax.grad(_tanh_scan, argnums=1), (x2, qws), (0, QS), atol=_grad_tol(x2))


def test_vmap_grad_scan_q8_carry():
  def f(q):
    body = lambda q, _: (hx.quantize(jnp.sin(hx.dequantize(q))), None)  # noqa: E731
    return hx.dequantize(jax.lax.scan(body, q, None, length=2)[0]).sum()
  _check_against_loop(jax.grad(f), (QX,), (QS,), axis_size=B)


# --- cond / switch with a batched predicate -------------------------------------------

def _cond_double(p, q):
  return hx.dequantize(jax.lax.cond(p, _double, lambda q: q, q))


def test_cond_batched_predicate_batched_q8():
  _check_against_loop(_cond_double, (PRED, QX), (0, QS))


def test_cond_batched_predicate_unbatched_q8():
  _check_against_loop(_cond_double, (PRED, hx.quantize(X[0])), (0, None))


def test_cond_batched_predicate_q8_result_out_of_vmap():
  f = lambda p, x: jax.lax.cond(p, hx.quantize, lambda x: hx.quantize(-x), x)  # noqa: E731
  _check_against_loop(f, (PRED, X), (0, 0), out_axes=QS)


def test_switch_batched_index_q8_result():
  branches = [hx.quantize, lambda x: hx.quantize(x * 3), lambda x: hx.quantize(-x)]
  f = lambda i, x: hx.dequantize(jax.lax.switch(i, branches, x))  # noqa: E731
  _check_against_loop(f, (jnp.array([2, 0, 1]), X), (0, 0))


def test_cond_batched_predicate_tup_r1_result():
  def f(p, x):
    t = jax.lax.cond(p, lambda x: hx.make_tup(x, hx.outer(x[0], x[1])),
                     lambda x: hx.make_tup(-x, hx.outer(x[1], x[0])), x)
    return hx.get_tuple_element(t, 0), hx.factors(hx.get_tuple_element(t, 1))
  _check_against_loop(f, (PRED, X), (0, 0))


def test_vmap_vmap_cond():
  pp = jnp.array([[True, False], [False, True], [True, True]])
  xx = jnp.stack([X, X + 1], 1)  # [3, 2, 4, 8]
  inner = lambda p, x: hx.dequantize(  # noqa: E731
      jax.lax.cond(p, lambda x: hx.quantize(x * 2), lambda x: hx.quantize(-x), x))
  _check_against_loop(jax.vmap(inner), (pp, xx), (0, 0))


def test_grad_of_vmap_cond():
  def f(x):
    q = hx.quantize(x)
    return jax.vmap(lambda p: hx.dequantize(jax.lax.cond(
        p, lambda q: hx.quantize(hx.dequantize(q) * 3), lambda q: q, q)).sum())(PRED).sum()
  for g in (jax.grad(f), jax.jit(jax.grad(f))):
    # straight-through: d/dx sum_b (3 if PRED[b] else 1) * x
    np.testing.assert_array_equal(g(X[0]), jnp.full((4, 8), 3.0 + 1.0 + 3.0))


def test_stop_gradient_of_q8_under_jit():
  f = jax.jit(jax.grad(lambda x: (hx.dequantize(jax.lax.stop_gradient(hx.quantize(x))) * x).sum()))
  np.testing.assert_array_equal(f(X[0]), hx.dequantize(hx.quantize(X[0])))


def test_while_loop_batched_predicate_tup_r1_carry():
  def f(x, n):
    def body(c):
      i, t = c
      col, row = hx.factors(hx.get_tuple_element(t, 1))
      return i + 1, hx.make_tup(hx.get_tuple_element(t, 0) * 2, hx.outer(col + 1, row))
    t = jax.lax.while_loop(lambda c: c[0] < n, body,
                           (0, hx.make_tup(x, hx.outer(x[0], x[1]))))[1]
    return hx.get_tuple_element(t, 0), hx.factors(hx.get_tuple_element(t, 1))
  _check_against_loop(f, (X, jnp.array([0, 2, 1])), (0, 0))


# --- branches that return a hi operand unchanged ----------------------------------------
# cond/switch forward an operand every branch returns as it is around cond_p and
# lax.asarray it: a hi value raised "asarray: expected ArrayLike, got QArray(...)"

def _parts(v):
  return [np.asarray(c) for c in hx.qarray_parts(v)]


IDENTITY_FORMS = {
    "cond": lambda p, q: jax.lax.cond(p, lambda a: a, lambda a: a, q),
    "cond-one-identity": lambda p, q: jax.lax.cond(p, lambda a: a, _minus, q),
    "cond-closure": lambda p, q: jax.lax.cond(p, lambda: q, lambda: q),
    "switch": lambda p, q: jax.lax.switch(p.astype(jnp.int32), [lambda a: a] * 2, q),
    "switch-int": lambda p, q: jax.lax.switch(0, [lambda a: a] * 2, q),
}


def _minus(q):
  """``q`` with its values negated (any format: -v of q8, 15 - v of u4o's nibbles), a fresh value."""
  v, *rest = hx.qarray_parts(q)
  return hx.make_qarray(~v if v.dtype == jnp.uint8 else -v, *rest)


def _offset_q(x):
  return hx.quantize(x, jnp.uint4, method="minmax")


@pytest.mark.parametrize("quantize", [hx.quantize, _offset_q], ids=["q8", "u4o"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("form", list(IDENTITY_FORMS))
def test_branches_returning_the_hi_operand(form, jit, quantize):
  q = quantize(X[0])
  f = IDENTITY_FORMS[form]
  for p in (True, False):
    got = (jax.jit(f) if jit else f)(jnp.array(p), q)
    # the one non-identity branch (cond-one-identity, false) negates the values
    want = _minus(q) if form == "cond-one-identity" and not p else q
    assert jax.typeof(got) == jax.typeof(want)
    for g, w in zip(_parts(got), _parts(want)):
      np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("form", list(IDENTITY_FORMS))
def test_vmap_of_branches_returning_the_hi_operand(form):
  f = IDENTITY_FORMS[form]
  # a batched predicate with the q8 batched and unbatched, and an unbatched predicate
  _check_against_loop(lambda p, q: hx.dequantize(f(p, q)), (PRED, QX), (0, QS))
  _check_against_loop(lambda p, q: hx.dequantize(f(p, q)), (PRED, hx.quantize(X[0])), (0, None))
  _check_against_loop(lambda q: f(jnp.array(True), q), (QX,), (QS,), out_axes=QS, axis_size=B)
