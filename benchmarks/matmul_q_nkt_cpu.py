"""``hx_matmul_q_cpu_nkt_v1`` (the transposed product of the ``[out, in]`` layout, the
backward of ``hx.einsum("...k,nk->...n")`` in ``x``) per format: median seconds of
``x @ W`` for ``W[n, k]`` and ``x: f32[m, n]``, the weight's stored bytes per second, and
the same product as XLA's f32 dot on the dequantized weight (``jnp.dot(x, w)``).

Usage: ``python benchmarks/matmul_q_nkt_cpu.py [--n 1536] [--k 576] [--m 1 64] [--reps 20]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir.gguf import device_bytes
from hxmlir.lowering.matmul_q import cpu as native


def _weight(name: str, n: int, k: int):
  rng = np.random.default_rng(0)
  if name in ("Q4_1", "Q8_0", "Q4_0"):
    dtype, method = {"Q4_1": (jnp.uint4, "minmax"), "Q8_0": (jnp.int8, "absmax"),
                     "Q4_0": (jnp.int4, "absmax")}[name]
    w = hx.quantize(jnp.asarray(rng.standard_normal((n, k)), jnp.float32), dtype,
                    group_size=32, method=method)
    v, *rest = hx.qarray_parts(w)
    return hx.make_qarray(v, *(c.astype(jnp.float16) for c in rest))
  from hxmlir import gguf as hg
  kind = name
  rs = np.random.RandomState(0)
  raw = rs.randint(0, 256, size=(n, k // hg._BLOCK_SIZES[kind], hg._BLOCK_BYTES[kind]))
  raw = raw.astype(np.uint8)
  d_at, m_at, _ = hg._HEADERS[kind]
  for at in (d_at,) if m_at is None else (d_at, m_at):
    raw[..., at:at + 2] = (rs.randn(n, raw.shape[1], 1) * 0.02).astype(np.float16).view(np.uint8)
  return hx.make_qarray(*hg.block_parts(raw, kind))


def _time(f, *args, reps):
  jax.block_until_ready(f(*args))
  ts = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    ts.append(time.perf_counter() - t0)
  return statistics.median(ts)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--n", type=int, default=1536)
  ap.add_argument("--k", type=int, default=576)
  ap.add_argument("--m", type=int, nargs="+", default=[1, 64])
  ap.add_argument("--reps", type=int, default=20)
  ap.add_argument("--formats", nargs="+",
                  default=["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "IQ4_NL", "Q4_K", "Q5_K",
                           "Q6_K", "Q2_K", "Q3_K", "IQ4_XS"])
  args = ap.parse_args()
  print(f"{hx.cpu_kernel_info()}; W[{args.n}, {args.k}]")
  print(f"{'format':8} {'m':>4} {'nkt ms':>8} {'GB/s':>6} {'f32 dot ms':>10}")
  nkt = jax.jit(native.matmul_q_native_nkt)
  dot = jax.jit(jnp.dot)
  for name in args.formats:
    w = _weight(name, args.n, args.k)
    parts = hx.qarray_parts(w)
    dense = hx.dequantize(w)
    nbytes = sum(device_bytes(p) for p in parts)
    for m in args.m:
      x = jnp.asarray(np.random.default_rng(m).standard_normal((m, args.n)), jnp.float32)
      t = _time(nkt, x, *parts, reps=args.reps)
      td = _time(dot, x, dense, reps=args.reps)
      print(f"{name:8} {m:4d} {t * 1e3:8.3f} {nbytes / t / 1e9:6.2f} {td * 1e3:10.3f}")


if __name__ == "__main__":
  main()
