"""``hx_matmul_q_cpu_v4``: the native CPU kernel of GGUF's block formats in ``[out, in]``.

Weights are random GGUF blocks (random bytes with finite f16 ``d``/``dmin``), split into
the format's components by :func:`hxmlir.gguf.block_parts`. References, computed another
way: ``gguf.quants.dequantize`` of the same bytes (gguf-py's NumPy decoder, independent of
hxmlir), and float64 NumPy products.

- Decode: with ``x`` the identity (``y[i, j] = w[j, i]``: one exact product and exact zeros
  per output) the kernel's weight equals gguf's bit for bit, every element of every block.
- Products: against float64 ``x @ w.T``. Every term ``x_i w_i`` is rounded once, then summed
  in ``W <= 16`` lanes (at most ``k / W`` adds each) and the lanes as a tree (4 adds), so the
  error is at most ``gamma_{k+5} * |x| @ |w|.T + k * tiny`` (Higham section 3.1), per ISA
  this CPU runs, at ``m`` in the "dot" regime (``m <= 8``) and in "blocks" (tiles), odd ``n``.
- One row of ``x`` (``m = 1``) sums ``x q`` per sub-block, times the sub-block's ``sc``, less
  ``sum_s mn_s X_s`` (``csrc/matmul_q_nk.h``): within ``gamma_{k+5}`` of ``|x|`` times
  ``|sc q| + |mn|``, the real ``|d u| + |dmin v|`` (:func:`hxmlir.block_decode.units`) up to
  ``gamma_2`` for ``sc``, ``mn`` and ``w``'s own rounding: ``gamma_{k+7} * |x| @ T.T``.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from hx_testing import block_call, custom_calls
from numerics import TINY, assert_within, gamma
from test_matmul_q_formats_native import _with_isa

import hxmlir as hx
from hxmlir import block_decode, formats
from hxmlir import gguf as hg
from hxmlir.lowering.matmul_q import cpu as native

gguf = pytest.importorskip("gguf", reason="pip install 'hxmlir[gguf]'")
INFO = hx.cpu_kernel_info()
needs_native = pytest.mark.skipif(not INFO.active, reason=f"native kernel inactive: {INFO}")
V4 = jax.jit(native.matmul_q_native_v4)
KINDS = [f.gguf for f in formats.BLOCK_FORMATS]


def _weight(kind: str, n: int, blocks: int, seed: int = 0):
  """``(components, w)``: ``n`` rows of ``blocks`` random GGUF blocks of ``kind`` as the
  format's components, and gguf-py's f32 dequantization ``w: f32[n, k]``."""
  rs = np.random.RandomState(seed)
  size = hg._BLOCK_BYTES[kind]
  d_at, m_at, _ = hg._HEADERS[kind]
  raw = rs.randint(0, 256, size=(n, blocks, size)).astype(np.uint8)
  for at in (d_at,) if m_at is None else (d_at, m_at):
    h = (rs.randn(n, blocks) * 0.02).astype(np.float16)
    raw[..., at:at + 2] = h[..., None].view(np.uint8)
  w = gguf.quants.dequantize(raw.reshape(n, -1), gguf.GGMLQuantizationType[kind])
  return hg.block_parts(raw, kind), np.asarray(w, np.float32)


def _exact_terms(parts, kind: str) -> tuple[np.ndarray, np.ndarray | None]:
  """``(d u, dmin v)``: ``f64[n, k]``, the weight's two exact real terms
  (:mod:`hxmlir.block_decode`; ``None`` for the second where the format has no offset)."""
  fmt = formats.FORMATS[kind.lower()]
  u, v = block_decode.units(parts[0], fmt.name)
  du = np.repeat(np.asarray(parts[1], np.float64), fmt.block, axis=-1) * np.asarray(u, np.float64)
  if v is None:
    return du, None
  return du, np.repeat(np.asarray(parts[2], np.float64), fmt.block, axis=-1) * np.asarray(
      v, np.float64)


def _exact_weight(parts, kind: str) -> tuple[np.ndarray, np.ndarray]:
  """``(w*, |w|*)``: ``f64[n, k]``, the weight's exact real value ``d u + dmin v`` and the
  magnitude ``|d u| + |dmin v|`` the bounds sum."""
  du, dv = _exact_terms(parts, kind)
  if dv is None:
    return du, np.abs(du)
  return du + dv, np.abs(du) + np.abs(dv)


def _bound(x: np.ndarray, w: np.ndarray, parts, kind: str) -> np.ndarray:
  """The module's bound on ``|y - x @ w.T|`` for ``x: f32[..., k]``: the row's (one row of
  ``x``) or the "dot" and "blocks" regimes' (more)."""
  k = x.shape[-1]
  x64 = np.abs(x.astype(np.float64))
  if x.reshape(-1, k).shape[0] == 1:
    return gamma(k + 7) * (x64 @ _exact_weight(parts, kind)[1].T) + k * TINY
  return gamma(k + 5) * (x64 @ np.abs(w.astype(np.float64)).T) + k * TINY


