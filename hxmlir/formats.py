"""Quantization formats: the one place that says what each format is and how it is stored.

A quantized array ``Q[*lead, n]`` is quantized along its last axis ``n``. Its
*format* is a value dtype and a scale granularity:

=================  ======  =============  ==========================  ===========  =====================
format (``dtype``)  prints  values          stored as (lo component)    bytes/value  range, scale
=================  ======  =============  ==========================  ===========  =====================
``int8``           ``q8``  int8           ``i8[*lead, n]``            1            [-127, 127], amax/127
``int4``           ``q4``  int4           ``ui8[*lead, n // 2]``      0.5          [-7, 7], amax/7
``float8_e4m3fn``  ``f8``  float8 e4m3fn  ``f8E4M3FN[*lead, n]``      1            [-448, 448], amax/448
=================  ======  =============  ==========================  ===========  =====================

Scales are ``f32``: one per row (``group_size=None``; scale ``f32[*lead]``) or one
per ``g`` consecutive elements of the last axis (``group_size=g``, ``n % g == 0``;
scale ``f32[*lead, n // g]``, printed ``q4[64,128:g32]``). The value is
``values * scale`` broadcast per row or per group. A per-row scale is one group of ``n``
for the helpers below, so callers need no branch on ``group_size=None``:
:func:`group_size` (``n`` per row), :func:`scale_shape`, :func:`scale_parts` (the
scale's per-axis entries: its sharding drops the last axis per row, shards the group axis
like the last per group), :func:`split_groups`/:func:`merge_groups`, :func:`as_groups`
(a per-row scale viewed ``[*lead, 1]``), :func:`apply_scale`, :func:`sum_per_scale`;
:func:`group_attribute` is the composites' ``group_size`` (``0`` per row). The types and
the IR keep the per-row scale ``f32[*lead]``.

Ranges: int8 and int4 are symmetric (``-2**(b-1)`` is never produced, as in
LLM.int8(), Dettmers et al. 2022, and GPTQ/AWQ's symmetric mode); float8 e4m3fn's
largest finite value is 448 (Micikevicius et al., "FP8 Formats for Deep
Learning", 2022; ``ml_dtypes.finfo(float8_e4m3fn).max``), so ``scale = amax / 448``
and values are cast with round-to-nearest-even (StableHLO ``convert``), after
clipping to [-448, 448] (e4m3fn has no infinity: an overflow would be NaN).

Layout (``LAYOUTS``; a versioned part of the IR contract: the composites'
``layout`` attribute names it):

- ``"plain"``: one stored element per value, row-major like the dense array.
- ``"int4_pairs_v1"`` (int4): XLA CPU stores ``s4`` arrays one byte per value
  (``jnp.zeros((4096, 4096), jnp.int4)`` is 16 MiB on device), so hxmlir packs two
  values per ``uint8`` itself: dense elements ``2j`` and ``2j + 1`` of a row are
  byte ``j``'s low nibble (bits 0-3) and high nibble (bits 4-7), each a 4-bit
  two's-complement integer (the order of pytorch/ao's ``uint8`` int4 packing and of
  XLA's own ``s4`` packing). ``n`` must be even; groups (``g``) must be even too,
  so a packed byte never straddles a group or a shard.

Formats with f16 scales and formats with an offset (hxmlir 0.4's composites' version 4:
GGUF's legacy blocks, GPTQ/AWQ zero points). A format also says its scale dtype (``scale_dtype``: ``f32``, or
``f16`` for GGUF's legacy blocks, whose bytes then stay the file's; decodes widen them
to f32 on the fly) and whether it has an *offset* per row or group
(``x = values * scale + offset``, the offset of the scale's dtype and shape):

====================  =========================  =====================  =====  ======  ============
format (``dtype``)    prints                     values (range)         scale  offset  GGUF
====================  =========================  =====================  =====  ======  ============
``int8_f16``          ``q8[..., n:g32,f16]``     int8 [-128, 127]       f16    no      Q8_0, Q5_0
``int4_f16``          ``q4[..., n:g32,f16]``     int4 [-8, 7]           f16    no      Q4_0
``uint4``             ``u4o[..., n:g32]``        uint4 [0, 15]          f32    f32     Q4_K
``uint4_f16``         ``u4o[..., n:g32,f16]``    uint4 [0, 15]          f16    f16     Q4_1
``int8_offset``       ``q8o[..., n:g32]``        int8 [-128, 127]       f32    f32     Q5_K
``int8_offset_f16``   ``q8o[..., n:g32,f16]``    int8 [-128, 127]       f16    f16     Q5_1
====================  =========================  =====================  =====  ======  ============

The printed name is the value prefix (``u4o``: unsigned 4-bit values with an offset)
and, when the scales are not f32, their dtype after the group (``,f16``). ``uint4``
values are stored like int4 pairs but unsigned (layout ``"uint4_pairs_v1"``: element
``2j`` in the low nibble of byte ``j``, ``2j + 1`` in the high one, each in [0, 15]).
5-bit values (GGUF's Q5_0, ``q - 16`` in [-16, 15]; Q5_1's and Q5_K's ``q`` in [0, 31]
with an offset) are int8 values: one per byte (``q8o``: int8 values with an offset).
``value_range`` is what the storage holds (a loaded Q4_0 keeps -8); ``qmax`` is
what :func:`hxmlir.quantize` produces. ``hx.quantize`` makes f32-scale formats only:
the symmetric ones with ``method="absmax"``/``"mse"``, ``uint4`` with ``method="minmax"``
(asymmetric, per row or group: ``scale = (max - min) / 15``, ``offset = min``).
Formats with f16 scales come from checkpoints (:mod:`hxmlir.gguf`,
:func:`hxmlir.make_qarray`).

A format's components identify it (:func:`of_components`: the values' storage dtype,
the scale dtype, an offset or not), so every layer reads the format off the lo types.
``native_cpu`` and ``pallas`` name the weight layouts (:data:`WEIGHT_LAYOUTS`) in
which the native CPU kernel and the Pallas kernels take the format; where they do not,
the platform's rule emits the StableHLO decomposition (the formats with f16 scales or offsets have
kernels in the checkpoints' ``"nk"`` layout only: ``hx_matmul_q_cpu_v3`` on CPU,
``hx_matmul_q_nk_v1`` in Pallas).

Block formats (GGUF's block types at the file's bytes; :data:`BLOCK_FORMATS`). Each holds
one GGUF type exactly: a tensor ``[*lead, n]`` is ``n // B`` blocks of ``B`` elements along
its last axis, and a block is llama.cpp's ``block_*`` struct (``ggml-common.h``) split into
three components: the block's f16 ``d`` (the **scale**, ``f16[*lead, n // B]``: one group
per block, the type's group size is ``B``), its f16 ``dmin`` (the **offset**, like the scale,
where the format has one: Q4_K, Q5_K, Q2_K; Q5_1's ``m``) and the block's other bytes, in
the file's order (the **values**, ``ui16[*lead, n // B, W]``: the bytes as little-endian
16-bit words, byte ``2i`` the low byte of word ``i``; ``W`` words per block). The values
hold the sub-block factors (the second level of the scales: 6-bit for Q4_K, Q5_K, Q3_K,
IQ4_XS, int8 for Q6_K, 4-bit for Q2_K) and the quantized values packed at their bit width
in the file's bit planes (4 + 1 bits for 5-bit values, 4 + 2 for 6-bit, 2 + 1 for 3-bit, 2
for 2-bit; IQ4's 4-bit indices into the fixed table :data:`hxmlir.block_decode.IQ4_VALUES`).
No byte is added: device bytes equal the file's. The dense value is
``x = d · sc · q − dmin · m`` (K-quants with mins), ``d · sc · q`` (Q6_K, Q3_K), ``d · sc ·
T[i]`` (IQ4_XS), ``d · q (+ m)`` (Q5_0, Q5_1), ``d · T[i]`` (IQ4_NL), as llama.cpp's
``dequantize_row_*`` (``ggml-quants.c``) computes it; :mod:`hxmlir.block_decode` decodes
them (bit for bit ``gguf.quants.dequantize``'s result).

=============  ===========  =====  ===  ==============  ==============  =================================
format         GGUF         B      W    bytes / block   bits / value    fields of the values (bytes)
=============  ===========  =====  ===  ==============  ==============  =================================
``q5_0``       Q5_0         32     10   22              5.5             qh 4, qs 16; ``q - 16``
``q5_1``       Q5_1         32     10   24 (offset m)   6               qh 4, qs 16; ``d·q + m``
``iq4_nl``     IQ4_NL       32     8    18              4.5             qs 16: table indices
``q4_k``       Q4_K         256    70   144 (dmin)      4.5             scales 12, qs 128
``q5_k``       Q5_K         256    86   176 (dmin)      5.5             scales 12, qh 32, qs 128
``q6_k``       Q6_K         256    104  210             6.5625          ql 128, qh 64, scales 16 (int8)
``q2_k``       Q2_K         256    40   84 (dmin)       2.625           scales 16 (4+4 bit), qs 64
``q3_k``       Q3_K         256    54   110             3.4375          hmask 32, qs 64, scales 12
``iq4_xs``     IQ4_XS       256    67   136             4.25            scales_h 2, scales_l 4, qs 128
=============  ===========  =====  ===  ==============  ==============  =================================

Each :class:`Format`'s ``fields`` spells its values' fields (name, bytes, meaning: which
bits of which byte hold which element). Their types print ``q4_k[576,1536:g256,f16]`` (the
format's name, the block as the group size, the f16 scales). A block format is identified
by its components like every format (:func:`of_components`): ``ui16`` values, which no
other format has, and their words per block ``W`` (with the offset, Q5_0 and Q5_1 differ
by it). A sharding of the last axis must keep whole blocks (:func:`split_problem`).
``hx.quantize`` does not make them (:func:`check_method`). Kernels: the native CPU kernel
``hx_matmul_q_cpu_v4`` in the checkpoints' ``"nk"`` layout (``native_cpu = ("nk",)``,
``docs/kernels.md``); no Pallas kernel yet (``pallas = ()``): other platforms and layouts
emit the StableHLO decomposition.

The packing helpers here are plain JAX code (they run traced, in decompositions and
in the types' rules); quantization itself is :mod:`hxmlir.lowering.reference`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from jax import lax

from hxmlir import block_decode

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)


WEIGHT_LAYOUTS = {
    "kn": "W[in, out] = Q[*b, k, n], quantized along the free axis n: x @ w, "
          "CPU kernels hx_matmul_q_cpu_v1/v2, Pallas kernels hx_matmul_q_v1/v2",
    "nk": "W[out, in] = Q[*b, n, k], groups along the contraction k: "
          "hx.einsum('...k,nk->...n', x, w), CPU kernel hx_matmul_q_cpu_v3, Pallas kernel hx_matmul_q_nk_v1",
}
"""The weight layouts of the ``hx.matmul_q`` kernels (``Format.native_cpu`` and ``Format.pallas``
name them)."""


@dataclass(frozen=True)
class Format:
  """One value format: ``name`` (``hx.quantize``'s ``dtype``: ``"int4"``), ``prefix``
  (the type's printed name: ``q4``), ``value_dtype`` (the values' own dtype),
  ``storage_dtype`` (the lo component's dtype), ``mlir`` (that dtype as MLIR spells it),
  ``pack`` (values per stored element), ``qmax`` (largest magnitude produced),
  ``layout`` (the storage layout's name, see the module docstring), ``scale_dtype``
  (the scales' dtype, and the offsets'), ``offset`` (whether ``x = q * s + o``),
  ``value_range`` (the values the storage holds, ``(lo, hi)``), ``native_cpu`` and
  ``pallas`` (the weight layouts of :data:`WEIGHT_LAYOUTS` the native CPU kernel and the
  Pallas kernels take it in; elsewhere the platform's rule emits the StableHLO
  decomposition). A *block format* (``block > 0``: GGUF's blocks at the file's bytes) stores
  each block of ``block`` elements as ``fields`` (``(name, bytes, meaning)`` in order, the
  module docstring's table) in ``ui16`` words, its scale (and offset) one f16 per block;
  ``gguf`` names the GGUF type it holds."""
  name: str
  prefix: str
  value_dtype: np.dtype
  storage_dtype: np.dtype
  mlir: str
  pack: int
  qmax: float
  layout: str
  scale_dtype: np.dtype = F32
  offset: bool = False
  value_range: tuple[float, float] = (-127, 127)
  native_cpu: tuple[str, ...] = ("kn", "nk")
  pallas: tuple[str, ...] = ("kn", "nk")
  block: int = 0
  fields: tuple[tuple[str, int, str], ...] = ()
  gguf: str = ""

  @property
  def block_bytes(self) -> int:
    """A block format's stored bytes per block (its :attr:`fields`' sum; 0 for the others)."""
    return sum(b for _, b, _ in self.fields)

  @property
  def block_words(self) -> int:
    """A block format's stored ``ui16`` words per block (the values' last axis)."""
    return self.block_bytes // 2

  @property
  def integer(self) -> bool:
    """Whether values are integers (rounded) rather than floats (cast)."""
    return jnp.issubdtype(self.value_dtype, jnp.integer)

  @property
  def signed(self) -> bool:
    """Whether stored values are signed (packed nibbles sign-extended when decoded)."""
    return self.value_range[0] < 0

  @property
  def scale_mlir(self) -> str:
    """The scale's (and offset's) element type as MLIR spells it: ``f32``, ``f16``."""
    return {F32: "f32", F16: "f16"}[self.scale_dtype]

  @property
  def legacy(self) -> bool:
    """Whether the composites' format attributes of their first versions (f32 scales, no
    offset: ``dtype``, ``group_size``, ``layout``) say this format."""
    return self.scale_dtype == F32 and not self.offset

  def storage_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The stored values' shape for dense ``shape`` (``n // pack`` along the last axis; a
    block format's ``[*lead, n // block, block_words]``)."""
    if self.block:
      return (*shape[:-1], shape[-1] // self.block, self.block_words)
    return (*shape[:-1], shape[-1] // self.pack)

  def dense_shape(self, storage_shape: Sequence[int]) -> tuple[int, ...]:
    """The dense shape of stored values of ``storage_shape``."""
    if self.block:
      return (*storage_shape[:-2], storage_shape[-2] * self.block)
    return (*storage_shape[:-1], storage_shape[-1] * self.pack)

  def value_parts(self, parts: Sequence) -> tuple:
    """The stored values' per-axis entries (partition entries, shardings) from the dense
    value's ``parts``: the same, and ``None`` for a block format's block axis."""
    return (*parts, None) if self.block else tuple(parts)

  def dense_parts(self, value_parts: Sequence) -> tuple:
    """:meth:`value_parts`' inverse: the dense value's entries from the stored values'."""
    return tuple(value_parts)[:-1] if self.block else tuple(value_parts)


INT8 = Format("int8", "q8", np.dtype(jnp.int8), np.dtype(jnp.int8), "i8", 1, 127, "plain",
              value_range=(-128, 127))
INT4 = Format("int4", "q4", np.dtype(jnp.int4), np.dtype(jnp.uint8), "ui8", 2, 7, "int4_pairs_v1",
              value_range=(-8, 7))
FP8 = Format("float8_e4m3fn", "f8", np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e4m3fn),
             "f8E4M3FN", 1, 448, "plain", value_range=(-448, 448))
# f16 scales (GGUF's legacy blocks) and offsets: the native CPU kernel and the
# Pallas kernel take them in the checkpoints' [out, in] layout only
_NO_KERNELS = dict(native_cpu=("nk",), pallas=("nk",))
INT8_F16 = dataclasses.replace(INT8, name="int8_f16", scale_dtype=F16, **_NO_KERNELS)
INT4_F16 = dataclasses.replace(INT4, name="int4_f16", scale_dtype=F16, **_NO_KERNELS)
UINT4 = Format("uint4", "u4o", np.dtype(jnp.uint4), np.dtype(jnp.uint8), "ui8", 2, 15,
               "uint4_pairs_v1", offset=True, value_range=(0, 15), **_NO_KERNELS)
UINT4_F16 = dataclasses.replace(UINT4, name="uint4_f16", scale_dtype=F16)
INT8_OFFSET = dataclasses.replace(INT8, name="int8_offset", prefix="q8o", offset=True,
                                  **_NO_KERNELS)
INT8_OFFSET_F16 = dataclasses.replace(INT8_OFFSET, name="int8_offset_f16", scale_dtype=F16)


UI16 = np.dtype(np.uint16)


def _block_format(gguf: str, block: int, fields, value_range, offset: bool = False) -> Format:
  """A block format (module docstring, "Block formats"): GGUF type ``gguf``'s blocks of
  ``block`` elements, stored as ``fields`` in ``ui16`` words with an f16 scale (and
  offset) per block; the native CPU kernel ``hx_matmul_q_cpu_v4`` in ``[out, in]``, StableHLO
  decompositions elsewhere."""
  name = gguf.lower()
  return Format(name, name, UI16, UI16, "ui16", 1, 0, f"gguf_{name}_v1", scale_dtype=F16,
                offset=offset, value_range=value_range, native_cpu=("nk",), pallas=(), block=block,
                fields=tuple(fields), gguf=gguf)


_NIBBLES_32 = ("qs", 16, "low 4 bits: element j in the low nibble of byte j, j + 16 in its "
               "high nibble")
_QH_32 = ("qh", 4, "fifth bits: element j's is bit j of qh as a little-endian u32")
_K_SCALES = ("scales", 12, "6-bit factors of the 8 sub-blocks of 32: scales sc and mins m "
             "(llama.cpp's get_scale_min_k4: sub-blocks 0-3 bits 0-5 of bytes 0-3 (sc) and "
             "4-7 (m); 4-7 the nibbles of bytes 8-11 (sc low, m high) with bits 6-7 of "
             "bytes 0-7 on top)")
_K_QS = ("qs", 128, "low 4 bits: per 64 elements 32 bytes, element l in the low nibble of "
         "byte l, 32 + l in its high nibble")
Q5_0 = _block_format("Q5_0", 32, [_QH_32, _NIBBLES_32], (-16, 15))
Q5_1 = _block_format("Q5_1", 32, [_QH_32, _NIBBLES_32], (0, 31), offset=True)
IQ4_NL = _block_format("IQ4_NL", 32, [("qs", 16, "4-bit indices i into IQ4_VALUES, "
                                                 "ordered as Q4_0's nibbles")], (-127, 113))
Q4_K = _block_format("Q4_K", 256, [_K_SCALES, _K_QS], (0, 15), offset=True)
Q5_K = _block_format("Q5_K", 256, [_K_SCALES, ("qh", 32, "fifth bits: element 32c + l's is "
                                               "bit c of byte l"), _K_QS], (0, 31), offset=True)
Q6_K = _block_format("Q6_K", 256, [
    ("ql", 128, "low 4 bits: per 128 elements 64 bytes, element l (l < 64) the low nibble "
                "of byte l, 64 + l its high nibble"),
    ("qh", 64, "high 2 bits: per 128 elements 32 bytes, element 32s + l's are bits 2s, "
               "2s + 1 of byte l"),
    ("scales", 16, "int8 factor of each sub-block of 16")], (-32, 31))
Q2_K = _block_format("Q2_K", 256, [
    ("scales", 16, "per sub-block of 16: the 4-bit factor of d (low nibble) and of dmin "
                   "(high nibble)"),
    ("qs", 64, "2-bit values: per 128 elements 32 bytes, element 32s + l's are bits 2s, "
               "2s + 1 of byte l")], (0, 3), offset=True)
Q3_K = _block_format("Q3_K", 256, [
    ("hmask", 32, "third bits: element 32c + l's is bit c of byte l; a clear bit "
                  "subtracts 4"),
    ("qs", 64, "low 2 bits, as Q2_K's"),
    ("scales", 12, "6-bit factors - 32 of the 16 sub-blocks of 16: low 4 bits the nibbles "
                   "of bytes 0-7 (sub-block 8n + b: nibble n of byte b), high 2 bits "
                   "bits 2s, 2s + 1 of bytes 8-11 (sub-block 4s + b)")], (-4, 3))
IQ4_XS = _block_format("IQ4_XS", 256, [
    ("scales_h", 2, "high 2 bits of the 8 sub-blocks' 6-bit factors - 32: bits 2j, 2j + 1 "
                    "of a little-endian u16"),
    ("scales_l", 4, "low 4 bits of those factors: sub-block 2b + n in nibble n of byte b"),
    ("qs", 128, "4-bit indices i into IQ4_VALUES: per sub-block of 32, 16 bytes, element "
                "l in the low nibble of byte l, 16 + l in its high nibble")], (-127, 113))
BLOCK_FORMATS = (Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS)
"""The block formats (GGUF's blocks at the file's bytes), in :data:`FORMATS`' order."""

FORMATS: dict[str, Format] = {f.name: f for f in (INT8, INT4, FP8, INT8_F16, INT4_F16, UINT4,
                                                  UINT4_F16, INT8_OFFSET, INT8_OFFSET_F16,
                                                  *BLOCK_FORMATS)}
"""Every format by name (``hx.quantize``'s ``dtype``; the composites' ``dtype`` attribute)."""

LAYOUTS = frozenset(f.layout for f in FORMATS.values())

def prefix_names(where=None) -> list[str]:
  """The formats' printed names, each once (f16 scales are an option of the same name), of
  the formats ``where`` keeps (a predicate on :class:`Format`; default all), in
  :data:`FORMATS`' order: ``["q8", "q4", "f8", "u4o", "q8o"]``."""
  return list(dict.fromkeys(f.prefix for f in FORMATS.values() if where is None or where(f)))


def prefixes() -> str:
  """The formats' printed names for messages, from :data:`FORMATS`: ``"q8, q4, f8, u4o
  or q8o"`` (:func:`prefix_names`)."""
  names = prefix_names()
  return ", ".join(names[:-1]) + " or " + names[-1]


def components_text(lead: str = "*l", dtype_name=None, where=None, axis: str = "n") -> str:
  """The formats' components for messages, from :data:`FORMATS`: each printed name with its
  stored values and its scales' dtypes, then the scales' shapes (``"q8: i8[*l, n] values,
  f32 or f16 scales; q4: ui8[*l, n/2] int4 pairs, f32 or f16 scales; ...; u4o: ui8[*l, n/2]
  uint4 pairs, f32 or f16 scales and offsets; ...; scales [*l] per row or [*l, n/g] per
  group of g"``). ``lead`` spells the leading dims and ``axis`` the quantized one;
  ``dtype_name`` spells a numpy dtype (default: as MLIR does, ``ui8``; the types' messages
  pass JAX's short names); ``where`` (a predicate on :class:`Format`) keeps the formats a
  kernel takes."""
  kinds: dict = {}
  blocks = []
  for f in FORMATS.values():
    if f.block:
      if where is None or where(f):
        blocks.append(f"{f.prefix}: {dtype_name(f.storage_dtype) if dtype_name else f.mlir}"
                      f"[{lead}, {axis}/{f.block}, {f.block_words}] {f.gguf} blocks, "
                      f"{dtype_name(f.scale_dtype) if dtype_name else f.scale_mlir} "
                      f"scales{' and offsets' if f.offset else ''} [{lead}, {axis}/{f.block}]")
      continue
    if where is None or where(f):
      kinds.setdefault((f.prefix, f.storage_dtype, f.offset), []).append(f)
  out = []
  for (prefix, _, offset), fs in kinds.items():
    f = fs[0]
    values = (f"{dtype_name(f.storage_dtype) if dtype_name else f.mlir}[{lead}, {axis}"
              + ("] values" if f.pack == 1 else f"/{f.pack}] {f.value_dtype.name} "
                 + ("pairs" if f.pack == 2 else f"values, {f.pack} per byte")))
    scales = " or ".join(dict.fromkeys(dtype_name(g.scale_dtype) if dtype_name else g.scale_mlir
                                       for g in fs))
    out.append(f"{prefix}: {values}, {scales} scales{' and offsets' if offset else ''}")
  if out:
    out[-1] += f"; scales [{lead}] per row or [{lead}, {axis}/g] per group of g"
  return "; ".join(out + blocks)


METHODS = ("absmax", "mse", "minmax")
"""``hx.quantize``'s scale methods (see :func:`hxmlir.lowering.reference.quantize`):
``"minmax"`` for formats with an offset, the others for the symmetric ones."""


def _by_components() -> dict:
  out = {}
  for f in FORMATS.values():
    key = (f.storage_dtype, f.scale_dtype, f.offset, f.block_words)
    assert key not in out, f"formats {out.get(key)} and {f.name} have the same components"
    out[key] = f.name
  return out


_COMPONENTS = _by_components()

MSE_RATIOS = tuple(float(r) for r in np.linspace(1.0, 0.5, 20, dtype=np.float32))
"""Clipping ratios ``method="mse"`` tries, largest first (ties keep the larger)."""


def lookup(dtype) -> Format:
  """The format of ``hx.quantize``'s ``dtype`` (``jnp.int8``, ``jnp.int4``,
  ``jnp.float8_e4m3fn``, their names, or a :class:`Format`). Raises ``TypeError``
  naming the known formats otherwise."""
  if isinstance(dtype, Format):
    return dtype
  try:
    name = np.dtype(dtype).name
  except TypeError:
    name = str(dtype)
  if name not in FORMATS:
    raise TypeError(f"hx.quantize: no quantization format for dtype {dtype!r}; known: "
                    f"{', '.join(FORMATS)}")
  return FORMATS[name]


def of_storage(dtype, shape: Sequence[int] | None = None) -> Format | None:
  """The format whose lo values have numpy ``dtype`` or MLIR element type name, else ``None``.
  Block formats (``ui16`` values) need the values' ``shape``: its last axis (words per
  block) names the block format (Q5_0's and Q5_1's values are alike: the first is
  returned; :func:`of_components` tells them apart by the offset)."""
  if shape is not None and _np_dtype(dtype) == UI16:
    return _BLOCK_OF_WORDS.get(int(shape[-1])) if len(shape) >= 2 else None
  try:
    return _OF_STORAGE[dtype]
  except (KeyError, TypeError):  # TypeError: an unhashable argument
    pass
  key = str(dtype)
  found = next((f for f in FORMATS.values()
                if not f.block and key in (f.storage_dtype.name, f.mlir)), None)
  try:
    _OF_STORAGE[dtype] = found
  except TypeError:
    pass
  return found


_OF_STORAGE: dict = {}  # of_storage's answers by argument (str(dtype) is slow on numpy dtypes)
_BLOCK_OF_WORDS: dict = {}
for _f in reversed(BLOCK_FORMATS):  # the first of equal words wins
  _BLOCK_OF_WORDS[_f.block_words] = _f


def _np_dtype(dtype) -> np.dtype | None:
  """``dtype`` (numpy, JAX, or an MLIR element type name: ``"ui8"``, ``"f16"``) as numpy's
  (MLIR names first: numpy reads ``"i8"`` as int64)."""
  if isinstance(dtype, str):
    f = of_storage(dtype)
    if f is not None:
      return f.storage_dtype
    if dtype == "ui16":
      return UI16
    if dtype in _MLIR_FLOATS:
      return _MLIR_FLOATS[dtype]
  try:
    return np.dtype(dtype)
  except TypeError:
    return None


_MLIR_FLOATS = {"f32": F32, "f16": F16}


def dense_shape_of(storage_dtype, storage_shape: Sequence[int]) -> tuple[int, ...]:
  """The dense shape of stored values of ``storage_dtype`` (numpy dtype or MLIR element type
  name) and ``storage_shape``: the format's (:func:`of_storage`) unpacking, or the shape
  itself for a dtype no format stores (a dense array, or an operand to be refused later)."""
  f = of_storage(storage_dtype, storage_shape)
  return f.dense_shape(storage_shape) if f is not None else tuple(storage_shape)


def of_components(values_dtype, scale_dtype, offset: bool,
                  values_shape: Sequence[int] | None = None) -> Format | None:
  """The format whose components are values of ``values_dtype``, scales of ``scale_dtype``
  and, when ``offset``, offsets of the scale's dtype (numpy dtypes or MLIR element type
  names), else ``None``. The one place that reads a format off lo types. A block format's
  values (``ui16``) also need their shape ``values_shape``: its last axis, the words per
  block, names the format (without it: ``None``)."""
  vd = _np_dtype(values_dtype)
  words = 0
  if vd == UI16:
    if values_shape is None or len(values_shape) < 2:
      return None
    words = int(values_shape[-1])
  key = (vd, _np_dtype(scale_dtype), bool(offset), words)
  try:
    name = _COMPONENTS.get(key)
  except TypeError:  # an unhashable dtype
    return None
  return FORMATS[name] if name is not None else None


def of_avals(q, s, o=None) -> Format | None:
  """:func:`of_components` of components ``q``, ``s`` and ``o`` (``None``, or a falsy
  sequence: no offset): arrays, avals or anything with ``dtype`` and ``shape``."""
  return of_components(q.dtype, s.dtype, bool(o) if not hasattr(o, "dtype") else True,
                       tuple(q.shape))


def check_method(fmt: Format, method: str) -> str | None:
  """Why ``hx.quantize(..., dtype=fmt.name, method=method)`` cannot be, else ``None``."""
  if method not in METHODS:
    return f"method must be one of {METHODS}, got {method!r}"
  if fmt.block:
    return (f"hx.quantize does not make {fmt.name} (GGUF's {fmt.gguf} blocks come from "
            "checkpoints: hxmlir.gguf.load, or hx.make_qarray of the blocks' components)")
  if fmt.scale_dtype != F32:
    base = fmt.name.removesuffix("_f16")
    return (f"{fmt.name} has f16 scales, which come from checkpoints (hxmlir.gguf, "
            f"hx.make_qarray); quantize to {base!r} (f32 scales)")
  # the formats hx.quantize makes with an offset: unsigned values, f32 scales (uint4)
  minmax = [f.name for f in FORMATS.values() if f.offset and not f.signed and f.scale_dtype == F32]
  if fmt.offset and fmt.signed:
    return (f"{fmt.name} holds checkpoints' 5-bit values with an offset (GGUF's Q5_1, "
            f"Q5_K); quantize with an offset to {' or '.join(map(repr, minmax))} "
            "(method='minmax')")
  if fmt.offset != (method == "minmax"):
    if fmt.offset:
      return f"{fmt.name} has an offset: quantize it with method='minmax', got {method!r}"
    return (f"method='minmax' is asymmetric and needs a format with an offset "
            f"({', '.join(minmax)}), got dtype {fmt.name}")
  return None


def scale_shape(shape: Sequence[int], group: int | None) -> tuple[int, ...]:
  """The scale's shape for dense ``shape``: ``shape[:-1]`` per row, ``(*shape[:-1], n // g)``
  per group of ``g``."""
  return tuple(shape[:-1]) if group is None else (*shape[:-1], shape[-1] // group)


def group_size(n: int, group: int | None) -> int:
  """The elements per scale along a quantized axis of ``n``: ``group``, or ``n`` per row (a
  per-row scale is one group of ``n``)."""
  return n if group is None else group


def scale_parts(parts: Sequence, group: int | None) -> tuple:
  """The scale's per-axis entries (partition entries, shardings, axes) from the dense
  value's ``parts``: all but the last per row, all of them per group (the group axis takes
  the last axis's entry: groups are sharded like the elements they scale, never split)."""
  return tuple(parts) if group is not None else tuple(parts)[:-1]


def group_attribute(group: int | None) -> int:
  """The ``group_size`` attribute of the composites and of the native kernels' calls that says
  ``group``: ``g``, or ``0`` per row."""
  return group or 0


def group_of(shape: Sequence[int], s_shape: Sequence[int]) -> int | None | str:
  """The group size that a scale of ``s_shape`` means for dense ``shape``: ``None`` (per
  row: ``s_shape == shape[:-1]``), ``g`` (``s_shape == (*shape[:-1], n // g)``), or a
  string saying why neither fits."""
  shape, s_shape = tuple(shape), tuple(s_shape)
  if s_shape == shape[:-1]:
    return None
  if len(s_shape) == len(shape) and s_shape[:-1] == shape[:-1] and s_shape[-1] > 0 \
     and shape[-1] % s_shape[-1] == 0:
    return shape[-1] // s_shape[-1]
  return ("the scale's shape must be the values' shape without its last axis (per row) "
          "or with n // g there (per group of g)")


def check(fmt: Format, shape: Sequence[int], group: int | None) -> str | None:
  """Why dense ``shape`` cannot hold format ``fmt`` with ``group``, else ``None``."""
  n = shape[-1] if shape else 0
  if fmt.block:
    if group != fmt.block:
      return (f"{fmt.name} has one scale per block of {fmt.block}: its group size is "
              f"{fmt.block}, got {'one per row' if group is None else group}")
    if n % fmt.block:
      return f"the last axis ({n}) is not a multiple of {fmt.name}'s block of {fmt.block}"
    return None
  if group is not None:
    if not isinstance(group, (int, np.integer)) or isinstance(group, bool) or group < 1:
      return f"group_size must be a positive int or None, got {group!r}"
    if n % group:
      return f"the last axis ({n}) is not a multiple of the group size {group}"
    if group % fmt.pack:
      return f"{fmt.name} packs {fmt.pack} values per byte: the group size must be even"
  if n % fmt.pack:
    return f"{fmt.name} packs {fmt.pack} values per byte: the last axis ({n}) must be even"
  return None


def split_problem(fmt: Format, n: int, group: int | None, ways: int,
                  stored_name: str) -> str | None:
  """Why a quantized axis of ``n`` dense elements of format ``fmt`` (``group``: ``None``
  per row) cannot be sharded ``ways`` ways, else ``None``: a shard would split a group, or
  a stored element (``stored_name``: its dtype as the caller prints it). The one rule of
  the types' check (``hxmlir.types.qarray``) and ``hx-verify``'s."""
  if fmt.block and (n // fmt.block) % ways:
    return (f"its {n // fmt.block} blocks of {fmt.block} ({fmt.name} super-blocks) cannot be "
            f"split {ways} ways (a shard would split a block); shard another axis, or "
            f"split it into a divisor of {n // fmt.block} parts")
  if group is not None and (n // group) % ways:
    return (f"{n // group} groups of {group} cannot be split {ways} ways (a shard would "
            f"split a group); shard another axis, or use a group size that divides "
            f"{n // ways} ({n} / {ways})")
  if (n // fmt.pack) % ways:
    return f"its {n // fmt.pack} stored {stored_name} values cannot be split {ways} ways"
  return None


def type_name(fmt: Format, dims: str, group: int | None) -> str:
  """``q4[64,128:g32]``: the prefix, the dims text (``64,128``, shardings included), the
  group and a scale dtype other than f32 (``u4o[64,128:g32,f16]``)."""
  return f"{fmt.prefix}[{dims}{type_options(fmt, group)}]"


def type_options(fmt: Format, group: int | None) -> str:
  """What a type prints after its dims: ``:g32``, ``:g32,f16``, ``:f16`` or nothing."""
  opts = ([] if group is None else [f"g{group}"]) + \
      ([] if fmt.scale_dtype == F32 else [fmt.scale_mlir])
  return f":{','.join(opts)}" if opts else ""


# --- traced helpers: storage and scales -----------------------------------------

def store(q, f: Format):
  """Values ``q`` (``int8`` for the integer formats) as format ``f``'s lo component."""
  return pack_int4(q) if f.pack == 2 else q


def pack_int4(q):
  """``i8[..., n]`` holding values in [-8, 7] -> ``ui8[..., n // 2]`` (layout
  ``int4_pairs_v1``, :mod:`hxmlir.formats`: element ``2j`` in the low nibble)."""
  pairs = q.reshape(*q.shape[:-1], q.shape[-1] // 2, 2).astype(jnp.uint8)
  return (pairs[..., 0] & np.uint8(0xF)) | (pairs[..., 1] << np.uint8(4))


def unpack_int4(p, signed: bool = True):
  """``ui8[..., m] -> i8[..., 2m]``: :func:`pack_int4`'s inverse (nibbles sign-extended;
  ``signed=False``: layout ``uint4_pairs_v1``, nibbles in [0, 15])."""
  if not signed:
    lo = p & np.uint8(0xF)
    hi = lax.shift_right_logical(p, np.uint8(4))
    return jnp.stack([lo, hi], axis=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])
  b = p.astype(jnp.int8)
  lo = lax.shift_right_arithmetic(lax.shift_left(b, np.int8(4)), np.int8(4))
  hi = lax.shift_right_arithmetic(b, np.int8(4))
  return jnp.stack([lo, hi], axis=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])


def values_f32(q, fmt: Format | None = None):
  """Stored values ``q`` of any format (``fmt``; default the symmetric format of ``q``'s
  dtype, :func:`of_storage`) as ``f32`` of the dense shape: what multiplies the scale (a
  block format's sub-block factor times its value: the dense value's derivative in the
  block's scale, :mod:`hxmlir.block_decode`)."""
  f = fmt or of_storage(q.dtype, q.shape)
  if f is not None and f.block:
    return block_decode.units(q, f.name)[0]
  if f is not None and f.pack == 2:
    q = unpack_int4(q, f.signed)
  return q.astype(jnp.float32)


def decode(q, s, o=None):
  """The dense ``f32`` value of components ``q`` (stored values), ``s`` (scales, f32 or
  f16, per row or group) and ``o`` (offsets like ``s``, or ``None``):
  ``values * s + o`` per row or group, scales and offsets widened to f32 first (finite
  where ``values * s`` alone overflows but the sum does not). The
  format is :func:`of_components`' (a dtype no format has raises ``TypeError``)."""
  f = of_components(q.dtype, s.dtype, o is not None, q.shape)
  if f is None:
    raise TypeError(f"no quantization format has values {q.dtype}{list(q.shape)}, scales "
                    f"{s.dtype}{' and offsets' if o is not None else ''}")
  if f.block:  # x = u * d + v * dmin per block: each product exact or rounded once
    u, v = block_decode.units(q, f.name)
    y = apply_scale(u, s.astype(jnp.float32))
    return y if o is None else y + apply_scale(v, o.astype(jnp.float32))
  v, s = values_f32(q, f), s.astype(jnp.float32)
  y = apply_scale(v, s)
  if o is None:
    return y
  o = o.astype(jnp.float32)
  out = apply_offset(y, o)
  # a range near f32's limits (scale up to 2 * max / qmax): values * scale may overflow
  # where values * scale + offset does not; there the halved sum, doubled (exact scalings)
  wide = apply_offset(apply_scale(v, s * 0.5), o * 0.5) * 2
  return jnp.where(jnp.isinf(out) & jnp.isfinite(apply_offset(apply_scale(v * 0, s), o)),
                   wide, out)


def offset_units(q, fmt: Format):
  """What multiplies the offset for stored values ``q`` of a format with one: ``None`` for
  the elementwise formats (the offset is added as it is: :func:`apply_offset`), a block
  format's ``f32`` dense derivative in its offset (``-m``: K-quants' sub-block mins)."""
  if not fmt.block:
    return None
  return block_decode.units(q, fmt.name)[1]


def add_offset(y, o, units=None):
  """``y`` plus offsets ``o`` per row or group, each times ``units`` (:func:`offset_units`;
  ``None``: once)."""
  return apply_offset(y, o) if units is None else y + apply_scale(units, o)


def apply_offset(y, o):
  """``y: f32[*lead, n]`` plus its offsets ``o`` (the scale's shape) per row or group."""
  g = group_of_scale(y.shape, o)
  return (split_groups(y, g) + o[..., None]).reshape(y.shape)


def split_groups(x, group_size: int | None):
  """``x: [*lead, n]`` as ``[*lead, n // g, g]`` (unchanged for ``group_size=None``)."""
  if group_size is None:
    return x
  return x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)


def merge_groups(x, group_size: int | None):
  """:func:`split_groups`' inverse: ``x: [*lead, n // g, g]`` as ``[*lead, n]`` (unchanged
  for ``group_size=None``)."""
  return x if group_size is None else x.reshape(*x.shape[:-2], -1)


def as_groups(s, dense_shape: Sequence[int]):
  """Scales (or offsets) ``s`` of values of ``dense_shape`` viewed per group:
  ``[*lead, n // g]`` as they are, a per-row ``[*lead]`` as ``[*lead, 1]`` (one group of
  ``n``, :func:`group_size`)."""
  return s[..., None] if group_of_scale(dense_shape, s) is None else s


def group_of_scale(dense_shape: Sequence[int], s) -> int | None:
  """The group size of scales ``s`` (an array or aval) for values of ``dense_shape``
  (``None``: per row). The shapes must already agree (:func:`group_of`)."""
  return None if s.ndim == len(dense_shape) - 1 else dense_shape[-1] // s.shape[-1]


def apply_scale(qf, s):
  """``qf: f32[*lead, n]`` times its scales ``s`` (``f32[*lead]`` per row, or
  ``f32[*lead, n // g]`` per group): the dense value."""
  g = group_of_scale(qf.shape, s)
  return (split_groups(qf, g) * s[..., None]).reshape(qf.shape)


def sum_per_scale(t, group: int | None):
  """``t: f32[*lead, n]`` summed over each row (``group=None``) or each group of ``group``:
  ``f32[*lead]`` or ``f32[*lead, n // g]``, the scale's shape (the transpose of
  :func:`apply_scale` in the scale, for ``t = ct * values``)."""
  return jnp.sum(split_groups(t, group), axis=-1)
