"""JAX's placement, sharding, debugging and array APIs on hi values: ``jax.device_put``,
``with_sharding_constraint``, ``jit``'s ``in_shardings``/``out_shardings``,
``jax.debug.print``/``callback`` and ``jnp.array`` of a traced hi value.

Part of the JAX seam (:mod:`hxmlir._jax`).
"""

from __future__ import annotations

import functools as _functools
import threading as _threading

# =============================================================================
# Hi values in JAX's placement, sharding, debugging and control-flow APIs
# (issue 14). JAX 0.10.2 gives these primitives no hi rules: each function below
# makes one of them hi-capable (``is_high`` / ``to_lojax`` / ``abstract_eval``, as JAX
# does for ``ref_p``) or wraps one helper JAX looks up by module attribute. Every
# wrapper keeps JAX's original and falls through to it for arrays; installing twice
# is a no-op. The rules use JAX's ``HiType`` protocol plus hxmlir's own:
#   ``ty.hx_lo_specs(spec) -> tuple[PartitionSpec, ...]``: the components' specs for a
#       dense ``spec`` (q8: the values ``spec``, the scales ``spec`` without the last
#       axis; r1: the factors' entries; Tup: ``TypeError``, it has no dense sharding);
#   ``ty.hx_update_sharding(s: NamedSharding) -> HiType``: the type with dense sharding ``s``.
# Component specs are never read off ``ty.lo_ty()`` after a placement: ``ShapedArray``
# keeps Explicit mesh axes only, so on an Auto mesh they would silently replicate.
# =============================================================================
from functools import partial as _partial  # noqa: E402

from jax._src import api as _api  # noqa: E402
from jax._src import core
from jax._src import debugging as _debugging  # noqa: E402
from jax._src import pjit as _pjit  # noqa: E402
from jax._src import sharding_impls as _sharding_impls
from jax._src.hijax import MappingSpec
from jax._src.interpreters import batching as _batching
from jax._src.layout import Format as _Format  # noqa: E402
from jax._src.sharding import Sharding as _Sharding  # noqa: E402

from hxmlir._jax._wrap import (
  _is_hi,
  _is_int_dim,
  _make_high,
  _replace,
  _short,
)

_NamedSharding = _sharding_impls.NamedSharding










def _hi_after_dense_rule(ty, s, dense_rule):
  """Hi type ``ty`` after a placement JAX types for arrays by ``dense_rule``.

  JAX's rule runs on the dense array ``ty`` stands for (its tangent type for q8 and
  r1), and the type takes the resulting dense sharding; a tuple refuses (its
  ``hx_update_sharding`` raises ``TypeError``).
  """
  dense = ty.to_tangent_aval()
  if not isinstance(dense, core.ShapedArray):
    return ty.hx_update_sharding(s)
  return ty.hx_update_sharding(dense_rule(dense).sharding)


def component_shardings(ty, s, n: int) -> tuple:
  """The shardings of the ``n`` components of hi type ``ty`` placed by dense sharding ``s``.

  A ``NamedSharding``: one per component, by ``ty.hx_lo_specs``; a single-device or
  fully replicated sharding, a ``Device``, a memory space, ``None`` or JAX's
  UNSPECIFIED/AUTO: ``s`` for each, as JAX repeats it. Raises ``TypeError`` for any
  other multi-device sharding (hi values are placed by the spec of their dense shape).
  """
  if isinstance(s, _NamedSharding):
    return tuple(_NamedSharding(s.mesh, spec, memory_kind=s.memory_kind)
                 for spec in ty.hx_lo_specs(s.spec, s.mesh))
  if isinstance(s, _Sharding) and s.num_devices > 1 and not s.is_fully_replicated:
    raise TypeError(f"{_short(ty)} is placed by a NamedSharding of its dense shape (or a "
                    f"Device, or a single-device sharding), got {s}")
  return (s,) * n


# --- jax.device_put ------------------------------------------------------------
from jax._src import dispatch as _dp_dispatch  # noqa: E402

_device_put_p = _dp_dispatch.device_put_p


def _placed_type(ty, d):
  """JAX's ``update_dp_aval`` for hi type ``ty`` put on ``d``."""
  if isinstance(d, _Format):
    raise TypeError(f"jax.device_put of {_short(ty)} with a Format (layout): hi values take a "
                    "Sharding, Device or memory space; put its components instead")
  if isinstance(d, _Sharding):
    component_shardings(ty, d, 0)  # refuses a multi-device sharding that is not named
    return _hi_after_dense_rule(ty, d, lambda a: _dp_dispatch.update_dp_aval(a, d))
  return ty  # None, a Device or a memory space: the type is unchanged