# blocks per row: 2, and 6 (the AVX-512 decoders of Q4_K's and Q5_K's factors take four
# blocks at a time: a whole four and two more)
@needs_native
@pytest.mark.parametrize("isa", INFO.supported_isas)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("blocks", [2, 6])
def test_decode_is_gguf_bit_for_bit(isa, kind, blocks):
  parts, w = _weight(kind, 5, blocks)
  x = np.eye(w.shape[1], dtype=np.float32)  # m = k: the tiled regime
  y = _with_isa(isa, V4, x, *parts)
  np.testing.assert_array_equal(y, w.T)
  # and the m = 1 GEMV, one column of w at a time (a few)
  for i in (0, 1, w.shape[1] // 2 + 3, w.shape[1] - 1):
    y1 = _with_isa(isa, V4, x[i:i + 1], *parts)
    np.testing.assert_array_equal(y1[0], w[:, i])


# (leading dims of x, rows of W, blocks per row): m = 1 (the decode step's GEMV), 3, 6, 8
# (the "dot" regime, rows of x in tiles of up to 8 or 4 by ISA), 10 and 17 (tiles); odd n
CASES = [((1,), 37, 3), ((3,), 37, 2), ((6,), 11, 2), ((8,), 5, 3), ((2, 5), 37, 3), ((17,), 9, 2)]


@needs_native
@pytest.mark.parametrize("isa", INFO.supported_isas)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lead,n,blocks", CASES)
def test_against_float64(isa, kind, lead, n, blocks):
  parts, w = _weight(kind, n, blocks, seed=n + blocks)
  k = w.shape[1]
  x = np.random.RandomState(k).randn(*lead, k).astype(np.float32)
  y = _with_isa(isa, V4, x, *parts)
  assert y.shape == (*lead, n) and y.dtype == np.float32
  x64, w64 = x.astype(np.float64), w.astype(np.float64)
  assert_within(y, x64 @ w64.T, _bound(x, w, parts, kind), f"{kind} {isa} {lead} n={n}: ")


@needs_native
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("kind,change", [("Q4_K", "block"), ("Q4_K", "offset"),
                                         ("Q5_0", "block"), ("Q5_1", "offset")])
def test_bound_catches_a_wrong_weight(m, kind, change):
  # one block off (the next block's weights), or without the offset term (a weight of only
  # d u), fails the bound above, in the row's path (m = 1) and the "dot" regime's (m = 2)
  b = hg._BLOCK_SIZES[kind]
  parts, w = _weight(kind, 9, 3 if b == 256 else 24, seed=3)
  x = np.random.RandomState(5).randn(m, w.shape[1]).astype(np.float32)
  y = np.asarray(V4(x, *parts)).astype(np.float64)
  exact, _ = _exact_weight(parts, kind)
  wrong = np.roll(w, b, axis=1) if change == "block" else _exact_terms(parts, kind)[0]
  assert np.abs(wrong - exact).max() > 0
  assert_within(y, x.astype(np.float64) @ w.astype(np.float64).T, _bound(x, w, parts, kind))
  with pytest.raises(AssertionError):
    assert_within(y, x.astype(np.float64) @ wrong.T, _bound(x, wrong, parts, kind))


@needs_native
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0"])
def test_einsum_installed_calls_v4(kind):
  parts, w = _weight(kind, 300, 2 if hg._BLOCK_SIZES[kind] == 256 else 16)
  x = np.random.RandomState(7).randn(1, w.shape[1]).astype(np.float32)
  f = jax.jit(lambda x, *p: hx.einsum("mk,nk->mn", x, hx.make_qarray(*p)))
  with hx.installed():
    hlo = f.lower(x, *parts).as_text()
    y = f(x, *parts)
  fmt = formats.FORMATS[kind.lower()]
  assert custom_calls(hlo) == [block_call(native.TARGET_V4, fmt)]
  np.testing.assert_array_equal(np.asarray(y), np.asarray(V4(x, *parts)))
  with hx.installed(activations="int8"):  # integer activations: hx_matmul_q_cpu_i8x_v2
    assert re.findall(r"custom_call @(\w+)\(", f.lower(x, *parts).as_text()) == [
        native.TARGET_I8X_V2]


@needs_native
def test_refuses_non_block_operands():
  x = np.zeros((1, 64), np.float32)
  with pytest.raises(TypeError, match="hx_matmul_q_cpu_v4: no block format"):
    native.matmul_q_native_v4(x, np.zeros((2, 64), np.int8), np.zeros((2, 2), np.float16))


def test_block_formats_claim_the_native_kernel():
  for f in formats.BLOCK_FORMATS:
    assert f.native_cpu == ("nk",)
    assert INFO.describe(f.name, f.block, "nk").startswith(
        f"native CPU kernel {native.TARGET_V4}") or not INFO.active
