"""Rank-1 matrices: ``r1[*b, m, n]``, an outer product kept as its two factors.

A :class:`Rank1` holds ``col: f32[*b, m]`` and ``row: f32[*b, n]`` and stands
for ``col[..., :, None] * row[..., None, :]`` without ever materialising it.
Built with :func:`outer`, taken apart with :func:`factors`, consumed by
:func:`matmul_r1`. Rank-1 matrices are not closed under addition, so tangents
and cotangents are dense ``f32[*b, m, n]`` arrays; gradients chained through
:func:`outer` land back on the factors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.hijax import HiPspec, HiType, ShapedArray, Zero, register_hitype
from jax.sharding import NamedSharding, PartitionSpec

from hxmlir import _jax
from hxmlir import pallas as hx_pallas
from hxmlir._jax import ManualAxisType, MappingSpec, empty_mat
from hxmlir.types import shardings as shd
from hxmlir.types.hiprim import (
  DenseValue,
  DenseValuedType,
  HxPrimitive,
  NeedsJitShardMap,
  accumulate,
  broadcast_unmapped,
  is_linear_operand,
  refuse_array_api,
  shard_map_spec_hint,
  value_refusals,
)

F32 = jnp.dtype("float32")


@dataclass(frozen=True)
class Rank1(DenseValue):
  """A rank-1 matrix value: factors ``col: f32[*b, m]`` and ``row: f32[*b, n]``."""
  col: Any
  row: Any

  @property
  def shape(self) -> tuple[int, ...]:
    """The dense shape ``(*b, m, n)``."""
    return (*self.col.shape, self.row.shape[-1])

  # not an array: np.asarray(r), r1 == r2, hash(r), bool(r) raise TypeError
  __array__, __eq__, __ne__, __hash__, __bool__ = value_refusals(
      "hx.factors(r) for the factors (col, row), or np.outer(*hx.factors(r)) for the dense "
      "matrix of an unbatched r1")


@dataclass(frozen=True)
class Rank1Spec(MappingSpec):
  """``vmap`` mapping spec of a rank-1 matrix: mapped along its leading (batch) axis."""


@dataclass(frozen=True)
class Rank1P(NeedsJitShardMap, HiPspec):
  """``shard_map`` partition spec of a rank-1 matrix: ``spec`` partitions the dense
  axes ``(*b, m, n)``; ``col`` takes the ``(*b, m)`` entries, ``row`` the ``(*b, n)`` ones.

  For a batched ``r1[*b, m, n]`` the spec must name all its axes (``None`` for
  unpartitioned ones); for ``r1[m, n]`` a shorter spec is padded with ``None``.
  """
  spec: PartitionSpec = PartitionSpec()

  def to_lo(self) -> tuple[PartitionSpec, PartitionSpec]:
    # rank unknown here: specs are padded to the dense rank by the caller's type
    parts = tuple(self.spec)
    if len(parts) < 2:
      parts = parts + (None,) * (2 - len(parts))
    return (PartitionSpec(*parts[:-1]), PartitionSpec(*parts[:-2], parts[-1]))

  def to_tangent_spec(self) -> PartitionSpec:
    return self.spec

  def to_ct_spec(self) -> PartitionSpec:
    return self.spec


@dataclass(frozen=True)
class Rank1Ty(DenseValuedType, HiType):
  """The type ``r1[*b, m, n]`` of a rank-1 matrix (``r1[6@i,5]`` when sharded).

  ``shape`` is the dense shape represented and ``sharding`` its
  ``NamedSharding``; ``col`` is sharded like the ``(*b, m)`` axes, ``row`` like
  ``(*b, n)``. ``col_mat`` and ``row_mat`` are the factors' manual-axis types
  inside ``shard_map`` (the mesh axes each varies over; empty elsewhere): one
  per factor, so that ``shard_map`` checks each factor against its own entries
  of an ``hx.Rank1P``. ``mat``, what a value computed from the matrix varies
  over, is their join, and is what the type prints (``r1[2,3]{V:(i,j)}``). The
  tangent type is the dense ``f32`` array of the same shape, sharding and ``mat``.
  """
  shape: tuple[int, ...]
  sharding: NamedSharding
  col_mat: ManualAxisType = empty_mat
  row_mat: ManualAxisType = empty_mat

  def __post_init__(self):
    if len(self.shape) < 2:
      raise TypeError(f"a rank-1 matrix has at least two axes, got shape {self.shape}")

  @property
  def mat(self) -> ManualAxisType:
    """The manual axes either factor varies over (JAX and the typing rules read
    ``mat`` off every operand; the dense tangent varies over these)."""
    return shd.join_mats(self.col_mat, self.row_mat)

  def lo_ty(self) -> list[ShapedArray]:
    """``[f32[*b, m], f32[*b, n]]`` with shardings derived from the dense one and
    each factor's own manual-axis type."""
    cspec, rspec = self._factor_specs(PartitionSpec(*self._parts()))
    return [ShapedArray(self.shape[:-1], F32, sharding=self.sharding.update(spec=cspec),
                        manual_axis_type=self.col_mat),
            ShapedArray((*self.shape[:-2], self.shape[-1]), F32,
                        sharding=self.sharding.update(spec=rspec),
                        manual_axis_type=self.row_mat)]

  def lower_val(self, r: Rank1) -> list:
    return [r.col, r.row]

  def raise_val(self, col, row) -> Rank1:
    return Rank1(col, row)

  def dec_rank(self, size, spec) -> Rank1Ty:
    if not isinstance(spec, Rank1Spec):
      raise TypeError(f"an {self} is mapped with hx.Rank1Spec(), got {spec!r}")
    if len(self.shape) < 3 or self.shape[0] != size:
      raise ValueError(f"cannot map {self} over a leading axis of size {size}")
    return Rank1Ty(self.shape[1:], shd.with_partitions(self.sharding, self._parts()[1:]),
                   self.col_mat, self.row_mat)

  def inc_rank(self, size, spec) -> Rank1Ty:
    if not isinstance(spec, Rank1Spec):
      raise TypeError(f"an {self} is mapped with hx.Rank1Spec(), got {spec!r}")
    return Rank1Ty((size, *self.shape), shd.with_partitions(self.sharding, (None, *self._parts())),
                   self.col_mat, self.row_mat)

  def leading_axis_spec(self) -> Rank1Spec:
    return Rank1Spec()

  def hx_matchaxis(self, r, size, src, dst, match):
    """An unmapped ``vmap`` output with ``out_axes=Rank1Spec()``: ``size`` copies of it."""
    if src is None and isinstance(dst, Rank1Spec):
      return broadcast_unmapped(r, size)
    return NotImplemented

  def _check_pspec(self, spec) -> PartitionSpec:
    if not isinstance(spec, Rank1P):
      raise TypeError(f"an {self} crosses shard_map with hx.Rank1P(P(...)), "
                      f"got {spec!r}{shard_map_spec_hint(spec)}")
    if len(spec.spec) > self.ndim or (self.ndim > 2 and len(spec.spec) != self.ndim):
      # Rank1P.to_lo cannot see the rank: a batched r1 needs one entry per axis
      raise TypeError(f"hx.Rank1P({spec.spec}) for {self} needs exactly {self.ndim} entries, "
                      "one per dense axis")
    return spec.spec

  def _factor_specs(self, dspec: PartitionSpec) -> tuple[PartitionSpec, PartitionSpec]:
    """The factors' specs within the dense ``dspec``: ``(*b, m)`` and ``(*b, n)`` entries
    (what ``Rank1P.to_lo`` gives JAX), each with ``dspec``'s unreduced and reduced axes."""
    parts = tuple(dspec) + (None,) * (self.ndim - len(dspec))
    return (PartitionSpec(*parts[:-1], unreduced=dspec.unreduced, reduced=dspec.reduced),
            PartitionSpec(*parts[:-2], parts[-1], unreduced=dspec.unreduced,
                          reduced=dspec.reduced))

  def shard(self, mesh, manual_axes, check_vma, spec) -> Rank1Ty:
    dspec = self._check_pspec(spec)
    d = self.to_tangent_aval().shard(mesh, manual_axes, check_vma, dspec)
    # inside, each factor varies over the axes of its own entries (and what it did)
    c, r = (ty.shard(mesh, manual_axes, check_vma, s)
            for ty, s in zip(self.lo_ty(), self._factor_specs(dspec)))
    return Rank1Ty(d.shape, d.sharding, c.mat, r.mat)

  def unshard(self, mesh, check_vma, spec) -> Rank1Ty:
    dspec = self._check_pspec(spec)
    # each factor against its own entries: the dense spec names the other factor's
    # axes too, and a factor varying over an axis only those name would come out as
    # one device's block
    lo = self.lo_ty()
    for name, ty, s in zip(("col", "row"), lo, self._factor_specs(dspec)):
      entries = PartitionSpec(*s)  # as the user reads them, without unreduced/reduced
      shd.check_out_vma(f"the {name} factor {shd.short(ty)} (its entries: {entries}) of {self}",
                        spec, mesh, check_vma, shd.spec_axes(s), ty.mat)
    d = self.to_tangent_aval().unshard(mesh, check_vma, dspec)
    c, r = (ty.unshard(mesh, check_vma, s) for ty, s in zip(lo, self._factor_specs(dspec)))
    return Rank1Ty(d.shape, d.sharding, c.mat, r.mat)

  def nospec(self, mesh, check_vma, all_names) -> Rank1P:
    return Rank1P(self.to_tangent_aval().nospec(mesh, check_vma, all_names))

  def str_short(self, short_dtypes=False, mesh_axis_types=False) -> str:
    # the dense type prints dims, shardings and {V:...} exactly like JAX
    return "r1" + self.to_tangent_aval().str_short(True, mesh_axis_types).removeprefix("f32")

  def __repr__(self) -> str:
    return self.str_short()

  def __str__(self) -> str:
    return self.str_short()

  # Pallas: an r1 operand or result of pl.pallas_call (hxmlir.pallas; its methods
  # are added by hx_pallas.register_type below the class)
  def _pallas_layout(self, rank: int | None = None) -> dict:
    # col has the (*b, m) axes, row the (*b, n) axes; a BlockSpec has the array's
    # rank (a block type lacks its squeezed axes)
    r = len(self.shape) if rank is None else rank
    return dict(components=(tuple(range(r - 1)), (*range(r - 2), r - 1)),
                structural=(r - 2, r - 1), group=None)

  def _pallas_block_ty(self, shape) -> Rank1Ty:
    return Rank1Ty(tuple(shape), shd.with_partitions(self.sharding, (None,) * len(shape)),
                   self.col_mat, self.row_mat)

  # JAX's placement APIs (jax.device_put, with_sharding_constraint, jit in/out_shardings)
  def hx_lo_specs(self, spec: PartitionSpec, mesh=None) -> tuple[PartitionSpec, PartitionSpec]:
    """The specs of ``(col, row)`` for a dense ``spec`` of this ``r1[*b, m, n]``
    (the rule of ``shard_map``'s ``hx.Rank1P``). Raises ``TypeError`` if ``spec``
    has more entries than the rank."""
    shd.dense_spec_entries(self, spec, self.ndim)
    return self._factor_specs(spec)

  def hx_update_sharding(self, sharding: NamedSharding) -> Rank1Ty:
    """This type with dense sharding ``sharding`` (as JAX computed it for the dense matrix)."""
    shd.dense_spec_entries(self, sharding.spec, self.ndim)
    return Rank1Ty(self.shape, sharding, self.col_mat, self.row_mat)


