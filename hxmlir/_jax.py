"""The one module that imports JAX's private API (``jax._src``) and changes JAX's state.

Every other hxmlir module reaches private JAX through the names re-exported
here, so a JAX upgrade touches this file alone. Names are grouped by the part of
hxmlir that needs them. Pinned to the JAX 0.10.x line.

Every change hxmlir makes to JAX's state is a named function here:

- :func:`patch_matchaxis`: ``vmap``'s output rule takes hi values (at import, for good;
  arrays reach JAX's own rule unchanged);
- :func:`wrap_lower_jaxpr_to_module` / :func:`unwrap_lower_jaxpr_to_module`: the hook
  ``hx.install()`` puts into JAX's lowering, and takes out;
- :func:`scope_export_allow_list` / :func:`unscope_export_allow_list`: ``jax.export``'s
  custom-call allow-list widened per exporting thread, and put back;
- :func:`cached_lowering`: a composite's decomposition kept in the ``ModuleContext``'s
  cache of the module being lowered (JAX's cache, used as JAX uses it).
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


# --- install: the hook where a jaxpr becomes a StableHLO module (installation.py)
from jax._src import config as _config  # noqa: E402
from jax._src.interpreters import mlir as _mlir  # noqa: E402

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


# --- passes: the MLIR context JAX lowers into (passes/, hxmlir/opt.py) ---------
make_ir_context = _mlir.make_ir_context
"""A fresh ``ir.Context`` with every dialect JAX emits (stablehlo, chlo, mhlo, sdy, func)."""


# --- export: portable artifacts and the custom-call allow-list (export/, installation.py)
import copy as _copy  # noqa: E402

from jax._src.export import _export as _export_internal  # noqa: E402

module_to_portable_bytecode = _export_internal._module_to_bytecode
"""Serializes an ``ir.Module`` as ``jax.export`` does (VHLO portable artifact, 4-week target)."""


def in_named_shardings(exported) -> tuple:
  """The ``NamedSharding`` s (or ``None`` s) of a ``jax.export.Exported``'s arguments,
  as ``jax.export`` recorded them (empty when it recorded none)."""
  return tuple(getattr(exported, "_in_named_shardings", ()))


def out_named_shardings(exported) -> tuple:
  """Like :func:`in_named_shardings`, for the results."""
  return tuple(getattr(exported, "_out_named_shardings", ()))


_JAX_STABLE = _export_internal._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE  # JAX's set


def jax_stable_custom_call_targets() -> frozenset[str]:
  """The custom-call targets JAX itself guarantees stable (what ``jax.export`` accepts
  by default), never with what :func:`scope_export_allow_list` adds."""
  return frozenset(_JAX_STABLE)


def export_allowed_custom_call_targets() -> frozenset[str]:
  """What ``jax.export`` accepts in this thread now: JAX's targets plus those a
  scoped allow-list adds for this thread."""
  return frozenset(_copy.copy(_export_internal._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE))


class _ThreadScopedTargets(set):
  """JAX's allow-list with targets added per thread (stands in for JAX's set).

  ``jax.export``'s ``_check_module`` reads ``copy.copy(<the set>)`` in the
  exporting thread, after lowering; ``__copy__`` answers there with JAX's targets
  plus ``extra()`` (evaluated in that thread). JAX's own set stays the storage:
  additions and removals go to it, so nothing is lost when it is put back.
  """

  def __init__(self, base: set, extra):
    super().__init__()
    self._base, self._extra = base, extra

  def __copy__(self) -> set:
    return set(self._base) | set(self._extra())

  def __contains__(self, target) -> bool:
    return target in self._base or target in self._extra()

  def __iter__(self):
    return iter(self.__copy__())

  def __len__(self) -> int:
    return len(self.__copy__())

  def __repr__(self) -> str:
    return f"{type(self).__name__}({sorted(self.__copy__())!r})"

  def add(self, target) -> None:
    self._base.add(target)

  def discard(self, target) -> None:
    self._base.discard(target)

  def remove(self, target) -> None:
    self._base.remove(target)


def scope_export_allow_list(extra) -> None:
  """Widens ``jax.export``'s custom-call allow-list by ``extra()``, per exporting thread.

  ``extra``: a function of no arguments returning the targets to accept in the
  thread that calls it (``hx.install`` answers with hxmlir's registered kernel
  targets in threads where it is installed, nothing elsewhere). Replaces JAX's
  set by a stand-in that delegates to it (:class:`_ThreadScopedTargets`); a
  second call replaces ``extra``. Undone by :func:`unscope_export_allow_list`.
  """
  _export_internal._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE = _ThreadScopedTargets(_JAX_STABLE, extra)


def unscope_export_allow_list() -> None:
  """Puts JAX's own allow-list back (idempotent)."""
  _export_internal._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE = _JAX_STABLE


# --- Pallas: hi types as operands and results of pl.pallas_call (hxmlir/pallas.py)
from jax._src.state import indexing as _state_indexing  # noqa: E402
from jax._src.state import primitives as _state_primitives  # noqa: E402
from jax._src.state import types as _state_types  # noqa: E402

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

# --- may hxmlir fork this process? (read by hxmlir.passes.parsing.parse_crash) -------
from jax._src import xla_bridge as _xla_bridge  # noqa: E402


def runtime_started() -> bool:
  """Whether JAX has started its runtime (backends and their threads) in this process.

  After that ``os.fork()`` may deadlock the child, and JAX warns about it (its
  ``os.register_at_fork`` hook, installed when the first backend starts), so
  hxmlir parses untrusted input in a fresh interpreter instead of a forked child.
  """
  return bool(_xla_bridge._at_fork_handler_installed or _xla_bridge._backends)
