"""Lowering: the hook where a jaxpr becomes a StableHLO module, the ``ModuleContext``
helpers composites use, the MLIR context, and whether JAX's runtime has started.

Part of the JAX seam (:mod:`hxmlir._jax`).
"""

from __future__ import annotations

# --- install: the hook where a jaxpr becomes a StableHLO module (installation.py)
from jax._src import config as _config
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import mlir as _mlir

ConfigState = _config.State
"""JAX's thread-local config state; with ``include_in_trace_context`` its value keys JAX's caches."""
jax_lower_jaxpr_to_module = _mlir.lower_jaxpr_to_module
"""JAX's own ``mlir.lower_jaxpr_to_module``, as imported."""


def wrap_lower_jaxpr_to_module(wrapper):
  """Makes ``wrapper`` what JAX's ``pxla`` calls to turn a jaxpr into a module.

  ``pxla`` calls ``mlir.lower_jaxpr_to_module`` by attribute for ``jit``,
  ``.lower()`` and ``jax.export``. Returns the function ``wrapper`` replaces
  (JAX's, or a wrapper someone installed before), which ``wrapper`` must call.
  """
  inner = _mlir.lower_jaxpr_to_module
  _mlir.lower_jaxpr_to_module = wrapper
  return inner


def unwrap_lower_jaxpr_to_module(wrapper, inner) -> bool:
  """Puts ``inner`` back if ``wrapper`` is still the hook; ``False`` (nothing changed)
  when someone wrapped it after us (``wrapper`` then stays in their chain)."""
  if _mlir.lower_jaxpr_to_module is not wrapper:
    return False
  _mlir.lower_jaxpr_to_module = inner
  return True


def current_lower_jaxpr_to_module():
  """The ``mlir.lower_jaxpr_to_module`` JAX's ``pxla`` calls now."""
  return _mlir.lower_jaxpr_to_module


from jax._src import source_info_util as _source_info_util  # noqa: E402
from jax._src import traceback_util as _traceback_util  # noqa: E402


def exclude_from_tracebacks(path: str) -> None:
  """Keeps frames of file ``path`` out of IR locations and of filtered tracebacks (as JAX's own)."""
  _source_info_util.register_exclusion(path)
  _traceback_util.register_exclusion(path)


# --- lowering: hx composites (lowering/composite.py) --------------------------

def single_platform_module_context(module_ctx, platform: str):
  """``module_ctx`` lowering for ``platform`` alone: no platform-index or dim-var arguments.

  Fresh lowering caches, so functions cached for the multi-platform context
  (which take the platform index) are never called from it.
  """
  return module_ctx.replace(
      platforms=(platform,),
      shape_poly_state=_mlir.ShapePolyLoweringState((), (platform,)),
      lowering_cache={}, cached_primitive_lowerings={})


def cached_lowering(module_ctx, key, build):
  """The function ``build()`` made for ``key`` in the module being lowered, made once.

  Kept in the ``ModuleContext``'s ``cached_primitive_lowerings`` (JAX's cache of
  per-primitive functions, one per module), so equal composites in one module
  share their decomposition function, and none outlives the module.
  """
  fn = module_ctx.cached_primitive_lowerings.get(key)
  if fn is None:
    fn = build()
    module_ctx.cached_primitive_lowerings[key] = fn
  return fn


def sdy_sharding_attr(module_ctx, aval):
  """The ``#sdy.sharding`` of ``aval`` in explicit sharding mode, or ``None``.

  ``None`` when the aval has no mesh, or its mesh axes are all manual
  (``shard_map``) or all auto: the cases where JAX itself emits no sharding.
  """
  sharding = getattr(aval, "sharding", None)
  mesh = getattr(sharding, "mesh", None)
  if mesh is None or mesh.empty or mesh.are_all_axes_manual or mesh.are_all_axes_auto:
    return None
  return sharding._to_sdy_sharding(aval.ndim, modify_wrt_axis_types=True).build(
      module_ctx.sharding_attr_cache)


# --- passes: the MLIR context JAX lowers into (passes/, hxmlir/tools/opt.py) ---------
make_ir_context = _mlir.make_ir_context
"""A fresh ``ir.Context`` with every dialect JAX emits (stablehlo, chlo, mhlo, sdy, func)."""


def kernel_is_partitioned(module_ctx) -> bool:
  """Whether a kernel's custom call lowered in ``module_ctx`` would be partitioned by XLA.

  ``True`` in a program over several devices outside a ``shard_map`` that makes every
  mesh axis manual (``ShardingContext`` of more than one device, or an
  ``SPMDAxisContext`` with auto axes left): there JAX refuses Mosaic calls ("Mosaic
  kernels cannot be automatically partitioned", ``jax/_src/tpu_custom_call.py``) and
  XLA replicates the operands of any other custom call. ``False`` on one device, inside
  a fully manual ``shard_map`` and under ``pmap``.
  """
  ax = module_ctx.axis_context
  if isinstance(ax, _sharding_impls.SPMDAxisContext):
    manual = set(ax.manual_axes) | set(ax.mesh.manual_axes)
    return manual != set(ax.mesh.axis_names)
  if isinstance(ax, _sharding_impls.ShardingContext):
    return ax.num_devices != 1
  return False


# --- may hxmlir fork this process? (read by hxmlir.passes.parsing.parse_crash) -------
from jax._src import xla_bridge as _xla_bridge  # noqa: E402


def runtime_started() -> bool:
  """Whether JAX has started its runtime (backends and their threads) in this process.

  After that ``os.fork()`` may deadlock the child, and JAX warns about it (its
  ``os.register_at_fork`` hook, installed when the first backend starts), so
  hxmlir parses untrusted input in a fresh interpreter instead of a forked child.
  """
  return bool(_xla_bridge._at_fork_handler_installed or _xla_bridge._backends)

