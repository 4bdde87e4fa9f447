"""Pass pipelines: parse ``hx-verify,hx-fold-scales{opt=v},canonicalize,cse`` and run it.

Grammar (xDSL's ``arg_spec``, MLIR's textual pipelines)::

  pipeline := element (',' element)*
  element  := name ['{' option (' ' option)* '}']   |   name '(' native-pipeline ')'
  option   := key ['=' value]       (dashes in keys map to underscores)

Names in :data:`~hxmlir.passes.registry.PASS_REGISTRY` are our passes; every
other element is handed verbatim to ``jaxlib.mlir.passmanager.PassManager``
(nested as ``builtin.module(<element>)``), so one pipeline mixes both. A
``builtin.module(...)`` anchor around the whole pipeline is accepted, like
``mlir-opt``'s, and so is one around some of its elements
(``hx-verify,builtin.module(hx-fold-scales)``, what ``hx.install`` builds when it
puts ``hx-verify`` before a user's anchored pipeline): the pipeline runs on the
one top-level module, so the anchor names that module, not nested ones. Empty
pass names (``a,,b``, ``,``) are errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jaxlib.mlir import ir, passmanager

from hxmlir.passes import ops, parsing
from hxmlir.passes.base import Diagnostic, HxPass, PassContext, PassError, PipelineError
from hxmlir.passes.registry import PASS_REGISTRY

NATIVE_PASSES: tuple[str, ...] = (
    "canonicalize", "control-flow-sink", "cse", "inline", "loop-invariant-code-motion",
    "mem2reg", "remove-dead-values", "sccp", "sdy-add-data-flow-edges",
    "sdy-aggressive-propagate", "sdy-basic-propagate", "sdy-close-shardings",
    "sdy-export-pipeline", "sdy-import-pipeline", "sdy-propagation-pipeline",
    "sdy-remove-sharding-groups", "sroa", "strip-debuginfo", "symbol-dce",
    "symbol-privatize", "topological-sort",
)
"""Module-level MLIR passes that jaxlib registers (a test checks each one parses).

