"""The composite schema: the one place that says what an ``hx.*`` op is.

For every ``stablehlo.composite`` that hxmlir emits, this module records the
op name, its current ``version`` (and the older versions still accepted), the
keys and types of its ``composite_attributes``, and its type and sharding
invariants. The lowering reads it to emit ops; ``hx-verify`` reads it to check
them. Types are described backend-neutrally as :class:`TensorType` (shape and
element type name as MLIR spells it: ``f32``, ``i8``) and shardings as
:data:`DimSharding` tuples, so both JAX avals and MLIR types convert to them.

Bump an op's ``version`` whenever its semantics or attributes change, keep the
old version in ``accepted_versions`` while artifacts that use it may exist, and
add a back-compat artifact for the new version (tests/py/integration/backcompat).

Quantization formats (:mod:`hxmlir.formats`): every op over quantized
values says its format in ``composite_attributes`` (:data:`FORMAT_ATTRIBUTES`):
``dtype`` (``"int8"``, ``"int4"``, ``"float8_e4m3fn"``), ``group_size`` (``0``: one
scale per row, else ``g``) and ``layout`` (the storage layout, ``"plain"`` or
``"int4_pairs_v1"``: two int4 values per ``ui8``, element ``2j`` in the low nibble).
``hx.quantize`` v2 adds ``method`` (``"absmax"``, ``"mse"``) and keeps ``qmax``;
``hx.dequantize`` v2 and ``hx.matmul_q`` v3 carry the three. The attributes must agree
with the operand types (``hx-verify`` checks both). Older versions (``hx.quantize``
v1, ``hx.dequantize`` v1, ``hx.matmul_q`` v1 and v2) have no format attributes and
mean int8 values with per-row scales only.

Formats with f16 scales or an offset (``x = q·s + o`` per row or group):
``hx.quantize`` v3, ``hx.dequantize`` v3 and ``hx.matmul_q`` v4 add ``scale_dtype``
(``"f32"``, ``"f16"``) and ``offset`` (bool) to the format attributes
(:data:`OFFSET_FORMAT_ATTRIBUTES`); with ``offset = true`` the offsets (the scales'
type) follow the scales: one more result of ``hx.quantize`` (``method = "minmax"``),
one more operand of ``hx.dequantize`` and ``hx.matmul_q``. Each op is emitted at the
oldest version that holds its format (:meth:`OpSchema.version_for`): the formats of
before keep their versions and IR, those with f16 scales or offsets take these.

Block formats (GGUF's blocks at the file's bytes, :data:`hxmlir.formats.BLOCK_FORMATS`:
``q5_0`` ... ``iq4_xs``): ``hx.dequantize`` v4 and ``hx.matmul_q`` v5, the same attribute
keys as v3 and v4, whose ``dtype`` names the block format (``"q4_k"``), ``layout`` its
storage (``"gguf_q4_k_v1"``), ``group_size`` its block, ``scale_dtype = "f16"``; the values
are ``ui16[*l, n // B, W]`` (each block's fields as 16-bit words), the scales (and
offsets) ``f16[*l, n // B]``. Older versions refuse a block format
(:meth:`OpSchema.format_problem`). ``hx.quantize`` does not make them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import ml_dtypes  # noqa: F401  (bfloat16, float8_e4m3fn: numpy dtypes by name)
import numpy as np

from hxmlir import formats
from hxmlir.types import dotdims, matmul_q_typing
from hxmlir.types.dotdims import DotDims

PREFIX = "hx."


@dataclass(frozen=True)
class TensorType:
  """A ranked tensor type: ``shape`` (static ints) and ``dtype`` (``"f32"``, ``"i8"``)."""
  shape: tuple[int, ...]
  dtype: str

  def __str__(self) -> str:
    return f"{self.dtype}[{','.join(map(str, self.shape))}]"

  @classmethod
  def of(cls, value) -> TensorType:
    """The type of anything with ``shape`` and numpy ``dtype`` (a JAX aval or array):
    ``f32[2,3]``; dtypes outside the schema keep numpy's name."""
    return cls(tuple(value.shape), _DTYPE_NAMES.get(str(value.dtype), str(value.dtype)))


