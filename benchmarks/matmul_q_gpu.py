"""GPU timings of hxmlir's Pallas ``matmul_q`` kernels, per weight format, against XLA's bf16 and f32 matmuls.

At decode shapes (``x: f32[m, k]``, ``m`` in 1, 16, 64; weight ``k = n = 8192``)
a matmul is bound by the bytes of the weight it reads, so the table prints, per
format and variant, the time per call, the bytes it must move (weight values +
scales (+ offsets) + x + result), the achieved bandwidth and that bandwidth as a
fraction of the device's peak. Two weight layouts (``--layout``):

- ``kn`` (default): ``W[in, out] = Q[k, n]``, quantized along ``n``: ``x @ w``, kernels
  ``hx_matmul_q_v1``/``v2``, shape ``--k``/``--n``;
- ``nk``: the checkpoint layout ``W[out, in] = Q[n, k]`` with groups along the
  contraction (GGUF, torch ``Linear``): ``hx.einsum("...k,nk->...n", x, w)``, kernel
  ``hx_matmul_q_nk_v1`` (``matmul_q_nk_pallas``). Defaults: SmolLM2-135M's projections
  and a 4096 x 4096 one (``--shapes`` OUTxIN: 576x576, 192x576, 1536x576, 576x1536,
  49152x576, 4096x4096), ``m`` = 1, 16, 256, and GGUF's block formats as loaded by
  :mod:`hxmlir.gguf`: Q8_0-like ``int8_f16:g32`` (``q8[..:g32,f16]``), Q4_0-like
  ``int4_f16:g32`` and Q4_1-like ``uint4_f16:g32`` (``u4o``, with an offset); the dense
  baselines multiply by the first format's dequantized weight (transposed by XLA).

- formats (``--formats``, default every one): ``int8`` (1 byte per element, one
  f32 scale per row), ``int4`` (half a byte, two values per ``uint8``), ``fp8``
  (``float8_e4m3fn``, 1 byte), each per row or with ``:gG`` group scales
  (``int4:g128``: one f32 scale per 128 elements, ``hxmlir/formats.py``);
- ``pallas``: ``matmul_q_pallas(x, q, s, backend="triton")`` on the weight's
  components, dequantized tile by tile (kernel ``hx_matmul_q_v1`` for int8 per
  row, ``hx_matmul_q_v2`` otherwise; ``lowering/matmul_q/pallas/``);
- ``hx``: ``jax.jit(hx.matmul_q)`` while hxmlir is installed (the cuda lowering
  rule picks the same kernel; a check that the rule is wired);
- ``bf16``: XLA's ``x.astype(bf16) @ w_bf16`` (2 bytes per weight element), and
  ``f32``: XLA's ``x @ w`` (4 bytes per element), once per ``m``.

The error column is the largest difference from ``x @ dequantize(q)`` computed by
XLA in f32 at ``Precision.HIGHEST``, relative to that product's largest entry.
Times are medians over interleaved rounds (all variants called in turn), each
call synchronised with ``block_until_ready``. Peak bandwidth comes from a table
of known devices or ``--peak-gbps``.

GGUF's block formats at the file's bytes (Q4_K ... IQ4_XS) have a Triton kernel of their
own, timed by ``benchmarks/matmul_q_blocks_pallas.py``.

No GPU has been lent to this project, so these figures have never been taken.
On a machine without a GPU the script says so and exits; ``--dry-run`` then
builds every format's operands at the given shapes, lowers the kernel and
``hx.matmul_q`` for ``cuda`` and prints their custom calls (no timing), and
``--interpret`` runs the whole table with the kernel in Pallas interpret mode
(which checks the script; its times mean nothing). Usage::

  python benchmarks/matmul_q_gpu.py                     # every format; m = 1 16 64, k = n = 8192
  python benchmarks/matmul_q_gpu.py --formats int8 int4:g128 --m 1 --k 4096 --n 11008
  python benchmarks/matmul_q_gpu.py --blocks 16 128 256 # (block_m, block_n, block_k)
  python benchmarks/matmul_q_gpu.py --layout nk         # SmolLM2's shapes, GGUF formats
  python benchmarks/matmul_q_gpu.py --layout nk --shapes 4096x4096 --m 1 --formats uint4_f16:g32
  python benchmarks/matmul_q_gpu.py --dry-run --k 1024 --n 1024   # CPU-only machines
  python benchmarks/matmul_q_gpu.py --dry-run --layout nk --m 1   # the same, [out, in]
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
from hxmlir.lowering.matmul_q import pallas as mqp

# Peak HBM bandwidth in GB/s (vendor data sheets), matched against device_kind.
PEAK_GBPS = {
    "H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "GH200": 4000,
    "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864, "L4": 300,
    "A10G": 600, "A10": 600, "V100": 900, "T4": 320, "RTX 4090": 1008, "RTX 3090": 936,
    "B200": 8000,
}

DEFAULT_FORMATS = ("int8", "int4", "int4:g128", "fp8", "int8:g128")
NK_FORMATS = ("int8_f16:g32", "int4_f16:g32", "uint4_f16:g32")
"""``--layout nk``'s default formats: GGUF's Q8_0, Q4_0 and Q4_1 as :mod:`hxmlir.gguf` loads them."""
NK_SHAPES = ("576x576", "192x576", "1536x576", "576x1536", "49152x576", "4096x4096")
"""``--layout nk``'s default weights ``OUTxIN``: SmolLM2-135M's q/o, k/v, gate/up, down and
tied-head projections, and a 4096 x 4096 one."""
DEFAULT_M = {"kn": (1, 16, 64), "nk": (1, 16, 256)}
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
  """``("int4", 128)`` -> ``"q4:g128"``, the type's prefix and options
  (``("uint4_f16", 32)`` -> ``"u4o:g32,f16"``)."""
  name, group = fmt
  f = formats.FORMATS[name]
  return f.prefix + formats.type_options(f, group)


def peak_gbps(device) -> float | None:
  """The device's peak memory bandwidth in GB/s from :data:`PEAK_GBPS`, or ``None``."""
  kind = device.device_kind
  for key in sorted(PEAK_GBPS, key=len, reverse=True):
    if key.lower() in kind.lower():
      return float(PEAK_GBPS[key])
  return None