def _device_put_to_lojax(*xs, devices, srcs, copy_semantics):
  flat, dsts, srcs_lo, copies, raise_as = [], [], [], [], []
  for x, d, s, c in zip(xs, devices, srcs, copy_semantics):
    ty = core.typeof(x)
    if not _is_hi(ty):
      flat.append(x), dsts.append(d), srcs_lo.append(s), copies.append(c)
      raise_as.append((None, 1))
      continue
    los = ty.lower_val(x)
    flat += los
    dsts += component_shardings(ty, d, len(los))
    srcs_lo += component_shardings(ty, s, len(los))
    copies += [c] * len(los)
    raise_as.append((_placed_type(ty, d), len(los)))
  ys = _device_put_p.bind(*flat, devices=tuple(dsts), srcs=tuple(srcs_lo),
                          copy_semantics=tuple(copies))
  out, i = [], 0
  for new_ty, k in raise_as:
    out.append(ys[i] if new_ty is None else new_ty.raise_val(*ys[i:i + k]))
    i += k
  return out


def _wrap_device_put_abstract_eval(jax_rule):
  def abstract_eval(*avals, devices, srcs, copy_semantics):
    outs, effects = jax_rule(*avals, devices=devices, srcs=srcs, copy_semantics=copy_semantics)
    return [_placed_type(a, d) if _is_hi(a) else o
            for a, o, d in zip(avals, outs, devices)], effects
  abstract_eval._hx_wraps = jax_rule
  return abstract_eval


def _wrap_batched_device_put_impl(jax_impl):
  def _batched_device_put_impl(*xs, devices, srcs, copy_semantics, dst_avals):
    if not any(_is_hi(core.typeof(x)) for x in xs):
      return jax_impl(*xs, devices=devices, srcs=srcs, copy_semantics=copy_semantics,
                      dst_avals=dst_avals)
    # the eval trace runs a hi primitive through its to_lojax rule, then JAX's impl
    # on the components
    return _device_put_p.bind(*xs, devices=tuple(devices), srcs=tuple(srcs),
                              copy_semantics=tuple(copy_semantics))
  _batched_device_put_impl._hx_wraps = jax_impl
  return _batched_device_put_impl


def _wrap_infer_src_sharding(jax_rule):
  def _infer_src_sharding(src, x, x_aval):
    # JAX reads x_aval.sharding / memory_space; a hi value's source is what was given
    return src if _is_hi(x_aval) else jax_rule(src, x, x_aval)
  _infer_src_sharding._hx_wraps = jax_rule
  return _infer_src_sharding


def _wrap_check_sharding(jax_rule):
  def _check_sharding(aval, s):
    if not _is_hi(aval):
      return jax_rule(aval, s)
    _placed_type(aval, s)  # TypeError: a tuple with a sharding, a Format, a bad rank
    if hasattr(aval, "shape"):  # JAX's checks of the dense shape (even division, ...)
      jax_rule(aval, s)
  _check_sharding._hx_wraps = jax_rule
  return _check_sharding


def _wrap_check_aval_sharding(jax_rule):
  def pjit_check_aval_sharding(shardings, flat_avals, names, what_aval, allow_uneven_sharding):
    keep = []
    for s, a, n in zip(shardings, flat_avals, names):
      if _is_hi(a) and not hasattr(a, "shape"):  # a tuple: no dense shape to check
        if not isinstance(s, _sharding_impls.UnspecifiedValue):
          a.hx_update_sharding(s)  # raises TypeError naming the tuple
        continue
      keep.append((s, a, n))
    if keep:
      jax_rule(*map(list, zip(*keep)), what_aval, allow_uneven_sharding)
  pjit_check_aval_sharding._hx_wraps = jax_rule
  return pjit_check_aval_sharding




