"""A small deterministic transformer: the built-in model of ``hxmlir demo``.

A stack of pre-LayerNorm transformer blocks (self-attention and a GELU MLP,
Vaswani et al. 2017, with the pre-LN placement of Xiong et al. 2020) over
``x: f32[batch, seq, d_model]``. Weights come from a fixed NumPy PCG64 seed, so
every machine builds the same model without downloading anything. Every dense
weight is stored ``[in, out]``; :func:`quantize_params` turns each into a
``q8[in, out]`` used through :func:`hxmlir.matmul_q`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hxmlir.models import _nn

DENSE_WEIGHTS = ("wq", "wk", "wv", "wo", "w1", "w2")
"""Names of the dense weights of a block (each ``[in, out]``)."""

LN_EPS = 1e-5


@dataclass(frozen=True)
class Config:
  """Sizes of the built-in model.

  The defaults (12.6 M weights, 50 MiB as f32) run one step over a small batch
  (2 x 8 = 16 tokens), where the dense layers are bound by reading their
  weights -- the regime int8 weights are for -- in tens of milliseconds on
  one CPU core.
  """
  layers: int = 4
  d_model: int = 512
  heads: int = 8
  d_ff: int = 2048
  batch: int = 2
  seq: int = 8
  seed: int = 0


def init_params(cfg: Config = Config()) -> dict[str, Any]:
  """Deterministic f32 parameters: ``{"blocks": [...], "ln_g", "ln_b"}``.

  Each block holds ``ln1_g, ln1_b, ln2_g, ln2_b: f32[d]``, ``wq, wk, wv, wo:
  f32[d, d]``, ``w1: f32[d, d_ff]``, ``b1: f32[d_ff]``, ``w2: f32[d_ff, d]``,
  ``b2: f32[d]``. Dense weights are ``N(0, 1/fan_in)`` from
  ``numpy.random.default_rng(cfg.seed)``; norms start near identity.
  """
  rng = np.random.default_rng(cfg.seed)
  d, f = cfg.d_model, cfg.d_ff

  def dense(k, n):
    return (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)

  def vec(n, base, spread):
    return (base + spread * rng.standard_normal(n)).astype(np.float32)

  blocks = []
  for _ in range(cfg.layers):
    blocks.append({
        "ln1_g": vec(d, 1.0, 0.1), "ln1_b": vec(d, 0.0, 0.1),
        "wq": dense(d, d), "wk": dense(d, d), "wv": dense(d, d), "wo": dense(d, d),
        "ln2_g": vec(d, 1.0, 0.1), "ln2_b": vec(d, 0.0, 0.1),
        "w1": dense(d, f), "b1": vec(f, 0.0, 0.1),
        "w2": dense(f, d), "b2": vec(d, 0.0, 0.1),
    })
  return {"blocks": blocks, "ln_g": vec(d, 1.0, 0.1), "ln_b": vec(d, 0.0, 0.1)}


def quantize_params(params: dict[str, Any], dtype=jnp.int8, *, group_size: int | None = None,
                    method: str = "absmax") -> dict[str, Any]:
  """``params`` with every dense weight ``f32[k, n]`` replaced by ``hx.quantize(w): q8[k, n]``
  (or, with ``dtype``/``group_size``/``method``, that format: :func:`hxmlir.quantize`)."""
  return _nn.quantize_weights(params, DENSE_WEIGHTS, dtype, group_size=group_size, method=method)


def example_input(cfg: Config = Config()) -> np.ndarray:
  """The demo's input ``x: f32[batch, seq, d_model]``, deterministic (seed ``cfg.seed + 1``)."""
  rng = np.random.default_rng(cfg.seed + 1)
  return rng.standard_normal((cfg.batch, cfg.seq, cfg.d_model)).astype(np.float32)


def forward(params: dict[str, Any], x, *, heads: int = Config.heads, naive: bool = False):
  """The model: ``x: f32[b, s, d] -> f32[b, s, d]``.

  ``params`` from :func:`init_params` (f32) or :func:`quantize_params` (q8
  dense weights, applied with ``hx.matmul_q``; with ``naive=True`` by
  dequantizing each weight and doing an f32 dot instead).
  """
  lin = lambda h, w, b=None: _nn.linear(h, w, b, naive=naive)
  for blk in params["blocks"]:
    h = _nn.layer_norm(x, blk["ln1_g"], blk["ln1_b"], LN_EPS)
    a = _nn.attention(lin(h, blk["wq"]), lin(h, blk["wk"]), lin(h, blk["wv"]), heads)
    x = x + lin(a, blk["wo"])
    h = _nn.layer_norm(x, blk["ln2_g"], blk["ln2_b"], LN_EPS)
    x = x + lin(jax.nn.gelu(lin(h, blk["w1"], blk["b1"]), approximate=False), blk["w2"], blk["b2"])
  return _nn.layer_norm(x, params["ln_g"], params["ln_b"], LN_EPS)


def as_jax(params: dict[str, Any]) -> dict[str, Any]:
  """``params`` with NumPy leaves moved to device arrays (hi values are kept)."""
  return jax.tree.map(lambda a: a if _nn.is_quantized(a) else jnp.asarray(a), params)
