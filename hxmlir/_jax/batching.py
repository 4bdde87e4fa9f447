"""``vmap``: the output rule (``batching.matchaxis``) and the batching of JAX's control
flow (``scan``/``while_loop``/``cond``/``switch``) taught hi values.

Part of the JAX seam (:mod:`hxmlir._jax`).
"""

from __future__ import annotations

import functools as _functools
import threading as _threading

from jax._src import ad_util as _ad_util
from jax._src import core
from jax._src.hijax import MappingSpec
from jax._src.interpreters import batching as _batching

from hxmlir._jax._wrap import (
  _hi_typeof,
  _is_hi,
  _is_int_dim,
  _make_high,
  _replace,
  _short,
)

# --- hi types: vmap outputs that are not mapped (hiprim.py) --------------------

vmap_infer = _batching.infer
vmap_sum_axis = _batching.sum_axis
SpecMatchError = _batching.SpecMatchError
jax_matchaxis = _batching.matchaxis
"""JAX's own ``batching.matchaxis`` (as imported, before :func:`patch_matchaxis`)."""


def patch_matchaxis(wrapper) -> None:
  """Makes ``wrapper`` JAX's ``batching.matchaxis`` (idempotent).

  JAX's ``from_elt`` calls ``batching.matchaxis`` (by attribute) to bring each
  ``vmap`` output to its ``out_axes``; JAX has that rule for arrays only. hxmlir's
  wrapper (``hiprim._matchaxis``) takes hi values and hi specs, and hands every other
  call to :data:`jax_matchaxis` unchanged -- same result, same errors -- so programs
  of arrays see JAX's behaviour. Patched once, when ``hxmlir`` is imported, for as
  long as the process lives (hi types map under ``vmap`` with or without
  ``hx.install()``). Not patched over a ``matchaxis`` someone else put there.
  """
  if _batching.matchaxis is jax_matchaxis:
    _batching.matchaxis = wrapper


def unpatch_matchaxis(wrapper) -> None:
  """Puts JAX's own ``matchaxis`` back if ``wrapper`` is the one in place (tests)."""
  if _batching.matchaxis is wrapper:
    _batching.matchaxis = jax_matchaxis


def current_matchaxis():
  """The ``batching.matchaxis`` JAX's ``vmap`` calls now."""
  return _batching.matchaxis


# --- vmap of scan / while_loop / fori_loop / cond / switch with hi values -----------
from jax._src.lax.control_flow import conditionals as _conditionals  # noqa: E402
from jax._src.lax.control_flow import loops as _loops  # noqa: E402


def _hi_spec(ty, d):
  """JAX's int batch dim ``d`` of a hi value of type ``ty``, as its mapping spec:
  ``0`` is the leading axis, the only one hi types map along."""
  if d != 0:
    raise NotImplementedError(f"vmap of a {_short(ty)} along axis {d}: hi values map along "
                              f"their leading axis only ({ty.leading_axis_spec()!r})")
  return ty.leading_axis_spec()


def _wrap_batch_jaxpr_axes(jax_rule):
  def batch_jaxpr_axes(closed_jaxpr, axis_data, in_axes, out_axes_dest):
    in_axes = [_hi_spec(a, d) if _is_hi(a) and _is_int_dim(d) else d
               for a, d in zip(closed_jaxpr.in_avals, in_axes)]
    return jax_rule(closed_jaxpr, axis_data, in_axes, out_axes_dest)
  batch_jaxpr_axes._hx_wraps = jax_rule
  return batch_jaxpr_axes


_vmap_out_axes = _threading.local()  # .user: matching the user's vmap out_axes (from_elt)


def _wrap_from_elt(jax_rule):
  def from_elt(*args, **kwargs):
    prev = getattr(_vmap_out_axes, "user", False)
    _vmap_out_axes.user = True
    try:
      return jax_rule(*args, **kwargs)
    finally:
      _vmap_out_axes.user = prev
  from_elt._hx_wraps = jax_rule
  return from_elt


def internal_batch_dst(dst, x):
  """The ``out_axes`` entry ``dst`` that ``batching.matchaxis`` should use for ``x``.

  JAX's own rules (``batch_jaxpr``, custom_jvp/vjp) instantiate outputs at dim
  ``0``; for a hi value that means its leading mapping spec. The user's own
  ``vmap(out_axes=0)`` for a hi output (reached through ``from_elt``) stays
  ``0``, so the error that names the spec to pass still fires. Called first
  by hxmlir's one ``matchaxis`` wrapper (``hiprim._matchaxis``).
  """
  if _is_int_dim(dst) and dst == 0 and not getattr(_vmap_out_axes, "user", False):
    ty = _hi_typeof(x)
    if ty is not None:
      return ty.leading_axis_spec()
  return dst


def _wrap_moveaxis(jax_rule, swap_leading_axes):
  def moveaxis(x, src, dst):
    if not isinstance(src, MappingSpec):
      return jax_rule(x, src, dst)
    if dst == 0:  # hi values are mapped along axis 0 already
      return x
    if dst == 1:  # scan xs: [B, T, ...] -> [T, B, ...]
      return swap_leading_axes(x)
    raise NotImplementedError(f"moving the batch axis of a {_short(core.typeof(x))} to "
                              f"axis {dst}: hi values map along their leading axes only")
  moveaxis._hx_wraps = jax_rule
  return moveaxis


