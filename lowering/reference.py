"""Reference semantics of hxmlir's lo primitives, as plain JAX on lo arrays.

Each function here is the meaning of one ``hx.*`` op: the lowering traces it
to build the composite's ``decomposition`` (plain StableHLO), and tests compare
every other implementation against it. Shapes follow the lo primitives:
``q: i8[*lead, n]``, ``s: f32[*lead]``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from hxmlir import dotdims
from hxmlir.lowering.schema import QMAX

# The scale is amax times the f32 reciprocal of QMAX, written as a multiply: XLA
# rewrites a division by a constant into this multiply in some fusion contexts
# and not in others; spelling it out removes that source of 1-ulp differences
# between contexts (XLA may still reassociate constant factors across fusions).
INV_QMAX = np.float32(1.0 / QMAX)


def quantize(x):
  """``f32[*lead, n] -> (i8[*lead, n], f32[*lead])``: per-row absmax quantization.

  ``s = max|row| * f32(1/127)``; ``q = clip(round_half_even(row / s), -127, 127)``.
  All-zero rows: ``s = 0`` and ``q = 0``. Rows with NaN or +-inf: ``s = NaN``
  and ``q = 0``, so they dequantize to NaN. Empty rows (``n = 0``) count as
  all-zero rows: the maximum starts from 0.

  Non-finite rows are found with a boolean OR of ``~isfinite``, carried by the
  same (variadic) reduction as the maximum, never by the maximum itself: XLA
  CPU's vectorised row maximum drops NaN (``maxps``-style ``a > b ? a : b``) at
  about 1000 columns and more, as ``jnp.max`` does there; whatever the maximum
  makes of a NaN row is ignored. One pass over ``x``, no extra buffer, and the
  same bits as a plain maximum on finite rows.
  """
  def combine(a, b):
    return lax.max(a[0], b[0]), lax.bitwise_or(a[1], b[1])
  amax, bad = lax.reduce((jnp.abs(x), ~jnp.isfinite(x)), (np.float32(0), np.bool_(False)),
                         combine, (x.ndim - 1,))
  return _quantize_rows(x, amax, ~bad)


def quantize_with_amax(x, amax, round_half_even=jnp.round):
  """:func:`quantize` given each row's ``amax`` (``f32[*lead]``): ``max|row|``, or NaN for a
  row holding a NaN or an infinity.

  Pallas kernels, which have no generic reduction, compute ``amax`` with
  ``jnp.max`` (their blocks are never empty) and mark non-finite rows with a
  sum; Triton kernels, which have no ``round``, pass their own ``round_half_even``.
  """
  return _quantize_rows(x, amax, jnp.isfinite(amax), round_half_even)


def _quantize_rows(x, amax, finite, round_half_even=jnp.round):
  """The values and scales of :func:`quantize` from each row's ``amax`` and whether the row
  is ``finite`` (``bool[*lead]``; ``amax`` is ignored where it is not)."""
  scale = jnp.where(finite, amax * INV_QMAX, jnp.nan)
  divisor = jnp.where(finite & (amax > 0), scale, 1.0)
  q = jnp.clip(round_half_even(x / divisor[..., None]), -QMAX, QMAX)
  q = jnp.where(finite[..., None], q, 0.0).astype(jnp.int8)
  return q, scale


def dequantize(q, s):
  """``(i8[*lead, n], f32[*lead]) -> f32[*lead, n]``: ``q * s[..., None]``."""
  return q.astype(jnp.float32) * s[..., None]


def matmul_q(x, q, s, dimension_numbers=None):
  """``dot_general(x, q * s[..., None], dimension_numbers)`` without scaling the weight.

  ``x: f32[...]``, ``q: i8[..., n]``, ``s: f32[...]`` (``q``'s shape without ``n``);
  ``dimension_numbers``: ``lax.dot_general``'s, default ``hx.matmul_q`` version 1's
  (``f32[*b, m, k] x i8[*b, k, n] -> f32[*b, m, n]``). The result has
  ``dot_general``'s layout: batch dims, ``x``'s free dims, ``q``'s free dims.

  Where the scale goes is :func:`hxmlir.dotdims.scale_side`'s rule:
  ``"dense"``: ``(x * s) . f32(q)``, with the scale's axes that are free on
  ``q`` added to the scaled ``x`` as batch axes (its size grows by their
  product), the result transposed back to ``dot_general``'s order; ``"result"``:
  ``(x . f32(q)) * s`` on the result axes the scale spans. Raises
  ``TypeError`` when neither applies.
  """
  dims = dimension_numbers or dotdims.v1_dims(x.ndim)
  (lc, rc), (lb, rb) = dims
  side = dotdims.scale_side(q.ndim, dims)
  qf = q.astype(jnp.float32)
  scale_axes = range(q.ndim - 1)
  if side == "result":
    y = lax.dot_general(x, qf, dims, preferred_element_type=jnp.float32)
    q_free = dotdims.free_dims(q.ndim, rc, rb)
    first_q_free = y.ndim - len(q_free)
    pos = [rb.index(a) if a in rb else first_q_free + q_free.index(a) for a in scale_axes]
    return y * _broadcast(s, y.shape, pos)
  if side is None:
    raise TypeError(f"hx.matmul_q: the scales of i8{list(q.shape)} cannot be folded through "
                    f"dimension numbers {dims}")
  # dense: each scale axis is an axis of x, or (free on q) a new batch axis of x
  new = [a for a in scale_axes if a not in rb and a not in rc]
  x_of = {**dict(zip(rb, lb)), **dict(zip(rc, lc))}
  pos = [x_of[a] if a in x_of else x.ndim + new.index(a) for a in scale_axes]
  shape = (*x.shape, *(q.shape[a] for a in new))
  xs = lax.broadcast_in_dim(x, shape, tuple(range(x.ndim))) if new else x
  xs = xs * _broadcast(s, shape, pos)
  new_x = tuple(range(x.ndim, x.ndim + len(new)))
  y = lax.dot_general(xs, qf, ((lc, rc), ((*lb, *new_x), (*rb, *new))),
                      preferred_element_type=jnp.float32)
  if not new:
    return y
  # y: batch, new batch, x's free, q's free without `new`; back to dot_general's order
  nb, nn = len(lb), len(new)
  nx = len(dotdims.free_dims(x.ndim, lc, lb))
  q_free = dotdims.free_dims(q.ndim, rc, rb)
  rest = [a for a in q_free if a not in new]
  perm = [*range(nb), *range(nb + nn, nb + nn + nx),
          *(nb + new.index(a) if a in new else nb + nn + nx + rest.index(a) for a in q_free)]
  return lax.transpose(y, perm)


@functools.cache
def matmul_q_for(dimension_numbers) -> Callable:
  """:func:`matmul_q` with ``dimension_numbers`` bound, one function object per dims (so
  ``lower_composite`` shares equal decompositions within a module)."""
  return functools.partial(matmul_q, dimension_numbers=dimension_numbers)


def _broadcast(s, shape, pos):
  """``s`` broadcast to ``shape``, its axis ``i`` at ``pos[i]`` (any order)."""
  order = sorted(range(len(pos)), key=lambda i: pos[i])
  if order != list(range(len(pos))):
    s = lax.transpose(s, order)
  return lax.broadcast_in_dim(s, shape, tuple(pos[i] for i in order))


def outer(col, row):
  """``(f32[*b, m], f32[*b, n]) -> (f32[*b, m], f32[*b, n])``: forms a rank-1 value.

  The identity on the factors: the composite marks where a rank-1 matrix is
  built; nothing is materialised.
  """
  return col, row


def matmul_r1(x, col, row):
  """``f32[*b, p, m] x (f32[*b, m], f32[*b, n]) -> f32[*b, p, n]``: ``(x @ col) ⊗ row``."""
  nb = x.ndim - 2
  batch = tuple(range(nb))
  xc = lax.dot_general(x, col, (((nb + 1,), (nb,)), (batch, batch)),
                       preferred_element_type=jnp.float32)
  return xc[..., :, None] * row[..., None, :]
