"""Hi types inside Pallas kernels: what ``pl.pallas_call`` asks of ``q8``, ``r1`` and ``Tup``.

JAX 0.10.2's ``pallas_call`` takes hi-typed operands and results
(``_pallas_call_to_lojax`` in ``jax/_src/pallas/pallas_call.py``): each hi
operand becomes its lo components, each ``BlockSpec`` -- written over the
value's dense shape, as a user thinks of a weight -- is lowered per component
by the type's ``lower_block_spec``, and inside the kernel a ref of a hi type is
read (``ref[...]``, ``ref[0:8, :]``) and written (``ref[...] = v``) as hi
values through the type's ``ref_get_*``/``ref_swap_*`` methods, which apply the
index to each component. The protocol is JAX's (its ``PallasHiJaxTest`` toy
types implement the same methods); this module holds the logic the hi types
share, described per type by

* ``components``: for each lo component (in ``lo_ty`` order), the dense axes
  it has, in order. ``q8[*l, n]``: values all axes, scale ``*l`` (one scale
  per row). ``r1[*b, m, n]``: ``col`` ``(*b, m)``, ``row`` ``(*b, n)``.
* ``structural``: dense axes a component lacks. An index may slice them (a
  slice of a row keeps the row's scale) but not pick one element (that would
  leave no ``q8``), and a write must cover them whole (writing half a row with
  its own scale would rescale the other half).
* ``group``: elements per scale along the last axis (``None``: one scale per
  row, the only format refs take today: a ``q4``/``f8``/grouped operand is a
  ``TypeError`` that says to pass the components, ``hx.qarray_parts``; hxmlir's own
  ``matmul_q`` kernel takes every format that way, ``lowering/matmul_q_pallas.py``).
  A block or slice along a grouped axis must
  hold whole groups (:func:`check_whole_groups`, :func:`check_index`). A
  grouped format (scale ``f32[*l, n // g]``) passes its ``g``; what it adds
  here is its scale's last block dim and index, the dense ones divided by
  ``g`` (in :func:`component_block_specs` and ``_component_indexer``).

Each component's block takes the dense block's entries on its axes and the
index map's block indices on those axes: the scale's block follows the rows.
Inside kernels hxmlir's lo primitives lower as their reference semantics
(:func:`use_in_kernels`, called here when a hi type first meets
``pallas_call``).
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
  """``ty``'s name with the dense shape of the array it is a block of (``q8[16,256]``), else ``str(ty)``."""
  whole = getattr(ty, "_pallas_array_shape", None)
  if whole is None:
    return str(ty)
  return f"{str(ty).split('[')[0]}[{','.join(map(str, whole))}]"


def check_whole_groups(ty: str, block_shape: Sequence, group: int | None) -> None:
  """Raises ``TypeError`` unless the block's last dim holds whole quantization groups.

  ``ty`` names the type (``q8[16,256]``), ``block_shape`` is the dense block
  (``(8, 96)``), ``group`` the elements per scale (``None``: one scale per row,
  which any block holds whole). The block dim must be a ``pl.Blocked`` size
  (or an int) that ``group`` divides, so every block starts on a group.
  """
  if group is None:
    return
  from jax.experimental import pallas as pl
  last = block_shape[-1]
  size = _block_dim_size(last)
  if not isinstance(last, (int, pl.Blocked)) or size % group:
    raise TypeError(f"a {ty} block {tuple(block_shape)} splits quantization groups of "
                    f"size {group} along the last axis; make its last block dim a multiple "
                    f"of {group} (pl.Blocked or an int)")


def _lower_block_spec(ty, block_spec, *, components, structural, group) -> list:
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
  check_whole_groups(name, bs, group)
  whole = getattr(ty, "_pallas_array_shape", None)
  origin = _jax.pallas_block_origin() or ""
  if whole is not None and origin.startswith("outputs"):
    for a in structural:
      if _block_dim_size(bs[a]) != whole[a]:
        raise TypeError(f"the block {bs} of result {name} splits axis {a} "
                        f"({_block_dim_size(bs[a])} of {whole[a]}), which one scale or factor "
                        "spans, so each program would write it with its own part's value; "
                        "make the result's block hold the whole axis")
  return component_block_specs(block_spec, components)


