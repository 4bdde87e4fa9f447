"""The documentation's code runs: every ```python block of README.md and docs/*.md.

One fresh interpreter per page, its blocks in order in one namespace (a page reads as one
session), from an empty temporary directory, with the environment the user would have (the
test suite's ``XLA_FLAGS``/``JAX_PLATFORMS`` removed: a page that needs several devices sets
them itself, before importing JAX). Each block is compiled under the page's file name with
its own line numbers, so a failure's traceback points at the Markdown line. A block fenced
```python notest is not run (code that needs a GPU or TPU). Pages whose code loads the real
SmolLM2 or all-MiniLM-L6-v2 models are marked ``slow``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python(?P<notest>[ \t]+notest)?[ \t]*\n(?P<code>.*?)^```[ \t]*$",
                   re.MULTILINE | re.DOTALL)
HEAVY = re.compile(r"smollm2|minilm|Llama\.", re.IGNORECASE)
TIMEOUT_S = 600

# Runs in the fresh interpreter: argv[1] is the page, argv[2] a JSON list of (line, code).
DRIVER = """
import json, sys
page, blocks = sys.argv[1], json.loads(sys.argv[2])
ns = {"__name__": "__main__"}
for line, code in blocks:
  print(f"--- {page}:{line}", flush=True)
  exec(compile("\\n" * (line - 1) + code, page, "exec"), ns)
"""


def blocks_of(text: str) -> list[tuple[int, str]]:
  """``(first code line, code)`` of every ```python block of ``text`` that is to run."""
  return [(text.count("\n", 0, m.start("code")) + 1, m.group("code"))
          for m in FENCE.finditer(text) if not m.group("notest")]


def blocks(page: Path) -> list[tuple[int, str]]:
  """:func:`blocks_of` the page's text."""
  return blocks_of(page.read_text())


def _param(page: Path):
  code = "".join(c for _, c in blocks(page))
  marks = [pytest.mark.slow] if HEAVY.search(code) else []
  return pytest.param(page, id=str(page.relative_to(ROOT)), marks=marks)


def test_blocks_are_found():
  # the extractor sees the fences the pages use (a regex that matched nothing would
  # pass every page): README's worked example is at least two blocks, and a notest
  # block is skipped
  assert len(blocks(ROOT / "README.md")) >= 2
  text = "x\n```python\na = 1\n```\n\n```python notest\nb = 2\n```\n```python\nc = 3\n```\n"
  assert blocks_of(text) == [(3, "a = 1\n"), (10, "c = 3\n")]


@pytest.mark.parametrize("page", [_param(p) for p in PAGES if blocks(p)])
def test_page_runs(page: Path, tmp_path):
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "PYTHONPATH")}
  env["MPLBACKEND"] = "Agg"
  rel = str(page.relative_to(ROOT))
  proc = subprocess.run([sys.executable, "-c", DRIVER, str(page), json.dumps(blocks(page))],
                        cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=TIMEOUT_S)
  assert proc.returncode == 0, (
      f"{rel}: a python block failed (exit {proc.returncode}); the last '--- {rel}:LINE' "
      f"names the block\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