def parse_shape(text: str) -> tuple[int, int]:
  """``"1536x576"`` -> ``(1536, 576)`` (argparse type; ``--layout nk``: ``OUTxIN``)."""
  m = re.match(r"^([0-9]+)x([0-9]+)$", text)
  if not m:
    raise argparse.ArgumentTypeError(f"shape {text!r}: give ROWSxCOLS (e.g. 1536x576)")
  return int(m[1]), int(m[2])


def _dense(m: int, k: int, n: int, seed: int = 0, layout: str = "kn"):
  """``x: f32[m, k]`` and an f32 weight ``[k, n]`` (``layout="nk"``: ``[n, k]``)."""
  rng = np.random.default_rng(seed)
  w = jnp.asarray(rng.standard_normal((k, n) if layout == "kn" else (n, k)).astype(np.float32)
                  * 0.02)
  x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
  return x, w


def quantized(w32, fmt: tuple[str, int | None]):
  """``w32`` quantized along its last axis in format ``fmt`` and its bytes at rest (values +
  scales + offsets): ``hx.quantize(w32, name, group_size=group)``; a format with f16
  scales (GGUF's blocks) is its f32 twin's components with the scales (and offsets)
  rounded to f16, an offset format's twin quantized with ``method="minmax"``. Raises
  ``TypeError`` (hxmlir's, naming the type) when the axis is not a multiple of the group."""
  name, group = fmt
  f = formats.FORMATS[name]
  base = name.removesuffix("_f16")
  qw = hx.quantize(w32, base, group_size=group, method="minmax" if f.offset else "absmax")
  if f.scale_dtype != np.float32:
    v, *rest = hx.qarray_parts(qw)
    qw = hx.make_qarray(v, *(c.astype(f.scale_dtype) for c in rest))
  return qw, sum(int(np.prod(c.shape)) * c.dtype.itemsize for c in hx.qarray_parts(qw))


