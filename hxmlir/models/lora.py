"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") over a GGUF
decoder whose weights stay in their stored formats (QLoRA's setting, Dettmers et al. 2023).

A projection ``y = x @ W.T`` (``W[out, in]``, the file's quantized weight, untouched)
becomes ``y = x @ W.T + (alpha / r) * (x @ A.T) @ B.T`` with adapters ``A: f32[r, in]``
(small random, seeded) and ``B: f32[out, r]`` (zero: the adapted model starts as the base
model). Adapters sit on logical projections (:data:`TARGETS`: ``q``, ``k``, ``v``, ``o``,
``gate``, ``up``, ``down``), also where the decoder holds Q/K/V or gate/up as one fused
weight (:data:`hxmlir.models.params.FUSED`): the fused product is split, then each part gets
its own adapter. Mixture-of-experts layers take adapters on attention only.

Python API::

  from hxmlir.models import from_gguf, lora
  m = from_gguf(path, max_context=256)
  spec = lora.LoraSpec(rank=8, alpha=16.0)                 # targets: TARGETS
  adapters = lora.init(m.config, spec, seed=0)             # [{ "q": {"a", "b"}, ...}, ...]
  tr = lora.Trainer(m, spec, optax.adam(1e-3), seq_len=64)
  adapters, opt_state, loss = tr.step(adapters, opt_state, ids, mask)
  lora.save("a.safetensors", adapters, spec, base=path)
  lora.apply(m, lora.load("a.safetensors", m)[0], spec)  # m.generate(...) now adapted

Gradients flow to the adapters only: the weights are closed over as constants of the
loss, so ``jax.grad`` never forms a weight cotangent. Through each quantized projection
the backward is ``hx.matmul_q``'s transpose in ``x``: ``g @ W`` as ``hx.einsum("...n,nk->...k",
g, W)`` on the weight as stored (:class:`hxmlir.types.qarray.MatmulQ`), on CPU the native
kernel ``hx_matmul_q_cpu_nkt_v1`` (no dequantized f32 weight is formed).

The adapter file (:func:`save`) is safetensors with llama.cpp's LoRA tensor names
(``blk.N.attn_q.weight.lora_a``: ``f32[r, in]``, ``...lora_b``: ``f32[out, r]``) and
string metadata ``rank``, ``alpha``, ``targets`` (comma-separated), ``base`` (the GGUF
file's name), ``family``, ``layers``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hxmlir.models.arch import Config
from hxmlir.models.forward import LAYER_OUT, head, hidden
from hxmlir.models.params import LAYER

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""The projections an adapter may sit on (layer keys of :mod:`hxmlir.models.params`)."""

class AdapterError(ValueError):
  """An adapter file that does not fit the model (names the file and the tensor)."""


@dataclass(frozen=True)
class LoraSpec:
  """What to adapt: ``rank`` (``r``, >= 1), ``alpha`` (the adapter's output is scaled by
  ``alpha / rank``), ``targets`` (a subset of :data:`TARGETS`)."""
  rank: int = 8
  alpha: float = 16.0
  targets: tuple[str, ...] = TARGETS

  def __post_init__(self):
    if not isinstance(self.rank, int) or self.rank < 1:
      raise ValueError(f"rank={self.rank!r} must be an int >= 1")
    bad = [t for t in self.targets if t not in TARGETS]
    if bad or not self.targets:
      raise ValueError(f"targets {bad or '(none)'} are not projections; choose among "
                       f"{', '.join(TARGETS)}")
    object.__setattr__(self, "targets", tuple(self.targets))

  @property
  def scale(self) -> float:
    """``alpha / rank``."""
    return float(self.alpha) / self.rank


def shapes(cfg: Config, spec: LoraSpec) -> dict[str, tuple[int, int]]:
  """``{target: (out, in)}`` of the projections ``spec`` adapts in every layer of ``cfg``.
  Raises ``ValueError`` for an FFN target on a mixture-of-experts model."""
  q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
  all_ = {"q": (q, cfg.hidden), "k": (kv, cfg.hidden), "v": (kv, cfg.hidden),
          "o": (cfg.hidden, q), "gate": (cfg.ffn, cfg.hidden), "up": (cfg.ffn, cfg.hidden),
          "down": (cfg.hidden, cfg.ffn)}
  if cfg.experts:
    ffn = [t for t in spec.targets if t in ("gate", "up", "down")]
    if ffn:
      raise ValueError(f"targets {ffn}: this {cfg.family} model's FFN is a mixture of "
                       "experts; adapt the attention projections (q, k, v, o) only")
  return {t: all_[t] for t in spec.targets}


def default_spec(cfg: Config, rank: int = 8, alpha: float = 16.0) -> LoraSpec:
  """:class:`LoraSpec` with every target the model has (attention only for MoE)."""
  targets = ("q", "k", "v", "o") if cfg.experts else TARGETS
  return LoraSpec(rank=rank, alpha=alpha, targets=targets)


def init(cfg: Config, spec: LoraSpec, seed: int = 0) -> list[dict[str, dict[str, jax.Array]]]:
  """Fresh adapters, one dict per layer ``{target: {"a": f32[r, in], "b": f32[out, r]}}``:
  ``a`` uniform in ``[-1/sqrt(in), 1/sqrt(in)]`` (PEFT's Kaiming-uniform default) from
  ``numpy.random.default_rng(seed)``, ``b`` zero."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(cfg.layers):
    layer = {}
    for t, (n, k) in shapes(cfg, spec).items():
      a = rng.uniform(-1, 1, (spec.rank, k)) / np.sqrt(k)
      layer[t] = {"a": jnp.asarray(a, jnp.float32), "b": jnp.zeros((n, spec.rank), jnp.float32)}
    out.append(layer)
  return out


def attach(params: dict[str, Any], adapters, scale) -> dict[str, Any]:
  """``params`` with layer ``i``'s adapters under its ``"lora"`` key (each with ``"scale"``),
  read by :func:`hxmlir.models.forward.adapted`; the weights are the same objects."""
  layers = [{**p, "lora": {t: {**ad, "scale": jnp.asarray(scale, jnp.float32)}
                           for t, ad in a.items()}}
            for p, a in zip(params["layers"], adapters, strict=True)]
  return {**params, "layers": layers}


def apply(model, adapters, spec: LoraSpec) -> None:
  """Make ``model`` (a :class:`hxmlir.models.Decoder`) run with ``adapters``: its
  ``params`` get them attached (:func:`attach`); its jitted functions retrace once. The
  quantized weights are not changed (no merge)."""
  base = {**model.params, "layers": [{k: v for k, v in p.items() if k != "lora"}
                                     for p in model.params["layers"]]}
  model.params = attach(base, adapters, spec.scale)


# Tokens per chunk of the loss's head (:func:`loss`): the logits of one chunk at a time,
# f32[LOSS_CHUNK, vocab], are what the step keeps of the vocabulary.
LOSS_CHUNK = 16


def loss(adapters, params, ids, mask, *, cfg: Config, scale: float, remat: bool = False,
         proj=None):
  """Mean next-token cross-entropy of ``ids: i32[T]`` under the adapted model: position
  ``t`` predicts ``ids[t + 1]``, weighted by ``mask: f32[T]`` at ``t + 1`` (0 for padding),
  divided by the weight's sum -> ``f32[]``. ``remat``: keep only each layer's output for
  the backward pass (``jax.checkpoint`` with :data:`LAYER_OUT` saved), recomputing the
  rest layer by layer. ``proj``: the decoder's projection (:func:`hxmlir.models.forward.forward`'s;
  on a mesh :func:`hxmlir.models.llama_sharding.projection`), ``None`` for one device.

  Each position's loss is ``logsumexp(z) - z[target]`` of its logits ``z``, computed
  :data:`LOSS_CHUNK` positions at a time (``lax.map``) with the head recomputed in the
  backward pass (``jax.checkpoint``): the step holds one chunk's logits, never
  ``f32[T, vocab]`` (for SmolLM2 at 64 tokens, 12 MiB of logits and as much of their
  gradient), for one more head product per step."""
  t = ids.shape[0]
  kw = {} if proj is None else {"proj": proj}
  k = tuple(jnp.zeros((cfg.kv_heads, t, cfg.head_dim), jnp.float32) for _ in range(cfg.layers))
  v = tuple(jnp.zeros((cfg.kv_heads, cfg.head_dim, t), jnp.float32) for _ in range(cfg.layers))

  def hidden_of(adapters):
    return hidden(attach(params, adapters, scale), ids, jnp.int32(0), k, v, cfg=cfg, **kw)[0]
  if remat:
    policy = jax.checkpoint_policies.save_only_these_names(LAYER_OUT)
    hidden_of = jax.checkpoint(hidden_of, policy=policy)
  x = hidden_of(adapters)[:-1]
  n = -(-(t - 1) // LOSS_CHUNK)
  pad = n * LOSS_CHUNK - (t - 1)
  x = jnp.pad(x, ((0, pad), (0, 0))).reshape(n, LOSS_CHUNK, x.shape[-1])
  targets = jnp.pad(ids[1:], (0, pad)).reshape(n, LOSS_CHUNK)

  @jax.checkpoint
  def nll(chunk):
    xc, tc = chunk
    z = head(params, xc, cfg=cfg, **kw)
    return jax.nn.logsumexp(z, axis=-1) - jnp.take_along_axis(z, tc[:, None], axis=-1)[:, 0]
  per_position = jax.lax.map(nll, (x, targets)).reshape(-1)[:t - 1]
  w = mask[1:]
  return jnp.sum(per_position * w) / jnp.maximum(jnp.sum(w), 1.0)


class Trainer:
  """One jitted training step over ``model`` (a :class:`hxmlir.models.Decoder`; its weights
  in their formats, or :func:`hxmlir.models.params.dequantized` ones for the f32
  baseline) for sequences of ``seq_len`` tokens:

  ``step(adapters, opt_state, ids: i32[seq_len], mask: f32[seq_len]) -> (adapters,
  opt_state, loss: f32[])``, one ``optimizer`` (an optax ``GradientTransformation``)
  update of the gradient of :func:`loss` in the adapters only; ``adapters`` and
  ``opt_state`` are donated (their buffers are reused). Compiled once (``seq_len`` fixed),
  with the model's kernels setting (:class:`hxmlir.models.Decoder`'s ``kernels``).
  ``remat``: :func:`loss`'s; off by default: on SmolLM2 and Gemma 3 270M at 64 tokens it
  raised XLA's temporary memory (``benchmarks/finetune_cpu.py``), the activations being small
  beside the weights.

  On a mesh (a model made with ``mesh=``, its own weights: ``params`` ``None``) the step runs
  tensor-parallel: each projection by :func:`hxmlir.models.llama_sharding.projection` (the
  weights' shards on their devices), the adapters and the optimizer's state replicated."""

  def __init__(self, model, spec: LoraSpec, optimizer, *, seq_len: int, remat: bool = False,
               params=None):
    from hxmlir.integration.dispatch import jit as hx_jit
    from hxmlir.models.runtime import _installed_for
    self.model, self.spec, self.optimizer, self.seq_len = model, spec, optimizer, seq_len
    self.params = model.params if params is None else params
    self.params = {**self.params, "layers": [{k: v for k, v in p.items() if k != "lora"}
                                             for p in self.params["layers"]]}
    self.traces = 0
    cfg, scale = model.config, spec.scale
    mesh = getattr(model, "mesh", None) if params is None else None
    proj, placed, self._rep = None, {}, None
    if mesh is not None:
      from hxmlir.models import llama_sharding
      proj = llama_sharding.projection(self.params, mesh)
      rep = self._rep = llama_sharding.replicated(mesh)
      placed = {"in_shardings": (rep, rep, llama_sharding.param_shardings(self.params, mesh),
                                 rep, rep), "out_shardings": rep}

    def step(adapters, opt_state, params, ids, mask):
      self.traces += 1
      val, grads = jax.value_and_grad(loss)(adapters, params, ids, mask, cfg=cfg, scale=scale,
                                            remat=remat, proj=proj)
      updates, opt_state = optimizer.update(grads, opt_state, adapters)
      return jax.tree.map(jnp.add, adapters, updates), opt_state, val
    # a mesh: jax.jit (the weights' shardings come with them; hx.jit is for one device)
    self._jitted = (jax.jit if mesh is not None else hx_jit)(step, donate_argnums=(0, 1),
                                                             **placed)
    self._step = _installed_for(model.kernels, self._jitted, model.activations)

  def init(self, adapters):
    """The optimizer's state for ``adapters``."""
    return self._placed(self.optimizer.init(adapters))

  def _placed(self, tree):
    """``tree`` replicated on the mesh (every step's inputs placed alike: one trace), or
    itself on one device."""
    return tree if self._rep is None else jax.device_put(tree, self._rep)

  def _args(self, ids, mask):
    ids = np.asarray(ids, np.int32)
    mask = np.ones(ids.shape, np.float32) if mask is None else np.asarray(mask, np.float32)
    if ids.shape != (self.seq_len,) or mask.shape != ids.shape:
      raise ValueError(f"expected ids and mask of shape ({self.seq_len},), got "
                       f"{ids.shape} and {mask.shape}")
    return ids, mask

  def step(self, adapters, opt_state, ids, mask=None):
    """One update (class docstring); ``mask`` defaults to all ones."""
    return self._step(self._placed(adapters), self._placed(opt_state), self.params,
                      *self._args(ids, mask))

  def lower(self, adapters, opt_state, ids, mask=None):
    """The step's ``jax.stages.Lowered`` (for ``.compile().memory_analysis()``)."""
    return self._step.lower(self._placed(adapters), self._placed(opt_state), self.params,
                            *self._args(ids, mask))


# --- the adapter file ---------------------------------------------------------------------

def _tensor(i: int, target: str, part: str) -> str:
  return f"blk.{i}.{LAYER[target]}.lora_{part}"


def save(path: str | os.PathLike, adapters, spec: LoraSpec, *, base: str = "",
         cfg: Config | None = None) -> None:
  """Write ``adapters`` to a safetensors file ``path`` (module docstring: names and
  metadata; ``base``: the GGUF file they were trained on, its name recorded)."""
  from safetensors.numpy import save_file
  tensors = {_tensor(i, t, part): np.asarray(v, np.float32)
             for i, layer in enumerate(adapters) for t, ad in layer.items()
             for part, v in (("a", ad["a"]), ("b", ad["b"]))}
  meta = {"format": "hxmlir-lora", "rank": str(spec.rank), "alpha": repr(float(spec.alpha)),
          "targets": ",".join(spec.targets), "base": os.path.basename(os.fspath(base)),
          "layers": str(len(adapters))}
  if cfg is not None:
    meta["family"] = cfg.family
  save_file(tensors, os.fspath(path), metadata=meta)


def load(path: str | os.PathLike, model) -> tuple[list, LoraSpec]:
  """The adapters of the file ``path`` (:func:`save`'s) for ``model``'s description, and
  their :class:`LoraSpec`. Raises :class:`AdapterError` naming the file and the tensor (or
  key) when the file lacks its metadata, lacks a tensor the targets need, holds one they
  do not, or holds one of another shape or dtype than ``model`` needs."""
  from safetensors import safe_open
  path = os.fspath(path)
  cfg = model.config
  with safe_open(path, "numpy") as f:
    meta = f.metadata() or {}
    for key in ("rank", "alpha", "targets"):
      if key not in meta:
        raise AdapterError(f"{path}: metadata key {key!r} is missing: not an adapter file "
                           "written by hxmlir finetune")
    try:
      spec = LoraSpec(rank=int(meta["rank"]), alpha=float(meta["alpha"]),
                      targets=tuple(meta["targets"].split(",")))
    except ValueError as e:
      raise AdapterError(f"{path}: bad metadata: {e}") from None
    base = meta.get("base", "?")
    try:
      want = shapes(cfg, spec)
    except ValueError as e:
      raise AdapterError(f"{path}: {e}") from None
    names = set(f.keys())
    adapters = []
    for i in range(cfg.layers):
      layer = {}
      for t, (n, k) in want.items():
        ad = {}
        for part, shape in (("a", (spec.rank, k)), ("b", (n, spec.rank))):
          name = _tensor(i, t, part)
          if name not in names:
            raise AdapterError(f"{path}: tensor {name!r} is missing (the adapters were "
                               f"trained on {base!r}; this model has {cfg.layers} layers)")
          a = f.get_tensor(name)
          if a.shape != shape or a.dtype != np.float32:
            raise AdapterError(
                f"{path}: tensor {name!r} is {a.dtype}{list(a.shape)}, this model needs "
                f"float32{list(shape)} (the adapters were trained on {base!r}, not on "
                f"{os.path.basename(getattr(model, 'path', '?'))!r}?)")
          ad[part] = jnp.asarray(a)
          names.discard(name)
        layer[t] = ad
      adapters.append(layer)
    if names:
      raise AdapterError(f"{path}: tensor {sorted(names)[0]!r} is not used by this "
                         f"{cfg.family} model of {cfg.layers} layers (trained on {base!r}?)")
  return adapters, spec


def n_params(adapters) -> int:
  """How many trainable numbers ``adapters`` hold."""
  return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(adapters))


def pad(ids: Sequence[int], length: int) -> tuple[np.ndarray, np.ndarray]:
  """``ids`` padded with zeros to ``length`` -> ``(i32[length], mask f32[length])`` (1 on
  ``ids``' positions). Raises ``ValueError`` when ``ids`` is longer."""
  if len(ids) > length:
    raise ValueError(f"{len(ids)} tokens do not fit in {length}")
  out = np.zeros(length, np.int32)
  out[:len(ids)] = ids
  mask = np.zeros(length, np.float32)
  mask[:len(ids)] = 1
  return out, mask
