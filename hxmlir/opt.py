"""``hxmlir-opt``: run hxmlir and MLIR passes on MLIR files (the tool lit drives).

In the spirit of ``mlir-opt`` and ``xdsl-opt``::

  hxmlir-opt [input|-] [-o out] [-p PIPELINE] [--split-input-file]
             [--verify-diagnostics] [--mlir-print-debuginfo] [--emit-bytecode]
             [--print-ir-after-all] [--timing] [--allow-unregistered-dialect]
             [--list-passes] [--version]

``mlir-opt``'s single-dash spellings of the long flags (``-split-input-file``,
``-pass-pipeline=...``) are accepted too; ``-p`` and ``-o`` may be given once.

Input is MLIR text or bytecode (file or stdin); output is text (or bytecode
with ``--emit-bytecode``) on stdout or ``-o``. Errors — malformed input,
unknown passes or options, bad flags, failing passes — are printed on stderr
as ``file:line:col: error: message`` and the exit status is 1; never a Python
traceback. Bytecode input is checked first (header, strings) and parsed once in
a child process, since MLIR's reader can abort or hang on a corrupted file;
either becomes ``file:0:0: error: corrupted MLIR bytecode: ...``.
``--verify-diagnostics`` checks the diagnostics against MLIR's
``// expected-error @+1 {{...}}`` (``expected-warning``, ``expected-remark``,
``expected-note``; ``@+N``, ``@-N``, ``@above``, ``@below``, ``@unknown``;
``expected-error-re {{literal {{regex}} literal}}`` and the other ``-re`` kinds)
annotations instead of printing them; an unknown ``expected-*`` kind is an error.

:class:`HxmlirOpt` runs in-process (``HxmlirOpt(["-p", "hx-verify", path]).run()``
returns the exit status), so pytest drives it without subprocesses. An internal
error (a bug) is reported in one line; set ``HXMLIR_OPT_TRACEBACK=1`` to get the
Python traceback instead.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO

from hxmlir.passes import PASS_REGISTRY, PassError, PipelineError, irutil, parse_pipeline
from hxmlir.passes.base import Diagnostic, Severity
from hxmlir.passes.pipeline import NATIVE_PASSES, option_help

SPLIT_MARKER = re.compile(r"^// -----.*$", re.MULTILINE)
_EXPECTED = re.compile(
    r"expected-(error|warning|remark|note)(-re)?\s*(?:@\s*([+-]\d+|above|below|unknown))?\s*"
    r"\{\{(.*)\}\}")
_ANY_EXPECTED = re.compile(r"\bexpected-([\w-]+)\s*(?:@|\{\{)")
_REGEX_PART = re.compile(r"\{\{(.*?)\}\}")


class _Usage(Exception):
  pass


class _Parser(argparse.ArgumentParser):
  out: IO | None = None  # where --help goes (the driver's stdout)

  def error(self, message):  # argparse would print usage and exit 2
    raise _Usage(message)

  def _print_message(self, message, file=None):
    if message:
      (self.out or file or sys.stdout).write(message)


class _Once(argparse.Action):
  """A flag that may be given once (a repeated ``-p`` would silently drop a pipeline)."""

  def __call__(self, parser, namespace, values, option_string=None):
    if getattr(namespace, f"_seen_{self.dest}", False):
      hint = ("give one pipeline, its passes separated by ','" if self.dest == "pipeline"
              else "give it once")
      raise _Usage(f"{option_string} given twice ({getattr(namespace, self.dest)!r}, then "
                   f"{values!r}); {hint}")
    setattr(namespace, f"_seen_{self.dest}", True)
    setattr(namespace, self.dest, values)


def _long_flags(parser: argparse.ArgumentParser) -> frozenset[str]:
  return frozenset(s[2:] for a in parser._actions for s in a.option_strings if s.startswith("--"))


def _mlir_spellings(argv: list[str], long_flags: frozenset[str]) -> list[str]:
  """``mlir-opt``'s single-dash long flags (``-split-input-file``, ``-pass-pipeline=...``)
  as their ``--`` spelling; everything after ``--`` is left alone."""
  out = []
  for i, a in enumerate(argv):
    if a == "--":
      return out + argv[i:]
    if a.startswith("-") and not a.startswith("--") and a[1:].split("=", 1)[0] in long_flags:
      a = "-" + a
    out.append(a)
  return out


def _build_parser() -> argparse.ArgumentParser:
  p = _Parser(prog="hxmlir-opt", description="Run hxmlir and MLIR passes on MLIR files.",
              add_help=True)
  p.add_argument("input", nargs="?", default="-", help="input file (MLIR text or bytecode); "
                 "'-' or none for stdin")
  p.add_argument("-o", dest="output", default="-", action=_Once,
                 help="output file ('-' for stdout)")
  p.add_argument("-p", "--pass-pipeline", "--passes", dest="pipeline", default="", action=_Once,
                 help="comma-separated passes, e.g. 'hx-verify,hx-fold-scales,canonicalize' "
                 "(given once)")
  p.add_argument("--split-input-file", action="store_true",
                 help="process each '// -----'-separated chunk separately")
  p.add_argument("--verify-diagnostics", action="store_true",
                 help="check diagnostics against expected-* annotations in the input")
  p.add_argument("--mlir-print-debuginfo", action="store_true",
                 help="print locations in the output")
  p.add_argument("--emit-bytecode", action="store_true", help="write MLIR bytecode")
  p.add_argument("--print-ir-after-all", action="store_true",
                 help="print the IR on stderr after each pass")
  p.add_argument("--timing", action="store_true", help="print pass timings on stderr")
  p.add_argument("--allow-unregistered-dialect", action="store_true",
                 help="accept ops of dialects that are not registered")
  p.add_argument("--list-passes", action="store_true", help="list the available passes")
  p.add_argument("--version", action="store_true", help="print versions and exit")
  return p


@dataclass
class _Expected:
  severity: str
  line: int | None  # None: @unknown
  text: str
  where: str  # "file:line:col" of the annotation
  pattern: re.Pattern | None = None  # expected-*-re: literal text with {{regex}} parts
  seen: bool = False

  def matches(self, message: str) -> bool:
    if self.pattern is not None:
      return self.pattern.search(message) is not None
    return self.text in message


class HxmlirOpt:
  """The ``hxmlir-opt`` driver; ``run()`` returns the exit status (0 ok, 1 error).

  ``args``: command-line arguments without the program name (default
  ``sys.argv[1:]``). ``stdin``/``stdout``/``stderr``: binary or text streams
  (default the process's); stdout receives bytes when writing bytecode.
  """

  def __init__(self, args: list[str] | None = None, *, stdin: IO | None = None,
               stdout: IO | None = None, stderr: IO | None = None):
    self.argv = list(sys.argv[1:] if args is None else args)
    self.stdin = stdin if stdin is not None else sys.stdin
    self.stdout = stdout if stdout is not None else sys.stdout
    self.stderr = stderr if stderr is not None else sys.stderr
    self.timings: list[tuple[str, float]] = []

  def _err(self, text: str) -> None:
    self.stderr.write(text if text.endswith("\n") else text + "\n")

  def run(self) -> int:
    """Parses the arguments, processes the input, returns the exit status."""
    try:
      return self._run()
    except _Usage as e:
      self._err(f"hxmlir-opt: error: {e}\n(run 'hxmlir-opt --help' for usage)")
      return 1
    except SystemExit as e:  # --help
      return int(e.code or 0)
    except Exception as e:  # an internal error: one line, no traceback
      if os.environ.get("HXMLIR_OPT_TRACEBACK"):
        raise
      self._err(f"hxmlir-opt: internal error: {type(e).__name__}: {e}")
      return 1

  def _run(self) -> int:
    parser = _build_parser()
    parser.out = self.stdout
    args = parser.parse_args(_mlir_spellings(self.argv, _long_flags(parser)))
    if args.version:
      return self._version()
    if args.list_passes:
      return self._list_passes()
    try:
      pipeline = parse_pipeline(args.pipeline)
    except PipelineError as e:
      first, *rest = str(e).splitlines()
      col = e.column or 1
      self._err(f"<pass-pipeline>:1:{col}: error: {first}\n" + "\n".join(rest))
      return 1
    source_name, data = self._read(args.input)
    if data is None:
      return 1
    if isinstance(data, bytes):  # bytecode
      problem = check_bytecode(data) or _parse_bytecode_in_child(
          data, args.allow_unregistered_dialect)
      if problem:
        self._err(f"{source_name}:0:0: error: {problem}")
        return 1
      if args.split_input_file or args.verify_diagnostics:
        self._err(f"{source_name}:0:0: error: --split-input-file and --verify-diagnostics "
                  "need MLIR text input, got bytecode")
        return 1
      chunks = [(data, 0)]
    else:
      chunks = _split(data) if args.split_input_file else [(data, 0)]
    if args.emit_bytecode and len(chunks) > 1:
      self._err("hxmlir-opt: error: --emit-bytecode writes one module; "
                "do not combine it with --split-input-file")
      return 1
    ctx = irutil.make_context(args.allow_unregistered_dialect)
    outputs: list[str | bytes] = []
    status = 0
    for text, offset in chunks:
      out, ok = self._process(ctx, args, pipeline, source_name, text, offset)
      status |= 0 if ok else 1
      if out is not None:
        outputs.append(out)
    if not self._write(args, outputs):
      return 1
    if args.timing:
      self._report_timing()
    return status

  # --- input / output --------------------------------------------------------

  def _read(self, path: str):
    if path == "-":
      stream = self.stdin
      raw = stream.buffer.read() if hasattr(stream, "buffer") else stream.read()
      name = "<stdin>"
    else:
      try:
        with open(path, "rb") as f:
          raw = f.read()
      except OSError as e:
        self._err(f"hxmlir-opt: error: could not open input file '{path}': {e.strerror}")
        return path, None
      name = path
    if isinstance(raw, str):
      return name, raw
    if irutil.is_bytecode(raw):
      return name, raw
    try:
      return name, raw.decode("utf-8")
    except UnicodeDecodeError as e:
      self._err(f"{name}:0:0: error: input is neither UTF-8 MLIR text nor MLIR bytecode "
                f"({e.reason} at byte {e.start})")
      return name, None

  def _write(self, args, outputs: list) -> bool:
    """Writes the outputs; ``False`` (after the error) when the output file cannot be opened."""
    data = (outputs[0] if outputs else b"") if args.emit_bytecode else "// -----\n".join(outputs)
    if args.output == "-":
      out = self.stdout
      if args.emit_bytecode and hasattr(out, "buffer"):
        out = out.buffer
      out.write(data)
      out.flush()
      return True
    try:
      with open(args.output, "wb" if args.emit_bytecode else "w") as f:
        f.write(data)
    except OSError as e:
      self._err(f"hxmlir-opt: error: could not open output file '{args.output}': "
                f"{e.strerror or e}")
      return False
    return True

  # --- one chunk --------------------------------------------------------------

  def _process(self, ctx, args, pipeline, source_name, text, offset):
    """Parses, runs and prints one chunk; returns (output or None, ok)."""
    diags: list[Diagnostic] = []
    out = None
    start = time.perf_counter()
    src = text if isinstance(text, bytes) else "\n" * offset + text
    try:
      module = irutil.parse_module(src, ctx, source_name)
    except irutil.ir.MLIRError as e:
      diags += [Diagnostic.from_mlir(d) for d in e.error_diagnostics]
      if isinstance(text, bytes):  # MLIR's bytecode reader says "-:0:0"; name the file
        diags = [_relocate(d, source_name) for d in diags]
      module = None
    self.timings.append(("(parse)", time.perf_counter() - start))
    if module is not None:
      def after(name, op, seconds):
        self.timings.append((name, seconds))
        if args.print_ir_after_all:
          self._err(f"// -----// IR Dump After {name} //----- //\n"
                    f"{op.get_asm(enable_debug_info=args.mlir_print_debuginfo)}")
      try:
        result = pipeline.run(module, after_pass=after)
        diags += result.diagnostics
        start = time.perf_counter()
        if args.emit_bytecode:
          buf = io.BytesIO()
          module.write_bytecode(buf)
          out = buf.getvalue()
        else:
          out = module.get_asm(enable_debug_info=args.mlir_print_debuginfo)
        self.timings.append(("(output)", time.perf_counter() - start))
      except PassError as e:
        diags += e.diagnostics
        if not args.verify_diagnostics:
          self._err(f"{e.pass_name}: {e.summary}")
    if args.verify_diagnostics:
      return out, self._verify(source_name, text, offset, diags)
    for d in diags:
      self._err(str(d))
    return out, not any(d.severity is Severity.ERROR for d in diags)

  def _verify(self, source_name: str, text: str, offset: int, diags: list[Diagnostic]) -> bool:
    try:
      expected = _expectations(source_name, text, offset)
    except _BadAnnotation as e:
      self._err(str(e))
      return False
    flat = []
    for d in diags:
      flat.append(d)
      flat += d.notes
    ok = True
    for d in flat:
      line = _line_of(d.location, source_name)
      match = next((e for e in expected if not e.seen and e.severity == d.severity.value
                    and e.line == line and e.matches(d.message)), None)
      if match is None:
        ok = False
        self._err(f"{d.location}: error: unexpected {d.severity.value}: {d.message}")
      else:
        match.seen = True
    for e in expected:
      if not e.seen:
        ok = False
        kind = f"{e.severity} matching" if e.pattern is not None else e.severity
        self._err(f'{e.where}: error: expected {kind} "{e.text}" was not produced')
    return ok

  # --- informational ---------------------------------------------------------

  def _version(self) -> int:
    import jax
    import jaxlib

    import hxmlir
    self.stdout.write(f"hxmlir-opt (hxmlir {hxmlir.__version__}), jax {jax.__version__}, "
                      f"jaxlib {jaxlib.__version__}\n")
    return 0

  def _list_passes(self) -> int:
    lines = ["hxmlir passes:"]
    for name, getter in sorted(PASS_REGISTRY.items()):
      cls = getter()
      lines.append(f"  {name:<18} {cls.summary}")
      for key, f in cls.options().items():
        lines.append(f"      {key}={option_help(f)}")
    lines.append("MLIR passes (jaxlib, run by the MLIR pass manager; any registered pass works):")
    lines += [f"  {n}" for n in NATIVE_PASSES]
    self.stdout.write("\n".join(lines) + "\n")
    return 0

  def _report_timing(self) -> None:
    total = sum(t for _, t in self.timings) or 1e-12
    merged: dict[str, float] = {}
    for name, t in self.timings:
      merged[name] = merged.get(name, 0.0) + t
    bar = "===" + "-" * 73 + "==="
    lines = [bar, "  ... Execution time report ...".center(79), bar,
             f"  Total Execution Time: {total:.4f} seconds", "",
             "  ----Wall Time----  ----Name----"]
    for name, t in merged.items():
      lines.append(f"  {t:8.4f} ({100 * t / total:5.1f}%)  {name}")
    lines.append(f"  {total:8.4f} (100.0%)  Total")
    self._err("\n".join(lines))


# --- bytecode ------------------------------------------------------------------

def _varint(data: bytes, pos: int) -> tuple[int, int]:
  """MLIR's prefix varint at ``pos``: (value, next position); raises IndexError if cut short."""
  first = data[pos]
  if first & 1:
    return first >> 1, pos + 1
  if first == 0:
    if pos + 9 > len(data):
      raise IndexError(pos)
    return int.from_bytes(data[pos + 1:pos + 9], "little"), pos + 9
  n = (first & -first).bit_length()  # total bytes: trailing zeros + 1
  if pos + n > len(data):
    raise IndexError(pos)
  return int.from_bytes(data[pos:pos + n], "little") >> n, pos + n


def check_bytecode(data: bytes) -> str | None:
  """Why ``data`` is not readable MLIR bytecode, or ``None`` if its header and strings are sound.

  Checks what MLIR's reader would echo back as text in its diagnostics (which
  the Python bindings cannot convert, and then abort the process, when it is not
  UTF-8): the ``ML\xefR`` magic, the version varint, the NUL-terminated
  producer string, and the strings of the string section. Other structural
  problems are left to MLIR's reader, which reports them as errors.
  """
  if data[:4] != b"ML\xefR":
    return "not MLIR bytecode (the file does not start with the 'ML\\xefR' magic)"
  try:
    version, pos = _varint(data, 4)
  except IndexError:
    return "corrupted MLIR bytecode: the file ends inside the version number"
  end = data.find(b"\0", pos)
  if end < 0:
    return "corrupted MLIR bytecode: the producer string is not NUL-terminated"
  try:
    data[pos:end].decode("utf-8")
  except UnicodeDecodeError as e:
    return (f"corrupted MLIR bytecode: the producer string is not valid UTF-8 "
            f"(byte {pos + e.start} of the file)")
  pos = end + 1
  try:
    while pos < len(data):
      section, pos = data[pos], pos + 1
      length, pos = _varint(data, pos)
      if section & 0x80:  # aligned: alignment varint, then 0xCB padding
        align, pos = _varint(data, pos)
        while align > 1 and pos % align and pos < len(data) and data[pos] == 0xCB:
          pos += 1
      body = data[pos:pos + length]
      if len(body) < length:
        return None  # cut short: MLIR's reader says so
      if section & 0x7F == 0:  # the string section: count, sizes, then the strings
        count, p = _varint(body, 0)
        sizes = 0
        for _ in range(count):
          size, p = _varint(body, p)
          sizes += size
        try:
          body[len(body) - sizes:].decode("utf-8")
        except UnicodeDecodeError as e:
          return (f"corrupted MLIR bytecode: the string section holds text that is not valid "
                  f"UTF-8 (byte {pos + len(body) - sizes + e.start} of the file)")
      pos += length
  except IndexError:
    return None  # a malformed section: MLIR's reader reports it
  del version
  return None


BYTECODE_CHECK_TIMEOUT_S = 60.0
"""How long the child process may take to parse bytecode (a corrupted file can make MLIR's
reader loop) before the input is reported as unreadable."""

_CHILD_PARSE = """
import sys
from hxmlir.passes import irutil
ctx = irutil.make_context(sys.argv[1] == "1")
try:
  irutil.parse_module(sys.stdin.buffer.read(), ctx)
except irutil.ir.MLIRError:
  pass
"""


def _parse_bytecode_in_child(data: bytes, allow_unregistered: bool) -> str | None:
  """Parses ``data`` in a child process first; why it crashed there, or ``None``.

  MLIR's bytecode reader may echo raw bytes of a corrupted file in a
  diagnostic, and the Python bindings then abort the whole process (no
  exception reaches Python), and may loop forever on others, so no in-process
  check can be complete.
  """
  try:
    child = subprocess.run([sys.executable, "-c", _CHILD_PARSE, "1" if allow_unregistered else "0"],
                           input=data, capture_output=True, timeout=BYTECODE_CHECK_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    return (f"corrupted MLIR bytecode: MLIR's bytecode reader did not finish within "
            f"{BYTECODE_CHECK_TIMEOUT_S:g} s (set hxmlir.opt.BYTECODE_CHECK_TIMEOUT_S for "
            f"larger files)")
  except OSError as e:
    return f"could not check the MLIR bytecode in a child process: {e}"
  if child.returncode == 0:
    return None
  why = child.stderr.decode("utf-8", "replace").strip().splitlines()
  reason = why[-1] if why else f"exit status {child.returncode}"
  if child.returncode < 0:
    reason = f"signal {-child.returncode}; {reason}"
  return f"corrupted MLIR bytecode: MLIR's bytecode reader crashed on it ({reason})"


def _relocate(d: Diagnostic, source_name: str) -> Diagnostic:
  """``d`` (and its notes) with MLIR's ``-:0:0`` bytecode location replaced by the file name."""
  loc = d.location
  if loc.startswith("-:") or loc == "<unknown>":
    loc = f"{source_name}:0:0"
  return Diagnostic(d.severity, loc, d.message, tuple(_relocate(n, source_name) for n in d.notes))


def _split(text: str) -> list[tuple[str, int]]:
  """Chunks separated by ``// -----`` lines, each with the number of lines before it."""
  chunks, start, line = [], 0, 0
  for m in SPLIT_MARKER.finditer(text):
    chunks.append((text[start:m.start()], line))
    line += text.count("\n", start, m.end()) + 1
    start = m.end() + 1
  chunks.append((text[start:], line))
  return chunks


class _BadAnnotation(Exception):
  """An ``expected-*`` annotation that cannot be understood (unknown kind, bad regex)."""


def _regex_of(message: str) -> re.Pattern:
  """MLIR's ``expected-*-re`` message: literal text in which ``{{regex}}`` parts are regexes."""
  parts, pos = [], 0
  for m in _REGEX_PART.finditer(message):
    parts += [re.escape(message[pos:m.start()]), f"(?:{m.group(1)})"]
    pos = m.end()
  parts.append(re.escape(message[pos:]))
  return re.compile("".join(parts))


def _expectations(source_name: str, text: str, offset: int) -> list[_Expected]:
  """The ``expected-*`` annotations of one chunk; raises :class:`_BadAnnotation`."""
  out = []
  lines = text.split("\n")
  annotated = {i for i, ln in enumerate(lines) if _EXPECTED.search(ln)}
  for i, ln in enumerate(lines):
    known = {m.start() for m in _EXPECTED.finditer(ln)}
    for m in _ANY_EXPECTED.finditer(ln):
      if m.start() not in known and "//" in ln[:m.start()]:
        raise _BadAnnotation(
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
          raise _BadAnnotation(f"{where}: error: invalid regex in expected-{sev}-re "
                               f"{{{{{msg}}}}}: {e}") from None
      if at is None:
        target = i
      elif at == "unknown":
        target = None
      elif at == "above":
        target = i - 1
        while target in annotated:
          target -= 1
      elif at == "below":
        target = i + 1
        while target in annotated:
          target += 1
      else:
        target = i + int(at)
      line_no = None if target is None else target + 1 + offset
      out.append(_Expected(sev, line_no, msg, where, pattern))
  return out


def _line_of(location: str, source_name: str) -> int | None:
  if not location.startswith(source_name + ":"):
    return None
  try:
    return int(location[len(source_name) + 1:].split(":")[0])
  except ValueError:
    return None


def main(argv: list[str] | None = None) -> int:
  """Console entry point of ``hxmlir-opt``; exits with the driver's status."""
  sys.exit(HxmlirOpt(argv).run())


if __name__ == "__main__":
  main()
