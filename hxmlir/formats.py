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

Block formats (GGUF's block types at the file's bytes; :data:`BLOCK_FORMATS`, Q5_0 ... IQ4_XS):
each holds one GGUF type exactly, a block of ``B`` elements stored as the file's bytes in
``ui16`` words (``ui16[*lead, n // B, W]``) with one f16 scale (and offset) per block; they
print ``q4_k[576,1536:g256,f16]``. :mod:`hxmlir.block_formats` defines them, their fields and
their table; :mod:`hxmlir.block_decode` decodes them. ``hx.quantize`` does not make them
(:func:`check_method`); a sharding of the last axis must keep whole blocks
(:func:`split_problem`).

The record of a format (:class:`Format`, :data:`WEIGHT_LAYOUTS`, :data:`F32`, :data:`F16`) is
:mod:`hxmlir.format_spec`'s; this module re-exports it and the block formats, so every format
is read from here.

The packing helpers here are plain JAX code (they run traced, in decompositions and
in the types' rules); quantization itself is :mod:`hxmlir.lowering.reference`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from hxmlir import block_decode
from hxmlir.block_formats import BLOCK_FORMATS as BLOCK_FORMATS
from hxmlir.block_formats import IQ4_NL as IQ4_NL
from hxmlir.block_formats import IQ4_XS as IQ4_XS
from hxmlir.block_formats import Q2_K as Q2_K
from hxmlir.block_formats import Q3_K as Q3_K
from hxmlir.block_formats import Q4_K as Q4_K
from hxmlir.block_formats import Q5_0 as Q5_0
from hxmlir.block_formats import Q5_1 as Q5_1
from hxmlir.block_formats import Q5_K as Q5_K
from hxmlir.block_formats import Q6_K as Q6_K
from hxmlir.block_formats import UI16 as UI16
from hxmlir.format_spec import F16 as F16
from hxmlir.format_spec import F32 as F32
from hxmlir.format_spec import WEIGHT_LAYOUTS as WEIGHT_LAYOUTS
from hxmlir.format_spec import Format as Format

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


def group_of_stored(fmt: Format, q_shape: Sequence[int], s_shape: Sequence[int]) -> int | None | str:
  """:func:`group_of` for values stored as ``fmt`` in ``q_shape`` and scales of ``s_shape``:
  a block format's group is its block, one ``d`` per block (``f16[*l, n, k/B]`` for words
  ``ui16[*l, n, k/B, W]``), also where a row holds no block (k = 0)."""
  if fmt.block:
    if tuple(s_shape) == tuple(q_shape[:-1]):
      return fmt.block
    return (f"{fmt.name}'s d must have one element per block: the words' shape without its "
            f"last axis ({list(q_shape[:-1])})")
  return group_of(fmt.dense_shape(q_shape), s_shape)


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
    if n == 0:  # no group to read the size back from (make_qarray of the components)
      return (f"the last axis is empty: it holds no group of {group}; quantize it per row "
              "(group_size=None)")
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
  """What multiplies the offset for stored values ``q`` of a format with one: ``None`` where
  the offset is added as it is (:func:`apply_offset`: the elementwise formats, and Q5_1,
  :data:`hxmlir.block_decode.OFFSET_AS_IS`), else a block format's ``f32`` dense derivative
  in its offset (``-m``: K-quants' sub-block mins). ``None`` also keeps a constant of ones
  out of the reference decomposition's dot products: XLA CPU (jaxlib 0.10.2, its YNNPACK
  fusion) summed a batched dot against constant ones wrongly at some row counts (8, 16)."""
  if not fmt.block or fmt.name in block_decode.OFFSET_AS_IS:
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
  return x if group_size is None else x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def as_groups(s, dense_shape: Sequence[int]):
  """Scales (or offsets) ``s`` of values of ``dense_shape`` viewed per group:
  ``[*lead, n // g]`` as they are, a per-row ``[*lead]`` as ``[*lead, 1]`` (one group of
  ``n``, :func:`group_size`)."""
  return s[..., None] if group_of_scale(dense_shape, s) is None else s


def group_of_scale(dense_shape: Sequence[int], s) -> int | None:
  """The group size of scales ``s`` (an array or aval) for values of ``dense_shape``
  (``None``: per row). The shapes must already agree (:func:`group_of`). An empty last
  axis holds no group, and its size cannot be read: 1 then (every reshape into groups
  takes it; a block format's weight with no block per row, k = 0)."""
  if s.ndim == len(dense_shape) - 1:
    return None
  return dense_shape[-1] // s.shape[-1] if s.shape[-1] else 1


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
