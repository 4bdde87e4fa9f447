"""Writes the back-compat artifacts that tests/py/integration/backcompat/test_backcompat.py replays.

Usage (from the repository root)::

  python tests/py/integration/backcompat/generate.py              # list the cases and what is stored
  python tests/py/integration/backcompat/generate.py NAME [...]   # (re)write these cases

Each case exports one small function with ``hxmlir.export`` for
``("cpu", "cuda", "tpu")`` and stores, in ``data/``:

- ``NAME.hxa``: the serialized artifact (``Exported.serialize()``),
- ``NAME.npz``: the flat lo components of its inputs (``in_0``, ``in_1``, ...)
  and of the outputs this code computed on CPU (``out_0``, ...),
- an entry in ``MANIFEST.json``: the ``hx.*`` composite ``(op, version)`` pairs
  and registered kernels the artifact holds, its hi signature, platforms, the
  hxmlir/jax versions and date that wrote it, and the artifact's SHA-256.

Never rewrite an existing case to make a test pass: a case is a promise that
artifacts written by that code keep loading and computing the same values.
When an op's semantics change, bump its version in ``lowering/schema.py`` (keep
the old one in ``accepted_versions``) and add a case named ``<op>_v<version>``
next to the old one; add one per platform for every kernel registered with
``owner="hxmlir"`` (``<kernel>_v<version>_<platform>``). The idea follows JAX's
``jax/_src/internal_test_util/export_back_compat_test_data`` (serialized
modules plus inputs and expected outputs, checked by a replaying test).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import hxmlir as hx  # noqa: E402
from hxmlir import export as hxe  # noqa: E402
from hxmlir import formats as hxf  # noqa: E402
from hxmlir import targets  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
MANIFEST = DATA / "MANIFEST.json"
PLATFORMS = ("cpu", "cuda", "tpu")


@dataclass(frozen=True)
class Case:
  """``fn`` exported for ``make_args()``; ``covers`` the (op, version) pairs it must hold.

  Kernel cases name the ``(target, kernel name)`` custom calls they must hold in
  ``kernels``; they are exported while hxmlir is installed (which is when the
  kernels are used and exportable) and native CPU calls are kept
  (``hx.keep_native_cpu_calls()``), for their own ``platforms``; outputs are
  stored only when ``cpu`` is among them; ``activations``: the setting's
  ``hx.install(activations=...)`` while they are exported.

  ``reordered``: for a CPU kernel whose summation order changed after the case was
  written, the version that changed it and ``bounds(*args)`` -> one entry per output:
  ``None`` where the output must still be the stored one bit for bit, else an array of
  the largest difference two f32 evaluations of it in different orders may have (derived
  from the computation: Higham's gamma bound of each order, added).
  """
  fn: Callable
  make_args: Callable[[], tuple]
  covers: tuple[tuple[str, int], ...]
  platforms: tuple[str, ...] = PLATFORMS
  kernels: tuple[tuple[str, str], ...] = ()
  activations: str = "f32"
  reordered: tuple[str, Callable] | None = None


def _x(shape, seed):
  # small, exactly representable values with a zero row and both signs
  v = np.random.default_rng(seed).integers(-40, 41, size=shape).astype(np.float32) / 8
  if v.ndim >= 2:
    v[..., 0, :] = 0.0
  return jnp.asarray(v)


def _f16_scales(q):
  """``q`` with its scales (and offsets) rounded to f16: GGUF's legacy blocks' form."""
  v, *rest = hx.qarray_parts(q)
  return hx.make_qarray(v, *(c.astype(jnp.float16) for c in rest))


def _nk_blocks(x, w, backend: str = "mosaic_tpu"):
  """``x @ dequantize(w).T`` by the block formats' Pallas kernel for ``backend``, called
  directly."""
  from hxmlir.lowering.matmul_q import pallas as mqp
  return mqp.matmul_q_nk_pallas(x, *hx.qarray_parts(w), backend=backend)


def _blocks(name: str, rows: int, blocks: int, seed: int):
  """A block format's value (:data:`hxmlir.formats.BLOCK_FORMATS`: GGUF's blocks at the file's
  bytes) of ``rows`` rows of ``blocks`` blocks: random words, f16 scales (and offsets) of
  both signs, small enough that every product is exact."""
  f = hxf.FORMATS[name]
  rng = np.random.default_rng(seed)
  words = rng.integers(0, 1 << 16, size=(rows, blocks, f.block_words)).astype(np.uint16)
  scales = [(rng.integers(-64, 65, size=(rows, blocks)) / 1024).astype(np.float16)
            for _ in range(2 if f.offset else 1)]
  return hx.make_qarray(words, *scales)
def _gguf_blocks(kind: str, n: int, blocks: int, seed: int):
  """A weight ``[n, blocks * B]`` of GGUF block format ``kind`` (random bytes, finite f16
  ``d``/``dmin``) from its components (hxmlir.gguf.block_parts)."""
  from hxmlir import gguf as hg
  rs = np.random.RandomState(seed)
  raw = rs.randint(0, 256, size=(n, blocks, hg._BLOCK_BYTES[kind])).astype(np.uint8)
  d_at, m_at, _ = hg._HEADERS[kind]
  for at in (d_at,) if m_at is None else (d_at, m_at):
    raw[..., at:at + 2] = (rs.randn(n, blocks, 1) * 0.02).astype(np.float16).view(np.uint8)
  return hx.make_qarray(*hg.block_parts(raw, kind))


def _gamma(n: int) -> float:
  """Higham's gamma_n for f32: n u / (1 - n u), u = 2^-24 (section 3.1)."""
  u = 2.0 ** -24
  return n * u / (1 - n * u)


