"""The Pallas kernel of ``hx.matmul_q`` for the checkpoint layout ``W[out, in]``
(``hx.einsum("...k,nk->...n")``, GGUF, torch ``Linear``): kernel ``hx_matmul_q_nk_v1``,
groups along the contraction ``k``, every format of :mod:`hxmlir.formats`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from hxmlir import formats, targets
from hxmlir.lowering import schema
from hxmlir.lowering.matmul_q.pallas.common import (
  call_blocked,
  check_backend,
  check_blocks,
  empty_product,
  grid_of,
  linear_in_x,
  padded_x,
  round_up,
)
from hxmlir.lowering.matmul_q.pallas.kn import default_blocks
from hxmlir.lowering.matmul_q.pallas.nk_blocks import matmul_q_nk_blocks_pallas

NK_KERNEL_NAME = "hx_matmul_q_nk"
NK_KERNEL_VERSION = 1
"""The ``[out, in]`` kernel's calling convention (see :func:`matmul_q_nk_pallas`); bump when
its semantics or calling convention change (and add back-compat cases)."""
NK_TRITON_KERNEL = targets.register_kernel(targets.TRITON, NK_KERNEL_NAME, NK_KERNEL_VERSION,
                                           ("cuda", "rocm"), owner="hxmlir")
NK_MOSAIC_TPU_KERNEL = targets.register_kernel(targets.MOSAIC_TPU, NK_KERNEL_NAME,
                                               NK_KERNEL_VERSION, ("tpu",), owner="hxmlir")
assert NK_TRITON_KERNEL.ir_name == NK_MOSAIC_TPU_KERNEL.ir_name == "hx_matmul_q_nk_v1"


def default_blocks_nk(m: int, k: int, n: int, backend: str, fmt=formats.INT8,
                      group: int | None = None) -> tuple[int, int, int] | None:
  """``(block_m, block_n, block_k)`` of the ``[out, in]`` kernel for ``x: f32[m, k]`` and a
  weight ``W[n, k]`` (``n`` outputs, ``k`` inputs) in format ``fmt`` with ``group``
  elements of ``k`` per scale (``None``: one scale per output row) on ``backend``.

  As :func:`default_blocks` with the roles of ``n`` and ``k`` exchanged for the group:
  one row block at decode shapes; ``block_n = 128`` output columns (TPU lanes of the
  result); ``block_k``, the weight tile's lane axis, holds 128 stored elements on Mosaic
  (int4: 256 values) and 128 values on Triton, and must hold whole groups or lie inside
  one (``block_k % g == 0`` or ``g % block_k == 0``): else on Triton the largest power of
  two dividing ``g`` (at most 128), on Mosaic the least common multiple of ``g`` and the
  default. Returns ``None`` when no tile fits ``g`` (Triton: a largest power-of-two divisor
  below 16; Mosaic: a multiple above :data:`MOSAIC_MAX_BLOCK_N`).
  """
  # default_blocks' grouped tile axis is its block_n: here it is k
  blocks = default_blocks(m, n, k, backend, fmt, group)
  return None if blocks is None else (blocks[0], blocks[2], blocks[1])


def _broadcast_groups(c, shape, group: int | None):
  """Per-row or per-group factors ``c: [bn, 1]`` or ``[bn, bk / g]`` broadcast over a tile of
  ``shape = (bn, bk)`` (each over its ``g`` consecutive columns)."""
  bn, bk = shape
  if c.shape[-1] == 1:
    return jnp.broadcast_to(c, shape)
  return jnp.broadcast_to(c[:, :, None], (bn, c.shape[-1], group)).reshape(bn, bk)


def _kernel_nk(x_ref, q_ref, s_ref, *refs, k: int, n: int, block_k: int, masked: bool,
               fmt: str, group: int | None):
  """One ``block_m x block_n`` output tile of ``x @ dequantize(W).T`` over chunks of ``block_k``.

  ``x_ref: f32[block_m, kp]`` (zero-padded to ``kp``, ``k`` rounded up to ``block_k``);
  ``q_ref``: stored values ``[block_n, kp / pack]`` (rows ``>= n`` and columns ``>= k``
  lie past the array: masked when ``masked``, else stale); ``s_ref`` (and the offsets
  ``o_ref``, when the format has them, in ``refs`` before the output): per row
  ``[block_n, 1]``, per group ``[block_n, width]`` (every group of the tile's rows: a
  Mosaic block's last dim is the array's or a multiple of 128 lanes), f32 or f16;
  ``out_ref: f32[block_m, block_n]``. Each chunk's weight tile is dequantized as
  ``q * s (+ o)`` in f32, its columns ``>= k`` selected to zero (stale data may be NaN)
  and contracted with the ``x`` chunk along both operands' last axis.
  """
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as pltriton
  f = formats.FORMATS[fmt]
  o_ref, out_ref = (refs[0], refs[1]) if len(refs) == 2 else (None, refs[0])
  block_m, kp = x_ref.shape
  block_n = out_ref.shape[-1]
  r0 = pl.program_id(2) * block_n  # this tile's first weight row (output column)

  def load(ref, c0, width: int, ncols: int, other=0):
    # ref[:, c0:c0 + width], reading rows r0 + r >= n and columns c0 + c >= ncols as other
    if not masked:
      return ref[:, pl.ds(c0, width)]
    shape = (block_n, width)
    rows = r0 + lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = c0 + lax.broadcasted_iota(jnp.int32, shape, 1)
    return pltriton.load(ref.at[:, pl.ds(c0, width)], mask=(rows < n) & (cols < ncols),
                         other=other)

  def factors(ref, k0):
    if group is None:
      return load(ref, 0, 1, 1).astype(jnp.float32)
    # lax.div: jnp's // on a traced int lowers through `sign`, which Mosaic lowers per chip
    c0 = lax.div(k0, group)
    return load(ref, c0, max(block_k // group, 1), k // group).astype(jnp.float32)

  def step(t, acc):
    k0 = pl.multiple_of(t * block_k, block_k)
    xs = x_ref[:, pl.ds(k0, block_k)]
    # Triton has no fp8 `other`: masked fp8 values are selected away below
    c0 = k0 if f.pack == 1 else pl.multiple_of(lax.div(k0, f.pack), block_k // f.pack)
    qt = load(q_ref, c0, block_k // f.pack, k // f.pack, other=0 if f.integer else None)
    shape = (block_n, block_k)
    w = formats.values_f32(qt, f) * _broadcast_groups(factors(s_ref, k0), shape, group)
    if o_ref is not None:
      w = w + _broadcast_groups(factors(o_ref, k0), shape, group)
    if kp != k:  # Mosaic: stale columns (may be NaN); Triton: fp8 has no `other`
      w = jnp.where(k0 + lax.broadcasted_iota(jnp.int32, shape, 1) < k, w, 0.0)
    return acc + lax.dot_general(xs, w, (((1,), (1,)), ((), ())),
                                 precision=lax.Precision.HIGHEST,
                                 preferred_element_type=jnp.float32)

  acc = lax.fori_loop(0, kp // block_k, step, jnp.zeros((block_m, block_n), jnp.float32))
  out_ref[...] = acc


def _check_operands_nk(x, q, s, o):
  """``(format, group)`` of the ``[out, in]`` operands ``x: f32[*b, m, k]``, values of dense
  shape ``[*b, n, k]``, scales (and offsets) per row or group of ``k``; ``TypeError`` naming
  them otherwise."""
  ops = [schema.TensorType.of(v) for v in (x, q, s, *(() if o is None else (o,)))]
  f = formats.of_components(q.dtype, s.dtype, o is not None)
  ok = f is not None and 2 <= x.ndim == q.ndim and s.ndim in (q.ndim - 1, q.ndim)
  group = None
  if ok:
    dense = f.dense_shape(q.shape)
    g = formats.group_of(dense, s.shape)
    ok = (x.shape[:-2] == dense[:-2] and x.shape[-1] == dense[-1] and not isinstance(g, str)
          and formats.check(f, dense, g) is None and (o is None or o.shape == s.shape))
    group = None if isinstance(g, str) else g
  if not ok:
    raise TypeError(f"matmul_q_nk_pallas expects f32[*b, m, k], values of dense shape "
                    f"[*b, n, k] of a format of hxmlir.formats and scales (and offsets) "
                    f"[*b, n] or [*b, n, k/g], got {', '.join(map(str, ops))}")
  return f, group


@linear_in_x("matmul_q_nk_pallas", "nk")
def matmul_q_nk_pallas(x, q, s, o=None, *, backend: str, interpret: bool = False,
                       blocks: Sequence[int] | None = None):
  """``x @ dequantize(W).T`` for a weight in the checkpoint layout ``W[out, in]``, with Pallas.

  ``hx.einsum("...mk,...nk->...mn", x, w)``: ``x: f32[*b, m, k]``; ``q``: stored values of
  dense shape ``[*b, n, k]`` in any format of :mod:`hxmlir.formats` (``i8``, ``ui8``
  int4 or uint4 pairs, ``f8E4M3FN``), quantized along ``k``, the contraction; ``s``:
  scales ``[*b, n]`` (one per output row) or ``[*b, n, k / g]`` (one per group of ``g``
  inputs), f32 or f16 (widened in the kernel); ``o``: offsets like ``s`` for a format
  with an offset (``x = q * s + o``), else ``None`` -> ``f32[*b, m, n]``. Each weight
  tile is dequantized in f32 (``q * s + o``: one rounding for the product, one for the
  sum) and contracted with ``x``; the weight is read once per row block of ``x`` and
  never copied (``x`` is zero-padded to whole blocks, the result sliced back).

  A weight in one of GGUF's block formats (``q: ui16[*b, n, k / B, W]``, ``s``: ``d``, ``o``:
  ``dmin``) goes to :func:`~hxmlir.lowering.matmul_q.pallas.nk_blocks.matmul_q_nk_blocks_pallas`
  (Mosaic and Triton; ``blocks`` does not apply).

  Kernel ``hx_matmul_q_nk_v1`` (:data:`NK_TRITON_KERNEL`, :data:`NK_MOSAIC_TPU_KERNEL`),
  operands ``(x, q, s[, o])``: ``x: f32[B, mp, kp]``, ``q: [B, n, k / pack]``, ``s``
  (and ``o``) ``[B, n, 1]`` or ``[B, n, k / g]`` (``B`` the batch dims collapsed, ``mp`` /
  ``kp`` rounded up to whole blocks) -> ``f32[B, mp, np]``; the format and the group
  follow from the operand types. ``backend``, ``interpret`` as for
  :func:`matmul_q_pallas`; ``blocks``: ``(block_m, block_n, block_k)``, default
  :func:`default_blocks_nk`. Raises ``TypeError`` naming the operand types when they do
  not have these shapes and dtypes, and ``ValueError`` for an unknown backend, Triton
  blocks that are not powers of two >= 16, or a ``block_k`` that neither holds whole
  groups nor lies inside one (nor holds whole bytes of int4 pairs).
  """
  check_backend("matmul_q_nk_pallas", backend)
  x, q, s, o = (v if v is None or isinstance(v, jax.core.Tracer) else jnp.asarray(v)
                for v in (x, q, s, o))
  block = formats.of_components(q.dtype, s.dtype, o is not None, q.shape)
  if block is not None and block.block:  # GGUF's block formats: their own kernel
    return matmul_q_nk_blocks_pallas.__wrapped__(x, q, s, o, backend=backend,
                                                 interpret=interpret)
  f, group = _check_operands_nk(x, q, s, o)
  *batch, m, k = x.shape
  n = q.shape[-2]
  chosen = blocks or default_blocks_nk(m, k, n, backend, f, group)
  if chosen is None:
    raise ValueError(f"matmul_q_nk_pallas: no {backend} block_k holds whole groups of "
                     f"{group} or lies inside one; use the reference (hx.einsum without "
                     "install) for this group size")
  check_blocks("matmul_q_nk_pallas", backend, chosen, "k", f, group)
  if (empty := empty_product(x, n)) is not None:
    return empty
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  g = grid_of(x, n, chosen)
  nb, kp = g.nb, g.kp
  x3 = padded_x(x, g)
  q3 = q.reshape(nb, n, q.shape[-1])
  sq = pl.squeezed
  if group is None:
    width, factors = 1, [c.reshape(nb, n, 1) for c in (s, o) if c is not None]
  else:
    # every group of the tile's rows; with ragged k the last chunk reaches past the last
    # group: whole chunks of groups, rounded up to 128 lanes (selected away in the kernel)
    groups, covered = k // group, max(kp // group, k // group)
    width = groups if covered == groups else round_up(covered, 128)
    factors = [c.reshape(nb, n, groups) for c in (s, o) if c is not None]
  f_spec = pl.BlockSpec((sq, g.block_n, width), lambda b, i, j: (b, j, 0))
  kernel = functools.partial(_kernel_nk, k=k, n=n, block_k=g.block_k,
                             masked=backend == "triton", fmt=f.name, group=group)
  q_spec = pl.BlockSpec((sq, g.block_n, kp // f.pack), lambda b, i, j: (b, j, 0))
  return call_blocked(kernel, g, x3, (q3, *factors), (q_spec, *([f_spec] * len(factors))),
                      backend=backend, interpret=interpret, name=NK_TRITON_KERNEL.ir_name)
