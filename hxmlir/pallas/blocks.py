"""Block specs and indices of hi types in ``pl.pallas_call``: each ``BlockSpec`` and index
written over a value's dense shape, checked (whole rows, groups and packed bytes where a
component needs them) and lowered per lo component (see :mod:`hxmlir.pallas`).
"""

from __future__ import annotations

from collections.abc import Sequence

from hxmlir import _jax

Axes = tuple[int, ...]


def _block_dim_size(d):
  """The size of one block dim (``int``, ``pl.Blocked``, ``pl.Element``, ...); ``None`` when squeezed."""
  from jax.experimental import pallas as pl
  if d is None or isinstance(d, pl.Squeezed):
    return None
  return getattr(d, "block_size", d)


def array_name(ty) -> str:
  """``ty``'s name with the dense shape of the array it is a block of (``q8[16,256]``,
  ``q4[16,256:g64]``), else ``str(ty)``."""
  whole = getattr(ty, "_pallas_array_shape", None)
  if whole is None:
    return str(ty)
  name = str(ty)
  head = name.split("[")[0]
  inside = name[len(head) + 1:name.rindex("]")]
  group = ":" + inside.split(":", 1)[1] if ":" in inside else ""   # q4[16,256:g64]
  return f"{head}[{','.join(map(str, whole))}{group}]"


def _unit(group: int | None, pack: int) -> tuple[int, str]:
  """Elements the last axis keeps together, and their name in messages."""
  if group is not None:
    return group, f"quantization groups of size {group}"
  return pack, f"packed values ({pack} per byte)"


def check_whole_groups(ty: str, block_shape: Sequence, group: int | None, pack: int = 1) -> None:
  """Raises ``TypeError`` unless the block's last dim holds whole quantization groups.

  ``ty`` names the type (``q4[16,256:g64]``), ``block_shape`` is the dense block
  (``(8, 96)``), ``group`` the elements per scale (``None``: one scale per row,
  which any block holds whole) and ``pack`` the values per stored byte (int4: 2,
  a block must hold whole bytes too). The block dim must then be a ``pl.Blocked``
  size (or an int) that the group (or ``pack``) divides, so every block starts on
  a group.
  """
  align, what = _unit(group, pack)
  if align == 1:
    return
  from jax.experimental import pallas as pl
  last = block_shape[-1]
  size = _block_dim_size(last)
  if not isinstance(last, (int, pl.Blocked)) or size % align:
    raise TypeError(f"a {ty} block {tuple(block_shape)} splits {what} along the last axis; "
                    f"make its last block dim a multiple of {align} (pl.Blocked or an int)")


def _layout(ty, rank: int | None = None) -> dict:
  """``ty._pallas_layout(rank)`` with the defaults of the optional keys filled in."""
  layout = dict(ty._pallas_layout(rank))
  layout.setdefault("divisors", (1,) * len(layout["components"]))
  layout.setdefault("pack", 1)
  return layout


def _lower_block_spec(ty, block_spec, *, components, structural, group, divisors,
                      pack) -> list:
  """The type's ``lower_block_spec``: checks the dense block, then one spec per component.

  Raises ``TypeError`` naming the array's type and the block when the block
  squeezes a ``structural`` axis, when a result's block splits one (each
  program would write the shared scale or factor with its own part's value),
  or when it splits quantization groups (:func:`check_whole_groups`).
  """
  name, bs = array_name(ty), tuple(block_spec.block_shape)
  for a in structural:
    if _block_dim_size(bs[a]) is None:
      raise TypeError(f"a {name} block {bs} squeezes axis {a}, which one scale or factor "
                      "spans; keep it as a block dim (size 1 for one element)")
  if _block_dim_size(bs[-1]) is None and (group is not None or pack > 1):
    raise TypeError(f"a {name} block {bs} squeezes the last axis, which holds "
                    f"{_unit(group, pack)[1]}; keep it as a block dim")
  check_whole_groups(name, bs, group, pack)
  whole = getattr(ty, "_pallas_array_shape", None)
  origin = _jax.pallas_block_origin() or ""
  if whole is not None and origin.startswith("outputs"):
    for a in structural:
      if _block_dim_size(bs[a]) != whole[a]:
        raise TypeError(f"the block {bs} of result {name} splits axis {a} "
                        f"({_block_dim_size(bs[a])} of {whole[a]}), which one scale or factor "
                        "spans, so each program would write it with its own part's value; "
                        "make the result's block hold the whole axis")
  return component_block_specs(block_spec, components, divisors)


