"""JAX's own APIs on hi values: the typing and lowering rules that make ``jax.device_put``,
``jax.lax.with_sharding_constraint``, ``jax.jit``'s ``in_shardings``/``out_shardings``,
``jax.debug.print``/``jax.debug.callback`` and ``jax.lax.stop_gradient`` take hi values.
The seam (:mod:`hxmlir._jax.jax_apis`, :mod:`hxmlir._jax.batching`) installs
them into JAX's primitives and keeps JAX's own rules for arrays; :func:`install` does
that, once, when :mod:`hxmlir.types.hiprim` is imported.

The rules use JAX's ``HiType`` protocol plus hxmlir's own:

- ``ty.hx_lo_specs(spec, mesh) -> tuple[PartitionSpec, ...]``: the components' specs for
  a dense ``spec`` (q8: the values ``spec``, the scales ``spec`` without the last axis,
  or with the group axis sharded like the last; r1: the factors' entries; Tup:
  ``TypeError``, it has no dense sharding);
- ``ty.hx_update_sharding(s: NamedSharding) -> HiType``: the type with dense sharding ``s``.

Component specs are never read off ``ty.lo_ty()`` after a placement: ``ShapedArray``
keeps Explicit mesh axes only, so on an Auto mesh they would silently replicate.
"""

from __future__ import annotations

import jax
from jax.experimental.hijax import HiType, ShapedArray
from jax.experimental.layout import Format
from jax.sharding import NamedSharding, Sharding

from hxmlir import _jax
from hxmlir._jax import MappingSpec


def _is_hi(aval) -> bool:
  return isinstance(aval, HiType)


def _is_int_dim(d) -> bool:
  return isinstance(d, int) and not isinstance(d, bool)


def _short(ty) -> str:
  return ty.str_short(short_dtypes=True)


def _hi_after_dense_rule(ty, s, dense_rule):
  """Hi type ``ty`` after a placement JAX types for arrays by ``dense_rule``.

  JAX's rule runs on the dense array ``ty`` stands for (its tangent type for q8 and
  r1), and the type takes the resulting dense sharding; a tuple refuses (its
  ``hx_update_sharding`` raises ``TypeError``).
  """
  dense = ty.to_tangent_aval()
  if not isinstance(dense, ShapedArray):
    return ty.hx_update_sharding(s)
  return ty.hx_update_sharding(dense_rule(dense).sharding)


def component_shardings(ty, s, n: int) -> tuple:
  """The shardings of the ``n`` components of hi type ``ty`` placed by dense sharding ``s``.

  A ``NamedSharding``: one per component, by ``ty.hx_lo_specs``; a single-device or
  fully replicated sharding, a ``Device``, a memory space, ``None`` or JAX's
  UNSPECIFIED/AUTO: ``s`` for each, as JAX repeats it. Raises ``TypeError`` for any
  other multi-device sharding (hi values are placed by the spec of their dense shape).
  """
  if isinstance(s, NamedSharding):
    return tuple(NamedSharding(s.mesh, spec, memory_kind=s.memory_kind)
                 for spec in ty.hx_lo_specs(s.spec, s.mesh))
  if isinstance(s, Sharding) and s.num_devices > 1 and not s.is_fully_replicated:
    raise TypeError(f"{_short(ty)} is placed by a NamedSharding of its dense shape (or a "
                    f"Device, or a single-device sharding), got {s}")
  return (s,) * n


def placed_type(ty, d):
  """JAX's ``update_dp_aval`` for hi type ``ty`` put on ``d``."""
  if isinstance(d, Format):
    raise TypeError(f"jax.device_put of {_short(ty)} with a Format (layout): hi values take a "
                    "Sharding, Device or memory space; put its components instead")
  if isinstance(d, Sharding):
    component_shardings(ty, d, 0)  # refuses a multi-device sharding that is not named
    return _hi_after_dense_rule(ty, d, lambda a: _jax.update_dp_aval(a, d))
  return ty  # None, a Device or a memory space: the type is unchanged