def _typeof_rank1(r: Rank1) -> Rank1Ty:
  ct, rt = jax.typeof(r.col), jax.typeof(r.row)
  if isinstance(ct, _jax.AbstractRef):  # the factors of an r1 ref inside a Pallas kernel
    return Rank1Ty(r.shape, ct.inner_aval.sharding.update(spec=PartitionSpec()))
  if not (_is_f32_vector_stack(ct) and _is_f32_vector_stack(rt)) or ct.shape[:-1] != rt.shape[:-1]:
    raise TypeError("hx.Rank1 needs col: f32[*b, m] and row: f32[*b, n], got "
                    f"col: {shd.short(ct)}, row: {shd.short(rt)}")
  cs, rs = ct.sharding, rt.sharding
  cp = shd.partitions(cs, r.col.ndim)
  rp = shd.partitions(rs, r.row.ndim)
  base = shd.pick_mesh_sharding(cs, rs)
  return Rank1Ty(r.shape, shd.with_partitions(base, (*cp, rp[-1])), ct.mat, rt.mat)


register_hitype(Rank1, _typeof_rank1)
refuse_array_api(Rank1, Rank1Ty, "rank-1 matrix",
                 "call hx.matmul_r1(x, r) for a product, hx.factors(r) for its factors (col, row), "
                 "jnp.outer(*hx.factors(r)) for the dense f32 matrix of an unbatched r1")
