"""CPU timings of ``hx.matmul_q`` (native kernel and StableHLO) against dequantize-then-dot and f32.

For ``x: f32[m, k]`` and a quantized weight ``q8[k, n]`` (``i8`` values and one
f32 scale per row), times per call, side by side in one run:

- ``naive``: ``x @ (q.astype(f32) * s[:, None])``, what a user writes without
  hxmlir (XLA materialises the whole dequantized weight);
- ``hlo``: ``jax.jit(hx.matmul_q)`` without ``hx.install()``: the portable
  StableHLO lowering that streams the weight (``lowering/matmul_q/streaming.py``),
  what exported artifacts run;
- ``native``: ``jax.jit(hx.matmul_q)`` compiled while ``hx.install()`` is
  active: the native CPU kernel ``hx_matmul_q_cpu_v1`` (``csrc/``,
  ``lowering/matmul_q/cpu.py``), or the StableHLO again where it is inactive
  (the first line printed says which, and why);
- ``f32``: ``x @ w`` on the dequantized weight held as an f32 array (the
  dense model the quantized one replaces; 4x the weight bytes).

The executables are compiled first, then called in interleaved rounds (each
round in a seeded random order: each follows each other equally often on
average, as what ran before -- the allocator's state, dirty cache lines --
affects a call), so a change in machine load hits all alike; each time is the median
over rounds, and ``spread`` is the interquartile range of ``native/f32``
over rounds (a wide one means a noisy machine). Before every timed call a
read-only pass over a 96 MiB buffer evicts the caches (clean), so every
variant starts as a layer of a real model does: weights in DRAM, nothing dirty
left by the previous call (``--warm`` skips it). ``temp`` is XLA's compiled
``memory_analysis().temp_size_in_bytes`` (the kernel's own per-call buffers,
``x * s`` and for ``m <= 4`` a few ``f32[m, n]`` partial sums, are not in it).
Targets, marked in the last column: ``native/f32 <= 0.50`` at
``m = 1, 4`` (4096 x 4096), ``<= 0.75`` at ``m = 16``, ``<= 1.00`` at ``m =
64, 256`` and on the small layers (512 x 2048, 384 x 1536 at ``m = 16, 128``);
``temp <= 1/8`` of the f32 weight's bytes at every ``m`` (native column).

``--formats [FORMAT ...]`` prints, instead, one row per weight format
(``int8``, ``int4``, ``int4:g128``, ``int4:g32``, ``float8_e4m3fn``, ``int8:g128`` by
default; ``:gG`` is the group size, none is one scale per row) at each ``--m`` (default 1 and 16 there) on
``k x n``: the ``format`` column, ``hx.matmul_q`` compiled while installed on a
weight assembled inside jit from its stored components (``hx.make_qarray``, as a
layer in a model's jitted step; the native kernel ``hx_matmul_q_cpu_v1`` for int8 per
row, ``hx_matmul_q_cpu_v2`` for every other format), against ``f32`` on the same
weight dequantized,
and the weight's bytes at rest (stored values + scales, from the device buffers)
against f32's::

  python benchmarks/matmul_q_cpu.py --formats --m 1 16

``--nk`` prints the checkpoint layout's table instead, after the machine's plain read
bandwidth (a ``numpy`` sum over 512 MiB on one thread and on all), with each format's
weight bytes per second (GB/s) at each ``m`` and that over the all-thread read bandwidth
(``x bw``: the GEMV's goal at ``m = 1`` is >= 0.8 on a weight larger than the L3 cache,
e.g. ``--nk-shapes 32768 16384``); GGUF's block formats (Q4_K, Q6_K, Q5_0, ...;
``hx_matmul_q_cpu_v4``) are random blocks at the file's bytes, each also with int8
activations (``hx.install(activations="int8")``: ``hx_matmul_q_cpu_i8x_v2``; columns ``i8 GB/s``
and ``i8 bw``); ``--nk-formats`` and ``--nk-shapes`` pick some. Every weight is moved into
huge pages first (:func:`hxmlir.huge_pages.collapse`, as the decoders place theirs; NumPy's
own large arrays, the bandwidth's, are in huge pages too); ``--small-pages`` leaves them in
XLA's 4 KiB pages.
The table (``W[out, in]`` quantized
along ``in``, the contraction axis, as GGUF and torch ``Linear`` store it):
``hx.einsum("mk,nk->mn", x, w)`` compiled while installed on a weight assembled inside jit
(the native kernel ``hx_matmul_q_cpu_v3``), for Q8_0-like ``q8[..:g32,f16]``, Q4_0-like
``q4[..:g32,f16]`` and Q4_1-like ``u4o[..:g32,f16]``, against XLA's f32 dot on the
dequantized weight stored ``[in, out]`` (``x @ w``: XLA's fast layout), all four interleaved in one set of rounds, at ``--m``
on 4096 x 4096 and SmolLM2-135M's projections (out x in: 576x576, 192x576, 1536x576,
576x1536, 49152x576), with each weight's bytes and the CPU model. Targets: at ``m = 1,
4`` time <= 0.35x f32 for 4-bit and <= 0.50x for 8-bit; at ``m >= 64`` <= 1.0x::

  python benchmarks/matmul_q_cpu.py --nk --rounds 15

``--nk-stream`` measures that goal as stated: per format, the m = 1 GEMV on one random
weight ``[out, --k]`` of at least 1.25x the L3 cache (``/sys``'s size; out chosen so), in
huge pages, each call streaming it from memory, with f32 and with int8 activations, as GB/s and over the all-thread read bandwidth, marked against 0.80 (the
4096 x 4096 rows above pay a call's fixed costs, ~0.1-0.3 ms here, on a few MB)::

  python benchmarks/matmul_q_cpu.py --nk-stream --rounds 7

Usage::

  python benchmarks/matmul_q_cpu.py                 # the int8 table
  python benchmarks/matmul_q_cpu.py --m 1 16 --rounds 50
  python benchmarks/matmul_q_cpu.py --shape 2048 8192
  python benchmarks/matmul_q_cpu.py --inside-jit    # QArray built inside jit
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir import huge_pages


def naive(x, q, s):
  """The dequantize-then-dot a user writes: materialises ``f32[k, n]``."""
  return x @ (q.astype(jnp.float32) * s[:, None])


def f32_matmul(x, w):
  """The dense f32 matmul on the dequantized weight."""
  return x @ w


def hx_matmul_q(x, q, s):
  """hxmlir's ``matmul_q``, compiled without ``hx.install()`` (the StableHLO lowering)."""
  return hx.matmul_q(x, hx.QArray(q, s))