_DTYPE_NAMES = {"float32": "f32", "int8": "i8", "uint8": "ui8", "uint16": "ui16", "int32": "i32",
                "float8_e4m3fn": "f8E4M3FN", "float16": "f16",
                "bfloat16": "bf16"}  # numpy -> MLIR spelling
_NUMPY_NAMES = {v: k for k, v in _DTYPE_NAMES.items()}


def _numpy_dtype(name: str) -> np.dtype | None:
  """The numpy dtype of a :class:`TensorType`'s ``dtype`` (``"f32"`` -> ``float32``), or
  ``None`` for a type numpy has no dtype for."""
  try:
    return np.dtype(_NUMPY_NAMES.get(name, name))
  except TypeError:
    return None


# Sharding of one value: for each dimension, the tuple of mesh axis names it is
# split over (empty = replicated along that dim). ``None`` for a whole value
# means "no sharding known" and is never checked.
DimSharding = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class OpSchema:
  """What one ``hx.*`` composite is.

  ``check_types(operands, results)`` returns a list of problems (empty when the
  types are right); ``check_operands(operands)`` the problems of the operands alone
  (what a kernel of the op checks before it runs). ``primitive``: the name of the lo
  primitive that lowers to the op; ``attribute_values``: the ``composite_attributes``
  the lowering emits. ``result_shardings(operand_shardings)`` gives the sharding
  each result must have, given its operands' (``None`` entries unknown);
  ``check_shardings`` returns the problems with a full set of shardings. All three
  take the op's decoded ``composite_attributes`` as an optional last argument
  (``attrs``: key -> Python value, ``None`` for an op of an older version without
  them). ``old_attributes``: the attribute keys of older accepted versions that
  differ from ``attributes`` (version -> keys and types).
  """
  name: str
  version: int
  num_operands: int
  num_results: int
  signature: str  # human-readable, for docs and diagnostics
  primitive: str = ""
  attributes: dict[str, type] = field(default_factory=dict)
  attribute_values: dict[str, object] = field(default_factory=dict)
  accepted_versions: tuple[int, ...] = ()
  old_attributes: dict[int, dict[str, type]] = field(default_factory=dict)
  check_types: Callable[..., list[str]] = lambda ops, res, attrs=None: []
  check_shardings: Callable[..., list[str]] = lambda ops, res, attrs=None: []
  check_operands: Callable[..., list[str]] = lambda ops, attrs=None: []
  # which count a format's offset adds one to, from the version that has the
  # ``offset`` attribute on: "operands" or "results"
  offset_adds: str | None = None
  # the version still emitted for the first formats (f32 scales, no offset:
  # FORMAT_ATTRIBUTES), whose IR stays as it was
  legacy_version: int | None = None
  # the version still emitted for the other formats that are not block formats (f16
  # scales, offsets: OFFSET_FORMAT_ATTRIBUTES); the block formats take the current one
  offset_version: int | None = None
  # The op's quantized value, if any: (what diagnostics call it -- "result", "operand",
  # "weight" --, index of its stored values, index of its scales), among the results
  # for "result", else among the operands.
  quantized_pair: tuple[str, int, int] | None = None
  # what each version is emitted for, where several are (docs/compatibility.md's table)
  emitted_for: dict[int, str] = field(default_factory=dict)

  @property
  def versions(self) -> tuple[int, ...]:
    """Every version this code accepts (the current one last)."""
    return (*self.accepted_versions, self.version)

  def counts(self, attrs: dict | None = None) -> tuple[int, int]:
    """``(operands, results)`` of an op with decoded ``composite_attributes`` ``attrs``: one
    more operand (or result) when they say ``offset = true``."""
    extra = int(bool((attrs or {}).get("offset")) and self.offset_adds is not None)
    return (self.num_operands + extra * (self.offset_adds == "operands"),
            self.num_results + extra * (self.offset_adds == "results"))

  def version_for(self, attrs: dict | None) -> int:
    """What an emitter that names no version emits for ``composite_attributes`` ``attrs``:
    ``legacy_version`` when they are its keys (f32 scales, no offset: the IR stays as it
    was), ``offset_version`` for the other formats but the block formats, else the current
    version (module docstring)."""
    if self.legacy_version is not None and \
       set(attrs or {}) == set(self.attributes_of(self.legacy_version)):
      return self.legacy_version
    if self.offset_version is not None and not is_block_format(attrs):
      return self.offset_version
    return self.version

  def format_problem(self, version: int, attrs: dict | None) -> str | None:
    """Why an op of ``version`` cannot hold the format its ``composite_attributes`` ``attrs``
    name (a block format before the version that introduced them), else ``None``."""
    if self.offset_version is not None and version <= self.offset_version and \
       is_block_format(attrs):
      return (f"dtype {attrs['dtype']!r} is a block format (GGUF's {attrs['dtype'].upper()}), "
              f"which {self.name} holds from version {self.offset_version + 1} on, not in "
              f"version {version}")
    return None

  def attributes_of(self, version: int | None = None) -> dict[str, type]:
    """The ``composite_attributes`` keys and Python types of ``version`` (default: current)."""
    if version is None or version == self.version:
      return self.attributes
    return self.old_attributes.get(version, self.attributes)


