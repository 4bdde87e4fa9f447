"""The weights pytree of a GGUF decoder: the checkpoint's tensors under short keys.

``{"embed": q8[vocab, d], "norm": f32[d], "layers": [{...}, ...]}`` plus ``"output"`` when
the head is not tied and ``"rope_freqs": f32[head_dim / 2]`` when the file has Llama 3's
factors. A layer holds what its :class:`~hxmlir.models.arch.Config` reads (:data:`LAYER`):
``q``, ``k``, ``v``, ``o``; the norms of ``cfg.norms`` (``attn_norm``, ``attn_post_norm``,
``ffn_norm``, ``ffn_post_norm``); ``q_norm``/``k_norm``; ``q_bias``/``k_bias``/``v_bias``;
``gate``, ``up``, ``down`` (dense FFN) or ``router: f32[experts, d]`` and the expert stacks
``gate_exps``/``up_exps: q8[experts, ffn, d]``, ``down_exps: q8[experts, d, ffn]``.
Values are the checkpoint's (:func:`hxmlir.gguf.load`), not copied, except where
:func:`params_of` fuses projections that read the same input.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from hxmlir.gguf import GGUFError
from hxmlir.models.arch import NORM_TENSORS, Config
from hxmlir.types.qarray import QArrayTy, dequantize, make_qarray, qarray_parts

LAYER = {"q": "attn_q.weight", "k": "attn_k.weight", "v": "attn_v.weight",
         "o": "attn_output.weight", "attn_norm": "attn_norm.weight",
         "attn_post_norm": "post_attention_norm.weight", "ffn_norm": "ffn_norm.weight",
         "ffn_post_norm": "post_ffw_norm.weight", "q_norm": "attn_q_norm.weight",
         "k_norm": "attn_k_norm.weight", "q_bias": "attn_q.bias", "k_bias": "attn_k.bias",
         "v_bias": "attn_v.bias", "gate": "ffn_gate.weight", "up": "ffn_up.weight",
         "down": "ffn_down.weight", "router": "ffn_gate_inp.weight",
         "gate_exps": "ffn_gate_exps.weight", "up_exps": "ffn_up_exps.weight",
         "down_exps": "ffn_down_exps.weight"}
"""Layer key -> the tensor ``blk.N.<name>`` it holds."""

NORM_KEYS = {"attn_pre": "attn_norm", "attn_post": "attn_post_norm", "ffn_pre": "ffn_norm",
             "ffn_post": "ffn_post_norm"}
"""Norm position (:attr:`Config.norms`) -> layer key."""
assert {LAYER[v].split(".")[0] for v in NORM_KEYS.values()} == set(NORM_TENSORS.values())

FUSED = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}
"""Projections that read the same ``x``, held as one weight by :func:`params_of`
(``fuse=True``): ``name: (parts, ...)`` concatenated along ``out`` in this order."""


def layer_keys(cfg: Config) -> tuple[str, ...]:
  """The keys of one layer of :func:`params_of` (unfused) for ``cfg``."""
  keys = ["q", "k", "v", "o", *(NORM_KEYS[n] for n in cfg.norms)]
  if cfg.qk_norm != "none":
    keys += ["q_norm", "k_norm"]
  if cfg.qkv_bias:
    keys += ["q_bias", "k_bias", "v_bias"]
  keys += ["router", "gate_exps", "up_exps", "down_exps"] if cfg.experts else [
      "gate", "up", "down"]
  return tuple(keys)


def tensor_names(cfg: Config, layers: int | None = None) -> set[str]:
  """The tensors :func:`params_of` reads for ``cfg`` (its first ``layers`` blocks)."""
  names = {"token_embd.weight", "output_norm.weight"}
  names |= {"output.weight"} - ({"output.weight"} if cfg.tied else set())
  names |= {"rope_freqs.weight"} if cfg.rope_factors else set()
  keys = layer_keys(cfg)
  n = cfg.layers if layers is None else layers
  return names | {f"blk.{i}.{LAYER[k]}" for i in range(n) for k in keys}


def params_of(ck, cfg: Config, *, fuse: bool = True) -> dict[str, Any]:
  """The weights pytree (module docstring) of a loaded checkpoint ``ck``
  (:func:`hxmlir.gguf.load`) for ``cfg``.

  ``fuse``: in each layer, the weights that multiply the same activation (:data:`FUSED`:
  Q/K/V, gate/up) are held as one weight concatenated along ``out`` (``"qkv":
  u4o[(heads + 2 kv_heads) * head_dim, d:g32,f16]``) where their formats agree, so each is
  one ``hx.matmul_q`` call; the forward splits the result. Parts of different formats
  stay separate. Raises :class:`hxmlir.gguf.GGUFError` naming a missing tensor."""
  def get(name):
    if name not in ck.tensors:
      raise GGUFError(f"{ck.path}: tensor {name!r} is missing")
    return ck.tensors[name]
  keys = layer_keys(cfg)
  layers = [{k: get(f"blk.{i}.{LAYER[k]}") for k in keys} for i in range(cfg.layers)]
  if fuse:
    layers = [_fuse(p) for p in layers]
  params = {"embed": get("token_embd.weight"), "norm": get("output_norm.weight"),
            "layers": layers}
  if not cfg.tied:
    params["output"] = get("output.weight")
  if cfg.rope_factors:
    params["rope_freqs"] = jnp.asarray(get("rope_freqs.weight"), jnp.float32)
  return params


def _fuse(p: dict[str, Any]) -> dict[str, Any]:
  """Layer ``p`` with each group of :data:`FUSED` concatenated along ``out`` when all its
  parts are quantized arrays of one format (:func:`hxmlir.qarray_parts` of each,
  concatenated along axis 0, reassembled by :func:`hxmlir.make_qarray`)."""
  p = dict(p)
  for name, parts in FUSED.items():
    if not all(k in p for k in parts):
      continue
    types = [jax.typeof(p[k]) for k in parts]
    if not all(isinstance(t, QArrayTy) for t in types) or len(
        {(t.fmt, t.group, t.shape[1:]) for t in types}) != 1:
      continue
    comps = zip(*(qarray_parts(p[k]) for k in parts))
    p[name] = make_qarray(*(jnp.concatenate(c, axis=0) for c in comps))
    for k in parts:
      del p[k]
  return p


def dequantized(params: dict[str, Any]) -> dict[str, Any]:
  """``params`` with every quantized weight replaced by ``f32`` :func:`hxmlir.dequantize`
  of it (same pytree structure): the dense f32 decoder that the quantized one replaces,
  run by the same forward (``jnp.einsum`` and ``jnp.take`` instead of ``hx.einsum`` and
  ``hx.take_rows``)."""
  deq = jax.jit(dequantize)
  return jax.tree.map(lambda v: deq(v) if isinstance(jax.typeof(v), QArrayTy) else v,
                      params)