def hx_native(x, q, s):
  """hxmlir's ``matmul_q``, compiled while installed (the native kernel where active)."""
  return hx.matmul_q(x, hx.QArray(q, s))


def _from_parts(x, q, s):
  """``hx.matmul_q`` on a weight assembled inside jit from its ``i8`` values and scales."""
  return hx.matmul_q(x, hx.make_qarray(q, s))


def _compile(fn, *args, inside_jit: bool = False):
  if fn in (hx_matmul_q, hx_native):
    with hx.installed() if fn is hx_native else contextlib.nullcontext():
      if inside_jit:
        return jax.jit(_from_parts).lower(*args).compile(), args
      qw = hx.QArray(args[1], args[2])
      c = jax.jit(hx.matmul_q).lower(args[0], qw).compile()
    return c, (args[0], qw)
  c = jax.jit(fn).lower(*args).compile()
  return c, args


FLUSH_BYTES = 96 * 2**20  # 3x the 32 MiB L3 of the development machine


def time_rounds(compiled: dict, rounds: int, warm: bool) -> dict[str, list[float]]:
  """Seconds per call of each ``compiled[name] = (executable, args)``, over interleaved
  rounds (see the module docstring), the caches evicted before each call unless ``warm``."""
  times = {name: [] for name in compiled}
  flush_buf = jnp.ones((FLUSH_BYTES // 4,), jnp.float32)
  flush = jax.jit(jnp.sum)
  names = list(compiled)
  order = np.random.default_rng(0)
  for _ in range(rounds):
    for name in order.permutation(names):  # each follows each as often, on average
      c, a = compiled[name]
      if not warm:
        flush(flush_buf).block_until_ready()
      t0 = time.perf_counter()
      c(*a).block_until_ready()
      times[name].append(time.perf_counter() - t0)
  return times


def measure(m: int, k: int, n: int, rounds: int, seed: int = 0, warm: bool = False,
            inside_jit: bool = False) -> tuple[dict[str, tuple[float, int]], float]:
  """``({variant: (median seconds per call, temp bytes)}, spread)`` for one shape.

  ``spread``: the interquartile range of the per-round ratio native / f32.
  ``inside_jit``: ``hlo`` and ``native`` take the weight's ``i8`` values and
  scales as plain arrays and assemble the ``QArray`` inside jit (as a layer
  inside a model's jitted step does), instead of taking a ``QArray`` argument,
  whose per-call dispatch in Python costs ~0.1 ms on the development machine.
  """
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.integers(-127, 128, (k, n), dtype=np.int8))
  s = jnp.asarray(rng.uniform(0.001, 0.02, k).astype(np.float32))
  w = jax.jit(lambda q, s: q.astype(jnp.float32) * s[:, None])(q, s)
  x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
  variants = {"naive": (naive, (x, q, s)), "hlo": (hx_matmul_q, (x, q, s)),
              "native": (hx_native, (x, q, s)), "f32": (f32_matmul, (x, w))}
  compiled = {}
  for name, (fn, args) in variants.items():
    c, cargs = _compile(fn, *args, inside_jit=inside_jit)
    c(*cargs).block_until_ready()  # warm up
    compiled[name] = (c, cargs)
  ys = {name: np.asarray(c(*a)) for name, (c, a) in compiled.items()}
  scale = np.abs(ys["f32"]).max()
  for name in ("naive", "hlo", "native"):
    err = np.abs(ys[name] - ys["f32"]).max() / scale
    if err > 1e-4:
      raise AssertionError(f"{name} differs from f32 by {err:.2e} (relative) at m={m}")
  times = time_rounds(compiled, rounds, warm)
  ratios = [a / b for a, b in zip(times["native"], times["f32"])]
  q1, _, q3 = statistics.quantiles(ratios, n=4)
  return {name: (statistics.median(times[name]),
                 compiled[name][0].memory_analysis().temp_size_in_bytes)
          for name in compiled}, q3 - q1


TARGETS = {(1, 4096, 4096): 0.50, (4, 4096, 4096): 0.50, (16, 4096, 4096): 0.75}
"""native / f32 targets of the int8 kernel; every other case: 1.00."""


def _mib(b: int) -> str:
  return f"{b / 2**20:.2f}"


DEFAULT_FORMATS = ("int8", "int4", "int4:g128", "int4:g32", "float8_e4m3fn", "int8:g128")


def parse_format(text: str) -> tuple[str, int | None]:
  """``"int4:g128"`` -> ``("int4", 128)``, ``"int8"`` -> ``("int8", None)``; raises
  ``argparse.ArgumentTypeError`` naming the known formats otherwise."""
  from hxmlir import formats
  name, _, group = text.partition(":")
  if name not in formats.FORMATS or (group and not (group[:1] == "g" and group[1:].isdigit())):
    raise argparse.ArgumentTypeError(
        f"expected FORMAT or FORMAT:gG with FORMAT one of {', '.join(formats.FORMATS)}, "
        f"got {text!r}")
  return name, int(group[1:]) if group else None


def measure_format(m: int, k: int, n: int, dtype: str, group: int | None, rounds: int,
                   seed: int = 0, warm: bool = False) -> dict[str, float | int]:
  """One row of the formats table: ``{"hx", "f32"}`` (median seconds per call),
  ``"temp"`` (XLA temp bytes of the ``hx`` executable) and ``"bytes"`` (the
  quantized weight's values + scales as stored on the device).

  The weight is ``hx.quantize(w, dtype, group_size=group)`` of a Gaussian ``f32[k, n]``;
  ``hx`` is ``hx.matmul_q(x, hx.make_qarray(values, scales))`` compiled while
  installed, ``f32`` is ``x @ hx.dequantize(qw)``. Raises ``AssertionError`` when
  they differ by more than 1e-4 of the output's largest magnitude.
  """
  rng = np.random.default_rng(seed)
  w = jnp.asarray(rng.standard_normal((k, n)).astype(np.float32) * 0.02)
  qw = jax.jit(lambda w: hx.quantize(w, dtype, group_size=group))(w)
  q, s = qw.qvalue, qw.scale
  wd = jax.jit(hx.dequantize)(qw)
  x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
  with hx.installed():
    c_hx = jax.jit(lambda x, q, s: hx.matmul_q(x, hx.make_qarray(q, s))).lower(x, q, s).compile()
  compiled = {"hx": (c_hx, (x, q, s)), "f32": (jax.jit(f32_matmul).lower(x, wd).compile(), (x, wd))}
  ys = {name: np.asarray(c(*a)) for name, (c, a) in compiled.items()}
  err = np.abs(ys["hx"] - ys["f32"]).max() / np.abs(ys["f32"]).max()
  if err > 1e-4:
    raise AssertionError(f"hx.matmul_q on {dtype} g{group} differs from f32 by {err:.2e} "
                         f"(relative) at m={m}")
  times = time_rounds(compiled, rounds, warm)
  return {"hx": statistics.median(times["hx"]), "f32": statistics.median(times["f32"]),
          "temp": c_hx.memory_analysis().temp_size_in_bytes,
          "bytes": int(q.nbytes) + int(s.nbytes)}


def main_formats(args) -> None:
  """The ``--formats`` table (see the module docstring)."""
  fmts = args.formats or [parse_format(f) for f in DEFAULT_FORMATS]
  ms = args.m if args.m_given else [1, 16]
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs, "
        f"median of {args.rounds} interleaved rounds, "
        f"{'warm caches' if args.warm else 'caches evicted before each call'}; "
        "hx.matmul_q installed, weight assembled inside jit")
  head = (f"{'format':>18} {'m':>4} {'k':>5} {'n':>5} | {'hx ms':>8} {'f32 ms':>8} "
          f"{'hx/f32':>6} | {'weight MiB':>10} {'f32 MiB':>7} {'f32/weight':>10} | "
          f"{'temp MiB':>8}")
  print(head)
  print("-" * len(head))
  k, n = args.k, args.n
  for dtype, group in fmts:
    for m in ms:
      r = measure_format(m, k, n, dtype, group, args.rounds, warm=args.warm)
      name = dtype + (f" g{group}" if group else "")
      print(f"{name:>18} {m:>4} {k:>5} {n:>5} | {r['hx'] * 1e3:>8.2f} {r['f32'] * 1e3:>8.2f} "
            f"{r['hx'] / r['f32']:>6.2f} | {_mib(r['bytes']):>10} {_mib(4 * k * n):>7} "
            f"{4 * k * n / r['bytes']:>10.2f} | {_mib(r['temp']):>8}", flush=True)


