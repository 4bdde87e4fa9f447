"""Reference semantics of hxmlir's lo primitives, as plain JAX on lo arrays.

Each function here is the meaning of one ``hx.*`` op: the lowering traces it
to build the composite's ``decomposition`` (plain StableHLO), and tests compare
every other implementation against it. Shapes follow the lo primitives:
``q: i8[*lead, n]``, ``s: f32[*lead]``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

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
  all-zero rows: the maximum starts from 0 (``|x| >= 0``, and NaN still wins).
  """
  amax = lax.reduce(jnp.abs(x), np.float32(0), lax.max, (x.ndim - 1,))
  return quantize_with_amax(x, amax)


def quantize_with_amax(x, amax, round_half_even=jnp.round):
  """:func:`quantize` given each row's ``amax = max|row|`` (``f32[*lead]``).

  Pallas kernels, which have no generic reduction, compute ``amax`` with
  ``jnp.max`` (their blocks are never empty) and share the rest; Triton
  kernels, which have no ``round``, pass their own ``round_half_even``.
  """
  finite = jnp.isfinite(amax)
  scale = jnp.where(finite, amax * INV_QMAX, jnp.nan)
  divisor = jnp.where(finite & (amax > 0), scale, 1.0)
  q = jnp.clip(round_half_even(x / divisor[..., None]), -QMAX, QMAX)
  q = jnp.where(finite[..., None], q, 0.0).astype(jnp.int8)
  return q, scale


def dequantize(q, s):
  """``(i8[*lead, n], f32[*lead]) -> f32[*lead, n]``: ``q * s[..., None]``."""
  return q.astype(jnp.float32) * s[..., None]


def matmul_q(x, q, s):
  """``f32[*b, m, k] x (i8[*b, k, n], f32[*b, k]) -> f32[*b, m, n]``.

  ``(x * s[..., None, :]) @ q``: the per-row scales of the weight lie along the
  contraction axis, so they fold into the dense operand.
  """
  nb = x.ndim - 2
  batch = tuple(range(nb))
  xs = x * s[..., None, :]
  return lax.dot_general(xs, q.astype(jnp.float32),
                         (((nb + 1,), (nb,)), (batch, batch)),
                         preferred_element_type=jnp.float32)


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
