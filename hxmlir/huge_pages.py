"""Weights in 2 MiB pages: the CPU buffers of arrays that a kernel streams, backed by huge pages.

A decode step reads every weight byte once, front to back. In 4 KiB pages that is a TLB
miss every 4 KiB and, worse, a stop of the hardware prefetchers at every page boundary:
on the 2-core Xeon VMs this project is measured on, a plain AVX-512 read of 600 MB runs
at 18.6 GB/s on two threads from 4 KiB pages and 24.8 GB/s from 2 MiB pages (NumPy puts
its own large arrays in huge pages, so its ``a.sum()`` sees the second figure). XLA's CPU
client allocates buffers with ``malloc``: 4 KiB pages unless the system's transparent huge
pages are ``always`` (the default is ``madvise``).

:func:`collapse` asks Linux to move buffers that already exist into huge pages
(``madvise(MADV_COLLAPSE)``, Linux 6.1 and newer; ``Documentation/admin-guide/mm/transhuge.rst``):
synchronous, the contents unchanged, the addresses unchanged, so every array and every
compiled executable that uses them is as it was. The decoders of :mod:`hxmlir.models`
call it on their weights when they are built; call it on your own after placing them.
"""
from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

MADV_COLLAPSE = 25  # include/uapi/asm-generic/mman-common.h
_PMD_SIZE_FILE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"


@functools.cache
def page_bytes() -> int:
  """Bytes of a transparent huge page (2 MiB on x86-64), or 0 where the system has none
  (not Linux, or transparent huge pages compiled out)."""
  if not sys.platform.startswith("linux"):
    return 0
  try:
    with open(_PMD_SIZE_FILE) as f:
      return int(f.read())
  except (OSError, ValueError):
    return 0


@functools.cache
def _madvise():
  libc = ctypes.CDLL(None, use_errno=True)
  fn = libc.madvise
  fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
  fn.restype = ctypes.c_int
  return fn


def _buffers(tree: Any) -> list[tuple[int, int]]:
  """``(address, bytes)`` of every CPU buffer of the arrays in ``tree`` (a pytree of
  ``jax.Array``, hx values with ``components`` such as ``QArray``, and anything else,
  which is skipped), each shard of a sharded array once, after the array is ready."""
  import jax
  out = []
  def visit(x):
    if isinstance(x, jax.Array):
      x.block_until_ready()  # written (a page no write has reached yet cannot collapse)
      for shard in x.addressable_shards:
        if shard.device.platform == "cpu" and shard.data.nbytes:
          out.append((shard.data.unsafe_buffer_pointer(), shard.data.nbytes))
    elif hasattr(x, "components"):
      for c in x.components:
        visit(c)
  for leaf in jax.tree.leaves(tree):
    visit(leaf)
  return out


def _ranges(buffers: list[tuple[int, int]], page: int) -> list[tuple[int, int]]:
  """The huge pages that hold any byte of ``buffers``: ``[start, end)`` byte ranges,
  sorted, disjoint, each a multiple of ``page``."""
  runs: list[tuple[int, int]] = []
  for a, n in sorted(buffers):
    lo, hi = a // page * page, -(-(a + n) // page) * page
    if runs and lo <= runs[-1][1]:
      runs[-1] = (runs[-1][0], max(runs[-1][1], hi))
    else:
      runs.append((lo, hi))
  return runs


def collapse(tree: Any) -> int:
  """Moves the CPU buffers of the arrays in ``tree`` into transparent huge pages.

  ``tree``: a pytree of ``jax.Array`` (any dtype and shape, sharded or not) and hx values
  (``QArray``: each component); other leaves, and buffers on other platforms, are skipped.
  Every huge page that holds a byte of a buffer is collapsed, one at a time, with
  ``madvise(MADV_COLLAPSE)``: most weights are smaller than a huge page, so the memory
  around a buffer in its pages moves too (its contents unchanged, memory the process had
  not touched there now resident: at most two pages per buffer). A page the kernel
  refuses (memory mapped from a file, say) stays as it is.
  Values, addresses and compiled executables are unchanged; a step that streams the
  buffers reads them at the huge-page bandwidth (module docstring).

  Returns the bytes now in huge pages (0 where the system cannot: not Linux, a kernel
  before 6.1, transparent huge pages ``never``, or no free huge page). Never raises for
  that: the pages are a speed-up, not part of any result.
  """
  page = page_bytes()
  if not page:
    return 0
  madvise, done = _madvise(), 0
  for lo, hi in _ranges(_buffers(tree), page):
    for a in range(lo, hi, page):  # a page at a time: a refused page does not hide the rest
      done += page if madvise(a, page, MADV_COLLAPSE) == 0 else 0
  return done