Not exhaustive: any pass ``PassManager.parse`` accepts works, including nested
ones like ``func.func(sdy-drop-sharding-rules)``."""


def _split_top(text: str, sep: str) -> list[str]:
  """Splits ``text`` at ``sep`` outside ``{}``/``()``/quotes; raises on unbalanced brackets."""
  parts: list[str] = []
  cur: list[str] = []
  depth, quote = 0, False
  for ch in text:
    if ch == '"':
      quote = not quote
    elif not quote and ch in "{(":
      depth += 1
    elif not quote and ch in "})":
      depth -= 1
      if depth < 0:
        raise PipelineError(f"unbalanced {ch!r} in pass pipeline {text!r}", len(cur) + 1)
    if ch == sep and depth == 0 and not quote:
      parts.append("".join(cur))
      cur = []
    else:
      cur.append(ch)
  if depth != 0 or quote:
    raise PipelineError(f"unbalanced brackets or quotes in pass pipeline {text!r}")
  parts.append("".join(cur))
  return parts


def _convert(pass_name: str, key: str, f: dataclasses.Field, raw: str | None):
  typ = f.type if isinstance(f.type, type) else {"bool": bool, "int": int, "float": float,
                                                 "str": str}.get(str(f.type), str)
  if raw is None:
    if typ is bool:
      return True
    raise PipelineError(f"{pass_name}: option {key!r} needs a value ({key}=<{typ.__name__}>)")
  raw = raw.strip('"')
  sep = f.metadata.get("separator")
  if sep and "," in raw:
    raise PipelineError(f"{pass_name}: option {key!r} separates its values with {sep!r}, got "
                        f"{raw!r}; ',' separates passes (write {key}={raw.replace(',', sep)})")
  if typ is bool:
    if raw.lower() in ("true", "1"):
      return True
    if raw.lower() in ("false", "0"):
      return False
    raise PipelineError(f"{pass_name}: option {key!r} must be true or false, got {raw!r}")
  try:
    return typ(raw)
  except ValueError:
    raise PipelineError(f"{pass_name}: option {key!r} must be {typ.__name__}, "
                        f"got {raw!r}") from None


def _make_pass(name: str, opts_text: str, column: int) -> HxPass:
  """The pass ``name`` with options ``opts_text`` (which starts at ``column`` of the pipeline)."""
  cls = PASS_REGISTRY[name]()
  fields = cls.options()
  kwargs = {}
  pos = 0
  for item in opts_text.split():
    pos = opts_text.index(item, pos)
    key, _, raw = item.partition("=")
    f = fields.get(key) or fields.get(key.replace("_", "-"))
    try:
      if f is None:
        valid = ", ".join(fields) or "none"
        raise PipelineError(f"{name}: unknown option {key!r}; valid options: {valid}")
      kwargs[f.name] = _convert(name, key, f, raw if "=" in item else None)
    except PipelineError as e:
      e.column = column + pos
      raise
    pos += len(item)
  return cls(**kwargs)


@functools.cache
def _check_context() -> ir.Context:
  return parsing.make_context()


def option_help(f: dataclasses.Field) -> str:
  """``type (default v)`` for one pass option, with its value separator if it is a list."""
  typ = f.type if isinstance(f.type, str) else f.type.__name__
  sep = f.metadata.get("separator")
  kind = f"{typ}, {sep!r}-separated list" if sep else typ
  return f"{kind} (default {f.default!r})" if sep else f"{kind} (default {f.default})"


_LLVM_PROG = re.compile(r"^\s*[\w.\-]*: (?=for the )")


@contextlib.contextmanager
def _captured_stderr(into: list[str]):
  """Captures what C++ writes on file descriptor 2 (LLVM's option parser) into ``into``."""
  try:
    saved = os.dup(2)
  except OSError:  # no fd 2: nothing to capture
    yield
    return
  with tempfile.TemporaryFile() as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      into += [ln for ln in tmp.read().decode("utf-8", "replace").splitlines() if ln.strip()]


def _parse_native(text: str, context: ir.Context) -> passmanager.PassManager:
  """``PassManager.parse(text)``; raises ``ValueError`` with MLIR's message and what it
  printed on stderr (an option's bad value) in one.

  Used once per pipeline string (parse time); running a parsed pipeline does not touch
  file descriptor 2.
  """
  printed: list[str] = []
  try:
    with _captured_stderr(printed):
      pm = passmanager.PassManager.parse(text, context=context)
  except ValueError as e:
    lines = [ln.strip() for ln in [*printed, *str(e).splitlines()] if ln.strip()]
    # LLVM's option parser prefixes its errors with the program name it was given
    # ("", or "xla" once XLA has set up its flags): drop it, the text is the same.
    raise ValueError("\n".join(_LLVM_PROG.sub("", ln.removeprefix("<Pass-Options-Parser>:"))
                               .lstrip(": ") for ln in lines)) from None
  if printed:  # not MLIR's (it succeeded): another thread's output, passed on
    os.write(2, ("\n".join(printed) + "\n").encode())
  return pm


def _native_option_error(element: str, why: str) -> PipelineError | None:
  """The error for a known MLIR pass with bad options (MLIR says "failed to add `p` with
  options `o`"), else ``None``."""
  lines = why.splitlines()
  failed = [ln for ln in lines if ln.startswith("failed to add `") and "with options `" in ln]
  if not failed or failed[0].endswith("with options ``"):
    return None
  name = failed[0].split("`")[1]
  details = [ln for ln in lines if not ln.startswith("failed to add `")]
  detail = "; ".join(details) or failed[0]
  return PipelineError(f"{name}: bad option for MLIR pass {name!r}: {detail} (in {element!r})")


def _native_error(name: str, why: str) -> PipelineError:
  ours = sorted(PASS_REGISTRY)
  close = [c for c in difflib.get_close_matches(name, [*ours, *NATIVE_PASSES], n=2) if c != name]
  hint = f" (did you mean {close[0]!r}?)" if close else ""
  return PipelineError(
      f"unknown pass {name!r}{hint}: {why}\n"
      f"  hxmlir passes: {', '.join(ours)}\n"
      f"  MLIR passes (jaxlib): {', '.join(NATIVE_PASSES)}")


@dataclass(frozen=True)
class NativePass:
  """An element handed to MLIR's pass manager, e.g. ``canonicalize`` or ``func.func(cse)``."""
  text: str

  @property
  def name(self) -> str:
    return self.text

  def pipeline_str(self) -> str:
    return self.text


@dataclass
class PipelineResult:
  """The outcome of :meth:`Pipeline.run`.

  ``changed``: some pass modified the module. ``stats``: pass name -> counters
  (``{"hx-fold-scales": {"scales folded": 3}}``). ``diagnostics``: warnings and
  remarks the passes reported (errors raise :class:`PassError` instead).
  """
  changed: bool = False
  stats: dict[str, dict[str, int]] = field(default_factory=dict)
  diagnostics: list[Diagnostic] = field(default_factory=list)


AfterPass = Callable[[str, ir.Operation, float], None]
"""``after_pass(pass_name, module, seconds)``: called after each pass succeeds."""


@dataclass(frozen=True)
class Pipeline:
  """A parsed pipeline: our passes (:class:`HxPass`) and native ones (:class:`NativePass`)."""
  passes: tuple[HxPass | NativePass, ...]

  def __str__(self) -> str:
    return ",".join(p.pipeline_str() for p in self.passes)

  def run(self, module, *, after_pass: AfterPass | None = None,
          platforms: tuple[str, ...] | None = None) -> PipelineResult:
    """Runs every pass on ``module`` (``ir.Module`` or ``builtin.module`` op), in place.

    The module is verified with MLIR's verifier after each pass that changed it. Raises
    :class:`PassError` when a pass reports errors (all of them, at once), when
    MLIR's verifier fails after a pass (naming that pass), or when a native
    pass fails. ``platforms``: what the module is being lowered for, when known
    (``hxmlir.integration.installation`` passes JAX's lowering platforms); passes may specialise
    on it (``hx-fold-scales`` builds CPU-streaming decompositions for ``("cpu",)``).
    """
    op = module.operation
    result = PipelineResult()
    with ops.op_index_scope():
      self._run_passes(op, result, after_pass, platforms)
    return result

  def run_jaxpr(self, jaxpr) -> tuple[object, dict[str, dict[str, int]], list[tuple[str, float]]]:
    """The pipeline's jaxpr stage, for a pipeline about to run on the module lowered from ``jaxpr``.

    ``jaxpr``: a ``jax.extend.core.ClosedJaxpr``. Runs the jaxpr stage
    (:meth:`HxPass.apply_jaxpr`) of the leading passes, in order: analyses
    (``HxPass.analysis``) are passed over, since they look at the module only;
    the first pass that is neither an analysis nor has a jaxpr stage ends it
    (everything after must see that pass's result). :meth:`run` then runs the
    whole pipeline on the lowered module as usual. Returns the jaxpr (the same
    object when nothing changed), counters per pass, and ``(pass name,
    seconds)`` per jaxpr stage run.
    """
    stats: dict[str, dict[str, int]] = {}
    ran: list[tuple[str, float]] = []
    for p in self.passes:
      if isinstance(p, NativePass):
        break
      if p.analysis:
        continue
      start = time.perf_counter()
      got = p.apply_jaxpr(jaxpr)
      if got is None:
        break
      jaxpr, counters = got
      ran.append((p.name, time.perf_counter() - start))
      if counters:
        stats[p.name] = dict(counters)
    return jaxpr, stats, ran

  def _run_passes(self, op: ir.Operation, result: PipelineResult,
                  after_pass: AfterPass | None, platforms: tuple[str, ...] | None) -> None:
    for p in self.passes:
      start = time.perf_counter()
      if isinstance(p, NativePass):
        changed, stats = _run_native(p, op), {}
        if changed:
          ops.invalidate_op_index()
      else:
        diags = PassContext(platforms)
        with op.context, ir.Location.unknown():
          outcome = p.apply(op, diags)
        result.diagnostics += [d for d in diags.items if d not in diags.errors]
        if diags.errors:
          n = len(diags.errors)
          raise PassError(p.name, f"{n} problem{'s' if n != 1 else ''} found", diags.items)
        changed, stats = outcome.changed, outcome.stats
        if changed:  # an unchanged module is as valid as before the pass
          ops.invalidate_op_index()
          _verify_after(p.name, op)
      elapsed = time.perf_counter() - start
      result.changed |= changed
      mine = result.stats.setdefault(p.name, {})
      for k, v in stats.items():
        mine[k] = mine.get(k, 0) + v
      if after_pass is not None:
        after_pass(p.name, op, elapsed)


def _verify_after(name: str, op: ir.Operation) -> None:
  try:
    op.verify()
  except ir.MLIRError as e:
    raise PassError(name, "the IR is invalid after this pass (MLIR verifier failed); "
                    "this is a bug in the pass",
                    [Diagnostic.from_mlir(d) for d in e.error_diagnostics]) from None


def _run_native(p: NativePass, op: ir.Operation) -> bool:
  before = op.get_asm(enable_debug_info=True)
  try:
    pm = passmanager.PassManager.parse(f"builtin.module({p.text})", context=op.context)
  except ValueError as e:
    raise _native_error(p.text, str(e).splitlines()[0]) from None
  pm.enable_verifier(True)
  try:
    pm.run(op)
  except ir.MLIRError as e:
    raise PassError(p.name, "MLIR pass failed",
                    [Diagnostic.from_mlir(d) for d in e.error_diagnostics]) from None
  return op.get_asm(enable_debug_info=True) != before


def parse_pipeline(text: str) -> Pipeline:
  """Parses a pipeline string; raises :class:`PipelineError` on unknown passes or options.

  Our passes take ``{key=value ...}`` options; anything else must be a pass
  (or nested pipeline) that jaxlib's MLIR registers. ``builtin.module(...)``
  anchors (around the whole pipeline or some elements) name the module the
  pipeline runs on. Empty pass names are errors.
  """
  return Pipeline(tuple(_parse_elements(text, 0)))


_ANCHOR = "builtin.module("


def _parse_elements(text: str, offset: int) -> list[HxPass | NativePass]:
  """The passes of ``text``, which starts at 0-based ``offset`` in the whole pipeline."""
  offset += len(text) - len(text.lstrip())
  text = text.strip()
  if text.startswith(_ANCHOR) and text.endswith(")") and len(_split_top(text, ",")) == 1:
    text = text[len(_ANCHOR):-1]
    offset += len(_ANCHOR) + len(text) - len(text.lstrip())
    text = text.strip()
  if not text:
    return []
  passes: list[HxPass | NativePass] = []
  column = 1 + offset
  for raw in _split_top(text, ","):
    element = raw.strip()
    start = column + len(raw) - len(raw.lstrip())
    column += len(raw) + 1
    if not element:
      raise PipelineError(f"empty pass name in pipeline {text!r} (a stray ','?)", start)
    if element.startswith(_ANCHOR) and element.endswith(")"):
      passes += _parse_elements(element, start - 1)
      continue
    name, brace, rest = element.partition("{")
    name = name.strip()
    if name in PASS_REGISTRY:
      if brace and not rest.endswith("}"):
        raise PipelineError(f"{name}: options must be written {{key=value ...}}, got {element!r}",
                            start)
      passes.append(_make_pass(name, rest[:-1] if brace else "", start + len(name) + 1))
      continue
    head = element.split("(")[0].split("{")[0].strip()
    try:
      _parse_native(f"builtin.module({element})", _check_context())
    except ValueError as e:
      err = _native_option_error(element, str(e))
      if err is None:
        msg = str(e).splitlines()
        why = next((m for m in msg if "error:" in m), msg[0] if msg else "")
        why = why.split("error:", 1)[-1].strip()
        err = _native_error(head, why)
      err.column = start
      raise err from None
    passes.append(NativePass(element))
  return passes
