"""The Pallas kernel of ``hx.matmul_q`` for ``f32[*b, m, k] x Q[*b, k, n]`` (the weight
quantized along ``n``, the free axis): kernels ``hx_matmul_q_v1`` and ``hx_matmul_q_v2``.

The kernel. Grid ``(batch, cdiv(m, block_m), cdiv(n, block_n))``, all
parallel. Each program holds one ``block_m x block_n`` output tile in
registers (GPU) or vector memory (TPU) and walks the contraction axis in
chunks of ``block_k``: it loads a ``block_k x block_n / pack`` tile of stored
values, turns it into f32 (int4: each byte's two nibbles sign-extended with
shifts and interleaved, element ``2j`` from byte ``j``'s low nibble; fp8 and int8:
a conversion), multiplies it with the ``x`` chunk and accumulates (f32 dot at
``Precision.HIGHEST``). Per-row scales multiply the ``x`` chunk (``x * s``,
``block_m x block_k``, cheaper than scaling the weight tile); group scales
multiply the converted weight tile, ``f32[block_k, block_n / g]`` of them (each
broadcast over its ``g`` columns; ``block_n`` is a multiple of ``g``) or, when a
group is wider than the tile (``g`` a multiple of ``block_n``), one column
``f32[block_k, 1]``, sliced from the program's block of scales: all ``n / g`` groups
of the weight's rows (a Mosaic block's last dim must be the array's or a multiple
of 128 lanes; fetched once per batch element, ``k * n / g * 4`` bytes of VMEM). The dequantized weight exists only one tile at a time.
Weight bytes are read once per row block of ``x``: at decode shapes
(``m <= block_m``) exactly once, so the kernel is meant to be bound by the
weight's bandwidth (int4: half of int8's bytes). Not yet measured on a GPU or
TPU (``benchmarks/matmul_q_gpu.py`` does that, per format): the exact-f32 dot
runs on CUDA cores rather than tensor cores, Triton's ``tl.dot`` pads decode
rows to 16, and ``n / block_n`` programs may leave SMs idle at ``m = 1`` (a split
over ``k`` would need a new kernel version, since it changes the custom call's
result). On a TPU v5e (0.8.5) Mosaic compiled int8 and fp8 per row and refused
the int4 interleave (a reshape to ``[.., 1]``: "unsupported shape cast") and the
lane slice of the group scales at a traced offset (E2003); the lowering rules
take the kernel on TPU only where it compiles (:func:`.common.mosaic_compiles`).

Ragged shapes. ``x`` and per-row ``s`` (small: ``m * k`` and ``k`` elements) are
zero-padded to whole blocks (``m`` to ``block_m``, ``k`` to ``block_k``) and the
result is padded to whole ``block_n`` columns and sliced back; the weight and
group scales (``k * n / g`` elements, a quarter of an int4 weight's bytes at
``g = 32``) are never copied. Weight and scale tiles past the arrays' ends are
masked on GPU (Triton loads with ``mask``/``other=0``). On TPU the Mosaic pipeline
copies the valid part of an edge block and the rest of the tile is stale data:
stale int8 or int4 values are finite and meet the zero padding of ``x * s``, so
they add exact zeros; stale fp8 values or group scales may be NaN, so for those
the kernel zeroes the converted tile's rows ``>= k`` with a select (columns
``>= n`` land in the result's padding, sliced away). Pallas' interpret mode
fills the stale part with NaN (floats) or the integer minimum, so the tests
check exactly this.

Why over value and scale refs, not a ``q8`` ref (which ``pl.pallas_call``
accepts, see :mod:`hxmlir.pallas`): the kernel pads per-row scales (never the
weight) so stale rows of an edge weight tile meet zeros, masks its Triton
loads on the stored component, and its operands ``(x, s, q)`` are the calling
convention of the registered kernels and of their back-compat artifacts. A
``q8`` of padded scales and unpadded values is not a type, and a ``q8`` operand
would change the custom call (a new kernel version).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from hxmlir import formats, targets
from hxmlir.lowering import schema
from hxmlir.lowering.matmul_q.pallas.common import (
  MOSAIC_MAX_BLOCK_N,
  call_blocked,
  check_backend,
  check_blocks,
  empty_product,
  fits_group,
  grid_of,
  linear_in_x,
  padded_x,
  pow2_at_least,
  round_up,
)
from hxmlir.types import dotdims

KERNEL_NAME = "hx_matmul_q"
KERNEL_VERSION = 2
"""The newest calling convention (see the module docstring); bump when the kernel's
semantics or calling convention change (and add back-compat cases)."""
V1_VERSION = 1
"""int8 values with per-row scales: emitted under version 1's name, v1's exact call."""

TRITON_KERNELS = {v: targets.register_kernel(targets.TRITON, KERNEL_NAME, v, ("cuda", "rocm"),
                                             owner="hxmlir")
                  for v in (V1_VERSION, KERNEL_VERSION)}
MOSAIC_TPU_KERNELS = {v: targets.register_kernel(targets.MOSAIC_TPU, KERNEL_NAME, v, ("tpu",),
                                                 owner="hxmlir")
                      for v in (V1_VERSION, KERNEL_VERSION)}
TRITON_KERNEL, MOSAIC_TPU_KERNEL = TRITON_KERNELS[V1_VERSION], MOSAIC_TPU_KERNELS[V1_VERSION]
"""Version 1's records (int8 per row)."""
assert all(TRITON_KERNELS[v].ir_name == MOSAIC_TPU_KERNELS[v].ir_name == f"{KERNEL_NAME}_v{v}"
           for v in TRITON_KERNELS)



