"""JAX's placement, sharding, debugging and array APIs on hi values: ``jax.device_put``,
``with_sharding_constraint``, ``jit``'s ``in_shardings``/``out_shardings``,
``jax.debug.print``/``callback`` and ``jnp.array`` of a traced hi value: the private
primitives and helpers the rules of :mod:`hxmlir.types.jax_apis` need, and the installers
that put those rules into JAX.

Part of the JAX seam (:mod:`hxmlir._jax`).
"""

from __future__ import annotations  # noqa: I001

import functools as _functools
import threading as _threading

# JAX 0.10.2 gives these primitives no hi rules: each installer below makes one of them
# hi-capable (``is_high`` / ``to_lojax`` / ``abstract_eval``, as JAX does for ``ref_p``)
# with rules written on the types' floor (:mod:`hxmlir.types.jax_apis`), or wraps one
# helper JAX looks up by module attribute. Every wrapper keeps JAX's original and falls
# through to it for arrays; installing twice is a no-op.
from functools import partial as _partial

from jax._src import api as _api
from jax._src import core
from jax._src import debugging as _debugging
from jax._src import pjit as _pjit
from jax._src import sharding_impls as _sharding_impls
from jax._src.hijax import MappingSpec
from jax._src.interpreters import batching as _batching

from hxmlir._jax._wrap import (
  _is_hi,
  _make_high,
  _replace,
)



# --- jax.device_put ------------------------------------------------------------
from jax._src import dispatch as _dp_dispatch

device_put_p = _dp_dispatch.device_put_p
update_dp_aval = _dp_dispatch.update_dp_aval
"""JAX's type of an array put on a ``Sharding`` (``dispatch.update_dp_aval``)."""


