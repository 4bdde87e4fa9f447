"""Writes llama.cpp's logits on each decoder family's small random-weight GGUF file: the
fixtures of tests/py/models/test_families_llamacpp.py.

For every family of tests/py/models/gguf_families.py (``llama``, ``llama_rope_freqs``,
``qwen2``, ``qwen3``, ``gemma2``, ``gemma3``, ``olmo2``, ``qwen3moe``):

* ``F32``: the family's file with f32 weights (seed 0); llama.cpp's logits on it.
* ``Q4_K_M``: the family's file in llama.cpp's Q4_K_M type mix (Q4_K and Q6_K blocks drawn
  from the seed); the reference is llama.cpp's logits on the F32 file of the same exact
  values (``gguf.quants.dequantize`` of the stored blocks), so that it holds the quantized
  file's numbers without llama.cpp's quantized matmuls (which round the activations to
  8 bits). llama.cpp's logits on the Q4_K_M file itself are compared with that reference
  (top-1 agreement; printed and stored), which checks that llama.cpp reads the blocks as
  ``gguf-py`` does. The file's type mix is compared with what
  ``llama_cpp.llama_model_quantize`` chooses for Q4_K_M on the F32 file (stored too).

llama.cpp runs with every position's logits (``logits_all``), 2 threads, an f32 KV cache
(``type_k``/``type_v``), flash attention off, one batch for the whole prompt
(:data:`PROMPT_LEN` token ids drawn from a fixed seed). Written: ``data/llamacpp_logits.npz``
(``"<family>/<variant>"``: f32[positions, vocab]; ``"prompt"``: i32[positions]) and
``data/llamacpp_families.json`` (versions, the prompt, each file's exact-weights SHA-256 --
the test checks that the writer still gives the same numbers -- type mixes and checks).

Needs llama-cpp-python (built as DEVELOPERS.md says), gguf, numpy. Run:
  python scripts/make_llamacpp_fixtures.py [--out tests/py/models/data] [--families a,b]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import inspect
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "py", "models")
sys.path.insert(0, TESTS)

import gguf_families  # noqa: E402

PROMPT_LEN = 32
"""Positions of the fixed prompt: four times gemma2/gemma3's sliding window of 8."""
PROMPT_SEED = 123
WEIGHT_SEED = 0
VARIANTS = ("F32", "Q4_K_M")


def prompt_ids() -> np.ndarray:
  """The fixed prompt: ``i32[PROMPT_LEN]`` token ids drawn from ``PROMPT_SEED``, the BOS id
  first."""
  ids = np.random.default_rng(PROMPT_SEED).integers(3, gguf_families.vocab_size(),
                                                    PROMPT_LEN)
  ids[0] = 1
  return ids.astype(np.int32)


def weights_sha256(weights: dict[str, np.ndarray]) -> str:
  """SHA-256 over the tensors' names and f32 little-endian bytes, in name order."""
  h = hashlib.sha256()
  for name in sorted(weights):
    h.update(name.encode())
    h.update(np.ascontiguousarray(weights[name], "<f4").tobytes())
  return h.hexdigest()


def llamacpp_logits(path: str, ids: np.ndarray) -> np.ndarray:
  """llama.cpp's logits ``f32[len(ids), vocab]`` on the GGUF file ``path`` for ``ids``
  (every position; 2 threads; f32 KV cache; flash attention off)."""
  import llama_cpp
  kw = dict(model_path=path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=2,
            n_threads_batch=2, logits_all=True, type_k=llama_cpp.GGML_TYPE_F32,
            type_v=llama_cpp.GGML_TYPE_F32, verbose=False, n_gpu_layers=0)
  params = inspect.signature(llama_cpp.Llama.__init__).parameters
  if "flash_attn_type" in params:
    kw["flash_attn_type"] = getattr(llama_cpp, "LLAMA_FLASH_ATTN_TYPE_DISABLED", 0)
  else:
    kw["flash_attn"] = False
  llm = llama_cpp.Llama(**kw)
  llm.eval(ids.tolist())
  out = np.array(llm.scores[:len(ids)], np.float32)
  llm.close()
  return out


