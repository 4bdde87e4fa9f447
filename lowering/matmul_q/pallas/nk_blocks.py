"""The Pallas TPU kernel of ``hx.matmul_q`` for a weight ``W[out, in]`` in one of GGUF's block
formats at the file's bytes (Q5_0 ... IQ4_XS, :mod:`hxmlir.block_formats`): kernel
``hx_matmul_q_nk_blocks_v1``, Mosaic only.

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
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hxmlir import block_layout, formats, targets
from hxmlir.lowering.matmul_q.pallas.common import check_backend, compiler_params, round_up

BLOCKS_KERNEL_NAME = "hx_matmul_q_nk_blocks"
BLOCKS_KERNEL_VERSION = 1
"""The calling convention of :func:`matmul_q_nk_blocks_pallas`'s kernel; bump when it changes."""
BLOCKS_MOSAIC_TPU_KERNEL = targets.register_kernel(
    targets.MOSAIC_TPU, BLOCKS_KERNEL_NAME, BLOCKS_KERNEL_VERSION, ("tpu",), owner="hxmlir")
BLOCKS_GEMV_MOSAIC_TPU_KERNEL = targets.register_kernel(
    targets.MOSAIC_TPU, BLOCKS_KERNEL_NAME + "_gemv", BLOCKS_KERNEL_VERSION, ("tpu",),
    owner="hxmlir")
"""The kernel of at most :data:`GEMV_MAX_M` rows of ``x`` (:func:`_gemv_kernel`)."""
VMEM_LIMIT = 64 << 20
"""The GEMV kernel's VMEM limit (bytes; a TPU v5e core has 128 MiB): its ``x`` operand holds
three bf16 limbs per element, row and bit field."""

CHUNK_WORDS = 512
"""Words of a weight row that one chunk of the kernel decodes at a time (whole blocks)."""
BLOCK_N = 256
"""Weight rows (output columns) per program."""
XP_BYTES = 4 << 20
"""The most VMEM the permuted ``x`` block takes (it bounds ``block_m``)."""


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


def _factors(words, gather_ref, vec_ref, lay: block_layout.BlockLayout, cs: int, cw: int):
  """``(sc, m)``: ``i32[bn, cs]`` each, the scale and min factors of the chunk's sub-blocks from
  its words ``i32[bn, cw]`` (``sc``: ``None`` without factors, ``m``: ``None`` without mins)."""
  if not lay.scale:
    return None, None
  lo = (words & 255).astype(jnp.bfloat16)
  hi = lax.shift_right_logical(words, 8).astype(jnp.bfloat16)
  n_scale = len(lay.scale)
  sc = _factor(lo, hi, gather_ref, vec_ref, 0, n_scale, cs, cw)
  if lay.signed_scale:
    sc = jnp.where(sc >= 128, sc - 256, sc)
  sc = sc - lay.factor_minus
  m = _factor(lo, hi, gather_ref, vec_ref, n_scale, len(lay.mins), cs, cw) if lay.mins \
      else None
  return sc, m


def _const_term(sc, m, d_subs, dmin_subs, lay: block_layout.BlockLayout):
  """``f32[bn, cs]``: each sub-block's constant, ``-minus·sc·d - m·dmin`` (``+ dmin`` for
  Q5_1), the coefficient of ``x`` summed over the sub-block."""
  const = jnp.zeros(d_subs.shape, jnp.float32)
  if lay.minus:
    factor = 1.0 if sc is None else sc.astype(jnp.float32)
    const = const - float(lay.minus) * factor * d_subs
  if m is not None:
    const = const - m.astype(jnp.float32) * dmin_subs
  elif lay.offset_as_is:
    const = const + dmin_subs
  return const


