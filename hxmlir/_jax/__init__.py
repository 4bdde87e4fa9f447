"""The JAX seam: the one package that imports JAX's private API (``jax._src``) and changes
JAX's state.

Every other hxmlir module reaches private JAX through the names this package exports
(``from hxmlir import _jax; _jax.make_ir_context()``), so a JAX upgrade touches this
package alone. Pinned to the JAX 0.10.x line. Split by concern:

- :mod:`~hxmlir._jax.trace`: core names hi types and hi primitives build on (mapping
  helpers, staging, zeros, type matching, manual axes, ``hx.jit``'s lowered trace);
- :mod:`~hxmlir._jax.batching`: ``vmap``'s output rule and control flow under ``vmap``;
- :mod:`~hxmlir._jax.lowering`: the jaxpr -> StableHLO hook, ``ModuleContext`` helpers,
  the MLIR context, whether JAX's runtime has started;
- :mod:`~hxmlir._jax.fastpath`: ``jax.jit`` of hi code on JAX's C++ dispatch path;
- :mod:`~hxmlir._jax.export`: portable bytecode and ``jax.export``'s custom-call allow-list;
- :mod:`~hxmlir._jax.pallas`: hi types in ``pl.pallas_call`` and hi primitives in kernels;
- :mod:`~hxmlir._jax.jax_apis`: ``device_put``, sharding constraints, ``jit`` shardings,
  ``jax.debug``, ``jnp.array`` on hi values;
- :mod:`~hxmlir._jax._wrap`: what the wrappers share.

Every change hxmlir makes to JAX's state, each by a named function here (each wrapper
keeps JAX's original, falls through to it for arrays, and is installed once; "import":
when ``import hxmlir`` runs, for the life of the process):

- ``batching.matchaxis`` (``vmap``'s output rule): :func:`patch_matchaxis`, at import;
- ``mlir.lower_jaxpr_to_module`` (what ``pxla`` calls to turn a jaxpr into a module):
  :func:`wrap_lower_jaxpr_to_module`, by ``hx.install()`` / ``hx.installed()``, undone by
  :func:`unwrap_lower_jaxpr_to_module` when nothing is installed in any thread;
- ``pjit._run_python_pjit`` (what ``jax.jit``'s C++ cache miss runs): wrapped by
  :func:`install_fastpath`, by ``hx.install()`` / ``hx.installed()``, undone by
  :func:`uninstall_fastpath` when nothing is installed in any thread (and set aside for a
  block by :func:`jax_python_dispatch`): where hxmlir is installed, a jaxpr with hi
  equations is lowered before JAX compiles it and keeps its executable in the C++ cache;
- ``tree_util.dispatch_registry`` (how ``jax.jit``'s C++ path flattens arguments and
  results): nodes for ``QArray``, ``Rank1`` and ``HiTup``, by :func:`install_fastpath` the
  first time anything is installed, for the life of the process (a ``PyTreeRegistry``
  has no removal): a value's components where hxmlir is installed in the calling thread,
  else one opaque leaf that the C++ path refuses as it refused the value;
- ``export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE`` (``jax.export``'s allow-list): a
  per-thread stand-in, :func:`scope_export_allow_list`, by ``hx.install()``; undone by
  :func:`unscope_export_allow_list`;
- entries of a ``ModuleContext``'s ``cached_primitive_lowerings``: :func:`cached_lowering`,
  while lowering (JAX's cache of the module being lowered, used as JAX uses it);
- ``source_info_util`` / ``traceback_util`` exclusions: :func:`exclude_from_tracebacks`,
  at import (``installation.py``'s and ``fastpath.py``'s own files);
- ``state.indexing.indexer_transform_type_registry``: :func:`register_indexer_transform_type`,
  at import (``pallas.py``);
- ``state.primitives.swap_p.abstract_eval``: :func:`install_ref_write_check`, at import
  (``pallas.py``);
- ``pallas_call_p.to_lojax``; ``get_p`` and ``swap_p``'s ``to_lojax`` and ``abstract_eval``:
  :func:`install_pallas_operand_forms`, at import (``pallas.py``);
- Pallas' Mosaic TPU ``lowering_rules`` and Triton ``triton_lowering_rules`` (rules for
  hxmlir's primitives inside kernels): :func:`activate_pallas_kernel_rules`, when a hi type
  first meets ``pallas_call``;
- ``device_put_p`` (``is_high``, ``to_lojax``, ``abstract_eval``),
  ``dispatch._batched_device_put_impl``, ``api._infer_src_sharding``,
  ``api._check_sharding``, ``pjit.pjit_check_aval_sharding``:
  :func:`install_device_put_rules`, at import (:mod:`hxmlir.types.jax_apis`);
- ``sharding_constraint_p`` (``is_high``, ``to_lojax``, ``abstract_eval``) and its
  ``batching.fancy_primitive_batchers`` entry: :func:`install_sharding_constraint_rules`,
  at import (:mod:`hxmlir.types.jax_apis`);
- ``pjit._lojax_expand_params``, ``jit_p.to_lojax``: :func:`install_jit_sharding_rules`,
  at import (:mod:`hxmlir.types.jax_apis`);
- ``debug_callback_p`` and ``debug_print_p`` (``is_high``, ``to_lojax``) and their
  ``fancy_primitive_batchers`` entries: :func:`install_debug_rules`, at import
  (:mod:`hxmlir.types.jax_apis`);
- ``batching.batch_jaxpr_axes``, ``from_elt``, ``moveaxis``, ``broadcast``; the
  ``fancy_primitive_batchers`` of ``scan_p``, ``while_p``, ``cond_p``;
  ``conditionals._bcast_select`` and ``_bcast_select_n``; ``jax.lax.asarray`` (seen by every
  caller: hi values pass through, arrays reach JAX's); ``stop_gradient_p`` (``is_high``,
  ``to_lojax``): :func:`install_vmap_control_flow`, at import (:mod:`hxmlir.types.control_flow`);
- ``jax._src.numpy.array_constructors.array`` and ``jax.numpy.array``:
  :func:`install_jnp_array_check`, at import (:mod:`hxmlir.types.hiprim`).

Registrations through JAX's public API, outside this package, add to JAX's tables
without changing its behaviour for anything else: ``jax.experimental.hijax.register_hitype``
(``QArray``, ``Rank1``, ``HiTup``, Pallas' kernel-form values), ``mlir.register_lowering``
for hxmlir's own lo primitives (``lowering/``), ``jax.ffi.register_ffi_target`` for the
native CPU kernel (``lowering/matmul_q/cpu.py``), ``jax.tree_util.register_dataclass``
(``hx.jit``'s lo pytree), a JAX config state ``hxmlir_install``
(:mod:`hxmlir.install_state`, through :data:`ConfigState`), and
``jax.config.update("jax_num_cpu_devices", n)`` by ``hxmlir run --host-devices``.
"""

