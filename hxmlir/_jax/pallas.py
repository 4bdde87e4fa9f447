"""Pallas: hi types as ``pl.pallas_call`` operands and results, their refs, and the
rules hi primitives lower by inside kernels.

Part of the JAX seam (:mod:`hxmlir._jax`).
"""

from __future__ import annotations

import sys as _sys

# --- Pallas: hi types as operands and results of pl.pallas_call (hxmlir/pallas.py)
from jax import tree_util as _tree_util
from jax._src import core
from jax._src.state import indexing as _state_indexing
from jax._src.state import primitives as _state_primitives
from jax._src.state import types as _state_types

from hxmlir._jax._wrap import (
  _replace,
)

NDIndexer = _state_indexing.NDIndexer
"""A ref's index (``ref[0:8, :]``): ``indices`` per axis (``Slice`` or integer arrays)."""
IndexSlice = _state_indexing.Slice
AbstractRef = _state_types.AbstractRef
ref_get_p = _state_primitives.get_p
ref_swap_p = _state_primitives.swap_p


def register_indexer_transform_type(ty: type) -> None:
  """Lets JAX's ``NDIndexer.transform_type`` index hi type ``ty`` (``ty.transform_ndindexer``).

  Pallas computes the type of ``ref.at[...]`` views and of reads through it."""
  _state_indexing.indexer_transform_type_registry.add(ty)


def _wrap_ref_swap_abstract_eval(jax_rule, check_write):
  def rule(ref_aval, val_aval, *args, tree):
    check_write(ref_aval, val_aval, _tree_util.tree_unflatten(tree, args))
    return jax_rule(ref_aval, val_aval, *args, tree=tree)
  rule._hx_wraps = jax_rule
  return rule


def install_ref_write_check(check_write) -> None:
  """Runs ``check_write(ref_aval, val_aval, transforms)`` before JAX types ``ref[idx] = v``.

  JAX's ``swap_p`` types a write through a hi ref's indexer with the hi type's
  ``ref_swap_abstract_eval``, but a write of the whole ref (``o_ref[...] = v``,
  no transforms) and any write of a hi value into an array ref reach its array
  rule, which fails later in ``_swap_to_lojax`` (``safe_zip``) or on an
  ``assert``; ``check_write`` raises ``TypeError`` first (idempotent).
  """
  _replace(ref_swap_p, "abstract_eval", lambda f: _wrap_ref_swap_abstract_eval(f, check_write))


_pallas_kernel_rules: dict = {}
_pallas_kernel_rules_active: set = set()


def add_pallas_kernel_rule(prim, fn, triton_fn=None) -> None:
  """Records that ``prim`` lowers inside Pallas kernels as the traceable function ``fn``
  (``triton_fn`` in Triton kernels, when given).

  Registered into Pallas' Mosaic TPU and Triton kernel lowerings by
  :func:`activate_pallas_kernel_rules` (importing those lowerings costs about a
  second, so it happens when a hi type first meets ``pallas_call``)."""
  _pallas_kernel_rules[prim] = (fn, triton_fn or fn)
  _pallas_kernel_rules_active.discard(prim)


def activate_pallas_kernel_rules() -> None:
  """Registers every recorded kernel rule with Pallas' Mosaic TPU and Triton lowerings.

  Idempotent. Each rule is Pallas' own ``lower_fun`` of the recorded function
  (the op's reference semantics in ``jax.numpy``/``lax``), so a kernel calling
  ``hx.dequantize`` lowers as the kernel would with that code written inline.
  Mosaic GPU is left out: its lowering needs packages this install lacks."""
  pending = {p: f for p, f in _pallas_kernel_rules.items() if p not in _pallas_kernel_rules_active}
  if not pending:
    return
  from jax._src.pallas.mosaic import core as _tpu_core
  from jax._src.pallas.mosaic import lowering as _tpu_lowering
  from jax._src.pallas.triton import lowering as _triton_lowering
  for prim, (fn, triton_fn) in pending.items():
    for kernel_type in _tpu_core.CoreType:
      _tpu_lowering.lowering_rules[kernel_type].setdefault(prim, _tpu_lowering.lower_fun(fn))
    _triton_lowering.triton_lowering_rules.setdefault(
        prim, _triton_lowering.lower_fun(triton_fn, multiple_results=prim.multiple_results))
    _pallas_kernel_rules_active.add(prim)


