"""The one module that imports JAX's private API (``jax._src``).

Every other hxmlir module reaches private JAX through the names re-exported
here, so a JAX upgrade touches this file alone. Names are grouped by the part of
hxmlir that needs them. Pinned to the JAX 0.10.x line.
"""

from jax._src import core as core
from jax._src.hijax import MappingSpec as MappingSpec

# --- hi types: mapping helpers for component types (vmap / scan) ------------
mapped_aval = core.mapped_aval
unmapped_aval = core.unmapped_aval


# --- hi primitives: values a to_lojax rule passes through (hiprim.py) ---------
def stage_value(x):
  """``x`` lifted into the current trace: a constant of the jaxpr being built, or
  ``x`` itself when evaluating eagerly. JAX's ``lower_jaxpr`` expects every lo value
  a ``to_lojax`` rule returns to be a tracer of its trace, also a closed-over constant."""
  return core.trace_ctx.trace.stage_value(x)


def is_hi_level_tracer(x) -> bool:
  """Whether ``x`` is a tracer of a trace that takes hi primitives as they are.

  ``jit`` tracing, ``grad``, ``vmap`` and ``scan`` bodies (``requires_low`` false)
  see a hi value as one tracer of a hi type, so a value class (``hx.QArray``)
  holding such tracers was built by hand in traced code. Traces that run hi
  primitives through their ``to_lojax`` rules at once (lowering, an un-jitted
  ``shard_map``) legitimately build value classes holding their own tracers."""
  return isinstance(x, core.Tracer) and not x._trace.requires_low


# --- hi types: vmap outputs that are not mapped (hiprim.py) --------------------
from jax._src.interpreters import batching as _batching  # noqa: E402

vmap_batching = _batching
"""``jax._src.interpreters.batching``: ``from_elt`` calls its ``matchaxis`` (by
attribute) to bring each ``vmap`` output to its ``out_axes``; hiprim wraps it so an
unmapped hi output is broadcast to a hi spec, as JAX does for arrays."""


# --- hi types: where a plain PartitionSpec for a hi value came from (hiprim.py) --
import sys as _sys  # noqa: E402

from jax._src import pmap as _pmap  # noqa: E402
from jax._src import shard_map as _shard_map  # noqa: E402


def plain_spec_origin() -> str | None:
  """Why a hi type's ``shard``/``unshard`` is being handed a plain ``PartitionSpec``.

  ``"eager"`` inside JAX's un-jitted ``shard_map`` (``_shard_map_impl``, which
  reshards with plain specs whatever the user wrote), ``"pmap"`` inside
  ``jax.pmap`` (built on ``shard_map`` with plain specs), else ``None``: the
  user's own spec. Read off the Python stack: only called to word an error.
  """
  f = _sys._getframe(1)
  while f is not None:
    file, name = f.f_code.co_filename, f.f_code.co_name
    if file == _pmap.__file__:
      return "pmap"
    if file == _shard_map.__file__ and name == "_shard_map_impl":
      return "eager"
    f = f.f_back
  return None


# --- lowering: lo primitives --------------------------------------------------
from jax._src import dispatch as _dispatch  # noqa: E402

apply_primitive = _dispatch.apply_primitive


# --- hi rules: zeros of a type, as JAX makes them (hiprim.zeros) --------------
from jax._src import ad_util as _ad_util  # noqa: E402

zeros_like_aval = _ad_util.zeros_like_aval
"""Zeros of an aval exactly as JAX's AD makes them: a hi type's ``vspace_zero()``; an
array of the aval's sharding, also on no mesh under ``jax.set_mesh``, varying over
its manual axes."""


typematch = core.typematch
"""JAX's type equivalence (``core.typematch``): arrays match up to weak type, and up to
sharding when either is on no mesh; what its AD accepts as a cotangent's type."""


# --- hi types: manual-axis (shard_map check_vma) type component ---------------
ManualAxisType = core.ManualAxisType
empty_mat = core.empty_mat
from jax._src.interpreters import ad as _hi_ad  # noqa: E402

GradAccum = _hi_ad.GradAccum
"""What a hi primitive's ``transpose`` receives for its linear operands (``.accum(ct)``)."""


# --- install: the hook where a jaxpr becomes a StableHLO module ---------------
from jax._src import config as _config  # noqa: E402
from jax._src.interpreters import mlir as _mlir  # noqa: E402

jax_mlir = _mlir
"""``jax._src.interpreters.mlir``: ``pxla`` calls its ``lower_jaxpr_to_module``
(by attribute) for ``jit``, ``.lower()`` and ``jax.export``; install wraps it."""
ConfigState = _config.State
"""JAX's thread-local config state; with ``include_in_trace_context`` its value keys JAX's caches."""
from jax._src import source_info_util as _source_info_util  # noqa: E402
from jax._src import traceback_util as _traceback_util  # noqa: E402


def exclude_from_tracebacks(path: str) -> None:
  """Keeps frames of file ``path`` out of IR locations and of filtered tracebacks (as JAX's own)."""
  _source_info_util.register_exclusion(path)
  _traceback_util.register_exclusion(path)


# --- lowering: hx composites (lowering/composite.py) --------------------------
from jax._src.interpreters import mlir as _composite_mlir  # noqa: E402


def single_platform_module_context(module_ctx, platform: str):
  """``module_ctx`` lowering for ``platform`` alone: no platform-index or dim-var arguments.

  Fresh lowering caches, so functions cached for the multi-platform context
  (which take the platform index) are never called from it.
  """
  return module_ctx.replace(
      platforms=(platform,),
      shape_poly_state=_composite_mlir.ShapePolyLoweringState((), (platform,)),
      lowering_cache={}, cached_primitive_lowerings={})


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


# --- passes: the MLIR context JAX lowers into (passes/, hxmlir/opt.py) ---------
from jax._src.interpreters import mlir as _passes_mlir  # noqa: E402

make_ir_context = _passes_mlir.make_ir_context
"""A fresh ``ir.Context`` with every dialect JAX emits (stablehlo, chlo, mhlo, sdy, func)."""


# --- export: portable artifacts and the custom-call allow-list (export.py, targets.py)
from jax._src.export import _export as _export_internal  # noqa: E402

module_to_portable_bytecode = _export_internal._module_to_bytecode
"""Serializes an ``ir.Module`` as ``jax.export`` does (VHLO portable artifact, 4-week target)."""
stable_custom_call_targets = _export_internal._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE
"""The (mutable) set of custom-call targets ``jax.export`` accepts; ``targets.activate`` adds to it."""

# --- may hxmlir fork this process? (read by hxmlir.passes.parsing.parse_crash) -------
from jax._src import xla_bridge as _xla_bridge  # noqa: E402


def runtime_started() -> bool:
  """Whether JAX has started its runtime (backends and their threads) in this process.

  After that ``os.fork()`` may deadlock the child, and JAX warns about it (its
  ``os.register_at_fork`` hook, installed when the first backend starts), so
  hxmlir parses untrusted input in a fresh interpreter instead of a forked child.
  """
  return bool(_xla_bridge._at_fork_handler_installed or _xla_bridge._backends)