def device_put_to_lojax(*xs, devices, srcs, copy_semantics):
  """``jax.device_put``'s ``to_lojax`` rule for hi values: each hi operand becomes its
  components, each placed by the component's share of the destination (a
  ``NamedSharding`` of the dense shape, a ``Device``); dense operands pass as they are.
  Raises ``TypeError`` naming the type for a destination it cannot take (a ``Tup``'s
  ``NamedSharding``, a layout)."""
  flat, dsts, srcs_lo, copies, raise_as = [], [], [], [], []
  for x, d, s, c in zip(xs, devices, srcs, copy_semantics):
    ty = jax.typeof(x)
    if not _is_hi(ty):
      flat.append(x), dsts.append(d), srcs_lo.append(s), copies.append(c)
      raise_as.append((None, 1))
      continue
    los = ty.lower_val(x)
    flat += los
    dsts += component_shardings(ty, d, len(los))
    srcs_lo += component_shardings(ty, s, len(los))
    copies += [c] * len(los)
    raise_as.append((placed_type(ty, d), len(los)))
  ys = _jax.device_put_p.bind(*flat, devices=tuple(dsts), srcs=tuple(srcs_lo),
                          copy_semantics=tuple(copies))
  out, i = [], 0
  for new_ty, k in raise_as:
    out.append(ys[i] if new_ty is None else new_ty.raise_val(*ys[i:i + k]))
    i += k
  return out


def constrained_type(ty, sharding):
  """The hi type ``ty`` with the ``NamedSharding`` ``sharding`` of its dense shape in it
  (``with_sharding_constraint``'s typing rule). Raises ``TypeError`` naming ``ty`` for a
  sharding that is not a ``NamedSharding`` or splits a quantization group."""
  if not isinstance(sharding, NamedSharding):
    raise TypeError(f"with_sharding_constraint of {_short(ty)} takes a NamedSharding (or a "
                    f"PartitionSpec under jax.set_mesh) of its dense shape, got {sharding}")
  return _hi_after_dense_rule(ty, sharding, lambda a: _jax.sharding_constraint_aval(a, sharding))


def sharding_constraint_to_lojax(x, *, sharding, layout, context_mesh, unconstrained_dims):
  """``with_sharding_constraint``'s ``to_lojax`` rule for a hi value ``x``: one constraint
  per component, each with its share of ``sharding``. Raises ``TypeError`` naming the type
  for a layout."""
  ty = jax.typeof(x)
  if layout is not None:
    raise TypeError(f"with_sharding_constraint of {_short(ty)} with a layout: constrain its "
                    "components instead")
  new_ty = constrained_type(ty, sharding)
  los = ty.lower_val(x)
  out = [_jax.sharding_constraint_p.bind(lo, sharding=s, layout=None, context_mesh=context_mesh,
                                     unconstrained_dims=_jax.unconstrained_dims(s))
         for lo, s in zip(los, component_shardings(ty, sharding, len(los)))]
  return new_ty.raise_val(*out)


def expand_shardings(lol, hi_avals, shardings) -> tuple:
  """``jax.jit``'s ``in_shardings``/``out_shardings`` of hi arguments expanded to their lo
  components: ``lol`` the lo avals, ``hi_avals`` the hi ones, ``shardings`` one per hi
  aval (a dense-shape ``NamedSharding`` becomes each component's share)."""
  # JAX prepends lo arguments for closed-over mutables (none of hxmlir's): align at the end
  skip = len(lol) - len(hi_avals)
  out = []
  for i, (los, s) in enumerate(zip(lol, shardings)):
    aval = hi_avals[i - skip] if i >= skip else None
    out += component_shardings(aval, s, len(los)) if _is_hi(aval) else (s,) * len(los)
  return tuple(out)


def _lower_args(args):
  """The flat lo values of ``args``, and a function rebuilding ``args`` from them."""
  tys = [jax.typeof(a) for a in args]
  los, counts = [], []
  for ty, a in zip(tys, args):
    parts = ty.lower_val(a) if _is_hi(ty) else [a]
    los += parts
    counts.append(len(parts))

  def raise_args(*flat):
    out, i = [], 0
    for ty, k in zip(tys, counts):
      out.append(ty.raise_val(*flat[i:i + k]) if _is_hi(ty) else flat[i])
      i += k
    return out
  return los, raise_args


