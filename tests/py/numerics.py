"""Tolerances derived from the computation, for comparing f32 results that are reduced
(sums, matmuls, their gradients) in an order the test does not control.

XLA is free to reorder an f32 sum (vector width, blocking, thread count differ per
CPU), so two correct evaluations of the same sum may differ, and near cancellation
they differ by far more than any ``rtol``: ``0.0`` against ``-9.5e-07`` is a correct
pair. An ``assert_allclose(rtol=..)`` with ``atol=0`` passes only by the data and the
CPU. Instead we use the standard forward error bound of a sum in floating point
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eqs. 3.4-3.5):
any evaluation order of ``sum_i t_i`` whose terms each carry ``c`` further
roundings (a product, a scale applied before or after the sum) differs from the
exact sum by at most ``gamma_{n+c} * sum_i |t_i|`` with ``gamma_n = n u / (1 - n u)``.
We take ``u`` as f32's machine epsilon (twice the unit roundoff: a margin of 2 for
the exact product being itself an f64 evaluation and for denormal/fused steps) and
add ``n`` times the smallest normal f32 for underflow. The exact value is computed
in float64 from the same f32 inputs, so a wrong index, a lost remainder or a
missing term (an error of the order of one term) still fails.

Use :func:`assert_matmul_close` / :func:`assert_sum_close` when the reference is a
matmul (einsum) or a sum of known f32 operands, and :func:`assert_within` with
:func:`dot_bound`/:func:`sum_bound` for other shapes of computation (chains,
gradients compared with gradients).
"""

from __future__ import annotations

import re

import numpy as np

EPS = float(np.finfo(np.float32).eps)
TINY = float(np.finfo(np.float32).tiny)


def gamma(n: int) -> float:
  """``gamma_n = n eps / (1 - n eps)`` for f32 (Higham eq. 3.8, with ``u`` = eps)."""
  if n * EPS >= 1:
    raise ValueError(f"gamma({n}) is not defined for f32 (n eps >= 1)")
  return n * EPS / (1 - n * EPS)


def _f64(a) -> np.ndarray:
  return np.asarray(a).astype(np.float64)


def _contracted(subscripts: str, *operands) -> int:
  """The number of terms of each sum in ``einsum(subscripts, *operands)``."""
  ins, out = subscripts.replace(" ", "").split("->")
  sizes = {}
  for spec, op in zip(ins.split(","), operands):
    letters = spec.replace("...", "")  # ellipsis dims are batch dims, never summed
    shape = np.shape(op)[len(np.shape(op)) - len(letters):]
    for letter, size in zip(letters, shape):
      sizes[letter] = size
  return int(np.prod([sizes[c] for c in sizes if c not in out], dtype=np.int64))


def dot_bound(subscripts: str, *operands, extra: int = 0) -> np.ndarray:
  """Elementwise bound of ``|fl32(einsum) - einsum|`` for f32 ``operands``, f64 array.

  ``subscripts``: an explicit ``einsum`` spec with ``->`` (``"mk,kn->mn"``).
  ``extra``: roundings per term beyond the sum's own (``1`` when an implementation
  applies a scale after the sum rather than to the operand, ``1`` per further
  elementwise product). Bound: ``gamma_{k+extra} * einsum(|operands|) + k * tiny``.
  """
  k = _contracted(subscripts, *operands)
  mags = np.einsum(subscripts, *(np.abs(_f64(o)) for o in operands))
  return gamma(k + extra) * mags + k * TINY


def sum_bound(terms, axis=None, *, extra: int = 0) -> np.ndarray:
  """Elementwise bound of ``|fl32(sum(terms, axis)) - sum(terms, axis)|``, f64.

  ``gamma_{n+extra} * sum(|terms|) + n * tiny`` with ``n`` the number of summed terms.
  """
  t = _f64(terms)
  n = t.size if axis is None else int(np.prod([t.shape[a] for a in np.atleast_1d(axis)]))
  return gamma(max(n, 1) + extra) * np.abs(t).sum(axis=axis) + max(n, 1) * TINY


def assert_within(got, want, bound, what: str = "") -> None:
  """``|got - want| <= bound`` elementwise (``want``, ``bound`` broadcast to ``got``).

  Raises ``AssertionError`` naming the worst element, its error and its bound.
  """
  got64, want64 = _f64(got), _f64(want)
  assert got64.shape == np.broadcast_shapes(got64.shape, want64.shape), (
      f"{what}shape {got64.shape} does not hold {want64.shape}")
  err = np.abs(got64 - want64)
  bound = np.broadcast_to(np.asarray(bound, np.float64), err.shape)
  if err.size and not np.all(err <= bound):
    over = np.where(np.isnan(err), np.inf, err - bound)
    worst = np.unravel_index(np.argmax(over), err.shape)
    raise AssertionError(
        f"{what}error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst} "
        f"(got {got64[worst]!r}, want {np.broadcast_to(want64, err.shape)[worst]!r})")


_ARROW = re.compile(r"->")


