"""Tuples as one JAX value: ``Tup{f32[3],f32[]}``, elements of any JAX type.

A :class:`HiTup` is built with :func:`make_tup` and read with
:func:`get_tuple_element` (static index). Elements may be arrays or other hi
values (quantized arrays, rank-1 matrices, tuples); every method of
:class:`TupTy` delegates to the element types, so shardings, tangents and
mapping specs come from them. Tuples exist only in the hi jaxpr: they lower to
their elements and leave no composite in the IR.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.hijax import HiPspec, HiType, Zero, register_hitype
from jax.sharding import PartitionSpec

from hxmlir import pallas as hx_pallas
from hxmlir._jax import MappingSpec, mapped_aval, typematch, unmapped_aval
from hxmlir.types import shardings as shd
from hxmlir.types.hiprim import (
  HxPrimitive,
  NeedsJitShardMap,
  accumulate,
  instantiate,
  is_hi,
  is_linear_operand,
  lo_types,
  refuse_array_api,
  shard_map_spec_hint,
  value_refusals,
  zeros,
)


@dataclass(frozen=True)
class HiTup:
  """A tuple value; ``elts`` are JAX values (arrays or hi values).

  ``ty``: its ``TupTy`` when it was built as a value of a given type (by
  ``raise_val`` or ``make_tup`` lowered); else the elements' types. The two
  differ only as JAX's AD lets a cotangent's type differ from its primal's
  (``typematch``), and the tuple keeps the type AD expects.
  """
  elts: tuple
  ty: Any = field(default=None, compare=False, repr=False)

  def __len__(self) -> int:
    return len(self.elts)

  # not an array: np.asarray(t), t1 == t2, hash(t), bool(t) raise TypeError
  __array__, __eq__, __ne__, __hash__, __bool__ = value_refusals(
      "hx.get_tuple_element(t, i) for each element")


@dataclass(frozen=True)
class TupSpec(MappingSpec):
  """``vmap`` mapping spec of a tuple: one entry per element.

  Each entry is what that element would take in ``in_axes``/``out_axes``:
  ``None`` (unmapped), an int axis for an array, or a hi spec
  (``hx.QArraySpec()``, another ``TupSpec``) for a hi element.
  """
  val: tuple


@dataclass(frozen=True)
class TupP(NeedsJitShardMap, HiPspec):
  """``shard_map`` partition spec of a tuple: one spec per element
  (``P(...)`` for arrays, ``hx.QArrayP``/``hx.TupP`` for hi elements)."""
  specs: tuple

  def to_lo(self) -> tuple[PartitionSpec, ...]:
    return tuple(lo for s in self.specs
                 for lo in (s.to_lo() if isinstance(s, HiPspec) else (s,)))

  def to_tangent_spec(self) -> TupP:
    return TupP(tuple(s.to_tangent_spec() if isinstance(s, HiPspec) else s for s in self.specs))

  def to_ct_spec(self) -> TupP:
    return TupP(tuple(s.to_ct_spec() if isinstance(s, HiPspec) else s for s in self.specs))


@dataclass(frozen=True)
class TupTy(HiType):
  """The type ``Tup{t0,t1,...}`` of a tuple whose element types are ``tys``.

  The tangent type is the tuple of the elements' tangent types.
  """
  tys: tuple

  def lo_ty(self) -> list:
    return [lo for ty in self.tys for lo in lo_types(ty)]

  @staticmethod
  def _len(t) -> int:
    """``len(t)`` of a traced tuple: its element count, as for a ``HiTup`` value."""
    return len(t.aval.tys)

  @property
  def mat(self):
    """The manual axes any element varies over (JAX reads ``mat`` off every
    ``shard_map`` output given a plain ``P``, before the type sees the spec)."""
    return shd.join_mat(*self.tys)

  # type equality up to weak types, as for arrays (``core.typematch``)
  def normalize(self) -> TupTy:
    return TupTy(tuple(ty.normalize() for ty in self.tys))

  def strip_weak_type(self) -> TupTy:
    return self.normalize()

  def lower_val(self, tup: HiTup) -> list:
    return [lo for ty, e in zip(self.tys, tup.elts)
            for lo in (ty.lower_val(e) if is_hi(ty) else [e])]

  def raise_val(self, *los) -> HiTup:
    it = iter(los)
    elts = []
    for ty in self.tys:
      if is_hi(ty):
        elts.append(ty.raise_val(*itertools.islice(it, len(ty.lo_ty()))))
      else:
        elts.append(next(it))
    # JAX also raises values of another rank than self (scan stacks ys): the tuple then
    # takes its elements' types
    fits = all(typematch(jax.typeof(e), t) for e, t in zip(elts, self.tys))
    return HiTup(tuple(elts), self if fits else None)

  # autodiff: a tuple of tangents is itself a (hi) vector space
  def to_tangent_aval(self) -> TupTy:
    return TupTy(tuple(ty.to_tangent_aval() for ty in self.tys))

  def vspace_zero(self) -> HiTup:
    return _make_tup_as(self, [zeros(ty) for ty in self.tys])

  def vspace_add(self, x, y) -> HiTup:
    return _make_tup_as(self, [_add(ty, get_tuple_element(x, i), get_tuple_element(y, i))
                               for i, ty in enumerate(self.tys)])

  # vmap / scan
  def _check_spec(self, spec) -> tuple:
    if not isinstance(spec, TupSpec) or len(spec.val) != len(self.tys):
      raise TypeError(f"a {self} is mapped with hx.TupSpec of {len(self.tys)} entries, "
                      f"got {spec!r}")
    return spec.val

  def dec_rank(self, size, spec) -> TupTy:
    return TupTy(tuple(ty if s is None else mapped_aval(size, s, ty)
                       for ty, s in zip(self.tys, self._check_spec(spec))))

  def inc_rank(self, size, spec) -> TupTy:
    return TupTy(tuple(ty if s is None else unmapped_aval(size, s, ty)
                       for ty, s in zip(self.tys, self._check_spec(spec))))

  def hx_matchaxis(self, tup, size, src, dst, match):
    """A ``vmap`` output brought to ``out_axes=TupSpec(...)`` element by element
    (an unmapped element is broadcast, as JAX does for arrays)."""
    if not isinstance(dst, TupSpec) or not (src is None or isinstance(src, TupSpec)):
      return NotImplemented
    dsts = self._check_spec(dst)
    srcs = (None,) * len(self.tys) if src is None else src.val
    return make_tup(*(match(s, d, get_tuple_element(tup, i))
                      for i, (s, d) in enumerate(zip(srcs, dsts))))

  def leading_axis_spec(self) -> TupSpec:
    return TupSpec(tuple(ty.leading_axis_spec() if is_hi(ty) else 0 for ty in self.tys))

  # shard_map
  def _check_pspec(self, spec) -> tuple:
    if not isinstance(spec, TupP) or len(spec.specs) != len(self.tys):
      raise TypeError(f"a {self} crosses shard_map with hx.TupP of {len(self.tys)} specs, "
                      f"got {spec!r}{shard_map_spec_hint(spec)}")
    return spec.specs

  def shard(self, mesh, manual_axes, check_vma, spec) -> TupTy:
    return TupTy(tuple(ty.shard(mesh, manual_axes, check_vma, s)
                       for ty, s in zip(self.tys, self._check_pspec(spec))))

  def unshard(self, mesh, check_vma, spec) -> TupTy:
    specs = self._check_pspec(spec)
    for i, (ty, s) in enumerate(zip(self.tys, specs)):
      if not is_hi(ty):  # hi elements check themselves in their unshard
        shd.check_out_vma(f"element {i} ({shd.short(ty)}) of {self}", spec, mesh, check_vma,
                          shd.spec_axes(s), ty.mat)
    return TupTy(tuple(ty.unshard(mesh, check_vma, s) for ty, s in zip(self.tys, specs)))

  def nospec(self, mesh, check_vma, all_names) -> TupP:
    return TupP(tuple(ty.nospec(mesh, check_vma, all_names) for ty in self.tys))

  def str_short(self, short_dtypes=False, mesh_axis_types=False) -> str:
    return "Tup{" + ",".join(shd.short(ty) for ty in self.tys) + "}"

  def __repr__(self) -> str:
    return self.str_short()

  def __str__(self) -> str:
    return self.str_short()

  # Pallas: a Tup operand or result of pl.pallas_call (hxmlir.pallas; its methods
  # are added by hx_pallas.register_tuple_type below the class). Pallas'
  # BlockSpec is written over one dense shape: a Tup whose elements share theirs
  # has it, and its block spec applies to every element.
  @property
  def shape(self) -> tuple[int, ...]:
    """The dense shape every element has; ``AttributeError`` when they differ (or have none)."""
    shapes = {tuple(ty.shape) if hasattr(ty, "shape") else None for ty in self.tys}
    if len(shapes) != 1 or None in shapes:
      raise AttributeError(f"{self} has no dense shape: its elements' shapes differ, so "
                           "pl.pallas_call cannot block it; pass its elements as operands")
    return shapes.pop()

  @property
  def dtype(self):
    """The dense dtype every element has (Pallas compares it for ``input_output_aliases``);
    ``AttributeError`` when they differ."""
    dtypes = {getattr(ty, "dtype", None) for ty in self.tys}
    if len(dtypes) != 1 or None in dtypes:
      raise AttributeError(f"{self} has no dense dtype: its elements' dtypes differ")
    return dtypes.pop()

  # JAX's placement APIs: a tuple has no dense sharding
  def _no_dense_sharding(self, what) -> TypeError:
    return TypeError(f"a {self} has no dense sharding to place by {what}: place its elements "
                     "(jax.device_put / jax.lax.with_sharding_constraint / jit shardings on "
                     "each) and rebuild it with hx.make_tup")

  def hx_lo_specs(self, spec: PartitionSpec, mesh=None):
    """Always raises ``TypeError``: a tuple's elements are placed one by one."""
    raise self._no_dense_sharding(spec)

  def hx_update_sharding(self, sharding):
    """Always raises ``TypeError``: a tuple's elements are placed one by one."""
    raise self._no_dense_sharding(sharding)


