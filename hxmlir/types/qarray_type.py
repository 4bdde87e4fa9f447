"""The quantized array type: :class:`QArray` (the value), :class:`QArrayTy` (its JAX type,
``q8[..., n]``, ``q4[..., n:g32]``, ``q4_k[..., n:g256,f16]``), its ``vmap`` and ``shard_map``
specs, and the typing rule of its components (:func:`make_qarray_type`).

The primitives over it are :mod:`hxmlir.types.qarray_prims`; the user functions
(``hx.quantize``, ``hx.dequantize``, ...) :mod:`hxmlir.types.qarray`, which re-exports
these names.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.hijax import (
  HiPspec,
  HiType,
  ShapedArray,
  aval_property,
  register_hitype,
)
from jax.sharding import NamedSharding, PartitionSpec

from hxmlir import _jax, formats
from hxmlir import pallas as hx_pallas
from hxmlir._jax import ManualAxisType, MappingSpec, empty_mat, is_hi_level_tracer
from hxmlir.types import shardings as shd
from hxmlir.types.hiprim import (
  DenseValue,
  DenseValuedType,
  NeedsJitShardMap,
  broadcast_unmapped,
  refuse_array_api,
  shard_map_spec_hint,
  value_refusals,
)
from hxmlir.types.matmul_q_typing import dense_dtype_hint

F32 = jnp.dtype("float32")
I8 = jnp.dtype("int8")

@dataclass(frozen=True)
class QArray(DenseValue):
  """A quantized array value: ``qvalue: i8[*lead, n]``, ``scale: f32[*lead]``.

  Represents ``qvalue.astype(f32) * scale[..., None]``. Construct it with
  :func:`quantize`, or from its components with :func:`make_qarray`, which
  works everywhere (``jit``, ``grad``, ``vmap``, ``scan``, ``shard_map``) and
  checks the components' types. The constructor checks concrete components
  (NumPy or JAX arrays) at once, and others when JAX asks for the type (the same
  rule: ``i8`` values, ``f32`` scales sharded like the values' leading axes;
  ``TypeError`` naming both components), and is for concrete arrays (for example a checkpoint
  loaded eagerly): inside traced code a ``QArray`` of traced arrays raises
  ``TypeError`` telling you to use :func:`make_qarray` as soon as it reaches a
  primitive (returned from ``jit``, JAX reports it as not a valid JAX type).
  ``q.qvalue`` and ``q.scale`` work on concrete and traced values alike; on a
  traced one they are :func:`qarray_parts`.
  """
  qvalue: Any
  scale: Any
  offset: Any = None  # a format with an offset (u4o): x = qvalue * scale + offset

  def __post_init__(self):
    # concrete components are checked here, where the mistake is made: under jit JAX
    # would report a bad argument only as "Error interpreting argument ..."
    if all(isinstance(c, (np.ndarray, jax.Array)) and not isinstance(c, jax.core.Tracer)
           for c in self.components):
      _typeof_qarray(self)

  @property
  def components(self) -> tuple:
    """``(qvalue, scale)``, or ``(qvalue, scale, offset)`` for a format with an offset."""
    return (self.qvalue, self.scale) if self.offset is None else \
        (self.qvalue, self.scale, self.offset)

  @property
  def shape(self) -> tuple[int, ...]:
    """The dense shape ``(*lead, n)`` (twice the stored last axis for packed int4)."""
    return formats.dense_shape_of(self.qvalue.dtype, self.qvalue.shape)

  # not an array: np.asarray(q), q1 == q2, hash(q), bool(q) raise TypeError
  __array__, __eq__, __ne__, __hash__, __bool__ = value_refusals(
      "np.asarray(hx.dequantize(q)) for the dense f32 values, or hx.qarray_parts(q) "
      "for the stored values and scales, and the offsets of a format with an offset "
      f"({', '.join(formats.prefix_names(lambda f: f.offset))}): (np.asarray(q.qvalue), "
      "np.asarray(q.scale)[, np.asarray(q.offset)])")


@dataclass(frozen=True)
class QArraySpec(MappingSpec):
  """``vmap`` mapping spec of a quantized array: mapped along its leading axis.

  A batch of ``q8[2,3]`` values stacked on a new leading axis is a
  ``q8[b,2,3]`` (values ``i8[b,2,3]``, scales ``f32[b,2]``), so the spec carries
  no data. Pass it in ``in_axes``/``out_axes`` with an explicit ``axis_size``
  when no array argument fixes the size.
  """


@dataclass(frozen=True)
class QArrayP(NeedsJitShardMap, HiPspec):
  """``shard_map`` partition spec of a quantized array.

  ``spec`` partitions the leading axes only; the quantized (last) axis stays
  whole on each device, so every row travels with its scale. ``QArrayP(P('i'))``
  shards the rows of a ``q8[8,3]`` over mesh axis ``i``. A format with an offset
  (``u4o``, ``q8o``) has three components: ``QArrayP(P('i'), offset=True)``.
  """
  spec: PartitionSpec = PartitionSpec()
  offset: bool = False

  def to_lo(self) -> tuple[PartitionSpec, ...]:
    """Partition specs of ``(qvalue, scale[, offset])``: each takes ``spec`` for the
    leading axes."""
    return (self.spec,) * (3 if self.offset else 2)

  def to_tangent_spec(self) -> PartitionSpec:
    """Tangents are dense ``f32`` arrays of the value's shape: partitioned by ``spec``."""
    return self.spec

  def to_ct_spec(self) -> PartitionSpec:
    """Cotangents, like tangents, are dense arrays partitioned by ``spec``."""
    return self.spec