def _fmt(types: Sequence[TensorType]) -> str:
  return ", ".join(map(str, types))


def _rank_at_least(t: TensorType, r: int) -> bool:
  return len(t.shape) >= r


# --- type invariants ---------------------------------------------------------

def quantized_format(q: TensorType, s: TensorType, o: TensorType | None = None):
  """``(format, group, dense shape)`` of stored values ``q``, scales ``s`` and offsets
  ``o`` (``None``: a format without) (:mod:`hxmlir.formats`), or a string saying what is
  wrong."""
  f = formats.of_storage(q.dtype, q.shape)
  if f is None or not _rank_at_least(q, 1):
    return (f"quantized values must be i8[..., n], got {q} (formats: "
            f"{formats.components_text('...')})")
  dense = f.dense_shape(q.shape)
  group = formats.group_of_stored(f, q.shape, s.shape)
  if isinstance(group, str):
    return (f"scale shape must be the value shape without its last axis: values {q}, "
            f"scale {s} (per group of g: with n // g last; dense shape {list(dense)})")
  full = formats.of_components(q.dtype, s.dtype, o is not None, q.shape)
  if full is None or (o is not None and (o.shape, o.dtype) != (s.shape, s.dtype)):
    offsets = "" if o is None else f", offsets {o}"
    return (f"values {q}, scale {s}{offsets}: no quantization format has these components "
            f"(formats: {formats.components_text('...')}; offsets of the scales' type)")
  problem = formats.check(full, dense, group)
  if problem:
    return f"values {q}, scale {s}: {problem}"
  return full, group, dense


FORMAT_ATTRIBUTES = {"dtype": str, "group_size": int, "layout": str}
"""The ``composite_attributes`` that say a quantized operand's or result's format."""

OFFSET_FORMAT_ATTRIBUTES = {**FORMAT_ATTRIBUTES, "scale_dtype": str, "offset": bool}
"""The format attributes of the versions for f16 scales and offsets (``hx.quantize`` v3,
``hx.dequantize`` v3, ``hx.matmul_q`` v4, and the block formats' versions after them): also the scales' (and offsets')
dtype, ``"f32"`` or ``"f16"``, and whether offsets follow the scales."""


def is_block_format(attrs: dict | None) -> bool:
  """Whether ``composite_attributes`` ``attrs`` name a block format (:mod:`hxmlir.formats`:
  GGUF's blocks at the file's bytes)."""
  f = formats.FORMATS.get((attrs or {}).get("dtype"))
  return bool(f is not None and f.block)


def format_attributes(fmt, group: int | None) -> dict[str, object]:
  """``{"dtype", "group_size", "layout"}`` of format ``fmt`` (a :class:`hxmlir.formats.Format`
  or its name) with ``group`` (``None``: per row, written ``0``); for a format with f16
  scales or an offset, also ``scale_dtype`` and ``offset`` (:data:`OFFSET_FORMAT_ATTRIBUTES`)."""
  f = formats.lookup(fmt)
  out = {"dtype": f.name, "group_size": formats.group_attribute(group), "layout": f.layout}
  if not f.legacy:
    out.update(scale_dtype=f.scale_mlir, offset=f.offset)
  return out


def format_attributes_of(q: TensorType, s: TensorType,
                         o: TensorType | None = None) -> dict[str, object]:
  """:func:`format_attributes` of stored values ``q`` with scales ``s`` and offsets ``o``
  (types that :func:`quantized_format` accepts)."""
  f, group, _ = quantized_format(q, s, o)
  return format_attributes(f, group)


