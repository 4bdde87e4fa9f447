"""hxmlir.passes: Python passes over ``jaxlib.mlir`` modules, and their pipeline.

The API other code relies on::

  from hxmlir.passes import parse_pipeline, PassError, PipelineError, PASS_REGISTRY

  pipe = parse_pipeline("hx-verify,hx-fold-scales,canonicalize,cse")
  result = pipe.run(module)      # jaxlib.mlir.ir.Module (or its builtin.module op), in place
  result.changed                 # bool: some pass modified the module
  result.stats                   # {"hx-fold-scales": {"scales folded": 3}, ...}
  result.diagnostics             # warnings/remarks the passes reported

- :func:`parse_pipeline` raises :class:`PipelineError` (a ``ValueError``) for
  an unknown pass or option, listing the valid ones. Names that are not ours
  (``canonicalize``, ``cse``, ``inline``, ``symbol-dce``, ``func.func(...)``)
  run in ``jaxlib.mlir.passmanager.PassManager``.
- ``Pipeline.run`` raises :class:`PassError` after a pass reports problems
  (``.diagnostics``: every problem, each with ``severity``, ``location``
  ``"file:line:col"`` and ``message``; ``str()`` lists them all), and when
  MLIR's verifier fails after a pass (the error names the pass).
- :data:`PASS_REGISTRY` maps pass names to lazy getters of their classes;
  register a new pass with one line in ``passes/registry.py``.
- A pass is ``apply(module, ctx)``: ``ctx`` is a :class:`PassContext` (xDSL's
  ``ctx``), the diagnostics sink plus what the run knows: ``ctx.platforms``, the
  lowering's platforms (``Pipeline.run(module, platforms=...)``; ``None`` in
  ``hxmlir-opt``). Nothing reaches a pass through global or context-variable state.
- Passes run in the MLIR context JAX uses (:func:`parsing.make_context`); they
  read and rewrite IR only and never trace JAX code.
- Inside a JAX lowering (``hx.install``), ``Pipeline.run_jaxpr`` first runs the
  jaxpr stage of the leading passes (:meth:`HxPass.apply_jaxpr`): part of a
  pass's rewrite done on the jaxpr before JAX lowers it, where it is cheaper
  (``hx-fold-scales``: ``x @ hx.dequantize(qw)`` -> ``hx_matmul_q``). It
  rewrites equations, never traces; the MLIR stage still runs afterwards.
  This is the one deliberate exception to "passes read MLIR only": the jaxpr is
  the IR one step earlier, and ``fold_scales_jaxpr.py`` binds the lowering's
  ``hx_matmul_q_p`` (an import in the allowed direction, passes -> lowering).
  It lives next to its pass, not in ``lowering/``, because it is that pass's
  rewrite (same pattern, same options, same stats, and the MLIR stage must give
  the same result for whatever it leaves), selected by the pipeline string, and
  tested against the MLIR stage; ``lowering/`` holds rules JAX calls, not
  rewrites a pipeline chooses.

Passes: ``hx-verify`` (the IR contract of ``lowering/schema.py``),
``hx-fold-scales`` (dequantize -> dot_general: scales into the smaller side,
``hx.matmul_q`` where it fits), ``hx-decompose`` (inline ``hx.*`` composites),
``hx-check-export`` (custom calls are registered, export-stable targets). One
file per pass, named after it.
"""

from hxmlir.passes.base import Diagnostic as Diagnostic
from hxmlir.passes.base import Diagnostics as Diagnostics
from hxmlir.passes.base import HxPass as HxPass
from hxmlir.passes.base import PassContext as PassContext
from hxmlir.passes.base import PassError as PassError
from hxmlir.passes.base import PassResult as PassResult
from hxmlir.passes.base import PipelineError as PipelineError
from hxmlir.passes.base import Severity as Severity
from hxmlir.passes.pipeline import NATIVE_PASSES as NATIVE_PASSES
from hxmlir.passes.pipeline import NativePass as NativePass
from hxmlir.passes.pipeline import Pipeline as Pipeline
from hxmlir.passes.pipeline import PipelineResult as PipelineResult
from hxmlir.passes.pipeline import parse_pipeline as parse_pipeline
from hxmlir.passes.registry import PASS_REGISTRY as PASS_REGISTRY