def kernel_version(fmt: formats.Format, group: int | None) -> int:
  """The kernel version a weight of format ``fmt`` with ``group`` is emitted under:
  1 for int8 per row (v1's call), else :data:`KERNEL_VERSION`."""
  return V1_VERSION if fmt is formats.INT8 and group is None else KERNEL_VERSION


def default_blocks(m: int, k: int, n: int, backend: str, fmt=formats.INT8,
                   group: int | None = None) -> tuple[int, int, int] | None:
  """``(block_m, block_n, block_k)`` for ``x: f32[m, k]`` and a weight of dense shape
  ``[k, n]`` in format ``fmt`` (a :class:`hxmlir.formats.Format` or its name) with
  ``group`` elements per scale (``None``: per row) on ``backend``.

  Decode shapes (small ``m``) take one row block so the weight is read once;
  ``block_n = 128`` columns (TPU lane width; on GPU 128 int8 columns are one
  128-byte line per row; int4 on TPU: 256, so a tile's stored bytes fill 128
  lanes) and ``block_k = 128`` (TPU: int8 sublane tiles of 32 rows divide it).
  Triton needs powers of two and at least 16 rows for ``tl.dot``; Mosaic needs
  ``block_m`` a multiple of 8. Group scales need a tile of whole groups or one
  inside a group (``block_n % g == 0`` or ``g % block_n == 0``): the default
  ``block_n`` when it fits; else on Triton the largest power of two dividing
  ``g`` (at most 128), on Mosaic the least common multiple of ``g`` and the
  default (stored tiles of whole 128-lane rows). Returns ``None`` when no tile
  fits ``g``: on Triton when its largest power-of-two divisor is below 16
  (``g = 24`` or ``g = 6``), on Mosaic when the multiple exceeds
  :data:`MOSAIC_MAX_BLOCK_N`.
  """
  f = formats.lookup(fmt)
  if backend == "triton":
    block_m, block_n = min(64, max(16, pow2_at_least(m))), 128
  else:
    block_m, block_n = min(128, round_up(max(m, 1), 8)), 128 * f.pack
  if not fits_group(block_n, group):
    if backend == "triton":
      block_n = min(128, group & -group)  # the largest power of two dividing g
      if block_n < 16:
        return None
    else:  # whole groups in a tile of whole 128-lane rows of stored values
      block_n = math.lcm(block_n, group)
      if block_n > MOSAIC_MAX_BLOCK_N:
        return None
  return block_m, block_n, 128


def _dense_tile(qt, f: formats.Format):
  """A tile of stored values ``qt`` (``f``'s storage dtype) as ``f32`` of the dense shape
  (int4: :func:`hxmlir.formats.unpack_int4`, layout ``int4_pairs_v1``)."""
  if f.pack == 2:
    qt = formats.unpack_int4(qt)
  return qt.astype(jnp.float32)