def _wrap_broadcast(jax_rule, broadcast_unmapped):
  def broadcast(x, sz, axis, mesh_axis):
    ty = _hi_typeof(x)
    if ty is None:
      return jax_rule(x, sz, axis, mesh_axis)
    if axis != 0 or mesh_axis is not None:
      raise NotImplementedError(f"vmap broadcasting a {_short(ty)} along axis {axis} "
                                f"(mesh axis {mesh_axis}): hi values map along their "
                                "leading axis, on no explicit mesh axis")
    return broadcast_unmapped(x, sz)
  broadcast._hx_wraps = jax_rule
  return broadcast


def _wrap_control_flow_batcher(jax_rule, swap_leading_axes):
  """scan/while/cond batchers return int dims for their outputs: a hi output at dim
  ``1`` (scan ``ys``, ``[T, B, ...]``) is swapped to ``[B, T, ...]``, then dim ``0`` is
  its leading spec."""
  def batcher(axis_data, args, dims, **params):
    outs, out_dims = jax_rule(axis_data, args, dims, **params)
    new_outs, new_dims = [], []
    for x, d in zip(outs, out_dims):
      ty = _hi_typeof(x)
      if ty is not None and _is_int_dim(d):
        if d == 1:
          x, d = swap_leading_axes(x), 0
          ty = core.typeof(x)
        d = _hi_spec(ty, d)
      new_outs.append(x)
      new_dims.append(d)
    return new_outs, new_dims
  batcher._hx_wraps = jax_rule
  return batcher


def _wrap_bcast_select(jax_rule, select_n):
  def _bcast_select(pred, on_true, on_false):
    if _hi_typeof(on_true) is None:
      return jax_rule(pred, on_true, on_false)
    return select_n(pred, on_false, on_true)  # select(p, t, f) = select_n(p, f, t)
  _bcast_select._hx_wraps = jax_rule
  return _bcast_select


def _wrap_bcast_select_n(jax_rule, select_n):
  def _bcast_select_n(pred, *cases):
    if _hi_typeof(cases[0]) is None:
      return jax_rule(pred, *cases)
    return select_n(pred, *cases)
  _bcast_select_n._hx_wraps = jax_rule
  return _bcast_select_n


def _wrap_lax_asarray(jax_asarray):
  # cond/switch forward an operand that every branch returns unchanged around cond_p
  # and convert it with lax.asarray (conditionals.py); a hi value is already a JAX value
  def asarray(x):
    return x if _hi_typeof(x) is not None else jax_asarray(x)
  _functools.update_wrapper(asarray, jax_asarray)
  asarray._hx_wraps = jax_asarray
  return asarray


def install_vmap_control_flow(*, swap_leading_axes, select_n, broadcast_unmapped,
                              stop_gradient_to_lojax) -> None:
  """``vmap`` of ``lax.scan``/``while_loop``/``fori_loop``/``cond``/``switch`` where hi
  values are batched (operands, carries, ``xs``/``ys``, branch results).

  JAX's rules speak int batch dims; here an int dim ``0`` of a hi value means its
  ``leading_axis_spec()`` (in ``batch_jaxpr_axes``, in ``matchaxis`` through
  :func:`internal_batch_dst`, and in the rules'
  outputs), and the array helpers they call learn hi values: ``moveaxis`` to axis 1
  is ``swap_leading_axes(x)``, ``broadcast`` is ``broadcast_unmapped(x, size)``, the
  batched-predicate merge of ``cond`` is ``select_n(which, *cases)``; a hi operand that
  every branch of a ``cond``/``switch`` returns unchanged (forwarded around ``cond_p``,
  then ``lax.asarray``'d) passes ``lax.asarray`` as it is; and
  ``lax.stop_gradient`` takes hi values (``stop_gradient_to_lojax``). A hi output of ``vmap`` itself
  still needs its spec in ``out_axes`` (``0`` is refused, naming the spec). hxmlir.types.control_flow passes
  its hi primitives for the three callables.
  """
  _replace(_batching, "batch_jaxpr_axes", _wrap_batch_jaxpr_axes)
  _replace(_batching, "from_elt", _wrap_from_elt)
  _replace(_batching, "moveaxis", lambda f: _wrap_moveaxis(f, swap_leading_axes))
  _replace(_batching, "broadcast", lambda f: _wrap_broadcast(f, broadcast_unmapped))
  for prim in (_loops.scan_p, _loops.while_p, _conditionals.cond_p):
    _replace(_batching.fancy_primitive_batchers, prim,
             lambda f: _wrap_control_flow_batcher(f, swap_leading_axes))
  _replace(_conditionals, "_bcast_select", lambda f: _wrap_bcast_select(f, select_n))
  _replace(_conditionals, "_bcast_select_n", lambda f: _wrap_bcast_select_n(f, select_n))
  _replace(_conditionals.lax, "asarray", _wrap_lax_asarray)
  _make_high(stop_gradient_p, stop_gradient_to_lojax)


stop_gradient_p = _ad_util.stop_gradient_p
