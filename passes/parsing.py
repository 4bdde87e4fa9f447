"""Reading MLIR into the context JAX uses: text or bytecode, checked so that no input can
take the process down.

- :func:`make_context`: a context with every dialect JAX emits.
- :func:`parse_module`: text (with a source name, so locations read
  ``file:line:col``) or bytecode into a ``builtin.module`` op; several top-level ops
  are wrapped into one module as ``mlir-opt`` does, type and attribute aliases
  and a trailing ``{-# ... #-}`` resource block kept outside the wrapper.
- :func:`check_bytecode`: a structural check of MLIR bytecode's header and string
  section (the parts MLIR's reader echoes back in diagnostics).
- :func:`parse_crashes` / :func:`parse_crash`: parse the inputs in a child process
  first and say why one crashed there (a signal, or no answer within
  :data:`PARSE_GUARD_TIMEOUT_S`), so inputs that crash jaxlib's parser (an
  ``all_to_all`` with an empty ``replica_groups`` divides by zero; unregistered
  types in a bounded tensor dereference null; corrupted bytecode makes the
  bindings abort) become a diagnostic. The child is a fork of this process while
  JAX's runtime has not started (``hxmlir-opt``: 10-50 ms per file, measured,
  against about a second for a fresh interpreter that imports jaxlib), else a
  long-lived parse server (one interpreter per process).
- :func:`upgrade_vhlo`: a module in VHLO (the versioned form inside every
  ``jax.export`` artifact) as StableHLO, through StableHLO's own deserializer.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import io
import os
import re
import select
import signal
import struct
import subprocess
import sys

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hxmlir import _jax

BYTECODE_MAGIC = b"ML\xefR"

PARSE_GUARD_TIMEOUT_S = 60.0
"""How long the guarding child may take to parse an input (a corrupted bytecode file can
make MLIR's reader loop) before the input is reported as unreadable."""


def make_context(allow_unregistered: bool = False) -> ir.Context:
  """A new MLIR context with every dialect JAX emits (StableHLO, CHLO, MHLO, sdy, func)."""
  ctx = _jax.make_ir_context()
  ctx.allow_unregistered_dialects = allow_unregistered
  return ctx


def is_bytecode(data: bytes) -> bool:
  """Whether ``data`` is MLIR bytecode (starts with the ``ML\\xefR`` magic)."""
  return data[:4] == BYTECODE_MAGIC


# --- text ----------------------------------------------------------------------------------

# A top-level alias definition (``!t = ...``, ``#map = ...``) at the start of a line.
_ALIAS = re.compile(r"^[ \t]*[!#][\w.$-]+[ \t]*=")
_RESOURCES = "{-#"


def _top_level_lines(source: str) -> list[tuple[int, bool]]:
  """For each line: (its start offset, whether it starts at brace depth 0)."""
  out, depth, pos = [], 0, 0
  for line in source.split("\n"):
    out.append((pos, depth == 0))
    code = line.split("//", 1)[0]
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', code)
    depth += code.count("{") - code.count("}")
    pos += len(line) + 1
  return out


def _wrapped(source: str) -> str:
  """``source`` inside ``module { ... }`` with the same line numbers: top-level alias
  definitions move to line 1 (before the wrapper), a trailing resource block stays after it."""
  lines = source.split("\n")
  aliases = []
  for i, (_, top) in enumerate(_top_level_lines(source)):
    if top and _ALIAS.match(lines[i]):
      aliases.append(lines[i].strip())
      lines[i] = ""
  body = "\n".join(lines)
  tail = ""
  cut = body.rfind(_RESOURCES)
  if cut >= 0 and body[:cut].count("{") == body[:cut].count("}"):
    body, tail = body[:cut], body[cut:]
  return " ".join(aliases + ["module {"]) + body + "\n}" + tail


def parse_module(source: str | bytes, ctx: ir.Context, source_name: str = "<stdin>"
                 ) -> ir.Operation:
  """Parses MLIR text or bytecode into a ``builtin.module`` op.

  Text is parsed with ``source_name`` so op locations read
  ``source_name:line:col``. Like ``mlir-opt``, top-level ops that are not one
  ``builtin.module`` are wrapped into one (the wrapper is written on line 1, so
  line numbers are kept; alias definitions stay outside it). Raises
  ``ir.MLIRError`` with the parser's diagnostics.
  """
  with ctx:
    if isinstance(source, bytes):
      return ir.Module.parse(source).operation
    try:
      op = ir.Operation.parse(source, source_name=source_name)
    except ir.MLIRError as e:
      if "single top-level operation" not in str(e) and not _several_ops(e):
        raise
      return ir.Operation.parse(_wrapped(source), source_name=source_name).operation
    if op.operation.name == "builtin.module":
      return op.operation
    with ir.Location.unknown():
      module = ir.Module.create()
    module.body.append(op.operation)
    # keep the module alive through its operation
    return module.operation


def _several_ops(e: ir.MLIRError) -> bool:
  return any("top-level" in d.message or "single" in d.message for d in e.error_diagnostics)


# --- bytecode ------------------------------------------------------------------------------

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
  UTF-8): the ``ML\\xefR`` magic, the version varint, the NUL-terminated
  producer string, and the strings of the string section (format:
  ``mlir/docs/BytecodeFormat.md``). Other structural problems are left to MLIR's
  reader, which reports them as errors.
  """
  if not is_bytecode(data):
    return "not MLIR bytecode (the file does not start with the 'ML\\xefR' magic)"
  try:
    _, pos = _varint(data, 4)
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
  return None


# --- the crash guard -----------------------------------------------------------------------

def _parse_in_child(sources: list, ctx: ir.Context, source_name: str, done_fd: int) -> None:
  """The forked child: parse each source, one byte to ``done_fd`` after each, then leave
  without running any of the parent's exit code."""
  try:
    faulthandler.disable()  # a crash here is the answer, not a report
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    ctx.enable_multithreading(False)  # the parent's thread pool has no threads here
    for source in sources:
      try:
        parse_module(source, ctx, source_name)
      except ir.MLIRError:
        pass
      os.write(done_fd, b".")
  except BaseException:  # a Python error is not a crash: the parent reports it itself
    pass
  os._exit(0)


