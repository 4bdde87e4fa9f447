"""Sharding arithmetic shared by the hi types' typing rules.

Hi types record shardings as ``jax.sharding.NamedSharding`` (JAX's explicit
sharding mode); these helpers derive component and result shardings from them
(drop an axis, pick a mesh, print ``8@i``) so every type does it the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

from hxmlir._jax import ManualAxisType, empty_mat


def partitions(sharding: NamedSharding, ndim: int) -> tuple:
  """The spec of ``sharding`` as a tuple of exactly ``ndim`` entries (``None``-padded)."""
  parts = tuple(sharding.spec)
  if len(parts) > ndim:
    raise ValueError(f"partition spec {sharding.spec} has more entries than rank {ndim}")
  return parts + (None,) * (ndim - len(parts))


def with_partitions(sharding: NamedSharding, parts: Sequence) -> NamedSharding:
  """``sharding`` on the same mesh with spec ``P(*parts)``."""
  return sharding.update(spec=PartitionSpec(*parts))


def out_sharding(sharding: NamedSharding):
  """What to pass as JAX's ``out_sharding=`` for a result typed ``sharding``.

  The sharding itself when it lives on a mesh or no mesh is current; its
  ``PartitionSpec`` when its mesh is empty (a value made outside
  ``jax.set_mesh``) but a mesh is current, which JAX then resolves on that mesh:
  JAX ignores an ``out_sharding`` on no mesh, and a contraction over a sharded
  axis then fails for want of an output sharding.
  """
  if sharding.mesh.empty and not jax.sharding.get_abstract_mesh().empty:
    return sharding.spec
  return sharding


def pick_mesh_sharding(*shardings: NamedSharding) -> NamedSharding:
  """The first sharding whose mesh is not empty (else the first one).

  Used to place a result computed from operands of which some are unsharded
  (empty mesh) and some live on a mesh.
  """
  for s in shardings:
    if not s.mesh.empty:
      return s
  return shardings[0]


def product_sharding(lhs: NamedSharding, lhs_batch: Sequence, lhs_rows,
                     rhs: NamedSharding, rhs_batch: Sequence, rhs_cols) -> NamedSharding:
  """The typing rule "dense @ structured" for result sharding, written once.

  The result ``f32[*b, m, n]`` of ``lhs[*b, m, ...] . rhs[*b, ..., n]`` (``f32[*b, m, k]
  @ q8[*b, k, n]``, ``@ r1[*b, k, n]``, and ``outer(f32[*b, m], f32[*b, n])``) is
  sharded: each batch axis like whichever operand shards it (``lhs`` first), rows
  like ``lhs_rows``, columns like ``rhs_cols``; on the first operand mesh that is not
  empty. ``*_batch``: the operands' batch partition entries; ``lhs_rows`` /
  ``rhs_cols``: the entries of the row and column axes. Checked on the IR by the
  composite schema's sharding invariants (``hx-verify``).
  """
  batch = tuple(a if a is not None else b for a, b in zip(lhs_batch, rhs_batch))
  return with_partitions(pick_mesh_sharding(lhs, rhs), (*batch, lhs_rows, rhs_cols))


def dims_str(shape: Sequence[int], parts: Sequence) -> str:
  """Comma-separated dims with their mesh axes, e.g. ``8@i,3`` or ``8@(i,j),3``."""
  out = []
  for d, p in zip(shape, parts):
    if p is None:
      out.append(str(d))
    elif isinstance(p, tuple):
      out.append(f"{d}@({','.join(p)})")
    else:
      out.append(f"{d}@{p}")
  return ",".join(out)


def short(aval) -> str:
  """An operand's type as users write it: ``f32[2,5]``, ``q8[3,4]``, ``Tup{...}``."""
  if isinstance(aval, jax.core.ShapedArray):
    return aval.str_short(short_dtypes=True)
  return aval.str_short(short_dtypes=True) if hasattr(aval, "str_short") else repr(aval)