def install_device_put_rules() -> None:
  """``jax.device_put`` of hi values, eagerly and under ``jit``, with ``None``, a
  ``Device``, a memory space or a ``NamedSharding`` of the dense shape (pytrees too).

  ``device_put_p`` becomes hi-capable (each component put by
  :func:`component_shardings`); the eager path (``dispatch._batched_device_put_impl``,
  which hands leaves to ``pxla.shard_args``) binds the primitive for hi leaves; and
  ``api``'s source-sharding inference and sharding check learn hi types.
  """
  _make_high(_device_put_p, _device_put_to_lojax)
  _replace(_device_put_p, "abstract_eval", _wrap_device_put_abstract_eval)
  _replace(_dp_dispatch, "_batched_device_put_impl", _wrap_batched_device_put_impl)
  _replace(_api, "_infer_src_sharding", _wrap_infer_src_sharding)
  _replace(_api, "_check_sharding", _wrap_check_sharding)
  _replace(_pjit, "pjit_check_aval_sharding", _wrap_check_aval_sharding)


# --- jax.lax.with_sharding_constraint ----------------------------------------------
_sharding_constraint_p = _pjit.sharding_constraint_p


def _constrained_type(ty, sharding):
  if not isinstance(sharding, _NamedSharding):
    raise TypeError(f"with_sharding_constraint of {_short(ty)} takes a NamedSharding (or a "
                    f"PartitionSpec under jax.set_mesh) of its dense shape, got {sharding}")
  return _hi_after_dense_rule(ty, sharding, lambda a: _pjit._sharding_constraint_abstract_eval(
      a, sharding=sharding, layout=None, context_mesh=None, unconstrained_dims=None))


def _sharding_constraint_to_lojax(x, *, sharding, layout, context_mesh, unconstrained_dims):
  ty = core.typeof(x)
  if layout is not None:
    raise TypeError(f"with_sharding_constraint of {_short(ty)} with a layout: constrain its "
                    "components instead")
  new_ty = _constrained_type(ty, sharding)
  los = ty.lower_val(x)
  out = [_sharding_constraint_p.bind(lo, sharding=s, layout=None, context_mesh=context_mesh,
                                     unconstrained_dims=_pjit.get_unconstrained_dims(s))
         for lo, s in zip(los, component_shardings(ty, sharding, len(los)))]
  return new_ty.raise_val(*out)


def _wrap_sharding_constraint_abstract_eval(jax_rule):
  def abstract_eval(x_aval, **params):
    if _is_hi(x_aval):
      return _constrained_type(x_aval, params["sharding"]), set()
    return jax_rule(x_aval, **params)
  abstract_eval._hx_wraps = jax_rule
  return abstract_eval


def _wrap_leading_batcher(jax_rule):
  """A batcher that JAX wrote for int batch dims, given a hi value mapped by a spec:
  hi values map along their leading axis, so JAX's rule runs with dim 0."""
  def batcher(axis_data, vals_in, dims_in, **params):
    if not any(isinstance(d, MappingSpec) for d in dims_in):
      return jax_rule(axis_data, vals_in, dims_in, **params)
    (d,) = dims_in
    y, _ = jax_rule(axis_data, vals_in, (0,), **params)
    return y, d
  batcher._hx_wraps = jax_rule
  return batcher


def install_sharding_constraint_rules() -> None:
  """``jax.lax.with_sharding_constraint`` of hi values (``jit``, eager, ``grad``, ``vmap``):
  one constraint per component, by :func:`component_shardings` of the dense sharding.
  On an Explicit mesh JAX refuses specs naming Explicit axes, as for arrays."""
  _make_high(_sharding_constraint_p, _sharding_constraint_to_lojax)
  _replace(_sharding_constraint_p, "abstract_eval", _wrap_sharding_constraint_abstract_eval)
  _replace(_batching.fancy_primitive_batchers, _sharding_constraint_p, _wrap_leading_batcher)


# --- jax.jit(in_shardings=, out_shardings=) -----------------------------------------
_hi_jaxpr = _threading.local()


def _expand_shardings(lol, hi_avals, shardings) -> tuple:
  # JAX prepends lo arguments for closed-over mutables (none of hxmlir's): align at the end
  skip = len(lol) - len(hi_avals)
  out = []
  for i, (los, s) in enumerate(zip(lol, shardings)):
    aval = hi_avals[i - skip] if i >= skip else None
    out += component_shardings(aval, s, len(los)) if _is_hi(aval) else (s,) * len(los)
  return tuple(out)


