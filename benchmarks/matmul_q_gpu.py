"""GPU timings of hxmlir's Pallas ``matmul_q`` kernel, per weight format, against XLA's bf16 and f32 matmuls.

At decode shapes (``x: f32[m, k]``, ``m`` in 1, 16, 64; weight ``k = n = 8192``)
a matmul is bound by the bytes of the weight it reads, so the table prints, per
format and variant, the time per call, the bytes it must move (weight values +
scales + x + result), the achieved bandwidth and that bandwidth as a fraction of
the device's peak:

- formats (``--formats``, default every one): ``int8`` (1 byte per element, one
  f32 scale per row), ``int4`` (half a byte, two values per ``uint8``), ``fp8``
  (``float8_e4m3fn``, 1 byte), each per row or with ``:gG`` group scales
  (``int4:g128``: one f32 scale per 128 elements, ``hxmlir/formats.py``);
- ``pallas``: ``matmul_q_pallas(x, q, s, backend="triton")`` on the weight's
  components, dequantized tile by tile (kernel ``hx_matmul_q_v1`` for int8 per
  row, ``hx_matmul_q_v2`` otherwise; ``lowering/matmul_q_pallas.py``);
- ``hx``: ``jax.jit(hx.matmul_q)`` while hxmlir is installed (the cuda lowering
  rule picks the same kernel; a check that the rule is wired);
- ``bf16``: XLA's ``x.astype(bf16) @ w_bf16`` (2 bytes per weight element), and
  ``f32``: XLA's ``x @ w`` (4 bytes per element), once per ``m``.

The error column is the largest difference from ``x @ dequantize(q)`` computed by
XLA in f32 at ``Precision.HIGHEST``, relative to that product's largest entry.
Times are medians over interleaved rounds (all variants called in turn), each
call synchronised with ``block_until_ready``. Peak bandwidth comes from a table
of known devices or ``--peak-gbps``.

No GPU has been lent to this project, so these figures have never been taken.
On a machine without a GPU the script says so and exits; ``--dry-run`` then
builds every format's operands at the given shapes, lowers the kernel and
``hx.matmul_q`` for ``cuda`` and prints their custom calls (no timing), and
``--interpret`` runs the whole table with the kernel in Pallas interpret mode
(which checks the script; its times mean nothing). Usage::

  python benchmarks/matmul_q_gpu.py                     # every format; m = 1 16 64, k = n = 8192
  python benchmarks/matmul_q_gpu.py --formats int8 int4:g128 --m 1 --k 4096 --n 11008
  python benchmarks/matmul_q_gpu.py --blocks 16 128 256 # (block_m, block_n, block_k)
  python benchmarks/matmul_q_gpu.py --dry-run --k 1024 --n 1024   # CPU-only machines
  python benchmarks/matmul_q_gpu.py --interpret --m 1 --k 256 --n 256 --rounds 2  # the same
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir import formats
from hxmlir.lowering import matmul_q_pallas as mqp

# Peak HBM bandwidth in GB/s (vendor data sheets), matched against device_kind.
PEAK_GBPS = {
    "H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "GH200": 4000,
    "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864, "L4": 300,
    "A10G": 600, "A10": 600, "V100": 900, "T4": 320, "RTX 4090": 1008, "RTX 3090": 936,
    "B200": 8000,
}

DEFAULT_FORMATS = ("int8", "int4", "int4:g128", "fp8", "int8:g128")
_ALIASES = {"fp8": "float8_e4m3fn"}
_FORMAT_RE = re.compile(r"^(?P<name>[a-z0-9_]+)(?::g(?P<group>[0-9]+))?$")


def parse_format(text: str) -> tuple[str, int | None]:
  """``"int4:g128"`` -> ``("int4", 128)``, ``"fp8"`` -> ``("float8_e4m3fn", None)``
  (argparse type; raises ``argparse.ArgumentTypeError`` naming the known formats)."""
  m = _FORMAT_RE.match(text)
  name = _ALIASES.get(m["name"], m["name"]) if m else None
  if name not in formats.FORMATS:
    raise argparse.ArgumentTypeError(
        f"unknown format {text!r}: give NAME or NAME:gG with NAME one of "
        f"{', '.join([*formats.FORMATS, *_ALIASES])} (e.g. int4:g128)")
  return name, int(m["group"]) if m["group"] else None


def format_label(fmt: tuple[str, int | None]) -> str:
  """``("int4", 128)`` -> ``"q4:g128"``, the type's prefix and group."""
  name, group = fmt
  return formats.FORMATS[name].prefix + ("" if group is None else f":g{group}")