def _quantized_pair(q: TensorType, s: TensorType, what: str, attrs=None,
                    o: TensorType | None = None) -> list[str]:
  errs = []
  if s.dtype != "f32" and not (attrs and "scale_dtype" in attrs and s.dtype == "f16"):
    # (the versions before the f16-scale formats hold f32 scales only)
    return [f"{what}: scale must be f32, got {s}"]
  got = quantized_format(q, s, o)
  if isinstance(got, str):
    return [f"{what}: {got}"]
  have = format_attributes(got[0], got[1])
  if attrs and "dtype" in attrs:
    said = {k: attrs[k] for k in OFFSET_FORMAT_ATTRIBUTES if k in attrs}
    if said != have:
      errs.append(f"{what}: composite_attributes say {_fmt_attrs(said)} but the types "
                  f"{q}, {s} are {_fmt_attrs(have)}")
  elif have != format_attributes("int8", None):
    errs.append(f"{what}: this version holds int8 values with per-row scales only, got "
                f"{q}, {s} ({_fmt_attrs(have)}); newer versions carry the format")
  return errs


def _fmt_attrs(a: dict) -> str:
  return ", ".join(f"{k} = {a[k]!r}" for k in OFFSET_FORMAT_ATTRIBUTES if k in a)


def dense_shape(q: TensorType) -> tuple[int, ...]:
  """The dense shape of stored values ``q`` (``ui8[..., m]`` int4 pairs: ``[..., 2m]``)."""
  return formats.dense_shape_of(q.dtype, q.shape)


def _grouped(q: TensorType, s: TensorType) -> bool:
  return len(s.shape) == len(q.shape)


def _check_quantize(ops, res, attrs=None):
  (x,), (q, s, *o) = ops, res
  errs = []
  if x.dtype != "f32" or not _rank_at_least(x, 1):
    errs.append(f"operand must be f32[..., n], got {x}")
  errs += _quantized_pair(q, s, "result", attrs, *o)
  if dense_shape(q) != x.shape:
    errs.append(f"result values {q} must have the operand's shape {x}")
  return errs


def _check_dequantize(ops, res, attrs=None):
  (q, s, *o), (y,) = ops, res
  errs = _quantized_pair(q, s, "operand", attrs, *o)
  if y.dtype != "f32" or y.shape != dense_shape(q):
    errs.append(f"result must be f32 of the values' dense shape {dense_shape(q)}, got {y}")
  return errs


# --- hx.matmul_q: dot_general with a quantized right operand ------------------

MATMUL_Q_ATTRIBUTES = ("lhs_batching_dimensions", "rhs_batching_dimensions",
                       "lhs_contracting_dimensions", "rhs_contracting_dimensions")
"""``hx.matmul_q`` v2's ``composite_attributes``: ``stablehlo.dot_general``'s names, each
an ``array<i64: ...>``. The rules of the dimension numbers (result shape and
sharding, where the scale goes) are :mod:`hxmlir.types.dotdims`'s."""


def matmul_q_attributes(dims: DotDims, fmt_attrs: dict) -> dict[str, object]:
  """``composite_attributes`` of ``hx.matmul_q`` v3 for ``dims`` and the weight's format
  (:func:`format_attributes`)."""
  (lc, rc), (lb, rb) = dims
  return {"lhs_batching_dimensions": tuple(lb), "rhs_batching_dimensions": tuple(rb),
          "lhs_contracting_dimensions": tuple(lc), "rhs_contracting_dimensions": tuple(rc),
          **fmt_attrs}


def matmul_q_dims(attrs, x_rank: int) -> DotDims:
  """The dimension numbers of an ``hx.matmul_q`` with decoded attributes ``attrs``
  (``None`` or empty: version 1, :func:`hxmlir.types.dotdims.v1_dims` of ``x_rank``)."""
  if not attrs or "lhs_contracting_dimensions" not in attrs:
    return dotdims.v1_dims(x_rank)
  return ((tuple(attrs["lhs_contracting_dimensions"]), tuple(attrs["rhs_contracting_dimensions"])),
          (tuple(attrs["lhs_batching_dimensions"]), tuple(attrs["rhs_batching_dimensions"])))


