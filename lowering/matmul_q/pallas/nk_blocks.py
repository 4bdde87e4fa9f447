"""The Pallas TPU kernel of ``hx.matmul_q`` for a weight ``W[out, in]`` in one of GGUF's block
formats at the file's bytes (Q5_0 ... IQ4_XS, :mod:`hxmlir.block_formats`): kernel
``hx_matmul_q_nk_blocks_v1`` on Mosaic, and :func:`matmul_q_nk_blocks_pallas`, the entry for
both backends (Triton's kernel: :mod:`.nk_blocks_triton`).

The decode works on whole 16-bit words, never on single bytes or lanes: a block's values
(``W`` words) are bit planes. Each plane is one shift and one mask of every word, and
:mod:`hxmlir.block_layout` says which element of the block each (plane, word) holds. The
kernel never moves a weight element to its place along ``k``. ``x`` is permuted once per
call instead: ``xp[p, i, c]`` holds ``x[i, e]`` for the element ``e`` that word ``c`` holds
in plane ``p``, and 0 where word ``c`` holds none. Then ``y = sum_p xp[p] @ (plane_p · weight_p
· sc · d)ᵀ``. Sub-block factors come from two one-hot matrix products:

* a gather of the factor bytes (``[bn, words] @ [words, sub-blocks]``);
* a spread of each factor over its plane's words (``[bn, sub-blocks] @ [sub-blocks, words]``).

Both run in bf16 on small integers (bytes, factors), so they are exact. ``d`` is spread over
the words the same way in f32 at ``Precision.HIGHEST`` (a one-hot product: exact). The
constant part of each sub-block takes one more product, ``xs @ Cᵀ``. Here ``xs`` is ``x``
summed per sub-block and ``C = -minus · sc · d - m · dmin`` (``+ dmin`` for Q5_1).

Grid ``(batch, mp / block_m, np / block_n)``, all parallel. Each program holds a
``block_m x block_n`` output tile, the whole rows of its ``block_n`` weight rows (``ui16``,
``n`` rows of ``k / B * W`` words) and their ``d`` (and ``dmin``) widened to f32 by XLA. It
walks the row in static chunks of whole blocks (:func:`chunk_blocks`). The one-hot tables
are built once per call from the layout with ``iota`` (no constants in the IR). Rows past
``n`` in the last tile read stale data, which stays in those rows' own result columns,
sliced away.

Seen on a TPU v5e with jax 0.10.2 (0.8.5, ``benchmarks/matmul_q_blocks_pallas.py``): Mosaic
compiled the kernel for every format, and it matched float64 within 7e-8 of ``|x|·|W|``. It
took 0.5-5x the time of XLA's own decode and dot, per format and shape. So the lowering rules
keep the reference decomposition for block weights, and this kernel is a direct call. Again in
0.8.7, at ``m`` up to 256: Q5_0 and Q5_1 with more than one tile of rows ran out of Mosaic's
scoped VMEM at the tiles of 0.8.6 (:func:`default_block_n`, :data:`XP_BYTES`); at the smaller
tiles every format compiled and matched float64 within 8e-8 of ``|x|·|W|``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hxmlir import block_layout, formats, targets
from hxmlir.lowering.matmul_q.pallas.common import (
  block_weight_operands,
  call_blocked,
  check_backend,
  empty_product,
  grid_of,
  linear_in_x,
  padded_x,
  round_up,
  table_lookup,
)
from hxmlir.lowering.matmul_q.pallas.nk_blocks_triton import (
  matmul_q_nk_blocks_triton,
  triton_block_n,
)

BLOCKS_KERNEL_NAME = "hx_matmul_q_nk_blocks"
BLOCKS_KERNEL_VERSION = 1
"""The calling convention of :func:`matmul_q_nk_blocks_pallas`'s kernel; bump when it changes."""
BLOCKS_MOSAIC_TPU_KERNEL = targets.register_kernel(
    targets.MOSAIC_TPU, BLOCKS_KERNEL_NAME, BLOCKS_KERNEL_VERSION, ("tpu",), owner="hxmlir")

