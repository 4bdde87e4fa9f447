"""The demo's report: one :class:`Step` per step, collected in a :class:`Report`, and the
progress line it rewrites on a terminal; plus what it reads off IR text (composite counts,
``hx-verify``)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO

from hxmlir.passes import PassError, parse_pipeline
from hxmlir.passes.parsing import make_context, parse_module

_COMPOSITE_RE = re.compile(r'stablehlo\.composite\s+"(hx\.[A-Za-z0-9_.]+)"')


@dataclass
class Step:
  """One demo step: ``status`` is ``ok`` / ``failed`` (a check) or ``info`` / ``skipped``."""
  name: str
  status: str
  line: str
  data: dict[str, Any] = field(default_factory=dict)

  def text(self) -> str:
    mark = {"ok": "ok  ", "info": "    ", "failed": "FAIL", "skipped": "skip"}[self.status]
    return f"[{mark}] {self.name:<9} {self.line}"


@dataclass
class Report:
  """All steps of one demo run; ``ok`` when none failed or was skipped. ``format``: the
  weights' format (``{"dtype", "group_size", "method", "label"}``)."""
  model: str
  steps: list[Step] = field(default_factory=list)
  format: dict[str, Any] = field(default_factory=dict)

  @property
  def ok(self) -> bool:
    return all(s.status in ("ok", "info") for s in self.steps)

  def to_json(self) -> dict[str, Any]:
    return {"model": self.model, "format": self.format, "ok": self.ok,
            "steps": [{"name": s.name, "status": s.status, "line": s.line, **s.data}
                      for s in self.steps]}

  def summary(self) -> str:
    c = Counter(s.status for s in self.steps)
    checks = c["ok"] + c["failed"] + c["skipped"]
    verdict = "PASSED" if self.ok else "FAILED"
    extra = "".join(f", {c[k]} {k}" for k in ("failed", "skipped") if c[k])
    return f"demo {verdict}: {c['ok']}/{checks} checks passed{extra}"


class StepFailed(Exception):
  """Raised inside a step to end it as ``failed`` with a message (no traceback)."""


class StepSkipped(Exception):
  """Raised inside a step to end it as ``skipped`` with the reason."""


class ProgressLine:
  """Progress messages on a terminal: one line rewritten in place; silent otherwise."""

  def __init__(self, stream: TextIO):
    self.stream = stream
    self.tty = stream.isatty()
    self.width = 0

  def __call__(self, msg: str) -> None:
    if self.tty:
      text = f"  ... {msg}"
      self.stream.write("\r" + text.ljust(self.width))
      self.stream.flush()
      self.width = len(text)

  def clear(self) -> None:
    if self.tty and self.width:
      self.stream.write("\r" + " " * self.width + "\r")
      self.stream.flush()
      self.width = 0


# --- what the report reads off IR text ----------------------------------------

def count_composites(ir_text: str) -> dict[str, int]:
  """``{"hx.matmul_q": 24, ...}``: the ``hx.*`` composite ops in a module's text."""
  return dict(sorted(Counter(_COMPOSITE_RE.findall(ir_text)).items()))


_COMPOSITE_ATTRS_RE = re.compile(
    r'stablehlo\.composite\s+"(hx\.[A-Za-z0-9_.]+)"[^{]*\{composite_attributes = \{([^}]*)\}')
_ATTR_RE = re.compile(r'(\w+) = ("[^"]*"|[^,]+)')


def count_composites_by_format(ir_text: str) -> dict[str, int]:
  """``{"hx.matmul_q uint4_f16 g32 offset": 210, "hx.matmul_q int8_f16 g32": 1, ...}``:
  the ``hx.*`` composites of a module's text by name and by the quantized format in their
  attributes (``dtype``, the format's name, ``group_size`` and ``offset``; only the name
  for a composite without them)."""
  counts: Counter = Counter()
  for name, attrs in _COMPOSITE_ATTRS_RE.findall(ir_text):
    a = {k: v.strip().strip('"') for k, v in _ATTR_RE.findall(attrs)}
    parts = [a["dtype"]] if "dtype" in a else []
    if "group_size" in a:
      parts.append(f"g{a['group_size'].split(':')[0].strip()}")
    if a.get("offset") == "true":
      parts.append("offset")
    counts[" ".join([name, *parts])] += 1
  # composites without attributes (none of the regex above): by name only
  for name, n in Counter(_COMPOSITE_RE.findall(ir_text)).items():
    seen = sum(v for k, v in counts.items() if k.split(" ")[0] == name)
    if n > seen:
      counts[name] += n - seen
  return dict(sorted(counts.items()))


def fmt_counts(counts: dict[str, int]) -> str:
  """One line for a :func:`count_composites` result: ``"hx.matmul_q x24, hx.quantize x2"``
  (in ``counts``' order), or ``"no hx.* composites"`` when ``counts`` is empty."""
  return ", ".join(f"{k} x{v}" for k, v in counts.items()) or "no hx.* composites"


def verify_text(ir_text: str) -> tuple[bool, list[str]]:
  """Runs ``hx-verify`` on a module's text: ``(passed, problems)``."""
  ctx = make_context(allow_unregistered=True)
  with ctx:
    module = parse_module(ir_text, ctx, "<demo>")
    try:
      parse_pipeline("hx-verify").run(module)
    except PassError as e:
      return False, [str(d) for d in e.diagnostics] or [str(e)]
  return True, []