def join_mat(*avals):
  """The manual-axis type (``shard_map`` varying axes) of a result computed from ``avals``.

  Inside ``shard_map`` with ``check_vma=True`` a value varies over the manual
  mesh axes any of its operands varies over, as for JAX's own primitives;
  outside ``shard_map`` every ``mat`` is empty and so is the result.
  """
  return join_mats(*(a.mat for a in avals if getattr(a, "mat", None) is not None))


def join_mats(*mats):
  """The manual-axis type varying over the axes any of ``mats`` varies over (see :func:`join_mat`)."""
  varying = frozenset().union(*(m.varying for m in mats))
  if not varying:
    return empty_mat
  return ManualAxisType(varying=varying)


def match_vma(ct, aval):
  """Cotangent ``ct`` summed over the manual mesh axes it varies over but ``aval`` does not.

  Inside ``shard_map`` (``check_vma=True``) an operand invariant over an axis
  meets varying ones by an implicit ``pvary``, whose transpose is ``psum``: a
  backward rule applies this to each operand's cotangent so that it gets its
  primal's type. Outside ``shard_map`` it returns ``ct`` unchanged.
  """
  extra = jax.typeof(ct).mat.varying - aval.mat.varying
  if not extra:
    return ct
  return jax.lax.psum(ct, tuple(a for a in jax.typeof(ct).sharding.mesh.axis_names if a in extra))


def spec_axes(spec: PartitionSpec) -> frozenset:
  """The mesh axes a ``PartitionSpec`` names: its partitions', unreduced and reduced."""
  return frozenset(a for p in spec.partitions if p is not None
                   for a in (p if isinstance(p, tuple) else (p,))) | spec.unreduced | spec.reduced


def check_out_vma(what: str, spec, mesh, check_vma: bool, named: frozenset, mat) -> None:
  """Refuse a ``shard_map`` output that varies over a manual axis its ``out_specs`` omits.

  JAX's own rule (``_check_mats`` in ``jax/_src/shard_map.py``), which it applies
  to plain ``PartitionSpec`` outputs only: with ``check_vma`` every mesh axis the
  spec does not name (``named``), and that is not already manual outside this
  ``shard_map``, must be one the value (``mat``) does not vary over; else the
  output would silently be one device's block. A hi type's ``unshard`` calls this
  with its own ``what`` (its type) and the axes its spec names.
  """
  if not check_vma:
    return
  outer_manual = set(getattr(mesh, "manual_axes", ()))
  bad = [a for a in mesh.axis_names
         if a not in named and a not in outer_manual and a in mat.vur]
  if not bad:
    return
  got = ",".join(a for a in mesh.axis_names if a in mat.vur)
  diff = ",".join(bad)
  raise TypeError(
      f"shard_map out_specs {spec!r} for {what} implies that the output is replicated "
      f"across mesh axes {{{diff}}}, but it was inferred to be possibly varying over "
      f"{{{got}}}; name {{{diff}}} in the out_specs, or reduce over them first "
      "(jax.lax.psum / jax.lax.pmax of the arrays it is built from), or pass check_vma=False to jax.shard_map if the "
      "value is replicated")


def dense_spec_entries(ty, spec: PartitionSpec, ndim: int) -> tuple:
  """The entries of a hi value's dense ``spec`` padded to ``ndim`` (``None`` for the rest).

  Used to derive its components' specs (``hx_lo_specs``) for JAX's placement APIs
  (``jax.device_put``, ``with_sharding_constraint``, ``jit`` ``in_shardings``).
  Raises ``TypeError`` naming hi type ``ty`` when ``spec`` has more entries than
  the dense rank.
  """
  parts = tuple(spec)
  if len(parts) > ndim:
    raise TypeError(f"partition spec {spec} has {len(parts)} entries, more than the dense "
                    f"rank {ndim} of {short(ty)}")
  return parts + (None,) * (ndim - len(parts))


def spec_like(spec: PartitionSpec, parts: Sequence) -> PartitionSpec:
  """``P(*parts)`` with ``spec``'s unreduced and reduced mesh axes."""
  return PartitionSpec(*parts, unreduced=spec.unreduced, reduced=spec.reduced)