hx_pallas.register_type(Rank1Ty)


def _is_f32_vector_stack(aval) -> bool:
  return isinstance(aval, ShapedArray) and aval.dtype == F32 and aval.ndim >= 1


class Outer(HxPrimitive):
  """``outer: f32[*b, m], f32[*b, n] -> r1[*b, m, n]``; see :func:`outer`."""

  def __init__(self, col_aval, row_aval):
    sig = f"{shd.short(col_aval)}, {shd.short(row_aval)}"
    if not (_is_f32_vector_stack(col_aval) and _is_f32_vector_stack(row_aval)):
      raise TypeError(f"hx.outer expects f32[*b, m] and f32[*b, n] factors, got {sig}")
    if col_aval.shape[:-1] != row_aval.shape[:-1]:
      raise TypeError(f"hx.outer factors have different batch dimensions: {sig}")
    cp = shd.partitions(col_aval.sharding, col_aval.ndim)
    rp = shd.partitions(row_aval.sharding, row_aval.ndim)
    self.in_avals = (col_aval, row_aval)
    self.out_aval = Rank1Ty((*col_aval.shape, row_aval.shape[-1]),
                            shd.product_sharding(col_aval.sharding, cp[:-1], cp[-1],
                                                 row_aval.sharding, rp[:-1], rp[-1]),
                            col_aval.mat, row_aval.mat)
    self.params = {}
    super().__init__()

  def vjp_fwd(self, nzs_in, col, row):
    return self(col, row), (col, row)

  def vjp_bwd_retval(self, res, g):  # g: dense f32[*b, m, n]
    col, row = res
    c_aval, r_aval = self.in_avals
    # cotangents live where their primals live: pin the (maybe sharded) contractions
    gc = jnp.einsum("...mn,...n->...m", g, row, out_sharding=shd.out_sharding(c_aval.sharding))
    gr = jnp.einsum("...m,...mn->...n", col, g, out_sharding=shd.out_sharding(r_aval.sharding))
    return shd.match_vma(gc, c_aval), shd.match_vma(gr, r_aval)

  def jvp(self, primals, tangents):
    (col, row), (dc, dr) = primals, tangents
    terms = []
    if not isinstance(dc, Zero):
      terms.append(dc[..., :, None] * row[..., None, :])
    if not isinstance(dr, Zero):
      terms.append(col[..., :, None] * dr[..., None, :])
    out_t = sum(terms[1:], terms[0]) if terms else jnp.zeros(self.out_aval.shape, F32)
    return self(col, row), out_t

  def batch(self, axis_data, args, dims):
    (col, row), (dc, dr) = args, dims
    if dc is None and dr is None:
      return outer(col, row), None
    size = axis_data.size
    col = jnp.moveaxis(col, dc, 0) if dc is not None else jnp.broadcast_to(col, (size, *col.shape))
    row = jnp.moveaxis(row, dr, 0) if dr is not None else jnp.broadcast_to(row, (size, *row.shape))
    return outer(col, row), Rank1Spec()


