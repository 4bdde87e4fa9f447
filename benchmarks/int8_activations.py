"""The opt-in integer activations (``hx.install(activations="int8")``): speed and accuracy.

Three parts, each printed with the CPU model:

- ``kernels``: the ``[out, in]`` projections of SmolLM2-135M at prefill (``m`` rows of
  ``x``, default 128): ``hx_matmul_q_cpu_v3`` (f32 activations) against
  ``hx_matmul_q_cpu_i8x_v1`` (int8 activations) on the same weights, interleaved
  repetitions, medians and the ratio;
- ``smollm2``: the logits of every position of the 128-token prompt of
  ``benchmarks/generate_cpu.py`` with int8 activations against f32 activations (same
  Q4_1/Q8_0 weights), and both against the f32 decoder on the dequantized weights
  (``jax-f32``): max |diff|, max |diff| / max |logit|, top-1 agreement;
- ``minilm``: all-MiniLM-L6-v2's sentence embeddings, dense weights int8 per row in the
  layout ``[out, in]`` (``minilm.quantize_params(out_in=True)``), with int8 against f32
  activations, and both against the f32 model: cosine similarity (min and mean over the
  sentences).

Usage::

  python benchmarks/int8_activations.py                 # all three
  python benchmarks/int8_activations.py --parts kernels --rows 128 512
  python benchmarks/int8_activations.py --parts kernels --rows 1 --cold   # decode
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from generate_cpu import PROMPT, cpu_model, prompt_ids

import hxmlir as hx
from hxmlir.lowering.matmul_q import cpu as native

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leaps above a sleepy hound.",
    "Quantized weights keep the model small in memory.",
    "Integer dot products run faster than floating point ones on this CPU.",
    "Paris is the capital of France.",
    "The stock market fell sharply on Monday after the announcement.",
    "She plays the violin in the city orchestra every weekend.",
    "Photosynthesis turns light into chemical energy in plants.",
] + [s.strip() + "." for s in PROMPT.split(".") if s.strip()]


def _looped(f, calls: int, copies: int):
  """``f(x, *w)`` called ``calls`` times on each of ``copies`` weights (``w``: their
  components, copy after copy) in one jitted loop (each call's ``x`` depends on the
  previous result, so none is hoisted): a call's time without JAX's dispatch."""
  def body(_, x, *ws):
    per = len(ws) // copies
    for c in range(copies):
      x = x + jnp.float32(1e-30) * f(x, *ws[c * per:(c + 1) * per])[..., :1]
    return x
  return jax.jit(lambda x, *ws: jax.lax.fori_loop(0, calls, lambda i, x: body(i, x, *ws), x))


COLD_BYTES = 96 << 20
"""``--cold``: the copies of a weight add up to at least this many bytes (3x the 32 MiB L3 of
the Zen 4 machine), at most :data:`COLD_COPIES` of them: each call streams its weight
from memory, as a decode step does (SmolLM2's o and down projections, 0.2-0.5 MB, stay in
the L3 at 64 copies)."""
COLD_COPIES = 64
"""``--cold``: the most copies of one weight (each is one more call in the jitted loop)."""


def kernels(rows: list[int], reps: int, calls: int = 32, cold: bool = False) -> None:
  """Print v3 against i8x on SmolLM2-135M's projection shapes (Q4_1 layers, Q8_0 head): the
  median time of one call, from jitted loops of ``calls`` calls (``cold``: on as many copies
  of the weight as :data:`COLD_BYTES` takes, so the weight comes from memory, not the
  caches)."""
  rng = np.random.default_rng(0)
  shapes = [("q/k/v (fused)", 960, 576), ("o", 576, 576), ("gate/up (fused)", 3072, 576),
            ("down", 576, 1536), ("head (Q8_0)", 49152, 576)]
  print(f"{'projection':>16} {'m':>4} {'n':>6} {'k':>5} | {'v3 us':>8} {'i8x us':>8} | "
        f"{'v3/i8x':>6}")
  for m in rows:
    for name, n, k in shapes:
      s = jnp.asarray((rng.random((n, k // 32)) * 0.01).astype(np.float16))
      if name.startswith("head"):
        args = (jnp.asarray(rng.integers(-128, 128, (n, k), dtype=np.int8)), s)
      else:
        q = jnp.asarray(rng.integers(0, 256, (n, k // 2), dtype=np.uint8))
        args = (q, s, jnp.asarray((rng.random((n, k // 32)) * 0.01).astype(np.float16)))
      x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
      copies = min(COLD_COPIES, -(-COLD_BYTES // sum(a.nbytes for a in args))) if cold else 1
      args = tuple(jnp.array(a, copy=True) for _ in range(copies) for a in args)
      v3 = _looped(native.matmul_q_native_v3, max(1, calls // copies), copies)
      i8x = _looped(native.matmul_q_native_i8x, max(1, calls // copies), copies)
      per_call = max(1, calls // copies) * copies
      times = {"v3": [], "i8x": []}
      for f in (v3, i8x):
        f(x, *args).block_until_ready()
      for _ in range(reps):
        for tag, f in (("v3", v3), ("i8x", i8x)):
          t = time.perf_counter()
          f(x, *args).block_until_ready()
          times[tag].append((time.perf_counter() - t) / per_call)
      a, b = statistics.median(times["v3"]), statistics.median(times["i8x"])
      print(f"{name:>16} {m:>4} {n:>6} {k:>5} | {a * 1e6:>8.1f} {b * 1e6:>8.1f} | {a / b:>6.2f}")


def _compare(a: np.ndarray, b: np.ndarray, what: str) -> None:
  d = np.abs(a - b)
  print(f"  {what}: max |diff| {d.max():.3g}, max |diff| / max |logit| "
        f"{d.max() / np.abs(b).max():.2e}, top-1 agreement {np.mean(a.argmax(-1) == b.argmax(-1)):.3f}"
        f" ({len(b)} positions)")


def smollm2(tokens: int) -> None:
  """Print the logits of every prompt position, int8 against f32 activations."""
  from hxmlir import gguf
  from hxmlir.models import llama
  m = llama.Llama.smollm2(max_context=max(tokens, 16) + 8)
  i8 = llama.Llama(m.config, m.params, max_context=m.max_context, activations="int8")
  dense = llama.Llama(m.config, llama.dequantized(llama.params_of(
      gguf.load(llama.smollm2_path()), m.config, fuse=False)), max_context=m.max_context,
      kernels=False)
  ids = jnp.asarray(prompt_ids(m, tokens), jnp.int32)

  def logits(model):
    k, v = model.new_cache()
    return np.asarray(model._prefill(model.params, ids, jnp.int32(0), k, v)[0])

  f32, int8, ref = logits(m), logits(i8), logits(dense)
  print(f"SmolLM2-135M-Instruct Q4_1 (head Q8_0), prefill of {tokens} tokens, logits:")
  _compare(int8, f32, "int8 vs f32 activations (same weights)")
  _compare(f32, ref, "f32 activations vs the f32 decoder on the dequantized weights")
  _compare(int8, ref, "int8 activations vs the f32 decoder on the dequantized weights")


def minilm() -> None:
  """Print all-MiniLM-L6-v2's embeddings' cosine, int8 against f32 activations."""
  from hxmlir.models import minilm as mm
  cfg, params = mm.load_params()
  tok = mm.Tokenizer()
  ids, mask = (jnp.asarray(a) for a in tok(SENTENCES))
  f32 = jax.jit(lambda p, i, k: mm.encode(p, i, k, cfg=cfg))
  nk = jax.jit(lambda p, i, k: mm.encode(p, i, k, cfg=cfg, out_in=True))
  ref = np.asarray(f32(jax.tree.map(jnp.asarray, params), ids, mask))
  q = mm.quantize_params(params, out_in=True)
  with hx.installed():
    e32 = np.asarray(nk(q, ids, mask))
  with hx.installed(activations="int8"):
    text = nk.lower(q, ids, mask).as_text()
    e8 = np.asarray(nk(q, ids, mask))
  calls = text.count(f"custom_call @{native.TARGET_I8X}(")
  cos = lambda a, b: np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
  print(f"all-MiniLM-L6-v2, {len(SENTENCES)} sentences (ids {list(ids.shape)}), dense weights "
        f"int8 per row [out, in]; with int8 activations the module calls {native.TARGET_I8X} "
        f"({calls} decompositions: one per weight shape):")
  for what, a, b in (("int8 vs f32 activations (same weights)", e8, e32),
                     ("f32 activations vs the f32 model", e32, ref),
                     ("int8 activations vs the f32 model", e8, ref)):
    c = cos(a, b)
    print(f"  {what}: cosine min {c.min():.6f}, mean {c.mean():.6f}")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--parts", nargs="+", choices=("kernels", "smollm2", "minilm"),
                  default=["kernels", "smollm2", "minilm"])
  ap.add_argument("--rows", nargs="+", type=int, default=[128], help="m of the kernels part")
  ap.add_argument("--reps", type=int, default=15)
  ap.add_argument("--calls", type=int, default=32, help="kernel calls per timed jitted loop")
  ap.add_argument("--cold", action="store_true",
                  help="kernels: weights streamed from memory (copies past the L3 cache)")
  ap.add_argument("--prompt-tokens", type=int, default=128)
  args = ap.parse_args(argv)
  from hxmlir import _matmul_q_cpu as ext
  print(f"CPU: {cpu_model()}; hx.matmul_q on CPU: {hx.cpu_kernel_info()}; integer "
        f"activations: {ext.i8x_isa()}")
  if "kernels" in args.parts:
    kernels(args.rows, args.reps, args.calls, args.cold)
  if "smollm2" in args.parts:
    smollm2(args.prompt_tokens)
  if "minilm" in args.parts:
    minilm()


if __name__ == "__main__":
  main()
