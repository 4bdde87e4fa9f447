"""Small random-weight GGUF files of each decoder family, as llama.cpp's converter writes them.

For every family in :data:`FAMILIES` (``llama``, ``llama`` with Llama-3's ``rope_freqs``,
``qwen2``, ``qwen3``, ``gemma2``, ``gemma3``, ``olmo2``, ``qwen3moe``) :func:`write` writes a
tiny model (a few layers, width 256, grouped-query attention, a 512-token vocabulary) with
``gguf.GGUFWriter``: the metadata keys and tensor names of llama.cpp's
``convert_hf_to_gguf.py`` for that architecture (``gguf-py``'s ``constants.py``:
``{arch}.attention.key_length``, ``blk.N.post_ffw_norm``, ``blk.N.ffn_gate_exps`` ...) and
a real tokenizer's metadata (SmolLM2's byte-level BPE, its first 512 tokens and the merges
among them: ``data/smollm2_vocab512.json``) so that llama.cpp loads the file. Weights are
drawn from ``numpy.random.default_rng(seed)``: the same seed gives the same bytes.

``qtype`` stores the matrices quantized: ``"F32"`` (default), ``"F16"``, a legacy block type
(``"Q8_0"``, ``"Q4_0"``, ``"Q4_1"``, ``"Q5_0"``, ``"Q5_1"``: the f32 weights quantized by
``gguf.quants.quantize``, llama.cpp's reference rounding), or ``"Q4_K_M"``: llama.cpp's
Q4_K_M type mix (:func:`q4_k_m_types`: Q6_K for the output head, for ``attn_v`` and
``ffn_down`` in the layers llama.cpp's ``use_more_bits`` picks, Q4_K elsewhere; 1-D
tensors and the MoE router in F32). ``gguf-py`` has no K-quant quantizer, so K-quant
blocks are drawn at random (every field of the block: the f16 ``d``/``dmin`` set so that
the values have the family's spread, the 6-bit scales and the 4/6-bit values uniform),
which covers every bit pattern of the format. Whatever the type, :func:`write` returns the
exact f32 values the file holds (``gguf.quants.dequantize`` of the stored bytes), and
:func:`write_weights` writes them as an F32 file of the same model: llama.cpp's logits on
that file are the reference for the quantized one.

Rotary embeddings: the ``llama`` rows are taken as stored (random weights need no
permutation); llama.cpp applies its NORM rope (consecutive pairs) to ``llama`` and NEOX
(halves) to the others. Gemma's norm weights are stored with the ``+1`` the converter bakes
in (drawn around 1 like the others).

Usage::

  from gguf_families import write, write_weights
  exact = write("/tmp/gemma3.gguf", "gemma3", seed=0)            # F32
  exact = write("/tmp/gemma3.q4km.gguf", "gemma3", qtype="Q4_K_M")
  write_weights("/tmp/gemma3.exact.gguf", "gemma3", exact)      # its exact f32 twin
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace

import numpy as np

VOCAB_JSON = os.path.join(os.path.dirname(__file__), "data", "smollm2_vocab512.json")
"""The tokenizer metadata written into every file (512 tokens of SmolLM2's vocabulary)."""


@dataclass(frozen=True)
class Spec:
  """One tiny model: the GGUF architecture and its sizes and constants."""
  arch: str
  layers: int = 2
  hidden: int = 256
  heads: int = 4
  kv_heads: int = 2
  head_dim: int = 64
  ffn: int = 512
  rms_eps: float = 1e-5
  rope_base: float = 10000.0
  tied: bool = True                 # no output.weight: the head is the embedding table
  rope_freqs: bool = False          # Llama 3's rope_freqs tensor (llama3 rope scaling)
  qkv_bias: bool = False            # qwen2
  qk_norm: str | None = None        # "head" (qwen3, gemma3, qwen3moe) or "full" (olmo2)
  norms: str = "pre"                # "pre", "pre+post" (gemma2/3), "post" (olmo2)
  key_length: bool = False          # write {arch}.attention.key_length / value_length
  attn_softcap: float | None = None
  final_softcap: float | None = None
  sliding_window: int | None = None
  experts: int = 0
  experts_used: int = 0
  expert_ffn: int = 0
  context_length: int = 4096
  extra: dict = field(default_factory=dict)


FAMILIES: dict[str, Spec] = {
    # SmolLM2 / TinyLlama-like: tied head, NORM rope
    "llama": Spec("llama", kv_heads=2),
    # Llama 3.x-like: separate head, rope_freqs (llama3 scaling), base 500000
    "llama_rope_freqs": Spec("llama", tied=False, rope_freqs=True, rope_base=500000.0),
    "qwen2": Spec("qwen2", qkv_bias=True, rms_eps=1e-6, rope_base=1000000.0),
    # head_dim 128 with 4 heads: q is 512 wide over a width of 256 (key_length differs)
    "qwen3": Spec("qwen3", head_dim=128, qk_norm="head", key_length=True, rms_eps=1e-6,
                  rope_base=1000000.0),
    "gemma2": Spec("gemma2", norms="pre+post", key_length=True, rms_eps=1e-6,
                   attn_softcap=5.0, final_softcap=30.0, sliding_window=8, layers=3),
    # 6 layers: 5 local (window 8, rope base 10000) and 1 global (base from the file)
    "gemma3": Spec("gemma3", layers=6, heads=4, kv_heads=1, head_dim=128, qk_norm="head",
                   norms="pre+post", key_length=True, rms_eps=1e-6, rope_base=1000000.0,
                   sliding_window=8),
    "olmo2": Spec("olmo2", kv_heads=4, qk_norm="full", norms="post", tied=False,
                  rms_eps=1e-6, rope_base=500000.0),
    "qwen3moe": Spec("qwen3moe", head_dim=128, qk_norm="head", key_length=True, tied=False,
                     rms_eps=1e-6, rope_base=1000000.0, experts=4, experts_used=2,
                     expert_ffn=256),
}
"""The families: name -> :class:`Spec`. ``llama_rope_freqs`` is ``llama`` with Llama 3's
``rope_freqs`` tensor."""

QTYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M")
"""The ``qtype`` values :func:`write` takes."""


def vocab_metadata() -> dict:
  """The tokenizer metadata of :data:`VOCAB_JSON` (``tokenizer.ggml.*`` keys)."""
  with open(VOCAB_JSON, encoding="utf-8") as f:
    d = json.load(f)
  return {k: v for k, v in d.items() if k.startswith("tokenizer.")}


def vocab_size() -> int:
  """Tokens in :data:`VOCAB_JSON` (the models' vocabulary)."""
  return len(vocab_metadata()["tokenizer.ggml.tokens"])


def llama3_rope_freqs(head_dim: int, base: float, *, factor: float = 8.0,
                      low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                      original_context: int = 16) -> np.ndarray:
  """``f32[head_dim / 2]``: Llama 3's rope scaling as the converter stores it (the factor
  each rotary frequency is divided by; Meta's ``apply_scaling``): 1 for wavelengths under
  ``original_context / high_freq_factor``, ``factor`` above ``original_context /
  low_freq_factor``, interpolated between. ``original_context`` is small here (16, not
  8192) so that the tiny model's few positions see the scaling."""
  freqs = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  low_wl, high_wl = original_context / low_freq_factor, original_context / high_freq_factor
  out = []
  for f in freqs:
    wl = 2 * math.pi / f
    if wl < high_wl:
      out.append(1.0)
    elif wl > low_wl:
      out.append(factor)
    else:
      smooth = (original_context / wl - low_freq_factor) / (high_freq_factor - low_freq_factor)
      out.append(1 / ((1 - smooth) / factor + smooth))
  return np.asarray(out, np.float32)


def tensor_shapes(s: Spec) -> dict[str, tuple[int, ...]]:
  """Every tensor's NumPy shape (``[out, in]``; experts ``[E, out, in]``) by GGUF name."""
  v, d, hd = vocab_size(), s.hidden, s.head_dim
  q, kv = s.heads * hd, s.kv_heads * hd
  t: dict[str, tuple[int, ...]] = {"token_embd.weight": (v, d), "output_norm.weight": (d,)}
  if not s.tied:
    t["output.weight"] = (v, d)
  if s.rope_freqs:
    t["rope_freqs.weight"] = (hd // 2,)
  for i in range(s.layers):
    b = f"blk.{i}."
    if s.norms in ("pre", "pre+post"):
      t[b + "attn_norm.weight"] = (d,)
    t[b + "attn_q.weight"], t[b + "attn_k.weight"] = (q, d), (kv, d)
    t[b + "attn_v.weight"], t[b + "attn_output.weight"] = (kv, d), (d, q)
    if s.qkv_bias:
      t[b + "attn_q.bias"], t[b + "attn_k.bias"], t[b + "attn_v.bias"] = (q,), (kv,), (kv,)
    if s.qk_norm == "head":
      t[b + "attn_q_norm.weight"], t[b + "attn_k_norm.weight"] = (hd,), (hd,)
    elif s.qk_norm == "full":
      t[b + "attn_q_norm.weight"], t[b + "attn_k_norm.weight"] = (q,), (kv,)
    if s.norms in ("pre+post", "post"):
      t[b + "post_attention_norm.weight"] = (d,)
    if s.norms in ("pre", "pre+post"):
      t[b + "ffn_norm.weight"] = (d,)
    if s.experts:
      e, f = s.experts, s.expert_ffn
      t[b + "ffn_gate_inp.weight"] = (e, d)
      t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"] = (e, f, d), (e, f, d)
      t[b + "ffn_down_exps.weight"] = (e, d, f)
    else:
      t[b + "ffn_gate.weight"], t[b + "ffn_up.weight"] = (s.ffn, d), (s.ffn, d)
      t[b + "ffn_down.weight"] = (d, s.ffn)
    if s.norms in ("pre+post", "post"):
      t[b + "post_ffw_norm.weight"] = (d,)
  return t


def _std(name: str, shape: tuple[int, ...], s: Spec) -> float:
  """The spread of a tensor's random values: 1/sqrt(in) for projections (activations stay
  O(1)), 0.25 for the embedding table (logits of spread ~4), 0.1 around the norms' 1."""
  if name == "token_embd.weight":
    return 0.25
  if name == "output.weight":
    return 0.25
  if name.endswith(".bias"):
    return 0.5
  return 1.0 / math.sqrt(shape[-1])


def f32_weights(s: Spec, seed: int = 0) -> dict[str, np.ndarray]:
  """The model's f32 weights by GGUF name (:func:`tensor_shapes`), from ``seed``."""
  rng = np.random.default_rng(seed)
  out = {}
  for name, shape in tensor_shapes(s).items():
    if name == "rope_freqs.weight":
      out[name] = llama3_rope_freqs(s.head_dim, s.rope_base)
    elif name.endswith("norm.weight"):
      out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    else:
      out[name] = (_std(name, shape, s) * rng.standard_normal(shape)).astype(np.float32)
  return out


def _use_more_bits(i: int, n: int) -> bool:
  """llama.cpp's ``use_more_bits`` (llama-quant.cpp): layers that Q4_K_M gives Q6_K."""
  return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_types(s: Spec) -> dict[str, str]:
  """The GGML type of each tensor in llama.cpp's Q4_K_M mix for this model: ``Q6_K`` for
  ``output.weight`` (or ``token_embd.weight`` when the head is tied), for ``attn_v`` and
  ``ffn_down`` (dense or experts) in the layers ``use_more_bits`` picks; ``F32`` for 1-D
  tensors and the MoE router (``ffn_gate_inp``); ``Q4_K`` for the rest."""
  types = {}
  for name, shape in tensor_shapes(s).items():
    if len(shape) == 1 or "ffn_gate_inp" in name:
      types[name] = "F32"
    elif name == "output.weight" or (s.tied and name == "token_embd.weight"):
      types[name] = "Q6_K"
    elif ".attn_v." in name or ".ffn_down" in name:
      i = int(name.split(".")[1])
      types[name] = "Q6_K" if _use_more_bits(i, s.layers) else "Q4_K"
    else:
      types[name] = "Q4_K"
  return types


def _random_k_blocks(qtype: str, rows: int, cols: int, std: float, rng) -> np.ndarray:
  """``u8[rows, bytes]``: random ``qtype`` (Q4_K or Q6_K) blocks of 256 values along
  ``cols``, every field uniform except the f16 block scales, set so the values' spread is
  ``std`` (each block's scale times a random factor in [0.5, 1.5])."""
  import gguf
  q = gguf.GGMLQuantizationType[qtype]
  bs, tb = gguf.GGML_QUANT_SIZES[q]
  nb = rows * cols // bs
  blocks = rng.integers(0, 256, size=(nb, tb), dtype=np.uint8)
  jitter = rng.uniform(0.5, 1.5, nb)
  def set_scales(d):
    d16 = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    if qtype == "Q4_K":  # d, dmin at the front; dmin = 7.5 d centres d*sc*q - dmin*m
      blocks[:, 0:2] = d16
      blocks[:, 2:4] = (d * 7.5).astype(np.float16).view(np.uint8).reshape(nb, 2)
    else:  # Q6_K: d at the end
      blocks[:, -2:] = d16
  set_scales(jitter)
  spread = float(gguf.quants.dequantize(blocks.reshape(rows, -1), q).std())
  set_scales(jitter * std / spread)
  return blocks.reshape(rows, -1)


def quantized(name: str, w: np.ndarray, qtype: str, s: Spec, rng) -> tuple[np.ndarray, str]:
  """``(stored array, GGML type)`` of tensor ``name`` with f32 values ``w`` stored as
  ``qtype``: f32/f16 as NumPy arrays, legacy block types quantized from ``w``
  (``gguf.quants.quantize``), K-quants random blocks of ``w``'s spread and shape."""
  import gguf
  if qtype == "F32":
    return w, qtype
  if qtype == "F16":
    return w.astype(np.float16), qtype
  if qtype in ("Q4_K", "Q6_K"):
    rows = int(np.prod(w.shape[:-1]))
    raw = _random_k_blocks(qtype, rows, w.shape[-1], _std(name, w.shape, s), rng)
    return raw.reshape(*w.shape[:-1], -1), qtype
  return gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype]), qtype