# Re-exported by concern; callers use ``_jax.<name>``.

from hxmlir._jax.batching import SpecMatchError as SpecMatchError
from hxmlir._jax.batching import current_matchaxis as current_matchaxis
from hxmlir._jax.batching import install_vmap_control_flow as install_vmap_control_flow
from hxmlir._jax.batching import internal_batch_dst as internal_batch_dst
from hxmlir._jax.batching import jax_matchaxis as jax_matchaxis
from hxmlir._jax.batching import patch_matchaxis as patch_matchaxis
from hxmlir._jax.batching import stop_gradient_p as stop_gradient_p
from hxmlir._jax.batching import unpatch_matchaxis as unpatch_matchaxis
from hxmlir._jax.batching import vmap_infer as vmap_infer
from hxmlir._jax.batching import vmap_sum_axis as vmap_sum_axis
from hxmlir._jax.export import (
    export_allowed_custom_call_targets as export_allowed_custom_call_targets,
)
from hxmlir._jax.export import in_named_shardings as in_named_shardings
from hxmlir._jax.export import jax_stable_custom_call_targets as jax_stable_custom_call_targets
from hxmlir._jax.export import module_to_portable_bytecode as module_to_portable_bytecode
from hxmlir._jax.export import out_named_shardings as out_named_shardings
from hxmlir._jax.export import scope_export_allow_list as scope_export_allow_list
from hxmlir._jax.export import unscope_export_allow_list as unscope_export_allow_list
from hxmlir._jax.fastpath import current_run_python_pjit as current_run_python_pjit
from hxmlir._jax.fastpath import install_fastpath as install_fastpath
from hxmlir._jax.fastpath import jax_python_dispatch as jax_python_dispatch
from hxmlir._jax.fastpath import jax_run_python_pjit as jax_run_python_pjit
from hxmlir._jax.fastpath import uninstall_fastpath as uninstall_fastpath
from hxmlir._jax.jax_apis import array_api_names as array_api_names
from hxmlir._jax.jax_apis import debug_callback_p as debug_callback_p
from hxmlir._jax.jax_apis import device_put_p as device_put_p
from hxmlir._jax.jax_apis import install_debug_rules as install_debug_rules
from hxmlir._jax.jax_apis import install_device_put_rules as install_device_put_rules
from hxmlir._jax.jax_apis import install_jit_sharding_rules as install_jit_sharding_rules
from hxmlir._jax.jax_apis import install_jnp_array_check as install_jnp_array_check
from hxmlir._jax.jax_apis import (
    install_sharding_constraint_rules as install_sharding_constraint_rules,
)
from hxmlir._jax.jax_apis import moveaxis as moveaxis
from hxmlir._jax.jax_apis import print_callback as print_callback
from hxmlir._jax.jax_apis import sharding_constraint_aval as sharding_constraint_aval
from hxmlir._jax.jax_apis import sharding_constraint_p as sharding_constraint_p
from hxmlir._jax.jax_apis import unconstrained_dims as unconstrained_dims
from hxmlir._jax.jax_apis import update_dp_aval as update_dp_aval
from hxmlir._jax.lowering import ConfigState as ConfigState
from hxmlir._jax.lowering import cached_lowering as cached_lowering
from hxmlir._jax.lowering import current_lower_jaxpr_to_module as current_lower_jaxpr_to_module
from hxmlir._jax.lowering import exclude_from_tracebacks as exclude_from_tracebacks
from hxmlir._jax.lowering import jax_lower_jaxpr_to_module as jax_lower_jaxpr_to_module
from hxmlir._jax.lowering import kernel_is_partitioned as kernel_is_partitioned
from hxmlir._jax.lowering import make_ir_context as make_ir_context
from hxmlir._jax.lowering import runtime_started as runtime_started
from hxmlir._jax.lowering import sdy_sharding_attr as sdy_sharding_attr
from hxmlir._jax.lowering import single_platform_module_context as single_platform_module_context
from hxmlir._jax.lowering import unwrap_lower_jaxpr_to_module as unwrap_lower_jaxpr_to_module
from hxmlir._jax.lowering import wrap_lower_jaxpr_to_module as wrap_lower_jaxpr_to_module
from hxmlir._jax.pallas import AbstractRef as AbstractRef
from hxmlir._jax.pallas import IndexSlice as IndexSlice
from hxmlir._jax.pallas import NDIndexer as NDIndexer
from hxmlir._jax.pallas import activate_pallas_kernel_rules as activate_pallas_kernel_rules
from hxmlir._jax.pallas import add_pallas_kernel_rule as add_pallas_kernel_rule
from hxmlir._jax.pallas import install_pallas_operand_forms as install_pallas_operand_forms
from hxmlir._jax.pallas import install_ref_write_check as install_ref_write_check
from hxmlir._jax.pallas import pallas_block_origin as pallas_block_origin
from hxmlir._jax.pallas import ref_get_p as ref_get_p
from hxmlir._jax.pallas import ref_swap_p as ref_swap_p
from hxmlir._jax.pallas import register_indexer_transform_type as register_indexer_transform_type
from hxmlir._jax.trace import GradAccum as GradAccum
from hxmlir._jax.trace import ManualAxisType as ManualAxisType
from hxmlir._jax.trace import MappingSpec as MappingSpec
from hxmlir._jax.trace import apply_primitive as apply_primitive
from hxmlir._jax.trace import at_top_level as at_top_level
from hxmlir._jax.trace import core as core
from hxmlir._jax.trace import empty_mat as empty_mat
from hxmlir._jax.trace import is_hi_level_tracer as is_hi_level_tracer
from hxmlir._jax.trace import mapped_aval as mapped_aval
from hxmlir._jax.trace import plain_spec_origin as plain_spec_origin
from hxmlir._jax.trace import stage_value as stage_value
from hxmlir._jax.trace import trace_lowered as trace_lowered
from hxmlir._jax.trace import typematch as typematch
from hxmlir._jax.trace import unmapped_aval as unmapped_aval
from hxmlir._jax.trace import zeros_like_aval as zeros_like_aval
