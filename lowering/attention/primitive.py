"""``hx_attention_p``: the lo primitive of ``hx.attention``, its abstract eval, batching rule
and JVP.

Operands ``q: f32[T, kv, g, d]``, ``k: f32[kv, C, d]``, ``v: f32[kv, d, C]``, ``start:
i32[]``; parameter ``scale`` (a Python float) -> ``f32[T, kv, g, d]``, typed like ``q``
(sharding included). Semantics: :func:`hxmlir.lowering.reference.attention`. The abstract
eval raises ``TypeError`` naming the four operand types when they do not fit
(:func:`hxmlir.lowering.schema.attention_problems`, the rule ``hx-verify`` checks too).
The same primitive also takes a batch (version 3: ``q: f32[B, T, kv, g, d]``, ``k`` and
``v`` with a leading ``B`` or shared, ``start: i32[B]``;
:func:`hxmlir.lowering.reference.attention_batched`): the batching rule binds that, so
that ``vmap`` keeps one op (on CPU one call of the native kernel for the whole batch). Under differentiation the op is its
reference: the JVP is ``jax.jvp`` of the reference (the primal stays one ``hx_attention_p``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.hijax import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from hxmlir._jax import apply_primitive
from hxmlir.lowering import reference, schema
from hxmlir.types import shardings as shd

hx_attention_p = Primitive("hx_attention")
hx_attention_p.def_impl(functools.partial(apply_primitive, hx_attention_p))


@hx_attention_p.def_abstract_eval
def _attention_abstract_eval(q, k, v, start, *, scale, window=0, softcap=0.0):
  problems = schema.attention_problems(*(schema.TensorType.of(a) for a in (q, k, v, start)))
  if problems:
    raise TypeError(f"hx.attention {problems[0]}")
  return ShapedArray(q.shape, jnp.float32, sharding=q.sharding,
                     manual_axis_type=shd.join_mat(q, k, v, start))


def _batch_attention(args, dims, *, scale, window=0, softcap=0.0):
  """``vmap`` of one ``hx_attention_p``: one batched ``hx_attention_p`` (``hx.attention``
  version 3, the native kernel's ``hx_attention_cpu_v3`` on CPU) with the mapped axis first:
  ``q`` and ``start`` (small) broadcast where unmapped, ``k`` and ``v`` left without a batch
  axis when neither is mapped (one cache for every element), the unmapped one broadcast
  when only the other is. An already batched one under a second ``vmap``: the reference."""
  # dims: the mapped axis of each operand, None where it is not mapped (jax.vmap's in_axes)
  q, k, v, start = args
  if q.ndim - (dims[0] is not None) == 5:  # already a batch
    return jax.vmap(reference.attention_for(scale, window, softcap, batched=True),
                    in_axes=tuple(dims))(*args), 0
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

  def front(a, d):
    return jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
  q, start = front(q, dims[0]), front(start, dims[3])
  if dims[1] is not None or dims[2] is not None:
    k, v = front(k, dims[1]), front(v, dims[2])
  return hx_attention_p.bind(q, k, v, start, scale=scale, window=window,
                             softcap=softcap), 0


batching.primitive_batchers[hx_attention_p] = _batch_attention


def _attention_jvp(primals, tangents, *, scale, window=0, softcap=0.0):
  q, k, v, start = primals
  tq, tk, tv = (ad.instantiate_zeros(t) for t in tangents[:3])
  ref = reference.attention_for(scale, window, softcap, batched=q.ndim == 5)
  _, out_dot = jax.jvp(lambda q, k, v: ref(q, k, v, start), (q, k, v), (tq, tk, tv))
  return hx_attention_p.bind(q, k, v, start, scale=scale, window=window,
                             softcap=softcap), out_dot


ad.primitive_jvps[hx_attention_p] = _attention_jvp


def composite_attributes(scale: float, window: int, softcap: float,
                         batched: bool = False) -> tuple[dict, int]:
  """``hx.attention``'s ``composite_attributes`` and version for these parameters: version 1
  with ``scale`` alone when there is neither a window nor a soft cap (the IR of before
  both existed), else version 2 with ``window`` and ``softcap`` too; ``batched`` (operands
  with a leading batch axis, :data:`hxmlir.lowering.schema.ATTENTION_BATCHED_SIGNATURE`):
  version 3, with all three."""
  if batched:
    return {"scale": scale, "window": window, "softcap": softcap}, 3
  if not window and not softcap:
    return {"scale": scale}, 1
  return {"scale": scale, "window": window, "softcap": softcap}, 2


def attention(q, k, v, start, *, scale: float, window: int = 0, softcap: float = 0.0):
  """Grouped-query attention over a KV cache with a causal position bound, as one
  ``hx.attention`` composite (:func:`hxmlir.lowering.reference.attention` is its meaning).

  ``q: f32[T, kv, g, d]``, keys ``k: f32[kv, C, d]``, values ``v: f32[kv, d, C]``, ``start``:
  an i32 scalar (or a Python int), the position of query 0; query ``t`` attends to
  positions ``c <= start + t`` (all ``C`` when ``start + t >= C``) -> ``f32[T, kv, g, d]``.
  ``scale``: multiplies each score ``q . k`` (``1 / sqrt(d)`` in LLaMA), rounded to f32.
  On CPU while hxmlir is installed the composite calls the native kernel
  ``hx_attention_cpu_v1``, which reads only positions ``c <= start + t``
  (:mod:`hxmlir.lowering.attention.cpu`). ``window > 0``: query ``t`` reads only the last
  ``window`` positions ``start + t - window < c <= start + t`` (a sliding window; the
  kernel reads only those); ``softcap > 0``: each score ``s`` becomes ``softcap * tanh(s /
  softcap)`` before the softmax (Gemma 2's attention logit soft-capping). Either makes the
  composite version 2 (with ``window`` and ``softcap`` among its attributes); without them
  it is version 1, as before. Under ``jax.vmap`` (each element its own ``start``, its own
  cache or one shared) it is one composite of version 3 over the whole batch, on CPU one
  call of ``hx_attention_cpu_v3``. Raises ``TypeError`` naming the operand types when they do
  not fit, and when ``scale``, ``window`` (an int >= 0) or ``softcap`` (a finite number >=
  0) is not static and in range.
  """
  number = (int, float, np.integer, np.floating)
  if isinstance(scale, bool) or not isinstance(scale, number):
    raise TypeError(f"hx.attention: scale must be a static float (a Python or NumPy number), "
                    f"got {type(scale).__name__}")
  if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
    raise TypeError(f"hx.attention: window must be a static int >= 0 (0: no window), got "
                    f"{window!r}")
  if isinstance(softcap, bool) or not isinstance(softcap, number) or not (
      np.isfinite(softcap) and softcap >= 0):
    raise TypeError(f"hx.attention: softcap must be a static finite number >= 0 (0: none), "
                    f"got {softcap!r}")
  start = np.int32(start) if isinstance(start, (int, np.integer)) else start
  return hx_attention_p.bind(q, k, v, start, scale=float(np.float32(scale)),
                             window=int(window), softcap=float(np.float32(softcap)))