class Factors(HxPrimitive):
  """``factors: r1[*b, m, n] -> (f32[*b, m], f32[*b, n])``; see :func:`factors`."""

  def __init__(self, r_aval):
    if not isinstance(r_aval, Rank1Ty):
      raise TypeError(f"hx.factors expects a rank-1 matrix r1[m, n], got {shd.short(r_aval)}")
    self.in_avals = (r_aval,)
    self.out_aval = tuple(r_aval.lo_ty())
    self.params = {}
    super().__init__()

  # not differentiable: a dense tangent of r has no unique split into factor tangents
  def _not_differentiable(self):
    return TypeError(f"hx.factors is not differentiable: the tangent of {self.in_avals[0]} is a "
                     "dense f32 array with no unique split into factor tangents; where a "
                     "gradient must flow, use the factor arrays given to hx.outer instead")

  def vjp_fwd(self, nzs_in, r):
    if any(nzs_in):
      raise self._not_differentiable()
    return self(r), None

  def vjp_bwd_retval(self, _res, g):
    return (Zero(self.in_avals[0].to_ct_aval()),)

  def jvp(self, primals, tangents):
    (r,), (dr,) = primals, tangents
    if not isinstance(dr, Zero):
      raise self._not_differentiable()
    return self(r), tuple(Zero(a.to_tangent_aval()) for a in self.out_aval)

  def batch(self, axis_data, args, dims):
    (r,), (d,) = args, dims
    if d is None:
      return factors(r), (None, None)
    return factors(r), (0, 0)