def debug_callback_to_lojax(*args, callback, effect, partitioned):
  """``jax.debug.callback``'s ``to_lojax`` rule: the callback receives hi values rebuilt
  from the components it is bound with."""
  los, raise_args = _lower_args(args)
  return _jax.debug_callback_p.bind(
      *los, callback=lambda *xs: callback(*raise_args(*xs)), effect=effect,
      partitioned=partitioned)


def debug_print_to_lojax(*args, fmt, ordered, partitioned, in_tree, static_args,
                          np_printoptions, has_placeholders, logging_record):
  """``jax.debug.print``'s ``to_lojax`` rule: hi values print as hi values (their type
  and components), rebuilt on the host from the components."""
  callback, effect = _jax.print_callback(fmt, ordered, in_tree, static_args, np_printoptions,
                                     has_placeholders, logging_record)
  return debug_callback_to_lojax(*args, callback=callback, effect=effect,
                                  partitioned=partitioned)


def _example(batched_ty, ty, x, i):
  """Example ``i`` of host value ``x`` of hi type ``batched_ty`` mapped along its leading
  axis (element type ``ty``): each component that carries the batch axis is indexed
  (a tuple's unmapped elements do not)."""
  parts = [lo[i] if b.ndim == e.ndim + 1 else lo
           for lo, b, e in zip(batched_ty.lower_val(x), batched_ty.lo_ty(), ty.lo_ty())]
  return ty.raise_val(*parts)


def debug_callback_batched(axis_data, args, dims, *, callback, effect, partitioned):
  """``jax.debug.callback`` under ``vmap`` with hi operands: one callback that loops over
  the batch on the host, in JAX's order (JAX's own rule slices with ``index_in_dim``,
  which hi values do not take)."""
  # JAX unrolls the batch with lax.index_in_dim, which hi values do not take: one
  # callback instead, looping over the batch on the host in the same order
  size = axis_data.size
  args = [_jax.moveaxis(a, d, 0) if _is_int_dim(d) else a for a, d in zip(args, dims)]
  tys = [jax.typeof(a) for a in args]
  elt_tys = [t.dec_rank(size, d) if isinstance(d, MappingSpec) else None
             for t, d in zip(tys, dims)]

  def loop(*xs):
    for i in range(size):
      callback(*[x if d is None else _example(t, e, x, i) if e is not None else x[i]
                 for x, d, t, e in zip(xs, dims, tys, elt_tys)])
  _jax.debug_callback_p.bind(*args, callback=loop, effect=effect, partitioned=partitioned)
  return [], []


def debug_print_batched(axis_data, args, dims, *, fmt, ordered, partitioned, in_tree,
                         static_args, np_printoptions, has_placeholders, logging_record):
  """``jax.debug.print`` under ``vmap`` with hi operands: one print per batch element, in
  order, as :func:`debug_callback_batched`."""
  callback, effect = _jax.print_callback(fmt, ordered, in_tree, static_args, np_printoptions,
                                     has_placeholders, logging_record)
  return debug_callback_batched(axis_data, args, dims, callback=callback, effect=effect,
                                 partitioned=partitioned)


def stop_gradient_to_lojax(x):
  """``lax.stop_gradient`` of a hi value: of each component."""
  ty = jax.typeof(x)
  return ty.raise_val(*(_jax.stop_gradient_p.bind(lo) for lo in ty.lower_val(x)))


def install() -> None:
  """Installs the rules above into JAX's primitives (through the seam; idempotent)."""
  _jax.install_device_put_rules(device_put_to_lojax, placed_type)
  _jax.install_sharding_constraint_rules(sharding_constraint_to_lojax, constrained_type)
  _jax.install_jit_sharding_rules(expand_shardings)
  _jax.install_debug_rules(debug_callback_to_lojax, debug_print_to_lojax,
                           debug_callback_batched, debug_print_batched)