def _scale_tile(w, st, group: int):
  """Weight tile ``w: f32[bk, bn]`` times its group scales ``st``: ``f32[bk, bn / g]`` (whole
  groups in the tile) or ``f32[bk, 1]`` (the tile inside one group)."""
  bk, bn = w.shape
  if st.shape[-1] == 1:
    return w * st
  return (w.reshape(bk, st.shape[-1], group) * st[:, :, None]).reshape(bk, bn)


def _kernel(x_ref, s_ref, q_ref, o_ref, *, k: int, n: int, block_k: int, masked: bool,
            fmt: str, group: int | None):
  """One ``block_m x block_n`` output tile: ``o = x @ dequantize(q, s)`` over chunks of ``block_k``.

  ``x_ref: f32[block_m, kp]`` (``kp`` = ``k`` rounded up to ``block_k``, zero-padded),
  ``q_ref``: stored values ``[kp, block_n / pack]`` (rows ``>= k`` and dense columns
  ``>= n`` lie past the array: masked when ``masked``), ``s_ref``: per row
  ``f32[1, kp]`` (zero-padded), per group ``f32[kp, block_n / g]`` or ``f32[kp, 1]`` (past
  the array like ``q``), ``o_ref: f32[block_m, block_n]``.
  """
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as pltriton
  f = formats.FORMATS[fmt]
  block_m, kp = x_ref.shape
  block_n = o_ref.shape[-1]
  j = pl.program_id(2)
  # on Mosaic (no masked loads) stale rows of an edge tile may be NaN: fp8 values,
  # group scales; they are selected away
  select_rows = not masked and (group is not None or not f.integer)

  def masked_load(ref, k0, c0, width: int, col0, ncols: int, other=0):
    # ref[k0:k0+block_k, c0:c0+width], reading rows >= k and columns whose index
    # (col0 + c) is >= ncols as `other`; returns the mask too
    shape = (block_k, width)
    rows = k0 + lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = col0 + lax.broadcasted_iota(jnp.int32, shape, 1)
    mask = (rows < k) & (cols < ncols)
    return pltriton.load(ref.at[pl.ds(k0, block_k), pl.ds(c0, width)], mask=mask,
                         other=other), mask

  def step(t, acc):
    k0 = pl.multiple_of(t * block_k, block_k)
    ks = pl.ds(k0, block_k)
    xs = x_ref[:, ks]
    if group is None:
      xs = xs * s_ref[:, ks]
    mask = None
    if masked:  # Triton has no fp8 `other`: masked fp8 lanes are selected away below
      bs = q_ref.shape[-1]
      qt, mask = masked_load(q_ref, k0, 0, bs, j * bs, n // f.pack,
                             other=0 if f.integer else None)
    else:
      qt = q_ref[ks, :]
    w = _dense_tile(qt, f)
    if masked and not f.integer:
      w = jnp.where(mask, w, 0.0)
    if group is not None:  # this tile's scales: groups c0 .. c0 + tpg of the row block
      # lax.div: jnp's // on a traced int lowers through `sign`, which Mosaic lowers per chip
      c0, tpg = lax.div(j * block_n, group), max(block_n // group, 1)
      if masked:  # groups past n read as 0, like their columns
        st, _ = masked_load(s_ref, k0, c0, tpg, c0, n // group)
      else:
        st = s_ref[ks, pl.ds(c0, tpg)]
      w = _scale_tile(w, st, group)
    if select_rows:
      rows = k0 + lax.broadcasted_iota(jnp.int32, (block_k, block_n), 0)
      w = jnp.where(rows < k, w, 0.0)
    return acc + jnp.dot(xs, w, precision=lax.Precision.HIGHEST,
                         preferred_element_type=jnp.float32)

  acc = lax.fori_loop(0, kp // block_k, step, jnp.zeros((block_m, block_n), jnp.float32))
  o_ref[...] = acc



def _check_operands(x, q, s):
  """``(format, group)`` of ``hx.matmul_q``'s operands ``f32[*b, m, k]``, values of dense
  shape ``[*b, k, n]``, scales per row or group; ``TypeError`` naming them otherwise."""
  ops = [schema.TensorType.of(v) for v in (x, q, s)]
  got = schema.quantized_format(ops[1], ops[2])
  errs = [got] if isinstance(got, str) else []
  if not errs:
    attrs = schema.matmul_q_attributes(dotdims.v1_dims(len(ops[0].shape)),
                                       schema.format_attributes(got[0], got[1]))
    errs = schema.SCHEMAS["hx.matmul_q"].check_operands(ops, attrs)
  if errs or not 2 <= len(ops[0].shape) == len(ops[1].shape):
    types = ", ".join(map(str, ops))
    takes = formats.components_text("*b, k", where=lambda f: "kn" in f.pallas)
    raise TypeError(f"matmul_q_pallas expects f32[*b, m, k] and a weight of dense shape "
                    f"[*b, k, n] ({takes}), got {types}")
  return got[0], got[1]


@linear_in_x("matmul_q_pallas", "kn")
def matmul_q_pallas(x, q, s, *, backend: str, interpret: bool = False,
                    blocks: Sequence[int] | None = None):
  """``x @ dequantize(q, s)`` with the Pallas kernel, for every format.

  ``x: f32[*b, m, k]``; ``q``: stored values of dense shape ``[*b, k, n]``
  (``i8[*b, k, n]``, ``ui8[*b, k, n / 2]`` int4 pairs, ``f8E4M3FN[*b, k, n]``;
  :mod:`hxmlir.formats`); ``s: f32[*b, k]`` (per row) or ``f32[*b, k, n / g]`` (per
  group of ``g``) -> ``f32[*b, m, n]`` (JAX arrays or tracers). ``backend``:
  ``"triton"`` (GPU: masked loads, Triton compiler parameters) or
  ``"mosaic_tpu"`` (TPU). ``interpret``: run that flavour in Pallas interpret
  mode (any platform). ``blocks``: ``(block_m, block_n, block_k)``, default
  :func:`default_blocks`. The emitted custom call is named ``hx_matmul_q_v1``
  for int8 per-row weights and ``hx_matmul_q_v2`` otherwise. Raises
  ``TypeError`` naming the operand types when they are not those of
  ``hx.matmul_q``, and ``ValueError`` for an unknown backend, blocks Triton
  cannot take (not powers of two, or under 16), or a ``block_n`` that neither
  holds whole groups nor lies inside one (nor an odd one for int4).
  """
  check_backend("matmul_q_pallas", backend)
  x, q, s = (jnp.asarray(v) if not isinstance(v, jax.core.Tracer) else v for v in (x, q, s))
  f, group = _check_operands(x, q, s)
  *batch, m, k = x.shape
  n = f.dense_shape(q.shape)[-1]
  chosen = blocks or default_blocks(m, k, n, backend, f, group)
  if chosen is None:
    raise ValueError(f"matmul_q_pallas: no Triton block_n (a power of two >= 16) holds whole "
                     f"groups of {group} or lies inside one; use the reference (hx.matmul_q "
                     "without install) for this group size")
  check_blocks("matmul_q_pallas", backend, chosen, "n", f, group)
  if (empty := empty_product(x, n)) is not None:
    return empty
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  g = grid_of(x, n, chosen)
  nb, kp, np_, block_n = g.nb, g.kp, g.np_, g.block_n
  x3 = padded_x(x, g)
  q3 = q.reshape(nb, k, q.shape[-1])
  sq = pl.squeezed
  if group is None:
    s3 = jnp.pad(s.reshape(nb, 1, k), ((0, 0), (0, 0), (0, kp - k)))
    s_spec = pl.BlockSpec((sq, 1, kp), lambda b, i, j: (b, 0, 0))
  else:
    # the whole row block of scales (a Mosaic block's last dim must be the array's or a
    # multiple of 128 lanes); the kernel slices each tile's groups. With ragged n the
    # last tile reaches past the last group: the block then has whole tiles of groups,
    # rounded up to 128 (the groups past n scale columns past n, sliced away).
    groups, covered = n // group, max(np_ // group, n // group)
    s3 = s.reshape(nb, k, groups)
    width = groups if covered == groups else round_up(covered, 128)
    s_spec = pl.BlockSpec((sq, kp, width), lambda b, i, j: (b, 0, 0))
  kernel = functools.partial(_kernel, k=k, n=n, block_k=g.block_k, masked=backend == "triton",
                             fmt=f.name, group=group)
  q_spec = pl.BlockSpec((sq, kp, block_n // f.pack), lambda b, i, j: (b, 0, j))
  return call_blocked(kernel, g, x3, (s3, q3), (s_spec, q_spec), backend=backend,
                      interpret=interpret, name=TRITON_KERNELS[kernel_version(f, group)].ir_name)
