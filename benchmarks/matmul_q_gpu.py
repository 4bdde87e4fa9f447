"""GPU timings of hxmlir's Pallas ``matmul_q`` kernel against XLA's bf16 and f32 matmuls.

At decode shapes (``x: f32[m, k]``, ``m`` in 1, 16, 64; weight ``k = n = 8192``)
a matmul is bound by the bytes of the weight it reads, so the table prints,
per variant, the time per call, the bytes it must move (weight + x + result),
the achieved bandwidth and that bandwidth as a fraction of the device's peak:

- ``pallas``: ``matmul_q_pallas(x, q, s, backend="triton")`` -- int8 weight
  (1 byte per element) and f32 row scales, dequantized tile by tile;
- ``hx``: ``jax.jit(hx.matmul_q)`` while hxmlir is installed (the cuda lowering
  rule picks the same kernel; a check that the rule is wired);
- ``bf16``: XLA's ``x.astype(bf16) @ w_bf16`` (2 bytes per weight element);
- ``f32``: XLA's ``x @ w`` on the dequantized f32 weight (4 bytes per element);
- ``fmt``, with ``--dtype int4|float8_e4m3fn`` and/or ``--group-size g``:
  ``jax.jit(hx.matmul_q)`` on ``hx.quantize(w, dtype, group_size=g)`` (int4: half a
  byte per element plus the scales; on GPU such weights use the reference
  decomposition, hxmlir/formats.py; the Pallas kernel takes int8 per row).

Times are medians over interleaved rounds (all variants called in turn), each
call synchronised with ``block_until_ready``. Peak bandwidth comes from a table
of known devices or ``--peak-gbps``.

On a machine without a GPU the script says so and, with ``--check-lowering``,
only checks that the kernel lowers for ``cuda`` (no timing). Usage::

  python benchmarks/matmul_q_gpu.py                     # m = 1 16 64, k = n = 8192
  python benchmarks/matmul_q_gpu.py --m 1 --k 4096 --n 11008 --rounds 200
  python benchmarks/matmul_q_gpu.py --blocks 16 128 256 # (block_m, block_n, block_k)
  python benchmarks/matmul_q_gpu.py --dtype int4 --group-size 128   # and the fmt variant
  python benchmarks/matmul_q_gpu.py --check-lowering    # CPU-only machines
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir.lowering import matmul_q_pallas as mqp

# Peak HBM bandwidth in GB/s (vendor data sheets), matched against device_kind.
PEAK_GBPS = {
    "H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "GH200": 4000,
    "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864, "L4": 300,
    "A10G": 600, "A10": 600, "V100": 900, "T4": 320, "RTX 4090": 1008, "RTX 3090": 936,
    "B200": 8000,
}


def peak_gbps(device) -> float | None:
  """The device's peak memory bandwidth in GB/s from :data:`PEAK_GBPS`, or ``None``."""
  kind = device.device_kind
  for key in sorted(PEAK_GBPS, key=len, reverse=True):
    if key.lower() in kind.lower():
      return float(PEAK_GBPS[key])
  return None


def _operands(m: int, k: int, n: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.integers(-127, 128, (k, n), dtype=np.int8))
  s = jnp.asarray(rng.uniform(0.001, 0.02, k).astype(np.float32))
  x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
  return x, q, s


def _interleaved(calls: dict, rounds: int) -> dict[str, float]:
  for fn, args in calls.values():
    jax.block_until_ready(fn(*args))  # compile and warm up
  times = {name: [] for name in calls}
  for _ in range(rounds):
    for name, (fn, args) in calls.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - t0)
  return {name: statistics.median(t) for name, t in times.items()}


def _format_weight(w32, dtype: str, group: int | None):
  """``hx.quantize(w32, dtype, group_size=group)`` and its bytes at rest (values + scales)."""
  qw = hx.quantize(w32, jnp.dtype(dtype), group_size=group)
  return qw, sum(int(np.prod(c.shape)) * c.dtype.itemsize for c in hx.qarray_parts(qw))


