"""CPU timings of ``hx.matmul_q`` against the naive dequantize-then-dot and an f32 matmul.

For ``x: f32[m, k]`` and a quantized weight ``q8[k, n]`` (``i8`` values and one
f32 scale per row), times per call, side by side in one run:

- ``naive``: ``x @ (q.astype(f32) * s[:, None])``, what a user writes without
  hxmlir (XLA materialises the whole dequantized weight);
- ``hx``: ``jax.jit(hx.matmul_q)``, whose CPU lowering streams the weight
  (``lowering/matmul_q_impl.py``);
- ``f32``: ``x @ w`` on the dequantized weight held as an f32 array (the
  dense model the quantized one replaces; 4x the weight bytes).

The three executables are compiled first, then called in interleaved rounds
(naive, hx, f32; hx, f32, naive; f32, naive, hx; ...: each follows each other
equally often, as what ran before -- the allocator's state, dirty cache lines --
affects a call), so a change in machine load hits all three alike; each time is
the median over rounds. Before every timed call a read-only pass
over a 96 MiB buffer evicts the caches (clean), so every variant starts as a
layer of a real model does: weights in DRAM, nothing dirty left by the previous
call (``--warm`` skips it: weights may then stay in the last-level cache). ``temp`` is XLA's compiled
``memory_analysis().temp_size_in_bytes``. Targets (issue 7): ``hx/f32 <= 1.0``
for ``m <= 16`` and ``<= 1.3`` above, ``naive/hx >= 6`` at ``m = 1``, and
``temp <= 1/8`` of the f32 weight's bytes; the last column marks them.

Usage::

  python benchmarks/matmul_q_cpu.py                 # m in 1 4 16 64 256, k = n = 4096, + 1 non-square
  python benchmarks/matmul_q_cpu.py --m 1 16 --rounds 50
  python benchmarks/matmul_q_cpu.py --shape 2048 8192
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx


def naive(x, q, s):
  """The dequantize-then-dot a user writes: materialises ``f32[k, n]``."""
  return x @ (q.astype(jnp.float32) * s[:, None])


def f32_matmul(x, w):
  """The dense f32 matmul on the dequantized weight."""
  return x @ w


def hx_matmul_q(x, q, s):
  """hxmlir's ``matmul_q`` (its CPU lowering streams the int8 weight)."""
  return hx.matmul_q(x, hx.QArray(q, s))


def _compile(fn, *args):
  if fn is hx_matmul_q:
    qw = hx.QArray(args[1], args[2])
    c = jax.jit(hx.matmul_q).lower(args[0], qw).compile()
    return c, (args[0], qw)
  c = jax.jit(fn).lower(*args).compile()
  return c, args


FLUSH_BYTES = 96 * 2**20  # 3x the 32 MiB L3 of the development machine


def measure(m: int, k: int, n: int, rounds: int, seed: int = 0,
            warm: bool = False) -> dict[str, tuple[float, int]]:
  """``{variant: (median seconds per call, temp bytes)}`` for one shape."""
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.integers(-127, 128, (k, n), dtype=np.int8))
  s = jnp.asarray(rng.uniform(0.001, 0.02, k).astype(np.float32))
  w = jax.jit(lambda q, s: q.astype(jnp.float32) * s[:, None])(q, s)
  x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
  variants = {"naive": (naive, (x, q, s)), "hx": (hx_matmul_q, (x, q, s)),
              "f32": (f32_matmul, (x, w))}
  compiled = {}
  for name, (fn, args) in variants.items():
    c, cargs = _compile(fn, *args)
    c(*cargs).block_until_ready()  # warm up
    compiled[name] = (c, cargs)
  ys = {name: np.asarray(c(*a)) for name, (c, a) in compiled.items()}
  scale = np.abs(ys["f32"]).max()
  for name in ("naive", "hx"):
    err = np.abs(ys[name] - ys["f32"]).max() / scale
    if err > 1e-4:
      raise AssertionError(f"{name} differs from f32 by {err:.2e} (relative) at m={m}")
  times = {name: [] for name in compiled}
  flush_buf = jnp.ones((FLUSH_BYTES // 4,), jnp.float32)
  flush = jax.jit(jnp.sum)
  names = list(compiled)
  for r in range(rounds):
    for name in names[r % 3:] + names[:r % 3]:  # each variant follows each other as often
      c, a = compiled[name]
      if not warm:
        flush(flush_buf).block_until_ready()
      t0 = time.perf_counter()
      c(*a).block_until_ready()
      times[name].append(time.perf_counter() - t0)
  return {name: (statistics.median(times[name]),
                 compiled[name][0].memory_analysis().temp_size_in_bytes) for name in compiled}


def _mib(b: int) -> str:
  return f"{b / 2**20:.2f}"


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--m", type=int, nargs="+", default=[1, 4, 16, 64, 256])
  ap.add_argument("--k", type=int, default=4096)
  ap.add_argument("--n", type=int, default=4096)
  ap.add_argument("--shape", type=int, nargs=2, metavar=("K", "N"), action="append",
                  help="extra non-square weight shapes, run at m = 1 and 16 "
                       "(default: 2048 8192)")
  ap.add_argument("--rounds", type=int, default=30)
  ap.add_argument("--warm", action="store_true",
                  help="do not evict the caches between calls")
  args = ap.parse_args(argv)
  extra = args.shape if args.shape is not None else [(2048, 8192)]
  cases = [(m, args.k, args.n) for m in args.m]
  cases += [(m, k, n) for k, n in extra for m in (1, 16)]

  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs, "
        f"median of {args.rounds} interleaved rounds, "
        f"{'warm caches' if args.warm else 'caches evicted before each call'}")
  head = (f"{'m':>4} {'k':>5} {'n':>5} | {'naive ms':>9} {'hx ms':>8} {'f32 ms':>8} | "
          f"{'hx/f32':>6} {'naive/hx':>8} | {'temp MiB naive':>14} {'hx':>6} {'f32':>6} "
          f"{'hx/w32':>6} | targets")
  print(head)
  print("-" * len(head))
  for m, k, n in cases:
    r = measure(m, k, n, args.rounds, warm=args.warm)
    (tn, mn), (th, mh), (tf, mf) = r["naive"], r["hx"], r["f32"]
    w32 = 4 * k * n
    ok_time = th / tf <= (1.0 if m <= 16 else 1.3)
    ok_naive = m != 1 or tn / th >= 6
    ok_mem = mh <= w32 / 8
    marks = " ".join(f"{name}{'+' if ok else '-'}" for name, ok in
                     (("time", ok_time), ("naive", ok_naive), ("mem", ok_mem)))
    print(f"{m:>4} {k:>5} {n:>5} | {tn * 1e3:>9.2f} {th * 1e3:>8.2f} {tf * 1e3:>8.2f} | "
          f"{th / tf:>6.2f} {tn / th:>8.1f} | {_mib(mn):>14} {_mib(mh):>6} {_mib(mf):>6} "
          f"{mh / w32:>6.3f} | {marks}", flush=True)


if __name__ == "__main__":
  main()