class MatmulR1(HxPrimitive):
  """``matmul_r1: f32[*b, p, m] @ r1[*b, m, n] -> f32[*b, p, n]``; see :func:`matmul_r1`."""

  def __init__(self, x_aval, r_aval):
    sig = f"{shd.short(x_aval)} @ {shd.short(r_aval)}"
    if not isinstance(r_aval, Rank1Ty):
      raise TypeError(f"hx.matmul_r1 expects a rank-1 right operand r1[m, n]: {sig}")
    if not isinstance(x_aval, ShapedArray) or x_aval.dtype != F32:
      raise TypeError(f"hx.matmul_r1 expects a dense f32 left operand: {sig}")
    if x_aval.ndim != r_aval.ndim:
      raise TypeError(f"hx.matmul_r1 expects f32[*b, p, m] @ r1[*b, m, n] of equal rank: {sig}")
    if x_aval.shape[:-2] != r_aval.shape[:-2] or x_aval.shape[-1] != r_aval.shape[-2]:
      raise TypeError(f"hx.matmul_r1 operand shapes do not match: {sig}")
    xp = shd.partitions(x_aval.sharding, x_aval.ndim)
    rp = shd.partitions(r_aval.sharding, r_aval.ndim)
    if xp[-1] is not None or rp[-2] is not None:
      raise TypeError(f"hx.matmul_r1 requires unsharded contraction axes, got {sig}")
    self.in_avals = (x_aval, r_aval)
    self.out_aval = ShapedArray((*x_aval.shape[:-1], r_aval.shape[-1]), F32,
                                sharding=shd.product_sharding(x_aval.sharding, xp[:-2], xp[-2],
                                                              r_aval.sharding, rp[:-2], rp[-1]),
                                manual_axis_type=shd.join_mat(x_aval, r_aval))
    self.params = {}
    super().__init__()

  def vjp_fwd(self, nzs_in, x, r):
    col, row = factors(r)  # rules are traced code: primitives, not attributes
    return self(x, r), (x, col, row)

  def _ct_x(self, g, col, row):
    """Cotangent of the dense operand: ``(g @ row) ⊗ col``, never forming ``col ⊗ row``."""
    x_aval = self.in_avals[0]
    parts = shd.partitions(x_aval.sharding, x_aval.ndim)[:-1]
    gp = jnp.einsum("...pn,...n->...p", g, row,
                    out_sharding=shd.out_sharding(shd.with_partitions(x_aval.sharding, parts)))
    return shd.match_vma(gp[..., :, None] * col[..., None, :], x_aval)

  def transpose(self, ct, x, r):
    # the jvp rule applies matmul_r1 to tangents of x only (an r1's tangent is dense)
    if is_linear_operand(r):
      raise NotImplementedError("hx.matmul_r1 is linear in its dense operand only")
    if is_linear_operand(x) and not isinstance(ct, Zero):
      accumulate(x, self._ct_x(ct, *factors(r)))

  def vjp_bwd_retval(self, res, g):  # g: f32[*b, p, n]
    x, col, row = res
    x_aval, r_aval = self.in_avals
    gx = self._ct_x(g, col, row)
    gr = jnp.matmul(jnp.swapaxes(x, -1, -2), g, out_sharding=shd.out_sharding(r_aval.sharding))
    return gx, shd.match_vma(gr, r_aval)

  def jvp(self, primals, tangents):
    (x, r), (dx, dr) = primals, tangents
    terms = []
    if not isinstance(dx, Zero):
      terms.append(matmul_r1(dx, r))
    if not isinstance(dr, Zero):
      terms.append(jnp.matmul(x, dr, out_sharding=shd.out_sharding(self.out_aval.sharding)))
    out_t = sum(terms[1:], terms[0]) if terms else jnp.zeros(self.out_aval.shape, F32)
    return self(x, r), out_t

  def batch(self, axis_data, args, dims):
    (x, r), (dx, dr) = args, dims
    if dx is None and dr is None:
      return matmul_r1(x, r), None
    size = axis_data.size
    if dr is None:
      col, row = factors(r)
      r = outer(jnp.broadcast_to(col, (size, *col.shape)),
                jnp.broadcast_to(row, (size, *row.shape)))
    x = jnp.moveaxis(x, dx, 0) if dx is not None else jnp.broadcast_to(x, (size, *x.shape))
    return matmul_r1(x, r), 0


