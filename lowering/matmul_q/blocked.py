"""``hx.matmul_q`` for any dimension numbers, one block of the weight at a time.

The reference (:func:`hxmlir.lowering.reference.matmul_q`) converts the whole
weight ``q: i8[...]`` to f32 before its ``dot_general``; XLA keeps that copy in
temporary memory (four times the int8 bytes). The streaming builders of
``lowering/matmul_q/streaming.py`` avoid it for the layouts they know
(``f32[*b, m, k] x i8[*b, k, n]``, and ``f32[..., k] x i8[k, n]`` collapsed to
it). For every other layout -- the ``[out, in]`` checkpoint layout ``"mk,nk->mn"``
(scale on the result), a stack of weights ``"...ij,hjk->...ik"`` -- this module
walks one free axis of ``q`` in blocks inside a ``lax.fori_loop``: each step
slices ``q`` (and the scale, when it spans that axis), applies the reference to
the block and writes the block of the result with ``dynamic_update_slice``. Each
element is computed by the same reference arithmetic on the same values, so
results equal the reference's up to the order XLA sums a dot in.

Blocks are ``BLOCK_BYTES`` of converted f32 weight at most (and at most
``1/MAX_FRACTION`` of the whole); the axis walked is ``q``'s largest free axis.

Every format (:mod:`hxmlir.formats`) takes this path on CPU (the streaming builders
and the native kernel know int8 per-row weights only): shapes and block offsets are
the weight's dense ones; a block along the quantized axis holds whole groups and
whole packed int4 bytes, and slices the stored values (``offset // 2`` for int4
pairs) and the group scales (``offset // g``) to match. So an int4 or fp8 weight is
never unpacked or converted whole.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hxmlir import formats
from hxmlir.lowering import reference
from hxmlir.types import dotdims

BLOCK_BYTES = 2 * 1024 * 1024
MAX_FRACTION = 16
# Weights of at most this many elements are converted whole (the reference).
SMALL_WEIGHT = 64 * 1024


def block_axis(q_shape, dims) -> int | None:
  """The free axis of ``q`` to walk (its largest), or ``None`` when ``q`` has none or the
  weight is small enough to convert whole."""
  (_, rc), (_, rb) = dims
  free = dotdims.free_dims(len(q_shape), rc, rb)
  if not free or int(np.prod(q_shape, dtype=np.int64)) <= SMALL_WEIGHT:
    return None
  return max(free, key=lambda a: q_shape[a])


def block_size(q_shape, axis: int, align: int = 1) -> int:
  """The block length along ``axis`` (of the dense shape ``q_shape``): ``BLOCK_BYTES`` of
  f32, at most 1/MAX_FRACTION of q, a multiple of ``align`` (whole groups and packed
  bytes along the quantized axis: :func:`alignment`)."""
  other = int(np.prod(q_shape, dtype=np.int64)) // q_shape[axis]
  budget = min(BLOCK_BYTES, 4 * other * q_shape[axis] // MAX_FRACTION)
  b = max(1, min(q_shape[axis], budget // (4 * other)))
  return max(align, b // align * align)


def alignment(q_shape, axis: int, fmt: formats.Format, group: int | None) -> int:
  """What a block length along ``axis`` must be a multiple of: whole groups and whole
  stored bytes along the quantized (last) axis, anything elsewhere."""
  if axis != len(q_shape) - 1:
    return 1
  return int(np.lcm(group or 1, fmt.pack))


def matmul_q_blocked(x, q, s, *o, dimension_numbers, axis: int, block: int):
  """:func:`reference.matmul_q` computed ``block`` entries of ``q``'s free ``axis`` at a
  time (``x: f32[...]``, ``q``: stored values of any format, ``s: f32[...]`` (or f16);
  ``o``: the offsets of a format with one, sliced like ``s``
  (:func:`reference.matmul_q_offset`); JAX arrays or tracers; ``axis`` and ``block``
  count dense elements)."""
  dims = dimension_numbers
  (lc, rc), (lb, rb) = dims
  fmt = formats.of_components(q.dtype, s.dtype, bool(o), q.shape)
  dense = fmt.dense_shape(q.shape)
  group = formats.group_of_scale(dense, s)
  out_shape = dotdims.result_shape(x.shape, dense, dims)
  q_free = dotdims.free_dims(len(dense), rc, rb)
  r_axis = len(out_shape) - len(q_free) + q_free.index(axis)
  last = axis == len(dense) - 1
  stored = q.dtype
  if jnp.issubdtype(stored, jnp.floating):
    # XLA CPU has no fp8 arithmetic: it widens fp8 values to f16 where they are used,
    # which would be the whole weight; slice the bytes and reinterpret each block
    q = lax.bitcast_convert_type(q, jnp.uint8)

  def part(start, size):
    if last and fmt.block:  # whole blocks: the values' block axis and the scales in step
      qb = lax.dynamic_slice_in_dim(q, start // fmt.block, size // fmt.block, axis)
      sb = [lax.dynamic_slice_in_dim(c, start // group, size // group, axis) for c in (s, *o)]
    elif last:  # the quantized axis: stored bytes and group scales in step
      qb = lax.dynamic_slice_in_dim(q, start // fmt.pack, size // fmt.pack, axis)
      sb = [c if group is None else lax.dynamic_slice_in_dim(c, start // group, size // group,
                                                              axis) for c in (s, *o)]
    else:
      qb = lax.dynamic_slice_in_dim(q, start, size, axis)
      sb = [lax.dynamic_slice_in_dim(c, start, size, axis) for c in (s, *o)]
    return reference.matmul_q_offset(x, lax.bitcast_convert_type(qb, stored), sb[0],
                                     sb[1] if o else None, dims)

  def step(i, out):
    start = i * block
    return lax.dynamic_update_slice_in_dim(out, part(start, block), start, r_axis)

  steps, rem = divmod(dense[axis], block)
  # lower_composite traces references under jax.disable_jit(), which would unroll
  # the loop into a Python loop of constant offsets
  with jax.disable_jit(False):
    out = lax.fori_loop(0, steps, step, jnp.zeros(out_shape, jnp.float32))
  if rem:
    out = lax.dynamic_update_slice_in_dim(out, part(steps * block, rem), steps * block, r_axis)
  return out


@functools.cache
def blocked_for(dimension_numbers, axis: int, block: int) -> Callable:
  """:func:`matmul_q_blocked` with its parameters bound, one function object per set
  (``lower_composite`` shares equal decompositions)."""
  return functools.partial(matmul_q_blocked, dimension_numbers=dimension_numbers,
                           axis=axis, block=block)