def assert_matmul_close(got, a, b, subscripts: str | None = None, *, extra: int = 0) -> None:
  """``got`` is ``a @ b`` (or ``einsum(subscripts, a, b)``) evaluated in f32 in any order.

  Compares with the product computed in float64 from the same operands, within
  :func:`dot_bound`. ``a``/``b``: f32 arrays (``a``: ``[..., m, k]``, ``b``:
  ``[..., k, n]`` for ``@``). Raises ``AssertionError`` as :func:`assert_within`.
  """
  if subscripts is None:
    exact = _f64(a) @ _f64(b)
    mags = np.abs(_f64(a)) @ np.abs(_f64(b))
    k = np.shape(a)[-1]
    bound = gamma(k + extra) * mags + k * TINY
  else:
    if not _ARROW.search(subscripts):
      raise ValueError(f"give an explicit einsum spec with '->', got {subscripts!r}")
    exact = np.einsum(subscripts, _f64(a), _f64(b))
    bound = dot_bound(subscripts, a, b, extra=extra)
  assert_within(got, exact, bound)


def assert_sum_close(got, terms, axis=None, *, extra: int = 0) -> None:
  """``got`` is ``sum(terms, axis)`` evaluated in f32 in any order (exact sum in float64,
  within :func:`sum_bound`). Raises ``AssertionError`` as :func:`assert_within`."""
  assert_within(got, _f64(terms).sum(axis=axis), sum_bound(terms, axis, extra=extra))


def matmul_grad_bounds(x, w, dphi, lipschitz: float, *, eval_err: float = 0.0,
                       extra: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """Bounds on the difference of two f32 evaluations of the gradients of
  ``sum(phi(x @ w))`` with respect to ``x`` (``f32[..., m, k]``) and ``w`` (``f32[..., k, n]``).

  Both gradients go through ``g = phi'(y)``, ``y = x @ w``: ``gx = g @ w^T`` and
  ``gw = x^T @ g``. Each evaluation's ``y`` is within :func:`dot_bound` of the
  exact one, so its ``g`` is within ``lipschitz * dy + eval_err * max(1, |g|)``
  (``dphi``: ``phi'`` on float64 arrays; ``lipschitz``: a Lipschitz constant of
  ``phi'``; ``eval_err``: its evaluation error relative to ``max(1, |g|)``), and
  the second product adds its own rounding (:func:`dot_bound`) plus that error
  through ``|w|`` (or ``|x|``). The bounds returned are twice the one-evaluation
  bound, for comparing two evaluations.
  """
  x64, w64 = _f64(x), _f64(w)
  wt = np.swapaxes(w64, -1, -2)
  xt = np.swapaxes(x64, -1, -2)
  y = x64 @ w64
  dy = gamma(x64.shape[-1] + extra) * (np.abs(x64) @ np.abs(w64))
  g = dphi(y)
  dg = lipschitz * dy + eval_err * np.maximum(1.0, np.abs(g))
  n = w64.shape[-1]
  m = x64.shape[-2]
  bx = gamma(n + extra) * ((np.abs(g) + dg) @ np.abs(wt)) + dg @ np.abs(wt) + n * TINY
  bw = gamma(m + extra) * (np.abs(xt) @ (np.abs(g) + dg)) + np.abs(xt) @ dg + m * TINY
  return 2 * bx, 2 * bw


def polynomial_bound(f, *operands, depth: int) -> np.ndarray:
  """Bound of ``|fl32(p(operands)) - p(operands)|`` for ``p = f`` a polynomial in the
  operands (a loss such as ``sum((x @ w) ** 2)``, or its gradient), f64 array.

  Evaluated in any order, a sum of products whose longest chain of roundings
  (additions a term passes through plus its multiplications) is ``depth`` long
  differs from the exact value by at most ``gamma_depth`` times the same
  polynomial with every coefficient and operand replaced by its absolute value
  (Higham, section 3.1). ``f`` must be that sign-free form when given
  ``|operands|`` (true for products, sums and even powers of them, and for their
  JAX gradients); it may run in f32, which the extra ``(1 + gamma)`` covers.
  """
  mags = np.asarray(f(*(np.abs(np.asarray(o)) for o in operands))).astype(np.float64)
  g = gamma(depth)
  return g * (1 + g) * mags + depth * TINY


def elementwise_bound(want, roundings: int) -> np.ndarray:
  """Bound of ``|got - want|`` for values computed elementwise (products, quotients, a
  scale applied; no sums) where each element of ``got`` and ``want`` together passes
  through at most ``roundings`` f32 roundings: :func:`polynomial_bound` of the identity
  (``gamma_r (1 + gamma_r) |want| + r tiny``), so an exact zero must stay (nearly) zero."""
  return polynomial_bound(lambda v: v, want, depth=roundings)


def assert_einsum_close(got, subscripts: str, *operands, extra: int = 0) -> None:
  """``got`` is ``einsum(subscripts, *operands)`` (f32 operands, any number) evaluated in
  f32 in any order: compared with the float64 einsum within :func:`dot_bound`
  (``extra``: one per factor beyond two in each term). Raises ``AssertionError``."""
  exact = np.einsum(subscripts, *(_f64(o) for o in operands))
  assert_within(got, exact, dot_bound(subscripts, *operands, extra=extra))