def _abs_w(w) -> np.ndarray:
  """|w| in float64, w = hx.dequantize of a ``[n, k]`` weight (every form exact in f64)."""
  return np.abs(np.asarray(hx.dequantize(w), np.float64))


def _two_orders(x, w) -> np.ndarray:
  """The largest difference of two f32 sums of ``x @ w.T`` (``x: f32[..., k]``) in two
  orders: each within gamma_k |x| |w| of the exact value."""
  aw = _abs_w(w)
  return 2 * _gamma(aw.shape[-1]) * (np.abs(np.asarray(x, np.float64)) @ aw.T)


def _block_row_two_orders(x, w) -> np.ndarray:
  """The same for hx_matmul_q_cpu_v4's GEMV (one row of ``x``) on a GGUF block weight:
  each order within ``gamma_{k+7} |x| (|d u| + |dmin v|)`` of the exact value, the real
  terms of :mod:`hxmlir.block_decode` (tests/py/lowering/test_matmul_q_blocks_native.py)."""
  from hxmlir import block_decode, formats
  fmt = formats.lookup(jax.typeof(w).fmt)
  u, v = block_decode.units(np.asarray(w.qvalue), fmt.name)
  t = np.abs(np.repeat(np.asarray(w.scale, np.float64), fmt.block, -1) * np.asarray(u, np.float64))
  if v is not None:
    t += np.abs(np.repeat(np.asarray(w.offset, np.float64), fmt.block, -1) * np.asarray(v, np.float64))
  return 2 * _gamma(t.shape[-1] + 7) * (np.abs(np.asarray(x, np.float64)) @ t.T)


def _grad_sin_two_orders(x, w) -> np.ndarray:
  """The same for ``dx = cos(x @ w.T) @ w`` when only the forward product's order changed:
  cos moves by at most its argument's change plus a few f32 ulps of a value <= 1 (8 u
  here), and the transposed product of two inputs c1, c2 with |c| <= 1 differs by
  |c1 - c2| |w| plus each one's gamma_n |w| (n: rows of w)."""
  aw = _abs_w(w)
  dc = _two_orders(x, w) + 8 * 2.0 ** -24
  return dc @ aw + 2 * _gamma(aw.shape[0]) * aw.sum(axis=0)


def _int8_two_orders(x, w, a_old: int, a_new: int) -> np.ndarray:
  """The same for the integer-activation kernels (csrc/matmul_q_i8x.h,
  csrc/matmul_q_i8x_blocks.h), whose orders are each within ``gamma_a T`` of the exact value
  of their expression (``a_old``, ``a_new``: the two orders' ``a``), ``T`` the sum over the
  elements of ``|s_w v_e| |s_x qx_e|`` plus the offset's ``|o| |s_x qx_e|`` (at most; each
  factor within ``(1 + u)^2`` of its real value). With ``|s_x qx_e|`` at most its block of
  32's ``amax`` (``|qx| <= 127``, ``s_x = fl(amax / 127)``) and ``|s_w v| + |o| <= |w| +
  2 |o|`` (``w = s_w v + o``; ``w``'s f32 value within ``gamma_2`` of it: the slack covers
  it), ``T <= (1 + 1e-5) sum_e (|w_e| + 2 |o_e|) amax_e`` for ``w`` a value format with an
  offset per group of 32, or a block format without one (``o = 0``)."""
  xa = np.abs(np.asarray(x, np.float64))
  amax = np.repeat(xa.reshape(*xa.shape[:-1], -1, 32).max(axis=-1), 32, axis=-1)
  mag = _abs_w(w)
  parts = hx.qarray_parts(w) if hasattr(w, "qvalue") else ()
  if len(parts) == 3:  # a value format with offsets (groups of 32 along k)
    mag = mag + 2 * np.repeat(np.abs(np.asarray(parts[2], np.float64)), 32, axis=-1)
  return (_gamma(a_old) + _gamma(a_new)) * (1 + 1e-5) * (amax @ mag.T)


