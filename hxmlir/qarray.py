"""Quantized arrays: ``q8[..., n]``, int8 values with one f32 scale per row.

A :class:`QArray` holds ``qvalue: i8[*lead, n]`` and ``scale: f32[*lead]``
and stands for the dense array ``qvalue * scale[..., None]`` (symmetric
per-row, "per-channel", absmax quantization along the last axis, as in
LLM.int8()'s vector-wise quantization, Dettmers et al. 2022, without the
outlier split). Its JAX type is :class:`QArrayTy`; users build and consume
values only through the primitives :func:`quantize`, :func:`dequantize` and
:func:`matmul_q`, which work under ``jit``, ``grad``, ``vmap``, ``scan``,
explicit sharding and ``shard_map``.

The design follows JAX's guide "Defining new JAX types with hijax", adapted to
JAX 0.10.2 (``VJPHiPrimitive``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.hijax import HiPspec, HiType, ShapedArray, register_hitype
from jax.sharding import NamedSharding, PartitionSpec

from hxmlir import shardings as shd
from hxmlir._jax import ManualAxisType, MappingSpec, empty_mat
from hxmlir.hiprim import (
    HxPrimitive,
    NeedsJitShardMap,
    accumulate,
    broadcast_unmapped,
    instantiate,
    is_linear_operand,
    shard_map_spec_hint,
)

F32 = jnp.dtype("float32")
I8 = jnp.dtype("int8")


@dataclass(frozen=True)
class QArray:
  """A quantized array value: ``qvalue: i8[*lead, n]``, ``scale: f32[*lead]``.

  Represents ``qvalue.astype(f32) * scale[..., None]``. Construct it with
  :func:`quantize`; the constructor itself does no checking and is meant for
  rebuilding values from their components outside traced code (for example
  from a checkpoint). Inside traced code, use the primitives only.
  """
  qvalue: Any
  scale: Any

  @property
  def shape(self) -> tuple[int, ...]:
    """The dense shape ``(*lead, n)``."""
    return tuple(self.qvalue.shape)

  @property
  def dtype(self):
    """The dtype of the dense array represented: ``float32``."""
    return F32

  @property
  def ndim(self) -> int:
    """The dense rank."""
    return len(self.qvalue.shape)

  @property
  def size(self) -> int:
    """The dense element count (``jax.jacfwd`` builds its basis of dense tangents from it)."""
    return int(np.prod(self.shape, dtype=np.int64))


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
  shards the rows of a ``q8[8,3]`` over mesh axis ``i``.
  """
  spec: PartitionSpec = PartitionSpec()

  def to_lo(self) -> tuple[PartitionSpec, PartitionSpec]:
    """Partition specs of ``(qvalue, scale)``: both take ``spec`` for the leading axes."""
    return (self.spec, self.spec)

  def to_tangent_spec(self) -> PartitionSpec:
    """Tangents are dense ``f32`` arrays of the value's shape: partitioned by ``spec``."""
    return self.spec

  def to_ct_spec(self) -> PartitionSpec:
    """Cotangents, like tangents, are dense arrays partitioned by ``spec``."""
    return self.spec