def _metadata(w, s: Spec, qtype: str, tokenizer: dict | None = None) -> None:
  """Writes the architecture's keys as llama.cpp's converter does, then the tokenizer's."""
  import gguf
  a = s.arch
  w.add_name(f"hxmlir tiny random {a}")
  w.add_context_length(s.context_length)
  w.add_embedding_length(s.hidden)
  w.add_block_count(s.layers)
  w.add_feed_forward_length(s.ffn)
  w.add_head_count(s.heads)
  w.add_head_count_kv(s.kv_heads)
  w.add_layer_norm_rms_eps(s.rms_eps)
  w.add_rope_freq_base(s.rope_base)
  w.add_vocab_size(vocab_size())
  if a == "llama":
    w.add_rope_dimension_count(s.head_dim)
  if s.key_length:
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
  if s.attn_softcap is not None:
    w.add_attn_logit_softcapping(s.attn_softcap)
  if s.final_softcap is not None:
    w.add_final_logit_softcapping(s.final_softcap)
  if s.sliding_window is not None:
    w.add_sliding_window(s.sliding_window)
  if s.experts:
    w.add_expert_count(s.experts)
    w.add_expert_used_count(s.experts_used)
    w.add_expert_feed_forward_length(s.expert_ffn)
  w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32"
                  else gguf.LlamaFileType[f"MOSTLY_{qtype}"])
  w.add_quantization_version(gguf.GGML_QUANT_VERSION)
  tok = {**vocab_metadata(), **(tokenizer or {})}
  w.add_tokenizer_model(tok["tokenizer.ggml.model"])
  w.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
  w.add_token_list(tok["tokenizer.ggml.tokens"])
  w.add_token_types(tok["tokenizer.ggml.token_type"])
  w.add_token_merges(tok["tokenizer.ggml.merges"])
  w.add_bos_token_id(tok["tokenizer.ggml.bos_token_id"])
  w.add_eos_token_id(tok["tokenizer.ggml.eos_token_id"])
  w.add_unk_token_id(tok["tokenizer.ggml.unknown_token_id"])
  w.add_pad_token_id(tok["tokenizer.ggml.padding_token_id"])
  w.add_add_bos_token(False)
  w.add_chat_template(tok["tokenizer.chat_template"])