register_hitype(HiTup, lambda t: t.ty if t.ty is not None else
                TupTy(tuple(jax.typeof(e) for e in t.elts)))
refuse_array_api(HiTup, TupTy, "tuple", "call hx.get_tuple_element(t, i) for element i")
hx_pallas.register_tuple_type(TupTy)


def _add(ty, a, b):
  return ty.vspace_add(a, b) if is_hi(ty) else a + b


class MakeTup(HxPrimitive):
  """``make_tup: t0, t1, ... -> Tup{t0,t1,...}``; see :func:`make_tup`."""

  def __init__(self, elt_avals, tys=None):
    self.in_avals = tuple(elt_avals)
    self.out_aval = TupTy(tuple(elt_avals) if tys is None else tuple(tys))
    self.params = {}
    super().__init__()

  def vjp_fwd(self, nzs_in, *elts):
    return self(*elts), None

  def vjp_bwd_retval(self, _res, g):
    return tuple(get_tuple_element(g, i) for i in range(len(self.in_avals)))

  def jvp(self, primals, tangents):
    ts = [instantiate(t, a.to_tangent_aval()) for t, a in zip(tangents, self.in_avals)]
    return self(*primals), _make_tup_as(self.out_aval.to_tangent_aval(), ts)

  def transpose(self, ct, *elts):  # linear in every element
    if isinstance(ct, Zero):
      return
    for i, e in enumerate(elts):
      if is_linear_operand(e):
        accumulate(e, get_tuple_element(ct, i))

  def batch(self, axis_data, args, dims):
    if all(d is None for d in dims):
      return make_tup(*args), None
    return make_tup(*args), TupSpec(tuple(dims))


