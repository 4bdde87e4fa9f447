"""``hx.einsum``: JAX's einsum with one dense and one quantized operand, as one ``hx.matmul_q``.

``hx.einsum(subscripts, x, q)`` takes ``jnp.einsum``'s subscript grammar (implicit
output, ``...`` included; the subscripts are parsed by ``opt_einsum``, JAX's own
einsum dependency) with a dense ``x: f32[...]`` and a quantized ``q: q8[..., n]``
(either order), and equals ``jnp.einsum(subscripts, x, hx.dequantize(q))`` without
dequantizing the weight: it binds one :class:`hxmlir.types.qarray.MatmulQ` carrying
``lax.dot_general`` dimension numbers (the ``hx.matmul_q`` version 2 composite), then
transposes the result to the requested order, as ``jnp.einsum`` does. Where the
scale goes (the dense operand or the result) is :func:`hxmlir.types.dotdims.scale_side`'s
rule.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
from opt_einsum.parser import parse_einsum_input

from hxmlir import formats
from hxmlir.types import shardings as shd
from hxmlir.types.matmul_q_typing import dense_dtype, dtype_names
from hxmlir.types.qarray import F32, MatmulQ, QArrayTy


def einsum(subscripts: str, x, q) -> jax.Array:
  """``jnp.einsum(subscripts, x, dequantize(q))`` with ``q``'s scales folded, never expanded.

  ``x: f32[...]`` dense (or ``bf16``/``f16``: converted to f32 first, f32 result, as
  :func:`hxmlir.matmul_q`) and ``q: q8[..., n]`` quantized along its last axis, in either
  order. Examples: ``"bsk,kn->bsn"`` (a transformer layer, ``f32[b, s, k] @ q8[k, n]``),
  ``"...ij,hjk->...ik"`` (a stack of ``h`` weights ``q8[h, j, k]``, summed over ``h``),
  ``"mk,nk->mn"`` (the ``[out, in]`` checkpoint layout: the contraction runs over the
  quantized axis, so the scale multiplies the result). Indices of ``x`` alone that the
  output drops are summed first; indices of ``q`` alone that the output drops are
  contracted against a broadcast ``x`` (which grows by their sizes). Gradients and
  ``vmap`` as for :func:`hxmlir.matmul_q` (one op under ``vmap``); the result is
  sharded like ``dot_general``'s (batch and ``x``'s indices like ``x``, ``q``'s like
  ``q``), then transposed.

  Raises ``TypeError`` when ``subscripts`` is not a string, and one naming the
  subscripts and both operand types
  (``hx.einsum('mk,njk->mn'): f32[5,16], q8[4,3,16]: ...``) when there is not exactly
  one quantized and one dense f32/bf16/f16 operand, an index repeats within an operand
  (diagonals), sizes disagree, ``q``'s quantized axis is summed on ``q`` alone, the
  scales cannot be folded (the quantized axis is contracted and the scale spans both
  a contracted and a kept axis), or a contraction axis is sharded.
  """
  if not isinstance(subscripts, str):
    raise TypeError(f"hx.einsum takes its subscripts as a string first ('bsk,kn->bsn'), got "
                    f"{type(subscripts).__name__} {subscripts!r}")
  x_aval, q_aval = jax.typeof(x), jax.typeof(q)
  swapped = isinstance(x_aval, QArrayTy) and not isinstance(q_aval, QArrayTy)
  if swapped:
    x, q, x_aval, q_aval = q, x, q_aval, x_aval
  sig = f"hx.einsum({subscripts!r}): {shd.short(x_aval)}, {shd.short(q_aval)}"
  if not isinstance(q_aval, QArrayTy) or isinstance(x_aval, QArrayTy):
    raise TypeError(f"{sig}: expects one dense ({dtype_names()}) operand and one quantized "
                    f"operand ({formats.prefixes()})")
  if dense_dtype(x_aval) not in (None, F32):
    # bf16/f16 activations: in f32 from here on (exact), as jnp.einsum promotes them
    # against the f32 weight; the sums of x alone below run in f32 too
    x = x.astype(F32)
  shapes = [SimpleNamespace(shape=tuple(a.shape)) for a in (x_aval, q_aval)]
  try:
    ins, out, _ = parse_einsum_input((subscripts, *(shapes[::-1] if swapped else shapes)))
  except ValueError as e:
    raise TypeError(f"{sig}: {e}") from None
  xs, qs = ins.split(",")[::-1] if swapped else ins.split(",")
  if len(xs) != x_aval.ndim or len(qs) != q_aval.ndim:
    raise TypeError(f"{sig}: subscripts {xs!r}, {qs!r} do not match the operands' ranks")
  for what, idx in (("dense", xs), ("quantized", qs)):
    if len(set(idx)) != len(idx):
      raise TypeError(f"{sig}: index repeated within the {what} operand ({idx!r}): "
                      "diagonals are not supported; take the diagonal first")
  size = {}
  for idx, shape in ((xs, x_aval.shape), (qs, q_aval.shape)):
    for c, d in zip(idx, shape):
      if size.setdefault(c, d) != d:
        raise TypeError(f"{sig}: {_index_name(c, subscripts)} has sizes {size[c]} and {d}"
                        + ("; hx.einsum does not broadcast size-1 axes (broadcast the "
                           "operand first)" if 1 in (size[c], d) else ""))
  n = qs[-1]
  if n not in xs and n not in out:
    raise TypeError(f"{sig}: sums the quantized axis {n!r} of the {q_aval.format.prefix} "
                    "operand alone; "
                    "dequantize it first (hx.dequantize) or keep the axis in the output")
  # indices of x alone that the output drops: summed before the op
  x_only = [i for i, c in enumerate(xs) if c not in qs and c not in out]
  if x_only:
    x = jnp.sum(x, axis=tuple(x_only))
    xs = "".join(c for c in xs if c in qs or c in out)
  # indices of q alone that the output drops: contracted against a broadcast x
  q_only = "".join(c for c in qs if c not in xs and c not in out)
  if q_only:
    x = jnp.broadcast_to(x[(..., *[None] * len(q_only))], (*x.shape, *(size[c] for c in q_only)))
    xs += q_only
  batch = [c for c in xs if c in qs and c in out]
  contract = [c for c in xs if c in qs and c not in out]
  dims = (tuple(xs.index(c) for c in contract), tuple(qs.index(c) for c in contract)), \
         (tuple(xs.index(c) for c in batch), tuple(qs.index(c) for c in batch))
  y = MatmulQ(jax.typeof(x), q_aval, dims, who=f"hx.einsum({subscripts!r})",
              sig=f"{shd.short(x_aval)}, {shd.short(q_aval)}")(x, q)
  order = "".join(batch) + "".join(c for c in xs if c not in qs) + \
      "".join(c for c in qs if c not in xs)
  if order == out:
    return y
  return jnp.transpose(y, tuple(order.index(c) for c in out))


def _index_name(c: str, subscripts: str) -> str:
  """How an error names index ``c``: ``index 'k'``, or an axis under ``...`` (opt_einsum
  writes those with letters the user never wrote)."""
  if c in subscripts.replace("...", ""):
    return f"index {c!r}"
  return "an axis under '...'"
