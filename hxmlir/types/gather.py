"""``hx.take_rows``: rows of a quantized table, dequantized, without expanding the table."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hxmlir.types import shardings as shd
from hxmlir.types.qarray import QArrayTy, dequantize, make_qarray, qarray_parts


def take_rows(q, ids) -> jax.Array:
  """``dequantize(q)[ids]`` for ``q: q8[r, n]`` (any format, groups along ``n``) and
  integer ``ids: i32[*b]`` -> ``f32[*b, n]``, gathering only the selected rows.

  The rows of each component (values, scales and, for formats with an offset, offsets)
  are gathered with ``jnp.take`` along axis 0 and reassembled with
  :func:`hxmlir.make_qarray` into a ``q8[*b, n]`` of the same format, which alone is
  dequantized: a token embedding lookup on a ``q8[49152, 576:g32,f16]`` table reads
  ``len(ids)`` rows, never the f32 table. Ids outside ``[0, r)`` are clamped, as
  ``jnp.take(..., mode="clip")``. Raises ``TypeError`` naming both operand types unless
  ``q`` is a quantized array of rank 2 and ``ids`` an integer array.
  """
  q_aval, i_aval = jax.typeof(q), jax.typeof(ids)
  if not (isinstance(q_aval, QArrayTy) and q_aval.ndim == 2
          and jnp.issubdtype(getattr(i_aval, "dtype", None) or jnp.float32, jnp.integer)):
    raise TypeError(f"hx.take_rows({shd.short(q_aval)}, {shd.short(i_aval)}): expects a "
                    "rank-2 quantized table (q8[rows, n]) and integer ids")
  parts = [jnp.take(c, ids, axis=0, mode="clip") for c in qarray_parts(q)]
  return dequantize(make_qarray(*parts))