def _gemv_case(kernel: str, seed: int, activations: str = "f32",
               reordered: tuple[str, Callable] | None = None) -> Case:
  """A case of ``kernel``'s GEMV on GGUF blocks: one row of ``x`` (not zero) against Q4_K
  (sub-blocks of 32, mins), Q5_0 (one sub-block a block) and Q6_K (sub-blocks of 16), with
  ``activations`` (``reordered``: as :class:`Case`'s); inputs from ``seed`` on."""
  return Case(
      lambda x, a, b, c: tuple(hx.einsum("mk,nk->mn", x, w) for w in (a, b, c)),
      lambda: (_x((2, 512), seed)[1:], _gguf_blocks("Q4_K", 260, 2, seed + 1),
               _gguf_blocks("Q5_0", 260, 16, seed + 2), _gguf_blocks("Q6_K", 260, 2, seed + 3)),
      (("hx.matmul_q", 5),), platforms=("cpu",), kernels=((kernel, kernel),),
      activations=activations, reordered=reordered)


CASES: dict[str, Case] = {
    "quantize_v1": Case(hx.quantize, lambda: (_x((3, 4), 1),), (("hx.quantize", 1),)),
    "dequantize_v1": Case(hx.dequantize, lambda: (hx.quantize(_x((3, 4), 2)),),
                          (("hx.dequantize", 1),)),
    "matmul_q_v1": Case(hx.matmul_q, lambda: (_x((2, 3), 3), hx.quantize(_x((3, 4), 4))),
                        (("hx.matmul_q", 1),)),
    # version 2: dot_general dimension numbers in composite_attributes -- a transformer
    # layer's f32[b, s, k] @ q8[k, n] and the [out, in] layout (scale on the result)
    "matmul_q_v2": Case(lambda x, qw, qo: (hx.matmul_q(x, qw), hx.einsum("bsk,nk->bsn", x, qo)),
                        lambda: (_x((2, 3, 4), 12), hx.quantize(_x((4, 5), 13)),
                                 hx.quantize(_x((6, 4), 14))),
                        (("hx.matmul_q", 2),)),
    # The int4/fp8/group formats: hx.quantize v2, hx.dequantize v2, hx.matmul_q v3 carry dtype,
    # group_size and layout (int4 pairs two per byte) in composite_attributes
    "quantize_v2": Case(
        lambda x: (hx.quantize(x, method="mse"), hx.quantize(x, jnp.int4, group_size=4),
                   hx.quantize(x, jnp.float8_e4m3fn), hx.quantize(x, jnp.int8, group_size=2),
                   hx.quantize(x, jnp.int4, group_size=4, method="mse")),
        lambda: (_x((3, 8), 21),), (("hx.quantize", 2),)),
    "dequantize_v2": Case(
        lambda a, b, c: (hx.dequantize(a), hx.dequantize(b), hx.dequantize(c)),
        lambda: (hx.quantize(_x((3, 8), 22), jnp.int4, group_size=4),
                 hx.quantize(_x((3, 8), 23), jnp.float8_e4m3fn),
                 hx.quantize(_x((3, 8), 24), jnp.int8, group_size=2)),
        (("hx.dequantize", 2),)),
    "matmul_q_v3": Case(
        lambda x, xo, a, b, c: (hx.matmul_q(x, a), hx.einsum("bsk,nk->bsn", xo, b),
                                hx.matmul_q(x, c)),
        lambda: (_x((2, 3, 8), 25), _x((2, 3, 8), 26),
                 hx.quantize(_x((8, 6), 27), jnp.int4, group_size=2),
                 hx.quantize(_x((5, 8), 28), jnp.int4, group_size=4),
                 hx.quantize(_x((8, 6), 29), jnp.float8_e4m3fn)),
        (("hx.matmul_q", 3),)),
    # The f16-scale and offset formats: hx.quantize v3, hx.dequantize v3, hx.matmul_q v4 add scale_dtype
    # and offset (the offsets one more result or operand): u4o (uint4 pairs with an
    # offset), f16 scales (GGUF's Q8_0, Q4_0, Q4_1), q8o (int8 with an offset)
    "quantize_v3": Case(
        lambda x: (hx.quantize(x, jnp.uint4, group_size=4, method="minmax"),
                   hx.quantize(x, jnp.uint4, method="minmax")),
        lambda: (_x((3, 8), 41),), (("hx.quantize", 3),)),
    "dequantize_v3": Case(
        lambda a, b, c: (hx.dequantize(a), hx.dequantize(b), hx.dequantize(c)),
        lambda: (_f16_scales(hx.quantize(_x((3, 8), 42), jnp.uint4, group_size=4,
                                         method="minmax")),
                 _f16_scales(hx.quantize(_x((3, 8), 43), jnp.int4, group_size=4)),
                 hx.make_qarray(np.arange(24, dtype=np.int8).reshape(3, 8) % 32,
                                _x((3, 2), 44), _x((3, 2), 45))),
        (("hx.dequantize", 3),)),
    "matmul_q_v4": Case(
        lambda x, xo, a, b, c: (hx.matmul_q(x, a), hx.einsum("bsk,nk->bsn", xo, b),
                                hx.einsum("bsk,nk->bsn", xo, c)),
        lambda: (_x((2, 3, 8), 46), _x((2, 3, 8), 47),
                 hx.quantize(_x((8, 6), 48), jnp.uint4, group_size=2, method="minmax"),
                 _f16_scales(hx.quantize(_x((5, 8), 49), jnp.uint4, group_size=4,
                                         method="minmax")),
                 _f16_scales(hx.quantize(_x((5, 8), 50), jnp.int8, group_size=4))),
        (("hx.matmul_q", 4),)),
    # the block formats (GGUF's Q5_0 ... IQ4_XS at the file's bytes): hx.dequantize v4 and
    # hx.matmul_q v5, whose dtype names the block format (ui16 words, f16 per block)
    "dequantize_v4": Case(
        lambda *qs: tuple(hx.dequantize(q) for q in qs),
        lambda: tuple(_blocks(f.name, 2, 1 if f.block == 256 else 2, 60 + i)
                      for i, f in enumerate(hxf.BLOCK_FORMATS)),
        (("hx.dequantize", 4),)),
    "matmul_q_v5": Case(
        lambda x, xk, a, b, c: (hx.einsum("bsk,nk->bsn", x, a), hx.einsum("bsk,nk->bsn", xk, b),
                                hx.matmul_q(xk[0, :, :3], c)),
        lambda: (_x((2, 3, 256), 70), _x((2, 3, 64), 71), _blocks("q4_k", 5, 1, 72),
                 _blocks("q5_0", 4, 2, 73), _blocks("q6_k", 3, 1, 74)),
        (("hx.matmul_q", 5),)),
    "outer_v1": Case(hx.outer, lambda: (_x((3,), 5) + 1, _x((5,), 6)), (("hx.outer", 1),)),
    "matmul_r1_v1": Case(lambda x, c, r: hx.matmul_r1(x, hx.outer(c, r)),
                         lambda: (_x((2, 3), 7), _x((3,), 8) + 1, _x((4,), 9)),
                         (("hx.outer", 1), ("hx.matmul_r1", 1))),
    # grouped-query attention over a KV cache (lowering/attention/): T = 3 queries at
    # positions 5..7 of a cache of 16, 2 KV heads of 3 queries each, head_dim 8
    "attention_v1": Case(
        lambda q, k, v, start: hx.attention(q, k, v, start, scale=0.25),
        lambda: (_x((3, 2, 3, 8), 80), _x((2, 16, 8), 81), _x((2, 8, 16), 82), np.int32(5)),
        (("hx.attention", 1),)),
    # version 2: a sliding window of 4 and a soft cap of 0.5 (Gemma's local layers), T = 3
    # queries at positions 9..11 of a cache of 16
    "attention_v2": Case(
        lambda q, k, v, start: hx.attention(q, k, v, start, scale=0.25, window=4, softcap=0.5),
        lambda: (_x((3, 2, 3, 8), 83), _x((2, 16, 8), 84), _x((2, 8, 16), 85), np.int32(9)),
        (("hx.attention", 2),)),
    # version 3: jax.vmap of it, a batch of 3 each at its own position (2, 7, 12) over its own
    # cache of 16, T = 2 queries, a window of 4
    "attention_v3": Case(
        jax.vmap(lambda q, k, v, start: hx.attention(q, k, v, start, scale=0.25, window=4)),
        lambda: (_x((3, 2, 2, 3, 8), 86), _x((3, 2, 16, 8), 87), _x((3, 2, 8, 16), 88),
                 np.asarray([2, 7, 12], np.int32)),
        (("hx.attention", 3),)),
    # hxmlir's registered kernels (lowering/matmul_q/pallas/), one case per platform
    **{f"hx_matmul_q_v1_{p}": Case(
        hx.matmul_q, lambda: (_x((3, 40), 10), hx.quantize(_x((40, 50), 11))),
        (("hx.matmul_q", 1),), platforms=(p,),
        kernels=((targets.MOSAIC_TPU if p == "tpu" else targets.TRITON, "hx_matmul_q_v1"),))
      for p in ("cuda", "rocm", "tpu")},
    # version 2 of the Pallas kernel: int4 pairs, fp8 and group scales
    **{f"hx_matmul_q_v2_{p}": Case(
        lambda x, a, b, c: (hx.matmul_q(x, a), hx.matmul_q(x, b), hx.matmul_q(x, c)),
        lambda: (_x((3, 40), 15), hx.quantize(_x((40, 64), 16), jnp.int4),
                 hx.quantize(_x((40, 64), 17), jnp.float8_e4m3fn),
                 hx.quantize(_x((40, 64), 18), jnp.int4, group_size=32)),
        (("hx.matmul_q", 3),), platforms=(p,),
        kernels=((targets.MOSAIC_TPU if p == "tpu" else targets.TRITON, "hx_matmul_q_v2"),))
      for p in ("cuda", "rocm", "tpu")},
    # the [out, in] Pallas kernel: hx.einsum("...k,nk->...n") with groups along
    # the contraction -- GGUF's Q4_1 (u4o, f16 scales and offsets, ragged k chunk), Q8_0
    # (q8 g32 f16) and fp8 per row, x of rank 3
    **{f"hx_matmul_q_nk_v1_{p}": Case(
        lambda x, a, b, c: (hx.einsum("bsk,nk->bsn", x, a), hx.einsum("bsk,nk->bsn", x, b),
                            hx.einsum("bsk,nk->bsn", x, c)),
        lambda: (_x((2, 3, 96), 51),
                 _f16_scales(hx.quantize(_x((40, 96), 52), jnp.uint4, group_size=32,
                                         method="minmax")),
                 _f16_scales(hx.quantize(_x((40, 96), 53), jnp.int8, group_size=32)),
                 hx.quantize(_x((40, 96), 54), jnp.float8_e4m3fn)),
        (("hx.matmul_q", 3), ("hx.matmul_q", 4)), platforms=(p,),
        kernels=((targets.MOSAIC_TPU if p == "tpu" else targets.TRITON, "hx_matmul_q_nk_v1"),))
      for p in ("cuda", "rocm", "tpu")},
    # the block formats' Mosaic kernel, called directly (the rules keep the decomposition for
    # block weights): GGUF's Q4_K (2 blocks a row, 40 rows) and Q5_0 (3 blocks, 24 rows)
    "hx_matmul_q_nk_blocks_v1_tpu": Case(
        lambda x1, x2, a, b: (_nk_blocks(x1, a), _nk_blocks(x2, b)),
        lambda: (_x((3, 512), 55), _x((3, 96), 56), _blocks("q4_k", 40, 2, 57),
                 _blocks("q5_0", 24, 3, 58)),
        (), platforms=("tpu",),
        kernels=((targets.MOSAIC_TPU, "hx_matmul_q_nk_blocks_v1"),)),
    # its Triton kernel (gathers of the block's words), called directly: Q4_K (2 blocks a
    # row, 40 rows: a ragged second row tile) and IQ4_NL (3 blocks, 24 rows)
    **{f"hx_matmul_q_nk_blocks_v1_{p}": Case(
        lambda x1, x2, a, b: (_nk_blocks(x1, a, "triton"), _nk_blocks(x2, b, "triton")),
        lambda: (_x((3, 512), 59), _x((3, 96), 60), _blocks("q4_k", 40, 2, 61),
                 _blocks("iq4_nl", 24, 3, 62)),
        (), platforms=(p,),
        kernels=((targets.TRITON, "hx_matmul_q_nk_blocks_v1"),))
      for p in ("cuda", "rocm")},
    # the native CPU kernel (lowering/matmul_q/cpu.py), kept by hx.keep_native_cpu_calls();
    # a weight above matmul_q.streaming.SMALL_WEIGHT (64K elements), m <= 4 and m > 4 regimes
    "hx_matmul_q_cpu_v1_cpu": Case(
        lambda x1, x2, qw: (hx.matmul_q(x1, qw), hx.matmul_q(x2, qw)),
        lambda: (_x((3, 300), 12), _x((70, 300), 13), hx.quantize(_x((300, 260), 14))),
        (("hx.matmul_q", 1),), platforms=("cpu",),
        kernels=(("hx_matmul_q_cpu_v1", "hx_matmul_q_cpu_v1"),)),
    # its version 2 (every format): int4 per group (rows regime, a batched weight) and
    # float8 / int8 per group (blocks regime, m > 4)
    "hx_matmul_q_cpu_v2_cpu": Case(
        lambda x1, x2, a, b, c: (hx.matmul_q(x1, a), hx.matmul_q(x2, b), hx.matmul_q(x2, c)),
        lambda: (_x((2, 3, 300), 30), _x((70, 300), 31),
                 hx.quantize(_x((2, 300, 256), 32), jnp.int4, group_size=32),
                 hx.quantize(_x((300, 256), 33), jnp.float8_e4m3fn),
                 hx.quantize(_x((300, 256), 34), jnp.int8, group_size=8)),
        (("hx.matmul_q", 3),), platforms=("cpu",),
        kernels=(("hx_matmul_q_cpu_v2", "hx_matmul_q_cpu_v2"),)),
    # its version 3 (the [out, in] layout): Q4_1-like u4o with f16 scales and
    # offsets ("dot" regime, m <= 8, rank-3 x), Q8_0-like q8 f16 per group and q8o
    # ("blocks", m > 8), fp8 per row (a legacy format: hx.matmul_q version 3)
    "hx_matmul_q_cpu_v3_cpu": Case(
        lambda x1, x2, a, b, c, d: (hx.einsum("bmk,nk->bmn", x1, a), hx.einsum("mk,nk->mn", x2, b),
                                    hx.einsum("mk,nk->mn", x2, c), hx.einsum("bmk,nk->bmn", x1, d)),
        lambda: (_x((2, 3, 320), 60), _x((20, 320), 61),
                 _f16_scales(hx.quantize(_x((230, 320), 62), jnp.uint4, group_size=32,
                                         method="minmax")),
                 _f16_scales(hx.quantize(_x((230, 320), 63), jnp.int8, group_size=32)),
                 hx.make_qarray(np.arange(230 * 320, dtype=np.int64).reshape(230, 320)
                                .astype(np.int8) % 32, _x((230, 10), 64), _x((230, 10), 65)),
                 hx.quantize(_x((230, 320), 66), jnp.float8_e4m3fn)),
        (("hx.matmul_q", 4), ("hx.matmul_q", 3)), platforms=("cpu",),
        kernels=(("hx_matmul_q_cpu_v3", "hx_matmul_q_cpu_v3"),),
        # 0.7.0: "blocks" (m = 20) sums each output in one ascending chain
        reordered=("0.7.0", lambda x1, x2, a, b, c, d: (None, _two_orders(x2, b),
                                                       _two_orders(x2, c), None))),
    # the opt-in integer activations: x (here 20 rows) quantized to int8 per block
    # at run time; Q4_1-like u4o with f16 scales and offsets, int4 per row (one block per
    # 32 of k), int8 per group of 16 (blocks narrower than 32)
    "hx_matmul_q_cpu_i8x_v1_cpu": Case(
        lambda x, a, b, c: (hx.einsum("mk,nk->mn", x, a), hx.einsum("mk,nk->mn", x, b),
                            hx.einsum("mk,nk->mn", x, c)),
        lambda: (_x((20, 320), 70),
                 _f16_scales(hx.quantize(_x((230, 320), 71), jnp.uint4, group_size=32,
                                         method="minmax")),
                 hx.quantize(_x((230, 320), 72), jnp.int4),
                 hx.quantize(_x((230, 320), 73), jnp.int8, group_size=16)),
        (("hx.matmul_q", 4), ("hx.matmul_q", 3)), platforms=("cpu",),
        kernels=(("hx_matmul_q_cpu_i8x_v1", "hx_matmul_q_cpu_i8x_v1"),), activations="int8",
        # 0.8.0: the u4o weight (groups of 32, f16) takes the panels (k = 320: 10 blocks,
        # gamma_{2 (10 // 16 + 4) + 7} before, 16 block slots: gamma_{2 * 16 + 2} now)
        reordered=("0.8.0", lambda x, a, b, c: (
            _int8_two_orders(x, a, 2 * 4 + 7, 2 * 16 + 2), None, None))),
    # its version 4 (GGUF's block formats at the file's bytes, [out, in]): Q4_K at m = 1 (the
    # "dot" regime's GEMV), Q5_0 at m = 3, Q6_K at m = 20 (tiles)
    "hx_matmul_q_cpu_v4_cpu": Case(
        lambda x1, x3, x20, a, b, c: (hx.einsum("mk,nk->mn", x1, a), hx.einsum("mk,nk->mn", x3, b),
                                      hx.einsum("mk,nk->mn", x20, c)),
        lambda: (_x((1, 512), 80), _x((3, 512), 81), _x((20, 512), 82),
                 _gguf_blocks("Q4_K", 260, 2, 83), _gguf_blocks("Q5_0", 260, 16, 84),
                 _gguf_blocks("Q6_K", 260, 2, 85)),
        (("hx.matmul_q", 5),), platforms=("cpu",),
        kernels=(("hx_matmul_q_cpu_v4", "hx_matmul_q_cpu_v4"),),
        # 0.7.0: the tiles (m = 20) sum each output in one ascending chain
        reordered=("0.7.0", lambda x1, x3, x20, a, b, c: (None, None, _two_orders(x20, c)))),
    # the block formats with the opt-in integer activations (x quantized to int8 per block of
    # 32 at run time): Q4_K at m = 1 (the GEMV), Q5_0 at m = 3, Q6_K at m = 20
    "hx_matmul_q_cpu_i8x_v2_cpu": Case(
        lambda x1, x3, x20, a, b, c: (hx.einsum("mk,nk->mn", x1, a), hx.einsum("mk,nk->mn", x3, b),
                                      hx.einsum("mk,nk->mn", x20, c)),
        lambda: (_x((1, 512), 120), _x((3, 512), 121), _x((20, 512), 122),
                 _gguf_blocks("Q4_K", 260, 2, 123), _gguf_blocks("Q5_0", 260, 16, 124),
                 _gguf_blocks("Q6_K", 260, 2, 125)),
        (("hx.matmul_q", 5),), platforms=("cpu",),
        kernels=(("hx_matmul_q_cpu_i8x_v2", "hx_matmul_q_cpu_i8x_v2"),), activations="int8",
        # 0.8.0: m = 20 takes the panels, one sum over the sub-blocks (k = 512: nc = 2 chunks,
        # 32 sub-blocks of 16: gamma_{nc + 8} before, gamma_{2 * 32 + 2} now)
        reordered=("0.8.0", lambda x1, x3, x20, a, b, c: (
            None, None, _int8_two_orders(x20, c, 2 + 8, 2 * 32 + 2)))),
    # the GEMVs of the two above with one row of x that is not zero (the cases above give
    # m = 1 the zero row of _x: they cannot see the GEMV)
    "hx_matmul_q_cpu_v4_gemv_cpu": _gemv_case(
        "hx_matmul_q_cpu_v4", 130,
        # 0.8.3: Q4_K's offset term sums each sub-block slot in a lane of its own; Q6_K
        # (sub-blocks of 16) takes that loop too, x q summed per sub-block
        reordered=("0.8.3", lambda x, a, b, c: (_block_row_two_orders(x, a), None,
                                                _block_row_two_orders(x, c)))),
    "hx_matmul_q_cpu_i8x_v2_gemv_cpu": _gemv_case("hx_matmul_q_cpu_i8x_v2", 140, "int8"),
    # the transposed product of the [out, in] layout (the backward of hx.einsum("mk,nk->mn")
    # in x): Q4_1-like u4o with f16 scales and offsets at m = 3, Q4_K at m = 1, and the
    # gradient in x of a Q8_0-like q8 f16 product at m = 20 (k = 320: a panel and a part)
    "hx_matmul_q_cpu_nkt_v1_cpu": Case(
        lambda g3, g1, x, a, b, c: (
            hx.einsum("mn,nk->mk", g3, a), hx.einsum("mn,nk->mk", g1, b),
            jax.grad(lambda x: jnp.sum(jnp.sin(hx.einsum("mk,nk->mn", x, c))))(x)),
        lambda: (_x((3, 230), 110), _x((1, 260), 111), _x((20, 320), 112),
                 _f16_scales(hx.quantize(_x((230, 320), 113), jnp.uint4, group_size=32,
                                         method="minmax")),
                 _gguf_blocks("Q4_K", 260, 2, 114),
                 _f16_scales(hx.quantize(_x((230, 320), 115), jnp.int8, group_size=32))),
        (("hx.matmul_q", 4), ("hx.matmul_q", 5)), platforms=("cpu",),
        kernels=(("hx_matmul_q_cpu_nkt_v1", "hx_matmul_q_cpu_nkt_v1"),),
        # 0.7.0: the forward product inside the gradient (v3's "blocks", m = 20) reordered
        reordered=("0.7.0", lambda g3, g1, x, a, b, c: (None, None,
                                                       _grad_sin_two_orders(x, c)))),
    # hx.attention's native CPU kernel (lowering/attention/cpu.py): prefill (T = 5 from
    # position 0) and a decode step (T = 1 at position 40, head_dim 24: a vector and a tail)
    # over a cache of 48 positions
    "hx_attention_cpu_v1_cpu": Case(
        lambda q1, q2, k, v, k2, v2: (hx.attention(q1, k, v, np.int32(0), scale=0.125),
                                      hx.attention(q2, k2, v2, np.int32(40), scale=0.2)),
        lambda: (_x((5, 2, 3, 64), 90), _x((1, 3, 1, 24), 91), _x((2, 48, 64), 92),
                 _x((2, 64, 48), 93), _x((3, 48, 24), 94), _x((3, 24, 48), 95)),
        (("hx.attention", 1),), platforms=("cpu",),
        kernels=(("hx_attention_cpu_v1", "hx_attention_cpu_v1"),)),
    # its version 2 (a sliding window and a soft cap): prefill of T = 5 from position 20 with
    # a window of 8, a decode step at position 40 with a window of 16 and a cap of 0.5
    "hx_attention_cpu_v2_cpu": Case(
        lambda q1, q2, k, v, k2, v2: (
            hx.attention(q1, k, v, np.int32(20), scale=0.125, window=8),
            hx.attention(q2, k2, v2, np.int32(40), scale=0.2, window=16, softcap=0.5)),
        lambda: (_x((5, 2, 3, 64), 96), _x((1, 3, 1, 24), 97), _x((2, 48, 64), 98),
                 _x((2, 64, 48), 99), _x((3, 48, 24), 100), _x((3, 24, 48), 101)),
        (("hx.attention", 2),), platforms=("cpu",),
        kernels=(("hx_attention_cpu_v2", "hx_attention_cpu_v2"),)),
    # its version 3 (jax.vmap: a batch, each element at its own position): decode steps of 3
    # elements at positions 40, 3 and 20 over their own caches of 48 (a window of 16, a cap
    # of 0.5), and prefills of T = 5 of 2 elements from positions 0 and 30 over one shared
    # cache
    "hx_attention_cpu_v3_cpu": Case(
        lambda q1, q2, k, v, k2, v2: (
            jax.vmap(lambda q, k, v, s: hx.attention(q, k, v, s, scale=0.2, window=16,
                                                     softcap=0.5))(
                q1, k, v, jnp.asarray([40, 3, 20], jnp.int32)),
            jax.vmap(lambda q, s: hx.attention(q, k2, v2, s, scale=0.125))(
                q2, jnp.asarray([0, 30], jnp.int32))),
        lambda: (_x((3, 1, 3, 1, 24), 102), _x((2, 5, 2, 3, 64), 103), _x((3, 3, 48, 24), 104),
                 _x((3, 3, 24, 48), 105), _x((2, 48, 64), 106), _x((2, 64, 48), 107)),
        (("hx.attention", 3),), platforms=("cpu",),
        kernels=(("hx_attention_cpu_v3", "hx_attention_cpu_v3"),)),
}