CHUNK_WORDS = 512
"""Words of a weight row that one chunk of the kernel decodes at a time (whole blocks)."""
BLOCK_N = 256
"""Weight rows (output columns) per program (:func:`default_block_n`)."""
XP_BYTES = 2 << 20
"""The most VMEM the permuted ``x`` block takes (it bounds ``block_m``). On a TPU v5e (0.8.7),
4 MiB let Q5_0 at ``m = 64``, ``k = 4096`` take ``block_m = 40``, and Mosaic needed 39.75 MiB of
its 16 MiB of scoped VMEM; with 2 MiB every other format compiled at ``m = 64``."""


def default_block_n(name: str) -> int:
  """Weight rows per program when the caller gives none: :data:`BLOCK_N`, or 128 for Q5_0 and
  Q5_1, whose chunks hold the most blocks (51 of 32 elements) over the most bit planes (20).

  On a TPU v5e (0.8.7), Q5_0 at ``k = 4096`` with ``block_m = 16`` and two or more tiles of
  rows needed 18.3 MiB of the 16 MiB of scoped VMEM at ``block_n = 256``, and compiled at 128.
  """
  lay = block_layout.LAYOUTS[name]
  return 128 if lay.block == 32 and len(planes(name)) > 4 else BLOCK_N


@dataclass(frozen=True)
class Plane:
  """One bit plane of a block: bits ``[shift, shift + width)`` of each word, weighing
  ``weight`` in the stored value; ``elements[j]``: the element word ``j`` holds, or -1."""
  shift: int
  width: int
  weight: int
  elements: tuple[int, ...]