def _matmul_q_type(ops, attrs=None) -> tuple[list[str], TensorType | None]:
  """``hx.matmul_q``'s typing rule (:func:`hxmlir.types.matmul_q_typing.result_type`, ``x``
  f32) on the composite's operand types: ``(problems, result type)``, the type ``None``
  where there are problems. The weight's format is checked first (its components and the
  format attributes), and ``x``'s dtype with it."""
  x, q, s, *o = ops
  errs = _quantized_pair(q, s, "weight", attrs, *o)
  try:
    matmul_q_typing.check_dense_dtype(_numpy_dtype(x.dtype), _fmt(ops),
                                      matmul_q_typing.LO_DENSE_DTYPES)
  except matmul_q_typing.MatmulQTypeError as e:
    errs.append(str(e))
  if errs:
    return errs, None
  if not attrs and (len(x.shape) < 2 or len(x.shape) != len(q.shape)):
    return [f"version 1 expects f32[*b, m, k] x i8[*b, k, n] of equal rank >= 2, "
            f"got {_fmt(ops)}"], None
  try:
    _, shape, dtype = matmul_q_typing.result_type(
        x.shape, _numpy_dtype(x.dtype), dense_shape(q), _grouped(q, s),
        matmul_q_dims(attrs, len(x.shape)), operands=_fmt(ops),
        dtypes=matmul_q_typing.LO_DENSE_DTYPES)
  except matmul_q_typing.MatmulQTypeError as e:
    return [str(e)], None
  return [], TensorType(tuple(shape), _DTYPE_NAMES.get(dtype.name, dtype.name))


def _matmul_q_operands(ops, attrs=None) -> list[str]:
  return _matmul_q_type(ops, attrs)[0]


def _check_matmul_q(ops, res, attrs=None):
  (y,) = res
  errs, want = _matmul_q_type(ops, attrs)
  if not errs and y != want:
    errs.append(f"result must be {want}, got {y}")
  return errs


def _check_outer(ops, res, attrs=None):
  (c, r), (c2, r2) = ops, res
  errs = []
  if c.dtype != "f32" or r.dtype != "f32" or not c.shape or not r.shape:
    errs.append(f"factors must be f32[*b, m] and f32[*b, n], got {_fmt(ops)}")
  elif c.shape[:-1] != r.shape[:-1]:
    errs.append(f"factors have different batch dimensions: {_fmt(ops)}")
  if (c2, r2) != (c, r):
    errs.append(f"results must be the factors' types {_fmt(ops)}, got {_fmt(res)}")
  return errs


def _check_matmul_r1(ops, res, attrs=None):
  (x, c, r), (y,) = ops, res
  errs = []
  if any(t.dtype != "f32" for t in (x, c, r)) or len(x.shape) < 2:
    errs.append(f"expects f32[*b, p, m], f32[*b, m], f32[*b, n], got {_fmt(ops)}")
    return errs
  if x.shape[:-2] != c.shape[:-1] or x.shape[-1] != c.shape[-1] or \
     c.shape[:-1] != r.shape[:-1]:
    errs.append(f"operand shapes do not match f32[*b, p, m] x r1[*b, m, n]: {_fmt(ops)}")
    return errs
  want = (*x.shape[:-1], r.shape[-1])
  if y.dtype != "f32" or y.shape != want:
    errs.append(f"result must be f32[{','.join(map(str, want))}], got {y}")
  return errs


# --- hx.attention: grouped-query attention over a KV cache ----------------------

ATTENTION_SIGNATURE = ("(q: f32[T, kv, g, d], k: f32[kv, C, d], v: f32[kv, d, C], start: i32[]) "
                       "-> f32[T, kv, g, d]")
ATTENTION_BATCHED_SIGNATURE = (
    "(q: f32[B, T, kv, g, d], k: f32[B, kv, C, d] or f32[kv, C, d], v: f32[B, kv, d, C] or "
    "f32[kv, d, C] (as k), start: i32[B]) -> f32[B, T, kv, g, d]")
"""Version 3's operands: a batch of ``B`` version-2 problems, element ``b`` at its own
``start[b]``, over its own cache or (``k`` and ``v`` without ``B``) one shared by all."""


