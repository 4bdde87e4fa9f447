"""Runs hxmlir-opt over a corpus of foreign MLIR files and prints figures.

Usage::

  python scripts/corpus_check.py CORPUS_DIR [--pipeline P] [--limit N]

CORPUS_DIR: e.g. StableHLO's ``stablehlo/tests`` at openxla/stablehlo 13714d385 (the
last commit before jax-v0.10.2; not part of this repository). Every ``*.mlir`` file
goes through ``hxmlir-opt --split-input-file`` twice: with no passes and with
``-p hx-verify,hx-decompose,hx-fold-scales`` (``--pipeline``); with
``--verify-diagnostics`` when it holds ``expected-*`` annotations and with
``--allow-unregistered-dialect`` when its RUN lines use it. Each run happens in a
forked child that drives :class:`hxmlir.tools.opt.HxmlirOpt` in process, so a signal
is seen as one. Printed: files, chunks, chunks whose diagnostics all matched
their annotations (annotated files), chunks with errors (other files: inputs
StableHLO's own tests expect to fail under a pass we do not run, or that our
parser rejects), internal errors, signals; then the files with an internal error
or a signal. Exit status 1 when there was any internal error or signal.
"""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import re
import sys
import time

from hxmlir.tools.opt import SPLIT_MARKER, HxmlirOpt

PIPELINE = "hx-verify,hx-decompose,hx-fold-scales"
_LOC_LINE = re.compile(r"^[^:\n]+:(\d+):\d+: error: ", re.MULTILINE)


def _run_in_child(args: list[str]) -> tuple[int | None, int | None, str]:
  """(exit status or None, signal or None, stderr) of ``HxmlirOpt(args)`` in a forked child."""
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:  # the child: run, send stderr back, leave without cleanup
    os.close(r)
    err = io.StringIO()
    status = 1
    try:
      status = HxmlirOpt(args, stdout=io.StringIO(), stderr=err).run()
    finally:
      with os.fdopen(w, "w", encoding="utf-8", errors="replace") as f:
        f.write(err.getvalue())
      os._exit(status)
  os.close(w)
  with os.fdopen(r, encoding="utf-8", errors="replace") as f:
    err = f.read()
  _, status = os.waitpid(pid, 0)
  if os.WIFSIGNALED(status):
    return None, os.WTERMSIG(status), err
  return os.WEXITSTATUS(status), None, err


def _chunk_starts(text: str) -> list[int]:
  """The 1-based first line of each ``// -----`` chunk."""
  starts, line = [1], 1
  for m in SPLIT_MARKER.finditer(text):
    line = text.count("\n", 0, m.end()) + 2
    starts.append(line)
  return starts


def _chunk_of(line: int, starts: list[int]) -> int:
  return max(i for i, s in enumerate(starts) if s <= line)


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("corpus", type=pathlib.Path)
  ap.add_argument("--pipeline", default=PIPELINE)
  ap.add_argument("--limit", type=int, default=0, help="only the first N files")
  a = ap.parse_args(argv)
  files = sorted(a.corpus.rglob("*.mlir"))[:a.limit or None]
  figures = {"files": len(files), "chunks": 0}
  bad: list[str] = []
  t0 = time.perf_counter()
  for mode, pipeline in (("no passes", ""), ("passes", a.pipeline)):
    ok = errs = internal = signals = annotated_chunks = 0
    for path in files:
      text = path.read_text(encoding="utf-8", errors="replace")
      starts = _chunk_starts(text)
      if mode == "no passes":
        figures["chunks"] += len(starts)
      run_lines = "\n".join(ln for ln in text.splitlines() if "RUN:" in ln)
      verify = "expected-" in text
      args = [str(path), "--split-input-file"]
      args += ["--verify-diagnostics"] if verify else []
      args += ["--allow-unregistered-dialect"] if "allow-unregistered-dialect" in run_lines else []
      args += ["-p", pipeline] if pipeline else []
      status, sig, err = _run_in_child(args)
      if sig is not None:
        signals += 1
        bad.append(f"{mode}: {path}: signal {sig}")
        continue
      n_internal = err.count("internal error")
      internal += n_internal
      if n_internal:
        first = next(ln for ln in err.splitlines() if "internal error" in ln)
        bad.append(f"{mode}: {path}: {first}")
      failing = {_chunk_of(int(m.group(1)), starts) for m in _LOC_LINE.finditer(err)}
      if verify:
        annotated_chunks += len(starts)
        ok += len(starts) - len(failing)
      else:
        errs += len(failing)
    print(f"[{mode}{' -p ' + pipeline if pipeline else ''}] annotated chunks: "
          f"{annotated_chunks}, diagnostics ok: {ok}; chunks with errors in other files: "
          f"{errs}; internal errors: {internal}; signals: {signals}")
  print(f"files: {figures['files']}, chunks: {figures['chunks']}, "
        f"{time.perf_counter() - t0:.0f} s")
  for line in bad:
    print("  " + line)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
