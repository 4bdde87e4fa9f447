"""The Pallas Triton (GPU) kernel of ``hx.matmul_q`` for a weight ``W[out, in]`` in one of GGUF's
block formats at the file's bytes (Q5_0 ... IQ4_XS, :mod:`hxmlir.block_formats`): kernel
``hx_matmul_q_nk_blocks_v1`` for ``cuda`` and ``rocm``.

Triton's tensors have power-of-two shapes, and a block's words do not (70 for Q4_K, 10 for
Q5_0). Its elements do: 32 or 256. So the kernel works per element and reads the words with
gathers. :mod:`hxmlir.block_layout` says which bits of which byte hold each element's value
and each sub-block's factors. From it, per call, XLA builds one table ``i32[R, B]``
(:func:`gather_table`): for each value field, the word of the block that holds element ``e``'s
bits and their shift; for each factor piece, the word, shift, mask and destination bit of
the factor of ``e``'s sub-block. A program then, per block ``b`` of its rows:

* gathers ``[block_n, B]`` words once per field and once per factor piece (the same word
  again for many elements: cache hits);
* forms each element's integer ``q`` (or ``table[q]``, IQ4), its sub-block's ``sc`` (and
  ``m``) with shifts and masks, and the dense value ``w = u * d + v * dmin`` (``u = sc · q``
  exact, ``v = -m``; :mod:`hxmlir.block_decode`'s formula);
* adds ``x[:, block] @ wᵀ`` in f32 (``Precision.HIGHEST``).

Grid ``(batch, mp / block_m, np / block_n)``, all parallel. Rows of the last tile past ``n``
read row ``n - 1`` again (a clamped index, never out of bounds); their columns of the result
are sliced away.

Checked in Pallas' interpret mode against float64 and by lowering for ``cuda`` from CPU; no
GPU has run it, so its speed is unmeasured and the lowering rules keep the reference
decomposition for block weights on GPUs too: the kernel is a direct call.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from hxmlir import block_layout, targets
from hxmlir.lowering.matmul_q.pallas.common import (
  block_weight_operands,
  call_blocked,
  grid_of,
  padded_x,
  table_lookup,
)

BLOCKS_TRITON_KERNEL = targets.register_kernel(targets.TRITON, "hx_matmul_q_nk_blocks", 1,
                                               ("cuda", "rocm"), owner="hxmlir")
BLOCK_M = 16
"""Rows of ``x`` per program (Triton's dot takes at least 16)."""
BLOCK_N = 32
"""Weight rows (output columns) per program."""


@functools.cache
def table_rows(name: str) -> dict[tuple[str, int], int]:
  """The first row of :func:`gather_table` of each part of block format ``name``:
  ``("field", i)`` (2 rows: word, shift) per value field, then ``("scale", i)`` and
  ``("min", i)`` (4 rows: word, shift, mask, dest) per factor piece."""
  lay = block_layout.LAYOUTS[name]
  parts = ([("field", i, 2) for i in range(len(lay.fields))]
           + [("scale", i, 4) for i in range(len(lay.scale))]
           + [("min", i, 4) for i in range(len(lay.mins))])
  starts = np.cumsum([0] + [size for _, _, size in parts])
  return {(kind, i): int(r) for (kind, i, _), r in zip(parts, starts)}


@functools.cache
def gather_table(name: str) -> np.ndarray:
  """``i32[R, B]``: per element ``e`` of a block of format ``name``, where its bits lie
  (:func:`table_rows` says which rows are which; ``B`` the block's elements).

  A value field's rows: the word (16 bits, little-endian, from the block's first byte of
  values) holding ``e``'s bits and their shift in it. A factor piece's rows: the word holding
  the piece's bits of ``e``'s sub-block, their shift, their mask (0: the piece gives nothing
  to that sub-block) and the bit they go to."""
  lay = block_layout.LAYOUTS[name]
  b = lay.block
  rows = []
  for f in lay.fields:
    byte, shift = np.zeros(b, np.int64), np.zeros(b, np.int64)
    for t in range(8 // f.width):
      el = f.elements[:, t]
      byte[el] = f.offset + np.arange(f.nbytes)
      shift[el] = t * f.width
    rows += [byte // 2, 8 * (byte % 2) + shift]
  sub = np.arange(b) // (lay.sub or b)
  for p in (*lay.scale, *lay.mins):
    at = p.at[sub]
    rows += [at // 2, 8 * (at % 2) + p.shift[sub], (1 << p.width[sub]) - 1, p.dest[sub]]
  return np.stack(rows).astype(np.int32)


def triton_block_n(block_n: int | None) -> int:
  """``block_n`` (``None``: :data:`BLOCK_N`), checked: ``ValueError`` unless a power of two
  >= 16."""
  bn = BLOCK_N if block_n is None else block_n
  if bn < 16 or bn & (bn - 1):
    raise ValueError(f"matmul_q_nk_blocks_pallas: Triton's block_n must be a power of two "
                     f">= 16, got {bn}")
  return bn


def _kernel(x_ref, q_ref, d_ref, *refs, name: str, n: int, nblk: int):
  """One ``block_m x block_n`` output tile (see the module docstring). ``x_ref: f32[bm, k]``,
  ``q_ref: ui16[bn, nblk * W]``, ``d_ref`` (and ``dmin_ref`` in ``refs``): ``f32[bn, nblk]``,
  ``t_ref: i32[R, B]`` (:func:`gather_table`), ``out_ref: f32[bm, bn]``."""
  from jax.experimental import pallas as pl
  lay = block_layout.LAYOUTS[name]
  dmin_ref, t_ref, out_ref = refs if len(refs) == 3 else (None, *refs)
  B, W = lay.block, lay.nbytes // 2
  bn = out_ref.shape[-1]
  r0 = pl.program_id(2) * bn
  # this tile's rows, those past n clamped to the last row (their results are sliced away)
  def clamped_rows(shape):
    return jnp.minimum(r0 + lax.broadcasted_iota(jnp.int32, shape, 0), n - 1) - r0

  rows, rows1 = clamped_rows((bn, B)), clamped_rows((bn,))
  first = table_rows(name)

  def row(kind: str, i: int, j: int):  # i32[1, B]: row j of part (kind, i) of the table
    return t_ref[first[(kind, i)] + j, :][None, :]

  def bits(base, word_row, shift_row):
    word = q_ref[rows, base + word_row].astype(jnp.int32)
    return lax.shift_right_logical(word, shift_row)

  def factor(kind: str, count: int, base):
    total = jnp.zeros((bn, B), jnp.int32)
    for i in range(count):
      v = bits(base, row(kind, i, 0), row(kind, i, 1)) & row(kind, i, 2)
      total = total + lax.shift_left(v, row(kind, i, 3))
    return total

  def step(b, acc):
    base = b * W
    q = jnp.zeros((bn, B), jnp.int32)
    for i, f in enumerate(lay.fields):
      v = bits(base, row("field", i, 0), row("field", i, 1)) & ((1 << f.width) - 1)
      q = q | lax.shift_left(v, jnp.int32(f.dest))
    # IQ4: the 16 non-linear values; every value and product with sc is an exact f32 integer
    value = table_lookup(q, lay.table) if lay.table else (q - lay.minus).astype(jnp.float32)
    if lay.scale:
      sc = factor("scale", len(lay.scale), base)
      if lay.signed_scale:
        sc = jnp.where(sc >= 128, sc - 256, sc)
      value = value * (sc - lay.factor_minus).astype(jnp.float32)
    w = value * d_ref[rows1, b][:, None]
    if lay.mins:
      v = -factor("min", len(lay.mins), base)
      w = w + v.astype(jnp.float32) * dmin_ref[rows1, b][:, None]
    elif lay.offset_as_is:
      w = w + dmin_ref[rows1, b][:, None]
    xb = x_ref[:, pl.ds(pl.multiple_of(b * B, B), B)]
    return acc + lax.dot_general(xb, w, (((1,), (1,)), ((), ())),
                                 precision=lax.Precision.HIGHEST,
                                 preferred_element_type=jnp.float32)

  out_ref[...] = lax.fori_loop(0, nblk, step, jnp.zeros(out_ref.shape, jnp.float32))


def matmul_q_nk_blocks_triton(x, q, d, dmin, *, name: str, interpret: bool = False,
                              block_n: int | None = None):
  """``x @ dequantize(W).T`` for ``W[out, in]`` in block format ``name``, with Pallas Triton.

  Operands as :func:`~hxmlir.lowering.matmul_q.pallas.nk_blocks.matmul_q_nk_blocks_pallas`
  takes them, checked there: ``x: f32[*b, m, k]``, ``q: ui16[*b, n, k / B, W]``, ``d`` (and
  ``dmin``) ``f16[*b, n, k / B]`` -> ``f32[*b, m, n]``. ``block_n``: weight rows per program, a
  power of two >= 16 (default :data:`BLOCK_N`). Each output is one f32 sum over ``k`` of
  ``x`` times the dense weight, which is formed as :mod:`hxmlir.block_decode` forms it.

  Kernel ``hx_matmul_q_nk_blocks_v1`` for Triton (:data:`BLOCKS_TRITON_KERNEL`), operands
  ``(x, q, d[, dmin], table)``: ``x: f32[B, mp, k]``, ``q: ui16[B, n, k / B * W]``, ``d`` (and
  ``dmin``) ``f32[B, n, k / B]``, ``table: i32[R, B]`` (:func:`gather_table`) ->
  ``f32[B, mp, np]``. Raises ``ValueError`` for a ``block_n`` that is not a power of two
  >= 16."""
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  bn = triton_block_n(block_n)
  k = x.shape[-1]
  n, nblk = q.shape[-3:-1]
  g = grid_of(x, n, (BLOCK_M, bn, k))
  table = jnp.asarray(gather_table(name))
  operands, specs = block_weight_operands(g, q, d, dmin)
  operands.append(table)
  specs.append(pl.BlockSpec(table.shape, lambda bi, i, j: (0, 0)))
  kernel = functools.partial(_kernel, name=name, n=n, nblk=nblk)
  return call_blocked(kernel, g, padded_x(x, g), operands, specs, backend="triton",
                      interpret=interpret, name=BLOCKS_TRITON_KERNEL.ir_name)