def _lookup(v, table):
  """``f32``: ``table[v]`` for small ints ``v`` (a chain of selects; Mosaic has no gather)."""
  out = jnp.zeros(v.shape, jnp.float32)
  for i, t in enumerate(table):
    out = jnp.where(v == i, jnp.float32(t), out)
  return out


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
  acc = jnp.zeros(out_ref.shape, jnp.float32)
  for b0 in range(0, nblk, cb):
    nb = min(cb, nblk - b0)
    cw, cs = nb * w, nb * s
    words = q_ref[:, b0 * w:(b0 + nb) * w].astype(jnp.int32)
    d = d_ref[:, b0:b0 + nb]
    d_words = _hi(d, rep_ref[:nb, :cw])
    sc, m = _factors(words, gather_ref, vec_ref, lay, cs, cw)
    if sc is not None:
      sc_b = sc.astype(jnp.bfloat16)
    for p, plane in enumerate(planes(name)):
      bits = lax.shift_right_logical(words, plane.shift) & ((1 << plane.width) - 1)
      val = _lookup(bits, lay.table) if lay.table else \
          bits.astype(jnp.float32) * float(plane.weight)
      if sc is not None:
        val = val * jnp.dot(sc_b, maps_ref[p, :cs, :cw], preferred_element_type=jnp.float32)
      acc = acc + _nt(xp_ref[p, :, b0 * w:(b0 + nb) * w], val * d_words)
    if has_xs:
      d_subs = _hi(d, reps_ref[:nb, :cs])
      dmin_subs = _hi(dmin_ref[:, b0:b0 + nb], reps_ref[:nb, :cs]) if has_dmin else None
      const = _const_term(sc, m, d_subs, dmin_subs, lay)
      acc = acc + _nt(xs_ref[:, b0 * s:(b0 + nb) * s], const)
  out_ref[...] = acc


# --- the GEMV kernel: few rows of x, sums per sub-block on the MXU ------------------

GEMV_MAX_M = 8
"""The most rows of ``x`` the GEMV kernel takes (its ``x`` operand grows with them)."""
FIELD_SLICES = True
"""Whether the GEMV kernel gathers each field's words per chunk (static lane slices, one per
block) so a plane's product runs over its own words only, or runs every plane over the whole
chunk (``x`` zero on the other words)."""