def run(ms, k, n, rounds, blocks, peak, fmt=None) -> None:
  dev = jax.devices()[0]
  print(f"jax {jax.__version__}, {dev.device_kind}, peak {peak or '?'} GB/s, "
        f"median of {rounds} interleaved rounds, blocks {blocks or 'default'}")
  head = (f"{'m':>4} {'k':>6} {'n':>6} | {'variant':>7} {'us':>9} {'MB moved':>9} "
          f"{'GB/s':>8} {'of peak':>7} | {'max rel err':>11}")
  print(head)
  print("-" * len(head))
  pallas = jax.jit(lambda x, q, s: mqp.matmul_q_pallas(x, q, s, backend="triton", blocks=blocks))
  hx_mm = jax.jit(hx.matmul_q)
  for m in ms:
    x, q, s = _operands(m, k, n)
    w32 = jax.jit(lambda q, s: q.astype(jnp.float32) * s[:, None])(q, s)
    w16 = w32.astype(jnp.bfloat16)
    qw = hx.QArray(q, s)
    io = 4 * (m * k + m * n)
    calls = {
        "pallas": (pallas, (x, q, s)),
        "hx": (hx_mm, (x, qw)),
        "bf16": (jax.jit(lambda x, w: (x.astype(jnp.bfloat16) @ w).astype(jnp.float32)),
                 (x, w16)),
        "f32": (jax.jit(lambda x, w: jnp.matmul(x, w, precision="highest")), (x, w32)),
    }
    moved = {"pallas": k * n + 4 * k + io, "hx": k * n + 4 * k + io, "bf16": 2 * k * n + io,
             "f32": 4 * k * n + io}
    if fmt is not None:
      qf, nbytes = _format_weight(w32, *fmt)
      calls["fmt"] = (hx_mm, (x, qf))
      moved["fmt"] = nbytes + io
    with hx.installed():
      ts = _interleaved(calls, rounds)
      ys = {name: np.asarray(fn(*args)) for name, (fn, args) in calls.items()}
    ref = ys["f32"]
    scale = np.abs(ref).max()
    for name, t in ts.items():
      gbps = moved[name] / t / 1e9
      frac = f"{gbps / peak:7.2f}" if peak else f"{'?':>7}"
      err = np.abs(ys[name] - ref).max() / scale
      print(f"{m:>4} {k:>6} {n:>6} | {name:>7} {t * 1e6:>9.1f} {moved[name] / 1e6:>9.1f} "
            f"{gbps:>8.1f} {frac} | {err:>11.2e}", flush=True)


def check_lowering(k: int, n: int, fmt=None) -> None:
  """Lowers the kernel for cuda on any machine (no GPU needed) and prints its custom call
  (and, with a format, the ``hx.matmul_q`` composite of that format)."""
  x, q, s = _operands(1, k, n)
  if fmt is not None:
    qf, nbytes = _format_weight(jax.jit(lambda q, s: q.astype(jnp.float32) * s[:, None])(q, s),
                                *fmt)
    with hx.installed():
      text = jax.jit(hx.matmul_q).trace(x, qf).lower(lowering_platforms=("cuda",)).as_text()
    comp = [line.strip() for line in text.splitlines() if '"hx.matmul_q"' in line]
    print(f"{jax.typeof(qf)} ({nbytes / 1e6:.1f} MB at rest) lowered for cuda: {comp[0][:160]}")
  f = jax.jit(lambda x, q, s: mqp.matmul_q_pallas(x, q, s, backend="triton"))
  text = f.trace(x, q, s).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line.strip()[:120] for line in text.splitlines() if "stablehlo.custom_call" in line]
  print(f"lowered for cuda: {len(calls)} custom call(s), kernel {mqp.TRITON_KERNEL.ir_name}")
  for c in calls:
    print("  ", c, "...")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--m", type=int, nargs="+", default=[1, 16, 64])
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--rounds", type=int, default=100)
  ap.add_argument("--blocks", type=int, nargs=3, metavar=("BM", "BN", "BK"))
  ap.add_argument("--peak-gbps", type=float, help="peak memory bandwidth (default: table)")
  ap.add_argument("--dtype", choices=("int8", "int4", "float8_e4m3fn"), default="int8",
                  help="weight format of the fmt variant (hxmlir/formats.py)")
  ap.add_argument("--group-size", type=int, help="elements per scale of the fmt variant")
  ap.add_argument("--check-lowering", action="store_true",
                  help="without a GPU: only check that the kernel lowers for cuda")
  args = ap.parse_args(argv)
  fmt = None if args.dtype == "int8" and args.group_size is None else \
      (args.dtype, args.group_size)
  try:
    gpus = jax.devices("gpu")
  except RuntimeError:
    gpus = []
  if not gpus:
    print("no GPU visible to JAX: nothing to time on this machine.")
    if args.check_lowering:
      check_lowering(args.k, args.n, fmt)
    return 0
  run(args.m, args.k, args.n, args.rounds, tuple(args.blocks) if args.blocks else None,
      args.peak_gbps or peak_gbps(gpus[0]), fmt)
  return 0


if __name__ == "__main__":
  sys.exit(main())