def _divided(d, divisor: int):
  """Block dim ``d`` (an int or ``pl.Blocked``) of dense elements, in stored entries."""
  if divisor == 1 or d is None:
    return d
  from jax.experimental import pallas as pl
  if isinstance(d, pl.Blocked):
    return pl.Blocked(d.block_size // divisor)
  return d // divisor


def component_block_specs(block_spec, components: Sequence[Axes],
                          divisors: Sequence[int] | None = None) -> list:
  """One ``pl.BlockSpec`` per component, in its kernel form (:func:`kernel_form`).

  Each has the dense block's rank: the dense block dims and block indices on the
  component's axes (the last one divided by its divisor: ``q4`` values hold two
  per byte, a grouped scale one per group), a dim of 1 at block index 0 on the
  axes it lacks (a per-row scale's block is ``(block_m, 1)``).
  """
  from jax.experimental import pallas as pl

  from hxmlir.pallas.forms import use_in_kernels  # forms builds on this module
  use_in_kernels()
  rank = len(block_spec.block_shape)
  divisors = divisors or (1,) * len(components)
  out = []
  for axes, div in zip(components, divisors):
    def index_map(*args, _axes=axes, _f=block_spec.index_map):
      idx = _f(*args)
      return tuple(idx[a] if a in _axes else 0 for a in range(rank))
    shape = tuple((_divided(block_spec.block_shape[a], div) if a == rank - 1
                   else block_spec.block_shape[a]) if a in axes else 1 for a in range(rank))
    out.append(pl.BlockSpec(shape, index_map, memory_space=block_spec.memory_space,
                            pipeline_mode=block_spec.pipeline_mode))
  return out


def _component_indexer(idx, axes: Axes, divisor: int = 1, form: bool = False):
  """``idx`` on one component: its axes (``form``: every axis, a unit slice where it
  lacks one), the last axis' slice divided by ``divisor`` (its start checked static
  and aligned by :func:`check_index`)."""
  rank = len(idx.shape)
  keep = range(rank) if form else axes
  indices, shape = [], []
  for a in keep:
    if a not in axes:
      indices.append(_jax.IndexSlice(0, 1))
      shape.append(1)
      continue
    index, size = idx.indices[a], idx.shape[a]
    if a == rank - 1 and divisor > 1:
      index = _jax.IndexSlice(int(index.start) // divisor, int(index.size) // divisor)
      size //= divisor
    indices.append(index)
    shape.append(size)
  return _jax.NDIndexer(tuple(indices), tuple(shape), idx.int_indexer_shape, validate=False)


def _is_whole(index, size: int) -> bool:
  if not isinstance(index, _jax.IndexSlice):
    return False
  try:
    return int(index.start) == 0 and int(index.size) == size and index.stride == 1
  except TypeError:  # a traced start
    return False


def check_index(ty: str, transforms: Sequence, structural: Axes, group: int | None,
                write: bool, pack: int = 1) -> None:
  """Raises ``TypeError`` for an index that would break the value's structure.

  Every transform must be an index (``ref[...]``, ``ref.at[...]``); on the
  ``structural`` axes it must slice (a read) or cover the axis whole (a write);
  the last axis must be sliced, and with ``group`` (or ``pack > 1``) a slice of
  it must start and end on group (or byte) boundaries (static offsets only).
  """
  align, what = _unit(group, pack)
  for t in transforms:
    if not isinstance(t, _jax.NDIndexer):
      raise TypeError(f"a ref of {ty} takes only indexing (ref[...], ref.at[...]), got {t}")
    last = len(t.shape) - 1
    for a in sorted({*structural, last}):
      index, size = t.indices[a], t.shape[a]
      if write and a in structural and not _is_whole(index, size):
        raise TypeError(f"writing a {ty} through index {t.indices} covers part of axis {a}: "
                        "one scale or factor holds the whole axis, so a write must cover it "
                        "(write whole rows, or write the components of a lo result)")
      if not isinstance(index, _jax.IndexSlice):
        raise TypeError(f"indexing a ref of {ty} with an integer on axis {a} leaves no "
                        f"{ty.split('[')[0]}; slice it (ref[i:i+1]) and dequantize or take "
                        "factors first")
      if a == last and align > 1:
        try:
          start, stop = int(index.start), int(index.start) + int(index.size)
        except TypeError as e:
          raise TypeError(f"a slice of {ty}'s last axis needs a static start: it must not "
                          f"split {what}") from e
        if start % align or stop % align or index.stride != 1:
          raise TypeError(f"slice {start}:{stop} of {ty}'s last axis splits {what}")


def split_transforms(transforms: Sequence, components: Sequence[Axes],
                     divisors: Sequence[int] | None = None, form: bool = False) -> list[tuple]:
  """Per component, the transforms restricted to it (``form``: in its kernel form)."""
  divisors = divisors or (1,) * len(components)
  return [tuple(_component_indexer(t, axes, d, form) for t in transforms)
          for axes, d in zip(components, divisors)]


def note_block_of(block_ty, array_shape):
  """``block_ty``, a block of an array of dense ``array_shape``, noting that shape.

  Pallas makes a block's type with the array type's ``update(shape=...)`` and
  then asks the block type to lower its ``BlockSpec``: the note lets that
  check a result's block against the whole array and name the array in errors.
  It is not part of the type (equality and hashing ignore it).
  """
  object.__setattr__(block_ty, "_pallas_array_shape", tuple(array_shape))
  return block_ty


def is_tup(ty) -> bool:
  """Whether hi type ``ty`` is a ``Tup`` (its elements in ``ty.tys``)."""
  return hasattr(ty, "tys")