@dataclass(frozen=True)
class QArrayTy(DenseValuedType, HiType):
  """The type ``q8[*lead, n]`` of a quantized array (printed ``q8[8@i,3]`` when sharded).

  ``shape`` is the dense shape; ``sharding`` is the ``NamedSharding`` of the
  int8 values. The scale's sharding is derived from it by dropping the last
  axis. ``mat`` is the manual-axis type inside ``shard_map`` (which manual mesh
  axes the value varies over, printed ``{V:i}``), shared by both components and
  empty elsewhere. The tangent and cotangent type is the dense ``f32`` array of
  the same shape, sharding and ``mat`` (straight-through gradients).
  """
  shape: tuple[int, ...]
  sharding: NamedSharding
  mat: ManualAxisType = empty_mat
  fmt: str = "int8"
  group: int | None = None

  def __post_init__(self):
    if len(self.shape) < 1:
      raise TypeError(f"a quantized array needs at least one axis, got {self.format.prefix}[]")
    if isinstance(self.group, np.integer):  # a group size computed with NumPy: one spelling
      object.__setattr__(self, "group", int(self.group))
    problem = formats.check(self.format, self.shape, self.group)
    if problem:
      raise TypeError(f"{self}: {problem}")
    self._check_last_axis_split(self._parts()[-1], dict(self.sharding.mesh.shape))

  @property
  def format(self) -> formats.Format:
    """The value format (:mod:`hxmlir.formats`)."""
    return formats.FORMATS[self.fmt]

  def _check_last_axis_split(self, axes, mesh_shape: dict) -> None:
    """A last axis sharded over mesh ``axes`` (a partition entry; sizes in ``mesh_shape``)
    must split into whole groups (and whole packed bytes); ``TypeError`` otherwise."""
    if not axes:
      return
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    ways = int(np.prod([mesh_shape[a] for a in axes], dtype=np.int64))
    over = ", ".join(f"{a!r}={mesh_shape[a]}" for a in axes)
    problem = formats.split_problem(self.format, self.shape[-1], self.group, ways,
                                    self.format.storage_dtype.name)
    if problem:
      raise TypeError(f"{self} sharded over mesh axis {over}: {problem}")

  def _with(self, **changes) -> QArrayTy:
    """This type with ``changes`` (shape, sharding, mat), the same format."""
    return dataclasses.replace(self, **changes)

  def _dense_i8(self) -> ShapedArray:
    # an array of the dense shape and sharding: JAX's printing and shard_map rules
    return ShapedArray(self.shape, I8, sharding=self.sharding, manual_axis_type=self.mat)

  # ``q.qvalue`` and ``q.scale`` of a traced ``q`` (a tracer of this type):
  # ``hx.qarray_parts(q)``, so code reading components works traced as eagerly
  qvalue = aval_property(lambda q: _parts(q)[0])
  scale = aval_property(lambda q: _parts(q)[1])

  def _name(self) -> str:
    """The type as messages print it: ``q4_k[8@i,512:g256,f16]`` (no manual axes)."""
    return formats.type_name(self.format, self._dims(), self.group)

  def _dims(self) -> str:
    return shd.dims_str(self.shape, shd.partitions(self.sharding, len(self.shape)))

  # lowering to lo types and values
  def lo_ty(self) -> list[ShapedArray]:
    """``[values, f32 scale]`` with the value's and derived scale's shardings: for
    ``q8[*lead, n]`` ``[i8[*lead, n], f32[*lead]]``; the values are ``ui8[*lead, n // 2]``
    for ``q4`` and ``f8E4M3FN[*lead, n]`` for ``f8``, the scale ``f32[*lead, n // g]``
    per group (:mod:`hxmlir.formats`); the scale is the format's ``scale_dtype`` (f16
    for ``q8[..:g32,f16]``), and a format with an offset (``u4o``) has a third
    component, the offsets, typed and sharded like the scale."""
    vspec, sspec = self._component_specs(PartitionSpec(*self._parts()))
    f = self.format
    scale = ShapedArray(formats.scale_shape(self.shape, self.group), f.scale_dtype,
                        sharding=self.sharding.update(spec=sspec), manual_axis_type=self.mat)
    return [ShapedArray(f.storage_shape(self.shape), f.storage_dtype,
                        sharding=self.sharding.update(spec=vspec), manual_axis_type=self.mat),
            scale] + ([scale] if f.offset else [])

  def lower_val(self, q: QArray) -> list:
    return list(q.components)

  def raise_val(self, qvalue, scale, offset=None) -> QArray:
    return QArray(qvalue, scale, offset)

  # vmap / scan
  def dec_rank(self, size, spec) -> QArrayTy:
    if not isinstance(spec, QArraySpec):
      raise TypeError(f"a {self._name()} is mapped with hx.QArraySpec(), got {spec!r}")
    if self.shape[0] != size:
      raise ValueError(f"mapped axis of {self._name()} has size {self.shape[0]}, "
                       f"but the mapped size is {size}")
    if len(self.shape) < 2:
      raise TypeError(f"cannot map over the only (quantized) axis of {self._name()}")
    return self._with(shape=self.shape[1:],
                      sharding=shd.with_partitions(self.sharding, self._parts()[1:]))

  def inc_rank(self, size, spec) -> QArrayTy:
    if not isinstance(spec, QArraySpec):
      raise TypeError(f"a {self._name()} is mapped with hx.QArraySpec(), got {spec!r}")
    return self._with(shape=(size, *self.shape),
                      sharding=shd.with_partitions(self.sharding, (None, *self._parts())))

  def leading_axis_spec(self) -> QArraySpec:
    return QArraySpec()

  def hx_matchaxis(self, q, size, src, dst, match):
    """An unmapped ``vmap`` output with ``out_axes=QArraySpec()``: ``size`` copies of it."""
    if src is None and isinstance(dst, QArraySpec):
      return broadcast_unmapped(q, size)
    return NotImplemented

  # shard_map
  def _check_pspec(self, spec) -> PartitionSpec:
    if not isinstance(spec, QArrayP):
      raise TypeError(f"a {self._name()} crosses shard_map with hx.QArrayP(P(...)), "
                      f"got {spec!r}{shard_map_spec_hint(spec)}")
    if len(spec.spec) > len(self.shape) - 1:
      raise TypeError(f"hx.QArrayP({spec.spec}) partitions the quantized (last) axis of "
                      f"{self._name()}; only the leading axes may be partitioned")
    if spec.offset != self.format.offset:
      raise TypeError(f"a {self} crosses shard_map with hx.QArrayP(P(...), offset="
                      f"{self.format.offset}) (its format has "
                      f"{'an' if self.format.offset else 'no'} offset component), got {spec!r}")
    return spec.spec

  def shard(self, mesh, manual_axes, check_vma, spec) -> QArrayTy:
    qspec = self._check_pspec(spec)
    qty = self._dense_i8().shard(mesh, manual_axes, check_vma, qspec)
    return self._with(shape=qty.shape, sharding=qty.sharding, mat=qty.mat)

  def unshard(self, mesh, check_vma, spec) -> QArrayTy:
    qspec = self._check_pspec(spec)
    # both components take qspec: what JAX checks for a plain P, for the pair
    shd.check_out_vma(str(self), spec, mesh, check_vma, shd.spec_axes(qspec), self.mat)
    qty = self._dense_i8().unshard(mesh, check_vma, qspec)
    return self._with(shape=qty.shape, sharding=qty.sharding, mat=qty.mat)

  def nospec(self, mesh, check_vma, all_names) -> QArrayP:
    return QArrayP(self._dense_i8().nospec(mesh, check_vma, all_names), self.format.offset)

  # printing
  def str_short(self, short_dtypes=False, mesh_axis_types=False) -> str:
    # an int8 array of the dense shape prints dims, shardings and {V:...} exactly like
    # JAX; the format's prefix replaces i8 and the group size ends the dims (q4[64,128:g32])
    text = self._dense_i8().str_short(True, mesh_axis_types).removeprefix("i8")
    opts = formats.type_options(self.format, self.group)  # :g32, :g32,f16
    if opts:
      text = text.replace("]", f"{opts}]", 1)
    return self.format.prefix + text

  def __repr__(self) -> str:
    return self.str_short()

  def __str__(self) -> str:
    return self.str_short()

  # Pallas: a q8 operand or result of pl.pallas_call (hxmlir.pallas; its methods
  # are added by hx_pallas.register_type below the class)
  def _pallas_layout(self, rank: int | None = None) -> dict:
    # values have every dense axis (pack values per stored entry along the last); the
    # scale every axis but the quantized one (per row: that axis is structural) or all of
    # them, one entry per group; the offset (u4o, q8o) as the scale; a BlockSpec has the
    # array's rank (a block type lacks its squeezed axes)
    if self.format.block:
      raise TypeError(f"{self}: Pallas kernels do not take the block formats "
                      f"({self.format.name}'s values are {self.format.gguf} blocks); "
                      "hx.dequantize it, or use hx.matmul_q / hx.einsum outside the kernel")
    r = len(self.shape) if rank is None else rank
    scale_axes = formats.scale_parts(range(r), self.group)
    # a format with an offset (u4o, q8o): the offsets are blocked exactly like the scale
    extra = 1 if self.format.offset else 0
    return dict(components=(tuple(range(r)),) + (scale_axes,) * (1 + extra),
                divisors=(self.format.pack,) + (self.group or 1,) * (1 + extra),
                structural=tuple(a for a in range(r) if a not in scale_axes), group=self.group,
                pack=self.format.pack)

  def _pallas_block_ty(self, shape) -> QArrayTy:
    return self._with(shape=tuple(shape),
                      sharding=shd.with_partitions(self.sharding, (None,) * len(shape)))

  # JAX's placement APIs (jax.device_put, with_sharding_constraint, jit in/out_shardings)
  def hx_lo_specs(self, spec: PartitionSpec, mesh) -> tuple[PartitionSpec, ...]:
    """The specs of ``(qvalue, scale[, offset])`` for a dense ``spec`` of this ``q8[*lead, n]`` on
    ``mesh``: ``spec`` itself and ``spec`` without the last axis (the rule of
    :meth:`lo_ty`; per group, the group axis sharded like the last). Raises ``TypeError``
    if ``spec`` has more entries than the rank or splits a group or a packed byte
    (whatever the mesh's axis types: Auto axes never reach the type's own check)."""
    shd.dense_spec_entries(self, spec, self.ndim)
    parts = tuple(spec) + (None,) * (self.ndim - len(spec))
    self._check_last_axis_split(parts[-1], dict(mesh.shape))
    vspec, sspec = self._component_specs(spec)
    return (vspec, sspec, sspec) if self.format.offset else (vspec, sspec)

  def _component_specs(self, spec: PartitionSpec) -> tuple[PartitionSpec, PartitionSpec]:
    # the one rule: the values take the dense spec, the scales drop its last entry
    # (per row) or shard their group axis like the last axis (per group)
    parts = tuple(spec) + (None,) * (self.ndim - len(spec))
    return (shd.spec_like(spec, self.format.value_parts(parts)),
            shd.spec_like(spec, formats.scale_parts(parts, self.group)))

  def hx_update_sharding(self, sharding: NamedSharding) -> QArrayTy:
    """This type with dense sharding ``sharding`` (as JAX computed it for the dense array)."""
    shd.dense_spec_entries(self, sharding.spec, self.ndim)
    return self._with(sharding=sharding)