def _wrap_pallas_call_to_lojax(jax_rule, form, to_form, from_form):
  import dataclasses

  def rule(*hi_args, jaxpr, grid_mapping, out_avals, **params):
    in_tys = [core.typeof(a) for a in hi_args]
    forms_in = [form(t) for t in in_tys]
    forms_out = tuple(form(t) for t in out_avals)
    if all(a is b for a, b in zip([*forms_in, *forms_out], [*in_tys, *out_avals])):
      return jax_rule(*hi_args, jaxpr=jaxpr, grid_mapping=grid_mapping, out_avals=out_avals,
                      **params)
    args = [to_form(t, a) for t, a in zip(in_tys, hi_args)]
    mappings = tuple(dataclasses.replace(bm, array_aval=form(bm.array_aval))
                     for bm in grid_mapping.block_mappings)
    outs = jax_rule(*args, jaxpr=jaxpr, grid_mapping=grid_mapping.replace(
        block_mappings=mappings), out_avals=forms_out, **params)
    return [from_form(t, o) for t, o in zip(out_avals, outs)]
  rule._hx_wraps = jax_rule
  return rule


def _wrap_whole_ref_access(jax_rule, applies, method, takes_value):
  # ``ref[...]`` / ``ref[...] = v`` reach JAX's rule with no transforms, which lowers a hi
  # ref component by component with the value type's own lo types: a kernel-form ref
  # goes through its type's indexed rule with the trivial index instead
  def rule(ref, *args, tree):
    lead, idx = (args[:1], args[1:]) if takes_value else ((), args)
    ty = core.typeof(ref._refs)
    if not _tree_util.tree_unflatten(tree, idx) and applies(ty):
      index = NDIndexer.make_trivial_indexer(tuple(ty.shape))
      return getattr(ty, method)(_state_types.TransformedRef(ref, ()), *lead, index)
    return jax_rule(ref, *args, tree=tree)
  rule._hx_wraps = jax_rule
  return rule


def _wrap_whole_ref_abstract_eval(jax_rule, applies, value_type, takes_value):
  # JAX types a whole-ref read (or a write's old value) as the ref's type: a kernel
  # form's value is its ordinary type
  def rule(ref_aval, *args, tree):
    out, effects = jax_rule(ref_aval, *args, tree=tree)
    idx = args[1:] if takes_value else args
    inner = getattr(ref_aval, "inner_aval", None)
    if inner is not None and not _tree_util.tree_unflatten(tree, idx) and applies(inner):
      out = value_type(out)
    return out, effects
  rule._hx_wraps = jax_rule
  return rule


def install_pallas_operand_forms(form, to_form, from_form, applies, value_type) -> None:
  """Makes ``pl.pallas_call`` pass hi operands and results in their kernel forms.

  ``form(ty)``: the type ``ty`` has inside the call (``ty`` itself when it has no
  other); ``to_form(ty, x)`` / ``from_form(ty, x)``: a value of ``ty`` into and out of
  that form. Wraps ``pallas_call_p.to_lojax`` (``_pallas_call_to_lojax``, which lowers
  each hi operand by its type's ``lower_val`` and each block by the array type's
  ``lo_ty``): operands, result types and every block mapping's array type are put in
  their forms before it runs, results taken back after. Whole-ref reads and writes
  (``ref[...]``, no index) of a ref whose type ``applies(ty)`` answers for lower through
  the type's ``ref_get_to_lojax`` / ``ref_swap_to_lojax`` with the trivial index
  (JAX's own rule would take the components as the value type's), and their values
  have the ordinary type ``value_type(ty)``. Idempotent.
  """
  from jax._src.pallas import pallas_call as _pallas_call
  _replace(_pallas_call.pallas_call_p, "to_lojax",
           lambda f: _wrap_pallas_call_to_lojax(f, form, to_form, from_form))
  _replace(ref_get_p, "to_lojax",
           lambda f: _wrap_whole_ref_access(f, applies, "ref_get_to_lojax", False))
  _replace(ref_swap_p, "to_lojax",
           lambda f: _wrap_whole_ref_access(f, applies, "ref_swap_to_lojax", True))
  _replace(ref_get_p, "abstract_eval",
           lambda f: _wrap_whole_ref_abstract_eval(f, applies, value_type, False))
  _replace(ref_swap_p, "abstract_eval",
           lambda f: _wrap_whole_ref_abstract_eval(f, applies, value_type, True))


def pallas_block_origin() -> str | None:
  """The origin (``"outputs[0]"``, ``"x_ref"``...) of the Pallas block mapping being lowered
  to lo blocks (``BlockMapping.to_lojax``), read off the Python stack; ``None`` elsewhere."""
  from jax._src.pallas import core as _pallas_core
  f = _sys._getframe(1)
  while f is not None:
    if f.f_code is _pallas_core.BlockMapping.to_lojax.__code__:
      return f.f_locals["self"].origin
    f = f.f_back
  return None