def _einsum_nk(x, w):
  return hx.einsum("...k,nk->...n", x, w)


def _kernel_fn(layout: str, blocks, interpret: bool = False):
  """The Pallas kernel of ``layout`` on the weight's components, jitted (Triton flavour)."""
  if layout == "nk":
    return jax.jit(lambda x, *c: mqp.matmul_q_nk_pallas(x, *c, backend="triton", blocks=blocks,
                                                        interpret=interpret))
  return jax.jit(lambda x, q, s: mqp.matmul_q_pallas(x, q, s, backend="triton", blocks=blocks,
                                                     interpret=interpret))


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


def _highest_nk(x, w):
  return jnp.matmul(x, w.T, precision="highest")


def run(ms, shapes, rounds, blocks, peak, fmts, interpret: bool = False,
        layout: str = "kn") -> None:
  """Times and prints every variant for each ``m`` and weight shape (``shapes``: ``(k, n)``
  pairs; ``interpret``: the kernel in Pallas interpret mode, on any device: checks the
  script, its figures mean nothing)."""
  dev = jax.devices()[0]
  print(f"jax {jax.__version__}, {dev.device_kind}, peak {peak or '?'} GB/s, "
        f"median of {rounds} interleaved rounds, blocks {blocks or 'default'}, "
        f"layout {layout} ({formats.WEIGHT_LAYOUTS[layout].split(':')[0]})")
  head = (f"{'m':>4} {'k':>6} {'n':>6} | {'format':>14} {'variant':>7} {'us':>9} "
          f"{'MB moved':>9} {'GB/s':>8} {'of peak':>7} | {'max rel err':>11}")
  print(head)
  print("-" * len(head))
  pallas = _kernel_fn(layout, blocks, interpret)
  nk = layout == "nk"
  hx_mm = jax.jit(_einsum_nk if nk else hx.matmul_q)
  f32_mm = jax.jit(_highest_nk if nk else _highest)
  bf16_mm = jax.jit(lambda x, w: (x.astype(jnp.bfloat16) @ (w.T if nk else w))
                    .astype(jnp.float32))
  for k, n in shapes:
    for m in ms:
      x, w32 = _dense(m, k, n, layout=layout)
      io = 4 * (m * k + m * n)
      calls, moved, want = {}, {}, {}
      for fmt in fmts:
        label = format_label(fmt)
        qw, nbytes = quantized(w32, fmt)
        if not calls:  # XLA's dense products on the dequantized weight
          dense = hx.dequantize(qw)
          calls = {("bf16", "-"): (bf16_mm, (x, dense.astype(jnp.bfloat16))),
                   ("f32", "-"): (f32_mm, (x, dense))}
          moved = {("bf16", "-"): 2 * k * n + io, ("f32", "-"): 4 * k * n + io}
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
        print(f"{m:>4} {k:>6} {n:>6} | {label:>14} {variant:>7} {t * 1e6:>9.1f} "
              f"{moved[(variant, label)] / 1e6:>9.1f} {gbps:>8.1f} {frac} | {err:>11.2e}",
              flush=True)


_KERNEL_NAMES = re.compile(r'name = "(hx_matmul_q(?:_nk)?_v[0-9]+)"')