@dataclass(frozen=True)
class QArrayTy(HiType):
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

  def __post_init__(self):
    if len(self.shape) < 1:
      raise TypeError("a quantized array needs at least one axis, got q8[]")

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def dtype(self):
    return F32

  def _parts(self) -> tuple:
    return shd.partitions(self.sharding, len(self.shape))

  def _dims(self) -> str:
    return shd.dims_str(self.shape, shd.partitions(self.sharding, len(self.shape)))

  # lowering to lo types and values
  def lo_ty(self) -> list[ShapedArray]:
    """``[i8[*lead, n], f32[*lead]]`` with the value's and derived scale's shardings."""
    parts = self._parts()
    return [ShapedArray(self.shape, I8, sharding=shd.with_partitions(self.sharding, parts),
                        manual_axis_type=self.mat),
            ShapedArray(self.shape[:-1], F32,
                        sharding=shd.with_partitions(self.sharding, parts[:-1]),
                        manual_axis_type=self.mat)]

  def lower_val(self, q: QArray) -> list:
    return [q.qvalue, q.scale]

  def raise_val(self, qvalue, scale) -> QArray:
    return QArray(qvalue, scale)

  # autodiff
  def to_tangent_aval(self) -> ShapedArray:
    return ShapedArray(self.shape, F32, sharding=self.sharding, manual_axis_type=self.mat)

  def to_ct_aval(self) -> ShapedArray:
    return self.to_tangent_aval().to_ct_aval()

  # vmap / scan
  def dec_rank(self, size, spec) -> QArrayTy:
    if not isinstance(spec, QArraySpec):
      raise TypeError(f"a q8[{self._dims()}] is mapped with hx.QArraySpec(), got {spec!r}")
    if self.shape[0] != size:
      raise ValueError(f"mapped axis of q8[{self._dims()}] has size {self.shape[0]}, "
                       f"but the mapped size is {size}")
    if len(self.shape) < 2:
      raise TypeError(f"cannot map over the only (quantized) axis of q8[{self._dims()}]")
    return QArrayTy(self.shape[1:], shd.with_partitions(self.sharding, self._parts()[1:]),
                    self.mat)

  def inc_rank(self, size, spec) -> QArrayTy:
    if not isinstance(spec, QArraySpec):
      raise TypeError(f"a q8[{self._dims()}] is mapped with hx.QArraySpec(), got {spec!r}")
    return QArrayTy((size, *self.shape),
                    shd.with_partitions(self.sharding, (None, *self._parts())), self.mat)

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
      raise TypeError(f"a q8[{self._dims()}] crosses shard_map with hx.QArrayP(P(...)), "
                      f"got {spec!r}{shard_map_spec_hint(spec)}")
    if len(spec.spec) > len(self.shape) - 1:
      raise TypeError(f"hx.QArrayP({spec.spec}) partitions the quantized (last) axis of "
                      f"q8[{self._dims()}]; only the leading axes may be partitioned")
    return spec.spec

  def shard(self, mesh, manual_axes, check_vma, spec) -> QArrayTy:
    qspec = self._check_pspec(spec)
    qty = self.lo_ty()[0].shard(mesh, manual_axes, check_vma, qspec)
    return QArrayTy(qty.shape, qty.sharding, qty.mat)

  def unshard(self, mesh, check_vma, spec) -> QArrayTy:
    qspec = self._check_pspec(spec)
    qty = self.lo_ty()[0].unshard(mesh, check_vma, qspec)
    return QArrayTy(qty.shape, qty.sharding, qty.mat)

  def nospec(self, mesh, check_vma, all_names) -> QArrayP:
    return QArrayP(self.lo_ty()[0].nospec(mesh, check_vma, all_names))

  # printing
  def str_short(self, short_dtypes=False, mesh_axis_types=False) -> str:
    # the int8 component prints dims, shardings and {V:...} exactly like JAX
    return "q8" + self.lo_ty()[0].str_short(True, mesh_axis_types).removeprefix("i8")

  def __repr__(self) -> str:
    return self.str_short()

  def __str__(self) -> str:
    return self.str_short()


def _typeof_qarray(q: QArray) -> QArrayTy:
  qty, sty = jax.typeof(q.qvalue), jax.typeof(q.scale)
  if (qty.dtype != I8 or sty.dtype != F32 or qty.ndim < 1
      or tuple(sty.shape) != tuple(qty.shape[:-1])):
    raise TypeError("hx.QArray needs qvalue: i8[*lead, n] and scale: f32[*lead], got "
                    f"qvalue: {shd.short(qty)}, scale: {shd.short(sty)}")
  return QArrayTy(tuple(qty.shape), qty.sharding, qty.mat)


register_hitype(QArray, _typeof_qarray)


def _check_dense_f32(op: str, aval, min_rank: int) -> None:
  if not isinstance(aval, ShapedArray) or aval.dtype != F32 or aval.ndim < min_rank:
    want = "f32[..., n]" if min_rank <= 1 else "f32[..., m, k]"
    raise TypeError(f"hx.{op} expects a dense {want} array, got {shd.short(aval)}")


# --- primitives --------------------------------------------------------------