def _typeof_qarray(q: QArray) -> QArrayTy:
  qty, sty = jax.typeof(q.qvalue), jax.typeof(q.scale)
  if q.offset is not None:
    oty = jax.typeof(q.offset)
    if is_hi_level_tracer(q.offset) or any(is_hi_level_tracer(c) for c in q.components):
      raise TypeError("hx.QArray(qvalue, scale, offset) built from traced arrays inside "
                      "jit/grad/vmap/scan; use hx.make_qarray(qvalue, scale, offset) there")
    return _concrete_qarray_type(qty, sty, oty)
  if isinstance(qty, _jax.AbstractRef):  # the components of a q8 ref inside a Pallas kernel
    return QArrayTy(qty.shape, qty.inner_aval.sharding, qty.inner_aval.mat)  # (q8 only)
  if is_hi_level_tracer(q.qvalue) or is_hi_level_tracer(q.scale):
    # JAX asks for the type of a value that is not a tracer (a QArray holding
    # traced components) when traced code hands it to a primitive or returns it:
    # it would become an opaque constant with tracers inside
    raise TypeError(f"hx.QArray(qvalue: {shd.short(qty)}, scale: {shd.short(sty)}) built from "
                    "traced arrays inside jit/grad/vmap/scan; use "
                    "hx.make_qarray(qvalue, scale) there (and hx.qarray_parts(q) to take one "
                    "apart): the QArray constructor is for concrete arrays only")
  return _concrete_qarray_type(qty, sty)