NK_SHAPES = ((4096, 4096), (576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576),
             (1024, 640), (256, 640), (640, 1024), (2048, 640), (640, 2048))
"""``--nk``'s weights, out x in: 4096 x 4096, SmolLM2-135M's projections (q/o, k/v,
gate/up, down, the tied head) and Gemma 3 270M's (q, k/v, o, gate/up, down; its tied head,
262144 x 640, is left out: 0.7 GB as f32)."""
NK_FORMATS = (("Q8_0 q8 g32,f16", "int8"), ("Q4_0 q4 g32,f16", "int4"),
              ("Q4_1 u4o g32,f16", "uint4"), ("Q4_K", "Q4_K"), ("Q6_K", "Q6_K"),
              ("Q5_0", "Q5_0"), ("Q5_K", "Q5_K"), ("Q3_K", "Q3_K"), ("Q2_K", "Q2_K"),
              ("IQ4_XS", "IQ4_XS"), ("IQ4_NL", "IQ4_NL"), ("Q5_1", "Q5_1"))
"""``--nk``'s formats: (label, ``hx.quantize`` dtype of the f32-scale format whose scales
(and offsets) are then cast to f16, or a GGUF block type: random blocks at the file's
bytes, ``hx_matmul_q_cpu_v4``). ``--nk-formats`` picks some by label's first word."""