class Quantize(HxPrimitive):
  """``quantize: f32[*lead, n] -> q8[*lead, n]``; see :func:`quantize`."""

  def __init__(self, x_aval):
    _check_dense_f32("quantize", x_aval, 1)
    self.in_avals = (x_aval,)
    self.out_aval = QArrayTy(x_aval.shape, x_aval.sharding, x_aval.mat)
    self.params = {}
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
      return quantize(x), None
    return quantize(jnp.moveaxis(x, d, 0)), QArraySpec()


class Dequantize(HxPrimitive):
  """``dequantize: q8[*lead, n] -> f32[*lead, n]``; see :func:`dequantize`."""

  def __init__(self, q_aval):
    if not isinstance(q_aval, QArrayTy):
      raise TypeError(f"hx.dequantize expects a quantized array q8[..., n], "
                      f"got {shd.short(q_aval)}")
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


def matmul_q_result_type(x_aval, q_aval) -> ShapedArray:
  """Typing rule of ``matmul_q``: ``f32[*b, m, k] @ q8[*b, k, n] -> f32[*b, m, n]``.

  The result's rows are sharded like ``x``'s, its columns like the weight's.
  Raises ``TypeError`` naming both operand types (``f32[2,5] @ q8[3,4]``) on a
  wrong dtype, rank, shape or batch, or when a contraction axis is sharded.
  """
  sig = f"{shd.short(x_aval)} @ {shd.short(q_aval)}"
  if not isinstance(q_aval, QArrayTy):
    raise TypeError(f"hx.matmul_q expects a quantized right operand q8[k, n]: {sig}")
  if not isinstance(x_aval, ShapedArray) or x_aval.dtype != F32:
    raise TypeError(f"hx.matmul_q expects a dense f32 left operand: {sig}")
  if x_aval.ndim < 2 or q_aval.ndim < 2 or x_aval.ndim != q_aval.ndim:
    raise TypeError(f"hx.matmul_q expects f32[*b, m, k] @ q8[*b, k, n] of equal rank >= 2: {sig}")
  if x_aval.shape[:-2] != q_aval.shape[:-2]:
    raise TypeError(f"hx.matmul_q batch dimensions differ: {sig}")
  if x_aval.shape[-1] != q_aval.shape[-2]:
    raise TypeError(f"hx.matmul_q contracting dimensions differ "
                    f"({x_aval.shape[-1]} vs {q_aval.shape[-2]}): {sig}")
  xp = shd.partitions(x_aval.sharding, x_aval.ndim)
  qp = shd.partitions(q_aval.sharding, q_aval.ndim)
  if xp[-1] is not None or qp[-2] is not None:
    raise TypeError(f"hx.matmul_q requires unsharded contraction axes, got {sig}")
  batch = tuple(a if a is not None else b for a, b in zip(xp[:-2], qp[:-2]))
  base = shd.pick_mesh_sharding(x_aval.sharding, q_aval.sharding)
  out_sharding = shd.with_partitions(base, (*batch, xp[-2], qp[-1]))
  return ShapedArray((*x_aval.shape[:-1], q_aval.shape[-1]), F32, sharding=out_sharding,
                     manual_axis_type=shd.join_mat(x_aval, q_aval))