@functools.cache
def field_planes(name: str) -> tuple[tuple[Plane, ...], ...]:
  """Per :class:`~hxmlir.block_layout.ValueField` of format ``name``, its bit planes over the
  field's own words (``elements[j]``: the element of the field's word ``j``)."""
  lay = block_layout.LAYOUTS[name]
  out = []
  for f in lay.fields:
    words, ps = f.nbytes // 2, []
    for parity in (0, 1):
      for t in range(8 // f.width):
        el = tuple(int(f.elements[2 * j + parity, t]) for j in range(words))
        ps.append(Plane(8 * parity + f.width * t, f.width, 1 << f.dest, el))
    out.append(tuple(ps))
  return tuple(out)


def gemv_chunk_blocks(name: str, nblk: int) -> int:
  """Blocks per chunk of the GEMV kernel: the largest divisor of ``nblk`` whose words fit
  :data:`CHUNK_WORDS` (every chunk alike, so ``x``'s operand has one shape per chunk)."""
  words = block_layout.LAYOUTS[name].nbytes // 2
  return max(c for c in range(1, nblk + 1) if nblk % c == 0 and (c == 1 or c * words <= CHUNK_WORDS))


def _columns(name: str, field: int, cb: int) -> tuple[np.ndarray, list[np.ndarray]]:
  """The words a chunk of ``cb`` blocks feeds the planes of field ``field``, and per plane the
  element (within the chunk, ``blk * B + e``; -1 none) of each of those words."""
  lay = block_layout.LAYOUTS[name]
  w, f = lay.nbytes // 2, lay.fields[field]
  if FIELD_SLICES:
    fw = f.nbytes // 2
    words = np.concatenate([b * w + f.offset // 2 + np.arange(fw) for b in range(cb)])
    per = [np.concatenate([np.where(np.asarray(p.elements) >= 0,
                                    b * lay.block + np.asarray(p.elements), -1)
                           for b in range(cb)]) for p in field_planes(name)[field]]
    return words, per
  words = np.arange(cb * w)
  per = []
  for p in field_planes(name)[field]:
    el = np.full(cb * w, -1)
    for b in range(cb):
      j = b * w + f.offset // 2 + np.arange(len(p.elements))
      el[j] = np.where(np.asarray(p.elements) >= 0, b * lay.block + np.asarray(p.elements), -1)
    per.append(el)
  return words, per


def _truncated(v):
  """``v`` (f32) with its low 16 bits cleared: exact in bf16 (bit operations, which XLA does
  not fold, unlike a round trip through bf16 under its excess-precision rule)."""
  bits = lax.bitcast_convert_type(v, jnp.uint32) & np.uint32(0xFFFF0000)
  return lax.bitcast_convert_type(bits, jnp.float32)


def _limbs(v):
  """``bf16[3, ...]``: ``v`` (f32) as three bf16 limbs whose sum is ``v`` exactly (normal f32)."""
  l0 = _truncated(v)
  r = v - l0
  l1 = _truncated(r)
  return jnp.stack([l0, l1, r - l1]).astype(jnp.bfloat16)


def _gemv_x(x3, name: str, nblk: int, cb: int) -> list:
  """Per field, ``bf16[nb, P_f, nch, cols, 3 * m * cb*S]``: ``x3: f32[nb, m, k]`` for the GEMV
  kernel. Row ``c`` of plane ``p`` in chunk ``ch`` holds, in the column of limb ``l``, row
  ``i`` and the sub-block of the element word ``c`` holds, limb ``l`` of ``x[i, e] · weight_p``
  (0 elsewhere): the product with the plane's bits sums ``x · bits`` per sub-block."""
  lay = block_layout.LAYOUTS[name]
  nb, m, k = x3.shape
  nch, s, sub = nblk // cb, lay.subs, lay.sub or lay.block
  ext = jnp.pad(x3, ((0, 0), (0, 0), (0, 1)))
  out = []
  for fi, planes_f in enumerate(field_planes(name)):
    _, per = _columns(name, fi, cb)
    el = np.stack(per)  # [P_f, cols]
    start = (np.arange(nch) * cb * lay.block)[None, :, None]
    idx = np.where(el[:, None, :] >= 0, start + el[:, None, :], k)  # [P_f, nch, cols]
    weight = np.asarray([p.weight for p in planes_f], np.float32)[:, None, None]
    xg = jnp.take(ext, jnp.asarray(idx.astype(np.int32)), axis=2) * weight  # [nb, m, P, nch, c]
    sub_of = np.where(el >= 0, (el // lay.block) * s + (el % lay.block) // sub, -1)
    hot = (jnp.asarray(sub_of.astype(np.int32))[..., None]
           == jnp.arange(cb * s, dtype=jnp.int32)).astype(jnp.bfloat16)  # [P, cols, cs]
    limbs = _limbs(xg).transpose(1, 3, 4, 5, 0, 2)  # [nb, P, nch, cols, 3, m]
    xs = limbs[..., None] * hot[None, :, None, :, None, None, :]
    out.append(xs.reshape(*xs.shape[:4], -1))
  return out


def _gemv_kernel(*refs, name: str, nblk: int, cb: int, m: int, has_xs: bool,
                 has_dmin: bool):
  """``f32[bn, m]``: ``W x[i]`` for the ``bn`` weight rows of this program.

  ``refs``: per field ``xs_f`` (:func:`_gemv_x`), (``xsum: f32[m, nblk*S]``), ``q: ui16[bn,
  L]``, ``d: f32[bn, nblk]``, (``dmin``), ``reps: bf16[cb, cb*S]``, (``gather``, ``vec``),
  ``out: f32[bn, m]``. Per chunk each plane's bits (bf16, exact) times its ``xs`` (x in
  three exact bf16 limbs, one-hot in the sub-blocks) give ``D[r, (l, i, s)]``: sums of
  ``bits · x`` per sub-block, exact products summed in f32. Then ``sum_s D·sc·d`` per row,
  ``d`` spread exactly (two bf16 limbs of an f16)."""
  lay = block_layout.LAYOUTS[name]
  refs = list(refs)
  nf = len(lay.fields)
  xs_refs = [refs.pop(0) for _ in range(nf)]
  xsum_ref = refs.pop(0) if has_xs else None
  q_ref, d_ref = refs.pop(0), refs.pop(0)
  dmin_ref = refs.pop(0) if has_dmin else None
  reps_ref = refs.pop(0)
  gather_ref, vec_ref = (refs.pop(0), refs.pop(0)) if lay.scale else (None, None)
  out_ref = refs.pop(0)
  w, s = lay.nbytes // 2, lay.subs
  cw, cs, mc = cb * w, cb * s, m * cb * s
  reps = reps_ref[...]

  def spread(v):  # f32[bn, cb] -> f32[bn, cs]: a one-hot product at HIGHEST, exact
    return _hi(v, reps)

  acc = jnp.zeros(out_ref.shape, jnp.float32)
  for ch in range(nblk // cb):
    words = q_ref[:, ch * cw:(ch + 1) * cw].astype(jnp.int32)
    dsum = jnp.zeros((words.shape[0], 3 * mc), jnp.float32)
    for fi, planes_f in enumerate(field_planes(name)):
      f = lay.fields[fi]
      if FIELD_SLICES:
        lo_w, fw = f.offset // 2, f.nbytes // 2
        cols = [words[:, b * w + lo_w:b * w + lo_w + fw] for b in range(cb)]
        src = cols[0] if cb == 1 else jnp.concatenate(cols, axis=1)
      else:
        src = words
      for pi, plane in enumerate(planes_f):
        bits = lax.shift_right_logical(src, plane.shift) & ((1 << plane.width) - 1)
        val = _lookup(bits, lay.table) if lay.table else bits.astype(jnp.float32)
        dsum = dsum + jnp.dot(val.astype(jnp.bfloat16), xs_refs[fi][pi, ch],
                              preferred_element_type=jnp.float32)
    dsub = dsum[:, :mc] + dsum[:, mc:2 * mc] + dsum[:, 2 * mc:]
    d_subs = spread(d_ref[:, ch * cb:(ch + 1) * cb])
    sc, mn = _factors(words, gather_ref, vec_ref, lay, cs, cw)
    scale = d_subs if sc is None else sc.astype(jnp.float32) * d_subs
    cols = [jnp.sum(dsub[:, i * cs:(i + 1) * cs] * scale, axis=1, keepdims=True)
            for i in range(m)]
    acc = acc + (cols[0] if m == 1 else jnp.concatenate(cols, axis=1))
    if has_xs:
      dmin_subs = spread(dmin_ref[:, ch * cb:(ch + 1) * cb]) if has_dmin else None
      const = _const_term(sc, mn, d_subs, dmin_subs, lay)
      acc = acc + _nt(const, xsum_ref[:, ch * cs:(ch + 1) * cs])
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


def matmul_q_nk_blocks_pallas(x, q, d, dmin=None, *, backend: str = "mosaic_tpu",
                              interpret: bool = False, block_n: int | None = None):
  """``x @ dequantize(W).T`` for ``W[out, in]`` in a GGUF block format, on TPU with Pallas.

  ``x: f32[*b, m, k]``; ``q: ui16[*b, n, k / B, W]``, the blocks' values at the file's
  bytes (:mod:`hxmlir.block_formats`); ``d: f16[*b, n, k / B]``, the block scales; ``dmin``:
  the block offsets for Q4_K, Q5_K, Q2_K and Q5_1, else ``None`` -> ``f32[*b, m, n]``. The
  format follows from the operands (:func:`hxmlir.formats.of_components`). Each weight word
  is read once per row block of ``x`` and decoded in VMEM. The weight is never copied. XLA
  permutes ``x``, sums it per sub-block and widens ``d``/``dmin`` to f32. See the module
  docstring for the method and its roundings: each plane's ``bits · weight · sc`` is an
  exact integer, times ``d`` rounded once, and the products are summed in f32.

  Kernel ``hx_matmul_q_nk_blocks_v1`` (:data:`BLOCKS_MOSAIC_TPU_KERNEL`). ``backend`` must
  be ``"mosaic_tpu"``; ``interpret`` runs it in Pallas' interpreter (any machine);
  ``block_n``: weight rows per program (default :data:`BLOCK_N`). Raises ``TypeError``
  naming the operand types when they are not these, and ``ValueError`` for another backend
  (Triton has no block-format kernel: the reference decomposition serves GPUs).
  """
  check_backend("matmul_q_nk_blocks_pallas", backend)
  if backend != "mosaic_tpu":
    raise ValueError("matmul_q_nk_blocks_pallas: the block formats' kernel is Mosaic (TPU) "
                     f"only, got backend {backend!r}; GPUs take the reference decomposition")
  x, q, d, dmin = (v if v is None or isinstance(v, jax.core.Tracer) else jnp.asarray(v)
                   for v in (x, q, d, dmin))
  f = _check_operands(x, q, d, dmin)
  *batch, m, k = x.shape
  n, nblk, w = q.shape[-3:]
  nb = math.prod(batch)
  bn = block_n or BLOCK_N
  bn, np_ = (n, n) if n <= bn else (bn, round_up(n, bn))
  heads = [h.reshape(nb, n, nblk).astype(jnp.float32) for h in (d, dmin) if h is not None]
  call = _call_gemv if m <= GEMV_MAX_M else _call_tiles
  y = call(f.name, x.reshape(nb, m, k), q.reshape(nb, n, nblk * w), heads, nblk, bn, np_,
           interpret)
  return y.reshape(*batch, m, n)


def _table_specs(tables: dict, keys, nidx: int):
  """The tables named ``keys`` (those present) and their whole-array block specs."""
  from jax.experimental import pallas as pl
  ops = [tables[key] for key in keys if key in tables]
  return ops, [pl.BlockSpec(t.shape, lambda *_, _r=t.ndim: (0,) * _r) for t in ops]


def _call_tiles(name: str, x3, q2, heads, nblk: int, bn: int, np_: int, interpret: bool):
  """``f32[nb, m, n]`` by :func:`_kernel` (any ``m``: tiles of ``block_m`` rows)."""
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  lay = block_layout.LAYOUTS[name]
  nb, m, k = x3.shape
  w, s = lay.nbytes // 2, lay.subs
  cb = chunk_blocks(name, nblk)
  npl = len(planes(name))
  block_m = min(round_up(max(m, 1), 8),
                max(8, XP_BYTES // (4 * npl * nblk * w) // 8 * 8))
  mp = round_up(m, block_m)
  x3 = jnp.pad(x3, ((0, 0), (0, mp - m), (0, 0)))
  has_xs = bool(lay.minus or lay.mins or lay.offset_as_is)
  sq = pl.squeezed
  row = lambda bi, i, j: (bi, j, 0)  # noqa: E731
  operands = [_permuted_x(x3, name, nblk)]
  specs = [pl.BlockSpec((sq, npl, block_m, nblk * w), lambda bi, i, j: (bi, 0, i, 0))]
  if has_xs:
    operands.append(x3.reshape(nb, mp, nblk * s, -1).sum(-1))
    specs.append(pl.BlockSpec((sq, block_m, nblk * s), lambda bi, i, j: (bi, i, 0)))
  operands += [q2, *heads]
  specs += [pl.BlockSpec((sq, bn, nblk * w), row)] + \
      [pl.BlockSpec((sq, bn, nblk), row)] * len(heads)
  ops, tspecs = _table_specs(_tables(name, cb), ("rep", "reps", "maps", "gather", "vec"), 3)
  kernel = functools.partial(_kernel, name=name, nblk=nblk, cb=cb, has_xs=has_xs,
                             has_dmin=len(heads) == 2)
  call = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((nb, mp, np_), jnp.float32),
      grid=(nb, mp // block_m, np_ // bn),
      in_specs=specs + tspecs,
      out_specs=pl.BlockSpec((sq, block_m, bn), lambda bi, i, j: (bi, i, j)),
      compiler_params=None if interpret else compiler_params("mosaic_tpu"),
      interpret=interpret,
      name=BLOCKS_MOSAIC_TPU_KERNEL.ir_name,
  )
  with jax.disable_jit(False):  # see common.call_blocked
    y = call(*operands, *ops)
  return y[:, :m, :q2.shape[1]]


def _call_gemv(name: str, x3, q2, heads, nblk: int, bn: int, np_: int, interpret: bool):
  """``f32[nb, m, n]`` by :func:`_gemv_kernel` (``m <= GEMV_MAX_M``)."""
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  from jax.experimental.pallas import tpu as pltpu
  lay = block_layout.LAYOUTS[name]
  nb, m, k = x3.shape
  s = lay.subs
  cb = gemv_chunk_blocks(name, nblk)
  has_xs = bool(lay.minus or lay.mins or lay.offset_as_is)
  sq = pl.squeezed
  row = lambda bi, j: (bi, j, 0)  # noqa: E731
  operands, specs = [], []
  for xs in _gemv_x(x3, name, nblk, cb):
    operands.append(xs)
    specs.append(pl.BlockSpec((sq, *xs.shape[1:]), lambda bi, j: (bi, 0, 0, 0, 0)))
  if has_xs:
    operands.append(x3.reshape(nb, m, nblk * s, -1).sum(-1))
    specs.append(pl.BlockSpec((sq, m, nblk * s), lambda bi, j: (bi, 0, 0)))
  operands += [q2, *heads]
  specs += [pl.BlockSpec((sq, bn, q2.shape[-1]), row)] + \
      [pl.BlockSpec((sq, bn, nblk), row)] * len(heads)
  tables = _tables(name, cb)
  ops, tspecs = _table_specs(tables, ("reps", "gather", "vec"), 2)
  kernel = functools.partial(_gemv_kernel, name=name, nblk=nblk, cb=cb, m=m, has_xs=has_xs,
                             has_dmin=len(heads) == 2)
  params = None if interpret else pltpu.CompilerParams(
      dimension_semantics=("parallel", "parallel"), vmem_limit_bytes=VMEM_LIMIT)
  call = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((nb, np_, m), jnp.float32),
      grid=(nb, np_ // bn),
      in_specs=specs + tspecs,
      out_specs=pl.BlockSpec((sq, bn, m), lambda bi, j: (bi, j, 0)),
      compiler_params=params,
      interpret=interpret,
      name=BLOCKS_GEMV_MOSAIC_TPU_KERNEL.ir_name,
  )
  with jax.disable_jit(False):  # see common.call_blocked
    y = call(*operands, *ops)
  return y[:, :q2.shape[1], :].transpose(0, 2, 1)
