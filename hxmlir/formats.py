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
``values * scale`` broadcast per row or per group.

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

The packing helpers here are plain JAX code (they run traced, in decompositions and
in the types' rules); quantization itself is :mod:`hxmlir.lowering.reference`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclass(frozen=True)
class Format:
  """One value format: ``name`` (``hx.quantize``'s ``dtype``: ``"int4"``), ``prefix``
  (the type's printed name: ``q4``), ``value_dtype`` (the values' own dtype),
  ``storage_dtype`` (the lo component's dtype), ``mlir`` (that dtype as MLIR spells it),
  ``pack`` (values per stored element), ``qmax`` (largest magnitude produced),
  ``layout`` (the storage layout's name, see the module docstring)."""
  name: str
  prefix: str
  value_dtype: np.dtype
  storage_dtype: np.dtype
  mlir: str
  pack: int
  qmax: float
  layout: str

  @property
  def integer(self) -> bool:
    """Whether values are integers (rounded) rather than floats (cast)."""
    return jnp.issubdtype(self.value_dtype, jnp.integer)

  def storage_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The stored values' shape for dense ``shape`` (``n // pack`` along the last axis)."""
    return (*shape[:-1], shape[-1] // self.pack)

  def dense_shape(self, storage_shape: Sequence[int]) -> tuple[int, ...]:
    """The dense shape of stored values of ``storage_shape``."""
    return (*storage_shape[:-1], storage_shape[-1] * self.pack)


INT8 = Format("int8", "q8", np.dtype(jnp.int8), np.dtype(jnp.int8), "i8", 1, 127, "plain")
INT4 = Format("int4", "q4", np.dtype(jnp.int4), np.dtype(jnp.uint8), "ui8", 2, 7, "int4_pairs_v1")
FP8 = Format("float8_e4m3fn", "f8", np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e4m3fn),
             "f8E4M3FN", 1, 448, "plain")

FORMATS: dict[str, Format] = {f.name: f for f in (INT8, INT4, FP8)}
"""Every format by name (``hx.quantize``'s ``dtype``; the composites' ``dtype`` attribute)."""

LAYOUTS = frozenset(f.layout for f in FORMATS.values())

METHODS = ("absmax", "mse")
"""``hx.quantize``'s scale methods (see :func:`hxmlir.lowering.reference.quantize`)."""

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


def of_storage(dtype) -> Format | None:
  """The format whose lo values have numpy ``dtype`` or MLIR element type name, else ``None``."""
  try:
    return _OF_STORAGE[dtype]
  except (KeyError, TypeError):  # TypeError: an unhashable argument
    pass
  key = str(dtype)
  found = next((f for f in FORMATS.values() if key in (f.storage_dtype.name, f.mlir)), None)
  try:
    _OF_STORAGE[dtype] = found
  except TypeError:
    pass
  return found


_OF_STORAGE: dict = {}  # of_storage's answers by argument (str(dtype) is slow on numpy dtypes)


def scale_shape(shape: Sequence[int], group: int | None) -> tuple[int, ...]:
  """The scale's shape for dense ``shape``: ``shape[:-1]`` per row, ``(*shape[:-1], n // g)``
  per group of ``g``."""
  return tuple(shape[:-1]) if group is None else (*shape[:-1], shape[-1] // group)


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
  the types' check (``hxmlir.qarray``) and ``hx-verify``'s."""
  if group is not None and (n // group) % ways:
    return (f"{n // group} groups of {group} cannot be split {ways} ways (a shard would "
            f"split a group); shard another axis, or use a group size that divides "
            f"{n // ways} ({n} / {ways})")
  if (n // fmt.pack) % ways:
    return f"its {n // fmt.pack} stored {stored_name} values cannot be split {ways} ways"
  return None


def type_name(fmt: Format, dims: str, group: int | None) -> str:
  """``q4[64,128:g32]``: the prefix, the dims text (``64,128``, shardings included) and the group."""
  return f"{fmt.prefix}[{dims}{'' if group is None else f':g{group}'}]"


# --- traced helpers: storage and scales -----------------------------------------

def store(q, f: Format):
  """Values ``q`` (``int8`` for the integer formats) as format ``f``'s lo component."""
  return pack_int4(q) if f.pack == 2 else q


def pack_int4(q):
  """``i8[..., n]`` holding values in [-8, 7] -> ``ui8[..., n // 2]`` (layout
  ``int4_pairs_v1``, :mod:`hxmlir.formats`: element ``2j`` in the low nibble)."""
  pairs = q.reshape(*q.shape[:-1], q.shape[-1] // 2, 2).astype(jnp.uint8)
  return (pairs[..., 0] & np.uint8(0xF)) | (pairs[..., 1] << np.uint8(4))


def unpack_int4(p):
  """``ui8[..., m] -> i8[..., 2m]``: :func:`pack_int4`'s inverse (nibbles sign-extended)."""
  b = p.astype(jnp.int8)
  lo = lax.shift_right_arithmetic(lax.shift_left(b, np.int8(4)), np.int8(4))
  hi = lax.shift_right_arithmetic(b, np.int8(4))
  return jnp.stack([lo, hi], axis=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])


def values_f32(q):
  """Stored values ``q`` of any format as ``f32`` of the dense shape."""
  f = of_storage(q.dtype)
  if f is not None and f.pack == 2:
    q = unpack_int4(q)
  return q.astype(jnp.float32)


def split_groups(x, group_size: int | None):
  """``x: [*lead, n]`` as ``[*lead, n // g, g]`` (unchanged for ``group_size=None``)."""
  if group_size is None:
    return x
  return x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)


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