def outer(col, row) -> Rank1:
  """The rank-1 matrix ``col ⊗ row: r1[*b, m, n]`` of ``col: f32[*b, m]``, ``row: f32[*b, n]``.

  Nothing is materialised: the result keeps the factors. Gradients through it
  land on the factors. Raises ``TypeError`` on non-f32 or mismatched factors.
  """
  return Outer(jax.typeof(col), jax.typeof(row))(col, row)


def factors(r) -> tuple[jax.Array, jax.Array]:
  """The factors ``(col: f32[*b, m], row: f32[*b, n])`` of ``r: r1[*b, m, n]``.

  Not differentiable (a dense tangent of ``r`` has no unique factorisation):
  ``grad``/``jvp`` through it raise ``TypeError``, unless ``r`` carries no tangent.
  """
  return Factors(jax.typeof(r))(r)


def matmul_r1(x, r) -> jax.Array:
  """``x @ r`` for ``x: f32[*b, p, m]``, ``r: r1[*b, m, n]`` -> ``f32[*b, p, n]``.

  Computed as ``(x @ col) ⊗ row``: ``O(p(m + n))`` work, never materialising
  ``col ⊗ row``. Raises ``TypeError`` naming both operand types on mismatch.
  """
  return MatmulR1(jax.typeof(x), jax.typeof(r))(x, r)
