"""Quantized arrays: ``q8[..., n]``, ``q4[..., n:g32]``, ``f8[..., n]``: one type family.

A :class:`QArray` holds ``qvalue: i8[*lead, n]`` and ``scale: f32[*lead]``
and stands for the dense array ``qvalue * scale[..., None]`` (symmetric
per-row, "per-channel", absmax quantization along the last axis, as in
LLM.int8()'s vector-wise quantization, Dettmers et al. 2022, without the
outlier split). Other formats (:mod:`hxmlir.formats`): int4 values stored two per
byte (``q4``), float8 e4m3fn values (``f8``), and one scale per group of ``g``
elements of the last axis (``q4[64,128:g32]``). Its JAX type is :class:`QArrayTy`; users build and consume
values only through the primitives :func:`quantize`, :func:`dequantize`,
:func:`matmul_q`, and :func:`make_qarray`/:func:`qarray_parts` (from and to
the components), which work under ``jit``, ``grad``, ``vmap``, ``scan``,
explicit sharding and ``shard_map``.

The block formats (GGUF's blocks at the file's bytes: ``q4_k[576,1536:g256,f16]``) are
the same type with ``ui16`` block values and f16 scales (and offsets) per block.

The design follows JAX's guide "Defining new JAX types with hijax", adapted to
JAX 0.10.2 (``VJPHiPrimitive``). This module holds the user functions and re-exports the
rest: the type (:mod:`hxmlir.types.qarray_type`) and its primitives
(:mod:`hxmlir.types.qarray_prims`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.hijax import HiType, ShapedArray

from hxmlir import formats
from hxmlir.types.qarray_prims import (  # noqa: F401  (re-exported: the primitives)
  Dequantize,
  MakeQArray,
  MatmulQ,
  QArrayParts,
  Quantize,
  matmul_q_result_type,
  scale_tangent_weights,
)
from hxmlir.types.qarray_type import (  # noqa: F401  (re-exported: the type)
  F32,
  I8,
  QArray,
  QArrayP,
  QArraySpec,
  QArrayTy,
  make_qarray_type,
)

# the public classes keep the module users import them from (reprs, messages, pickles)
for _cls in (QArray, QArrayP, QArraySpec, QArrayTy):
  _cls.__module__ = __name__

# --- user functions ----------------------------------------------------------

def quantize(x, dtype=jnp.int8, *, group_size: int | None = None,
             method: str = "absmax") -> QArray:
  """Quantize ``x: f32[*lead, n]`` to ``q8[*lead, n]``, one scale per row.

  ``scale = max(|row|) * f32(1/127)`` and ``qvalue = round_half_even(row / scale)``
  clipped to ``[-127, 127]`` (symmetric absmax quantization along the last
  axis).

  Formats (:mod:`hxmlir.formats`, which cites the choices): ``dtype=jnp.int4`` gives
  ``q4[*lead, n]`` (values in [-7, 7], ``scale = amax / 7``, stored two per byte:
  ``n`` even), ``dtype=jnp.float8_e4m3fn`` gives ``f8[*lead, n]`` (``scale = amax /
  448``, values cast round-to-nearest-even). ``group_size=g``: one scale per ``g``
  consecutive elements of the last axis (scale ``f32[*lead, n // g]``, type
  ``q4[*lead, n:g32]``). ``method="mse"``: per scale, the clipping ratio in [0.5, 1]
  (20 tried) with the least squared quantization error
  (:func:`hxmlir.lowering.reference.quantize` says why and what it costs). An all-zero row gets ``scale = 0`` and zero values, so it dequantizes
  to exact zeros; a row holding NaN or +-inf gets ``scale = NaN`` and zero
  values, so it dequantizes to NaN, never to finite garbage. The result keeps
  ``x``'s sharding (``q8[8@i,3]``); the scale drops the last axis, so with a
  sharded last axis (``q8[3,4@j]``) each row's maximum reduces across shards.

  ``bfloat16`` and ``float16`` weights (most checkpoints) are converted to f32 first,
  which is exact. Differentiates as the identity (straight-through estimator). Raises
  ``TypeError`` at trace time unless ``x`` is such a float array of rank >= 1, for an
  unknown ``dtype``, when ``g`` does not divide ``n`` (naming the type,
  ``q4[64,100:g32]``), when an int4 ``n`` or ``g`` is odd, or when a sharded last axis
  would split a group (naming the type, the mesh axis and its size); ``ValueError`` for
  an unknown ``method``.
  """
  fmt = formats.lookup(dtype)
  if getattr(x, "dtype", None) in _WIDENED:  # a bf16/f16 checkpoint: f32 holds it exactly
    x = x.astype(F32)
  return Quantize(jax.typeof(x), fmt.name, group_size, method)(x)


_WIDENED = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
"""Weight dtypes :func:`quantize` converts to f32 first (exact: f32 holds every value)."""


def dequantize(q) -> jax.Array:
  """The dense ``f32[*lead, n]`` array ``qvalue * scale[..., None]`` of ``q: q8[*lead, n]``.

  Differentiates as the identity. Raises ``TypeError`` unless ``q`` is a
  quantized array.
  """
  return Dequantize(jax.typeof(q))(q)


def matmul_q(x, qw) -> jax.Array:
  """Dense times quantized matmul: ``f32[..., k] @ q8[k, n] -> f32[..., n]`` (any number of
  leading dims: ``f32[b, s, d] @ q8[d, f]``), or ``f32[*b, m, k] @ q8[*b, k, n] ->
  f32[*b, m, n]`` with batched weights of equal rank.

  ``x`` may be ``bf16`` or ``f16`` (activations,
  :data:`~hxmlir.types.matmul_q_typing.DENSE_DTYPES`): it is converted to
  f32 (exactly) inside the op, which accumulates in f32 and returns what JAX's dot of
  ``x`` with the dequantized f32 weight returns
  (:func:`~hxmlir.types.matmul_q_typing.matmul_q_dtype`: ``f32``); its
  cotangent has ``x``'s dtype.

  Equals ``x @ dequantize(qw)``, computed with the per-row scales folded into
  the dense operand (``(x * scale) @ qvalue``), never a dequantized copy of the
  weight. The result's leading dims are sharded like ``x``'s, its columns like
  ``qw``'s. A contraction axis sharded over Auto mesh axes (``jax.jit(...,
  in_shardings=...)``, a row-parallel layer) gives each shard's partial sum, which the
  partitioner all-reduces, as for a dense dot; on Explicit axes it is a ``TypeError``.
  Gradients with respect to both operands are dense: ``x``'s of ``x``'s dtype, the
  weight's ``f32``. Other layouts (``[out, in]`` weights, stacked
  weights, several contracted axes): :func:`hxmlir.types.einsum`.

  Raises ``TypeError`` at trace time naming both operand types (for example
  ``f32[2,5] @ q8[3,4]``) on mismatched shapes, ranks, dtypes or a sharded
  contraction axis.
  """
  return MatmulQ(jax.typeof(x), jax.typeof(qw))(x, qw)


def make_qarray(qvalue, scale, offset=None) -> QArray:
  """The quantized array ``q8[*l, n]`` with components ``qvalue: i8[*l, n]``, ``scale: f32[*l]``.

  ``offset`` (the scale's type, f32 or f16; formats of :mod:`hxmlir.formats` with an
  offset, ``u4o``: ``qvalue: ui8[*l, n // 2]`` uint4 pairs) makes
  ``qvalue * scale + offset``; f16 scales make ``q8[*l, n:g32,f16]`` and the like
  (GGUF's blocks, :mod:`hxmlir.gguf`). GGUF's block formats take a block's bytes as
  little-endian words, ``qvalue: u16[*l, n, k // B, W]``, with ``scale`` its ``d:
  f16[*l, n, k // B]`` (and ``offset`` its ``dmin`` where the format has one); ``W`` names
  the format (70 words: ``q4_k[*l, n, k]``; :data:`hxmlir.formats.BLOCK_FORMATS`).

  Stands for ``qvalue * scale[..., None]``; nothing is computed or checked
  beyond the types (the values are taken as they are, ``-128`` included). Use it
  wherever the components are JAX values -- inside ``jit``, ``grad``, ``vmap``,
  ``scan``, ``shard_map`` (for example weights kept as separate int8 and f32
  arrays in a checkpoint). The result is sharded like ``qvalue``; ``scale`` must
  be sharded like ``qvalue``'s leading axes. A weakly typed scale (a Python
  ``float`` or ``int``, also under ``jax_enable_x64``) becomes ``f32``; a
  strongly typed one must already be ``f32``, or ``f16`` for the formats with f16 scales
  (``bf16``, ``f64`` arrays are a ``TypeError``: convert them explicitly).

  Differentiable in ``scale``: the tangent is the dense ``f32`` array
  ``qvalue * d(scale)[..., None]`` and the cotangent of ``scale`` is
  ``sum(ct * qvalue, -1)``. ``qvalue`` is integer: no tangent, a zero ``float0``
  cotangent. Raises ``TypeError`` naming both operand types on wrong dtypes,
  shapes or shardings.
  """
  qvalue, scale = _lo_operand(qvalue), _lo_operand(scale)
  s_aval = jax.typeof(scale)
  if (isinstance(s_aval, ShapedArray) and s_aval.weak_type
      and (jnp.issubdtype(s_aval.dtype, jnp.floating)
           or jnp.issubdtype(s_aval.dtype, jnp.integer))):
    # a Python float or int (weakly typed: f32, or f64 under jax_enable_x64, or i32/i64)
    # takes the scale's dtype, as it would in arithmetic with an f32 array
    scale = jax.lax.convert_element_type(scale, F32)
  if offset is not None:
    offset = _lo_operand(offset)
    o_aval = jax.typeof(offset)
    if isinstance(o_aval, ShapedArray) and o_aval.weak_type:
      offset = jax.lax.convert_element_type(offset, jax.typeof(scale).dtype)
    return MakeQArray(jax.typeof(qvalue), jax.typeof(scale), jax.typeof(offset))(
        qvalue, scale, offset)
  return MakeQArray(jax.typeof(qvalue), jax.typeof(scale))(qvalue, scale)


def qarray_parts(q) -> tuple[jax.Array, ...]:
  """The components ``(qvalue: i8[*l, n], scale: f32[*l])`` of ``q: q8[*l, n]``; a format
  with an offset (``u4o``) has three, ``(qvalue, scale, offset)``, and the offset's
  tangent is zero.

  The inverse of :func:`make_qarray` (bit for bit both ways). Under ``vmap``
  both components are mapped along axis 0; shardings are those of ``q``'s
  components.

  Gradients: ``qvalue`` is integer and has none. The tangent of ``q`` is a
  dense ``f32`` array ``dX`` (of the value ``qvalue * scale``) with no unique
  split into a scale tangent, so ``qvalue`` is held fixed and the scale's
  tangent is read at the elements of largest ``|qvalue|`` in each row:
  ``d(scale) = dX_j / qvalue_j`` averaged over those ``j``; ``0`` for a row of
  zeros and for an empty quantized axis (``n = 0``). Consequences:

  * ``qarray_parts(make_qarray(qvalue, s))`` differentiates as the identity in
    ``s``, except in rows where ``qvalue`` is all zeros: such a row's scale has
    no effect on the value, so its tangent is ``0``.
  * ``qarray_parts(quantize(x))``'s scale (``quantize`` is straight-through)
    has the derivative of ``max(|x|) / 127`` only in rows where exactly one
    element quantizes to +-127. Where several do, the derivative is shared
    between them: ``x = [[1.0, 0.998, 0.1]]`` quantizes to ``[[127, 127, 13]]``
    and gets ``[[1/254, 1/254, 0]]``, not ``[[1/127, 0, 0]]``.

  The cotangent of ``q`` is that read-out's transpose: ``ct_scale /
  (qvalue_j * count)`` at the ``count`` largest elements, zero elsewhere.
  Raises ``TypeError`` unless ``q`` is a quantized array.
  """
  return QArrayParts(jax.typeof(q))(q)


def _lo_operand(x):
  """``x`` as a JAX value: arrays and tracers unchanged, numpy and Python values converted."""
  try:
    ty = jax.typeof(x)
  except TypeError:
    return jnp.asarray(x)
  return x if isinstance(ty, HiType) or isinstance(x, (jax.Array, jax.core.Tracer)) \
      else jnp.asarray(x)