def peak_gbps(device) -> float | None:
  """The device's peak memory bandwidth in GB/s from :data:`PEAK_GBPS`, or ``None``."""
  kind = device.device_kind
  for key in sorted(PEAK_GBPS, key=len, reverse=True):
    if key.lower() in kind.lower():
      return float(PEAK_GBPS[key])
  return None


def _dense(m: int, k: int, n: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  w = jnp.asarray(rng.standard_normal((k, n)).astype(np.float32) * 0.02)
  x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
  return x, w


def quantized(w32, fmt: tuple[str, int | None]):
  """``hx.quantize(w32, name, group_size=group)`` and its bytes at rest (values + scales).
  Raises ``TypeError`` (hxmlir's, naming the type) when ``n`` is not a multiple of the group."""
  name, group = fmt
  qw = hx.quantize(w32, jnp.dtype(name), group_size=group)
  return qw, sum(int(np.prod(c.shape)) * c.dtype.itemsize for c in hx.qarray_parts(qw))


def _interleaved(calls: dict, rounds: int) -> dict:
  for fn, args in calls.values():
    jax.block_until_ready(fn(*args))  # compile and warm up
  times = {key: [] for key in calls}
  for _ in range(rounds):
    for key, (fn, args) in calls.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[key].append(time.perf_counter() - t0)
  return {key: statistics.median(t) for key, t in times.items()}


def _highest(x, w):
  return jnp.matmul(x, w, precision="highest")


def run(ms, k, n, rounds, blocks, peak, fmts, interpret: bool = False) -> None:
  """Times and prints every variant for each ``m`` (``interpret``: the kernel in Pallas
  interpret mode, on any device: checks the script, its figures mean nothing)."""
  dev = jax.devices()[0]
  print(f"jax {jax.__version__}, {dev.device_kind}, peak {peak or '?'} GB/s, "
        f"median of {rounds} interleaved rounds, blocks {blocks or 'default'}")
  head = (f"{'m':>4} {'k':>6} {'n':>6} | {'format':>9} {'variant':>7} {'us':>9} "
          f"{'MB moved':>9} {'GB/s':>8} {'of peak':>7} | {'max rel err':>11}")
  print(head)
  print("-" * len(head))
  pallas = jax.jit(lambda x, q, s: mqp.matmul_q_pallas(x, q, s, backend="triton", blocks=blocks,
                                                       interpret=interpret))
  hx_mm, f32_mm = jax.jit(hx.matmul_q), jax.jit(_highest)
  bf16_mm = jax.jit(lambda x, w: (x.astype(jnp.bfloat16) @ w).astype(jnp.float32))
  for m in ms:
    x, w32 = _dense(m, k, n)
    io = 4 * (m * k + m * n)
    calls = {("bf16", "-"): (bf16_mm, (x, w32.astype(jnp.bfloat16))),
             ("f32", "-"): (f32_mm, (x, w32))}
    moved = {("bf16", "-"): 2 * k * n + io, ("f32", "-"): 4 * k * n + io}
    want = {}
    for fmt in fmts:
      label = format_label(fmt)
      qw, nbytes = quantized(w32, fmt)
      calls[("pallas", label)] = (pallas, (x, *hx.qarray_parts(qw)))
      calls[("hx", label)] = (hx_mm, (x, qw))
      moved[("pallas", label)] = moved[("hx", label)] = nbytes + io
      want[label] = np.asarray(f32_mm(x, hx.dequantize(qw)))
    with hx.installed():
      ts = _interleaved(calls, rounds)
      ys = {key: np.asarray(fn(*args)) for key, (fn, args) in calls.items()}
    for (variant, label), t in ts.items():
      ref = want[label] if label in want else ys[("f32", "-")]
      gbps = moved[(variant, label)] / t / 1e9
      frac = f"{gbps / peak:7.2f}" if peak else f"{'?':>7}"
      err = np.abs(ys[(variant, label)] - ref).max() / np.abs(ref).max()
      print(f"{m:>4} {k:>6} {n:>6} | {label:>9} {variant:>7} {t * 1e6:>9.1f} "
            f"{moved[(variant, label)] / 1e6:>9.1f} {gbps:>8.1f} {frac} | {err:>11.2e}",
            flush=True)


def dry_run(m: int, k: int, n: int, blocks, fmts) -> None:
  """Builds every format's operands and lowers the kernel and ``hx.matmul_q`` for cuda on
  any machine (no GPU needed); prints each one's bytes and custom calls."""
  x, w32 = _dense(m, k, n)
  for fmt in fmts:
    qw, nbytes = quantized(w32, fmt)
    q, s = hx.qarray_parts(qw)
    f = jax.jit(lambda x, q, s: mqp.matmul_q_pallas(x, q, s, backend="triton", blocks=blocks))
    kernel = f.trace(x, q, s).lower(lowering_platforms=("cuda",)).as_text()
    with hx.installed():
      rule = jax.jit(hx.matmul_q).trace(x, qw).lower(lowering_platforms=("cuda",)).as_text()
    names = sorted(set(re.findall(r'name = "(hx_matmul_q_v[0-9]+)"', kernel)))
    in_rule = sorted(set(re.findall(r'name = "(hx_matmul_q_v[0-9]+)"', rule)))
    print(f"{format_label(fmt):>9} {str(jax.typeof(qw)):>20} {nbytes / 1e6:8.2f} MB at rest; "
          f"lowered for cuda: kernel {', '.join(names) or 'none'}; "
          f"hx.matmul_q (installed) calls {', '.join(in_rule) or 'the reference'}")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--m", type=int, nargs="+", default=[1, 16, 64])
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--rounds", type=int, default=100)
  ap.add_argument("--blocks", type=int, nargs=3, metavar=("BM", "BN", "BK"))
  ap.add_argument("--peak-gbps", type=float, help="peak memory bandwidth (default: table)")
  ap.add_argument("--formats", type=parse_format, nargs="+",
                  default=[parse_format(f) for f in DEFAULT_FORMATS], metavar="FMT",
                  help="weight formats: int8, int4, fp8 (float8_e4m3fn), each optionally "
                       f":gG for group scales (default: {' '.join(DEFAULT_FORMATS)})")
  ap.add_argument("--interpret", action="store_true",
                  help="run the kernel in Pallas interpret mode on the default device (to "
                       "check the script without a GPU; the times mean nothing)")
  ap.add_argument("--dry-run", "--check-lowering", action="store_true", dest="dry_run",
                  help="no timing: build the operands and lower for cuda (works without a GPU)")
  args = ap.parse_args(argv)
  blocks = tuple(args.blocks) if args.blocks else None
  bad = [format_label(f) for f in args.formats if f[1] is not None and args.n % f[1]]
  if bad:
    ap.error(f"--n {args.n} is not a multiple of the group size of {', '.join(bad)}")
  if args.dry_run:
    dry_run(args.m[0], args.k, args.n, blocks, args.formats)
    return 0
  try:
    gpus = jax.devices("gpu")
  except RuntimeError:
    gpus = []
  if args.interpret:
    run(args.m, args.k, args.n, args.rounds, blocks, args.peak_gbps, args.formats, True)
    return 0
  if not gpus:
    print("no GPU visible to JAX: nothing to time on this machine (--dry-run lowers for cuda).")
    return 0
  run(args.m, args.k, args.n, args.rounds, blocks, args.peak_gbps or peak_gbps(gpus[0]),
      args.formats)
  return 0


if __name__ == "__main__":
  sys.exit(main())