@functools.lru_cache(maxsize=4096)
def _concrete_qarray_type(qty, sty, oty=None) -> QArrayTy:
  # JAX asks for the type of every QArray argument three times per call of a jitted
  # function (its Python dispatch path for hi values); a model's step takes dozens of
  # them, so the type is computed once per set of component types
  if _format_of(qty, sty, oty) is None:
    comps = f"qvalue: {shd.short(qty)}, scale: {shd.short(sty)}" + \
        ("" if oty is None else f", offset: {shd.short(oty)}")
    raise TypeError(f"hx.QArray needs qvalue: i8[*lead, n] and scale: f32[*lead], got {comps} "
                    f"(formats: {formats.components_text('*lead', _dtype_name)})")
  # the scale's sharding and manual axes: make_qarray's rule, so the type agrees
  # with where the components live
  return make_qarray_type(qty, sty, who="hx.QArray", o_aval=oty)


register_hitype(QArray, _typeof_qarray)
refuse_array_api(QArray, QArrayTy, "quantized array",
                 "call hx.matmul_q(x, q) or hx.einsum(spec, x, q) for a product, hx.dequantize(q) "
                 "for the dense f32 array, hx.qarray_parts(q) for its values and scales (and offsets: "
                 f"{', '.join(formats.prefix_names(lambda f: f.offset))})")
