"""A float64 NumPy forward pass of each gguf_families family, written from llama.cpp's graph
builders (``src/models/{llama,qwen2,qwen3,gemma2-iswa,gemma3,olmo2,qwen3moe}.cpp`` and the
hyper-parameters ``src/llama-model.cpp`` sets): a second reading of the architectures, to
check the llama.cpp fixtures and the file writer against (not hxmlir's decoder).

What each family does here (``Spec`` fields, gguf_families.py):

* embeddings ``E[ids]``, times ``sqrt(hidden)`` for gemma2/gemma3;
* per layer: RMSNorm before attention (``norms`` "pre" or "pre+post"); Q/K/V projections
  (+ biases for qwen2); q/k RMSNorm per head (qwen3, gemma3, qwen3moe) or over the whole
  projection (olmo2); rotary embeddings on consecutive pairs (``llama``: llama.cpp's NORM)
  or halves (the others: NEOX), frequencies ``base^(-2i/d)`` divided by ``rope_freqs``;
  gemma3's local layers (5 of every 6) with base 10000; scores ``q.k / sqrt(head_dim)``,
  soft-capped ``cap * tanh(s / cap)`` (gemma2); causal, and on sliding-window layers
  (gemma2: even layers; gemma3: all but every sixth) only keys with ``t - s < window``;
  the output projection, RMSNorm after it ("pre+post", "post"), the residual;
* the FFN on RMSNorm(x) ("pre", "pre+post") or x ("post"): ``down(act(gate) * up)`` with
  SiLU, or GELU (tanh form) for gemma; qwen3moe: softmax router over the experts, the top
  ``experts_used`` weights renormalized to sum 1, the chosen experts' SwiGLU FFNs summed;
  RMSNorm after it ("pre+post", "post"), the residual;
* final RMSNorm, the head (``output.weight`` or the embedding), gemma2's final soft-cap.
"""

from __future__ import annotations

import math

import numpy as np
from gguf_families import Spec


def _rms(x, w, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, base, neox, factors=None):
  """x: [T, H, d] rotated at positions pos: [T]."""
  d = x.shape[-1]
  inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
  if factors is not None:
    inv = inv / np.asarray(factors, np.float64)
  ang = pos[:, None, None].astype(np.float64) * inv[None, None, :]
  cos, sin = np.cos(ang), np.sin(ang)
  if neox:
    x0, x1 = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)
  x0, x1 = x[..., 0::2], x[..., 1::2]
  return np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).reshape(x.shape)


def _gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _silu(x):
  return x / (1 + np.exp(-x))


def swa_layer(s: Spec, i: int) -> bool:
  """Whether layer ``i`` uses the sliding window (llama.cpp's ``set_swa_pattern``: gemma2
  2, gemma3 6: layer ``i`` is local when ``i % n < n - 1``)."""
  n = {"gemma2": 2, "gemma3": 6}.get(s.arch)
  return s.sliding_window is not None and n is not None and i % n < n - 1


def logits(s: Spec, w: dict[str, np.ndarray], ids) -> np.ndarray:
  """f64[T, vocab]: the teacher-forced logits of ``ids`` (positions 0..T-1) for the model
  ``s`` with weights ``w`` (gguf_families' names, NumPy shapes)."""
  w = {k: np.asarray(v, np.float64) for k, v in w.items()}
  ids = np.asarray(ids)
  t, hd, eps = ids.size, s.head_dim, s.rms_eps
  pos = np.arange(t)
  gemma = s.arch in ("gemma2", "gemma3")
  x = w["token_embd.weight"][ids]
  if gemma:
    x = x * math.sqrt(s.hidden)
  neox = s.arch != "llama"
  factors = w.get("rope_freqs.weight")
  for i in range(s.layers):
    b = f"blk.{i}."
    h = _rms(x, w[b + "attn_norm.weight"], eps) if s.norms != "post" else x
    q, k, v = (h @ w[b + f"attn_{n}.weight"].T for n in "qkv")
    if s.qkv_bias:
      q, k, v = (y + w[b + f"attn_{n}.bias"] for y, n in zip((q, k, v), "qkv"))
    if s.qk_norm == "full":
      q, k = _rms(q, w[b + "attn_q_norm.weight"], eps), _rms(k, w[b + "attn_k_norm.weight"], eps)
    q, k = q.reshape(t, s.heads, hd), k.reshape(t, s.kv_heads, hd)
    v = v.reshape(t, s.kv_heads, hd)
    if s.qk_norm == "head":
      q, k = _rms(q, w[b + "attn_q_norm.weight"], eps), _rms(k, w[b + "attn_k_norm.weight"], eps)
    local = swa_layer(s, i)
    base = 10000.0 if (s.arch == "gemma3" and local) else s.rope_base
    q, k = _rope(q, pos, base, neox, factors), _rope(k, pos, base, neox, factors)
    g = s.heads // s.kv_heads
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    sc = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
    if s.attn_softcap is not None:
      sc = s.attn_softcap * np.tanh(sc / s.attn_softcap)
    mask = pos[None, :] <= pos[:, None]
    if local:
      mask &= (pos[:, None] - pos[None, :]) < s.sliding_window
    sc = np.where(mask[None], sc, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    a = np.einsum("hts,shd->thd", p, v).reshape(t, s.heads * hd) @ w[b + "attn_output.weight"].T
    if s.norms != "pre":
      a = _rms(a, w[b + "post_attention_norm.weight"], eps)
    x = x + a
    h = _rms(x, w[b + "ffn_norm.weight"], eps) if s.norms != "post" else x
    if s.experts:
      r = h @ w[b + "ffn_gate_inp.weight"].T
      r = np.exp(r - r.max(-1, keepdims=True))
      r /= r.sum(-1, keepdims=True)
      f = np.zeros_like(h)
      for j in range(t):
        top = np.argsort(-r[j], kind="stable")[:s.experts_used]
        wt = r[j, top] / r[j, top].sum()
        for e, c in zip(top, wt):
          u = _silu(w[b + "ffn_gate_exps.weight"][e] @ h[j]) * (w[b + "ffn_up_exps.weight"][e] @ h[j])
          f[j] += c * (w[b + "ffn_down_exps.weight"][e] @ u)
    else:
      act = _gelu_tanh if gemma else _silu
      f = (act(h @ w[b + "ffn_gate.weight"].T) * (h @ w[b + "ffn_up.weight"].T)) @ \
          w[b + "ffn_down.weight"].T
    if s.norms != "pre":
      f = _rms(f, w[b + "post_ffw_norm.weight"], eps)
    x = x + f
  x = _rms(x, w["output_norm.weight"], eps)
  out = x @ w.get("output.weight", w["token_embd.weight"]).T
  if s.final_softcap is not None:
    out = s.final_softcap * np.tanh(out / s.final_softcap)
  return out