def use_in_kernels() -> None:
  """Lets ``hx.*`` ops lower inside Pallas TPU (Mosaic) and GPU (Triton) kernels.

  Each of hxmlir's lo primitives then lowers in a kernel as its reference
  code (``hxmlir.lowering.reference``), as if written inline. Done
  automatically when a ``q8``/``r1``/``Tup`` is an operand or result of
  ``pl.pallas_call``; a kernel that uses ``hx.*`` ops on dense operands only
  needs this call once before it is lowered for TPU or GPU (interpret mode
  needs nothing). Idempotent; imports Pallas' TPU and Triton lowerings.
  """
  _jax.activate_pallas_kernel_rules()


def component_block_specs(block_spec, components: Sequence[Axes]) -> list:
  """One ``pl.BlockSpec`` per component: its axes' block dims and block indices."""
  from jax.experimental import pallas as pl
  use_in_kernels()
  out = []
  for axes in components:
    def index_map(*args, _axes=axes, _f=block_spec.index_map):
      idx = _f(*args)
      return tuple(idx[a] for a in _axes)
    out.append(pl.BlockSpec(tuple(block_spec.block_shape[a] for a in axes), index_map,
                            memory_space=block_spec.memory_space,
                            pipeline_mode=block_spec.pipeline_mode))
  return out


def _component_indexer(idx, axes: Axes):
  return _jax.NDIndexer(tuple(idx.indices[a] for a in axes), tuple(idx.shape[a] for a in axes),
                        idx.int_indexer_shape, validate=False)


def _is_whole(index, size: int) -> bool:
  if not isinstance(index, _jax.IndexSlice):
    return False
  try:
    return int(index.start) == 0 and int(index.size) == size and index.stride == 1
  except TypeError:  # a traced start
    return False


def check_index(ty: str, transforms: Sequence, structural: Axes, group: int | None,
                write: bool) -> None:
  """Raises ``TypeError`` for an index that would break the value's structure.

  Every transform must be an index (``ref[...]``, ``ref.at[...]``); on the
  ``structural`` axes it must slice (a read) or cover the axis whole (a write),
  and with ``group`` a slice of the last axis must start and end on group
  boundaries (static offsets only).
  """
  for t in transforms:
    if not isinstance(t, _jax.NDIndexer):
      raise TypeError(f"a ref of {ty} takes only indexing (ref[...], ref.at[...]), got {t}")
    for a in structural:
      index, size = t.indices[a], t.shape[a]
      if write and not _is_whole(index, size):
        raise TypeError(f"writing a {ty} through index {t.indices} covers part of axis {a}: "
                        "one scale or factor holds the whole axis, so a write must cover it "
                        "(write whole rows, or write the components of a lo result)")
      if not isinstance(index, _jax.IndexSlice):
        raise TypeError(f"indexing a ref of {ty} with an integer on axis {a} leaves no {ty[:2]}; "
                        "slice it (ref[i:i+1]) and dequantize or take factors first")
      if group is not None and a == len(t.shape) - 1:
        try:
          start, stop = int(index.start), int(index.start) + int(index.size)
        except TypeError as e:
          raise TypeError(f"a slice of {ty}'s grouped last axis needs a static start") from e
        if start % group or stop % group or index.stride != 1:
          raise TypeError(f"slice {start}:{stop} of {ty}'s last axis splits quantization "
                          f"groups of size {group}")


def split_transforms(transforms: Sequence, components: Sequence[Axes]) -> list[tuple]:
  """Per component, the transforms restricted to its axes."""
  return [tuple(_component_indexer(t, axes) for t in transforms) for axes in components]


def note_block_of(block_ty, array_shape):
  """``block_ty``, a block of an array of dense ``array_shape``, noting that shape.

  Pallas makes a block's type with the array type's ``update(shape=...)`` and
  then asks the block type to lower its ``BlockSpec``: the note lets that
  check a result's block against the whole array and name the array in errors.
  It is not part of the type (equality and hashing ignore it).
  """
  object.__setattr__(block_ty, "_pallas_array_shape", tuple(array_shape))
  return block_ty


# --- one walk over a (possibly nested) hi type: Tup elements, or components ----
# ``ty`` is a lo array type, a Tup (``ty.tys``), or a type with ``_pallas_layout``.