def lo_components(types, values) -> list[np.ndarray]:
  """The flat lo components of hi or plain ``values`` of ``types``."""
  out = []
  for ty, v in zip(types, values):
    parts = ty.lower_val(v) if hasattr(ty, "lower_val") else [v]
    out.extend(np.asarray(p) for p in parts)
  return out


def write(name: str) -> dict:
  case = CASES[name]
  args = case.make_args()
  if case.kernels:
    with hx.installed(activations=case.activations), hx.keep_native_cpu_calls():
      exp = hxe.export(case.fn, platforms=case.platforms)(*args)
  else:
    exp = hxe.export(case.fn, platforms=case.platforms)(*args)
  blob = bytes(exp.serialize())
  arrays = {f"in_{i}": a for i, a in enumerate(lo_components(exp.in_types, args))}
  if "cpu" in case.platforms:
    outs = exp.call(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    arrays |= {f"out_{i}": a for i, a in enumerate(lo_components(exp.out_types, outs))}
  DATA.mkdir(exist_ok=True)
  (DATA / f"{name}.hxa").write_bytes(blob)
  np.savez(DATA / f"{name}.npz", **arrays)
  return {"covers": [list(c) for c in case.covers], "kernels": [list(k) for k in case.kernels],
          "signature": exp.signature(), "platforms": list(exp.platforms),
          "hxmlir": hx.__version__, "jax": jax.__version__,
          "date": datetime.date.today().isoformat(),
          "sha256": hashlib.sha256(blob).hexdigest()} | _isas(case)


def _isas(case: Case) -> dict:
  """The CPU kernels' ISA (and the integer-activation kernels') the outputs were computed
  with, for a case holding CPU kernels: their summation order is the ISA's, so the outputs
  reproduce bit for bit under the same ISA only."""
  if not case.kernels or "cpu" not in case.platforms:
    return {}
  from hxmlir import _matmul_q_cpu as ext
  return {"cpu_isa": ext.selected_isa(), "i8x_isa": ext.i8x_isa()}


def main(argv: list[str]) -> int:
  manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
  if not argv:
    for name in CASES:
      print(f"{name:16s} {'stored ' + manifest[name]['date'] if name in manifest else 'missing'}")
    return 0
  unknown = [n for n in argv if n not in CASES]
  if unknown:
    print(f"unknown case(s) {unknown}; known: {', '.join(CASES)}", file=sys.stderr)
    return 2
  for name in argv:
    manifest[name] = write(name)
    print(f"wrote {name}: {manifest[name]['signature']}")
  MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