def dry_run(m: int, shapes, blocks, fmts, layout: str = "kn") -> None:
  """Builds every format's operands and lowers the kernel of ``layout`` and ``hx.matmul_q``
  (``"nk"``: ``hx.einsum("...k,nk->...n")``) for cuda on any machine (no GPU needed);
  prints each one's bytes and custom calls."""
  for k, n in shapes:
    x, w32 = _dense(m, k, n, layout=layout)
    for fmt in fmts:
      qw, nbytes = quantized(w32, fmt)
      parts = hx.qarray_parts(qw)
      kernel = _kernel_fn(layout, blocks).trace(x, *parts).lower(
          lowering_platforms=("cuda",)).as_text()
      with hx.installed():
        rule = jax.jit(_einsum_nk if layout == "nk" else hx.matmul_q).trace(x, qw).lower(
            lowering_platforms=("cuda",)).as_text()
      names = sorted(set(_KERNEL_NAMES.findall(kernel)))
      in_rule = sorted(set(_KERNEL_NAMES.findall(rule)))
      op = "hx.einsum" if layout == "nk" else "hx.matmul_q"
      print(f"{format_label(fmt):>14} {str(jax.typeof(qw)):>24} {nbytes / 1e6:8.2f} MB at rest; "
            f"lowered for cuda: kernel {', '.join(names) or 'none'}; "
            f"{op} (installed) calls {', '.join(in_rule) or 'the reference'}")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layout", choices=sorted(formats.WEIGHT_LAYOUTS), default="kn",
                  help="weight layout: kn = W[in, out] (x @ w), nk = W[out, in] with groups "
                       "along the contraction (hx.einsum('...k,nk->...n'))")
  ap.add_argument("--m", type=int, nargs="+",
                  help="rows of x (default: 1 16 64; --layout nk: 1 16 256)")
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--shapes", type=parse_shape, nargs="+", metavar="OUTxIN",
                  help="--layout nk: weights [out, in] (default: "
                       f"{' '.join(NK_SHAPES)}); --layout kn uses --k/--n")
  ap.add_argument("--rounds", type=int, default=100)
  ap.add_argument("--blocks", type=int, nargs=3, metavar=("BM", "BN", "BK"))
  ap.add_argument("--peak-gbps", type=float, help="peak memory bandwidth (default: table)")
  ap.add_argument("--formats", type=parse_format, nargs="+", metavar="FMT",
                  help="weight formats: int8, int4, fp8 (float8_e4m3fn), ... (hxmlir.formats), "
                       "each optionally :gG for group scales (default: "
                       f"{' '.join(DEFAULT_FORMATS)}; --layout nk: {' '.join(NK_FORMATS)})")
  ap.add_argument("--interpret", action="store_true",
                  help="run the kernel in Pallas interpret mode on the default device (to "
                       "check the script without a GPU; the times mean nothing)")
  ap.add_argument("--dry-run", "--check-lowering", action="store_true", dest="dry_run",
                  help="no timing: build the operands and lower for cuda (works without a GPU)")
  args = ap.parse_args(argv)
  blocks = tuple(args.blocks) if args.blocks else None
  nk = args.layout == "nk"
  fmts = args.formats or [parse_format(f) for f in (NK_FORMATS if nk else DEFAULT_FORMATS)]
  ms = args.m or list(DEFAULT_M[args.layout])
  if nk:  # OUTxIN -> (k, n)
    shapes = [(i, o) for o, i in (args.shapes or [parse_shape(t) for t in NK_SHAPES])]
  elif args.shapes:
    ap.error("--shapes is for --layout nk; --layout kn takes --k and --n")
  else:
    shapes = [(args.k, args.n)]
  for k, n in shapes:
    bad = [format_label(f) for f in fmts if f[1] is not None and (k if nk else n) % f[1]]
    if bad:
      what = f"the in axis of weight {n}x{k}" if nk else "--n"
      ap.error(f"{what} ({k if nk else n}) is not a multiple of the group size of "
               f"{', '.join(bad)}")
  if args.dry_run:
    dry_run(ms[0], shapes, blocks, fmts, args.layout)
    return 0
  try:
    gpus = jax.devices("gpu")
  except RuntimeError:
    gpus = []
  if args.interpret:
    run(ms, shapes, args.rounds, blocks, args.peak_gbps, fmts, True, args.layout)
    return 0
  if not gpus:
    print("no GPU visible to JAX: nothing to time on this machine (--dry-run lowers for cuda).")
    return 0
  run(ms, shapes, args.rounds, blocks, args.peak_gbps or peak_gbps(gpus[0]), fmts,
      layout=args.layout)
  return 0


if __name__ == "__main__":
  sys.exit(main())