def llamacpp_q4_k_m_types(src: str, dst: str) -> dict[str, str]:
  """The tensor types ``llama_model_quantize`` gives the F32 file ``src`` for Q4_K_M
  (written to ``dst``)."""
  import gguf
  import llama_cpp
  params = llama_cpp.llama_model_quantize_default_params()
  params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
  params.nthread = 2
  rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
  if rc != 0:
    raise RuntimeError(f"llama_model_quantize({src}) returned {rc}")
  return {t.name: t.tensor_type.name for t in gguf.GGUFReader(dst).tensors}


def agreement(a: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
  """``(top-1 agreement, max|a - ref| / max|ref|)``."""
  top1 = float(np.mean(a.argmax(-1) == ref.argmax(-1)))
  return top1, float(np.abs(a - ref).max() / np.abs(ref).max())


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.path.join(TESTS, "data"))
  ap.add_argument("--families", default=",".join(gguf_families.FAMILIES))
  ap.add_argument("--keep", help="a folder to keep the GGUF files in")
  args = ap.parse_args(argv)
  import llama_cpp

  ids = prompt_ids()
  arrays, families = {"prompt": ids}, {}
  npz = os.path.join(args.out, "llamacpp_logits.npz")
  js = os.path.join(args.out, "llamacpp_families.json")
  if os.path.exists(npz) and os.path.exists(js):  # other families' fixtures are kept
    with np.load(npz) as old:
      arrays.update({k: old[k] for k in old.files if k != "prompt"})
    with open(js) as f:
      families = json.load(f)["families"]
  from importlib.metadata import version
  meta = {"llama_cpp_python": llama_cpp.__version__, "gguf": version("gguf"),
          "prompt_seed": PROMPT_SEED, "weight_seed": WEIGHT_SEED, "prompt": ids.tolist(),
          "settings": "logits_all, n_threads 2, type_k/type_v f32, flash attention off, "
                      "n_ctx 64, one batch", "families": families}
  tmp = args.keep or tempfile.mkdtemp(prefix="hx_fixtures_")
  os.makedirs(tmp, exist_ok=True)
  for family in args.families.split(","):
    fam = meta["families"][family] = {}
    for variant in VARIANTS:
      path = os.path.join(tmp, f"{family}.{variant}.gguf")
      exact = gguf_families.write(path, family, seed=WEIGHT_SEED, qtype=variant)
      entry = fam[variant] = {"weights_sha256": weights_sha256(exact)}
      if variant == "F32":
        ref = llamacpp_logits(path, ids)
        mine = gguf_families.q4_k_m_types(gguf_families.spec(family))
        theirs = llamacpp_q4_k_m_types(path, os.path.join(tmp, f"{family}.llamacpp_q4km.gguf"))
        entry["llamacpp_q4_k_m_types_differ"] = {
            n: {"llama.cpp": theirs.get(n), "ours": t} for n, t in mine.items()
            if theirs.get(n) != t}
      else:
        twin = os.path.join(tmp, f"{family}.{variant}.exact_f32.gguf")
        gguf_families.write_weights(twin, family, exact)
        ref = llamacpp_logits(twin, ids)
        top1, rel = agreement(llamacpp_logits(path, ids), ref)
        entry["llamacpp_quantized_vs_exact"] = {"top1": top1, "rel_err": rel}
        entry["types"] = gguf_families.q4_k_m_types(gguf_families.spec(family))
      if not np.all(np.isfinite(ref)):
        raise RuntimeError(f"{family} {variant}: llama.cpp's logits are not finite")
      arrays[f"{family}/{variant}"] = ref
      print(f"{family:18s} {variant:7s} max|logit| {np.abs(ref).max():7.2f}  "
            + (f"llama.cpp on the Q4_K_M file vs its exact f32: top-1 {top1:.3f} rel "
               f"{rel:.1e}" if variant != "F32" else
               f"Q4_K_M type mix differs from llama.cpp's on "
               f"{len(entry['llamacpp_q4_k_m_types_differ'])} tensors"), flush=True)
  os.makedirs(args.out, exist_ok=True)
  np.savez_compressed(npz, **arrays)
  with open(js, "w") as f:
    json.dump(meta, f, indent=1)
  print("wrote", args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
