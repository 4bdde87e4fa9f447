"""Reference semantics of hxmlir's lo primitives, as plain JAX on lo arrays.

Each function here is the meaning of one ``hx.*`` op: the lowering traces it
to build the composite's ``decomposition`` (plain StableHLO), and tests compare
every other implementation against it. Shapes follow the lo primitives:
``q: i8[*lead, n]``, ``s: f32[*lead]``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hxmlir import formats
from hxmlir.lowering.schema import QMAX
from hxmlir.types import dotdims

# The scale is amax times the f32 reciprocal of qmax, written as a multiply: XLA
# rewrites a division by a constant into this multiply in some fusion contexts
# and not in others; spelling it out removes that source of 1-ulp differences
# between contexts (XLA may still reassociate constant factors across fusions).
INV_QMAX = np.float32(1.0 / QMAX)

MIN_SCALE = np.finfo(np.float32).tiny
"""The smallest scale of a row that is not all zeros: ``2**-126``, the smallest normal f32.
A smaller (denormal) scale is flushed to zero by XLA on CPU (and by most accelerators), so
a row of absmax below ``qmax * 2**-126`` (``~1.5e-36`` for int8) would dequantize to zeros
silently; with this scale it dequantizes to within ``2**-127`` of each value (half a step,
as fine as f32 arithmetic that flushes denormals resolves values near zero)."""


def quantize(x, fmt: str = "int8", group_size: int | None = None, method: str = "absmax"):
  """``f32[*lead, n] -> (values, f32 scales)``: symmetric quantization along the last axis.

  ``fmt`` is a :data:`hxmlir.formats.FORMATS` name; values are stored as the format's
  lo component (``i8[*lead, n]``, ``ui8[*lead, n // 2]`` packed int4,
  ``f8E4M3FN[*lead, n]``); scales are ``f32[*lead]`` per row or ``f32[*lead, n // g]``
  per group of ``g = group_size``. Per row or group: ``s = amax * f32(1/qmax)``,
  integer values ``clip(round_half_even(x / s), -qmax, qmax)``, fp8 values
  ``convert(clip(x / s, -448, 448))`` (round to nearest even).

  ``method="absmax"``: ``amax = max|row|``. ``method="mse"``: ``amax = r * max|row|``
  for the ratio ``r`` of :data:`hxmlir.formats.MSE_RATIOS` (20 from 1 down to 0.5)
  whose quantize-dequantize round trip has the least squared error on that row or
  group (ties keep the larger ``r``): clipping a few outliers buys a finer step for
  every other value, which matters at 4 bits (HQQ, Badri & Shaji 2023; AWQ, Lin et
  al. 2024, section 3.2, grid-searches its scales the same way). Cost: 20 more
  quantize-dequantize passes over ``x`` at quantization time, nothing at use.

  Rows of tiny absmax (below ``qmax * 2**-126``): ``s = MIN_SCALE`` (:data:`MIN_SCALE`),
  never a denormal that dequantizes to zero. All-zero rows: ``s = 0`` and zero values.
  Rows (or groups) with NaN or +-inf:
  ``s = NaN`` and zero values, so they dequantize to NaN. Empty rows (``n = 0``)
  count as all-zero rows: the maximum starts from 0.

  Non-finite rows are found with a boolean OR of ``~isfinite``, carried by the
  same (variadic) reduction as the maximum, never by the maximum itself: XLA
  CPU's vectorised row maximum drops NaN (``maxps``-style ``a > b ? a : b``) at
  about 1000 columns and more, as ``jnp.max`` does there; whatever the maximum
  makes of a NaN row is ignored. One pass over ``x``, no extra buffer, and the
  same bits as a plain maximum on finite rows.
  """
  f = formats.lookup(fmt)
  xg = formats.split_groups(x, group_size)
  if method == "minmax":
    return quantize_minmax(x, f, group_size)
  def combine(a, b):
    return lax.max(a[0], b[0]), lax.bitwise_or(a[1], b[1])
  amax, bad = lax.reduce((jnp.abs(xg), ~jnp.isfinite(xg)), (np.float32(0), np.bool_(False)),
                         combine, (xg.ndim - 1,))
  amax = jnp.where(bad, jnp.nan, amax)
  if method == "mse":
    amax = mse_amax(xg, amax, f)
  elif method != "absmax":
    raise ValueError(f"hx.quantize: method must be one of {formats.METHODS}, got {method!r}")
  q, s = quantize_with_amax(xg, amax, fmt=f)
  return formats.store(q.reshape(x.shape), f), s


def quantize_minmax(x, f, group_size: int | None = None):
  """``method="minmax"``: asymmetric quantization of ``x: f32[*lead, n]`` to format ``f``
  (one with an offset, values in ``[0, qmax]``), per row or group of ``group_size``:
  ``offset = min``, ``scale = (max - min) * f32(1/qmax)``, values
  ``clip(round_half_even((x - offset) / scale), 0, qmax)`` -> ``(values, scale, offset)``.

  GGUF's Q4_1 and the K-quants' sub-blocks are this form (``x = d·q + m``; llama.cpp's
  ``quantize_row_q4_1_ref`` takes the block's min and max as here); qwix's and AWQ's
  zero points are ``-offset / scale``. A constant row or group gets ``scale = 0``, zero
  values and ``offset`` the constant, so it dequantizes exactly; a row or group holding
  NaN or +-inf gets NaN scale and offset and zero values, so it dequantizes to NaN; a
  finite range wider than f32 holds (``-3e38 .. 3e38``) keeps a finite scale. The
  range is not widened to hold 0: a group of positive values keeps its whole 16 levels.
  """
  xg = formats.split_groups(x, group_size)
  def combine(a, b):
    return lax.min(a[0], b[0]), lax.max(a[1], b[1]), lax.bitwise_or(a[2], b[2])
  big = np.float32(np.inf)
  lo, hi, bad = lax.reduce((xg, xg, ~jnp.isfinite(xg)), (big, -big, np.bool_(False)),
                           combine, (xg.ndim - 1,))
  lo = jnp.where(bad | (lo > hi), jnp.where(bad, jnp.nan, 0.0), lo)  # lo > hi: n = 0
  hi = jnp.where(bad, jnp.nan, jnp.maximum(hi, lo))
  # a range wider than f32's (-3e38 .. 3e38) overflows hi - lo and x - lo: such a group
  # computes both halved (exact for normal f32), the same roundings on the same values
  c = jnp.where(jnp.isinf(hi - lo) & ~bad, np.float32(0.5), np.float32(1.0))
  scale = (hi * c - lo * c) * np.float32(1.0 / f.qmax) / c
  divisor = jnp.where(scale > 0, scale, 1.0)
  v = jnp.round((xg * c[..., None] - (lo * c)[..., None]) / (divisor * c)[..., None])
  q = jnp.where(jnp.isfinite(scale)[..., None], jnp.clip(v, 0, f.qmax), 0.0)
  return formats.store(q.astype(jnp.int8).reshape(x.shape), f), scale, lo


@functools.cache
def quantize_for(fmt: str, group_size: int | None, method: str) -> Callable:
  """:func:`quantize` with its parameters bound, one function object per set (so
  ``lower_composite`` shares equal decompositions within a module)."""
  return functools.partial(quantize, fmt=fmt, group_size=group_size, method=method)


def mse_amax(x, amax, f, round_half_even=jnp.round):
  """The clipped ``amax`` of least squared round-trip error per row of ``x`` (see
  :func:`quantize`; ``f`` a :class:`hxmlir.formats.Format`)."""
  best, best_err = amax, None
  for r in formats.MSE_RATIOS:
    a = amax * np.float32(r)
    q, s = quantize_with_amax(x, a, round_half_even, f)
    d = q.astype(jnp.float32) * s[..., None] - x
    err = jnp.sum(d * d, axis=-1)  # not jnp.square: it lowers to chlo.square, not StableHLO
    if best_err is None:
      best_err = err
      continue
    better = err < best_err
    best, best_err = jnp.where(better, a, best), jnp.where(better, err, best_err)
  return best


def quantize_with_amax(x, amax, round_half_even=jnp.round, fmt="int8"):
  """:func:`quantize`'s values (unpacked: ``int8`` for int4 too) and scales given each
  row's ``amax`` (``f32[*lead]``): ``max|row|``, or NaN for a row holding a NaN or an
  infinity.

  Pallas kernels, which have no generic reduction, compute ``amax`` with
  ``jnp.max`` (their blocks are never empty) and mark non-finite rows with a
  sum; Triton kernels, which have no ``round``, pass their own ``round_half_even``.
  """
  f = formats.lookup(fmt)
  finite = jnp.isfinite(amax)
  inv = INV_QMAX if f.qmax == QMAX else np.float32(1.0 / f.qmax)
  # a row with 0 < amax < qmax * MIN_SCALE would get a denormal scale, which XLA CPU
  # flushes to zero (the row dequantizes to 0): such rows take the smallest normal scale
  scale = jnp.where(finite, jnp.where(amax > 0, jnp.maximum(amax * inv, MIN_SCALE), 0.0),
                    jnp.nan)
  divisor = jnp.where(finite & (amax > 0), scale, 1.0)
  v = x / divisor[..., None]
  if f.integer:
    v = round_half_even(v)
  q = jnp.where(finite[..., None], jnp.clip(v, -f.qmax, f.qmax), 0.0)
  return q.astype(jnp.int8 if f.integer else f.value_dtype), scale


def dequantize(q, s, o=None):
  """``(values, scales[, offsets]) -> f32[*lead, n]``: ``values * scale (+ offset)`` per row
  or per group (the format from the components' dtypes, :func:`hxmlir.formats.decode`;
  the group from ``s``'s shape)."""
  return formats.decode(q, s, o)


def matmul_q(x, q, s, dimension_numbers=None):
  """``dot_general(x, dequantize(q, s), dimension_numbers)`` without scaling the weight.

  ``x: f32[...]``, ``q``: stored values of any format (:mod:`hxmlir.formats`) of dense
  shape ``[..., n]``, ``s: f32[...]`` (or f16, widened) per row (``q``'s dense shape
  without ``n``) or per group (with ``n // g``); ``dimension_numbers``:
  ``lax.dot_general``'s, default ``hx.matmul_q`` version 1's (``f32[*b, m, k] x
  i8[*b, k, n] -> f32[*b, m, n]``). Formats with an offset: :func:`matmul_q_offset`.
  """
  return matmul_q_offset(x, q, s, None, dimension_numbers)


def matmul_q_offset(x, q, s, o, dimension_numbers=None):
  """:func:`matmul_q` of the values and scales, plus, for a format with an offset ``o``
  (``None``: none), the offset term (:func:`matmul_offset`):
  ``Σ x·(q·s + o) = Σ_g s·Σ x·q + Σ_g o·Σ x``. ``s`` and ``o`` may be f16 (widened)."""
  f = formats.of_components(q.dtype, s.dtype, o is not None, q.shape)
  dims = dimension_numbers or dotdims.v1_dims(x.ndim)
  qf = formats.values_f32(q, f)
  y = _matmul_symmetric(x, qf, s.astype(jnp.float32), dims)
  if o is None:
    return y
  units = formats.offset_units(q, f)  # a block format's -m per element (K-quants' mins)
  if units is not None:
    return y + _matmul_symmetric(x, units, o.astype(jnp.float32), dims)
  return y + matmul_offset(x, qf.shape, o.astype(jnp.float32), dims)


def matmul_offset(x, dense_shape, o, dimension_numbers):
  """``dot_general(x, O, dims)`` where ``O[..., k] = o[..., k // g]`` is the offset
  broadcast over its row or group (``o: f32``, the scale's shape for a weight of
  ``dense_shape``), without forming ``O``: where the weight's grouped (last) axis is
  contracted, ``x`` is summed over each group first (``Σ_g o_g·Σ_{k∈g} x_k``); where it
  is a free axis, the product with ``o`` is repeated ``g`` times along it; as a batch
  axis (rare), ``O`` is formed."""
  dims = dimension_numbers
  (lc, rc), (lb, rb) = dims
  r = len(dense_shape) - 1
  g = formats.group_size(dense_shape[-1], formats.group_of_scale(dense_shape, o))
  o = formats.as_groups(o, dense_shape)  # per row: one group of n
  if r in rc:
    xa = lc[rc.index(r)]
    xs = x.reshape(*x.shape[:xa], x.shape[xa] // g, g, *x.shape[xa + 1:]).sum(axis=xa + 1)
    return lax.dot_general(xs, o, dims, preferred_element_type=jnp.float32)
  if r in rb:
    return lax.dot_general(x, jnp.repeat(o, g, axis=-1), dims,
                           preferred_element_type=jnp.float32)
  y = lax.dot_general(x, o, dims, preferred_element_type=jnp.float32)
  q_free = dotdims.free_dims(r + 1, rc, rb)
  axis = y.ndim - len(q_free) + q_free.index(r)
  return jnp.repeat(y, g, axis=axis)


def _matmul_symmetric(x, qf, s, dims):
  """:func:`matmul_q` of decoded values ``qf: f32`` and scales ``s: f32``.

  Per group, the weight's last axis is split into ``(n // g, g)`` (and ``x``'s axis
  paired with it likewise), which makes the group scales per-row scales of a weight of
  one more axis (:func:`hxmlir.types.dotdims.split_groups`); where the groups run along the
  contraction and the scale also spans a free axis (``"...k,nk->...n"``), each group's
  partial sum is scaled, then the partial sums are added.
  """
  if s.ndim == qf.ndim - 1:
    return _matmul_rows(x, qf, s, dims)
  g = formats.group_of_scale(qf.shape, s)
  plan = dotdims.split_groups(x.ndim, qf.ndim, dims)
  if plan is None:
    raise TypeError(f"hx.matmul_q: the group scales of {list(qf.shape)} (g={g}) cannot be "
                    f"folded through dimension numbers {dims}")
  dims2, xa, kind = plan
  if xa is not None:
    x = x.reshape(*x.shape[:xa], x.shape[xa] // g, g, *x.shape[xa + 1:])
  y = _matmul_rows(x, formats.split_groups(qf, g), s, dims2)
  if kind == "partial":
    return jnp.sum(y, axis=len(dims[1][0]))
  if kind == "free":
    return y.reshape(*y.shape[:-2], y.shape[-2] * g)
  if kind == "batch":
    i = dims[1][1].index(qf.ndim - 1)
    return y.reshape(*y.shape[:i], y.shape[i] * g, *y.shape[i + 2:])
  return y


def _matmul_rows(x, qf, s, dims):
  """:func:`matmul_q` for ``f32`` values ``qf`` with per-row scales ``s``."""
  (lc, rc), (lb, rb) = dims
  q = qf
  side = dotdims.scale_side(q.ndim, dims)
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
def matmul_q_for(dimension_numbers, offset: bool = False) -> Callable:
  """:func:`matmul_q` (``offset``: :func:`matmul_q_offset`) with ``dimension_numbers``
  bound, one function object per dims (so ``lower_composite`` shares equal
  decompositions within a module)."""
  return functools.partial(matmul_q_offset if offset else matmul_q,
                           dimension_numbers=dimension_numbers)


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


def causal_mask(start, t: int, c: int):
  """``bool[t, 1, 1, c]``: position ``c`` may be read by query ``i`` (at position
  ``start + i``) when ``c <= start + i``. ``start``: an i32 scalar (traced or not)."""
  positions = start + jnp.arange(t, dtype=jnp.int32)
  return (jnp.arange(c, dtype=jnp.int32)[None, :] <= positions[:, None])[:, None, None, :]


def attention(q, k, v, start, *, scale: float, window: int = 0, softcap: float = 0.0):
  """Grouped-query attention over a KV cache with a causal position bound: ``hx.attention``.

  ``q: f32[T, kv, g, d]`` (the ``g`` query heads that share each of ``kv`` key/value heads),
  keys ``k: f32[kv, C, d]``, values ``v: f32[kv, d, C]`` (positions last: the layout
  :func:`hxmlir.models.llama.attention` keeps its cache in), ``start: i32[]`` (the position
  of query 0) -> ``f32[T, kv, g, d]``::

    s[t, h, j, c] = scale * (q[t, h, j, :] . k[h, c, :])       masked to f32's lowest
                                                               where c > start + t
    out[t, h, j, :] = sum_c softmax_c(s[t, h, j, :]) * v[h, :, c]

  Positions beyond ``start + t`` weigh exactly 0 (``exp`` of f32's lowest minus the max
  underflows), and ``v`` past the last query's bound ``start + T - 1`` is read as 0 (for
  ``start >= 0``), so
  what is stored past it (a NaN, an infinity: an unwritten cache) never reaches the result,
  as the native kernel never reads it (``csrc/attention.h``). A query with no position
  (``start + t < 0``) averages ``v`` over all ``C`` positions (every score equal).
  ``scale``: a static float, multiplied after the dot product in f32. Version 2's
  attributes: ``softcap > 0`` caps each scaled score to ``softcap * tanh(s / softcap)``
  (Gemma 2); ``window > 0`` also masks positions ``c <= start + t - window`` (a sliding
  window of the last ``window`` positions, llama.cpp's standard SWA). 0 turns either off.
  """
  s = jnp.einsum("tkgd,kcd->tkgc", q, k) * np.float32(scale)
  if softcap:
    s = np.float32(softcap) * jnp.tanh(s / np.float32(softcap))
  causal = causal_mask(start, q.shape[0], k.shape[1])
  mask = causal
  if window:
    low = start + jnp.arange(q.shape[0], dtype=jnp.int32) - window  # c > low may be read
    mask = mask & (jnp.arange(k.shape[1], dtype=jnp.int32)[None, :] > low[:, None])[
        :, None, None, :]
  s = jnp.where(mask, s, jnp.finfo(jnp.float32).min)
  # v past the last query's bound read as 0 (a start < 0, whose first queries average v
  # over all C, keeps it all)
  v = jnp.where(causal[-1, 0] | (start < 0), v, np.float32(0))
  return jnp.einsum("tkgc,kdc->tkgd", jax.nn.softmax(s, axis=-1), v)


def attention_batched(q, k, v, start, *, scale: float, window: int = 0, softcap: float = 0.0):
  """``hx.attention`` version 3: a batch of :func:`attention` problems, each element its own
  start. ``q: f32[B, T, kv, g, d]``, ``k: f32[B, kv, C, d]`` and ``v: f32[B, kv, d, C]`` (or
  ``f32[kv, C, d]`` and ``f32[kv, d, C]``: one cache every element reads), ``start: i32[B]``
  -> ``f32[B, T, kv, g, d]``, ``out[b] = attention(q[b], k[b], v[b], start[b])``: the same
  computation under ``jax.vmap``."""
  kv_axis = 0 if k.ndim == 4 else None
  one = functools.partial(attention, scale=scale, window=window, softcap=softcap)
  return jax.vmap(one, in_axes=(0, kv_axis, kv_axis, 0))(q, k, v, start)


@functools.cache
def attention_for(scale: float, window: int = 0, softcap: float = 0.0,
                  batched: bool = False) -> Callable:
  """:func:`attention` (``batched``: :func:`attention_batched`) with ``scale``, ``window`` and
  ``softcap`` bound, one function per setting (a stable key for sharing decompositions
  within a module)."""
  return functools.partial(attention_batched if batched else attention, scale=scale,
                           window=window, softcap=softcap)