def _wrap_lojax_expand_params(jax_rule):
  def _lojax_expand_params(in_avals_, out_avals, **params):
    new = jax_rule(in_avals_, out_avals, **params)
    hi = params.get("jaxpr") or getattr(_hi_jaxpr, "jaxpr", None)
    if hi is None:
      return new
    in_lol = in_avals_.unpack()[0].unpack()
    mut_lol, out_lol = out_avals.unpack()
    new["in_shardings"] = _expand_shardings(in_lol, hi.in_avals, params["in_shardings"])
    new["out_shardings"] = ((_sharding_impls.UNSPECIFIED,) * len(mut_lol) + _expand_shardings(
        out_lol.unpack(), hi.out_avals, params["out_shardings"]))
    return new
  _lojax_expand_params._hx_wraps = jax_rule
  return _lojax_expand_params


def _wrap_jit_to_lojax(jax_rule):
  # JAX's jit to_lojax does not pass its hi jaxpr on to _lojax_expand_params: keep it
  # visible for the duration of the call (nested jits nest)
  def _to_lojax(*hi_args, jaxpr, **params):
    prev = getattr(_hi_jaxpr, "jaxpr", None)
    _hi_jaxpr.jaxpr = jaxpr
    try:
      return jax_rule(*hi_args, jaxpr=jaxpr, **params)
    finally:
      _hi_jaxpr.jaxpr = prev
  _to_lojax._hx_wraps = jax_rule
  return _to_lojax


def install_jit_sharding_rules() -> None:
  """``jax.jit(f, in_shardings=..., out_shardings=...)`` with a ``NamedSharding`` of a hi
  argument's or result's dense shape: each component gets the sharding
  :func:`component_shardings` derives (JAX would repeat the dense one per component)."""
  _replace(_pjit, "_lojax_expand_params", _wrap_lojax_expand_params)
  _replace(_pjit.jit_p, "to_lojax", _wrap_jit_to_lojax)


# --- jax.debug.print / jax.debug.callback ------------------------------------------
def _lower_args(args):
  """The flat lo values of ``args``, and a function rebuilding ``args`` from them."""
  tys = [core.typeof(a) for a in args]
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


def _debug_callback_to_lojax(*args, callback, effect, partitioned):
  los, raise_args = _lower_args(args)
  return _debugging.debug_callback_p.bind(
      *los, callback=lambda *xs: callback(*raise_args(*xs)), effect=effect,
      partitioned=partitioned)


def _debug_print_to_lojax(*args, fmt, ordered, partitioned, in_tree, static_args,
                          np_printoptions, has_placeholders, logging_record):
  callback, effect = _print_callback(fmt, ordered, in_tree, static_args, np_printoptions,
                                     has_placeholders, logging_record)
  return _debug_callback_to_lojax(*args, callback=callback, effect=effect,
                                  partitioned=partitioned)


def _print_callback(fmt, ordered, in_tree, static_args, np_printoptions, has_placeholders,
                    logging_record):
  """JAX's own formatting callback and effect for ``debug_print_p`` (as its impl builds them)."""
  callback = _debugging._make_flat_callback(in_tree, _partial(
      _debugging._format_print_callback, fmt, dict(np_printoptions), has_placeholders,
      logging_record), static_args)
  return callback, _debugging.ordered_debug_effect if ordered else _debugging.debug_effect


def _example(batched_ty, ty, x, i):
  """Example ``i`` of host value ``x`` of hi type ``batched_ty`` mapped along its leading
  axis (element type ``ty``): each component that carries the batch axis is indexed
  (a tuple's unmapped elements do not)."""
  parts = [lo[i] if b.ndim == e.ndim + 1 else lo
           for lo, b, e in zip(batched_ty.lower_val(x), batched_ty.lo_ty(), ty.lo_ty())]
  return ty.raise_val(*parts)


def _debug_callback_batched(axis_data, args, dims, *, callback, effect, partitioned):
  # JAX unrolls the batch with lax.index_in_dim, which hi values do not take: one
  # callback instead, looping over the batch on the host in the same order
  size = axis_data.size
  args = [_batching.moveaxis(a, d, 0) if _is_int_dim(d) else a for a, d in zip(args, dims)]
  tys = [core.typeof(a) for a in args]
  elt_tys = [t.dec_rank(size, d) if isinstance(d, MappingSpec) else None
             for t, d in zip(tys, dims)]

  def loop(*xs):
    for i in range(size):
      callback(*[x if d is None else _example(t, e, x, i) if e is not None else x[i]
                 for x, d, t, e in zip(xs, dims, tys, elt_tys)])
  _debugging.debug_callback_p.bind(*args, callback=loop, effect=effect, partitioned=partitioned)
  return [], []


