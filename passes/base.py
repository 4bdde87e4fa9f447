"""The pass base class, diagnostics and the errors of the pass framework.

A pass is a frozen dataclass deriving from :class:`HxPass`: a kebab-case
``name`` class variable, typed option fields with defaults (documented in the
class docstring), and :meth:`HxPass.apply`, which rewrites a ``builtin.module``
in place and returns a :class:`PassResult`. Problems are reported through the
:class:`Diagnostics` sink it is given (every problem, each at its op's
location); the pipeline fails once after the pass if any error was reported.
The layout follows xDSL's ``ModulePass`` (``xdsl/passes.py``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from jaxlib.mlir import ir

from hxmlir.passes import locations


class Severity(enum.Enum):
  """Diagnostic severity, spelled as MLIR prints it."""
  ERROR = "error"
  WARNING = "warning"
  REMARK = "remark"
  NOTE = "note"


@dataclass(frozen=True)
class Diagnostic:
  """One problem: ``severity``, ``location`` (``"file:line:col"``), ``message``.

  ``location`` is the first file position in the op's MLIR location (for IR
  lowered by JAX: the user's Python file and line); ``"<unknown>"`` when the
  location holds none. ``notes`` are further diagnostics attached to this one.
  """
  severity: Severity
  location: str
  message: str
  notes: tuple[Diagnostic, ...] = ()

  def __str__(self) -> str:
    lines = [f"{self.location}: {self.severity.value}: {self.message}"]
    lines += [f"{n.location}: note: {n.message}" for n in self.notes]
    return "\n".join(lines)

  @classmethod
  def from_mlir(cls, d) -> Diagnostic:
    """Converts a ``jaxlib.mlir.ir.Diagnostic``/``DiagnosticInfo`` (from an ``MLIRError``)."""
    sev = {ir.DiagnosticSeverity.ERROR: Severity.ERROR,
           ir.DiagnosticSeverity.WARNING: Severity.WARNING,
           ir.DiagnosticSeverity.REMARK: Severity.REMARK}.get(d.severity, Severity.NOTE)
    return cls(sev, locations.location_str(d.location), d.message,
               tuple(cls.from_mlir(n) for n in d.notes))


class PassError(Exception):
  """A pass reported problems, broke the IR, or a native pass failed.

  ``diagnostics`` lists every problem (each with ``severity``, ``location``,
  ``message``); ``pass_name`` names the pass. ``str()`` lists them all, one per
  line, as ``file:line:col: error: message``.
  """

  def __init__(self, pass_name: str, summary: str, diagnostics: Iterable[Diagnostic]):
    self.pass_name = pass_name
    self.summary = summary
    self.diagnostics = list(diagnostics)
    super().__init__(str(self))

  def __str__(self) -> str:
    return "\n".join([f"{self.pass_name}: {self.summary}", *map(str, self.diagnostics)])


class PipelineError(ValueError):
  """A pipeline string names an unknown pass or option, or an option has a bad value.

  The message lists the valid pass names (or the pass's options). ``column``
  (1-based, or ``None``) is where in the pipeline string the problem is.
  """

  def __init__(self, message: str, column: int | None = None):
    super().__init__(message)
    self.column = column


class Diagnostics:
  """The sink a pass reports to: ``error``/``warning``/``remark`` at an op or location."""

  def __init__(self):
    self.items: list[Diagnostic] = []

  def emit(self, severity: Severity, where, message: str) -> None:
    """Records ``message`` at ``where`` (an op, an ``ir.Location`` or a location string)."""
    if isinstance(where, str):
      loc = where
    elif isinstance(where, ir.Location):
      loc = locations.location_str(where)
    else:
      loc = locations.location_str(where.location)
    self.items.append(Diagnostic(severity, loc, message))

  def error(self, where, message: str) -> None:
    """Records an error; the pipeline fails after the pass."""
    self.emit(Severity.ERROR, where, message)

  def warning(self, where, message: str) -> None:
    """Records a warning (reported, not fatal)."""
    self.emit(Severity.WARNING, where, message)

  def remark(self, where, message: str) -> None:
    """Records a remark (reported, not fatal)."""
    self.emit(Severity.REMARK, where, message)

  @property
  def errors(self) -> list[Diagnostic]:
    return [d for d in self.items if d.severity is Severity.ERROR]


class PassContext(Diagnostics):
  """What a pass is given besides the module (xDSL's ``ctx``): the diagnostics sink and
  facts about the run.

  ``platforms``: the platforms the module is being lowered for (``("cpu",)``,
  ``("cuda", "tpu")``), when the pipeline runs inside a JAX lowering
  (``hxmlir.integration.installation`` gives JAX's lowering platforms); ``None`` when unknown
  (``hxmlir-opt``). Passes may specialise on it (``hx-fold-scales`` builds
  CPU-streaming decompositions for ``("cpu",)``). It is a :class:`Diagnostics`,
  so passes report to it directly.
  """

  def __init__(self, platforms: tuple[str, ...] | None = None):
    super().__init__()
    self.platforms = None if platforms is None else tuple(platforms)


@dataclass
class PassResult:
  """What one pass did: ``changed`` (the IR was modified) and ``stats`` (counters)."""
  changed: bool = False
  stats: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class HxPass:
  """Base of hxmlir's passes.

  Subclasses set ``name`` (kebab-case, ``hx-<verb>[-<object>]``) and
  ``summary`` (one line, shown by ``hxmlir-opt --list-passes``), declare
  options as dataclass fields with defaults (``bool``, ``int``, ``float``,
  ``str``), and implement :meth:`apply`.
  """
  name: ClassVar[str]
  summary: ClassVar[str] = ""
  analysis: ClassVar[bool] = False
  """True for passes that never modify the module (they only report)."""

  def apply(self, module: ir.Operation, ctx: PassContext) -> PassResult:
    """Runs on ``module`` (a ``builtin.module`` op), in place.

    Reports problems to ``ctx`` (a :class:`PassContext`: a :class:`Diagnostics`
    sink that also says what the module is lowered for); returns whether the IR
    changed and counters.
    """
    raise NotImplementedError

  def apply_jaxpr(self, jaxpr) -> tuple[object, dict[str, int]] | None:
    """The pass's jaxpr stage, for pipelines that run inside a JAX lowering.

    ``jaxpr``: the ``jax.extend.core.ClosedJaxpr`` JAX is about to lower.
    Returns the rewritten jaxpr and counters (as :meth:`apply`'s), or ``None``
    when the pass has no jaxpr stage (the default). A jaxpr stage does part of
    the pass's work before lowering, where it is cheaper; :meth:`apply` still
    runs on the module afterwards and must give the same result for whatever
    the jaxpr stage left. See :meth:`Pipeline.run_jaxpr
    <hxmlir.passes.pipeline.Pipeline.run_jaxpr>`.
    """
    return None

  @classmethod
  def options(cls) -> dict[str, dataclasses.Field]:
    """The pass's options keyed by their kebab-case spelling."""
    return {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}

  def pipeline_str(self) -> str:
    """``name{opt=value ...}`` with the options that differ from their defaults."""
    opts = []
    for key, f in self.options().items():
      v = getattr(self, f.name)
      if v != f.default:
        opts.append(f"{key}={str(v).lower() if isinstance(v, bool) else v}")
    return self.name + ("{" + " ".join(opts) + "}" if opts else "")
