"""hxmlir.huge_pages: which pages a set of buffers covers, and moving real XLA buffers into
huge pages with their values unchanged (checked against /proc/self/smaps, the kernel's own
account, where the system can)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hxmlir import huge_pages
from hxmlir.types.qarray import QArray

P = 1 << 21


@pytest.mark.parametrize("buffers, want", [
    ([], []),
    ([(P + 10, 100)], [(P, 2 * P)]),                          # inside one page
    ([(P - 1, 2)], [(0, 2 * P)]),                              # across a boundary
    ([(5 * P, P), (3 * P, 10)], [(3 * P, 4 * P), (5 * P, 6 * P)]),  # sorted, apart
    ([(P, 10), (P + 100, 10), (2 * P + 5, P)], [(P, 4 * P)]),  # one page shared: one run
    ([(P, P), (2 * P, P)], [(P, 3 * P)]),                      # touching
])
def test_ranges_are_the_pages_that_hold_the_buffers(buffers, want):
  assert huge_pages._ranges(buffers, P) == want


def test_buffers_walks_hx_values_and_skips_other_leaves():
  q = QArray(jnp.zeros((4, 64), jnp.int8), jnp.ones((4, 2), jnp.float16))
  a = jnp.arange(10, dtype=jnp.float32)
  got = huge_pages._buffers({"q": q, "a": [a], "n": np.zeros(3), "i": 3, "none": None})
  want = sorted((c.unsafe_buffer_pointer(), c.nbytes) for c in (*q.components, a))
  assert sorted(got) == want


def _anon_huge_kib(lo: int, hi: int) -> int:
  """AnonHugePages (KiB) of this process's mappings that overlap ``[lo, hi)`` (a buffer may
  span several: the heap's end and what grew after it)."""
  total, inside = 0, False
  with open("/proc/self/smaps") as f:
    for line in f:
      head = line.split()[0]
      if "-" in head and not head.endswith(":"):
        a, b = (int(x, 16) for x in head.split("-"))
        inside = a < hi and lo < b
      elif inside and head == "AnonHugePages:":
        total += int(line.split()[1])
  return total


def test_collapse_keeps_values_and_the_kernel_counts_the_pages():
  if not huge_pages.page_bytes():
    pytest.skip("no transparent huge pages on this system")
  x = np.random.default_rng(0).standard_normal((3 << 20) // 4 * 3, dtype=np.float32)
  a = jax.device_put(x)  # 9 MiB: at least 3 whole 2 MiB pages inside
  ptr = a.unsafe_buffer_pointer()
  done = huge_pages.collapse({"w": a, "other": "not an array"})
  if done == 0:
    pytest.skip("this kernel collapses no pages (before Linux 6.1, or THP 'never')")
  page = huge_pages.page_bytes()
  inside = (ptr + a.nbytes) // page - -(-ptr // page)
  assert done >= inside * page and done % page == 0
  assert _anon_huge_kib(ptr, ptr + a.nbytes) * 1024 >= inside * page
  np.testing.assert_array_equal(np.asarray(a), x)
  assert a.unsafe_buffer_pointer() == ptr
