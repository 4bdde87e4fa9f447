"""Quantized arrays: ``q8[..., n]``, ``q4[..., n:g32]``, ``f8[..., n]``: one type family.

A :class:`QArray` holds ``qvalue: i8[*lead, n]`` and ``scale: f32[*lead]``
and stands for the dense array ``qvalue * scale[..., None]`` (symmetric
per-row, "per-channel", absmax quantization along the last axis, as in
LLM.int8()'s vector-wise quantization, Dettmers et al. 2022, without the
outlier split). Other formats (:mod:`hxmlir.formats`): int4 values stored two per
byte (``q4``), float8 e4m3fn values (``f8``), and one scale per group of ``g``
elements of the last axis (``q4[64,128:g32]``). Its JAX type is :class:`QArrayTy`; users build and consume
values only through the primitives :func:`quantize`, :func:`dequantize`,
:func:`matmul_q`, and :func:`make_qarray`/:func:`qarray_parts` (from and to
the components), which work under ``jit``, ``grad``, ``vmap``, ``scan``,
explicit sharding and ``shard_map``.

The design follows JAX's guide "Defining new JAX types with hijax", adapted to
JAX 0.10.2 (``VJPHiPrimitive``).
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
  Zero,
  aval_property,
  register_hitype,
)
from jax.sharding import NamedSharding, PartitionSpec

from hxmlir import _jax, formats
from hxmlir import pallas as hx_pallas
from hxmlir._jax import ManualAxisType, MappingSpec, empty_mat, is_hi_level_tracer
from hxmlir.types import dotdims, matmul_q_typing
from hxmlir.types import shardings as shd
from hxmlir.types.hiprim import (
  DenseValue,
  DenseValuedType,
  HxPrimitive,
  NeedsJitShardMap,
  accumulate,
  broadcast_unmapped,
  instantiate,
  is_linear_operand,
  refuse_array_api,
  shard_map_spec_hint,
  value_refusals,
  zeros,
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
  qvalue = aval_property(lambda q: qarray_parts(q)[0])
  scale = aval_property(lambda q: qarray_parts(q)[1])

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
      raise TypeError(f"a {self} is mapped with hx.QArraySpec(), got {spec!r}")
    if self.shape[0] != size:
      raise ValueError(f"mapped axis of {self} has size {self.shape[0]}, "
                       f"but the mapped size is {size}")
    if len(self.shape) < 2:
      raise TypeError(f"cannot map over the only (quantized) axis of {self}")
    return self._with(shape=self.shape[1:],
                      sharding=shd.with_partitions(self.sharding, self._parts()[1:]))

  def inc_rank(self, size, spec) -> QArrayTy:
    if not isinstance(spec, QArraySpec):
      raise TypeError(f"a {self} is mapped with hx.QArraySpec(), got {spec!r}")
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
      raise TypeError(f"a {self} crosses shard_map with hx.QArrayP(P(...)), "
                      f"got {spec!r}{shard_map_spec_hint(spec)}")
    if len(spec.spec) > len(self.shape) - 1:
      raise TypeError(f"hx.QArrayP({spec.spec}) partitions the quantized (last) axis of "
                      f"{self}; only the leading axes may be partitioned")
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


# --- primitives --------------------------------------------------------------

class Quantize(HxPrimitive):
  """``quantize: f32[*lead, n] -> q8[*lead, n]``; see :func:`quantize`."""

  def __init__(self, x_aval, fmt: str = "int8", group_size: int | None = None,
               method: str = "absmax"):
    _check_dense_f32("quantize", x_aval, 1)
    if method not in formats.METHODS:
      raise ValueError(f"hx.quantize: method must be one of {formats.METHODS}, got {method!r}")
    why = formats.check_method(formats.lookup(fmt), method)
    if why:
      raise TypeError(f"hx.quantize({shd.short(x_aval)}, dtype={fmt!r}): {why}")
    self.in_avals = (x_aval,)
    try:
      self.out_aval = QArrayTy(x_aval.shape, x_aval.sharding, x_aval.mat, fmt, group_size)
    except TypeError as e:
      raise TypeError(f"hx.quantize({shd.short(x_aval)}): {e}") from None
    # the type's group: a NumPy integer becomes a Python int (JAX's caches key on params)
    self.params = {"fmt": fmt, "group_size": self.out_aval.group, "method": method}
    super().__init__()

  # straight-through estimator: the derivative of quantize is the identity
  def vjp_fwd(self, nzs_in, x):
    return self(x), None

  def vjp_bwd_retval(self, _res, g):
    return (g,)

  def jvp(self, primals, tangents):
    (x,), (dx,) = primals, tangents
    return self(x), instantiate(dx, self.in_avals[0])

  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    if d is None:
      return self(x), None
    x = jnp.moveaxis(x, d, 0)
    return Quantize(jax.typeof(x), **self.params)(x), QArraySpec()


class Dequantize(HxPrimitive):
  """``dequantize: q8[*lead, n] -> f32[*lead, n]``; see :func:`dequantize`."""

  def __init__(self, q_aval):
    _check_quantized("dequantize", q_aval)
    self.in_avals = (q_aval,)
    self.out_aval = ShapedArray(q_aval.shape, F32, sharding=q_aval.sharding,
                                manual_axis_type=q_aval.mat)
    self.params = {}
    super().__init__()

  def vjp_fwd(self, nzs_in, q):
    return self(q), None

  def vjp_bwd_retval(self, _res, g):
    return (g,)

  def jvp(self, primals, tangents):
    (q,), (dq,) = primals, tangents
    return self(q), instantiate(dq, self.in_avals[0].to_tangent_aval())

  def batch(self, axis_data, args, dims):
    (q,), (d,) = args, dims
    if d is None:
      return dequantize(q), None
    if not isinstance(d, QArraySpec):
      raise TypeError(f"a quantized array is mapped with hx.QArraySpec(), got {d!r}")
    return dequantize(q), 0


def matmul_q_result_type(x_aval, q_aval, dimension_numbers=None, *, who: str | None = None,
                         sig: str | None = None) -> ShapedArray:
  """Typing rule of ``matmul_q``: ``lax.dot_general(x, dequantize(q), dimension_numbers)``.

  The shapes and dtypes are :func:`hxmlir.types.matmul_q_typing.result_type`'s (the rule the
  lo primitive and the composite schema ask too); the shardings are checked here.

  ``dimension_numbers`` default (:func:`hxmlir.types.dotdims.matmul_dims`):
  ``f32[..., k] @ q8[k, n] -> f32[..., n]`` (any number of leading dims) and
  ``f32[*b, m, k] @ q8[*b, k, n] -> f32[*b, m, n]`` (equal ranks). The result has
  ``dot_general``'s layout and sharding: batch dims like ``x``'s (else ``q``'s), ``x``'s
  free dims like ``x``, ``q``'s free dims like ``q``. ``who``/``sig`` name the caller
  and the operands in messages (``hx.einsum`` passes its subscripts). Raises
  ``TypeError`` naming both operand types (``f32[2,5] @ q8[3,4]``) on a wrong dtype,
  rank, shape or batch, dims the scales cannot be folded through, or a sharded
  contraction axis.
  """
  who = who or "hx.matmul_q"
  sig = sig or f"{shd.short(x_aval)} @ {shd.short(q_aval)}"
  if not isinstance(q_aval, QArrayTy):
    raise TypeError(f"{who} expects a quantized right operand q8[k, n]: {sig}")
  try:  # the rule of the types (:mod:`hxmlir.types.matmul_q_typing`), then the shardings
    dims, shape, dtype = matmul_q_typing.result_type(
        getattr(x_aval, "shape", ()), matmul_q_typing.dense_dtype(x_aval), q_aval.shape,
        q_aval.group is not None, dimension_numbers, operands=sig,
        dtype_hint=dense_dtype_hint(x_aval))
  except matmul_q_typing.MatmulQTypeError as e:
    raise TypeError(e.for_caller(who)) from None
  xp = shd.partitions(x_aval.sharding, x_aval.ndim)
  qp = shd.partitions(q_aval.sharding, q_aval.ndim)
  if dotdims.sharded_contraction(xp, qp, dims):
    raise TypeError(f"{who} requires unsharded contraction axes, got {sig}: on Explicit "
                    "mesh axes the result's sharding would be ambiguous (as for JAX's dot); "
                    "reshard an operand (jax.sharding.reshard), or use Auto axes, where "
                    "each shard's partial sum is all-reduced")
  parts = dotdims.result_parts(xp, qp, dims)
  axes = [a for p in parts if p for a in ((p,) if isinstance(p, str) else p)]
  twice = sorted({a for a in axes if axes.count(a) > 1})
  if twice:
    raise TypeError(f"{who}: {sig}: the result would be sharded over mesh axis "
                    f"{', '.join(map(repr, twice))} twice; reshard one operand "
                    "(jax.sharding.reshard)")
  out_sharding = shd.with_partitions(shd.pick_mesh_sharding(x_aval.sharding, q_aval.sharding),
                                     parts)
  return ShapedArray(shape, dtype, sharding=out_sharding,
                     manual_axis_type=shd.join_mat(x_aval, q_aval))


def _dot(x, w, dims, sharding):
  """``lax.dot_general(x, w, dims)`` in f32, placed ``sharding`` (explicit mode)."""
  return jax.lax.dot_general(x, w, dims, preferred_element_type=F32,
                             out_sharding=shd.out_sharding(sharding))


def _dot_transpose(g, y, dims, x_aval, swap_ans: bool):
  """``dot_general(x, y, dims)``'s transpose in ``x`` at ``g`` (``dotdims.transpose_lhs``),
  computed and placed like ``x_aval`` (``swap_ans``: ``x`` was the right operand)."""
  dims2, order = dotdims.transpose_lhs(dims, x_aval.ndim, y.ndim, swap_ans)
  parts = shd.partitions(x_aval.sharding, x_aval.ndim)
  t = _dot(g, y, dims2, shd.with_partitions(x_aval.sharding, [parts[d] for d in order]))
  perm = tuple(sorted(range(len(order)), key=order.__getitem__))
  return t if perm == tuple(range(len(perm))) else jnp.transpose(t, perm)


class MatmulQ(HxPrimitive):
  """``matmul_q: dot_general(f32[...], q8[..., n], dimension_numbers)``; see :func:`matmul_q`
  and :func:`hxmlir.types.einsum.einsum`. ``params``: ``dimension_numbers`` (``lax.dot_general``'s,
  tuples), the lo primitive's."""

  def __init__(self, x_aval, q_aval, dimension_numbers=None, *, who=None, sig=None):
    if dimension_numbers is not None:
      dimension_numbers = dotdims.normalize(dimension_numbers)
    out = matmul_q_result_type(x_aval, q_aval, dimension_numbers, who=who, sig=sig)
    self.in_avals = (x_aval, q_aval)
    self.out_aval = out
    self.params = {"dimension_numbers": dimension_numbers
                   or dotdims.matmul_dims(x_aval.ndim, q_aval.ndim)}
    super().__init__()

  @property
  def dims(self):
    return self.params["dimension_numbers"]

  def _apply(self, x, qw):
    return MatmulQ(jax.typeof(x), jax.typeof(qw), self.dims)(x, qw)

  def vjp_fwd(self, nzs_in, x, qw):
    return self(x, qw), (x, qw)

  def vjp_bwd_retval(self, res, g):
    x, qw = res
    q_aval = self.in_avals[1]
    # the weight's cotangent is dense (straight-through); both are placed where
    # their primals live
    gw = _dot_transpose(g, x.astype(F32), dotdims.swapped(self.dims), q_aval.to_tangent_aval(),
                        True)
    return self._x_cotangent(g, qw), shd.match_vma(gw, q_aval)

  def _x_cotangent(self, g, qw):
    """The transpose of ``x -> dot_general(x, dequantize(qw))`` at ``g``, placed and varying
    like ``x`` (rules are traced code: primitives, not attributes)."""
    x_aval = self.in_avals[0]
    gx = _dot_transpose(g, dequantize(qw), self.dims, x_aval, False)
    return shd.match_vma(gx.astype(x_aval.dtype), x_aval)  # a bf16 x: a bf16 cotangent

  def transpose(self, ct, x, qw):
    # the jvp rule applies matmul_q to tangents of x only (a q8's tangent is dense)
    if is_linear_operand(qw):
      raise NotImplementedError("hx.matmul_q is linear in its dense operand only")
    if is_linear_operand(x) and not isinstance(ct, jax.experimental.hijax.Zero):
      accumulate(x, self._x_cotangent(ct, qw))

  def jvp(self, primals, tangents):
    (x, qw), (dx, dqw) = primals, tangents
    out = self(x, qw)
    zero = jax.experimental.hijax.Zero
    terms = []
    if not isinstance(dx, zero):
      terms.append(self._apply(dx, qw))
    if not isinstance(dqw, zero):
      terms.append(_dot(x.astype(F32), dqw, self.dims, self.out_aval.sharding))
    if not terms:
      return out, instantiate(dx, self.out_aval)
    return out, sum(terms[1:], terms[0])

  def batch(self, axis_data, args, dims):
    # one op, never a loop: the mapped axis becomes a batch or free dim of the
    # dot_general (dotdims.batched's rule, as for the lo primitive)
    (x, qw), (dx, dq) = args, dims
    if dx is None and dq is None:
      return self._apply(x, qw), None
    if dq is not None and not isinstance(dq, QArraySpec):
      raise TypeError(f"a quantized array is mapped with hx.QArraySpec(), got {dq!r}")
    x_aval, q_aval = self.in_avals
    new = dotdims.batched(self.dims, x_aval.ndim, q_aval.ndim, dx is not None, dq is not None)
    if new is None:  # only q mapped, and the scales need x mapped too
      x, dx = jnp.broadcast_to(x, (axis_data.size, *x.shape)), 0
      new = dotdims.batched(self.dims, x_aval.ndim, q_aval.ndim, True, True)
    elif dx is not None:
      x = jnp.moveaxis(x, dx, 0)
    dims2, out = new
    return MatmulQ(jax.typeof(x), jax.typeof(qw), dims2)(x, qw), out


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
  group = formats.group_of(fmt.dense_shape(q_aval.shape), s_aval.shape)
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


class MakeQArray(HxPrimitive):
  """``make_qarray: i8[*l, n], f32[*l] -> q8[*l, n]``; see :func:`make_qarray`. A format
  with an offset takes a third operand, the offsets (``x = q * s + o``)."""

  def __init__(self, q_aval, s_aval, o_aval=None):
    self.out_aval = make_qarray_type(q_aval, s_aval, o_aval=o_aval)
    self.in_avals = (q_aval, s_aval) if o_aval is None else (q_aval, s_aval, o_aval)
    self.params = {}
    super().__init__()

  def _values(self, qvalue):
    return formats.values_f32(qvalue, self.out_aval.format)

  # the result is qvalue * scale[..., None] (+ offset[..., None]): linear in the scale
  # and the offset, and the integer values carry no tangent (float0, as for every
  # integer array in JAX)
  def jvp(self, primals, tangents):
    (qvalue, *rest), (_, dscale, *doff) = primals, tangents
    t_aval = self.out_aval.to_tangent_aval()
    out = self(qvalue, *rest)
    terms = []
    if not isinstance(dscale, Zero):
      terms.append(formats.apply_scale(self._values(qvalue), dscale.astype(F32)))
    if doff and not isinstance(doff[0], Zero):
      base = terms.pop() if terms else jnp.zeros(t_aval.shape, F32)
      terms.append(formats.apply_offset(base, doff[0].astype(F32)))
    return out, (terms[0] if terms else zeros(t_aval))

  def vjp_fwd(self, nzs_in, qvalue, *rest):
    return self(qvalue, *rest), qvalue

  def vjp_bwd_retval(self, qvalue, g):
    q_aval, *sc_avals = self.in_avals
    if isinstance(g, Zero):
      return (Zero(q_aval.to_ct_aval()), *(Zero(a.to_ct_aval()) for a in sc_avals))
    group = self.out_aval.group
    cts = [formats.sum_per_scale(g * self._values(qvalue), group)]
    if len(sc_avals) == 2:  # the offset's cotangent: the sum over its row or group
      cts.append(formats.sum_per_scale(g, group))
    return (Zero(q_aval.to_ct_aval()),
            *(shd.match_vma(ct.astype(a.dtype), a) for ct, a in zip(cts, sc_avals)))

  def batch(self, axis_data, args, dims):
    if all(d is None for d in dims):
      return make_qarray(*args), None
    size = axis_data.size
    def lead(x, d):
      return jnp.moveaxis(x, d, 0) if d is not None else jnp.broadcast_to(x, (size, *x.shape))
    return make_qarray(*(lead(a, d) for a, d in zip(args, dims))), QArraySpec()


def scale_tangent_weights(qvalue, group: int | None = None, fmt=None) -> jax.Array:
  """``w: f32[*l, n]`` with ``d(scale) = sum(w * dX, -1)`` for ``qarray_parts`` (per group of
  ``group`` elements when given: the sum runs over each group, as everything below).

  The scale's tangent is read where the dequantized value is most precise, at
  the elements of largest ``|qvalue|`` in each row: ``dX_j / qvalue_j``
  averaged over those ``j`` (one for a row from :func:`quantize` unless
  several values round to +-127). A row of zeros, and every row of an empty
  quantized axis (``n = 0``), gets ``w = 0``.
  """
  qf = formats.split_groups(formats.values_f32(qvalue, fmt), group)
  a = jnp.abs(qf)
  top = jnp.max(a, axis=-1, keepdims=True, initial=0)  # initial: n = 0 has no maximum
  at_top = (a == top) & (top > 0)
  count = jnp.sum(at_top, axis=-1, keepdims=True).astype(F32)
  w = jnp.where(at_top, 1 / jnp.where(at_top, qf * count, 1), 0)
  return formats.merge_groups(w, group)


class QArrayParts(HxPrimitive):
  """``qarray_parts: q8[*l, n] -> (i8[*l, n], f32[*l])``; see :func:`qarray_parts`."""

  def __init__(self, q_aval):
    _check_quantized("qarray_parts", q_aval)
    self.in_avals = (q_aval,)
    self.out_aval = tuple(q_aval.lo_ty())
    self.params = {}
    super().__init__()

  def _tangents(self, qvalue, dq):
    # a format with an offset: the offset's tangent is zero (the scale's is read as
    # below, from the signed or unsigned values)
    q_ty, s_ty, *o_ty = self.out_aval
    if isinstance(dq, Zero):
      return (Zero(q_ty.to_tangent_aval()), *(Zero(t.to_tangent_aval()) for t in (s_ty, *o_ty)))
    group = self.in_avals[0].group
    weights = scale_tangent_weights(qvalue, group, self.in_avals[0].format)
    ds = formats.sum_per_scale(weights * dq, group).astype(s_ty.dtype)
    return (Zero(q_ty.to_tangent_aval()), ds, *(Zero(t.to_tangent_aval()) for t in o_ty))

  def jvp(self, primals, tangents):
    (q,), (dq,) = primals, tangents
    parts = self(q)
    return parts, self._tangents(parts[0], dq)

  def vjp_fwd(self, nzs_in, q):
    parts = self(q)
    return parts, parts[0]

  def vjp_bwd_retval(self, qvalue, g):
    q_aval = self.in_avals[0]
    _, gs, *_ = g
    if isinstance(gs, Zero):
      return (Zero(q_aval.to_ct_aval()),)
    group = q_aval.group
    gq = formats.apply_scale(scale_tangent_weights(qvalue, group, q_aval.format),
                             gs.astype(F32))
    return (shd.match_vma(gq, q_aval),)

  def batch(self, axis_data, args, dims):
    (q,), (d,) = args, dims
    n = len(self.out_aval)
    if d is None:
      return qarray_parts(q), (None,) * n
    if not isinstance(d, QArraySpec):
      raise TypeError(f"a quantized array is mapped with hx.QArraySpec(), got {d!r}")
    return qarray_parts(q), (0,) * n


# --- user functions ----------------------------------------------------------

def quantize(x, dtype=jnp.int8, *, group_size: int | None = None,
             method: str = "absmax") -> QArray:
  """Quantize ``x: f32[*lead, n]`` to ``q8[*lead, n]``, one scale per row.

  ``scale = max(|row|) * f32(1/127)`` and ``qvalue = round_half_even(row / scale)``
  clipped to ``[-127, 127]`` (symmetric absmax quantization along the last
  axis).

  Formats (:mod:`hxmlir.formats`, which cites the choices): ``dtype=jnp.int4`` gives
  ``q4[*lead, n]`` (values in [-7, 7], ``scale = amax / 7``, stored two per byte:
  ``n`` even), ``dtype=jnp.float8_e4m3fn`` gives ``f8[*lead, n]`` (``scale = amax /
  448``, values cast round-to-nearest-even). ``group_size=g``: one scale per ``g``
  consecutive elements of the last axis (scale ``f32[*lead, n // g]``, type
  ``q4[*lead, n:g32]``). ``method="mse"``: per scale, the clipping ratio in [0.5, 1]
  (20 tried) with the least squared quantization error
  (:func:`hxmlir.lowering.reference.quantize` says why and what it costs). An all-zero row gets ``scale = 0`` and zero values, so it dequantizes
  to exact zeros; a row holding NaN or +-inf gets ``scale = NaN`` and zero
  values, so it dequantizes to NaN, never to finite garbage. The result keeps
  ``x``'s sharding (``q8[8@i,3]``); the scale drops the last axis, so with a
  sharded last axis (``q8[3,4@j]``) each row's maximum reduces across shards.

  ``bfloat16`` and ``float16`` weights (most checkpoints) are converted to f32 first,
  which is exact. Differentiates as the identity (straight-through estimator). Raises
  ``TypeError`` at trace time unless ``x`` is such a float array of rank >= 1, for an
  unknown ``dtype``, when ``g`` does not divide ``n`` (naming the type,
  ``q4[64,100:g32]``), when an int4 ``n`` or ``g`` is odd, or when a sharded last axis
  would split a group (naming the type, the mesh axis and its size); ``ValueError`` for
  an unknown ``method``.
  """
  fmt = formats.lookup(dtype)
  if getattr(x, "dtype", None) in _WIDENED:  # a bf16/f16 checkpoint: f32 holds it exactly
    x = x.astype(F32)
  return Quantize(jax.typeof(x), fmt.name, group_size, method)(x)


_WIDENED = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
"""Weight dtypes :func:`quantize` converts to f32 first (exact: f32 holds every value)."""


def dequantize(q) -> jax.Array:
  """The dense ``f32[*lead, n]`` array ``qvalue * scale[..., None]`` of ``q: q8[*lead, n]``.

  Differentiates as the identity. Raises ``TypeError`` unless ``q`` is a
  quantized array.
  """
  return Dequantize(jax.typeof(q))(q)


def matmul_q(x, qw) -> jax.Array:
  """Dense times quantized matmul: ``f32[..., k] @ q8[k, n] -> f32[..., n]`` (any number of
  leading dims: ``f32[b, s, d] @ q8[d, f]``), or ``f32[*b, m, k] @ q8[*b, k, n] ->
  f32[*b, m, n]`` with batched weights of equal rank.

  ``x`` may be ``bf16`` or ``f16`` (activations,
  :data:`~hxmlir.types.matmul_q_typing.DENSE_DTYPES`): it is converted to
  f32 (exactly) inside the op, which accumulates in f32 and returns what JAX's dot of
  ``x`` with the dequantized f32 weight returns
  (:func:`~hxmlir.types.matmul_q_typing.matmul_q_dtype`: ``f32``); its
  cotangent has ``x``'s dtype.

  Equals ``x @ dequantize(qw)``, computed with the per-row scales folded into
  the dense operand (``(x * scale) @ qvalue``), never a dequantized copy of the
  weight. The result's leading dims are sharded like ``x``'s, its columns like
  ``qw``'s. A contraction axis sharded over Auto mesh axes (``jax.jit(...,
  in_shardings=...)``, a row-parallel layer) gives each shard's partial sum, which the
  partitioner all-reduces, as for a dense dot; on Explicit axes it is a ``TypeError``.
  Gradients with respect to both operands are dense: ``x``'s of ``x``'s dtype, the
  weight's ``f32``. Other layouts (``[out, in]`` weights, stacked
  weights, several contracted axes): :func:`hxmlir.types.einsum`.

  Raises ``TypeError`` at trace time naming both operand types (for example
  ``f32[2,5] @ q8[3,4]``) on mismatched shapes, ranks, dtypes or a sharded
  contraction axis.
  """
  return MatmulQ(jax.typeof(x), jax.typeof(qw))(x, qw)


def make_qarray(qvalue, scale, offset=None) -> QArray:
  """The quantized array ``q8[*l, n]`` with components ``qvalue: i8[*l, n]``, ``scale: f32[*l]``.

  ``offset`` (the scale's type, f32 or f16; formats of :mod:`hxmlir.formats` with an
  offset, ``u4o``: ``qvalue: ui8[*l, n // 2]`` uint4 pairs) makes
  ``qvalue * scale + offset``; f16 scales make ``q8[*l, n:g32,f16]`` and the like
  (GGUF's blocks, :mod:`hxmlir.gguf`).

  Stands for ``qvalue * scale[..., None]``; nothing is computed or checked
  beyond the types (the values are taken as they are, ``-128`` included). Use it
  wherever the components are JAX values -- inside ``jit``, ``grad``, ``vmap``,
  ``scan``, ``shard_map`` (for example weights kept as separate int8 and f32
  arrays in a checkpoint). The result is sharded like ``qvalue``; ``scale`` must
  be sharded like ``qvalue``'s leading axes. A weakly typed scale (a Python
  ``float`` or ``int``, also under ``jax_enable_x64``) becomes ``f32``; a
  strongly typed one must already be ``f32``, or ``f16`` for the formats with f16 scales
  (``bf16``, ``f64`` arrays are a ``TypeError``: convert them explicitly).

  Differentiable in ``scale``: the tangent is the dense ``f32`` array
  ``qvalue * d(scale)[..., None]`` and the cotangent of ``scale`` is
  ``sum(ct * qvalue, -1)``. ``qvalue`` is integer: no tangent, a zero ``float0``
  cotangent. Raises ``TypeError`` naming both operand types on wrong dtypes,
  shapes or shardings.
  """
  qvalue, scale = _lo_operand(qvalue), _lo_operand(scale)
  s_aval = jax.typeof(scale)
  if (isinstance(s_aval, ShapedArray) and s_aval.weak_type
      and (jnp.issubdtype(s_aval.dtype, jnp.floating)
           or jnp.issubdtype(s_aval.dtype, jnp.integer))):
    # a Python float or int (weakly typed: f32, or f64 under jax_enable_x64, or i32/i64)
    # takes the scale's dtype, as it would in arithmetic with an f32 array
    scale = jax.lax.convert_element_type(scale, F32)
  if offset is not None:
    offset = _lo_operand(offset)
    o_aval = jax.typeof(offset)
    if isinstance(o_aval, ShapedArray) and o_aval.weak_type:
      offset = jax.lax.convert_element_type(offset, jax.typeof(scale).dtype)
    return MakeQArray(jax.typeof(qvalue), jax.typeof(scale), jax.typeof(offset))(
        qvalue, scale, offset)
  return MakeQArray(jax.typeof(qvalue), jax.typeof(scale))(qvalue, scale)


def qarray_parts(q) -> tuple[jax.Array, ...]:
  """The components ``(qvalue: i8[*l, n], scale: f32[*l])`` of ``q: q8[*l, n]``; a format
  with an offset (``u4o``) has three, ``(qvalue, scale, offset)``, and the offset's
  tangent is zero.

  The inverse of :func:`make_qarray` (bit for bit both ways). Under ``vmap``
  both components are mapped along axis 0; shardings are those of ``q``'s
  components.

  Gradients: ``qvalue`` is integer and has none. The tangent of ``q`` is a
  dense ``f32`` array ``dX`` (of the value ``qvalue * scale``) with no unique
  split into a scale tangent, so ``qvalue`` is held fixed and the scale's
  tangent is read at the elements of largest ``|qvalue|`` in each row:
  ``d(scale) = dX_j / qvalue_j`` averaged over those ``j``; ``0`` for a row of
  zeros and for an empty quantized axis (``n = 0``). Consequences:

  * ``qarray_parts(make_qarray(qvalue, s))`` differentiates as the identity in
    ``s``, except in rows where ``qvalue`` is all zeros: such a row's scale has
    no effect on the value, so its tangent is ``0``.
  * ``qarray_parts(quantize(x))``'s scale (``quantize`` is straight-through)
    has the derivative of ``max(|x|) / 127`` only in rows where exactly one
    element quantizes to +-127. Where several do, the derivative is shared
    between them: ``x = [[1.0, 0.998, 0.1]]`` quantizes to ``[[127, 127, 13]]``
    and gets ``[[1/254, 1/254, 0]]``, not ``[[1/127, 0, 0]]``.

  The cotangent of ``q`` is that read-out's transpose: ``ct_scale /
  (qvalue_j * count)`` at the ``count`` largest elements, zero elsewhere.
  Raises ``TypeError`` unless ``q`` is a quantized array.
  """
  return QArrayParts(jax.typeof(q))(q)


def _lo_operand(x):
  """``x`` as a JAX value: arrays and tracers unchanged, numpy and Python values converted."""
  try:
    ty = jax.typeof(x)
  except TypeError:
    return jnp.asarray(x)
  return x if isinstance(ty, HiType) or isinstance(x, (jax.Array, jax.core.Tracer)) \
      else jnp.asarray(x)
