"""``hx_matmul_q_cpu_i8x_v2``: GGUF's block formats in ``[out, in]`` with integer activations.

Weights are random GGUF blocks (``test_matmul_q_blocks_native._weight``). The reference,
computed another way in float64: ``x`` quantized in NumPy as the kernel's header
(``csrc/matmul_q_i8x_blocks.h``) defines it (per block of 32: ``s_x = fl(amax / 127)``,
``qx = round-half-even(fl(x / s_x))``), times the weight's exact real value
``d * u + dmin * v`` (:func:`hxmlir.block_decode.units`: ``u = sc q`` and ``v = -m`` are small
integers per element, so ``d * u`` is the sub-block's exact ``d sc q``).

The bound: the kernel is within ``gamma_a * T`` of its semantics' exact value
(``T = sum_s |c_s| sum_e |q_e qx_e| + |o_s Sq_s|``, the header's derivation): ``a = nc + 8``
for the GEMV (x of at most 8 rows, ``nc = ceil(k / 256)``), ``a = 2 ns + 2`` for the panels
(more rows, ``ns = 256 nc / kSub`` sub-block slots). The semantics' factors
``c_s = fl(fl(d sc) s_x)``, ``o_s = fl(fl(dmin m) s_x)`` are within ``gamma_2`` of the real
``d sc s_x``, ``dmin m s_x``; together (Higham, lemma 3.3: ``gamma_a + gamma_2 + gamma_a
gamma_2 <= gamma_{a + 2}``)

  ``|y - y*| <= gamma_{a + 2} * T*,  T* = sum_e (|d u_e| + |dmin v_e|) s_x |qx_e|``

plus ``k * tiny`` for products that leave f32's normal range. A wrong sub-block scale is far
outside it (:func:`test_bound_catches_a_wrong_sub_block_scale`).
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from hx_testing import block_call, custom_calls
from numerics import TINY, assert_within, gamma
from test_matmul_q_blocks_native import _exact_weight, _weight
from test_matmul_q_formats_native import _with_isa

import hxmlir as hx
from hxmlir import formats
from hxmlir import gguf as hg
from hxmlir.lowering.matmul_q import cpu as native

pytest.importorskip("gguf", reason="pip install 'hxmlir[gguf]'")
INFO = hx.cpu_kernel_info()
needs_native = pytest.mark.skipif(not INFO.active, reason=f"native kernel inactive: {INFO}")
I8X2 = jax.jit(native.matmul_q_native_i8x_v2)
V4 = jax.jit(native.matmul_q_native_v4)
KINDS = [f.gguf for f in formats.BLOCK_FORMATS]
SUB = {"Q6_K": 16, "Q3_K": 16, "Q2_K": 16}  # kSub: elements per sub-block (else 32)
GEMV_ROWS = 8  # x of at most this many rows: the GEMV's order; more: the panels'


def _quantized_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``(s_x, qx)`` of ``x: f32[m, k]`` per block of 32 along ``k``, each ``f64[m, k]`` (``s_x``
  repeated over its block): the kernel's quantization, in f32 arithmetic as it does it."""
  m, k = x.shape
  xb = x.reshape(m, k // 32, 32)
  amax = np.max(np.abs(xb), axis=-1)
  with np.errstate(invalid="ignore"):
    sx = np.where(np.isfinite(xb).all(axis=-1), amax / np.float32(127), np.nan).astype(np.float32)
  safe = np.where(sx > 0, sx, np.float32(1))[..., None]
  qx = np.rint(np.clip(xb / safe, np.float32(-127), np.float32(127)))  # f32 divide, half-even
  qx = np.where(sx[..., None] > 0, qx, 0)
  return np.repeat(sx, 32, axis=-1).astype(np.float64), qx.reshape(m, k).astype(np.float64)


def _reference(x: np.ndarray, parts, kind: str):
  """``(y*, bound)`` for ``x: f32[..., k]``: the float64 reference and the module's bound."""
  k = x.shape[-1]
  x2 = x.reshape(-1, k)
  sx, qx = _quantized_x(x2)
  w, wabs = _exact_weight(parts, kind)
  xs = sx * qx
  nc = -(-k // 256)
  a = nc + 8 if x2.shape[0] <= GEMV_ROWS else 2 * (256 * nc // SUB.get(kind, 32)) + 2
  bound = gamma(a + 2) * (np.abs(xs) @ wabs.T) + k * TINY
  lead = x.shape[:-1]
  return (xs @ w.T).reshape(*lead, -1), bound.reshape(*lead, -1)


def _blocks_for(kind: str, k_min: int) -> int:
  """Blocks per row of at least ``k_min`` elements; for the 32-element formats an odd count
  that leaves the last chunk of 256 partial."""
  b = hg._BLOCK_SIZES[kind]
  blocks = -(-k_min // b)
  return blocks if b == 256 else blocks // 8 * 8 + 3


# (leading dims of x, rows of W, elements of k at least): the GEMV at m = 1 (the decode
# step), 3 and 8; the panels at 9, (2, 5), 17 and 40 (groups of 16 rows: one partial, one
# whole and a partial, two whole and a partial); n never a multiple of 4 or 6 (the tiles);
# at m = 3, six blocks of 256 (Q4_K's and Q5_K's factors decoded four blocks at a time on
# AVX-512: a whole four and two more)
CASES = [((1,), 37, 700), ((3,), 37, 1500), ((8,), 13, 520), ((9,), 13, 520),
         ((17,), 11, 520), ((2, 5), 13, 520), ((40,), 23, 300)]


@needs_native
@pytest.mark.parametrize("isa", INFO.supported_isas)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lead,n,k_min", CASES)
def test_against_float64(isa, kind, lead, n, k_min):
  blocks = _blocks_for(kind, k_min)
  parts, _ = _weight(kind, n, blocks, seed=n + blocks)
  k = blocks * hg._BLOCK_SIZES[kind]
  x = np.random.RandomState(k + n).randn(*lead, k).astype(np.float32)
  x[..., :32] = 0.0  # a block of zeros: s_x = 0, qx = 0
  y = _with_isa(isa, I8X2, x, *parts)
  assert y.shape == (*lead, n) and y.dtype == np.float32
  want, bound = _reference(x, parts, kind)
  assert_within(y, want, bound, f"{kind} {isa} {lead} n={n} k={k}: ")


@needs_native
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q2_K"])
def test_threads(kind):
  # enough multiply-adds for every thread: rows of W split over them, x quantized in tasks
  # of 16 rows (the result is the same sums whatever the split), m = 3 (GEMV), 12 and 40
  # (panels)
  blocks = _blocks_for(kind, 2048)
  parts, _ = _weight(kind, 301, blocks, seed=11)
  k = blocks * hg._BLOCK_SIZES[kind]
  for m, alone in ((3, 1), (12, GEMV_ROWS + 1), (40, GEMV_ROWS + 1)):
    x = np.random.RandomState(m).randn(m, k).astype(np.float32)
    want, bound = _reference(x, parts, kind)
    y = np.asarray(I8X2(x, *parts))
    assert_within(y, want, bound, f"{kind} m={m}: ")
    # each row of the result is that row's own computation in its order (tiles and panels
    # never mix rows): the same as a call of `alone` rows, in the same regime
    np.testing.assert_array_equal(np.asarray(I8X2(x[-alone:], *parts))[-1], y[-1])


@needs_native
@pytest.mark.parametrize("m", [2, 12])  # the GEMV's bound and the panels'
# sub-blocks of 32 and of 16; IQ4_XS: with AVX-512 VNNI the GEMV's spread order (a lane's
# sums over a chunk are one sub-block's: a lane given another sub-block's factor is caught;
# IQ4_NL's is the same order over 8 blocks, its partial last chunk in test_against_float64)
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "IQ4_XS"])
def test_bound_catches_a_wrong_sub_block_scale(kind, m):
  parts, _ = _weight(kind, 9, 3, seed=3)
  k = 3 * 256
  x = np.random.RandomState(5).randn(m, k).astype(np.float32)
  y = np.asarray(I8X2(x, *parts))
  want, bound = _reference(x, parts, kind)
  assert_within(y, want, bound)
  sub = SUB.get(kind, 32)
  sx, qx = _quantized_x(x)
  w, _ = _exact_weight(parts, kind)
  for s in (1, 9):  # one sub-block of every row, scale off by 1/8
    wrong = w.copy()
    wrong[:, s * sub:(s + 1) * sub] *= 1.125
    with pytest.raises(AssertionError):
      assert_within(y, (sx * qx) @ wrong.T, bound)


@needs_native
@pytest.mark.parametrize("isa", INFO.supported_isas)
@pytest.mark.parametrize("m", [3, 20])  # the GEMV and the panels
def test_nan_and_inf_make_their_row_nan(isa, m):
  parts, _ = _weight("Q4_K", 7, 2, seed=1)
  x = np.random.RandomState(2).randn(m, 512).astype(np.float32)
  x[0, 300] = np.nan
  x[2, 5] = np.inf
  y = _with_isa(isa, I8X2, x, *parts)
  assert np.isnan(y[0]).all() and np.isnan(y[2]).all()
  assert np.isfinite(np.delete(y, [0, 2], axis=0)).all()


@needs_native
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "IQ4_XS"])
def test_einsum_installed_int8_calls_i8x_v2(kind):
  parts, _ = _weight(kind, 300, 2 if hg._BLOCK_SIZES[kind] == 256 else 16)
  x = np.random.RandomState(7).randn(1, parts[0].shape[1] * hg._BLOCK_SIZES[kind])
  x = x.astype(np.float32)
  f = jax.jit(lambda x, *p: hx.einsum("mk,nk->mn", x, hx.make_qarray(*p)))
  fmt = formats.FORMATS[kind.lower()]
  with hx.installed(activations="int8"):
    hlo = f.lower(x, *parts).as_text()
    y = f(x, *parts)
  assert custom_calls(hlo) == [block_call(native.TARGET_I8X_V2, fmt)]
  np.testing.assert_array_equal(np.asarray(y), np.asarray(I8X2(x, *parts)))
  want, bound = _reference(x, parts, kind)
  assert_within(y, want, bound)
  with hx.installed():  # f32 activations: still hx_matmul_q_cpu_v4
    assert re.findall(r"custom_call @(\w+)\(", f.lower(x, *parts).as_text()) == [native.TARGET_V4]


@needs_native
def test_refuses_what_v4_refuses():
  x = np.zeros((1, 64), np.float32)
  with pytest.raises(TypeError, match="hx_matmul_q_cpu_i8x_v2: no block format"):
    native.matmul_q_native_i8x_v2(x, np.zeros((2, 64), np.int8), np.zeros((2, 2), np.float16))
  parts, _ = _weight("Q4_K", 3, 1)
  f = jax.ffi.ffi_call(native.TARGET_I8X_V2, jax.ShapeDtypeStruct((1, 3), np.float32))
  with pytest.raises(Exception, match=r"hx_matmul_q_cpu_i8x_v2: dtype q4_k has group_size 256"):
    f(np.zeros((1, 256), np.float32), *parts, dtype="q4_k", layout="gguf_q4_k_v1",
      group_size=np.int64(32), scale_dtype="f16", offset=True)
