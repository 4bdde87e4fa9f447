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
* ``divisors``: per component, dense elements per stored entry along the last
  axis (``q4``'s values: 2, a pair per byte; a grouped scale: ``g``; else 1).
* ``group`` and ``pack``: elements per scale (``None``: one per row) and per
  stored value. A block or slice along the last axis must hold whole groups and
  whole packed bytes (:func:`check_whole_groups`, :func:`check_index`): its
  component blocks and indices are the dense ones divided by the divisor.

Every format of :data:`hxmlir.formats.FORMATS` and group size is an operand and a
result (``q8``, ``q4`` int4 pairs, ``f8``, f16 scales; per row or per group); a
format with an offset (``u4o``, ``q8o``) has a third component blocked exactly
like the scale.

The kernel-side form. Inside ``pl.pallas_call`` each hi operand and result
travels as its *kernel form* (:func:`kernel_form`): the same components, each
with the dense rank, unit dims on the dense axes it lacks (a ``q8[m, n]``'s
per-row scale is ``f32[m, 1]``, an ``r1[m, n]``'s factors ``f32[m, 1]`` and
``f32[1, n]``). So every block has the array's rank and the last two dims
Mosaic tiles, and a kernel lowers for TPU from any machine (Pallas reads the
tiling of 1-D blocks from the local TPU). The form is a type of its own (a
subclass of the value's, :func:`kernel_form`) for operands, results and refs
only: a value read from a ref is the ordinary type (``ref[...]`` of a ``q8`` ref is a ``q8`` with scale
``f32[m]``), and the hook in the JAX seam
(:func:`hxmlir._jax.install_pallas_operand_forms`) reshapes operands into the
form before the call and results back after it.

Each component's block takes the dense block's entries on its axes and the
index map's block indices on those axes: the scale's block follows the rows.
Inside kernels hxmlir's lo primitives lower as their reference semantics
(:func:`use_in_kernels`, called here when a hi type first meets
``pallas_call``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from jax.experimental.hijax import register_hitype
from jax.sharding import PartitionSpec

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
  _jax.install_pallas_operand_forms(kernel_form, to_kernel_form, from_kernel_form,
                                    has_kernel_form, value_type)


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


# --- the kernel-side form of a hi type (see the module docstring) ---------------

@dataclass(frozen=True)
class KernelFormValue:
  """A value of a kernel-form type ``ty``: its lo components ``parts`` (arrays or refs)."""
  parts: tuple
  ty: object


register_hitype(KernelFormValue, lambda v: v.ty)

_FORM_CLASSES: dict = {}


def is_kernel_form(ty) -> bool:
  """Whether ``ty`` is a kernel-form type (:func:`kernel_form`)."""
  return type(ty) in _FORM_CLASSES.values()


def _form_class(cls: type) -> type:
  """The kernel-form subclass of hi type class ``cls`` (one per class)."""
  if cls not in _FORM_CLASSES:
    def lo_ty(self):
      return _form_lo_ty(self)

    def lower_val(self, v):
      return list(v.parts)

    def raise_val(self, *lo):
      return KernelFormValue(tuple(lo), self)

    def _pallas_block_ty(self, shape):
      return value_type(self)._pallas_block_ty(shape)

    # dataclass equality compares classes: a form never equals its value type
    _FORM_CLASSES[cls] = type(f"{cls.__name__}KernelForm", (cls,), dict(
        lo_ty=lo_ty, lower_val=lower_val, raise_val=raise_val,
        _pallas_block_ty=_pallas_block_ty,
        __doc__=f"The kernel-side form of a {cls.__name__} (hxmlir.pallas.kernel_form)."))
    _jax.register_indexer_transform_type(_FORM_CLASSES[cls])
  return _FORM_CLASSES[cls]


def has_kernel_form(ty) -> bool:
  """Whether ``ty`` is, or (a Tup) holds, a kernel-form type."""
  return any(has_kernel_form(t) for t in ty.tys) if _is_tup(ty) else is_kernel_form(ty)


def _retyped(ty, cls):
  return cls(**{f.name: getattr(ty, f.name) for f in dataclasses.fields(ty)})


def value_type(ty):
  """The ordinary type of kernel form ``ty`` (``ty`` itself for other types; Tups per element)."""
  if _is_tup(ty):
    return type(ty)(tuple(value_type(t) for t in ty.tys))
  if is_kernel_form(ty):
    return _retyped(ty, type(ty).__mro__[1])
  return ty


def kernel_form(ty):
  """The type hi type ``ty`` has as an operand, result or ref of ``pl.pallas_call``.

  For a type with a Pallas layout (``q8``/``q4``/``f8``, ``r1``): the same type but
  for its lo types, each component with the dense rank (unit dims on the axes it
  lacks: ``q8[m, n]``'s scale ``f32[m, 1]``); a Tup's form is its elements'; other
  types (arrays) are their own. Idempotent.
  """
  if not getattr(ty, "is_high", False):
    return ty
  if _is_tup(ty):
    tys = tuple(kernel_form(t) for t in ty.tys)
    return ty if all(a is b for a, b in zip(tys, ty.tys)) else type(ty)(tys)
  if is_kernel_form(ty) or not hasattr(ty, "_pallas_layout"):
    return ty
  form = _retyped(ty, _form_class(type(ty)))
  if hasattr(ty, "_pallas_array_shape"):
    note_block_of(form, ty._pallas_array_shape)
  return form


def _form_lo_ty(form) -> list:
  base = value_type(form)
  layout = _layout(base)
  rank = len(base.shape)
  out = []
  for lo, axes in zip(base.lo_ty(), layout["components"]):
    if len(axes) == rank:
      out.append(lo)
      continue
    shape, spec, it = [], [], iter(zip(lo.shape, tuple(lo.sharding.spec) + (None,) * lo.ndim))
    for a in range(rank):
      d, s = next(it) if a in axes else (1, None)
      shape.append(d)
      spec.append(s)
    out.append(lo.update(shape=tuple(shape),
                         sharding=lo.sharding.update(spec=PartitionSpec(*spec))))
  return out


def _unit_reshape(x, shape):
  """``x`` with unit dims inserted or removed to have ``shape`` (same elements)."""
  shape = tuple(shape)
  if tuple(x.shape) == shape:
    return x
  from jax import lax
  if len(shape) > x.ndim:
    i, pos = 0, []
    for j, d in enumerate(shape):
      if i < x.ndim and x.shape[i] == d:
        i += 1
      else:
        pos.append(j)
    return lax.expand_dims(x, pos)
  i, pos = 0, []
  for j, d in enumerate(x.shape):
    if i < len(shape) and shape[i] == d:
      i += 1
    else:
      pos.append(j)
  return lax.squeeze(x, pos)


def to_kernel_form(ty, x):
  """Value ``x`` of type ``ty`` as a value of ``kernel_form(ty)`` (components reshaped)."""
  form = kernel_form(ty)
  if form is ty:
    return x
  parts = ty.lower_val(x)
  return form.raise_val(*[_unit_reshape(p, lo.shape) for p, lo in zip(parts, form.lo_ty())])


def from_kernel_form(ty, x):
  """Value ``x`` of ``kernel_form(ty)`` as a value of ``ty``'s ordinary type."""
  vt = value_type(ty)
  form = kernel_form(vt)
  if form is vt:
    return x
  parts = form.lower_val(x)
  return vt.raise_val(*[_unit_reshape(p, lo.shape) for p, lo in zip(parts, vt.lo_ty())])


# --- one walk over a (possibly nested) hi type: Tup elements, or components ----
# ``ty`` is a lo array type, a Tup (``ty.tys``), or a type with ``_pallas_layout``.

def _is_tup(ty) -> bool:
  return hasattr(ty, "tys")


def _flat(transforms):
  import jax
  return jax.tree.flatten(tuple(transforms))


def _indexed_type(ty, transforms):
  """The ordinary type read from a ref of ``ty`` (not a Tup) through ``transforms``."""
  return ty._pallas_block_ty(transforms[-1].get_indexer_shape() if transforms else ty.shape)


def _read_type(ty, ref_aval, transforms, effects: set, write: bool):
  """The type read through a ref of ``ty`` with ``transforms``; adds the read effects."""
  if not ty.is_high:
    flat, tree = _flat(transforms)
    aval, eff = _jax.ref_get_p.abstract_eval(ref_aval.update(inner_aval=ty), *flat, tree=tree)
    effects |= set(eff)
    return aval
  if _is_tup(ty):
    return type(ty)(tuple(_read_type(t, ref_aval, transforms, effects, write) for t in ty.tys))
  layout = _layout(ty)
  check_index(str(ty), transforms, layout["structural"], layout["group"], write=write,
              pack=layout["pack"])
  for lo, ts in zip(ty.lo_ty(), _split(ty, layout, transforms)):
    _read_type(lo, ref_aval, ts, effects, write)  # JAX's checks of each component's index
  return _indexed_type(ty, transforms)


def _split(ty, layout, transforms):
  return split_transforms(transforms, layout["components"], layout["divisors"],
                          form=is_kernel_form(ty))


def _type_leaves(ty, transforms):
  """``(lo type, its transforms)`` for every lo array of ``ty``, in ``lo_ty`` order."""
  return [(lo, ts) for lo, ts, _ in _leaves(ty, None, transforms, types=True)]


def _leaves(ty, refs, transforms, types: bool = False):
  """``(lo ref, its transforms, shape)`` for every lo array under a hi ref's value ``refs``;
  ``shape``: the component's shape in the ordinary type read (``None`` for arrays)."""
  if not ty.is_high:
    return [(ty if types else refs, tuple(transforms), None)]
  if _is_tup(ty):
    elts = ty.tys if types else refs.elts
    return [leaf for t, e in zip(ty.tys, elts) for leaf in _leaves(t, e, transforms, types)]
  layout = _layout(ty)
  parts = ty.lo_ty() if types else ty.lower_val(refs)
  read = _indexed_type(ty, transforms).lo_ty()
  return [(r, ts, v.shape) for r, ts, v in zip(parts, _split(ty, layout, transforms), read)]


# --- the methods JAX's Pallas calls on a hi type ------------------------------
# register_type adds them to q8 and r1, which define
# ``_pallas_layout(rank=None) -> dict(components=, structural=, group=[, divisors=, pack=])``
# and ``_pallas_block_ty(shape)`` (their unsharded type of dense ``shape``), and to
# Tup, which applies them to each element.

def update(self, shape=None, **_):
  """The type of a block of dense ``shape`` of an array of this type (Pallas' ``aval.update``):
  the block's kernel form (:func:`kernel_form`), the type of the kernel's ref."""
  use_in_kernels()
  if shape is None:
    return self
  if _is_tup(self):
    return type(self)(tuple(t.update(shape=shape) for t in self.tys))
  layout = _layout(self)
  if len(shape) == len(self.shape):  # the block keeps the last axis: whole groups first
    check_whole_groups(array_name(note_block_of(value_type(self), self.shape)), tuple(shape),
                       layout["group"], layout["pack"])
  return kernel_form(note_block_of(self._pallas_block_ty(tuple(shape)), self.shape))


def lower_block_spec(self, block_spec) -> list:
  """``pl.BlockSpec`` over the dense shape -> one spec per lo component.

  A component's block takes the dense block's dims on its axes and the index
  map's block indices there (a ``q8``'s scale block follows the rows), in the
  component's kernel form (:func:`component_block_specs`); a Tup's block spec
  applies to each element. Raises ``TypeError`` naming the array's type and the
  block when the block squeezes an axis a scale or factor spans, when a result's
  block splits such an axis, or when it splits quantization groups or packed bytes.
  """
  if _is_tup(self):
    return [lo for t in self.tys
            for lo in (t.lower_block_spec(block_spec) if t.is_high else [block_spec])]
  layout = _layout(self, len(block_spec.block_shape))
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
  if held.is_high and not _jax.typematch(val_aval, value_type(held)):
    raise TypeError(f"writing {val_aval} to a ref of {held}: a write of the whole ref takes "
                    f"a value of its type {held}")
  if val_high and not held.is_high:
    where = f" at {transforms[-1].indices}" if transforms else ""
    raise TypeError(f"writing {val_aval} to a ref of {held}{where}: an array ref holds "
                    f"arrays; write the components (e.g. hx.dequantize(v), hx.qarray_parts(v)) "
                    f"or give the ref the type {val_aval}")


def ref_get_to_lojax(self, ref, idx):
  """``ref[idx]`` on the components: each lo array indexed on its axes (in its kernel
  form, then shaped as the ordinary type's component)."""
  outs = []
  for lo_ref, ts, shape in _leaves(self, ref.ref._refs, (*ref.transforms, idx)):
    flat, tree = _flat(ts)
    out = _jax.ref_get_p.bind(lo_ref, *flat, tree=tree)
    outs.append(out if shape is None else _unit_reshape(out, shape))
  return value_type(self).raise_val(*outs)


def ref_swap_to_lojax(self, ref, val, idx):
  """``ref[idx] = val`` on the components: each lo array swapped on its axes."""
  import jax
  outs = []
  val_ty = jax.typeof(val)
  leaves = _leaves(self, ref.ref._refs, (*ref.transforms, idx))
  for (lo_ref, ts, shape), lo_val in zip(leaves, val_ty.lower_val(val)):
    flat, tree = _flat(ts)
    held, _ = _jax.ref_get_p.abstract_eval(lo_ref.aval if hasattr(lo_ref, "aval")
                                           else jax.typeof(lo_ref), *flat, tree=tree)
    old = _jax.ref_swap_p.bind(lo_ref, _unit_reshape(lo_val, held.shape), *flat, tree=tree)
    outs.append(old if shape is None else _unit_reshape(old, shape))
  return val_ty.raise_val(*outs)


def transform_ndindexer(self, idx):
  """The type of ``ref.at[idx]`` for a ref of this type."""
  if _is_tup(self):
    return type(self)(tuple(t.transform_ndindexer(idx) if t.is_high
                            else idx.transform_type(t) for t in self.tys))
  layout = _layout(self)
  check_index(str(self), (idx,), layout["structural"], layout["group"], write=False,
              pack=layout["pack"])
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