hx_pallas.register_type(QArrayTy)


def _check_dense_f32(op: str, aval, min_rank: int) -> None:
  if not isinstance(aval, ShapedArray) or aval.dtype != F32 or aval.ndim < min_rank:
    raise TypeError(f"hx.{op} expects a dense float array of rank >= {min_rank} (f32[..., n]; "
                    f"bf16 and f16 are converted to f32 first, exactly), got "
                    f"{shd.short(aval)}{dense_dtype_hint(aval)}")


def _check_quantized(op: str, aval) -> None:
  if not isinstance(aval, QArrayTy):
    raise TypeError(f"hx.{op} expects a quantized array ({formats.prefixes()}[..., n]), got "
                    f"{shd.short(aval)}")


# --- building and taking apart ------------------------------------------------

def _same_parts(a: tuple, b: tuple) -> bool:
  """Partition entries equal up to spelling (``'i'`` and ``('i',)`` are the same axis)."""
  def norm(p):
    return p[0] if isinstance(p, tuple) and len(p) == 1 else p
  return tuple(map(norm, a)) == tuple(map(norm, b))


def _format_of(q_aval, s_aval, o_aval=None) -> tuple[formats.Format, int | None] | None:
  """``(format, group)`` of components ``qvalue``, ``scale`` and ``offset`` (``None``: a
  format without), by :func:`hxmlir.formats.of_components` and
  :func:`hxmlir.formats.group_of`, or ``None`` when no format has them (dtypes, ranks,
  or a scale's shape that fits no group size)."""
  comps = [c for c in (q_aval, s_aval, o_aval) if c is not None]
  if not all(isinstance(c, ShapedArray) for c in comps) or q_aval.ndim < 1:
    return None
  fmt = formats.of_components(q_aval.dtype, s_aval.dtype, o_aval is not None, q_aval.shape)
  if fmt is None:
    return None
  group = formats.group_of_stored(fmt, q_aval.shape, s_aval.shape)
  return None if isinstance(group, str) else (fmt, group)


