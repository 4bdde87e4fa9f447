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
- :func:`install_ref_write_check`: ``ref[...] = v`` with a hi ref or value is typed by
  hxmlir's check first (at import, for good; writes of arrays into arrays pass through).
- :func:`install_jnp_array_check`: ``jnp.array``/``jnp.asarray`` of a traced hi value
  raise its type's ``TypeError`` (at import, for good; arrays pass through).
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


# --- hx.jit: a function traced with its hi equations lowered (dispatch.py) ---------
import jax as _jax_api  # noqa: E402
from jax._src.interpreters import partial_eval as _pe  # noqa: E402


def at_top_level() -> bool:
  """Whether no transformation is tracing (``jit``, ``grad``, ``vmap``, ...): values here
  are concrete, and a jitted call is dispatched rather than staged."""
  return core.trace_state_clean()


def trace_lowered(fun, *args, **kwargs):
  """``fun(*args, **kwargs)`` staged into the current trace with every hi equation
  replaced by its lo equations (their ``to_lojax`` rules, as ``jax.jit`` lowers a hi
  jaxpr before compiling it).

  ``args``/``kwargs`` and the results are pytrees of lo values (hi values only in
  between). A ``jax.jit`` of a function whose jaxpr holds hi equations is dispatched
  from Python on every call (JAX 0.10.2's ``pjit._infer_params`` keeps no parameters
  for it, so the C++ cache never holds it); one whose equations are all lo, as here,
  takes JAX's C++ cache and dispatch.
  """
  closed, shape = _jax_api.make_jaxpr(fun, return_shape=True)(*args, **kwargs)
  if closed.jaxpr.is_high:
    closed = _pe.lower_jaxpr2(closed)
  outs = core.eval_jaxpr(closed.jaxpr, closed.consts, *_jax_api.tree.leaves((args, kwargs)))
  return _jax_api.tree.unflatten(_jax_api.tree.structure(shape), outs)


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
from jax import tree_util as _tree_util  # noqa: E402
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
import threading as _threading  # noqa: E402
from functools import partial as _partial  # noqa: E402

from jax._src import api as _api  # noqa: E402
from jax._src import debugging as _debugging  # noqa: E402
from jax._src import pjit as _pjit  # noqa: E402
from jax._src import sharding_impls as _sharding_impls  # noqa: E402
from jax._src.hijax import HiType as _HiType  # noqa: E402
from jax._src.layout import Format as _Format  # noqa: E402
from jax._src.sharding import Sharding as _Sharding  # noqa: E402

_NamedSharding = _sharding_impls.NamedSharding


def _is_hi(aval) -> bool:
  return isinstance(aval, _HiType)


def _any_high(*avals, **params) -> bool:
  return any(a.is_high for a in avals)


def _short(ty) -> str:
  return ty.str_short(short_dtypes=True)


def _make_high(prim, to_lojax) -> None:
  """Make JAX primitive ``prim`` take hi operands: lowered by ``to_lojax`` on values."""
  prim.is_high = _any_high
  prim.to_lojax = to_lojax


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


def _replace(obj, name, wrap) -> None:
  """``obj.name = wrap(obj.name)`` (``obj[name]`` for a dict) unless hxmlir wrapped it already."""
  if isinstance(obj, dict):
    if getattr(obj[name], "_hx_wraps", None) is None:
      obj[name] = wrap(obj[name])
  elif getattr(getattr(obj, name), "_hx_wraps", None) is None:
    setattr(obj, name, wrap(getattr(obj, name)))


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


# --- vmap of scan / while_loop / fori_loop / cond / switch with hi values -----------
from jax._src.lax.control_flow import conditionals as _conditionals  # noqa: E402
from jax._src.lax.control_flow import loops as _loops  # noqa: E402


def _hi_typeof(x):
  """``core.typeof(x)`` if it is a hi type, else ``None``."""
  try:
    ty = core.typeof(x)
  except TypeError:
    return None
  return ty if _is_hi(ty) else None


def _is_int_dim(d) -> bool:
  return isinstance(d, int) and not isinstance(d, bool)


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


def _stop_gradient_to_lojax(x):
  ty = core.typeof(x)
  return ty.raise_val(*(_ad_util.stop_gradient_p.bind(lo) for lo in ty.lower_val(x)))


def install_vmap_control_flow(*, swap_leading_axes, select_n, broadcast_unmapped) -> None:
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
  ``lax.stop_gradient`` takes hi values (componentwise). A hi output of ``vmap`` itself
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
  _make_high(_ad_util.stop_gradient_p, _stop_gradient_to_lojax)


# =============================================================================
# JAX's array API on hi values (hiprim.refuse_array_api): the names JAX forwards
# from a tracer to its type (``x + y`` -> ``typeof(x)._add(x, y)``, ``x.sum()`` ->
# ``typeof(x).sum.fun(x)``, ``x.T`` -> ``typeof(x).T.fget(x)``; jax/_src/core.py's
# ``Tracer`` and jax/_src/numpy/array_methods.py's ``_set_tracer_aval_forwarding``),
# and ``__jax_array__``, which jax.numpy calls on every operand that is not an array.
# Nothing of JAX's is changed: hiprim sets these on hxmlir's own classes (methods and
# properties as jax.experimental.hijax's public ``aval_method``/``aval_property``).
# =============================================================================
import functools as _functools  # noqa: E402

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