def _is_tup(ty) -> bool:
  return hasattr(ty, "tys")


def _flat(transforms):
  import jax
  return jax.tree.flatten(tuple(transforms))


def _read_type(ty, ref_aval, transforms, effects: set, write: bool):
  """The type read through a ref of ``ty`` with ``transforms``; adds the read effects."""
  if not ty.is_high:
    flat, tree = _flat(transforms)
    aval, eff = _jax.ref_get_p.abstract_eval(ref_aval.update(inner_aval=ty), *flat, tree=tree)
    effects |= set(eff)
    return aval
  if _is_tup(ty):
    return type(ty)(tuple(_read_type(t, ref_aval, transforms, effects, write) for t in ty.tys))
  layout = ty._pallas_layout()
  check_index(str(ty), transforms, layout["structural"], layout["group"], write=write)
  for lo, ts in zip(ty.lo_ty(), split_transforms(transforms, layout["components"])):
    _read_type(lo, ref_aval, ts, effects, write)  # JAX's checks of each component's index
  return ty._pallas_block_ty(transforms[-1].get_indexer_shape() if transforms else ty.shape)


def _type_leaves(ty, transforms):
  """``(lo type, its transforms)`` for every lo array of ``ty``, in ``lo_ty`` order."""
  return _leaves(ty, None, transforms, types=True)


def _leaves(ty, refs, transforms, types: bool = False):
  """``(lo ref, its transforms)`` for every lo array under a hi ref's value ``refs``."""
  if not ty.is_high:
    return [(ty if types else refs, tuple(transforms))]
  if _is_tup(ty):
    elts = ty.tys if types else refs.elts
    return [leaf for t, e in zip(ty.tys, elts) for leaf in _leaves(t, e, transforms, types)]
  components = ty._pallas_layout()["components"]
  parts = ty.lo_ty() if types else ty.lower_val(refs)
  return [leaf for lo, r, ts in zip(ty.lo_ty(), parts, split_transforms(transforms, components))
          for leaf in _leaves(lo, r, ts, types)]


# --- the methods JAX's Pallas calls on a hi type ------------------------------
# register_type adds them to q8 and r1, which define
# ``_pallas_layout(rank=None) -> dict(components=, structural=, group=)`` and
# ``_pallas_block_ty(shape)`` (their unsharded type of dense ``shape``), and to
# Tup, which applies them to each element.

def update(self, shape=None, **_):
  """The type of a block of dense ``shape`` of an array of this type (Pallas' ``aval.update``)."""
  if shape is None:
    return self
  if _is_tup(self):
    return type(self)(tuple(t.update(shape=shape) for t in self.tys))
  return note_block_of(self._pallas_block_ty(tuple(shape)), self.shape)


def lower_block_spec(self, block_spec) -> list:
  """``pl.BlockSpec`` over the dense shape -> one spec per lo component.

  A component's block takes the dense block's dims on its axes and the index
  map's block indices there (a ``q8``'s scale block follows the rows); a Tup's
  block spec applies to each element. Raises ``TypeError`` naming the array's
  type and the block when the block squeezes an axis a scale or factor spans,
  when a result's block splits such an axis, or when it splits quantization
  groups.
  """
  if _is_tup(self):
    return [lo for t in self.tys
            for lo in (t.lower_block_spec(block_spec) if t.is_high else [block_spec])]
  layout = self._pallas_layout(len(block_spec.block_shape))
  return _lower_block_spec(self, block_spec, **layout)


def ref_get_abstract_eval(self, ref_aval, *args, tree):
  """Type of ``ref[idx]`` for a ref of this type: this type, indexed (a slice of a ``q8`` is a ``q8``)."""
  import jax
  effects: set = set()
  return _read_type(self, ref_aval, jax.tree.unflatten(tree, args), effects, False), effects


