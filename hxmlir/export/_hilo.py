"""The hi primitives of export: taking hi values apart into lo components, building them
back, and calling an exported artifact on hi values (each with its ``to_lojax`` rule).

They sit above the lowering (an artifact call is not an ``hx.*`` op), so their
rules are registered here rather than in ``lowering/to_lojax.py``.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
from jax.experimental.hijax import HiType, ShapedArray, Zero

from hxmlir.types import shardings as shd
from hxmlir.types import typedesc
from hxmlir.types.hiprim import HxPrimitive, is_hi, lo_types, register_to_lojax, zeros


def typeof(x):
  """The abstract type of ``x`` as export sees it: a hi type (``q8[m, n]``, ``r1``,
  ``Tup``) or ``ShapedArray`` is returned as is; a ``jax.ShapeDtypeStruct`` becomes a
  ``ShapedArray`` of its shape, dtype and weak type, keeping its sharding only when it
  is a ``NamedSharding``; anything else is ``jax.typeof(x)`` (which raises
  ``TypeError`` for a non-JAX value). A dense type's dtype is the one JAX computes with
  (``jax.dtypes.canonicalize_dtype``: ``f64`` is ``f32`` while x64 is off), as
  ``jax.export`` records it, so the signature matches the module's arguments."""
  if isinstance(x, HiType):
    return x
  if isinstance(x, jax.ShapeDtypeStruct):
    s = x.sharding if isinstance(x.sharding, jax.sharding.NamedSharding) else None
  elif isinstance(x, ShapedArray):
    s = getattr(x, "sharding", None)
    s = s if isinstance(s, jax.sharding.NamedSharding) else None
    if jax.dtypes.canonicalize_dtype(x.dtype) == x.dtype:
      return x
  else:
    return jax.typeof(x)
  dtype = jax.dtypes.canonicalize_dtype(x.dtype)
  if s is None:
    return ShapedArray(x.shape, dtype, weak_type=x.weak_type)
  return ShapedArray(x.shape, dtype, weak_type=x.weak_type, sharding=s)


def match_key(ty):
  """What a call's argument must match: the descriptor without shardings and weak types."""
  def strip(d):
    d = {k: v for k, v in d.items() if k not in ("sharding", "weak_type")}
    if "elts" in d:
      d["elts"] = [strip(e) for e in d["elts"]]
    return d
  return json.dumps(strip(typedesc.to_json(ty)), sort_keys=True)


def differentiable(ty) -> bool:
  """Whether values of ``ty`` have a non-trivial tangent: an array type when its dtype is
  inexact (``f32``, ``bf16``, ``c64``...; not ``i8``/``bool``); a hi type when its
  tangent type is (a hi tangent type when every lo component of it is)."""
  if is_hi(ty):
    return all(differentiable(t) for t in lo_types(ty.to_tangent_aval())) \
        if is_hi(ty.to_tangent_aval()) else differentiable(ty.to_tangent_aval())
  return jnp.issubdtype(ty.dtype, jnp.inexact)


class _RaiseHi(HxPrimitive):
  """``raise: lo components of ty -> ty`` (the type's ``raise_val``), for traced code."""

  def __init__(self, ty):
    self.in_avals = tuple(ty.lo_ty())
    self.out_aval = ty
    self.params = {"ty": ty}
    super().__init__()


class _LowerHi(HxPrimitive):
  """``lower: ty -> its lo components`` (the type's ``lower_val``), for traced code."""

  def __init__(self, ty):
    self.in_avals = (ty,)
    self.out_aval = tuple(ty.lo_ty())
    self.params = {"ty": ty}
    super().__init__()


@register_to_lojax(_RaiseHi)
def _raise_rule(prim, *los):
  return prim.ty.raise_val(*los)


@register_to_lojax(_LowerHi)
def _lower_rule(prim, v):
  return tuple(prim.ty.lower_val(v))


def lower_flat(tys, vals, traced: bool) -> list:
  """The flat lo components of ``vals`` (of types ``tys``, in order): arrays stay, each hi
  value becomes its ``lo_ty()`` components (``q8[m, n]`` -> ``i8[m, n]``, ``f32[m]``).
  ``traced``: inside a trace, bind the lowering as a primitive (``to_lojax`` applies it
  later) rather than call the type's ``lower_val`` on a concrete value."""
  out = []
  for ty, v in zip(tys, vals):
    if not is_hi(ty):
      out.append(v)
    elif traced:
      out.extend(_LowerHi(ty)(v))
    else:
      out.extend(ty.lower_val(v))
  return out


def raise_flat(tys, los, traced: bool) -> list:
  """Inverse of :func:`lower_flat`: the values of types ``tys`` built from the flat lo
  components ``los`` (each hi type takes ``len(ty.lo_ty())`` of them, its
  ``raise_val``). ``traced`` as in :func:`lower_flat`. ``los`` must hold all the
  components ``tys`` need."""
  it = iter(los)
  out = []
  for ty in tys:
    if not is_hi(ty):
      out.append(next(it))
      continue
    parts = [next(it) for _ in ty.lo_ty()]
    out.append(_RaiseHi(ty)(*parts) if traced else ty.raise_val(*parts))
  return out


class CallExported(HxPrimitive):
  """Calls an :class:`Exported` on hi values: ``in_types -> tuple(out_types)``."""

  def __init__(self, exported, in_tys: tuple):
    self.in_avals = in_tys
    self.out_aval = tuple(exported.out_types)
    self.params = {"exported": exported}
    super().__init__()

  def vjp_fwd(self, nzs_in, *args):
    return self(*args), args

  def batch(self, axis_data, args, dims):
    """``NotImplementedError``: an artifact's shapes are fixed (as for ``jax.export``'s own
    ``call_exported``, which has no batching rule either)."""
    mapped = [f"argument {i} ({shd.short(ty)})"
              for i, (ty, d) in enumerate(zip(self.in_avals, dims)) if d is not None]
    raise NotImplementedError(
        f"jax.vmap of {self.exported.fun_name}, an exported call, is not supported: it was "
        f"exported for {self.exported.signature()} and vmap maps {', '.join(mapped)}; export "
        "the vmapped function instead (hxmlir.export(jax.vmap(f))), or call it in a loop")

  def vjp_bwd(self, res, outgrad, *arg_accums):
    exp = self.exported
    vjp = exp.vjp()
    cts = [zeros(ty.to_tangent_aval() if is_hi(ty) else ty) if isinstance(g, Zero) else g
           for ty, g in zip(exp.out_types, outgrad) if differentiable(ty)]
    grads = iter(vjp.call(*res, *cts))
    for ty, acc in zip(exp.in_types, arg_accums):
      if differentiable(ty):
        g = next(grads)
        if hasattr(acc, "accum"):
          acc.accum(g)


@register_to_lojax(CallExported)
def _call_exported_rule(prim, *args):
  exp = prim.exported
  los = lower_flat(exp.in_types, args, traced=False)
  outs = exp.lo.call(*los)
  return tuple(raise_flat(exp.out_types, outs, traced=False))