class GetTupElt(HxPrimitive):
  """``get_tuple_element: Tup{..., t_idx, ...} -> t_idx``; see :func:`get_tuple_element`."""

  def __init__(self, tup_aval, idx):
    if not isinstance(tup_aval, TupTy):
      raise TypeError(f"hx.get_tuple_element expects a tuple Tup{{...}}, got {shd.short(tup_aval)}")
    if isinstance(idx, jax.core.Tracer):
      raise TypeError(f"hx.get_tuple_element index must be a static Python int, got a traced "
                      f"{shd.short(jax.typeof(idx))} (for {tup_aval})")
    if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
      raise TypeError(f"hx.get_tuple_element index must be a static Python int, got "
                      f"{idx!r} of type {type(idx).__name__} (for {tup_aval})")
    idx = int(idx)
    if not -len(tup_aval.tys) <= idx < len(tup_aval.tys):
      raise IndexError(f"hx.get_tuple_element index {idx!r} out of range for {tup_aval}")
    idx = idx % len(tup_aval.tys)
    self.in_avals = (tup_aval,)
    self.out_aval = tup_aval.tys[idx]
    self.params = dict(idx=idx)
    super().__init__()

  def vjp_fwd(self, nzs_in, tup):
    return self(tup), None

  def vjp_bwd_retval(self, _res, g):
    tys = self.in_avals[0].tys
    elts = [g if i == self.idx else zeros(ty.to_ct_aval()) for i, ty in enumerate(tys)]
    return (_make_tup_as(TupTy(tuple(ty.to_ct_aval() for ty in tys)), elts),)

  def transpose(self, ct, tup):  # linear
    if is_linear_operand(tup) and not isinstance(ct, Zero):
      accumulate(tup, *self.vjp_bwd_retval(None, ct))

  def jvp(self, primals, tangents):
    (tup,), (dt,) = primals, tangents
    out = self(tup)
    if isinstance(dt, Zero):
      return out, zeros(self.out_aval.to_tangent_aval())
    return out, get_tuple_element(dt, self.idx)

  def batch(self, axis_data, args, dims):
    (tup,), (spec,) = args, dims
    if spec is None:
      return get_tuple_element(tup, self.idx), None
    return get_tuple_element(tup, self.idx), spec.val[self.idx]