def _dtype_name(dtype) -> str:
  return shd.short(ShapedArray((), dtype))[:-2]  # i8[] -> i8: as the messages print types


def make_qarray_type(q_aval, s_aval, who: str = "hx.make_qarray", o_aval=None) -> QArrayTy:
  """Typing rule of ``make_qarray``: ``i8[*l, n], f32[*l] -> q8[*l, n]``; every format's
  components (:mod:`hxmlir.formats`, read by :func:`hxmlir.formats.of_components`):
  ``ui8[*l, n // 2]`` values -> ``q4``, ``f8E4M3FN[*l, n]`` -> ``f8``, a scale
  ``f32[*l, n // g]`` -> groups of ``g``, f16 scales (``int8_f16``, ``int4_f16``:
  ``q8[..:g32,f16]``), offsets ``o_aval`` of the scale's type and sharding (``u4o``: uint4
  pairs ``ui8[*l, n // 2]``, ``q8o``).

  The result is sharded like ``qvalue``; the scale (and offset) must be sharded like
  ``qvalue``'s leading axes (``f32[8@i]`` for ``i8[8@i,3]``; per group, like all of
  ``qvalue``'s axes, :func:`hxmlir.formats.scale_parts`). Inside ``shard_map`` the result
  varies over the manual axes any component varies over. Raises ``TypeError`` naming the
  operand types otherwise, and the formats' components (:func:`hxmlir.formats.components_text`);
  ``who`` names the caller in the message (``hx.QArray`` for the constructor's type).
  """
  comps = [c for c in (q_aval, s_aval, o_aval) if c is not None]
  got = ", ".join(shd.short(c) for c in comps)
  found = _format_of(q_aval, s_aval, o_aval)
  known = formats.components_text("*l", _dtype_name)
  if o_aval is not None:
    if found is None and (not all(isinstance(c, ShapedArray) for c in comps) or
                          formats.of_components(q_aval.dtype, s_aval.dtype, True, q_aval.shape) is None):
      raise TypeError(f"{who}: no quantization format has components {got}; formats: {known}")
    if (o_aval.shape, o_aval.dtype) != (s_aval.shape, s_aval.dtype):
      raise TypeError(f"{who} expects the offset of the scale's type ({shd.short(s_aval)}), "
                      f"got {got}")
    if not _same_parts(shd.partitions(o_aval.sharding, o_aval.ndim),
                       shd.partitions(s_aval.sharding, s_aval.ndim)):
      raise TypeError(f"{who} expects the offset sharded like the scale, got {got}")
  if found is None and (want := _block_components(q_aval)):
    raise TypeError(f"{who}: {got} are not a block format's components: {want}")
  if found is None:
    raise TypeError(f"{who} expects qvalue: i8[*l, n] and scale: f32[*l], got {got}"
                    f"{_components_hint(q_aval, s_aval)} (formats: {known})")
  fmt, group = found
  if fmt.block and shd.partitions(q_aval.sharding, q_aval.ndim)[-1] is not None:
    raise TypeError(f"{who}: {got}: the last axis of {fmt.name}'s values holds each "
                    "block's words and cannot be sharded; shard the blocks' axis (the one "
                    "before it) or a leading axis")
  qp = fmt.dense_parts(shd.partitions(q_aval.sharding, q_aval.ndim))
  sp = shd.partitions(s_aval.sharding, s_aval.ndim)
  want_sp = formats.scale_parts(qp, group)
  sharded = any(p is not None for p in want_sp)
  if not _same_parts(sp, want_sp) or (sharded and s_aval.sharding.mesh != q_aval.sharding.mesh):
    want = ShapedArray(s_aval.shape, s_aval.dtype,
                       sharding=shd.with_partitions(q_aval.sharding, want_sp))
    raise TypeError(f"{who} expects the scale sharded like qvalue's leading axes "
                    f"({shd.short(want)} for {shd.short(q_aval)}), got {got}; reshard the "
                    "scale (jax.sharding.reshard) or the qvalue")
  return QArrayTy(fmt.dense_shape(q_aval.shape), shd.with_partitions(q_aval.sharding, qp),
                  shd.join_mat(*comps), fmt.name, group)


