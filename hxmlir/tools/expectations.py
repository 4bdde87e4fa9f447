"""MLIR's expected-diagnostics annotations (``--verify-diagnostics``), read and checked.

An annotation is a comment ``// expected-error @+1 {{message}}`` (kinds
``expected-error``, ``expected-warning``, ``expected-remark``, ``expected-note``;
targets ``@+N``, ``@-N``, ``@above``, ``@below``, ``@unknown``, none for the
same line; ``expected-error-re {{literal {{regex}} literal}}`` and the other
``-re`` kinds), as MLIR's ``SourceMgrDiagnosticVerifierHandler`` reads them
(``mlir/lib/IR/Diagnostics.cpp``). :func:`verify_diagnostics` matches the
diagnostics of one chunk against its annotations and returns the mismatches as
``file:line:col: error: ...`` lines; an unknown ``expected-*`` kind or a bad
regex is itself a mismatch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from hxmlir.passes.base import Diagnostic

_EXPECTED = re.compile(
    r"expected-(error|warning|remark|note)(-re)?\s*(?:@\s*([+-]\d+|above|below|unknown))?\s*"
    r"\{\{(.*)\}\}")
_ANY_EXPECTED = re.compile(r"\bexpected-([\w-]+)\s*(?:@|\{\{)")
_REGEX_PART = re.compile(r"\{\{(.*?)\}\}")

# MLIR attaches the failing op's text to an op's diagnostics as this note
# (``printOpOnDiagnostic``); mlir-opt turns it off in verify mode, so annotated tests
# never expect it.
CURRENT_OPERATION_NOTE = "see current operation:"


class BadAnnotation(Exception):
  """An ``expected-*`` annotation that cannot be understood (unknown kind, bad regex)."""


@dataclass
class Expected:
  """One annotation: ``severity`` (``"error"``...), target ``line`` (``None`` for
  ``@unknown``), message ``text``, ``where`` (``file:line:col`` of the annotation),
  ``pattern`` for ``-re`` kinds; ``seen`` once a diagnostic matched it."""
  severity: str
  line: int | None
  text: str
  where: str
  pattern: re.Pattern | None = None
  seen: bool = False

  def matches(self, message: str) -> bool:
    """Whether ``message`` is what this annotation expects (substring, or regex search)."""
    if self.pattern is not None:
      return self.pattern.search(message) is not None
    return self.text in message


def _regex_of(message: str) -> re.Pattern:
  """MLIR's ``expected-*-re`` message: literal text in which ``{{regex}}`` parts are regexes."""
  parts, pos = [], 0
  for m in _REGEX_PART.finditer(message):
    parts += [re.escape(message[pos:m.start()]), f"(?:{m.group(1)})"]
    pos = m.end()
  parts.append(re.escape(message[pos:]))
  return re.compile("".join(parts))


def _target(at: str | None, i: int, annotated: set[int]) -> int | None:
  """The 0-based line an annotation on line ``i`` points at (``None``: ``@unknown``)."""
  if at is None:
    return i
  if at == "unknown":
    return None
  if at in ("above", "below"):
    step = -1 if at == "above" else 1
    target = i + step
    while target in annotated:
      target += step
    return target
  return i + int(at)


def expectations(source_name: str, text: str, offset: int) -> list[Expected]:
  """The ``expected-*`` annotations of one chunk (``offset``: lines before it in the file).

  Raises :class:`BadAnnotation` for an unknown ``expected-*`` kind or a bad regex.
  """
  out = []
  lines = text.split("\n")
  annotated = {i for i, ln in enumerate(lines) if _EXPECTED.search(ln)}
  for i, ln in enumerate(lines):
    known = {m.start() for m in _EXPECTED.finditer(ln)}
    for m in _ANY_EXPECTED.finditer(ln):
      if m.start() not in known and "//" in ln[:m.start()]:
        raise BadAnnotation(
            f"{source_name}:{i + 1 + offset}:{m.start() + 1}: error: unknown annotation "
            f"'expected-{m.group(1)}'; use expected-error, expected-warning, expected-remark or "
            f"expected-note (with '-re' for {{{{regex}}}} parts), then "
            f"[@+N|@-N|@above|@below|@unknown] {{{{message}}}}")
    for m in _EXPECTED.finditer(ln):
      sev, is_re, at, msg = m.groups()
      where = f"{source_name}:{i + 1 + offset}:{m.start() + 1}"
      pattern = None
      if is_re:
        try:
          pattern = _regex_of(msg)
        except re.error as e:
          raise BadAnnotation(f"{where}: error: invalid regex in expected-{sev}-re "
                              f"{{{{{msg}}}}}: {e}") from None
      target = _target(at, i, annotated)
      line_no = None if target is None else target + 1 + offset
      out.append(Expected(sev, line_no, msg, where, pattern))
  return out


def _line_of(location: str, source_name: str) -> int | None:
  if not location.startswith(source_name + ":"):
    return None
  try:
    return int(location[len(source_name) + 1:].split(":")[0])
  except ValueError:
    return None


def verify_diagnostics(source_name: str, text: str, offset: int,
                       diags: Iterable[Diagnostic]) -> list[str]:
  """Mismatches between ``diags`` (with their notes) and the annotations of one chunk.

  Each is a ``file:line:col: error: ...`` line: an unexpected diagnostic, an
  annotation no diagnostic matched, or a bad annotation. Empty when all match.
  MLIR's ``see current operation`` notes are not diagnostics of the input and
  are skipped, as ``mlir-opt --verify-diagnostics`` does.
  """
  try:
    expected = expectations(source_name, text, offset)
  except BadAnnotation as e:
    return [str(e)]
  flat = []
  for d in diags:
    flat.append(d)
    flat += [n for n in d.notes if not n.message.startswith(CURRENT_OPERATION_NOTE)]
  problems = []
  for d in flat:
    line = _line_of(d.location, source_name)
    match = next((e for e in expected if not e.seen and e.severity == d.severity.value
                  and e.line == line and e.matches(d.message)), None)
    if match is None:
      problems.append(f"{d.location}: error: unexpected {d.severity.value}: {d.message}")
    else:
      match.seen = True
  for e in expected:
    if not e.seen:
      kind = f"{e.severity} matching" if e.pattern is not None else e.severity
      problems.append(f'{e.where}: error: expected {kind} "{e.text}" was not produced')
  return problems