def _signal_name(sig: int) -> str:
  try:
    return signal.Signals(sig).name
  except ValueError:
    return str(sig)


def _timeout_reason() -> str:
  return (f"MLIR's parser did not finish within {PARSE_GUARD_TIMEOUT_S:g} s (set "
          f"hxmlir.passes.parsing.PARSE_GUARD_TIMEOUT_S for larger inputs)")


def _fork_and_parse(sources: list, ctx: ir.Context, source_name: str) -> tuple[int, str | None]:
  """Parses ``sources`` in order in one forked child: (how many it finished, why it
  stopped before the next one or ``None``)."""
  sys.stdout.flush()
  sys.stderr.flush()
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:  # pragma: no cover (the child)
    os.close(r)
    _parse_in_child(sources, ctx, source_name, w)
  os.close(w)
  done, reason = 0, None
  try:
    while True:
      ready, _, _ = select.select([r], [], [], PARSE_GUARD_TIMEOUT_S)
      if not ready:
        os.kill(pid, signal.SIGKILL)
        reason = _timeout_reason()
        break
      got = os.read(r, 4096)
      if not got:
        break
      done += len(got)
  finally:
    os.close(r)
    _, status = os.waitpid(pid, 0)
  if reason is None and done < len(sources):
    if os.WIFSIGNALED(status):
      reason = f"MLIR's parser crashed on it (signal {_signal_name(os.WTERMSIG(status))})"
    else:
      reason = f"MLIR's parser crashed on it (exit status {os.WEXITSTATUS(status)})"
  return done, reason


def parse_crashes(sources: list[str | bytes], ctx: ir.Context, source_name: str = "<stdin>"
                  ) -> list[str | None]:
  """Parses each of ``sources`` in a child process, in a copy of ``ctx`` (a context from
  :func:`make_context`); for each, why it crashed there, or ``None``.

  ``None`` also when the child only found errors (the caller then parses in
  process and reports them). Otherwise a reason such as ``"MLIR's parser
  crashed on it (signal SIGFPE)"`` or ``"... did not finish within 60 s"``.
  While JAX's runtime has not started (``hxmlir-opt``), the child is a fork of
  this process: one for all the sources, and one more after each crash (a few
  milliseconds each). Once it has (threads that a fork would copy in an unknown
  state; JAX warns), the child is a long-lived parse server
  (:class:`_ParseServer`).
  """
  if _jax.runtime_started() or not hasattr(os, "fork"):
    return [_server.check(s, ctx.allow_unregistered_dialects, source_name) for s in sources]
  out: list[str | None] = [None] * len(sources)
  start = 0
  while start < len(sources):
    done, reason = _fork_and_parse(sources[start:], ctx, source_name)
    if reason is None:
      break
    out[start + done] = reason
    start += done + 1
  return out


