"""The methods JAX's Pallas calls on a hi type (``update``, ``lower_block_spec``, the ref
reads and writes, ``transform_ndindexer``), one set for array-like hi types (``q8`` and the
other quantized types, ``r1``), one for ``Tup`` (each element's), and the walk over a
(possibly nested) hi type they share.
"""

from __future__ import annotations

from hxmlir import _jax
from hxmlir.pallas.blocks import (
    _layout,
    _lower_block_spec,
    array_name,
    check_index,
    check_whole_groups,
    is_tup,
    note_block_of,
    split_transforms,
)
from hxmlir.pallas.forms import (
    _unit_reshape,
    is_kernel_form,
    kernel_form,
    use_in_kernels,
    value_type,
)

# --- one walk over a (possibly nested) hi type: Tup elements, or components ----
# ``ty`` is a lo array type, a Tup (``ty.tys``), or a type with ``_pallas_layout``.

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
  if is_tup(ty):
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
  if is_tup(ty):
    elts = ty.tys if types else refs.elts
    return [leaf for t, e in zip(ty.tys, elts) for leaf in _leaves(t, e, transforms, types)]
  layout = _layout(ty)
  parts = ty.lo_ty() if types else ty.lower_val(refs)
  read = _indexed_type(ty, transforms).lo_ty()
  return [(r, ts, v.shape) for r, ts, v in zip(parts, _split(ty, layout, transforms), read)]


# --- the methods JAX's Pallas calls on a hi type ------------------------------
# register_type adds them to q8 and r1, which define
# ``_pallas_layout(rank=None) -> dict(components=, structural=, group=[, divisors=, pack=])``
# and ``_pallas_block_ty(shape)`` (their unsharded type of dense ``shape``);
# register_tuple_type adds them to Tup, with its own update, lower_block_spec and
# transform_ndindexer (each element's). The ref methods go through the walk above.

def update(self, shape=None, **_):
  """The type of a block of dense ``shape`` of an array of this type (Pallas' ``aval.update``):
  the block's kernel form (:func:`kernel_form`), the type of the kernel's ref."""
  use_in_kernels()
  if shape is None:
    return self
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
  layout = _layout(self)
  check_index(str(self), (idx,), layout["structural"], layout["group"], write=False,
              pack=layout["pack"])
  return self._pallas_block_ty(idx.get_indexer_shape())


# --- Tup: each element's --------------------------------------------------------

def tup_update(self, shape=None, **_):
  """A Tup's :func:`update`: each element's block of dense ``shape``."""
  use_in_kernels()
  if shape is None:
    return self
  return type(self)(tuple(t.update(shape=shape) for t in self.tys))


def tup_lower_block_spec(self, block_spec) -> list:
  """A Tup's :func:`lower_block_spec`: the block spec applies to each element (its lo
  components' specs, or the spec itself for an array element), in ``lo_ty`` order."""
  return [lo for t in self.tys
          for lo in (t.lower_block_spec(block_spec) if t.is_high else [block_spec])]


def tup_transform_ndindexer(self, idx):
  """A Tup's :func:`transform_ndindexer`: each element indexed."""
  return type(self)(tuple(t.transform_ndindexer(idx) if t.is_high
                          else idx.transform_type(t) for t in self.tys))


# JAX's protocol asks these methods of the type's class (the names are JAX's).
_REF_METHODS = {"ref_get_abstract_eval": ref_get_abstract_eval,
                "ref_swap_abstract_eval": ref_swap_abstract_eval,
                "ref_get_to_lojax": ref_get_to_lojax, "ref_swap_to_lojax": ref_swap_to_lojax}
ARRAY_METHODS = {"update": update, "lower_block_spec": lower_block_spec,
                 "transform_ndindexer": transform_ndindexer, **_REF_METHODS}
TUP_METHODS = {"update": tup_update, "lower_block_spec": tup_lower_block_spec,
               "transform_ndindexer": tup_transform_ndindexer, **_REF_METHODS}


def _register(ty: type, methods: dict) -> None:
  for name, f in methods.items():
    setattr(ty, name, f)
  _jax.register_indexer_transform_type(ty)


def register_type(ty: type) -> None:
  """Makes array-like hi type ``ty`` (one with ``_pallas_layout`` and ``_pallas_block_ty``:
  the quantized types, ``r1``) an operand and result type of ``pl.pallas_call``.

  Adds the methods JAX's Pallas and ref primitives call (:data:`ARRAY_METHODS`:
  ``update``, ``lower_block_spec``, ``ref_get_abstract_eval``, ``ref_swap_abstract_eval``,
  ``ref_get_to_lojax``, ``ref_swap_to_lojax``, ``transform_ndindexer``) and registers
  ``ty`` with JAX's indexing (``ref.at[...]`` of its refs). For a ``Tup`` type (elements
  in ``tys``) it does :func:`register_tuple_type`.
  """
  if "tys" in getattr(ty, "__dataclass_fields__", {}):
    register_tuple_type(ty)
    return
  _register(ty, ARRAY_METHODS)


def register_tuple_type(ty: type) -> None:
  """Makes tuple type ``ty`` (elements in ``tys``) an operand and result type of
  ``pl.pallas_call``: :data:`TUP_METHODS`, each applied to the elements."""
  _register(ty, TUP_METHODS)