def _wrap_device_put_abstract_eval(jax_rule, placed_type):
  def abstract_eval(*avals, devices, srcs, copy_semantics):
    outs, effects = jax_rule(*avals, devices=devices, srcs=srcs, copy_semantics=copy_semantics)
    return [placed_type(a, d) if _is_hi(a) else o
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
    return device_put_p.bind(*xs, devices=tuple(devices), srcs=tuple(srcs),
                              copy_semantics=tuple(copy_semantics))
  _batched_device_put_impl._hx_wraps = jax_impl
  return _batched_device_put_impl


def _wrap_infer_src_sharding(jax_rule):
  def _infer_src_sharding(src, x, x_aval):
    # JAX reads x_aval.sharding / memory_space; a hi value's source is what was given
    return src if _is_hi(x_aval) else jax_rule(src, x, x_aval)
  _infer_src_sharding._hx_wraps = jax_rule
  return _infer_src_sharding


def _wrap_check_sharding(jax_rule, placed_type):
  def _check_sharding(aval, s):
    if not _is_hi(aval):
      return jax_rule(aval, s)
    placed_type(aval, s)  # TypeError: a tuple with a sharding, a Format, a bad rank
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


def install_device_put_rules(to_lojax, placed_type) -> None:
  """``jax.device_put`` of hi values, eagerly and under ``jit``, with ``None``, a
  ``Device``, a memory space or a ``NamedSharding`` of the dense shape (pytrees too).

  ``device_put_p`` becomes hi-capable (each component put by
  :func:`component_shardings`); the eager path (``dispatch._batched_device_put_impl``,
  which hands leaves to ``pxla.shard_args``) binds the primitive for hi leaves; and
  ``api``'s source-sharding inference and sharding check learn hi types.
  """
  _make_high(device_put_p, to_lojax)
  _replace(device_put_p, "abstract_eval",
           lambda f: _wrap_device_put_abstract_eval(f, placed_type))
  _replace(_dp_dispatch, "_batched_device_put_impl", _wrap_batched_device_put_impl)
  _replace(_api, "_infer_src_sharding", _wrap_infer_src_sharding)
  _replace(_api, "_check_sharding", lambda f: _wrap_check_sharding(f, placed_type))
  _replace(_pjit, "pjit_check_aval_sharding", _wrap_check_aval_sharding)


# --- jax.lax.with_sharding_constraint ----------------------------------------------
sharding_constraint_p = _pjit.sharding_constraint_p
unconstrained_dims = _pjit.get_unconstrained_dims


def sharding_constraint_aval(aval, sharding):
  """JAX's type of array ``aval`` under ``with_sharding_constraint(.., sharding)``."""
  return _pjit._sharding_constraint_abstract_eval(
      aval, sharding=sharding, layout=None, context_mesh=None, unconstrained_dims=None)


def _wrap_sharding_constraint_abstract_eval(jax_rule, constrained_type):
  def abstract_eval(x_aval, **params):
    if _is_hi(x_aval):
      return constrained_type(x_aval, params["sharding"]), set()
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


def install_sharding_constraint_rules(to_lojax, constrained_type) -> None:
  """``jax.lax.with_sharding_constraint`` of hi values (``jit``, eager, ``grad``, ``vmap``):
  one constraint per component, by :func:`component_shardings` of the dense sharding.
  On an Explicit mesh JAX refuses specs naming Explicit axes, as for arrays."""
  _make_high(sharding_constraint_p, to_lojax)
  _replace(sharding_constraint_p, "abstract_eval",
           lambda f: _wrap_sharding_constraint_abstract_eval(f, constrained_type))
  _replace(_batching.fancy_primitive_batchers, sharding_constraint_p, _wrap_leading_batcher)


# --- jax.jit(in_shardings=, out_shardings=) -----------------------------------------
_hi_jaxpr = _threading.local()


def _wrap_lojax_expand_params(jax_rule, expand_shardings):
  def _lojax_expand_params(in_avals_, out_avals, **params):
    new = jax_rule(in_avals_, out_avals, **params)
    hi = params.get("jaxpr") or getattr(_hi_jaxpr, "jaxpr", None)
    if hi is None:
      return new
    in_lol = in_avals_.unpack()[0].unpack()
    mut_lol, out_lol = out_avals.unpack()
    new["in_shardings"] = expand_shardings(in_lol, hi.in_avals, params["in_shardings"])
    new["out_shardings"] = ((_sharding_impls.UNSPECIFIED,) * len(mut_lol) + expand_shardings(
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


def install_jit_sharding_rules(expand_shardings) -> None:
  """``jax.jit(f, in_shardings=..., out_shardings=...)`` with a ``NamedSharding`` of a hi
  argument's or result's dense shape: each component gets the sharding
  :func:`component_shardings` derives (JAX would repeat the dense one per component)."""
  _replace(_pjit, "_lojax_expand_params",
           lambda f: _wrap_lojax_expand_params(f, expand_shardings))
  _replace(_pjit.jit_p, "to_lojax", _wrap_jit_to_lojax)


# --- jax.debug.print / jax.debug.callback ------------------------------------------
debug_callback_p = _debugging.debug_callback_p


def moveaxis(x, src, dst):
  """``vmap``'s ``batching.moveaxis`` as JAX calls it now (hxmlir's wrapper included)."""
  return _batching.moveaxis(x, src, dst)

def print_callback(fmt, ordered, in_tree, static_args, np_printoptions, has_placeholders,
                    logging_record):
  """JAX's own formatting callback and effect for ``debug_print_p`` (as its impl builds them)."""
  callback = _debugging._make_flat_callback(in_tree, _partial(
      _debugging._format_print_callback, fmt, dict(np_printoptions), has_placeholders,
      logging_record), static_args)
  return callback, _debugging.ordered_debug_effect if ordered else _debugging.debug_effect


def _wrap_debug_batcher(jax_rule, hi_rule):
  def batcher(axis_data, args, dims, **params):
    if any(isinstance(d, MappingSpec) for d in dims):
      return hi_rule(axis_data, args, dims, **params)
    return jax_rule(axis_data, args, dims, **params)
  batcher._hx_wraps = jax_rule
  return batcher


def install_debug_rules(callback_to_lojax, print_to_lojax, callback_batched,
                        print_batched) -> None:
  """``jax.debug.print`` / ``jax.debug.callback`` of hi values, eagerly and under ``jit``:
  the host callback receives the values rebuilt from their components (printed by the
  value class's ``repr``). Under ``vmap`` a batched hi operand is printed example by
  example, as JAX does for arrays."""
  for prim, rule, batched in (
      (debug_callback_p, callback_to_lojax, callback_batched),
      (_debugging.debug_print_p, print_to_lojax, print_batched)):
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