def _debug_print_batched(axis_data, args, dims, *, fmt, ordered, partitioned, in_tree,
                         static_args, np_printoptions, has_placeholders, logging_record):
  callback, effect = _print_callback(fmt, ordered, in_tree, static_args, np_printoptions,
                                     has_placeholders, logging_record)
  return _debug_callback_batched(axis_data, args, dims, callback=callback, effect=effect,
                                 partitioned=partitioned)


def _wrap_debug_batcher(jax_rule, hi_rule):
  def batcher(axis_data, args, dims, **params):
    if any(isinstance(d, MappingSpec) for d in dims):
      return hi_rule(axis_data, args, dims, **params)
    return jax_rule(axis_data, args, dims, **params)
  batcher._hx_wraps = jax_rule
  return batcher


def install_debug_rules() -> None:
  """``jax.debug.print`` / ``jax.debug.callback`` of hi values, eagerly and under ``jit``:
  the host callback receives the values rebuilt from their components (printed by the
  value class's ``repr``). Under ``vmap`` a batched hi operand is printed example by
  example, as JAX does for arrays."""
  for prim, rule, batched in (
      (_debugging.debug_callback_p, _debug_callback_to_lojax, _debug_callback_batched),
      (_debugging.debug_print_p, _debug_print_to_lojax, _debug_print_batched)):
    _make_high(prim, rule)
    _replace(_batching.fancy_primitive_batchers, prim,
             lambda f, batched=batched: _wrap_debug_batcher(f, batched))



# =============================================================================
# JAX's array API on hi values (hiprim.refuse_array_api): the names JAX forwards
# from a tracer to its type (``x + y`` -> ``typeof(x)._add(x, y)``, ``x.sum()`` ->
# ``typeof(x).sum.fun(x)``, ``x.T`` -> ``typeof(x).T.fget(x)``; jax/_src/core.py's
# ``Tracer`` and jax/_src/numpy/array_methods.py's ``_set_tracer_aval_forwarding``),
# and ``__jax_array__``, which jax.numpy calls on every operand that is not an array.
# Nothing of JAX's is changed: hiprim sets these on hxmlir's own classes (methods and
# properties as jax.experimental.hijax's public ``aval_method``/``aval_property``).
# =============================================================================

import jax.numpy as _jnp  # noqa: E402
from jax._src.numpy import array_constructors as _array_constructors  # noqa: E402
from jax._src.numpy import array_methods as _array_methods  # noqa: E402


def array_api_names() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
  """``(operators, methods, properties)`` of ``jax.Array`` that a tracer forwards to its type.

  Operators without underscores (``add``, ``rmatmul``, ``getitem``); public
  methods (``sum``, ``reshape``, ``astype``); properties (``T``, ``at``).
  """
  return (tuple(_array_methods._array_operators),
          tuple(n for n in _array_methods._array_methods if not n.startswith("_")),
          tuple(_array_methods._array_properties))



def _wrap_jnp_array(jax_array):
  def array(object, *args, **kwargs):
    # JAX's fast path returns (or copies) any traced value as it is; a traced hi value
    # gets its type's ``__jax_array__`` refusal, as an eager one does
    if isinstance(object, core.Tracer) and _is_hi(object.aval):
      refuse = getattr(object.aval, "__jax_array__", None)
      if refuse is not None:
        refuse.fun(object)
    return jax_array(object, *args, **kwargs)
  _functools.update_wrapper(array, jax_array)
  array._hx_wraps = jax_array
  return array


def install_jnp_array_check() -> None:
  """``jnp.array(v)`` / ``jnp.asarray(v)`` of a traced hi value ``v`` call its type's
  ``__jax_array__`` (hiprim.refuse_array_api: a ``TypeError`` saying what to call).

  JAX 0.10.2's ``array`` returns a tracer unconverted (``asarray``: the hi value itself,
  silently; ``array``: a copy that fails later in ``lower_jaxpr``); eager values already
  reach ``__jax_array__``. Wraps ``array`` in ``jax._src.numpy.array_constructors``
  (``asarray`` calls it there) and ``jax.numpy.array``; arrays pass through unchanged.
  """
  _replace(_array_constructors, "array", _wrap_jnp_array)
  _replace(_jnp, "array", _wrap_jnp_array)
