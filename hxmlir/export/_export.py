"""``hxmlir.export.export``: export a function whose signature holds hi types."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import export as jax_export

from hxmlir import __version__ as HXMLIR_VERSION
from hxmlir.export._exported import Exported
from hxmlir.export._hilo import differentiable, lower_flat, raise_flat, typeof
from hxmlir.export._tree import flatten, unflatten
from hxmlir.targets import check_platforms
from hxmlir.types import shardings as shd
from hxmlir.types import typedesc
from hxmlir.types.hiprim import is_hi, lo_types


def export(fn: Callable, platforms: Sequence[str] | None = None, *,
           disabled_checks: Sequence[jax_export.DisabledSafetyCheck] = ()
           ) -> Callable[..., Exported]:
  """``export(fn, platforms)(*args, **kwargs)``: exports ``fn`` for these argument types.

  ``args``/``kwargs`` are example values or types (arrays, ``jax.ShapeDtypeStruct``,
  hi values such as ``QArray``, or hi types such as ``hx.QArrayTy``) in tuples,
  lists, dicts and ``None``; results may hold the same. ``platforms`` defaults to
  the default backend's; ``("cpu", "cuda", "tpu")`` exports for all three from any
  machine. ``disabled_checks`` is passed to ``jax.export.export``.

  Returns an :class:`Exported`. Raises ``ValueError`` for a platform outside
  ``hxmlir.targets.PLATFORMS``, ``TypeError`` for containers other than
  tuple/list/dict or types without a descriptor, and whatever
  ``jax.export.export`` raises (for example on custom calls that are not
  export-stable).
  """
  if platforms is not None:
    platforms = check_platforms(platforms, "hxmlir.export.export platforms")

  def do_export(*args, **kwargs) -> Exported:
    leaves, in_tree = flatten((args, kwargs), "arguments")
    in_tys = [typeof(x) for x in leaves]
    in_tys = [_checked_type(t, f"argument {i}") for i, t in enumerate(in_tys)]
    lo_avals = [lo for t in in_tys for lo in lo_types(t)]
    out_info: dict[str, Any] = {}

    def lo_fun(*los):
      his = raise_flat(in_tys, los, traced=True)
      a, kw = unflatten(in_tree, his)
      out = fn(*a, **kw)
      out_leaves, out_tree = flatten(out, "results")
      out_tys = [_checked_type(jax.typeof(o), f"result {i}") for i, o in enumerate(out_leaves)]
      out_info.update(tree=out_tree, tys=out_tys)
      return lower_flat(out_tys, out_leaves, traced=True)

    lo_fun.__name__ = getattr(fn, "__name__", "fn")
    lo = jax_export.export(jax.jit(lo_fun), platforms=platforms,
                           disabled_checks=disabled_checks)(*map(_sds, lo_avals))
    out_tree, out_tys = out_info["tree"], out_info["tys"]

    def make_vjp() -> Exported:
      return _export_vjp(fn, lo, in_tree, in_tys, out_tree, out_tys, platforms,
                         disabled_checks)

    return Exported(lo, in_tree=in_tree, in_types=in_tys, out_tree=out_tree,
                    out_types=out_tys, hxmlir_version=HXMLIR_VERSION, vjp=make_vjp)
  return do_export


def _checked_type(ty, what: str):
  try:
    typedesc.to_json(ty)
  except typedesc.DescriptorError as e:
    raise TypeError(f"hxmlir.export: {what} has type {shd.short(ty)}, which cannot be "
                    f"exported: {e}") from None
  return ty


def _sds(aval) -> jax.ShapeDtypeStruct:
  s = aval.sharding
  if s is None or s.mesh.empty:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=s)


def _export_vjp(fn, lo, in_tree, in_tys, out_tree, out_tys, platforms, disabled_checks
                ) -> Exported:
  """Exports ``(*in_values, *out_cts) -> in_cts`` over the differentiable positions."""
  diff_in = [i for i, t in enumerate(in_tys) if differentiable(t)]
  diff_out = [i for i, t in enumerate(out_tys) if differentiable(t)]
  n = len(in_tys)

  def vjp_fun(*flat):
    primals, cts = list(flat[:n]), flat[n:]

    def f(*xs):
      full = list(primals)
      for i, x in zip(diff_in, xs):
        full[i] = x
      a, kw = unflatten(in_tree, full)
      outs, _ = flatten(fn(*a, **kw), "results")
      return tuple(outs[i] for i in diff_out)

    _, pullback = jax.vjp(f, *[primals[i] for i in diff_in])
    return list(pullback(tuple(cts)))

  vjp_fun.__name__ = f"{lo.fun_name}_vjp"
  ct_tys = [out_tys[i].to_tangent_aval() if is_hi(out_tys[i]) else out_tys[i]
            for i in diff_out]
  return export(vjp_fun, platforms=platforms or lo.platforms,
                disabled_checks=disabled_checks)(*in_tys, *ct_tys)