def attention_problems(q: TensorType, k: TensorType, v: TensorType,
                       start: TensorType) -> list[str]:
  """What is wrong with ``hx.attention``'s operand types (empty: nothing): ``q: f32[T, kv, g,
  d]``, ``k: f32[kv, C, d]``, ``v: f32[kv, d, C]``, ``start: i32[]``, the ``kv``, ``d`` and
  ``C`` of each the same; or, with a rank-5 ``q``, version 3's batch of them
  (:data:`ATTENTION_BATCHED_SIGNATURE`: ``q``, ``start`` and, unless shared, ``k`` and ``v``
  with a leading ``B``). One message naming every operand type."""
  batched = len(q.shape) == 5
  ok = q.dtype == k.dtype == v.dtype == "f32" and start.dtype == "i32"
  qs, ks, vs = q.shape, k.shape, v.shape  # one problem's shapes
  if batched:
    kb = len(ks) - 3  # 1: k and v have the batch dimension, 0: one cache for all
    ok = ok and kb in (0, 1) and len(vs) == len(ks) and start.shape == qs[:1] and \
        ks[:kb] == vs[:kb] == qs[:kb]
    qs, ks, vs = qs[1:], ks[kb:], vs[kb:]
  else:
    ok = ok and start.shape == ()
  ok = ok and len(qs) == 4 and len(ks) == 3 and len(vs) == 3
  if ok:
    _, kv, _, d = qs
    ok = ks[0] == vs[0] == kv and ks[2] == vs[1] == d and vs[2] == ks[1]
  if ok:
    return []
  return [f"expects {ATTENTION_BATCHED_SIGNATURE if batched else ATTENTION_SIGNATURE}, got "
          f"q: {q}, k: {k}, v: {v}, start: {start}"]


def _attention_operands(ops, attrs=None):
  return attention_problems(*ops) if len(ops) == 4 else [
      f"expects 4 operands {ATTENTION_SIGNATURE}, got {_fmt(ops)}"]


def _check_attention(ops, res, attrs=None):
  errs = _attention_operands(ops, attrs)
  (y,) = res
  if not errs and y != TensorType(ops[0].shape, "f32"):
    errs.append(f"result must be q's type {ops[0]}, got {y}")
  return errs


def _shard_attention(ops, res, attrs=None):
  q, *_ = ops
  (y,) = res
  if not _same(q, y):
    return [f"result sharding {fmt_sharding(y)} must equal q's {fmt_sharding(q)}"]
  return []


# --- sharding invariants -----------------------------------------------------

def _scale_like_values(q: DimSharding | None, s: DimSharding | None, what: str,
                       o: DimSharding | None = None) -> list[str]:
  errs = []
  if o is not None and s is not None and tuple(o) != tuple(s):
    errs.append(f"{what}: offset sharding {fmt_sharding(o)} must be the scale's "
                f"{fmt_sharding(s)}")
  if q is None or s is None:
    return errs
  if len(s) == len(q):  # group scales: the group axis is sharded like the last axis
    if tuple(q) != tuple(s):
      errs.append(f"{what}: group scale sharding {fmt_sharding(s)} must be the values' "
                  f"sharding {fmt_sharding(q)}")
  elif tuple(q[:-1]) != tuple(s):
    errs.append(f"{what}: scale sharding {fmt_sharding(s)} must be the values' sharding "
                f"{fmt_sharding(q)} without its last axis")
  return errs


def _same(a: DimSharding | None, b: DimSharding | None) -> bool:
  return a is None or b is None or tuple(a) == tuple(b)


def _shard_quantize(ops, res, attrs=None):
  (x,), (q, s, *o) = ops, res
  errs = _scale_like_values(q, s, "result", *o)
  if not _same(x, q):
    errs.append(f"result values sharding {fmt_sharding(q)} must equal the operand's "
                f"{fmt_sharding(x)}")
  return errs


def _shard_dequantize(ops, res, attrs=None):
  (q, s, *o), (y,) = ops, res
  errs = _scale_like_values(q, s, "operand", *o)
  if not _same(q, y):
    errs.append(f"result sharding {fmt_sharding(y)} must equal the values' {fmt_sharding(q)}")
  return errs


