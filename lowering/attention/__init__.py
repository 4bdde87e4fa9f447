"""``hx.attention`` in one place: grouped-query attention over a KV cache with a causal
position bound -- the lo primitive ``hx_attention_p``'s typing, batching, JVP and lowering
rules for every platform.

``out[t, h, j, :] = sum_{c <= start + t} softmax_c(scale * q[t, h, j, :] . k[h, c, :]) *
v[h, :, c]`` for ``q: f32[T, kv, g, d]``, ``k: f32[kv, C, d]``, ``v: f32[kv, d, C]``, ``start:
i32[]`` (:func:`hxmlir.lowering.reference.attention`). It lowers to one ``stablehlo.composite
"hx.attention"`` version 1, ``scale`` in its ``composite_attributes`` (version 2, for a
sliding ``window`` or a ``softcap``, adds both; version 3, a batch of such problems each
at its own ``start``, is what ``jax.vmap`` of it lowers to) (schema:
``lowering/schema.py``):

==============================  ==========================================================
module                          what
==============================  ==========================================================
:mod:`.primitive`               abstract eval, batching (one batched op, version 3), JVP
                                (``jax.jvp`` of the reference), :func:`attention`
default rule (here)             the reference decomposition (masked scores, softmax, the
                                weighted sum over all ``C`` positions; under ``vmap`` for a
                                batch)
:mod:`.cpu`                     ``platform="cpu"``: the native kernel ``hx_attention_cpu_v1``
                                (``_v2``, ``_v3`` for a batch; reads positions
                                ``c <= start + t`` only) while installed
==============================  ==========================================================

Importing this package registers every rule (``import hxmlir`` does).
"""

from jax.interpreters import mlir

from hxmlir.lowering import reference
from hxmlir.lowering.attention import cpu as cpu
from hxmlir.lowering.attention import primitive as primitive
from hxmlir.lowering.attention.primitive import attention as attention
from hxmlir.lowering.attention.primitive import composite_attributes
from hxmlir.lowering.attention.primitive import hx_attention_p as hx_attention_p
from hxmlir.lowering.composite import lower_composite


def lower_attention(ctx, q, k, v, start, *, scale: float, window: int = 0,
                    softcap: float = 0.0):
  """``hx_attention_p`` -> ``hx.attention`` (:func:`composite_attributes`: version 1 or 2, 3
  for a batch), decomposition :func:`hxmlir.lowering.reference.attention` (a batch:
  :func:`~hxmlir.lowering.reference.attention_batched`, the reference under ``vmap``)."""
  batched = len(ctx.avals_in[0].shape) == 5
  attrs, version = composite_attributes(scale, window, softcap, batched)
  return lower_composite(ctx, "hx.attention", q, k, v, start,
                         reference=reference.attention_for(scale, window, softcap, batched),
                         attributes=attrs, version=version)


mlir.register_lowering(hx_attention_p, lower_attention)
mlir.register_lowering(hx_attention_p, cpu.lower_attention_cpu, platform="cpu")
