"""``hx_matmul_q_cpu_nkt_v1``: the transposed product of the checkpoint layout ``[out, in]``,
``y = x @ W`` for ``W[n, k]`` quantized along ``k`` (``hx.einsum("...n,nk->...k")``), the
backward in ``x`` of ``hx.einsum("...k,nk->...n", x, W)`` (``csrc/matmul_q_nkt.h``).

Every format the ``[out, in]`` kernels take: the value formats of :mod:`hxmlir.formats`
(int8, int4 and uint4 pairs, fp8; f32 or f16 scales; offsets; per row or per group) and
GGUF's block formats (random blocks, gguf-py's decoder as the reference weight).

Numbers: against float64 ``x @ w``. A value format's weight is decoded as
``fl(fl(v s) + o)`` (within ``gamma_2 (|v s| + |o|)`` of ``v s + o``); a block format's is
``hx.dequantize``'s (gguf's) exactly. Each output is then a sum over ``j < n`` of rounded
products, added one after the other into a vector lane (fused or not): within
``gamma_{n+2} * |x| @ (|v s| + |o|) + n * tiny`` (Higham section 3.1; ``tests/py/numerics.py``).
A weight row off by one fails it (:func:`test_bound_catches_a_wrong_row`).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import TINY, assert_within, gamma
from test_matmul_q_formats_native import _with_isa
from test_matmul_q_nk_native import _components

import hxmlir as hx
from hxmlir import formats
from hxmlir.lowering.matmul_q import cpu as native

INFO = hx.cpu_kernel_info()
needs_native = pytest.mark.skipif(not INFO.active, reason=f"native kernel inactive: {INFO}")
NKT = jax.jit(native.matmul_q_native_nkt)
VALUE_FORMATS = [n for n, f in formats.FORMATS.items() if not f.block and "nk" in f.native_cpu]
BLOCK_KINDS = [f.gguf for f in formats.BLOCK_FORMATS]

# (x's leading shape, n, k): m = 1 (one row of x), 3, 64, 130 (more than a task's 128 rows)
# and a rank-3 x; n odd (rows of W, the contraction); k past a panel of 256 and not a
# multiple of any vector (k = 288, 90, 576 + 96), and small.
SHAPES = [((1,), 67, 288), ((3,), 37, 96), ((64,), 33, 672), ((130,), 9, 288),
          ((2, 3), 35, 96), ((6,), 13, 90), ((1,), 5, 4)]
GROUPS = [None, 32, "small"]  # small: 3 (one value per byte) or 2 (pairs)


def _check(y, x, vs, o, what=""):
  x64 = np.asarray(x, np.float64)
  n = x64.shape[-1]
  bound = gamma(n + 2) * (np.abs(x64) @ (np.abs(vs) + np.abs(o))) + n * TINY
  assert_within(np.asarray(y), x64 @ (vs + o), bound, what)


@needs_native
@pytest.mark.parametrize("group", GROUPS, ids=str)
@pytest.mark.parametrize("name", VALUE_FORMATS)
def test_value_formats_against_float64_every_shape_and_isa(name, group):
  fmt = formats.FORMATS[name]
  g = (2 if fmt.pack == 2 else 3) if group == "small" else group
  rng = np.random.default_rng(abs(hash((name, str(group)))) % 2**32)
  for lead, n, k in SHAPES:
    if (g is not None and k % g) or k % fmt.pack:
      continue
    q, s, o, vs, oo = _components(rng, fmt, n, k, g)
    x = rng.standard_normal((*lead, n)).astype(np.float32)
    args = (x, q, s) if o is None else (x, q, s, o)
    for isa in INFO.supported_isas:
      y = _with_isa(isa, NKT, *args)
      assert y.shape == (*lead, k) and y.dtype == np.float32
      _check(y, x, vs, oo, f"{name} g={g} {isa} {lead} n={n} k={k}: ")


def _blocks(kind: str, n: int, blocks: int, seed: int = 0):
  from test_matmul_q_blocks_native import _weight
  return _weight(kind, n, blocks, seed)


@needs_native
@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_block_formats_decode_bit_for_bit_and_against_float64(kind):
  pytest.importorskip("gguf", reason="pip install 'hxmlir[gguf]'")
  from hxmlir import gguf as hg
  per = 2 if hg._BLOCK_SIZES[kind] == 256 else 9  # k = 512 or 288: a panel and a part
  parts, w = _blocks(kind, 37, per, seed=per)
  n, k = w.shape
  eye = np.eye(n, dtype=np.float32)  # y[i] = w[i]: one exact product per output
  for isa in INFO.supported_isas:
    np.testing.assert_array_equal(_with_isa(isa, NKT, eye, *parts), w)
    for lead in ((1,), (5,), (2, 70)):
      x = np.random.RandomState(len(lead)).randn(*lead, n).astype(np.float32)
      y = _with_isa(isa, NKT, x, *parts)
      assert y.shape == (*lead, k)
      x64, w64 = x.astype(np.float64), w.astype(np.float64)
      assert_within(y, x64 @ w64, gamma(n + 2) * (np.abs(x64) @ np.abs(w64)) + n * TINY,
                    f"{kind} {isa} {lead}: ")


@needs_native
def test_bound_catches_a_wrong_row():
  fmt = formats.FORMATS["uint4_f16"]
  rng = np.random.default_rng(3)
  q, s, o, vs, oo = _components(rng, fmt, 21, 96, 32)
  x = rng.standard_normal((4, 21)).astype(np.float32)
  y = np.asarray(NKT(*((x, q, s) if o is None else (x, q, s, o))))
  with pytest.raises(AssertionError):
    _check(y, x, np.roll(vs, 1, axis=0), np.roll(oo, 1, axis=0))


@needs_native
def test_refuses_operands_that_disagree():
  q = np.zeros((8, 64), np.int8)
  s = np.ones((8,), np.float32)
  f = jax.ffi.ffi_call(native.TARGET_NKT, jax.ShapeDtypeStruct((2, 64), jnp.float32))
  with pytest.raises(Exception, match=r"hx_matmul_q_cpu_nkt_v1: expects f32\[\*b, n\], s8\[n, k\]"
                                      r".* got f32\[2,7\], s8\[8,64\], f32\[8\] -> f32\[2,64\]"):
    jax.block_until_ready(f(np.zeros((2, 7), np.float32), q, s, dtype="int8", layout="plain",
                            group_size=np.int64(0), scale_dtype="f32", offset=False))
  with pytest.raises(Exception, match="unknown dtype attribute 'int3'.*q4_k"):
    jax.block_until_ready(f(np.zeros((2, 8), np.float32), q, s, dtype="int3", layout="plain",
                            group_size=np.int64(0), scale_dtype="f32", offset=False))


# --- the gradient of the checkpoint layout ---------------------------------------------

def _gguf_weight(kind: str, n: int, k: int):
  """A GGUF-like weight ``W[n, k]`` (a block format, or Q4_1 / Q8_0: uint4 / int8 per 32
  with f16 scales) and its dequantized f32 value."""
  if kind in ("Q4_1", "Q8_0"):
    x = np.random.default_rng(1).standard_normal((n, k)).astype(np.float32)
    dtype, method = (jnp.uint4, "minmax") if kind == "Q4_1" else (jnp.int8, "absmax")
    w = hx.quantize(jnp.asarray(x), dtype, group_size=32, method=method)
    v, *rest = hx.qarray_parts(w)
    w = hx.make_qarray(v, *(c.astype(jnp.float16) for c in rest))
  else:
    from hxmlir import gguf as hg
    parts, _ = _blocks(kind, n, k // hg._BLOCK_SIZES[kind], seed=4)
    w = hx.make_qarray(*parts)
  return w, np.asarray(hx.dequantize(w), np.float64)


@needs_native
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q4_K", "Q6_K", "IQ4_NL"])
@pytest.mark.parametrize("m", [1, 17])
def test_grad_in_x_calls_the_kernel_without_a_dense_weight(kind, m):
  if kind not in ("Q4_1", "Q8_0"):
    pytest.importorskip("gguf", reason="pip install 'hxmlir[gguf]'")
  n, k = 300, 512
  w, w64 = _gguf_weight(kind, n, k)
  rng = np.random.default_rng(m)
  x = rng.standard_normal((m, k)).astype(np.float32)
  c = rng.standard_normal((m, n)).astype(np.float32)
  f = jax.jit(jax.grad(lambda x, w, c: jnp.sum(hx.einsum("mk,nk->mn", x, w) * c)))
  with hx.installed():
    hlo = f.lower(x, w, c).as_text()
    gx = np.asarray(f(x, w, c))
  calls = re.findall(r"stablehlo\.custom_call @(\w+)\(", hlo)
  assert native.TARGET_NKT in calls, calls
  assert f"tensor<{n}x{k}xf32>" not in hlo and f"tensor<{k}x{n}xf32>" not in hlo
  c64 = c.astype(np.float64)
  bound = gamma(n + 2) * (np.abs(c64) @ np.abs(w64)) + n * TINY
  assert_within(gx, c64 @ w64, bound, f"{kind} m={m} native: ")
  # the portable path (not installed: StableHLO, the weight walked in blocks) agrees too
  assert_within(np.asarray(f(x, w, c)), c64 @ w64, bound, f"{kind} m={m} portable: ")
