"""Sharding arithmetic shared by the hi types' typing rules.

Hi types record shardings as ``jax.sharding.NamedSharding`` (JAX's explicit
sharding mode); these helpers derive component and result shardings from them
(drop an axis, pick a mesh, print ``8@i``) so every type does it the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec


def partitions(sharding: NamedSharding, ndim: int) -> tuple:
  """The spec of ``sharding`` as a tuple of exactly ``ndim`` entries (``None``-padded)."""
  parts = tuple(sharding.spec)
  if len(parts) > ndim:
    raise ValueError(f"partition spec {sharding.spec} has more entries than rank {ndim}")
  return parts + (None,) * (ndim - len(parts))


def with_partitions(sharding: NamedSharding, parts: Sequence) -> NamedSharding:
  """``sharding`` on the same mesh with spec ``P(*parts)``."""
  return sharding.update(spec=PartitionSpec(*parts))


def pick_mesh_sharding(*shardings: NamedSharding) -> NamedSharding:
  """The first sharding whose mesh is not empty (else the first one).

  Used to place a result computed from operands of which some are unsharded
  (empty mesh) and some live on a mesh.
  """
  for s in shardings:
    if not s.mesh.empty:
      return s
  return shardings[0]


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
