"""Layers shared by hxmlir's example models: dense layers over f32 or ``q8`` weights.

Every dense weight is stored ``[in, out]`` (``k, n``) so that ``x @ w`` is the
layer; a quantized weight is a ``q8[k, n]`` (one scale per input row, see
:func:`hxmlir.quantize`) and is applied with :func:`hxmlir.matmul_q`, or, in the
*naive* baseline, by dequantizing it first and doing an f32 dot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hxmlir.types.einsum import einsum
from hxmlir.types.qarray import QArray, QArrayTy, dequantize, matmul_q, quantize


def is_quantized(w) -> bool:
  """True if ``w`` (a value or a tracer) is a quantized array ``q8[...]``."""
  return isinstance(jax.typeof(w), QArrayTy)


def linear(x, w, b=None, *, naive: bool = False, out_in: bool = False):
  """``x: f32[*lead, k] @ w + b -> f32[*lead, n]`` for ``w: f32[k, n]`` or ``q8[k, n]``,
  or with ``out_in=True`` ``x @ w.T + b`` for ``w`` in the checkpoint layout ``[n, k]``.

  A quantized ``w`` goes through ``hx.matmul_q`` (the leading axes of ``x`` are
  flattened into its rows: one 2-D product per layer; ``hx.einsum("mk,nk->mn")`` for
  ``out_in``), or, with ``naive=True``, through ``x @ hx.dequantize(w)``: the
  dequantize-then-dot baseline that materialises the f32 weight. ``b: f32[n]`` is
  optional.
  """
  lead, k = x.shape[:-1], x.shape[-1]
  x2 = x.reshape(-1, k)
  if not is_quantized(w):
    y = x2 @ (w.T if out_in else w)
  elif naive:
    y = x2 @ (dequantize(w).T if out_in else dequantize(w))
  elif out_in:
    y = einsum("mk,nk->mn", x2, w)
  else:
    y = matmul_q(x2, w)
  y = y.reshape(*lead, y.shape[-1])
  return y if b is None else y + b


def layer_norm(x, gamma, beta, eps: float):
  """LayerNorm over the last axis (Ba et al. 2016): ``(x - mean) / sqrt(var + eps) * gamma + beta``."""
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * gamma + beta


def attention(q, k, v, heads: int, bias=None):
  """Multi-head scaled dot-product attention (Vaswani et al. 2017).

  ``q, k, v: f32[b, s, d]`` with ``d = heads * dh``; ``bias: f32[b, 1, 1, s]``
  is added to the scores (``-inf``-like values mask keys out). Returns
  ``f32[b, s, d]``, heads concatenated.
  """
  b, s, d = q.shape
  dh = d // heads
  split = lambda t: t.reshape(b, s, heads, dh).transpose(0, 2, 1, 3)
  qh, kh, vh = split(q), split(k), split(v)
  scores = jnp.einsum("bhqd,bhkd->bhqk", qh, kh) / np.sqrt(dh).astype(np.float32)
  if bias is not None:
    scores = scores + bias
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bhqk,bhkd->bhqd", probs, vh)
  return out.transpose(0, 2, 1, 3).reshape(b, s, d)


def map_weights(tree: Any, fn: Callable[[Any], Any], keys: Iterable[str]) -> Any:
  """Copy of a nested dict/list ``tree`` with ``fn`` applied to the leaves under ``keys``."""
  keys = frozenset(keys)

  def go(node, key=None):
    if isinstance(node, dict):
      return {k: go(v, k) for k, v in node.items()}
    if isinstance(node, list | tuple):
      return type(node)(go(v) for v in node)
    return fn(node) if key in keys else node
  return go(tree)


def quantize_weights(tree: Any, keys: Iterable[str], dtype=jnp.int8, *,
                     group_size: int | None = None, method: str = "absmax") -> Any:
  """``tree`` with every ``f32[k, n]`` leaf under one of ``keys`` quantized to ``q8[k, n]``.

  ``dtype``, ``group_size`` and ``method`` are :func:`hxmlir.quantize`'s (the format,
  :mod:`hxmlir.formats`: ``jnp.int4`` with ``group_size=32`` gives ``q4[k, n:g32]``,
  groups of 32 consecutive outputs of one input row). Other leaves become device
  arrays. Runs as one jitted computation, so quantizing many weights costs one
  compilation rather than one per weight. Raises ``TypeError`` as ``hx.quantize`` does
  (unknown dtype, a group size not dividing ``n``).
  """
  keys = tuple(keys)
  tree = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)
  q = lambda w: quantize(w, dtype, group_size=group_size, method=method)
  return jax.jit(lambda t: map_weights(t, q, keys))(tree)


def weight_bytes(tree: Any) -> dict[str, int]:
  """Bytes of the dense weights in ``tree``, as stored on the device.

  Returns ``{"values": .., "scales": .., "f32_equivalent": .., "other_f32": ..}``:
  the bytes of the stored values (``qvalue``: int8, int4 packed two per byte, or
  float8) and of the scales (f32 or f16, and the offsets of a format with one: u4o,
  q8o) of every quantized leaf, counted from its
  components' device buffers (so a format's packing shows), the bytes those leaves'
  dense values would take as f32, and the bytes of every other array leaf.
  """
  out = {"values": 0, "scales": 0, "f32_equivalent": 0, "other_f32": 0}
  for leaf in jax.tree.leaves(tree):
    if isinstance(leaf, QArray):
      out["values"] += int(leaf.qvalue.nbytes)
      out["scales"] += sum(int(c.nbytes) for c in leaf.components[1:])  # scale[, offset]
      out["f32_equivalent"] += 4 * int(np.prod(leaf.shape))
    else:
      out["other_f32"] += int(np.asarray(leaf).nbytes)
  return out
