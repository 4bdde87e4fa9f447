"""``hx.install()``: run hxmlir's pass pipeline on every module JAX lowers.

After :func:`install`, each StableHLO module that JAX builds from a jaxpr --
for ``jax.jit(f)(...)``, ``jax.jit(f).lower(...)`` (and so ``.as_text()`` and
``.compile()``) and ``jax.export.export`` -- goes through the pipeline
(default ``hx-verify,hx-fold-scales``) before JAX compiles or serializes it::

  import hxmlir as hx
  hx.install()                      # process-wide, like jax.config.update
  jax.jit(f).lower(x, qw).as_text()  # folded, verified IR
  hx.uninstall()

  with hx.installed("hx-verify"):   # this thread only, like jax.enable_x64()
    jax.jit(f)(x, qw)

How it hooks in: JAX's ``pxla`` turns a jaxpr into a module by calling
``jax._src.interpreters.mlir.lower_jaxpr_to_module``; while anything is
installed that function is wrapped (through :func:`hxmlir._jax.wrap_lower_jaxpr_to_module`), and the
wrapper runs the pipeline on the module it returns, in place. Before lowering,
the wrapper runs the pipeline's jaxpr stage (``Pipeline.run_jaxpr``): passes
that can do part of their work on the jaxpr, where it is cheaper, do it there
(``hx-fold-scales`` turns ``x @ hx.dequantize(qw)`` into ``hx_matmul_q``). Lowering for
``jax.export`` (``LoweringParameters.for_export``) also runs ``hx-check-export``.
Uninstalling restores the original function.

The installed pipeline is the value of a JAX config state that is part of JAX's
trace context and jit cache key (like ``jax_enable_x64``). So every JAX cache
-- traced jaxprs, lowered modules, compiled executables -- keys on it: after
:func:`install` or :func:`uninstall` the next ``jit`` call lowers afresh,
while modules lowered earlier under the same setting are served from the caches
as usual. Nothing needs clearing, and caches from before :func:`install` are
valid again after :func:`uninstall`.

Modules that contain no ``hx.*`` composite are left untouched (one walk over
the module's ops finds out), so plain JAX code lowers to byte-identical text
with and without install. One exception, for export only: a module without
``hx.*`` ops that calls a custom-call target which hxmlir added to JAX's export
allow-list (:mod:`hxmlir.targets`; e.g. the Triton target, shared by every
Pallas GPU kernel) goes through ``hx-check-export`` alone, which accepts
hxmlir's registered kernels on it and refuses the rest. It is checked, never
rewritten.

The export allow-list is widened per thread, like the setting: ``jax.export``
accepts hxmlir's registered targets only in a thread where hxmlir is installed
(:func:`hxmlir._jax.scope_export_allow_list`), and every export lowering in such a
thread runs ``hx-check-export``; a thread without hxmlir exports against JAX's
own list, so no thread exports a kernel hxmlir never registered.

Calls of hi code: where hxmlir is installed, ``jax.jit`` of a function whose jaxpr holds
hi equations (``hx.make_qarray`` from arrays, ``q8`` arguments or results) keeps its
executable in JAX's C++ cache like a function of arrays, and later calls skip Python:
the hi jaxpr is lowered by the ``to_lojax`` rules JAX itself would run, before JAX
compiles it, and JAX's C++ path flattens ``QArray``/``Rank1``/``HiTup`` arguments and
results to their components (:mod:`hxmlir._jax.fastpath`). Same program, results and
errors; JAX 0.10.2 alone would call such a function from Python every time.

What :func:`install` changes in JAX (the lowering hook, the allow-list, the dispatch of
hi code) is put back when nothing is installed. What importing hxmlir changes, installed or not (``vmap``'s
``batching.matchaxis``, the batching of control flow, the rules of ``device_put``,
sharding constraints, ``jit``'s shardings, ``jax.debug``, Pallas refs, ``jnp.array``) stays
for the life of the process, each wrapper handing every call without a hi value to JAX's
own, unchanged: the complete list is the JAX seam's docstring (:mod:`hxmlir._jax`).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from jaxlib.mlir import ir

from hxmlir import _jax, targets
from hxmlir.install_state import ACTIVATIONS
from hxmlir.install_state import STATE as _state
from hxmlir.install_state import Setting as _Setting
from hxmlir.install_state import current_pipeline as current_pipeline
from hxmlir.install_state import is_installed as is_installed
from hxmlir.passes import PassError, parse_pipeline
from hxmlir.passes.ops import is_hx_composite
from hxmlir.types.qarray import QArray
from hxmlir.types.rank1 import Rank1
from hxmlir.types.tuples import HiTup

DEFAULT_PIPELINE = "hx-verify,hx-fold-scales"
"""The pipeline :func:`install` runs when none is given."""
VERIFY_PASS = "hx-verify"
CHECK_EXPORT_PASS = "hx-check-export"


class VerificationError(ValueError):
  """The pipeline rejected a module that JAX was lowering.

  Raised from inside ``jax.jit`` / ``.lower()`` / ``jax.export.export`` while
  hxmlir is installed, when a pass (usually ``hx-verify``) reports problems or
  leaves invalid IR. ``str()`` lists every problem on its own line as
  ``file:line:col: error: message`` (the location of the op, which JAX derives
  from the user's Python source). The plugin stays installed and usable.

  Attributes: ``module_name`` (``"jit_f"``), ``pass_name`` (the failing pass or
  ``None``), ``pipeline`` (the pipeline string that ran), ``diagnostics`` (the
  pass framework's diagnostics, each with ``severity``, ``location`` and
  ``message``).
  """

  def __init__(self, message: str, *, module_name: str, pass_name: str | None,
               pipeline: str, diagnostics: list):
    super().__init__(message)
    self.module_name = module_name
    self.pass_name = pass_name
    self.pipeline = pipeline
    self.diagnostics = diagnostics


# The wrapper's frame sits between the user's code and JAX's lowering; like JAX's
# own frames it must not show in op locations (plain modules stay byte-identical)
# or in tracebacks.
_jax.exclude_from_tracebacks(__file__)

_lock = threading.RLock()  # guards the hook, the counters below and _pipelines
_inner: Callable | None = None  # what our wrapper calls; None while not wrapped
_active_contexts = 0  # number of open ``installed()`` blocks, in all threads
_pipelines: dict[str, Any] = {}  # pipeline string -> parsed hxmlir.passes.Pipeline
_stats: dict[str, dict[str, float]] = {}


# --- pipeline strings ----------------------------------------------------------

def _elements(pipeline: str) -> list[tuple[str, str]]:
  """``(name, pipeline text)`` of each element of ``pipeline``, parsed by the pass
  framework (so every pipeline error -- unknown pass or option, an empty name -- is
  its ``PipelineError``)."""
  return [(p.name, p.pipeline_str()) for p in parse_pipeline(pipeline).passes]


def _effective(pipeline: str | None, verify: bool) -> str:
  if pipeline is None:
    pipeline = DEFAULT_PIPELINE
  if not isinstance(pipeline, str):
    raise TypeError(f"hxmlir.install: pipeline must be a string like {DEFAULT_PIPELINE!r}, "
                    f"got {type(pipeline).__name__}")
  elements = _elements(pipeline)
  if verify and VERIFY_PASS not in (name for name, _ in elements):
    elements.insert(0, (VERIFY_PASS, VERIFY_PASS))
  elif not verify:
    elements = [(name, text) for name, text in elements if name != VERIFY_PASS]
  return ",".join(text for _, text in elements)


def _export_variant(pipeline: str) -> str:
  elements = _elements(pipeline) if pipeline else []
  if CHECK_EXPORT_PASS not in (n for n, _ in elements):
    elements.append((CHECK_EXPORT_PASS, CHECK_EXPORT_PASS))
  return ",".join(text for _, text in elements)


def _parsed(pipeline: str):
  """The parsed :class:`hxmlir.passes.Pipeline` of ``pipeline`` (parsed once, then shared).

  Raises the pass framework's ``PipelineError`` (a ``ValueError``) for unknown
  passes or options.
  """
  with _lock:
    got = _pipelines.get(pipeline)
  if got is None:
    got = parse_pipeline(pipeline)
    with _lock:
      _pipelines[pipeline] = got
  return got


def _make_setting(pipeline: str | None, verify: bool, kernels: bool = True,
                  activations: str = "f32") -> _Setting:
  if activations not in ACTIVATIONS:
    raise ValueError(f"activations={activations!r} is not one of "
                     f"{', '.join(map(repr, ACTIVATIONS))}")
  pipe = _effective(pipeline, verify)
  setting = _Setting(pipe, _export_variant(pipe), CHECK_EXPORT_PASS, bool(kernels), activations)
  for p in (setting.pipeline, setting.export_pipeline, setting.check_pipeline):
    if p:
      _parsed(p)
  return setting


# --- the hook -------------------------------------------------------------------

def _scan(module: ir.Module, *, targets: bool) -> tuple[bool, set[str]]:
  """Whether ``module`` holds a ``stablehlo.composite "hx.*"``, and (if ``targets``) the
  ``call_target_name`` of every ``stablehlo.custom_call`` in it.

  One walk, stopping at the first hx composite (~1 us per op, against ~100 us
  per op for JAX to build the module). A module whose body holds only ``main`` and no
  custom call has no hx composite: a composite needs its decomposition
  function beside it.
  """
  if len(module.body.operations) < 2 and not targets:
    return False, set()
  found = False
  names: set[str] = set()
  is_hx = is_hx_composite

  def visit(op) -> ir.WalkResult:
    nonlocal found
    name = op.name
    if name == "stablehlo.composite" and is_hx(op):
      found = True
      return ir.WalkResult.INTERRUPT
    if targets and name == "stablehlo.custom_call":
      names.add(ir.StringAttr(op.attributes["call_target_name"]).value)
    return ir.WalkResult.ADVANCE

  with module.context:
    module.operation.walk(visit)
  return found, names


def _widened_targets() -> frozenset[str]:
  """The registered kernel targets hxmlir adds to JAX's export allow-list where installed."""
  return targets.registered_targets() - _jax.jax_stable_custom_call_targets()


def _allowed_here() -> frozenset[str]:
  """What ``jax.export`` accepts beyond JAX's list in the calling thread: the registered
  kernel targets where hxmlir is installed (its export lowerings run hx-check-export),
  nothing elsewhere."""
  return _widened_targets() if _state.value is not None else frozenset()


def _count(key: str, inc: dict[str, float]) -> None:
  entry = _stats.setdefault(key, {})
  for k, v in inc.items():
    entry[k] = entry.get(k, 0) + v


def _run(module: ir.Module, module_name: str, pipeline: str,
         platforms: tuple[str, ...] | None = None) -> None:
  """Runs ``pipeline`` on ``module`` in place; records stats; PassError -> VerificationError.

  ``platforms`` are the lowering's platforms, for passes that specialise on them.
  """
  ran: list[tuple[str, float]] = []
  counters: dict[str, dict[str, int]] = {}
  pipe = _parsed(pipeline)
  try:
    try:
      result = pipe.run(module, after_pass=lambda name, _op, seconds: ran.append((name, seconds)),
                        platforms=platforms)
    except PassError as e:
      diags = list(e.diagnostics)
      lines = [f"  {d}".replace("\n", "\n  ") for d in diags] or [f"  {e.summary}"]
      raise VerificationError(
          f"hxmlir: {e.pass_name} rejected module {module_name}: {e.summary} "
          f"(pipeline {pipeline!r}):\n" + "\n".join(lines),
          module_name=module_name, pass_name=e.pass_name, pipeline=pipeline,
          diagnostics=diags) from None
    except Exception as e:  # a crash inside a pass: a bug in it; name it and the way out
      name = pipe.passes[len(ran)].name if len(ran) < len(pipe.passes) else "?"
      raise RuntimeError(
          f"hxmlir: pass {name} failed on module {module_name} with {type(e).__name__}: {e}\n"
          f"This is a bug in the pass. To lower without it, hx.install() a pipeline "
          f"without {name} (now {pipeline!r}), or hx.uninstall().") from e
    counters = result.stats
  finally:
    _record(ran, counters, modules=1)


def _record(ran: list[tuple[str, float]], counters: dict[str, dict[str, int]],
            modules: int) -> None:
  """Adds to :func:`stats` what the passes in ``ran`` (``(name, seconds)``) did."""
  with _lock:
    for name, seconds in ran:
      mine = counters.get(name, {})
      _count(name, {**mine, "modules": modules, "rewrites": _rewrites(name, mine),
                    "seconds": seconds})


REWRITE_COUNTERS: dict[str, str | None] = {
    VERIFY_PASS: None,  # analyses: their counters say what they looked at
    CHECK_EXPORT_PASS: None,
    "hx-fold-scales": "scales folded",  # the others are breakdowns of this one
    "hx-decompose": "composites inlined",
}
"""Which counter of a pass counts its rewrites (``None``: it makes none). For a
pass not listed, every counter counts."""


def _rewrites(pass_name: str, counters: dict[str, int]) -> int:
  if pass_name in REWRITE_COUNTERS:
    key = REWRITE_COUNTERS[pass_name]
    return 0 if key is None else counters.get(key, 0)
  return sum(counters.values())


def _jaxpr_stage(pipeline: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
  """Runs ``pipeline``'s jaxpr stage on the jaxpr of a ``lower_jaxpr_to_module`` call.

  Returns the call's arguments with the rewritten jaxpr; records the stage's
  counters and time under each pass that ran it (modules are counted by
  :func:`_run`, which runs on the lowered module afterwards).
  """
  if len(args) > 1:
    jaxpr = args[1]
  elif "jaxpr" in kwargs:
    jaxpr = kwargs["jaxpr"]
  else:
    return args, kwargs
  new, counters, ran = _parsed(pipeline).run_jaxpr(jaxpr)
  _record(ran, counters, modules=0)
  if new is jaxpr:
    return args, kwargs
  if len(args) > 1:
    return (args[0], new, *args[2:]), kwargs
  return args, {**kwargs, "jaxpr": new}


def _lower_jaxpr_to_module(*args, **kwargs):
  """Wrapper of JAX's ``lower_jaxpr_to_module``: runs the pipeline's jaxpr stage, lowers,
  then runs the pipeline on the module."""
  inner = _inner if _inner is not None else _jax.jax_lower_jaxpr_to_module
  setting = _state.value
  if setting is None:
    return inner(*args, **kwargs)
  t0 = time.perf_counter()
  params = kwargs.get("lowering_parameters")
  for_export = bool(getattr(params, "for_export", False))
  args, kwargs = _jaxpr_stage(setting.export_pipeline if for_export else setting.pipeline,
                              args, kwargs)
  lower_start = time.perf_counter()
  result = inner(*args, **kwargs)
  t0 += time.perf_counter() - lower_start  # the hook's own time leaves JAX's lowering out
  module_name = str(args[0] if args else kwargs.get("module_name", "module"))
  module = result.module
  platforms = kwargs.get("platforms")
  platforms = tuple(platforms) if platforms is not None else None
  skipped = 1
  try:
    widened = _widened_targets() if for_export else frozenset()
    has_hx, called = _scan(module, targets=bool(widened))
    if has_hx:
      skipped = 0
      _run(module, module_name, setting.export_pipeline if for_export else setting.pipeline,
           platforms)
    elif called & widened:
      # No hx op, but a target on JAX's list only because of hxmlir (say the Triton
      # one): only hx-check-export tells our registered kernels from a user's.
      skipped = 0
      _run(module, module_name, setting.check_pipeline)
  finally:
    with _lock:
      _count("total", {"modules": 1, "skipped": skipped, "seconds": time.perf_counter() - t0})
  return result


def _installed_here() -> bool:
  return _state.value is not None


def _build_qarray(_, parts) -> QArray:
  return QArray(*parts)


def _build_rank1(_, parts) -> Rank1:
  return Rank1(*parts)


def _build_tup(ty, elts) -> HiTup:
  return HiTup(tuple(elts), ty)


_DISPATCH_NODES = {
    QArray: (lambda q: (q.components, None), _build_qarray),
    Rank1: (lambda r: ((r.col, r.row), None), _build_rank1),
    HiTup: (lambda t: (t.elts, t.ty), _build_tup),
}
"""How JAX's C++ dispatch path flattens each hi value class where hxmlir is installed:
``(flatten, build)``, the components in the order of the type's ``lower_val``, the aux
data what the components' types do not say (a tuple's ``ty``). A value's type is a function
of its components' (``QArrayTy``, ``Rank1Ty``), so the C++ path's key on the components'
shapes, dtypes, weak types and shardings keys on the type."""


def _wrap_locked() -> None:
  """Hooks the wrapper into JAX's lowering (once), scopes the export allow-list, and puts
  ``jax.jit`` calls of hi code on JAX's C++ dispatch path where installed."""
  global _inner
  if _inner is None:  # else in place (possibly under a wrapper someone added later)
    _inner = _jax.wrap_lower_jaxpr_to_module(_lower_jaxpr_to_module)
  _jax.scope_export_allow_list(_allowed_here)
  _jax.install_fastpath(_DISPATCH_NODES, _installed_here)


def _unwrap_if_idle_locked() -> None:
  """Puts JAX's lowering function and allow-list back once nothing is installed anywhere."""
  global _inner
  if _state.get_global() is not None or _active_contexts:
    return
  if _inner is not None and _jax.unwrap_lower_jaxpr_to_module(_lower_jaxpr_to_module, _inner):
    _inner = None
  # else: someone wrapped it after us; our wrapper stays in their chain as a
  # pass-through (the setting is None) rather than dropping their wrapper.
  _jax.unscope_export_allow_list()
  _jax.uninstall_fastpath()


# --- public API -------------------------------------------------------------------

def install(pipeline: str | None = None, *, verify: bool = True, kernels: bool = True,
            activations: str = "f32") -> None:
  """Runs ``pipeline`` on every module JAX lowers from now on, in all threads.

  Args:
    pipeline: a pass pipeline string (``"hx-verify,hx-fold-scales{...},cse"``;
      see :func:`hxmlir.passes.parse_pipeline`); default
      ``"hx-verify,hx-fold-scales"``.
    verify: if true, ``hx-verify`` runs first (added when the pipeline lacks
      it); if false, ``hx-verify`` is removed from the pipeline.
    kernels: if true (the default), lowering rules emit hxmlir's kernels where they
      apply (the native CPU kernel, the Pallas kernels on GPU/TPU); if false, the
      reference decomposition everywhere, with the pipeline still run. "Installed"
      thus means two things, named apart: the passes run
      (:func:`hxmlir.install_state.is_installed`) and the kernels are used
      (:func:`hxmlir.install_state.use_kernels`).
    activations: ``"f32"`` (the default) or ``"int8"``, an opt-in that changes the
      numerics: on CPU, ``hx.matmul_q`` in the checkpoint layout ``f32[..., k] x W[n, k]``
      with int8, int4 or uint4 weights (``x`` of any number of rows: decode and prefill;
      with groups not a multiple of 32, of at least 16 rows)
      then quantizes ``x`` to int8 per block of 32 (or of the weight's group) at run time
      and runs integer dot products (the custom call ``hx_matmul_q_cpu_i8x_v1``, ``csrc/matmul_q_i8x.h``);
      with GGUF's block formats (Q5_0 ... IQ4_XS), per block of 32 and exact integer dot
      products per sub-block (``hx_matmul_q_cpu_i8x_v2``, ``csrc/matmul_q_i8x_blocks.h``); other
      formats and layouts keep f32 activations. Part of the setting JAX's caches key on.

  Lowerings for ``jax.export`` additionally run ``hx-check-export`` last, and
  hxmlir's registered kernel targets become acceptable to ``jax.export``
  (:mod:`hxmlir.targets`) in the threads where hxmlir is installed. Calling ``install``
  again replaces the pipeline; with the same arguments it changes nothing.
  Takes effect at the next lowering (JAX's caches key on the setting). An open
  :class:`installed` block overrides it in its own thread.

  Raises:
    ValueError: (the pass framework's ``PipelineError``) unknown pass or option;
      nothing changes then.
    TypeError: ``pipeline`` is not a string.
    ValueError: ``activations`` is not one of ``"f32"``, ``"int8"``.
  """
  setting = _make_setting(pipeline, verify, kernels, activations)
  with _lock:
    _wrap_locked()
    _state.set_global(setting)


def uninstall() -> None:
  """Stops running the pipeline; JAX lowers exactly as before :func:`install`.

  A no-op when not installed. ``installed()`` blocks still open (in any
  thread) keep their pipeline until they exit; the wrapper of JAX's lowering
  function is removed when the last one closes.
  """
  with _lock:
    _state.set_global(None)
    _unwrap_if_idle_locked()


class installed:  # noqa: N801  (a context manager, named like JAX's)
  """Context manager: install ``pipeline`` for the lowerings in this thread.

  ``with hx.installed(): jax.jit(f)(x)`` -- like ``jax.enable_x64()``, it sets a
  thread-local value over the process-wide one from :func:`install`, and on
  exit restores what was there before (nested blocks nest). Also usable as a
  decorator. Arguments as for :func:`install`; the pipeline is parsed when the
  object is created, so a bad one raises before the block runs. To ask whether
  hxmlir is installed, use :func:`is_installed`.
  """

  def __init__(self, pipeline: str | None = None, *, verify: bool = True, kernels: bool = True,
               activations: str = "f32"):
    self._setting = _make_setting(pipeline, verify, kernels, activations)
    self._prev = threading.local()  # per thread: a stack of the values entered over

  def __enter__(self) -> installed:
    global _active_contexts
    with _lock:
      _wrap_locked()
      _active_contexts += 1
    stack = self._prev.__dict__.setdefault("stack", [])
    stack.append(_state.swap_local(self._setting))
    return self

  def __exit__(self, *exc) -> None:
    global _active_contexts
    _state.set_local(self._prev.stack.pop())
    with _lock:
      _active_contexts -= 1
      _unwrap_if_idle_locked()

  def __call__(self, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
      with self:
        return fn(*args, **kwargs)
    return wrapper


def stats(*, reset: bool = False) -> dict[str, dict[str, float]]:
  """What the pipeline did since import (or the last ``reset``), per pass.

  Returns ``{pass name: {"modules": n, "rewrites": n, "seconds": t, <the pass's
  own counters>...}}`` (``modules``: modules the pass ran on; ``rewrites``: see
  :data:`REWRITE_COUNTERS`, 0 for hx-verify and hx-check-export) and a
  ``"total"`` entry: ``modules`` lowered while installed, ``skipped`` (no
  ``hx.*`` op, left untouched) and ``seconds`` spent in the hook. A copy.
  """
  with _lock:
    out = {k: dict(v) for k, v in _stats.items()}
    if reset:
      _stats.clear()
  return out