def _dense_times(x: DimSharding | None, k_side: tuple[str, DimSharding | None, int],
                 n_side: tuple[str, DimSharding | None], y: DimSharding | None) -> list[str]:
  """Sharding rules of ``f32[*b, m, k] @ W[*b, k, n] -> f32[*b, m, n]``.

  ``k_side = (name, sharding, dim)``: the operand holding W's contraction axis and
  which of its dims that is; ``n_side = (name, sharding)``: the operand whose last
  axis is W's columns. Contraction axes unsharded; result rows like x's, columns
  like W's.
  """
  (k_name, k_sh, k_dim), (n_name, n_sh) = k_side, n_side
  errs = []
  if (x is not None and x[-1]) or (k_sh is not None and k_sh[k_dim]):
    errs.append(f"contraction axes must be unsharded, got x {fmt_sharding(x)} and "
                f"{k_name} {fmt_sharding(k_sh)}")
  if y is not None and x is not None and tuple(y[-2]) != tuple(x[-2]):
    errs.append(f"result rows must be sharded like x's rows: result {fmt_sharding(y)}, "
                f"x {fmt_sharding(x)}")
  if y is not None and n_sh is not None and tuple(y[-1]) != tuple(n_sh[-1]):
    errs.append(f"result columns must be sharded like {n_name}'s columns: result "
                f"{fmt_sharding(y)}, {n_name} {fmt_sharding(n_sh)}")
  return errs


def _shard_matmul_q(ops, res, attrs=None):
  """Per dimension numbers: result batch dims like ``x``'s (or ``q``'s where ``x``'s is
  not), ``x``'s free dims like ``x``, ``q``'s free dims like ``q`` (``dot_general``'s rule).

  A sharded contraction axis is allowed, as for ``stablehlo.dot_general``: each shard
  computes a partial sum and the partitioner adds them (an all-reduce). Auto mesh axes
  carry no type, so only the IR knows them sharded there (``jax.jit(...,
  in_shardings=...)`` of a row-parallel layer); on Explicit axes the typing rule refuses
  a sharded contraction at trace time (:func:`hxmlir.types.qarray.matmul_q_result_type`), as
  JAX's dot does.
  """
  (x, q, s, *o), (y,) = ops, res
  errs = _scale_like_values(q, s, "weight", *o)
  # x's rank: version 1 has equal ranks; a v2 op with x's sharding unknown checks q only
  rank = len(x) if x is not None else len(q) if q is not None and not attrs else None
  if rank is None:
    return errs
  (lc, rc), (lb, rb) = dims = matmul_q_dims(attrs, rank)
  if y is None or x is None and q is None:
    return errs
  # what each result dim must be, where the operand it comes from is known
  n_xfree = rank - len(lc) - len(lb)
  q_rank = len(y) - n_xfree + len(rc)
  want = dotdims.result_parts(x if x is not None else [None] * rank,
                              q if q is not None else [None] * q_rank, dims)
  if len(want) != len(y):
    return errs  # a wrong result rank: check_types reports it
  nb = len(lb)
  for what, lo, hi, src in (("x's", 0, nb + n_xfree, x), ("the weight's", nb + n_xfree, len(y), q)):
    if src is None:
      continue
    bad = [i for i in range(lo, hi) if want[i] is not None and tuple(want[i]) != tuple(y[i])]
    if bad:
      errs.append(f"result dims {bad} must be sharded like {what} (batch like x, else the "
                  f"weight; dimension numbers {dims}): result {fmt_sharding(y)}, x "
                  f"{fmt_sharding(x)}, weight {fmt_sharding(q)}")
  return errs


def _shard_matmul_r1(ops, res, attrs=None):
  (x, c, r), (y,) = ops, res
  return _dense_times(x, ("col", c, -1), ("row", r), y)


def fmt_sharding(sh: DimSharding | None) -> str:
  """``[{"i"}, {}]`` in Shardy's notation, or ``<unknown>``."""
  if sh is None:
    return "<unknown>"
  return "[" + ", ".join("{" + ", ".join(f'"{a}"' for a in d) + "}" for d in sh) + "]"


# --- the ops -----------------------------------------------------------------

QMAX = 127
"""Symmetric int8 range ``[-QMAX, QMAX]`` (-128 is never produced); ``hx.quantize``'s
``qmax`` attribute."""