class MatmulQ(HxPrimitive):
  """``matmul_q: f32[*b, m, k] @ q8[*b, k, n] -> f32[*b, m, n]``; see :func:`matmul_q`."""

  def __init__(self, x_aval, q_aval):
    out = matmul_q_result_type(x_aval, q_aval)
    self.in_avals = (x_aval, q_aval)
    self.out_aval = out
    self.params = {}
    super().__init__()

  def vjp_fwd(self, nzs_in, x, qw):
    return self(x, qw), (x, qw)

  def vjp_bwd_retval(self, res, g):
    x, qw = res
    w = dequantize(qw)  # rules are traced code: primitives, not attributes
    x_aval, q_aval = self.in_avals
    # cotangents live where their primals live: pin the sharded contractions
    gx = jnp.matmul(g, jnp.swapaxes(w, -1, -2), out_sharding=x_aval.sharding)
    gw = jnp.matmul(jnp.swapaxes(x, -1, -2), g, out_sharding=q_aval.sharding)
    return shd.match_vma(gx, x_aval), shd.match_vma(gw, q_aval)

  def transpose(self, ct, x, qw):
    # the jvp rule applies matmul_q to tangents of x only (a q8's tangent is dense)
    if is_linear_operand(qw):
      raise NotImplementedError("hx.matmul_q is linear in its dense operand only")
    if is_linear_operand(x) and not isinstance(ct, jax.experimental.hijax.Zero):
      x_aval = self.in_avals[0]
      w = dequantize(qw)
      gx = jnp.matmul(ct, jnp.swapaxes(w, -1, -2), out_sharding=x_aval.sharding)
      accumulate(x, shd.match_vma(gx, x_aval))

  def jvp(self, primals, tangents):
    (x, qw), (dx, dqw) = primals, tangents
    out = self(x, qw)
    zero = jax.experimental.hijax.Zero
    terms = []
    if not isinstance(dx, zero):
      terms.append(matmul_q(dx, qw))
    if not isinstance(dqw, zero):
      terms.append(jnp.matmul(x, dqw, out_sharding=self.out_aval.sharding))
    if not terms:
      return out, instantiate(dx, self.out_aval)
    return out, sum(terms[1:], terms[0])

  def batch(self, axis_data, args, dims):
    (x, qw), (dx, dq) = args, dims
    if dx is None and dq is None:
      return matmul_q(x, qw), None
    if dq is None:
      # only activations are batched: fold the batch into the rows and keep
      # the weight unbatched, so it is read once for the whole batch
      x = jnp.moveaxis(x, dx, -3)
      y = matmul_q(x.reshape(*x.shape[:-3], x.shape[-3] * x.shape[-2], x.shape[-1]), qw)
      b = x.shape[-3]
      y = y.reshape(*y.shape[:-2], b, y.shape[-2] // b, y.shape[-1])
      return y, y.ndim - 3
    if not isinstance(dq, QArraySpec):
      raise TypeError(f"a quantized array is mapped with hx.QArraySpec(), got {dq!r}")
    size = jax.typeof(qw).shape[0]
    if dx is None:
      x = jnp.broadcast_to(x, (size, *x.shape))
    else:
      x = jnp.moveaxis(x, dx, 0)
    return matmul_q(x, qw), 0


# --- user functions ----------------------------------------------------------

def quantize(x) -> QArray:
  """Quantize ``x: f32[*lead, n]`` to ``q8[*lead, n]``, one scale per row.

  ``scale = max(|row|) * f32(1/127)`` and ``qvalue = round_half_even(row / scale)``
  clipped to ``[-127, 127]`` (symmetric absmax quantization along the last
  axis). An all-zero row gets ``scale = 0`` and zero values, so it dequantizes
  to exact zeros; a row holding NaN or +-inf gets ``scale = NaN`` and zero
  values, so it dequantizes to NaN, never to finite garbage. The result keeps
  ``x``'s sharding (``q8[8@i,3]``); the scale drops the last axis, so with a
  sharded last axis (``q8[3,4@j]``) each row's maximum reduces across shards.

  Differentiates as the identity (straight-through estimator). Raises
  ``TypeError`` at trace time unless ``x`` is a float32 array of rank >= 1.
  """
  return Quantize(jax.typeof(x))(x)


def dequantize(q) -> jax.Array:
  """The dense ``f32[*lead, n]`` array ``qvalue * scale[..., None]`` of ``q: q8[*lead, n]``.

  Differentiates as the identity. Raises ``TypeError`` unless ``q`` is a
  quantized array.
  """
  return Dequantize(jax.typeof(q))(q)


def matmul_q(x, qw) -> jax.Array:
  """Dense times quantized matmul: ``f32[*b, m, k] @ q8[*b, k, n] -> f32[*b, m, n]``.

  Equals ``x @ dequantize(qw)``, computed with the per-row scales folded into
  the dense operand (``(x * scale) @ qvalue``), never a dequantized copy of the
  weight. Rows of the result are sharded like ``x``, columns like ``qw``;
  contraction axes must be unsharded. Gradients with respect to both operands
  are dense ``f32`` arrays.

  Raises ``TypeError`` at trace time naming both operand types (for example
  ``f32[2,5] @ q8[3,4]``) on mismatched shapes, ranks, dtypes or a sharded
  contraction axis.
  """
  return MatmulQ(jax.typeof(x), jax.typeof(qw))(x, qw)
