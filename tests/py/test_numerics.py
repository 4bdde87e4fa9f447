"""The bound-based tolerances of ``numerics.py`` hold for every summation order and still
catch a lost term (the class of failure: a correct reordered f32 sum that lands on
``0.0`` where another order gives ``-9.5e-07``)."""

from __future__ import annotations

import numpy as np
import pytest
from numerics import assert_matmul_close, assert_sum_close, assert_within, dot_bound


def _f32_sum(terms, order):
  acc = np.float32(0)
  for t in terms[order]:
    acc = np.float32(acc + t)
  return acc


def test_every_summation_order_is_within_the_bound_even_near_cancellation():
  rng = np.random.default_rng(0)
  for _ in range(50):
    t = rng.standard_normal(64).astype(np.float32)
    t = np.append(t, -np.float32(t.astype(np.float64).sum()))  # exact sum near 0
    for order in (np.arange(t.size), np.arange(t.size)[::-1], rng.permutation(t.size)):
      assert_sum_close(_f32_sum(t, order), t)


def test_a_lost_term_fails_the_bound():
  t = np.random.default_rng(1).standard_normal(64).astype(np.float32)
  with pytest.raises(AssertionError, match="error .* > bound"):
    assert_sum_close(_f32_sum(t[:-1], np.arange(63)), t)


def test_matmul_blocked_any_way_is_within_the_bound_and_a_wrong_block_is_not():
  rng = np.random.default_rng(2)
  a = rng.standard_normal((5, 300)).astype(np.float32)
  b = rng.standard_normal((300, 7)).astype(np.float32)
  blocked = sum((a[:, i:i + 64] @ b[i:i + 64]).astype(np.float32) for i in range(0, 300, 64))
  assert_matmul_close(np.float32(blocked), a, b)
  assert_matmul_close(a @ b, a, b, "mk,kn->mn")
  wrong = blocked - a[:, :1] @ b[:1]  # a block that lost its first row
  with pytest.raises(AssertionError, match="error .* > bound"):
    assert_within(wrong, a.astype(np.float64) @ b, dot_bound("mk,kn->mn", a, b))