SCHEMAS: dict[str, OpSchema] = {s.name: s for s in [
    OpSchema("hx.quantize", 3, 1, 2, "(f32[*l, n]) -> (i8[*l, n], f32[*l])",
             primitive="hx_quantize",
             attributes={"qmax": int, "method": str, **OFFSET_FORMAT_ATTRIBUTES},
             accepted_versions=(1, 2),
             old_attributes={1: {"qmax": int},
                             2: {"qmax": int, "method": str, **FORMAT_ATTRIBUTES}},
             offset_adds="results", legacy_version=2,
             quantized_pair=("result", 0, 1),
             check_types=_check_quantize, check_shardings=_shard_quantize),
    OpSchema("hx.dequantize", 4, 2, 1, "(i8[*l, n], f32[*l]) -> f32[*l, n]",
             primitive="hx_dequantize", attributes=dict(OFFSET_FORMAT_ATTRIBUTES),
             accepted_versions=(1, 2, 3), old_attributes={1: {}, 2: dict(FORMAT_ATTRIBUTES),
                                                          3: dict(OFFSET_FORMAT_ATTRIBUTES)},
             offset_adds="operands", legacy_version=2, offset_version=3,
             quantized_pair=("operand", 0, 1),
             check_types=_check_dequantize, check_shardings=_shard_dequantize),
    OpSchema("hx.matmul_q", 5, 3, 1,
             "(f32[...], i8[..., n], f32[...]) -> f32[...]: dot_general(x, q * s[..., None]) "
             "with the composite's dimension numbers (version 1: f32[*b, m, k], i8[*b, k, n], "
             "f32[*b, k] -> f32[*b, m, n])",
             primitive="hx_matmul_q",
             attributes={**dict.fromkeys(MATMUL_Q_ATTRIBUTES, tuple), **OFFSET_FORMAT_ATTRIBUTES},
             accepted_versions=(1, 2, 3, 4),
             old_attributes={1: {}, 2: dict.fromkeys(MATMUL_Q_ATTRIBUTES, tuple),
                             3: {**dict.fromkeys(MATMUL_Q_ATTRIBUTES, tuple),
                                 **FORMAT_ATTRIBUTES},
                             4: {**dict.fromkeys(MATMUL_Q_ATTRIBUTES, tuple),
                                 **OFFSET_FORMAT_ATTRIBUTES}},
             offset_adds="operands", legacy_version=3, offset_version=4,
             check_types=_check_matmul_q,
             check_shardings=_shard_matmul_q, check_operands=_matmul_q_operands,
             quantized_pair=("weight", 1, 2)),
    OpSchema("hx.outer", 1, 2, 2, "(f32[*b, m], f32[*b, n]) -> (f32[*b, m], f32[*b, n])",
             primitive="hx_outer", check_types=_check_outer),
    OpSchema("hx.matmul_r1", 1, 3, 1,
             "(f32[*b, p, m], f32[*b, m], f32[*b, n]) -> f32[*b, p, n]",
             primitive="hx_matmul_r1",
             check_types=_check_matmul_r1, check_shardings=_shard_matmul_r1),
    OpSchema("hx.attention", 3, 4, 1,
             ATTENTION_SIGNATURE + ": softmax over positions start + t - window < c <= "
             "start + t of scale * q . k (soft-capped), times v (lowering/reference.py: "
             "attention; version 1: no window or softcap attribute; version 3: a batch, "
             + ATTENTION_BATCHED_SIGNATURE + ")",
             primitive="hx_attention",
             attributes={"scale": float, "window": int, "softcap": float},
             accepted_versions=(1, 2), old_attributes={1: {"scale": float}},
             emitted_for={1: "no window or soft cap", 2: "a window or a soft cap",
                          3: "a batch (jax.vmap)"},
             check_types=_check_attention, check_shardings=_shard_attention,
             check_operands=_attention_operands),
]}


def for_primitive(primitive: str) -> OpSchema:
  """The schema of the composite lo primitive ``primitive`` (``"hx_matmul_q"``) lowers to.
  Raises ``KeyError`` naming the known primitives when there is none."""
  for op in SCHEMAS.values():
    if op.primitive == primitive:
      return op
  raise KeyError(f"no hx composite for lo primitive {primitive!r}; known: "
                 f"{', '.join(op.primitive for op in SCHEMAS.values())}")


def lookup(name: str) -> OpSchema | None:
  """The schema of composite ``name`` (``"hx.matmul_q"``), or ``None`` if unknown."""
  return SCHEMAS.get(name)