def spec(family: str) -> Spec:
  """The :class:`Spec` of ``family``; ``KeyError`` naming the known ones otherwise."""
  if family not in FAMILIES:
    raise KeyError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
  return FAMILIES[family]


def write(path: str | os.PathLike, family: str, *, seed: int = 0, qtype: str = "F32",
          tokenizer: dict | None = None, **overrides) -> dict[str, np.ndarray]:
  """Write ``family``'s tiny model (:data:`FAMILIES`; ``overrides``: :class:`Spec` fields
  to change, e.g. ``layers=1``) to ``path`` with its tensors stored as ``qtype``
  (:data:`QTYPES`). ``tokenizer``: ``tokenizer.ggml.*`` values replacing the vocabulary's
  (e.g. another ``tokenizer.ggml.pre``). Returns the exact f32 values the file holds by
  tensor name (NumPy shapes, ``[out, in]``). The same arguments give the same bytes."""
  import gguf
  if qtype not in QTYPES:
    raise ValueError(f"qtype={qtype!r} is not one of {', '.join(QTYPES)}")
  s = replace(spec(family), **overrides)
  weights = f32_weights(s, seed)
  types = q4_k_m_types(s) if qtype == "Q4_K_M" else {
      n: ("F32" if w.ndim == 1 or "ffn_gate_inp" in n else qtype) for n, w in weights.items()}
  rng = np.random.default_rng([seed, 1])
  w = gguf.GGUFWriter(os.fspath(path), s.arch)
  _metadata(w, s, qtype, tokenizer)
  exact = {}
  for name, value in weights.items():
    stored, t = quantized(name, value, types[name], s, rng)
    qt = gguf.GGMLQuantizationType[t]
    if t in ("F32", "F16"):
      w.add_tensor(name, stored)
      exact[name] = stored.astype(np.float32)
    else:
      w.add_tensor(name, stored, raw_dtype=qt)
      exact[name] = gguf.quants.dequantize(stored, qt).reshape(value.shape)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return exact


def write_weights(path: str | os.PathLike, family: str, weights: dict[str, np.ndarray],
                  **overrides) -> None:
  """Write ``family``'s model with the given f32 ``weights`` (:func:`write`'s result) as an
  F32 file: the same model as the file they came from, its values exactly."""
  import gguf
  s = replace(spec(family), **overrides)
  w = gguf.GGUFWriter(os.fspath(path), s.arch)
  _metadata(w, s, "F32")
  for name in tensor_shapes(s):
    w.add_tensor(name, np.ascontiguousarray(weights[name], np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
