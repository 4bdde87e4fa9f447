"""The forward pass of every GGUF decoder family, driven by its :class:`~hxmlir.models.arch.Config`.

One block, per layer ``i`` (llama.cpp's ``src/models/*.cpp``; each step present when the
description says so)::

  x = embed[ids] * embed_scale
  h = rms(x, attn_norm)                                   # attn_pre
  q, k, v = h @ Wq.T (+ bq), h @ Wk.T (+ bk), h @ Wv.T (+ bv)
  q, k = rms(q, q_norm), rms(k, k_norm)                   # qk_norm: per head or over the projection
  q, k = rope(q, k; rope_style, rope_bases[i], rope_scales[i], rope_factors)
  a = attention(q, k, v; attn_scale, windows[i], attn_softcap) @ Wo.T
  x = x + rms(a, attn_post_norm)                          # attn_post
  h = rms(x, ffn_norm)                                    # ffn_pre
  f = (act(h @ Wgate.T) * (h @ Wup.T)) @ Wdown.T          # or the routed experts' mixture
  x = x + rms(f, ffn_post_norm)                           # ffn_post
  logits = softcap(rms(x, output_norm) @ Wout.T; final_softcap)

Weights stay in their stored hx formats (:func:`hxmlir.types.einsum` for every projection,
:func:`hxmlir.take_rows` for the embedding); :func:`hxmlir.models.params.dequantized`
params run the same function with ``jnp.einsum``. Rotary embeddings: ``"norm"`` rotates
consecutive pairs ``(2i, 2i+1)`` (llama.cpp's converter permutes llama's Q/K rows so that
HF's ``rotate_half`` becomes this), ``"neox"`` pairs ``(i, i + d/2)``; the angle of pair
``i`` at position ``p`` is ``p * scale * base^(-2i/d) / factor[i]``.

KV cache. ``k`` and ``v`` are tuples of one array per layer: keys ``f32[kv_heads, C,
head_dim]``, values ``f32[kv_heads, head_dim, C]`` (both products then read them as stored),
or both ``q8[kv_heads, C, head_dim]`` (one int8 row and one f32 scale per position); written
in place at ``start + [0, T)``. On the f32 cache attention is one ``hx.attention`` (whose
CPU kernel reads only positions in the causal window); on ``q8`` rows both products are
``hx.einsum`` (per KV head from :data:`PER_HEAD_POSITIONS` positions read) on the int8 values
of the shortest prefix of :func:`cache_buckets` that holds the positions up to the last
query's (a ``lax.switch`` over the prefix lengths).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from hxmlir.lowering.attention import attention as hx_attention
from hxmlir.models.arch import Config
from hxmlir.models.params import FUSED
from hxmlir.types.einsum import einsum
from hxmlir.types.gather import take_rows
from hxmlir.types.qarray import QArrayTy, make_qarray, qarray_parts, quantize

LAYER_OUT = "decoder_layer"
"""The ``checkpoint_name`` of each layer's output ``x`` (a ``jax.checkpoint`` policy saving
only it recomputes the rest of the layer in the backward pass)."""


def _quantized(w) -> bool:
  return isinstance(jax.typeof(w), QArrayTy)


def rms_norm(x, w, eps: float):
  """``x / sqrt(mean(x^2) + eps) * w`` over the last axis (Zhang & Sennrich 2019)."""
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, base: float, *, style: str = "norm", scale: float = 1.0,
         factors=None):
  """Rotary embeddings (Su et al. 2021) on ``x: f32[T, heads, d]`` at ``positions:
  i32[T]``: pair ``i`` (``(2i, 2i+1)`` for ``style="norm"``, ``(i, i + d/2)`` for
  ``"neox"``) rotated by ``pos * scale * base^(-2i/d) / factors[i]`` (``factors:
  f32[d/2]`` or ``None``)."""
  d = x.shape[-1]
  inv = jnp.asarray(base, jnp.float32) ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
  if factors is not None:
    inv = inv / factors
  ang = (positions.astype(jnp.float32) * np.float32(scale))[:, None] * inv[None]  # [T, d/2]
  cos, sin = jnp.cos(ang)[:, None], jnp.sin(ang)[:, None]
  if style == "neox":
    x0, x1 = x[..., :d // 2], x[..., d // 2:]
    return jnp.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)
  x0, x1 = x[..., 0::2], x[..., 1::2]
  return jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).reshape(x.shape)


def proj(x, w, name=None):
  """``x @ w.T`` for a weight ``w[out, in]`` (``name``: the weight's key, read by a mesh's
  projection, :func:`hxmlir.models.llama_sharding.projection`): :func:`hxmlir.types.einsum`
  (one ``hx.matmul_q``) on a quantized ``w``, ``jnp.einsum`` on a dense one."""
  if _quantized(w):
    return einsum("...k,nk->...n", x, w)
  return jnp.einsum("...k,nk->...n", x, w)


def _ein(spec: str, x, w):
  return einsum(spec, x, w) if _quantized(w) else jnp.einsum(spec, x, w)


def cache_write(cache, start, x, *, keys: bool):
  """One layer's ``cache`` with ``x: f32[T, kv, d]`` written at positions ``start + [0,
  T)``: keys ``f32[kv, C, d]``, values ``f32[kv, d, C]``, or either as ``q8[kv, C, d]`` with
  ``x`` quantized per (head, position) row. Under ``jax.vmap`` with a mapped ``start`` each
  element's rows are written in place at its own start (:func:`_rows_writer`), not by a
  scatter and a select over the whole cache."""
  x = jnp.swapaxes(x, 0, 1)  # [kv, T, d]
  if _quantized(cache):
    return make_qarray(*(_rows_writer(1)(c, p, start)
                         for c, p in zip(qarray_parts(cache), qarray_parts(quantize(x)))))
  if keys:
    return _rows_writer(1)(cache, x, start)
  return _rows_writer(2)(cache, jnp.swapaxes(x, 1, 2), start)


@functools.cache
def _rows_writer(axis: int):
  """``write(cache, x, start)``: ``lax.dynamic_update_slice`` of ``x`` into ``cache`` at
  ``start`` along ``axis`` (0 along the others), whose ``vmap`` with a mapped ``start``
  writes element ``b``'s ``x[b]`` at ``start[b]`` with one in-place ``dynamic_update_slice``
  per element (a ``fori_loop``; XLA's own rule for a mapped start is a scatter and a select
  over the whole cache). Its JVP is the plain update of the tangents (linear in ``cache``
  and ``x``), so it differentiates and transposes as ``dynamic_update_slice`` does."""
  def write(cache, x, start):
    zero = jnp.zeros((), jnp.int32)
    return jax.lax.dynamic_update_slice(
        cache, x, tuple(start if i == axis else zero for i in range(cache.ndim)))

  batched = jax.custom_batching.custom_vmap(write)

  @batched.def_vmap
  def _vmap(size, in_batched, cache, x, start):
    cache_b, x_b, start_b = in_batched
    if not start_b:  # one start for all: a dynamic_update_slice of the batch
      axes = (0 if cache_b else None, 0 if x_b else None, None)
      return jax.vmap(write, in_axes=axes)(cache, x, start), cache_b or x_b
    if not cache_b:
      cache = jnp.broadcast_to(cache, (size, *cache.shape))

    def one(b, cache):
      row = jax.lax.dynamic_index_in_dim(x, b, keepdims=True) if x_b else x[None]
      zero = jnp.zeros((), jnp.int32)
      at = tuple(jnp.asarray(start)[b] if i == axis else zero for i in range(x.ndim - x_b))
      return jax.lax.dynamic_update_slice(cache, row, (b, *at))
    return jax.lax.fori_loop(0, size, one, cache), True

  @jax.custom_jvp
  def rows(cache, x, start):
    return batched(cache, x, start)

  @rows.defjvp
  def _jvp(primals, tangents):
    cache, x, start = primals
    return rows(cache, x, start), write(tangents[0], tangents[1], start)
  return rows


def window_mask(start, t: int, c: int, window: int = 0, first=0):
  """``bool[t, 1, 1, c]``: query ``i`` (at position ``start + i``) reads position ``first +
  j`` (``j < c``) when it is ``<= start + i`` and, for ``window > 0``, within the last
  ``window`` positions."""
  pos = start + jnp.arange(t, dtype=jnp.int32)
  cs = first + jnp.arange(c, dtype=jnp.int32)[None, :]
  ok = cs <= pos[:, None]
  if window:
    ok = ok & (pos[:, None] - cs < window)
  return ok[:, None, None, :]


def attention(q, k, v, start, *, scale: float, window: int = 0, softcap: float = 0.0):
  """Grouped-query attention of ``q: f32[T, kv, g, d]`` at positions ``start + [0, T)``
  over one layer's cache (keys ``f32[kv, C, d]`` and values ``f32[kv, d, C]``, or both
  ``q8[kv, C, d]``) -> ``f32[T, kv, g, d]``: scores ``s = scale * q . k``, soft-capped to
  ``softcap * tanh(s / softcap)`` when ``softcap > 0``, over positions ``c <= start + t``
  within the last ``window`` (0: all).

  On the f32 cache this is one :func:`hxmlir.attention` (``hx.attention``; its CPU kernel
  reads only the window's positions). On ``q8`` rows both products are
  :func:`hxmlir.types.einsum` (from :data:`PER_HEAD_POSITIONS` positions read, one per KV
  head: a 2-D ``q8[c, d]`` weight each, which the native CPU kernels take) on the int8
  values of a prefix of the cache
  (:func:`cache_buckets`: a little more than the positions written, never the unwritten rest;
  on a sliding-window layer, once the positions pass the window, the window itself):
  the scores contract the quantized axis
  (each key row's scale multiplies the result); ``P . V`` contracts positions (each value
  row's scale multiplies the probabilities first)."""
  if not _quantized(k):
    return hx_attention(q, k, v, start, scale=scale, window=window, softcap=softcap)
  # q8 rows: only a prefix of the cache is read, the shortest of cache_buckets(C) holding
  # the positions up to the last query's; on a sliding-window layer whose window (and
  # queries) span less than C, at most that span: a prefix of it while the positions fit,
  # then the span ending at the last query (lax.switch: one branch per length)
  t, c = q.shape[0], k.shape[1]
  span = window + t - 1 if window else c
  sizes = tuple(b for b in cache_buckets(c) if b < span) + (min(span, c),)
  end = start + t
  branch = jnp.sum(jnp.asarray(sizes, jnp.int32) < end).astype(jnp.int32)
  parts = (q, start, *qarray_parts(k), *qarray_parts(v))
  nk = len(qarray_parts(k))

  def read(b, sliding=False):
    def run(q, start, *cs):
      first = start + t - b if sliding else 0
      cut = ((lambda x: jax.lax.dynamic_slice_in_dim(x, first, b, axis=0)) if sliding
             else (lambda x: x[:b]))
      if b >= PER_HEAD_POSITIONS:  # one product per KV head: 2-D q8 weights, native kernels
        heads = range(q.shape[1])
        ks = [make_qarray(*(cut(x[h]) for x in cs[:nk])) for h in heads]
        vs = [make_qarray(*(cut(x[h]) for x in cs[nk:])) for h in heads]
        sc = jnp.stack([einsum("tgd,cd->tgc", q[:, h], ks[h]) for h in heads], 1)
        pv = lambda pr: jnp.stack([einsum("tgc,cd->tgd", pr[:, h], vs[h]) for h in heads], 1)
      else:  # one product over the heads (fewer, smaller calls)
        ks = make_qarray(*(jax.vmap(cut)(x) for x in cs[:nk]))
        vs = make_qarray(*(jax.vmap(cut)(x) for x in cs[nk:]))
        sc = einsum("tkgd,kcd->tkgc", q, ks)
        pv = lambda pr: einsum("tkgc,kcd->tkgd", pr, vs)
      sc = sc * np.float32(scale)
      if softcap:
        sc = np.float32(softcap) * jnp.tanh(sc / np.float32(softcap))
      sc = jnp.where(window_mask(start, t, b, window, first), sc, jnp.finfo(jnp.float32).min)
      return pv(jax.nn.softmax(sc, axis=-1))
    return run
  branches = [read(b) for b in sizes] + ([read(span, sliding=True)] if span < c else [])
  if len(branches) == 1:
    return branches[0](*parts)
  return jax.lax.switch(branch, branches, *parts)


PER_HEAD_POSITIONS = 512
"""The prefix length from which the ``int8`` cache's attention products run one per KV
head (2-D ``q8`` weights: the native CPU kernels) rather than one over the heads (which
``hx.matmul_q`` lowers to its StableHLO loop): above it the loop's reads dominate, below it
the per-head calls' fixed cost (SmolLM2, int8 activations: 0.62x of position 64's speed at
2048 where the loop gave 0.29x; at 64, 85 against 155 tok/s with the f32 cache)."""


def cache_buckets(c: int, smallest: int = 64, parts: int = 16) -> tuple[int, ...]:
  """The prefix lengths an ``int8`` cache of ``c`` positions is read in: powers of two from
  ``smallest`` up to ``step`` (``c / parts`` rounded up to a multiple of ``smallest``), then
  multiples of ``step``, and ``c``; a step reads the shortest holding its positions, so at
  most twice the positions written below ``step`` and at most ``step`` more above (at
  position 2048 of a 4096-position cache: 2304, where powers of two alone read 4096)."""
  step = max(smallest, -(-c // parts // smallest) * smallest)
  sizes, b = [], smallest
  while b < min(c, step):
    sizes.append(b)
    b *= 2
  b = step
  while b < c:
    sizes.append(b)
    b += step
  return (*sizes, c)


def _projs(x, p: dict[str, Any], fused: str, sizes: Sequence[int], proj=proj) -> list:
  """The projections ``FUSED[fused]`` of ``x`` (``out`` sizes ``sizes``) by layer ``p``'s
  weights: one call on the fused weight, split along ``out``, or one call per part."""
  if fused not in p:
    ys = [proj(x, p[k], k) for k in FUSED[fused]]
  else:
    ys = jnp.split(proj(x, p[fused], fused), np.cumsum(sizes)[:-1].tolist(), axis=-1)
  return [adapted(x, y, p, k) for y, k in zip(ys, FUSED[fused])]


def adapted(x, y, p: dict[str, Any], name: str):
  """``y`` (the projection ``name`` of ``x``) plus layer ``p``'s low-rank adapter of it when
  ``p["lora"]`` holds one (:mod:`hxmlir.models.lora`): ``y + scale * (x @ a.T) @ b.T`` with
  ``a: f32[r, in]``, ``b: f32[out, r]``, ``scale: f32[]``; the weight stays untouched."""
  ad = p.get("lora", {}).get(name)
  if ad is None:
    return y
  return y + jnp.einsum("...r,nr->...n", jnp.einsum("...k,rk->...r", x, ad["a"]),
                        ad["b"]) * ad["scale"]


def embed(table, ids):
  """Rows ``ids`` of the token embedding ``table[vocab, d]``, quantized or dense."""
  if _quantized(table):
    return take_rows(table, ids)
  return jnp.take(table, ids, axis=0, mode="clip")


def _act(cfg: Config, g):
  return jax.nn.gelu(g, approximate=True) if cfg.activation == "gelu_tanh" else jax.nn.silu(g)


def _take(w, idx):
  """Experts ``idx: i32[k]`` of a stack ``w[E, out, in]`` (quantized: each component's
  slices, so only those experts' bytes are read)."""
  if _quantized(w):
    return make_qarray(*(jnp.take(c, idx, axis=0) for c in qarray_parts(w)))
  return jnp.take(w, idx, axis=0)


def moe(h, p: dict[str, Any], cfg: Config):
  """The mixture of experts of ``h: f32[T, d]`` (llama.cpp's ``build_moe_ffn`` with softmax
  gating and normalised weights): router probabilities ``softmax(h @ router.T)``, the
  ``experts_used`` largest per token, their weights divided by their sum, each chosen
  expert's SwiGLU FFN weighted -> ``f32[T, d]``. One token (decode): only the chosen
  experts' weights are gathered and read; several (prefill): every expert runs on every
  token and the unchosen get weight 0 (the weights are read once)."""
  probs = jax.nn.softmax(proj(h, p["router"]), axis=-1)  # [T, E]
  w, idx = jax.lax.top_k(probs, cfg.experts_used)
  w = w / jnp.sum(w, axis=-1, keepdims=True)
  if h.shape[0] == 1:
    gate, up, down = (_take(p[k], idx[0]) for k in ("gate_exps", "up_exps", "down_exps"))
    a = _act(cfg, _ein("td,efd->tef", h, gate)) * _ein("td,efd->tef", h, up)
    return jnp.einsum("ted,te->td", _ein("tef,edf->ted", a, down), w)
  dense_w = jnp.sum(jax.nn.one_hot(idx, cfg.experts, dtype=jnp.float32) * w[..., None], 1)
  a = _act(cfg, _ein("td,efd->tef", h, p["gate_exps"])) * _ein("td,efd->tef", h, p["up_exps"])
  return jnp.einsum("ted,te->td", _ein("tef,edf->ted", a, p["down_exps"]), dense_w)


def hidden(params, ids, start, k_cache, v_cache, *, cfg: Config, proj=proj):
  """The final hidden states of tokens ``ids: i32[T]`` at positions ``start + [0, T)``
  attending to the cache and to each other causally (the module docstring's block, up to
  the output norm) -> ``(f32[T, d], k_cache, v_cache)``, the caches returned with
  positions ``start + [0, T)`` written. ``params``: :func:`hxmlir.models.params.params_of`'s
  tree (or its :func:`~hxmlir.models.params.dequantized` copy). ``start`` is an i32 scalar
  (traced: one compilation per ``T`` and ``C``); the caller keeps ``start + T <= C``.
  ``proj(x, w, name)``: ``x @ w.T`` for the weight of key ``name``; on a mesh,
  :func:`hxmlir.models.llama_sharding.projection`."""
  t = ids.shape[0]
  hd, g = cfg.head_dim, cfg.heads // cfg.kv_heads
  eps = cfg.rms_eps
  positions = start + jnp.arange(t, dtype=jnp.int32)
  factors = params.get("rope_freqs")
  k_out, v_out = [], []
  x = embed(params["embed"], ids)
  if cfg.embed_scale != 1.0:
    x = x * np.float32(cfg.embed_scale)
  for i, p in enumerate(params["layers"]):
    h = rms_norm(x, p["attn_norm"], eps) if "attn_norm" in p else x
    q, k, v = _projs(h, p, "qkv", (cfg.heads * hd, cfg.kv_heads * hd, cfg.kv_heads * hd), proj)
    if cfg.qkv_bias:
      q, k, v = q + p["q_bias"], k + p["k_bias"], v + p["v_bias"]
    if cfg.qk_norm == "proj":
      q, k = rms_norm(q, p["q_norm"], eps), rms_norm(k, p["k_norm"], eps)
    q, k = q.reshape(t, cfg.heads, hd), k.reshape(t, cfg.kv_heads, hd)
    if cfg.qk_norm == "head":
      q, k = rms_norm(q, p["q_norm"], eps), rms_norm(k, p["k_norm"], eps)
    rot = dict(style=cfg.rope_style, scale=cfg.rope_scales[i], factors=factors)
    q = rope(q, positions, cfg.rope_bases[i], **rot)
    k = rope(k, positions, cfg.rope_bases[i], **rot)
    k_out.append(cache_write(k_cache[i], start, k, keys=True))
    v_out.append(cache_write(v_cache[i], start, v.reshape(t, cfg.kv_heads, hd), keys=False))
    a = attention(q.reshape(t, cfg.kv_heads, g, hd), k_out[i], v_out[i], start,
                  scale=cfg.attn_scale, window=cfg.windows[i], softcap=cfg.attn_softcap)
    a = a.reshape(t, cfg.heads * hd)
    a = adapted(a, proj(a, p["o"], "o"), p, "o")
    x = x + (rms_norm(a, p["attn_post_norm"], eps) if "attn_post_norm" in p else a)
    h = rms_norm(x, p["ffn_norm"], eps) if "ffn_norm" in p else x
    if cfg.experts:
      f = moe(h, p, cfg)
    else:
      gate, up = _projs(h, p, "gate_up", (cfg.ffn, cfg.ffn), proj)
      f = _act(cfg, gate) * up
      f = adapted(f, proj(f, p["down"], "down"), p, "down")
    x = x + (rms_norm(f, p["ffn_post_norm"], eps) if "ffn_post_norm" in p else f)
    x = checkpoint_name(x, LAYER_OUT)
  return rms_norm(x, params["norm"], eps), tuple(k_out), tuple(v_out)


def head(params, x, *, cfg: Config, proj=proj):
  """The logits ``f32[T, vocab]`` of the final hidden states ``x: f32[T, d]``
  (:func:`hidden`'s): the output projection (the embedding where the head is tied),
  soft-capped to ``final_softcap * tanh(z / final_softcap)`` where the family has one."""
  logits = proj(x, params.get("output", params["embed"]), "output")
  if cfg.final_softcap:
    c = np.float32(cfg.final_softcap)
    logits = c * jnp.tanh(logits / c)
  return logits


def forward(params, ids, start, k_cache, v_cache, *, cfg: Config, proj=proj):
  """Logits of tokens ``ids: i32[T]`` at positions ``start + [0, T)`` attending to the
  cache and to each other causally (the module docstring's block) -> ``(f32[T, vocab],
  k_cache, v_cache)``: :func:`head` of :func:`hidden`."""
  x, k_out, v_out = hidden(params, ids, start, k_cache, v_cache, cfg=cfg, proj=proj)
  return head(params, x, cfg=cfg, proj=proj), k_out, v_out
