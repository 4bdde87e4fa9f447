"""``hxmlir-opt``: run hxmlir and MLIR passes on MLIR files (the tool lit drives).

In the spirit of ``mlir-opt`` and ``xdsl-opt``::

  hxmlir-opt [input|-] [-o out] [-p PIPELINE] [--split-input-file]
             [--verify-diagnostics] [--mlir-print-debuginfo] [--mlir-print-op-generic]
             [--emit-bytecode] [--print-ir-after-all] [--timing]
             [--allow-unregistered-dialect] [--list-passes] [--version]

``mlir-opt``'s single-dash spellings of the long flags (``-split-input-file``,
``-pass-pipeline=...``) are accepted too; ``-p`` and ``-o`` may be given once.

Input is MLIR text or bytecode (file or stdin); output is text (or bytecode
with ``--emit-bytecode``) on stdout or ``-o``; with ``--split-input-file`` each
chunk is processed and printed on its own, and a chunk that fails (even with an
internal error) does not drop the others' output. Errors — malformed input,
unknown passes or options, bad flags, failing passes — are printed on stderr
as ``file:line:col: error: message`` and the exit status is 1; never a Python
traceback, never a signal: every input is parsed first in a child process
(:func:`hxmlir.passes.parsing.parse_crash`), since jaxlib's parser can crash on
some inputs, and bytecode is checked before that
(:func:`hxmlir.passes.parsing.check_bytecode`). VHLO input (the module inside a
``jax.export`` artifact) is upgraded to StableHLO before the passes run, so the
output is StableHLO. ``--verify-diagnostics`` checks the diagnostics against
MLIR's ``// expected-error @+1 {{...}}`` annotations instead of printing them
(:mod:`hxmlir.tools.expectations`).

This module is the driver only: arguments, reading and writing, chunks, timing.
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
import sys
import time
from typing import IO

from jaxlib.mlir import ir

from hxmlir.passes import PASS_REGISTRY, PassError, PipelineError, parse_pipeline, parsing
from hxmlir.passes.base import Diagnostic, Severity
from hxmlir.passes.pipeline import NATIVE_PASSES, option_help
from hxmlir.tools.expectations import verify_diagnostics

SPLIT_MARKER = re.compile(r"^// -----.*$", re.MULTILINE)


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
  p.add_argument("--mlir-print-op-generic", action="store_true",
                 help="print operations in MLIR's generic form (always re-parses)")
  p.add_argument("--emit-bytecode", action="store_true", help="write MLIR bytecode")
  p.add_argument("--print-ir-after-all", action="store_true",
                 help="print the IR on stderr after each pass")
  p.add_argument("--timing", action="store_true", help="print pass timings on stderr")
  p.add_argument("--allow-unregistered-dialect", action="store_true",
                 help="accept ops of dialects that are not registered")
  p.add_argument("--list-passes", action="store_true", help="list the available passes")
  p.add_argument("--version", action="store_true", help="print versions and exit")
  return p


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
    ctx = parsing.make_context(args.allow_unregistered_dialect)
    chunks = self._chunks(args, ctx, source_name, data)
    if chunks is None:
      return 1
    outputs: list[str | bytes] = []
    status = 0
    for text, offset, crash in chunks:
      try:
        out, ok = self._process(ctx, args, pipeline, source_name, text, offset, crash)
      except Exception as e:  # a bug: report it for this chunk, go on with the others
        if os.environ.get("HXMLIR_OPT_TRACEBACK"):
          raise
        where = f" (in the chunk at {source_name}:{offset + 1})" if len(chunks) > 1 else ""
        self._err(f"hxmlir-opt: internal error{where}: {type(e).__name__}: {e}")
        out, ok = None, False
      status |= 0 if ok else 1
      if out is not None:
        outputs.append(out)
    if not self._write(args, outputs):
      return 1
    if args.timing:
      self._report_timing()
    return status

  def _chunks(self, args, ctx, source_name: str, data: str | bytes) -> list[tuple] | None:
    """``(text or bytecode, lines before it, why it crashed the parser or None)`` per
    chunk; ``None`` after reporting an input or flag combination that cannot be run.

    Bytecode is checked (:func:`parsing.check_bytecode`), text split; every
    chunk is parsed in a child process first, since jaxlib's parser can crash.
    """
    if isinstance(data, bytes):  # bytecode
      problem = parsing.check_bytecode(data)
      if problem is None and (crash := parsing.parse_crash(data, ctx, source_name)):
        problem = f"corrupted MLIR bytecode: {crash}"
      if problem:
        self._err(f"{source_name}:0:0: error: {problem}")
        return None
      if args.split_input_file or args.verify_diagnostics:
        self._err(f"{source_name}:0:0: error: --split-input-file and --verify-diagnostics "
                  "need MLIR text input, got bytecode")
        return None
      return [(data, 0, None)]
    chunks = _split(data) if args.split_input_file else [(data, 0)]
    if args.emit_bytecode and len(chunks) > 1:
      self._err("hxmlir-opt: error: --emit-bytecode writes one module; "
                "do not combine it with --split-input-file")
      return None
    crashes = parsing.parse_crashes(["\n" * off + t for t, off in chunks], ctx, source_name)
    return [(t, off, crash) for (t, off), crash in zip(chunks, crashes)]

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
    if parsing.is_bytecode(raw):
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

  def _process(self, ctx, args, pipeline, source_name, text, offset, crash):
    """Parses, runs and prints one chunk; returns (output or None, ok)."""
    diags: list[Diagnostic] = []
    out = None
    start = time.perf_counter()
    module = self._parse(ctx, source_name, text, offset, crash, diags)
    self.timings.append(("(parse)", time.perf_counter() - start))
    if module is not None:
      def after(name, op, seconds):
        self.timings.append((name, seconds))
        if args.print_ir_after_all:
          self._err(f"// -----// IR Dump After {name} //----- //\n{self._asm(args, op)}")
      try:
        result = pipeline.run(module, after_pass=after)
        diags += result.diagnostics
        start = time.perf_counter()
        if args.emit_bytecode:
          buf = io.BytesIO()
          module.write_bytecode(buf)
          out = buf.getvalue()
        else:
          out = self._asm(args, module)
        self.timings.append(("(output)", time.perf_counter() - start))
      except PassError as e:
        diags += e.diagnostics
        if not args.verify_diagnostics:
          self._err(f"{e.pass_name}: {e.summary}")
    if args.verify_diagnostics:
      problems = verify_diagnostics(source_name, text, offset, diags)
      for line in problems:
        self._err(line)
      return out, not problems
    for d in diags:
      self._err(str(d))
    return out, not any(d.severity is Severity.ERROR for d in diags)

  @staticmethod
  def _asm(args, op) -> str:
    return op.get_asm(enable_debug_info=args.mlir_print_debuginfo,
                      print_generic_op_form=args.mlir_print_op_generic)

  def _parse(self, ctx, source_name: str, text: str | bytes, offset: int, crash: str | None,
             diags: list[Diagnostic]) -> ir.Operation | None:
    """One chunk as a StableHLO module, or ``None`` after adding why not to ``diags``.

    ``crash``: why the chunk crashed jaxlib's parser in a child process
    (:func:`parsing.parse_crashes`), or ``None``; it is then parsed here. VHLO
    (what ``jax.export`` serializes) is upgraded to StableHLO, so passes see it.
    """
    start = f"{source_name}:{offset + _first_code_line(text)}:1"
    if crash:
      diags.append(Diagnostic(Severity.ERROR, start, f"cannot parse this input: {crash}"))
      return None
    src = text if isinstance(text, bytes) else "\n" * offset + text
    try:
      module = parsing.parse_module(src, ctx, source_name)
    except ir.MLIRError as e:
      found = [Diagnostic.from_mlir(d) for d in e.error_diagnostics]
      if isinstance(text, bytes):  # MLIR's bytecode reader says "-:0:0"; name the file
        found = [_relocate(d, source_name) for d in found]
      diags += found
      return None
    if parsing.has_vhlo(module):
      try:
        module = parsing.upgrade_vhlo(module, ctx)
      except ValueError as e:
        diags.append(Diagnostic(Severity.ERROR, start, str(e)))
        return None
    return module

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


def _split(text: str) -> list[tuple[str, int]]:
  """Chunks separated by ``// -----`` lines, each with the number of lines before it."""
  chunks, start, line = [], 0, 0
  for m in SPLIT_MARKER.finditer(text):
    chunks.append((text[start:m.start()], line))
    line += text.count("\n", start, m.end()) + 1
    start = m.end() + 1
  chunks.append((text[start:], line))
  return chunks


def _first_code_line(text: str | bytes) -> int:
  """The 1-based line of ``text``'s first line that is neither blank nor a comment (1 if none)."""
  if isinstance(text, str):
    for i, line in enumerate(text.split("\n")):
      if line.strip() and not line.lstrip().startswith("//"):
        return i + 1
  return 1


def _relocate(d: Diagnostic, source_name: str) -> Diagnostic:
  """``d`` (and its notes) with MLIR's ``-:0:0`` bytecode location replaced by the file name."""
  loc = d.location
  if loc.startswith("-:") or loc == "<unknown>":
    loc = f"{source_name}:0:0"
  return Diagnostic(d.severity, loc, d.message, tuple(_relocate(n, source_name) for n in d.notes))


def main(argv: list[str] | None = None) -> int:
  """Console entry point of ``hxmlir-opt``; exits with the driver's status."""
  sys.exit(HxmlirOpt(argv).run())


if __name__ == "__main__":
  main()