def make_tup(*elts) -> HiTup:
  """A tuple ``Tup{t0,t1,...}`` of JAX values (arrays, scalars, hi values).

  Python scalars become weakly typed arrays, as everywhere in JAX.
  """
  elts = tuple(e if is_hi(jax.typeof(e)) else jnp.asarray(e) for e in elts)
  return MakeTup(tuple(jax.typeof(e) for e in elts))(*elts)


def _make_tup_as(ty: TupTy, elts) -> HiTup:
  """``make_tup(*elts)`` typed ``ty``: for tangents and cotangents, whose type is the
  primal's. An element may differ from its entry in ``ty`` as JAX's AD lets an
  array's cotangent differ (``typematch``: on a mesh where the primal, made outside
  ``jax.set_mesh``, is on none); the tuple's type then stays the one AD expects."""
  avals = tuple(jax.typeof(e) for e in elts)
  if not all(typematch(a, t) for a, t in zip(avals, ty.tys)):
    raise TypeError(f"hx tuple elements {', '.join(map(shd.short, avals))} do not match "
                    f"{ty}")
  return MakeTup(avals, ty.tys)(*elts)


def get_tuple_element(tup, idx: int):
  """Element ``idx`` (a static Python int, negative counts from the end) of ``tup``.

  Raises ``TypeError`` if ``tup`` is not a tuple or ``idx`` is not a static
  integer (a float, a traced value), and ``IndexError`` if ``idx`` is out of range.
  """
  return GetTupElt(jax.typeof(tup), idx)(tup)
