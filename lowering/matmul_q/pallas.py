"""A Pallas kernel for ``hx.matmul_q`` that reads quantized weight tiles and scales directly.

``y = x @ dequantize(q, s)`` for ``x: f32[*b, m, k]`` and a weight of dense shape
``[*b, k, n]`` in any format of :mod:`hxmlir.formats`, quantized along ``n``:
``q: i8[*b, k, n]`` (int8), ``ui8[*b, k, n / 2]`` (int4, layout ``int4_pairs_v1``) or
``f8E4M3FN[*b, k, n]`` (fp8 e4m3fn), with scales ``s: f32[*b, k]`` (one per row of
the weight) or ``f32[*b, k, n / g]`` (one per group of ``g`` consecutive elements of
``n``, the free axis) -> ``f32[*b, m, n]``. One kernel body, written once, lowered by
Pallas for

- TPU: Mosaic, custom call ``tpu_custom_call`` (``kernel_name`` attribute),
- GPU: Triton, custom call ``__gpu$xla.gpu.triton`` (``name`` in its backend
  config), with the Triton compiler parameters given explicitly,
- any platform: Pallas interpret mode (``interpret=True``) runs either flavour
  (with the Triton flavour's masked loads) as plain XLA, which is how the
  kernel is tested on CPU. No GPU or TPU has been lent to this project: the
  kernel has run in interpret mode only, and the Triton and Mosaic flavours are
  checked by lowering for ``cuda`` and ``tpu`` from CPU (Mosaic's own compiler,
  which runs on a TPU host, has not seen them).

Kernel names and calling conventions (:data:`KERNEL_VERSION`, registered in
:mod:`hxmlir.targets` for ``cuda``, ``rocm`` (Triton) and ``tpu`` (Mosaic), so
``jax.export`` accepts them once ``hx.install()`` has run), operands ``(x, s, q)``:

- ``hx_matmul_q_v1``: ``x: f32[B, mp, kp]``, ``s: f32[B, 1, kp]``, ``q: i8[B, k, n]``
  -> ``f32[B, mp, np]`` (int8 values, per-row scales; ``B`` the batch dims
  collapsed, ``mp``/``kp``/``np`` ``m``/``k``/``n`` rounded up to whole blocks,
  ``x`` and ``s`` zero-padded).
- ``hx_matmul_q_v2``: the same, with ``q`` of any format (``ui8[B, k, n / 2]``,
  ``f8E4M3FN[B, k, n]``) and, per group of ``g``, ``s: f32[B, k, n / g]``, not padded
  (the format and the group follow from the operand types). The kernel emits
  ``v1`` for int8 per-row weights (exactly v1's call, so those artifacts keep
  loading in code that knows v1 only) and ``v2`` for every other format.

- ``hx_matmul_q_nk_v1`` (:func:`matmul_q_nk_pallas`): the checkpoint layout
  ``W[out, in]`` (GGUF, torch ``Linear``; ``hx.einsum("...k,nk->...n", x, w)``) with
  groups along the contraction ``k``, every format of :mod:`hxmlir.formats` (f16 scales
  widened in the kernel, offsets: each tile dequantized as ``q * s + o``); operands
  ``(x, q, s[, o])``, see that function.

The lowering rules of ``hx_matmul_q_p`` for ``cuda``, ``rocm`` and ``tpu`` use a
kernel as the ``hx.matmul_q`` composite's decomposition while hxmlir is
installed with its kernels (:func:`hxmlir.install_state.use_kernels`, part of JAX's cache
keys), for each layout a weight's format takes (``Format.pallas``, the layouts of
:data:`hxmlir.formats.WEIGHT_LAYOUTS`); otherwise they emit the default composite with
the reference decomposition.

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
result). Unverified on hardware: whether Mosaic compiles the in-register
reshapes of the int4 interleave and of the group broadcast, and the dynamic
lane slice of the group scales (all three lower from CPU).

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

from hxmlir import _jax, formats, targets
from hxmlir.install_state import use_kernels
from hxmlir.lowering import schema
from hxmlir.lowering.composite import lower_composite
from hxmlir.lowering.matmul_q import default
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

BACKENDS = ("triton", "mosaic_tpu")
_PLATFORM_BACKEND = {"cuda": "triton", "rocm": "triton", "tpu": "mosaic_tpu"}

TRITON_NUM_WARPS = 4
TRITON_NUM_STAGES = 3
"""Triton compiler parameters, passed explicitly (Pallas' defaults could change)."""


def kernel_version(fmt: formats.Format, group: int | None) -> int:
  """The kernel version a weight of format ``fmt`` with ``group`` is emitted under:
  1 for int8 per row (v1's call), else :data:`KERNEL_VERSION`."""
  return V1_VERSION if fmt is formats.INT8 and group is None else KERNEL_VERSION


def _compiler_params(backend: str):
  """The Pallas compiler parameters of ``backend`` (they also select Pallas' lowering)."""
  if backend == "triton":
    from jax.experimental.pallas import triton as pltriton
    return pltriton.CompilerParams(num_warps=TRITON_NUM_WARPS, num_stages=TRITON_NUM_STAGES)
  from jax.experimental.pallas import tpu as pltpu
  return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"))


def _round_up(v: int, mult: int) -> int:
  return -(-v // mult) * mult


def _pow2_at_least(v: int) -> int:
  p = 1
  while p < v:
    p *= 2
  return p


MOSAIC_MAX_BLOCK_N = 2048
"""The widest tile :func:`default_blocks` takes on Mosaic to hold whole groups."""


def _fits_group(block_n: int, group: int | None) -> bool:
  """Whether a ``block_n``-column tile holds whole groups of ``group`` or lies in one."""
  return group is None or block_n % group == 0 or group % block_n == 0


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
    block_m, block_n = min(64, max(16, _pow2_at_least(m))), 128
  else:
    block_m, block_n = min(128, _round_up(max(m, 1), 8)), 128 * f.pack
  if not _fits_group(block_n, group):
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
  if backend not in BACKENDS:
    raise ValueError(f"matmul_q_pallas: unknown backend {backend!r}; expected one of {BACKENDS}")
  x, q, s = (jnp.asarray(v) if not isinstance(v, jax.core.Tracer) else v for v in (x, q, s))
  f, group = _check_operands(x, q, s)
  *batch, m, k = x.shape
  n = f.dense_shape(q.shape)[-1]
  chosen = blocks or default_blocks(m, k, n, backend, f, group)
  if chosen is None:
    raise ValueError(f"matmul_q_pallas: no Triton block_n (a power of two >= 16) holds whole "
                     f"groups of {group} or lies inside one; use the reference (hx.matmul_q "
                     "without install) for this group size")
  block_m, block_n, block_k = chosen
  if backend == "triton" and any(b < 16 or b & (b - 1) for b in (block_m, block_n, block_k)):
    raise ValueError(f"matmul_q_pallas: Triton blocks must be powers of two >= 16, got "
                     f"(block_m, block_n, block_k) = {(block_m, block_n, block_k)}")
  if not _fits_group(block_n, group) or block_n % f.pack:
    raise ValueError(f"matmul_q_pallas: block_n = {block_n} must be a multiple or a divisor "
                     f"of the group size {group} (and a multiple of {f.pack} for {f.name})")
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  nb = 1
  for d in batch:
    nb *= d
  mp, kp, np_ = _round_up(m, block_m), _round_up(k, block_k), _round_up(n, block_n)
  x3 = jnp.pad(x.reshape(nb, m, k), ((0, 0), (0, mp - m), (0, kp - k)))
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
    width = groups if covered == groups else _round_up(covered, 128)
    s_spec = pl.BlockSpec((sq, kp, width), lambda b, i, j: (b, 0, 0))
  kernel = functools.partial(_kernel, k=k, n=n, block_k=block_k, masked=backend == "triton",
                             fmt=f.name, group=group)
  call = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((nb, mp, np_), jnp.float32),
      grid=(nb, mp // block_m, np_ // block_n),
      in_specs=[pl.BlockSpec((sq, block_m, kp), lambda b, i, j: (b, i, 0)),
                s_spec,
                pl.BlockSpec((sq, kp, block_n // f.pack), lambda b, i, j: (b, 0, j))],
      out_specs=pl.BlockSpec((sq, block_m, block_n), lambda b, i, j: (b, i, j)),
      compiler_params=None if interpret else _compiler_params(backend),
      interpret=interpret,
      name=TRITON_KERNELS[kernel_version(f, group)].ir_name,
  )
  # lower_composite traces references under jax.disable_jit(), which would run
  # the kernel's fori_loop as a Python loop (unrolled, with constant offsets).
  with jax.disable_jit(False):
    y = call(x3, s3, q3)
  return y[:, :m, :n].reshape(*batch, m, n)


# --- the [out, in] kernel: W[n, k], groups along the contraction ----------------

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
  if backend not in BACKENDS:
    raise ValueError(f"matmul_q_nk_pallas: unknown backend {backend!r}; expected one of "
                     f"{BACKENDS}")
  x, q, s, o = (v if v is None or isinstance(v, jax.core.Tracer) else jnp.asarray(v)
                for v in (x, q, s, o))
  f, group = _check_operands_nk(x, q, s, o)
  *batch, m, k = x.shape
  n = q.shape[-2]
  chosen = blocks or default_blocks_nk(m, k, n, backend, f, group)
  if chosen is None:
    raise ValueError(f"matmul_q_nk_pallas: no {backend} block_k holds whole groups of "
                     f"{group} or lies inside one; use the reference (hx.einsum without "
                     "install) for this group size")
  block_m, block_n, block_k = chosen
  if backend == "triton" and any(b < 16 or b & (b - 1) for b in chosen):
    raise ValueError(f"matmul_q_nk_pallas: Triton blocks must be powers of two >= 16, got "
                     f"(block_m, block_n, block_k) = {tuple(chosen)}")
  if not _fits_group(block_k, group) or block_k % f.pack:
    raise ValueError(f"matmul_q_nk_pallas: block_k = {block_k} must be a multiple or a "
                     f"divisor of the group size {group} (and a multiple of {f.pack} for "
                     f"{f.name})")
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  nb = math.prod(batch)
  mp, kp, np_ = _round_up(m, block_m), _round_up(k, block_k), _round_up(n, block_n)
  x3 = jnp.pad(x.reshape(nb, m, k), ((0, 0), (0, mp - m), (0, kp - k)))
  q3 = q.reshape(nb, n, q.shape[-1])
  sq = pl.squeezed
  if group is None:
    width, factors = 1, [c.reshape(nb, n, 1) for c in (s, o) if c is not None]
  else:
    # every group of the tile's rows; with ragged k the last chunk reaches past the last
    # group: whole chunks of groups, rounded up to 128 lanes (selected away in the kernel)
    groups, covered = k // group, max(kp // group, k // group)
    width = groups if covered == groups else _round_up(covered, 128)
    factors = [c.reshape(nb, n, groups) for c in (s, o) if c is not None]
  f_spec = pl.BlockSpec((sq, block_n, width), lambda b, i, j: (b, j, 0))
  kernel = functools.partial(_kernel_nk, k=k, n=n, block_k=block_k,
                             masked=backend == "triton", fmt=f.name, group=group)
  call = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((nb, mp, np_), jnp.float32),
      grid=(nb, mp // block_m, np_ // block_n),
      in_specs=[pl.BlockSpec((sq, block_m, kp), lambda b, i, j: (b, i, 0)),
                pl.BlockSpec((sq, block_n, kp // f.pack), lambda b, i, j: (b, j, 0)),
                *([f_spec] * len(factors))],
      out_specs=pl.BlockSpec((sq, block_m, block_n), lambda b, i, j: (b, i, j)),
      compiler_params=None if interpret else _compiler_params(backend),
      interpret=interpret,
      name=NK_TRITON_KERNEL.ir_name,
  )
  with jax.disable_jit(False):  # as in matmul_q_pallas: keep the fori_loop a loop
    y = call(x3, q3, *factors)
  return y[:, :m, :n].reshape(*batch, m, n)


# --- lowering rules of hx_matmul_q_p for cuda, rocm and tpu ---------------------

def _pallas_reference(backend: str):
  # One function object per backend, so lower_composite shares decompositions.
  return _PALLAS_REFERENCES[backend]


_PALLAS_REFERENCES = {b: functools.partial(matmul_q_pallas, backend=b)
                      for b in ("triton", "mosaic_tpu")}


def _kernel_fits(q_aval, s_aval, backend: str, layout: str = "kn") -> bool:
  """Whether the kernel of ``layout`` takes this weight on ``backend`` (a group size without a
  tile, :func:`default_blocks` / :func:`default_blocks_nk`, keeps the reference)."""
  f = formats.of_storage(q_aval.dtype)
  dense = f.dense_shape(q_aval.shape)
  group = formats.group_of_scale(dense, s_aval)
  if layout == "nk":  # W[n, k]: groups along k, the last axis
    return default_blocks_nk(1, dense[-1], dense[-2], backend, f, group) is not None
  return default_blocks(1, dense[-2], dense[-1], backend, f, group) is not None


def nk_dims(x_rank: int, q_rank: int) -> dotdims.DotDims | None:
  """The dims of the ``[out, in]`` layouts the kernel takes: ``f32[..., k] x W[n, k]``
  (``hx.einsum("...k,nk->...n")``, any rank of ``x``) and ``f32[*b, m, k] x W[*b, n, k]``
  (equal ranks >= 3), or ``None`` for other ranks."""
  if q_rank == 2 and x_rank >= 1:
    return ((x_rank - 1,), (1,)), ((), ())
  if x_rank == q_rank >= 3:
    batch = tuple(range(x_rank - 2))
    return ((x_rank - 1,), (q_rank - 1,)), (batch, batch)
  return None


def _pallas_kernel(ctx, dims, backend: str):
  """The kernel (a function of the operands ``x, q, s[, o]``) that computes this equation on
  ``backend``, run per shard in a program over several devices, or ``None`` (the reference):
  the layout (``"kn"``, ``"nk"``, :data:`hxmlir.formats.WEIGHT_LAYOUTS`) must be one the
  weight's format takes (``Format.pallas``) with a tile for its group size."""
  x_aval, q_aval, s_aval, *_ = ctx.avals_in
  xr, qr = x_aval.ndim, q_aval.ndim
  if xr == qr and dims == dotdims.v1_dims(xr):
    layout, kernel = "kn", _pallas_reference(backend)
  elif qr == 2 and dims == dotdims.matmul_dims(xr, 2):
    layout, kernel = "kn", _PALLAS_COLLAPSED[backend]  # f32[..., k] x Q[k, n]: rows into m
  elif dims == nk_dims(xr, qr):
    layout, kernel = "nk", _PALLAS_NK[(backend, qr == 2)]
  else:
    return None
  if layout not in default.weight_format(ctx).pallas or \
     not _kernel_fits(q_aval, s_aval, backend, layout):
    return None
  if _jax.kernel_is_partitioned(ctx.module_context):
    return _kernel_per_shard(kernel, layout, *ctx.avals_in)
  return kernel


def lower_matmul_q_accelerator(ctx, x, q, s, *o, platform: str, dimension_numbers=None):
  """``hx_matmul_q_p`` on ``cuda``/``rocm``/``tpu``: the Pallas kernels as decomposition.

  While hxmlir is installed with its kernels the ``hx.matmul_q`` composite's decomposition calls a
  registered kernel where the weight's format takes its layout (``Format.pallas``):
  :func:`matmul_q_pallas` for version 1's layout ``f32[*b, m, k] x Q[*b, k, n]`` and
  ``f32[..., k] x Q[k, n]`` (``x``'s leading dims collapsed into ``m``), every format
  with f32 scales and no offset; :func:`matmul_q_nk_pallas` for the checkpoint layout
  ``f32[..., k] x W[n, k]`` (``hx.einsum("...k,nk->...n")``, groups along the
  contraction) and ``f32[*b, m, k] x W[*b, n, k]``, every format (f16 scales, offsets).
  Other dimension numbers, formats and group sizes no tile fits (:func:`default_blocks`,
  :func:`default_blocks_nk`), and every equation while hxmlir's kernels are not installed
  (:func:`hxmlir.install_state.use_kernels`), keep the
  reference decomposition (what the default rule emits).
  """
  dims = dimension_numbers or dotdims.v1_dims(ctx.avals_in[0].ndim)
  kernel = _pallas_kernel(ctx, dims, _PLATFORM_BACKEND[platform]) if use_kernels() else None
  if kernel is None:
    return default.lower_matmul_q(ctx, x, q, s, *o, dimension_numbers=dimension_numbers)
  return lower_composite(ctx, "hx.matmul_q", x, q, s, *o, reference=kernel,
                         attributes=default.matmul_q_attributes(ctx, dims))


def _explicit_specs(*avals) -> tuple | None:
  """The mesh and each aval's partition spec (one entry per axis) when every aval has a
  sharding on one mesh whose axes are all explicit, else ``None``."""
  meshes = {getattr(getattr(a, "sharding", None), "mesh", None) for a in avals}
  if len(meshes) != 1:
    return None
  mesh = meshes.pop()
  if mesh is None or mesh.empty or not mesh.are_all_axes_explicit:
    return None
  return mesh, tuple(tuple(a.sharding.spec) + (None,) * (a.ndim - len(a.sharding.spec))
                     for a in avals)


def _mesh_axes(entry) -> tuple:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _kernel_per_shard(kernel, layout: str, x_aval, q_aval, s_aval, *o_aval):
  """``kernel(x, q, s[, o])`` run on each device's shards (``jax.shard_map``), or ``None``.

  For a program over several devices, where Mosaic refuses to be partitioned and XLA
  would replicate a Triton call's operands. The shards are the operands' own: explicit
  shardings (``ctx.avals_in``) on one mesh, the contraction axis ``k`` unsharded (as
  ``hx-verify`` requires), the batch axes of ``x`` and ``q`` sharded alike; each
  device computes its block of the result, rows like ``x`` and columns like the weight's
  free axis (``n``: ``q``'s last axis in layout ``"kn"``, its second last in ``"nk"``;
  scales and offsets sharded with it). ``None`` where the shardings are not known at
  lowering time (mesh axes of type Auto: XLA's propagation picks them later) or do not
  make independent blocks: the caller then keeps the reference decomposition, which XLA
  partitions like any dense dot.
  """
  found = _explicit_specs(x_aval, q_aval, s_aval, *o_aval)
  if found is None:
    return None
  mesh, (xs, qs, ss, *os_) = found
  per_group = s_aval.ndim == q_aval.ndim
  if layout == "kn":
    k_entries, col = (xs[-1], qs[-2], ss[-2] if per_group else ss[-1]), qs[-1]
  else:  # W[.., n, k], scales [.., n(, k / g)]
    k_entries, col = (xs[-1], qs[-1], *(ss[-1:] if per_group else ())), qs[-2]
  if any(e is not None for e in k_entries):
    return None                      # a sharded contraction: partial sums, not blocks
  if q_aval.ndim == x_aval.ndim and xs[:-2] != qs[:-2]:
    return None                      # batch axes sharded differently
  ys = (*xs[:-1], col)
  used = [a for e in ys for a in _mesh_axes(e)]
  if len(used) != len(set(used)):
    return None                      # one mesh axis on both rows and columns
  return _shard_mapped(kernel, mesh, (xs, qs, ss, *os_), ys)


@functools.lru_cache(maxsize=256)
def _shard_mapped(kernel, mesh, in_specs, ys):
  # one function object per (kernel, mesh, specs): lower_composite shares a
  # decomposition between equal keys, and the key holds this object
  from jax.sharding import PartitionSpec as P

  # the decomposition is traced on unsharded avals (lower_composite): on the mesh's
  # Auto twin shard_map takes them as they come, and lowers to the same manual axes
  auto = mesh.update_axis_types({a: jax.sharding.AxisType.Auto for a in mesh.axis_names})

  def per_shard(*operands):
    return jax.shard_map(kernel, mesh=auto, in_specs=tuple(P(*e) for e in in_specs),
                         out_specs=P(*ys), check_vma=False)(*operands)
  return per_shard


def _collapsed(x, q, s, *, backend: str):
  dense_n = formats.of_storage(q.dtype).dense_shape(q.shape)[-1]
  y = matmul_q_pallas(x.reshape(-1, x.shape[-1]), q, s, backend=backend)
  return y.reshape(*x.shape[:-1], dense_n)


_PALLAS_COLLAPSED = {b: functools.partial(_collapsed, backend=b) for b in ("triton", "mosaic_tpu")}


def _nk_collapsed(x, q, s, *o, backend: str):
  """``f32[..., k] x W[n, k] -> f32[..., n]``: ``x``'s leading dims collapsed into ``m``."""
  y = matmul_q_nk_pallas(x.reshape(-1, x.shape[-1]), q, s, *o, backend=backend)
  return y.reshape(*x.shape[:-1], q.shape[-2])


_PALLAS_NK = {**{(b, True): functools.partial(_nk_collapsed, backend=b) for b in BACKENDS},
              **{(b, False): functools.partial(matmul_q_nk_pallas, backend=b) for b in BACKENDS}}
"""The ``[out, in]`` kernel per ``(backend, weight of rank 2)``, one object each (shared
decompositions)."""