@functools.cache
def planes(name: str) -> tuple[Plane, ...]:
  """The bit planes of block format ``name``'s words (:mod:`hxmlir.block_layout`)."""
  lay = block_layout.LAYOUTS[name]
  words = lay.nbytes // 2
  out = []
  for f in lay.fields:
    for parity in (0, 1):
      for t in range(8 // f.width):
        el = [-1] * words
        for j in range(words):
          i = 2 * j + parity - f.offset
          if 0 <= i < f.nbytes:
            el[j] = int(f.elements[i, t])
        if max(el) >= 0:
          out.append(Plane(8 * parity + f.width * t, f.width, 1 << f.dest, tuple(el)))
  return tuple(out)


def chunk_blocks(name: str, nblk: int) -> int:
  """Blocks per chunk of a row of ``nblk`` blocks of format ``name``: whole blocks of about
  :data:`CHUNK_WORDS` words (the one-hot products grow with the chunk's square)."""
  words = block_layout.LAYOUTS[name].nbytes // 2
  return max(1, min(nblk, CHUNK_WORDS // words))


def _one_hot(rows: int, cols: int, target) -> jax.Array:
  """``bf16[rows, cols]``: 1 where ``row == target(col)`` (``target``: int32[cols], -1 none)."""
  r = lax.broadcasted_iota(jnp.int32, (rows, cols), 0)
  return (r == target[None, :]).astype(jnp.bfloat16)


def _tables(name: str, cb: int):
  """The chunk's one-hot tables and piece vectors (``cb`` blocks), built with ``iota``.

  ``rep: f32[cb, cb*W]`` (block of each word), ``reps: f32[cb, cb*S]`` (block of each
  sub-block), ``maps: bf16[P, cb*S, cb*W]`` (sub-block of plane ``p``'s word, formats with
  a scale factor), ``gather: bf16[2 * pieces, cb*W, cb*S]`` (the word holding each sub-block's
  factor byte, low and high byte), ``vec: i32[3 * pieces, cb*S]`` (shift, mask, dest)."""
  lay = block_layout.LAYOUTS[name]
  w, s, sub = lay.nbytes // 2, lay.subs, lay.sub or lay.block
  cw, cs = cb * w, cb * s
  col_w = jnp.arange(cw, dtype=jnp.int32)
  col_s = jnp.arange(cs, dtype=jnp.int32)
  out = {"rep": _one_hot(cb, cw, col_w // w).astype(jnp.float32),
         "reps": _one_hot(cb, cs, col_s // s).astype(jnp.float32)}
  if lay.scale:
    maps = []
    for p in planes(name):
      el = jnp.asarray(np.asarray(p.elements, np.int32))[col_w % w]
      maps.append(_one_hot(cs, cw, jnp.where(el >= 0, (col_w // w) * s + el // sub, -1)))
    out["maps"] = jnp.stack(maps)
    gather, vec = [], []
    for piece in (*lay.scale, *lay.mins):
      at = jnp.asarray(piece.at.astype(np.int32))[col_s % s]
      live = jnp.asarray(piece.width.astype(np.int32))[col_s % s] > 0
      word = jnp.where(live, (col_s // s) * w + at // 2, -1)
      for parity in (0, 1):
        gather.append(_one_hot(cw, cs, jnp.where(at % 2 == parity, word, -1)))
      for a in (piece.shift, (1 << piece.width) - 1, piece.dest):
        vec.append(jnp.asarray(a.astype(np.int32))[col_s % s])
    out["gather"] = jnp.stack(gather)
    out["vec"] = jnp.stack(vec)
  return out


def _factor(lo, hi, gather_ref, vec_ref, first: int, count: int, cs: int, cw: int):
  """``i32[bn, cs]``: the sum of pieces ``first .. first + count`` of each sub-block's factor
  (bytes ``lo``/``hi``: ``bf16[bn, cw]``, the words' low and high bytes)."""
  total = None
  for p in range(first, first + count):
    g = (jnp.dot(lo, gather_ref[2 * p, :cw, :cs], preferred_element_type=jnp.float32)
         + jnp.dot(hi, gather_ref[2 * p + 1, :cw, :cs], preferred_element_type=jnp.float32))
    shift, mask, dest = (vec_ref[3 * p + r:3 * p + r + 1, :cs] for r in range(3))
    bits = lax.shift_left(lax.shift_right_logical(g.astype(jnp.int32), shift) & mask, dest)
    total = bits if total is None else total + bits
  return total


def _nt(a, b):
  """``a @ bᵀ`` in f32 at ``Precision.HIGHEST`` (``a: [m, c]``, ``b: [n, c]``)."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                         preferred_element_type=jnp.float32)


def _hi(a, b):
  """``a @ b`` in f32 at ``Precision.HIGHEST``."""
  return jnp.dot(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def _kernel(*refs, name: str, nblk: int, cb: int, has_xs: bool, has_dmin: bool):
  """One ``block_m x block_n`` output tile (see the module docstring). ``refs``: ``xp:
  f32[P, bm, L]``, (``xs: f32[bm, nblk*S]``), ``q: ui16[bn, L]``, ``d: f32[bn, nblk]``,
  (``dmin``), ``rep``, ``reps``, (``maps``, ``gather``, ``vec``), ``out: f32[bm, bn]``."""
  lay = block_layout.LAYOUTS[name]
  refs = list(refs)
  xp_ref = refs.pop(0)
  xs_ref = refs.pop(0) if has_xs else None
  q_ref, d_ref = refs.pop(0), refs.pop(0)
  dmin_ref = refs.pop(0) if has_dmin else None
  rep_ref, reps_ref = refs.pop(0), refs.pop(0)
  maps_ref, gather_ref, vec_ref = (refs.pop(0), refs.pop(0), refs.pop(0)) if lay.scale \
      else (None, None, None)
  out_ref = refs.pop(0)
  w, s = lay.nbytes // 2, lay.subs
  n_scale = len(lay.scale)
  acc = jnp.zeros(out_ref.shape, jnp.float32)
  for b0 in range(0, nblk, cb):
    nb = min(cb, nblk - b0)
    cw, cs = nb * w, nb * s
    words = q_ref[:, b0 * w:(b0 + nb) * w].astype(jnp.int32)
    d = d_ref[:, b0:b0 + nb]
    d_words = _hi(d, rep_ref[:nb, :cw])
    sc = None
    if lay.scale:
      lo = (words & 255).astype(jnp.bfloat16)
      hi = lax.shift_right_logical(words, 8).astype(jnp.bfloat16)
      sc = _factor(lo, hi, gather_ref, vec_ref, 0, n_scale, cs, cw)
      if lay.signed_scale:
        sc = jnp.where(sc >= 128, sc - 256, sc)
      sc = sc - lay.factor_minus
      sc_b = sc.astype(jnp.bfloat16)
    for p, plane in enumerate(planes(name)):
      bits = lax.shift_right_logical(words, plane.shift) & ((1 << plane.width) - 1)
      val = table_lookup(bits, lay.table) if lay.table else \
          bits.astype(jnp.float32) * float(plane.weight)
      if sc is not None:
        val = val * jnp.dot(sc_b, maps_ref[p, :cs, :cw], preferred_element_type=jnp.float32)
      acc = acc + _nt(xp_ref[p, :, b0 * w:(b0 + nb) * w], val * d_words)
    if has_xs:
      d_subs = _hi(d, reps_ref[:nb, :cs])
      const = jnp.zeros(d_subs.shape, jnp.float32)
      if lay.minus:
        factor = 1.0 if sc is None else sc.astype(jnp.float32)
        const = const - float(lay.minus) * factor * d_subs
      if lay.mins or lay.offset_as_is:
        dmin_subs = _hi(dmin_ref[:, b0:b0 + nb], reps_ref[:nb, :cs])
        if lay.mins:
          m = _factor(lo, hi, gather_ref, vec_ref, n_scale, len(lay.mins), cs, cw)
          const = const - m.astype(jnp.float32) * dmin_subs
        else:
          const = const + dmin_subs
      acc = acc + _nt(xs_ref[:, b0 * s:(b0 + nb) * s], const)
  out_ref[...] = acc


def _check_operands(x, q, d, dmin):
  """The block format of ``x: f32[*b, m, k]``, values ``ui16[*b, n, k/B, W]``, ``d`` (and
  ``dmin``) ``f16[*b, n, k/B]``; ``TypeError`` naming the operand types otherwise."""
  from hxmlir.lowering import schema
  ops = [schema.TensorType.of(v) for v in (x, q, d, *(() if dmin is None else (dmin,)))]
  f = formats.of_components(q.dtype, d.dtype, dmin is not None, q.shape)
  ok = (f is not None and f.block is not None and x.dtype == jnp.float32 and x.ndim >= 2
        and q.ndim == x.ndim + 1 and d.shape == q.shape[:-1]
        and (dmin is None or dmin.shape == d.shape)
        and x.shape[:-2] == q.shape[:-3] and x.shape[-1] == q.shape[-2] * f.block)
  if not ok:
    raise TypeError(f"matmul_q_nk_blocks_pallas expects f32[*b, m, k], a block format's "
                    f"values ui16[*b, n, k/B, W] and d (and dmin) f16[*b, n, k/B], got "
                    f"{', '.join(map(str, ops))}")
  return f


def _permuted_x(x3, name: str, nblk: int):
  """``f32[nb, P, mp, nblk*W]``: ``x3: f32[nb, mp, k]`` in the words' order per plane (0 where
  a word holds no element of the plane)."""
  lay = block_layout.LAYOUTS[name]
  w = lay.nbytes // 2
  el = jnp.asarray(np.asarray([p.elements for p in planes(name)], np.int32))  # [P, W]
  cols = jnp.arange(nblk * w, dtype=jnp.int32)
  e = el[:, cols % w]
  zero = nblk * lay.block  # the index of the zero appended to x
  idx = jnp.where(e >= 0, (cols // w)[None, :] * lay.block + e, zero)
  ext = jnp.pad(x3, ((0, 0), (0, 0), (0, 1)))
  return jnp.take(ext, idx, axis=2).transpose(0, 2, 1, 3)


@linear_in_x("matmul_q_nk_blocks_pallas", "nk")
def matmul_q_nk_blocks_pallas(x, q, d, dmin=None, *, backend: str = "mosaic_tpu",
                              interpret: bool = False, block_n: int | None = None):
  """``x @ dequantize(W).T`` for ``W[out, in]`` in a GGUF block format, with Pallas.

  ``x: f32[*b, m, k]``; ``q: ui16[*b, n, k / B, W]``, the blocks' values at the file's
  bytes (:mod:`hxmlir.block_formats`); ``d: f16[*b, n, k / B]``, the block scales; ``dmin``:
  the block offsets for Q4_K, Q5_K, Q2_K and Q5_1, else ``None`` -> ``f32[*b, m, n]``. The
  format follows from the operands (:func:`hxmlir.formats.of_components`). Each weight word
  is read once per row block of ``x`` and decoded on chip; the weight is never copied.

  ``backend="mosaic_tpu"``: this module's kernel. XLA permutes ``x``, sums it per sub-block
  and widens ``d``/``dmin`` to f32. See the module docstring for the method and its
  roundings: each plane's ``bits · weight · sc`` is an exact integer, times ``d`` rounded
  once, and the products are summed in f32. ``backend="triton"``:
  :func:`~hxmlir.lowering.matmul_q.pallas.nk_blocks_triton.matmul_q_nk_blocks_triton`, which
  forms the dense weight as :mod:`hxmlir.block_decode` does and sums its products with ``x``
  in f32.

  Kernel ``hx_matmul_q_nk_blocks_v1`` (:data:`BLOCKS_MOSAIC_TPU_KERNEL`, and
  ``BLOCKS_TRITON_KERNEL`` with operands of its own). ``interpret`` runs it in Pallas'
  interpreter (any machine); ``block_n``: weight rows per program (default
  :func:`default_block_n` on Mosaic, ``nk_blocks_triton.BLOCK_N`` on Triton). Raises ``TypeError``
  naming the operand types when they are not these, and ``ValueError`` for an unknown
  backend, a Triton ``block_n`` that is not a power of two >= 16, or a Mosaic one that is
  neither a multiple of 128 nor at least ``n``. An empty product (a zero among ``*b``,
  ``m``, ``n``) is zeros ``f32[*b, m, n]`` without a kernel.
  """
  check_backend("matmul_q_nk_blocks_pallas", backend)
  x, q, d, dmin = (v if v is None or isinstance(v, jax.core.Tracer) else jnp.asarray(v)
                   for v in (x, q, d, dmin))
  f = _check_operands(x, q, d, dmin)
  if backend == "triton":
    triton_block_n(block_n)
  elif block_n is not None and (block_n < 1 or (block_n % 128 and block_n < q.shape[-3])):
    raise ValueError(f"matmul_q_nk_blocks_pallas: Mosaic's block_n must be a multiple of 128 "
                     f"(the output tile's lanes) or cover all {q.shape[-3]} rows, got {block_n}")
  if (empty := empty_product(x, q.shape[-3])) is not None:
    return empty
  if backend == "triton":
    return matmul_q_nk_blocks_triton(x, q, d, dmin, name=f.name, interpret=interpret,
                                     block_n=block_n)
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  name = f.name
  lay = block_layout.LAYOUTS[name]
  *batch, m, k = x.shape
  n, nblk, w = q.shape[-3:]
  s = lay.subs
  cb = chunk_blocks(name, nblk)
  npl = len(planes(name))
  block_m = min(round_up(max(m, 1), 8),
                max(8, XP_BYTES // (4 * npl * nblk * w) // 8 * 8))
  # whole rows of the weight (block_k = k), block_n of them (or all n)
  g = grid_of(x, n, (block_m, min(n, block_n or default_block_n(name)), k))
  x3 = padded_x(x, g)
  has_xs = bool(lay.minus or lay.mins or lay.offset_as_is)
  has_dmin = dmin is not None
  sq = pl.squeezed
  x_spec = pl.BlockSpec((sq, npl, block_m, nblk * w), lambda bi, i, j: (bi, 0, i, 0))
  operands, specs = [], []
  if has_xs:
    operands.append(x3.reshape(g.nb, g.mp, nblk * s, -1).sum(-1))
    specs.append(pl.BlockSpec((sq, block_m, nblk * s), lambda bi, i, j: (bi, i, 0)))
  weight, weight_specs = block_weight_operands(g, q, d, dmin)
  operands += weight
  specs += weight_specs
  tables = _tables(name, cb)
  for key in ("rep", "reps", "maps", "gather", "vec"):
    if key in tables:
      t = tables[key]
      operands.append(t)
      specs.append(pl.BlockSpec(t.shape, lambda bi, i, j, _r=t.ndim: (0,) * _r))
  kernel = functools.partial(_kernel, name=name, nblk=nblk, cb=cb, has_xs=has_xs,
                             has_dmin=has_dmin)
  return call_blocked(kernel, g, _permuted_x(x3, name, nblk), operands, specs,
                      backend=backend, interpret=interpret,
                      name=BLOCKS_MOSAIC_TPU_KERNEL.ir_name, x_spec=x_spec)