def read_bandwidth(mib: int = 512, rounds: int = 7) -> tuple[float, float]:
  """The machine's plain read bandwidth in GB/s (10^9 bytes/s), median of ``rounds``:
  ``numpy`` sums of an f32 array of ``mib`` MiB on one thread, and on all threads
  (``os.cpu_count()`` slices summed at once; NumPy releases the GIL in the reduction). The
  array lies in huge pages where the system has them (:func:`hxmlir.huge_pages.collapse`),
  as the weights it is compared with do. One untimed round first: the first all-thread sums
  of a process ran at 0.7-0.8x the later ones, and with five rounds they had moved the
  median from 31.5 to 22.3 GB/s between two runs."""
  from concurrent.futures import ThreadPoolExecutor
  held = jnp.ones(mib * 2**20 // 4, jnp.float32)
  huge_pages.collapse(held)
  a = np.asarray(held)  # the same buffer (CPU arrays are shared with NumPy)
  threads = os.cpu_count() or 1
  parts = np.array_split(a, threads)
  one, every = [], []
  with ThreadPoolExecutor(threads) as pool:
    a.sum()
    list(pool.map(np.sum, parts))
    for _ in range(rounds):
      t = time.perf_counter()
      a.sum()
      one.append(a.nbytes / (time.perf_counter() - t) / 1e9)
      t = time.perf_counter()
      list(pool.map(np.sum, parts))
      every.append(a.nbytes / (time.perf_counter() - t) / 1e9)
  return statistics.median(one), statistics.median(every)


def bandwidth_text(one: float, every: float) -> str:
  """The line that reports :func:`read_bandwidth`'s ``(one, every)`` GB/s."""
  return (f"read bandwidth (numpy sum of 512 MiB in huge pages, median of 7): {one:.1f} GB/s "
          f"one thread, {every:.1f} GB/s all {os.cpu_count()} threads")


def cpu_model() -> str:
  """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
  import platform
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def _gguf_block(kind: str) -> int:
  from hxmlir import gguf as hg
  return hg._BLOCK_SIZES[kind]


def _random_parts(n: int, k: int, dtype: str, seed: int = 0) -> tuple[jax.Array, ...]:
  """Components of a random weight ``[n, k]`` of ``dtype`` (a :data:`NK_FORMATS` dtype), built
  from random bytes without an f32 original (the stream weights are larger than the L3
  cache): values uniform, f16 scales (and offsets) of about 1e-3 (finite: the kernels'
  time does not depend on the values)."""
  rng = np.random.default_rng(seed)
  def f16(*shape):
    return jnp.asarray((rng.random(shape, np.float32) * 1e-3).astype(np.float16))
  if dtype.isupper():
    from hxmlir import gguf as hg
    raw = rng.integers(0, 256, (n, k // hg._BLOCK_SIZES[dtype], hg._BLOCK_BYTES[dtype]),
                       np.uint8)
    d_at, m_at, _ = hg._HEADERS[dtype]
    for at in (d_at,) if m_at is None else (d_at, m_at):
      raw[..., at:at + 2] = np.asarray(f16(n, k // hg._BLOCK_SIZES[dtype], 1)).view(np.uint8)
    return tuple(jnp.asarray(c) for c in hg.block_parts(raw, dtype))
  if dtype == "int8":
    return jnp.asarray(rng.integers(-127, 128, (n, k), np.int8)), f16(n, k // 32)
  values = jnp.asarray(rng.integers(0, 256, (n, k // 2), np.uint8))
  return (values, f16(n, k // 32)) + ((f16(n, k // 32),) if dtype == "uint4" else ())


def _nk_weight(w, dtype: str):
  """Components of ``w: f32[n, k]`` quantized along ``k`` in groups of 32 with f16 scales
  (and offsets): ``hx.quantize`` (``method="minmax"`` for uint4), scales cast to f16; for a
  GGUF block type (upper case), random blocks of ``w``'s shape (:func:`_random_parts`)."""
  if dtype.isupper():
    return _random_parts(*w.shape, dtype)
  qw = hx.quantize(w, dtype, group_size=32, method="minmax" if dtype == "uint4" else "absmax")
  parts = (qw.qvalue, qw.scale.astype(jnp.float16))
  return parts + ((qw.offset.astype(jnp.float16),) if dtype == "uint4" else ())


def _nk_einsum(x, *parts):
  return hx.einsum("mk,nk->mn", x, hx.make_qarray(*parts))


I8 = " i8"
"""The suffix of a block format's label in :func:`measure_nk`'s results for its time with
int8 activations (``hx.install(activations="int8")``: ``hx_matmul_q_cpu_i8x_v2``)."""


def measure_nk(m: int, n: int, k: int, rounds: int, seed: int = 0,
               warm: bool = False, nk_formats=None,
               huge: bool = True) -> dict[str, tuple[float, int]]:
  """``{label: (median seconds per call, weight bytes)}`` for ``f32`` and each of
  :data:`NK_FORMATS` on ``x: f32[m, k]``, ``W[n, k]``, interleaved in one set of rounds (and
  ``label + I8`` for the block formats with int8 activations). ``huge``: every weight
  (f32's too) moved into huge pages (:func:`hxmlir.huge_pages.collapse`), as the decoders
  place theirs; ``False``: as XLA allocated them (4 KiB pages).
  Raises ``AssertionError`` when a format's result differs from the f32 dot on its own
  dequantized weight by more than 1e-4 of the largest output."""
  rng = np.random.default_rng(seed)
  w = jnp.asarray(rng.standard_normal((n, k)).astype(np.float32) * 0.02)
  x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
  # the f32 weight stored [in, out], XLA's fast layout (x @ w.T on w: f32[out, in] takes a
  # slow loop in XLA:CPU, ~100x at m = 1 on 4096 x 4096)
  wt = jnp.asarray(np.asarray(w).T.copy())
  f32 = jax.jit(f32_matmul)
  compiled = {"f32": (f32.lower(x, wt).compile(), (x, wt))}
  if huge:
    huge_pages.collapse(wt)
  bytes_ = {"f32": 4 * n * k}
  checks = {}
  for label, dtype in nk_formats or NK_FORMATS:
    if dtype.isupper() and k % _gguf_block(dtype):
      continue  # the block does not divide k (llama.cpp stores such a tensor otherwise)
    parts = _nk_weight(w, dtype)
    with hx.installed():
      c = jax.jit(_nk_einsum).lower(x, *parts).compile()
    compiled[label] = (c, (x, *parts))
    if huge:
      huge_pages.collapse(parts)
    bytes_[label] = sum(int(p.nbytes) for p in parts)
    checks[label] = jax.jit(lambda *p: hx.dequantize(hx.make_qarray(*p)).T)(*parts)
    if dtype.isupper():  # a block format: its integer-activation kernel too (_i8x_v2)
      with hx.installed(activations="int8"):
        ci = jax.jit(_nk_einsum).lower(x, *parts).compile()
      compiled[label + I8] = (ci, (x, *parts))
      bytes_[label + I8], checks[label + I8] = bytes_[label], checks[label]
  for label, (c, a) in compiled.items():
    c(*a).block_until_ready()
    if label != "f32":
      want = np.asarray(f32(x, checks[label]))
      err = np.abs(np.asarray(c(*a)) - want).max() / np.abs(want).max()
      # int8 activations: x's quantization, |s_x qx - x| <= amax / 254 per element
      if err > (3e-2 if label.endswith(I8) else 1e-4):
        raise AssertionError(f"{label} differs from f32 by {err:.2e} (relative) at m={m}")
  times = time_rounds(compiled, rounds, warm)
  return {label: (statistics.median(times[label]), bytes_[label]) for label in compiled}


def l3_bytes() -> int:
  """The last-level cache's bytes (``/sys/devices/system/cpu/cpu0/cache``: the largest
  unified or data level), or 32 MiB where the system does not say."""
  import glob
  best = 0
  for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
    try:
      with open(f"{d}/type") as f:
        if f.read().strip() == "Instruction":
          continue
      with open(f"{d}/size") as f:
        text = f.read().strip()
    except OSError:
      continue
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    best = max(best, int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
  return best or 32 * 2**20


def measure_stream(dtype: str, k: int, min_bytes: int, rounds: int
                   ) -> tuple[int, int, dict[str, float]]:
  """``(n, weight bytes, {activations: median seconds per call})``: the m = 1 GEMV on one
  random weight ``[n, k]`` of ``dtype`` of at least ``min_bytes``, in huge pages, with f32
  and with int8 activations; each call streams the whole weight from
  memory (no eviction needed: it is larger than the caches), one warm-up call first.
  Raises ``ValueError`` when ``dtype``'s block (or group of 32) does not divide ``k``."""
  block = _gguf_block(dtype) if dtype.isupper() else 32
  if k % block:
    raise ValueError(f"--k {k} is not a multiple of {dtype}'s block of {block}")
  row = sum(int(p.nbytes) for p in _random_parts(1, k, dtype))
  n = -(-min_bytes // row)
  parts = _random_parts(n, k, dtype)
  huge_pages.collapse(parts)
  x = jnp.asarray(np.random.default_rng(1).standard_normal((1, k)).astype(np.float32))
  times = {}
  for act in ("f32", "int8"):
    with hx.installed(activations=act):
      c = jax.jit(_nk_einsum).lower(x, *parts).compile()
    c(x, *parts).block_until_ready()
    ts = []
    for _ in range(rounds):
      t0 = time.perf_counter()
      c(x, *parts).block_until_ready()
      ts.append(time.perf_counter() - t0)
    times[act] = statistics.median(ts)
  return n, sum(int(p.nbytes) for p in parts), times


def _chosen_formats(args) -> tuple[tuple[str, str], ...]:
  """:data:`NK_FORMATS`, or those ``--nk-formats`` names (the label's first word)."""
  if not args.nk_formats:
    return NK_FORMATS
  return tuple(f for f in NK_FORMATS if f[0].split()[0] in args.nk_formats)


def main_nk_stream(args) -> None:
  """The ``--nk-stream`` table (see the module docstring)."""
  chosen = _chosen_formats(args)
  one, every = read_bandwidth()
  l3 = l3_bytes()
  print(f"{bandwidth_text(one, every)}; L3 {l3 / 2**20:.0f} MiB")
  print(f"CPU: {cpu_model()}; jax {jax.__version__}, {os.cpu_count()} CPUs; m = 1 GEMV, "
        f"hx.einsum('mk,nk->mn') installed, one weight [out, {args.k}] of at least 1.25x the "
        f"L3 cache per format (random bytes, huge pages), median of {args.rounds} calls; "
        f"GB/s: weight bytes per second; x bw: over the all-thread read bandwidth; "
        f"target x bw >= 0.80 (f32 and int8 activations)")
  head = (f"{'format':>16} {'out':>7} {'in':>5} {'MiB':>6} | {'f32 ms':>8} {'GB/s':>6} "
          f"{'x bw':>5} | {'i8 ms':>8} {'GB/s':>6} {'x bw':>5} | target")
  print(head)
  print("-" * len(head))
  for label, dtype in chosen:
    n, nbytes, t = measure_stream(dtype, args.k, int(1.25 * l3), args.rounds)
    cells, marks = [], []
    for act in ("f32", "int8"):
      gbs = nbytes / t[act] / 1e9
      cells.append(f"{t[act] * 1e3:>8.2f} {gbs:>6.2f} {gbs / every:>5.2f}")
      marks.append(f"{act}{'+' if gbs / every >= 0.8 else '-'}")
    print(f"{label:>16} {n:>7} {args.k:>5} {nbytes / 2**20:>6.0f} | " + " | ".join(cells)
          + f" | {' '.join(marks)}", flush=True)


def main_nk(args) -> None:
  """The ``--nk`` table (see the module docstring)."""
  ms, info = args.m, hx.cpu_kernel_info()
  chosen = _chosen_formats(args)
  one, every = read_bandwidth()
  print(bandwidth_text(one, every))
  print(f"CPU: {cpu_model()}; jax {jax.__version__}, {os.cpu_count()} CPUs, median of "
        f"{args.rounds} interleaved rounds, "
        f"{'warm caches' if args.warm else 'caches evicted before each call'}; weights in "
        f"{'4 KiB pages' if args.small_pages else 'huge pages (hxmlir.huge_pages.collapse)'}; "
        f"hx.einsum('mk,nk->mn') installed, weight assembled inside jit; "
        + (f"native hx_matmul_q_cpu_v3/_v4, int8 activations _i8x_v2 ({info.isa})"
           if info.active
           else f"StableHLO lowering ({info.reason})") + "; GB/s: weight bytes per second; "
        f"x bw: GB/s over the all-thread read bandwidth ({every:.1f} GB/s); i8 GB/s, i8 bw: "
        "the block formats with int8 activations (hx.install(activations='int8'))")
  labels = [label for label, _ in chosen]
  head = (f"{'out':>6} {'in':>5} {'m':>4} | {'f32 ms':>8} | "
          + " | ".join(f"{label:>16} ms {'x f32':>6} {'GB/s':>6} {'x bw':>5} {'i8 GB/s':>7} "
                       f"{'i8 bw':>5}" for label in labels)
          + " | weight MiB "
          + " ".join(f"{label.split()[0]:>5}" for label in ["f32 "] + labels) + " | targets")
  print(head)
  print("-" * len(head))
  for n, k in args.nk_shapes or NK_SHAPES:
    for m in ms:
      r = measure_nk(m, n, k, args.rounds, warm=args.warm, nk_formats=chosen,
                     huge=not args.small_pages)
      tf = r["f32"][0]
      cells, marks = [], []
      for label, dtype in chosen:
        if label not in r:
          cells.append(f"{'-':>19} {'':>6} {'':>6} {'':>5} {'':>7} {'':>5}")
          continue
        t = r[label][0]
        gbs = r[label][1] / t / 1e9
        i8 = f"{'-':>7} {'':>5}"
        if label + I8 in r:
          g8 = r[label + I8][1] / r[label + I8][0] / 1e9
          i8 = f"{g8:>7.2f} {g8 / every:>5.2f}"
        cells.append(f"{t * 1e3:>19.3f} {t / tf:>6.2f} {gbs:>6.2f} {gbs / every:>5.2f} {i8}")
        target = (0.5 if dtype == "int8" else 0.35) if m <= 4 else 1.0 if m >= 64 else None
        if target is not None:
          marks.append(f"{label.split()[0]}<={target:.2f}{'+' if t / tf <= target else '-'}")
      mib = " ".join(f"{r[lab][1] / 2**20:>5.2f}" if lab in r else f"{'-':>5}"
                     for lab in ["f32", *labels])
      print(f"{n:>6} {k:>5} {m:>4} | {tf * 1e3:>8.3f} | " + " | ".join(cells)
            + f" | {mib:>10} | {' '.join(marks)}", flush=True)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--m", type=int, nargs="+", default=[1, 4, 16, 64, 256])
  ap.add_argument("--k", type=int, default=4096)
  ap.add_argument("--n", type=int, default=4096)
  ap.add_argument("--shape", type=int, nargs=2, metavar=("K", "N"), action="append",
                  help="extra weight shapes, run at m = 16 and 128 "
                       "(default: 512 2048 and 384 1536)")
  ap.add_argument("--formats", type=parse_format, nargs="*", metavar="FORMAT",
                  help="print the formats table instead: FORMAT is int8, int4, "
                       "float8_e4m3fn, with :gG for groups of G (default: "
                       f"{' '.join(DEFAULT_FORMATS)}; --m defaults to 1 16 there)")
  ap.add_argument("--nk", action="store_true",
                  help="print the [out, in] layout's table instead (hx_matmul_q_cpu_v3: Q8_0-, "
                       "Q4_0-, Q4_1-like weights against f32, 4096x4096 and SmolLM2's shapes)")
  ap.add_argument("--nk-formats", nargs="+", metavar="LABEL",
                  help="--nk: only these formats (first word of the label: Q8_0, Q4_0, Q4_1, "
                       "Q4_K, Q6_K, Q5_0, Q5_K, Q3_K, Q2_K, IQ4_XS, IQ4_NL, Q5_1)")
  ap.add_argument("--nk-shapes", type=int, nargs=2, metavar=("OUT", "IN"), action="append",
                  help="--nk: only these weight shapes (default: all of NK_SHAPES)")
  ap.add_argument("--nk-stream", action="store_true",
                  help="print the m = 1 GEMV's streaming table instead: per format (--nk-formats "
                       "picks), one [out, --k] weight larger than the L3 cache")
  ap.add_argument("--small-pages", action="store_true",
                  help="--nk: weights as XLA allocates them (4 KiB pages), not moved into huge "
                       "pages as the decoders place theirs")
  ap.add_argument("--rounds", type=int, default=30)
  ap.add_argument("--warm", action="store_true",
                  help="do not evict the caches between calls")
  ap.add_argument("--inside-jit", action="store_true",
                  help="hlo and native assemble the QArray inside jit from i8 values and "
                       "scales (no per-call Python dispatch of a QArray argument)")
  args = ap.parse_args(argv)
  extra = args.shape if args.shape is not None else [(512, 2048), (384, 1536)]
  cases = [(m, args.k, args.n) for m in args.m]
  cases += [(m, k, n) for k, n in extra for m in (16, 128)]
  if args.nk_stream:
    return main_nk_stream(args)
  if args.nk:
    return main_nk(args)
  if args.formats is not None:
    args.m_given = args.m != ap.get_default("m")
    return main_formats(args)

  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs, "
        f"median of {args.rounds} interleaved rounds, "
        f"{'warm caches' if args.warm else 'caches evicted before each call'}"
        f"{', QArray assembled inside jit' if args.inside_jit else ''}")
  print(f"hx.matmul_q on CPU while installed: {hx.cpu_kernel_info()}")
  head = (f"{'m':>4} {'k':>5} {'n':>5} | {'naive ms':>9} {'hlo ms':>8} {'native ms':>9} "
          f"{'f32 ms':>8} | {'hlo/f32':>7} {'native/f32':>10} {'spread':>6} | "
          f"{'temp MiB naive':>14} {'hlo':>6} {'native':>6} {'f32':>6} | targets")
  print(head)
  print("-" * len(head))
  for m, k, n in cases:
    r, spread = measure(m, k, n, args.rounds, warm=args.warm, inside_jit=args.inside_jit)
    (tn, mn), (th, mh), (tv, mv), (tf, mf) = r["naive"], r["hlo"], r["native"], r["f32"]
    w32 = 4 * k * n
    target = TARGETS.get((m, k, n), 1.00)
    marks = (f"time<={target:.2f}{'+' if tv / tf <= target else '-'} "
             f"mem{'+' if mv <= w32 / 8 else '-'}")
    print(f"{m:>4} {k:>5} {n:>5} | {tn * 1e3:>9.2f} {th * 1e3:>8.2f} {tv * 1e3:>9.2f} "
          f"{tf * 1e3:>8.2f} | {th / tf:>7.2f} {tv / tf:>10.2f} {spread:>6.2f} | "
          f"{_mib(mn):>14} {_mib(mh):>6} {_mib(mv):>6} {_mib(mf):>6} | {marks}", flush=True)


if __name__ == "__main__":
  main()