def ref_swap_abstract_eval(self, ref_aval, val_aval, *args, tree):
  """Type of ``ref[idx] = v``'s old value; ``v`` must have the indexed type."""
  import jax
  transforms = jax.tree.unflatten(tree, args)
  effects: set = set()
  out = _read_type(self, ref_aval, transforms, effects, True)
  if not _jax.typematch(val_aval, out):
    raise TypeError(f"writing {val_aval} to a ref of {self} at {transforms[-1].indices}: the "
                    f"indexed ref holds {out}")
  # every component's write has the same effect (a write to operand 0): take the first's
  lo_ty, ts = _type_leaves(self, transforms)[0]
  flat, tree = _flat(ts)
  lo_ref = ref_aval.update(inner_aval=lo_ty)
  lo_val, _ = _jax.ref_get_p.abstract_eval(lo_ref, *flat, tree=tree)
  _, write_effects = _jax.ref_swap_p.abstract_eval(lo_ref, lo_val, *flat, tree=tree)
  return out, write_effects


def check_write(ref_aval, val_aval, transforms) -> None:
  """Refuses ``ref[idx] = v`` where a hi type meets a type it cannot be written as.

  ``ref_aval``: the ref's ``AbstractRef``; ``val_aval``: ``v``'s type; ``transforms``:
  the index (empty for a whole-ref write such as ``o_ref[...] = v``). Writes through
  an index into a hi ref are checked by :func:`ref_swap_abstract_eval`; this covers
  the rest: a whole hi ref must receive a value of its exact type, and a hi value
  cannot go into an array ref. Raises ``TypeError`` naming both types.
  """
  if not isinstance(ref_aval, _jax.AbstractRef):
    return
  held = ref_aval.inner_aval
  val_high = getattr(val_aval, "is_high", False)
  if held.is_high and transforms:
    return  # ref_swap_abstract_eval checks it, index and all
  if held.is_high and not _jax.typematch(val_aval, held):
    raise TypeError(f"writing {val_aval} to a ref of {held}: a write of the whole ref takes "
                    f"a value of its type {held}")
  if val_high and not held.is_high:
    where = f" at {transforms[-1].indices}" if transforms else ""
    raise TypeError(f"writing {val_aval} to a ref of {held}{where}: an array ref holds "
                    f"arrays; write the components (e.g. hx.dequantize(v), hx.qarray_parts(v)) "
                    f"or give the ref the type {val_aval}")


def ref_get_to_lojax(self, ref, idx):
  """``ref[idx]`` on the components: each lo array indexed on its axes."""
  leaves = _leaves(self, ref.ref._refs, (*ref.transforms, idx))
  outs = []
  for lo_ref, ts in leaves:
    flat, tree = _flat(ts)
    outs.append(_jax.ref_get_p.bind(lo_ref, *flat, tree=tree))
  return self.raise_val(*outs)


def ref_swap_to_lojax(self, ref, val, idx):
  """``ref[idx] = val`` on the components: each lo array swapped on its axes."""
  import jax
  leaves = _leaves(self, ref.ref._refs, (*ref.transforms, idx))
  outs = []
  val_ty = jax.typeof(val)
  for (lo_ref, ts), lo_val in zip(leaves, val_ty.lower_val(val)):
    flat, tree = _flat(ts)
    outs.append(_jax.ref_swap_p.bind(lo_ref, lo_val, *flat, tree=tree))
  return val_ty.raise_val(*outs)


def transform_ndindexer(self, idx):
  """The type of ``ref.at[idx]`` for a ref of this type."""
  if _is_tup(self):
    return type(self)(tuple(t.transform_ndindexer(idx) if t.is_high
                            else idx.transform_type(t) for t in self.tys))
  layout = self._pallas_layout()
  check_index(str(self), (idx,), layout["structural"], layout["group"], write=False)
  return self._pallas_block_ty(idx.get_indexer_shape())


def register_type(ty: type) -> None:
  """Makes hi type ``ty`` an operand and result type of ``pl.pallas_call``.

  Adds the methods JAX's Pallas and ref primitives call (``update``,
  ``lower_block_spec``, ``ref_get_abstract_eval``, ``ref_swap_abstract_eval``,
  ``ref_get_to_lojax``, ``ref_swap_to_lojax``, ``transform_ndindexer``) and
  registers ``ty`` with JAX's indexing (``ref.at[...]`` of its refs).
  """
  for f in (update, lower_block_spec, ref_get_abstract_eval, ref_swap_abstract_eval,
            ref_get_to_lojax, ref_swap_to_lojax, transform_ndindexer):
    setattr(ty, f.__name__, f)
  _jax.register_indexer_transform_type(ty)


_jax.install_ref_write_check(check_write)