def parse_crash(source: str | bytes, ctx: ir.Context, source_name: str = "<stdin>"
                ) -> str | None:
  """:func:`parse_crashes` of one source."""
  return parse_crashes([source], ctx, source_name)[0]


_SERVER = """
import struct, sys
from hxmlir.passes import parsing
contexts = {}
inp, out = sys.stdin.buffer, sys.stdout.buffer
while True:
  head = inp.read(9)
  if len(head) < 9:
    break
  flags, n_name, n_data = struct.unpack("<BII", head)
  name = inp.read(n_name).decode("utf-8")
  data = inp.read(n_data)
  allow = bool(flags & 1)
  ctx = contexts.get(allow) or contexts.setdefault(allow, parsing.make_context(allow))
  try:
    parsing.parse_module(data if flags & 2 else data.decode("utf-8"), ctx, name)
  except Exception:
    pass
  out.write(b"k")
  out.flush()
"""


class _ParseServer:
  """A Python interpreter, started once per process, that parses inputs sent to it and
  answers one byte each; it is restarted after a crash. For processes where forking is
  unsafe (JAX's runtime threads are running): one start (about a second: it imports
  jaxlib), then a few milliseconds per input."""

  def __init__(self):
    self.proc: subprocess.Popen | None = None

  def check(self, source: str | bytes, allow_unregistered: bool, source_name: str
            ) -> str | None:
    data = source if isinstance(source, bytes) else source.encode("utf-8")
    name = source_name.encode("utf-8")
    flags = (1 if allow_unregistered else 0) | (2 if isinstance(source, bytes) else 0)
    if self.proc is None or self.proc.poll() is not None:
      self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc = self.proc
    try:
      proc.stdin.write(struct.pack("<BII", flags, len(name), len(data)) + name + data)
      proc.stdin.flush()
    except OSError:
      pass  # it died; the answer below says how
    ready, _, _ = select.select([proc.stdout], [], [], PARSE_GUARD_TIMEOUT_S)
    answer = os.read(proc.stdout.fileno(), 1) if ready else b""
    if answer == b"k":
      return None
    self.close()
    code = proc.returncode
    if not ready:
      return _timeout_reason()
    if code is not None and code < 0:
      return f"MLIR's parser crashed on it (signal {_signal_name(-code)})"
    return f"MLIR's parser crashed on it (exit status {code})"

  def close(self) -> None:
    proc, self.proc = self.proc, None
    if proc is not None:
      if proc.poll() is None:
        proc.kill()
      proc.wait()
      for f in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
          f.close()


_server = _ParseServer()
atexit.register(_server.close)


# --- VHLO ----------------------------------------------------------------------------------

def has_vhlo(module: ir.Operation) -> bool:
  """Whether the top level of ``module`` holds VHLO ops (``vhlo.func_v1``, ...)."""
  return any(op.operation.name.startswith("vhlo.")
             for op in module.regions[0].blocks[0].operations)


def upgrade_vhlo(module: ir.Operation, ctx: ir.Context) -> ir.Operation:
  """``module`` (VHLO, the portable form ``jax.export`` serializes) as StableHLO.

  Serializes it as a StableHLO portable artifact at its own version and reads it
  back with StableHLO's deserializer (``stablehlo.deserialize_portable_artifact``,
  the reader ``jax.export`` itself uses), which upgrades every op to the current
  StableHLO. Raises ``ir.MLIRError``-free ``ValueError`` naming the problem when
  the module cannot be read that way.
  """
  buf = io.BytesIO()
  module.write_bytecode(buf)
  try:
    with ctx:
      return stablehlo.deserialize_portable_artifact(ctx, buf.getvalue()).operation
  except Exception as e:  # the bindings raise a plain error with MLIR's message
    raise ValueError(f"the VHLO module cannot be upgraded to StableHLO: {e}") from None