def _block_components(q_aval) -> str:
  """For values ``q_aval`` shaped as GGUF blocks' words (``ui16[*l, n, k/B, W]``), what each
  block format with ``W`` words takes besides them (``d``, and ``dmin``); else ``""``."""
  if not isinstance(q_aval, ShapedArray) or q_aval.ndim < 2:
    return ""
  lead = "f16[" + ",".join(map(str, q_aval.shape[:-1])) + "]"
  return "; ".join(f"{f.name} takes d{' and dmin' if f.offset else ''} {lead}"
                   for f in formats.BLOCK_FORMATS
                   if q_aval.dtype == f.storage_dtype and q_aval.shape[-1] == f.block_words)


def _components_hint(q_aval, s_aval) -> str:
  """The conversion that makes refused components ``q_aval``, ``s_aval`` a format's: integer
  values of another dtype (a Python list, NumPy integers) to int8, a floating scale no
  format has with these values (bf16, f64) to f32."""
  if not (isinstance(q_aval, ShapedArray) and isinstance(s_aval, ShapedArray)):
    return ""
  if formats.of_storage(q_aval.dtype) is None and jnp.issubdtype(q_aval.dtype, jnp.integer):
    return ("; convert the values with .astype(jnp.int8) (a Python list or numpy "
            "integers become int32/int64 arrays)")
  if (formats.of_components(q_aval.dtype, s_aval.dtype, False, q_aval.shape) is None
      and s_aval.dtype != F32 and jnp.issubdtype(s_aval.dtype, jnp.floating)):
    return "; convert the scale with .astype(jnp.float32)"  # a bf16/f64 scale
  return ""



def _parts(q) -> tuple:
  """``hx.qarray_parts(q)`` of a traced ``q`` (the primitive sits one floor up, on this type)."""
  from hxmlir.types.qarray_prims import QArrayParts
  return QArrayParts(jax.typeof(q))(q)
