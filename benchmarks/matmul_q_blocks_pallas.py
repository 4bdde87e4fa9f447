"""TPU and GPU timings of the block formats' Pallas kernels (``hx_matmul_q_nk_blocks_v1``) per GGUF format.

For each format of :data:`hxmlir.formats.BLOCK_FORMATS` and each weight ``W[n, k]`` (``--shapes``
OUTxIN, default 4096x4096 and 16384x4096) the script builds a weight of random valid blocks. At
each ``m`` (``--m``, default 1 and 16) it prints:

- the time per call of the kernel (``matmul_q_nk_blocks_pallas``: Mosaic on a TPU, Triton on
  a GPU);
- ``hx.einsum`` jitted while hxmlir is installed (the tpu and cuda rules: the reference
  decomposition);
- XLA decoding the blocks (``hx.dequantize``) and multiplying in f32 (``ref``);
- XLA's bf16 product with the dense weight;
- a trivial jitted call (the floor of a dispatch on this machine);
- the kernel's GB/s of weight bytes, and the largest error against float64 relative to
  ``|x|·|W|`` of the kernel and of ``hx.einsum`` (on a TPU the latter is XLA's dot at JAX's
  default precision: bf16 passes at m > 1, errors near 2^-12).

Times are medians over interleaved rounds, each call synchronised
(:func:`hxmlir.tools.demo.time_interleaved`). Without a TPU or GPU the script
says so and exits; ``--interpret`` runs a kernel (``--backend``, default Mosaic's) in Pallas
interpret mode on any machine (a check of the script: its times mean nothing). Usage::

  python benchmarks/matmul_q_blocks_pallas.py                    # on a TPU or a GPU
  python benchmarks/matmul_q_blocks_pallas.py --formats q4_k q6_k --shapes 4096x4096 --m 1
  python benchmarks/matmul_q_blocks_pallas.py --interpret --backend triton --shapes 256x512
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir import block_layout, formats
from hxmlir.lowering.matmul_q.pallas import nk_blocks
from hxmlir.tools.demo import time_interleaved

PEAK_GBPS = {"TPU v5 lite": 819, "TPU v5e": 819, "TPU v4": 1200, "TPU v5p": 2765,
             "TPU v6 lite": 1640, "H200": 4800, "H100": 3350, "A100": 2039}
"""Peak HBM bandwidth in GB/s (Google's and NVIDIA's data sheets; H100 SXM, A100 80GB),
matched against ``device_kind``."""
BACKEND = {"tpu": "mosaic_tpu", "gpu": "triton"}
"""The Pallas backend of each JAX platform timed here."""


def _shape(text: str) -> tuple[int, int]:
  o, i = text.lower().split("x")
  return int(o), int(i)


def _weight(name: str, n: int, k: int, rs):
  """A weight ``name[n, k]`` of random valid blocks, its float64 dense value and bytes."""
  lay = block_layout.LAYOUTS[name]
  f = formats.FORMATS[name]
  nblk = k // lay.block
  by = rs.randint(0, 256, size=(n, nblk, lay.nbytes)).astype(np.uint8)
  heads = [(rs.randn(n, nblk) * 0.02).astype(np.float16) for _ in range(2 if f.offset else 1)]
  u, v = block_layout.decode(by, lay)
  dense = u.astype(np.float64) * heads[0].astype(np.float64)[..., None]
  if v is not None:
    dense += v.astype(np.float64) * heads[1].astype(np.float64)[..., None]
  w = hx.make_qarray(jnp.asarray(by.view(np.uint16)), *map(jnp.asarray, heads))
  return w, dense.reshape(n, k), by.nbytes + sum(h.nbytes for h in heads)


def _median_times(calls: dict, rounds: int) -> dict:
  """Median seconds per call of each ``calls[key] = (fn, args)``, in interleaved rounds."""
  ts = time_interleaved({key: functools.partial(fn, *args) for key, (fn, args) in calls.items()},
                        rounds)
  return {key: statistics.median(t) for key, t in ts.items()}


def run(names, shapes, ms, rounds: int, interpret: bool, backend: str) -> None:
  dev = jax.devices()[0]
  peak = next((v for k, v in PEAK_GBPS.items() if k.lower() in dev.device_kind.lower()), None)
  print(f"jax {jax.__version__}, {dev.device_kind}, {backend} kernel, peak {peak or '?'} GB/s, median of "
        f"{rounds} interleaved rounds{', INTERPRET MODE (times mean nothing)' if interpret else ''}")
  head = (f"{'format':>7} {'n':>6} {'k':>6} {'m':>4} | {'kernel us':>9} {'GB/s':>6} "
          f"{'of peak':>7} | {'hx us':>7} {'ref us':>7} {'bf16 us':>7} {'floor us':>8} | "
          f"{'kernel err':>10} {'hx err':>8}")
  print(head)
  print("-" * len(head))
  kern = jax.jit(lambda x, *c: nk_blocks.matmul_q_nk_blocks_pallas(
      x, *c, backend=backend, interpret=interpret))
  hx_fn = jax.jit(lambda x, w: hx.einsum("mk,nk->mn", x, w))
  ref_fn = jax.jit(lambda x, w: jnp.dot(x, hx.dequantize(w).T))
  bf16 = jax.jit(lambda x, w: jnp.dot(x.astype(jnp.bfloat16), w.T,
                                      preferred_element_type=jnp.float32))
  floor = jax.jit(lambda x: x + 1)
  rs = np.random.RandomState(0)
  for name in names:
    for n, k in shapes:
      w, dense, nbytes = _weight(name, n, k, rs)
      wd = jnp.asarray(dense, jnp.bfloat16)
      for m in ms:
        x = jnp.asarray(rs.randn(m, k).astype(np.float32))
        calls = {"kernel": (kern, (x, *hx.qarray_parts(w))), "ref": (ref_fn, (x, w)),
                 "bf16": (bf16, (x, wd)), "floor": (floor, (x,))}
        if not interpret:
          calls["hx"] = (hx_fn, (x, w))
        with hx.installed():
          ts = _median_times(calls, rounds)
          y = np.asarray(kern(x, *hx.qarray_parts(w)))
          y_hx = np.asarray(hx_fn(x, w)) if not interpret else y
        x64 = np.asarray(x, np.float64)
        mag = np.abs(x64) @ np.abs(dense.T)
        err = (np.abs(y - x64 @ dense.T) / mag).max()
        err_hx = (np.abs(y_hx - x64 @ dense.T) / mag).max()
        gbps = nbytes / ts["kernel"] / 1e9
        frac = f"{gbps / peak:7.3f}" if peak else f"{'?':>7}"
        hx_us = f"{ts['hx'] * 1e6:7.0f}" if "hx" in ts else f"{'-':>7}"
        print(f"{name:>7} {n:>6} {k:>6} {m:>4} | {ts['kernel'] * 1e6:9.0f} {gbps:6.1f} {frac} "
              f"| {hx_us} {ts['ref'] * 1e6:7.0f} {ts['bf16'] * 1e6:7.0f} "
              f"{ts['floor'] * 1e6:8.0f} | {err:10.1e} {err_hx:8.1e}", flush=True)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--formats", nargs="+", default=[f.name for f in formats.BLOCK_FORMATS],
                  choices=[f.name for f in formats.BLOCK_FORMATS], metavar="FMT")
  ap.add_argument("--shapes", type=_shape, nargs="+", default=[(4096, 4096), (16384, 4096)],
                  metavar="OUTxIN")
  ap.add_argument("--m", type=int, nargs="+", default=[1, 16])
  ap.add_argument("--rounds", type=int, default=20)
  ap.add_argument("--interpret", action="store_true",
                  help="Pallas interpret mode on the default device (checks the script)")
  ap.add_argument("--backend", choices=sorted(BACKEND.values()),
                  help="the kernel to time (default: the device's; with --interpret: mosaic_tpu)")
  args = ap.parse_args(argv)
  for n, k in args.shapes:
    bad = [f for f in args.formats if k % formats.FORMATS[f].block]
    if bad:
      ap.error(f"the in axis {k} of {n}x{k} is not a multiple of the block of {', '.join(bad)}")
  platform = jax.devices()[0].platform
  if not args.interpret and platform not in BACKEND:
    print("no TPU or GPU visible to JAX: nothing to time here (--interpret checks the script).")
    return 0
  backend = args.backend or BACKEND.get(platform, "mosaic_tpu")
  run(args.formats, args.shapes, args.m, args.rounds, args.interpret, backend)
  return 0


if __name__ == "__main__":
  sys.exit(main())
