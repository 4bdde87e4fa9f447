"""``hx_matmul_q_p``'s abstract eval and batching rule.

The abstract eval types the result ``dot_general(x, dequantize(q, s[, o]), dims)`` with
``hx.matmul_q``'s typing rule (:func:`hxmlir.types.matmul_q_typing.result_type`, on ``x``
and the weight's dense shape, ``x`` f32: :data:`~hxmlir.types.matmul_q_typing.LO_DENSE_DTYPES`;
a ``TypeError`` naming the operand types otherwise), sharded rows like ``x`` and columns
like the weight (:func:`hxmlir.types.dotdims.result_parts`). The batching rule moves a mapped axis to
the front of each operand and folds it into the equation's ``dimension_numbers``
(:func:`hxmlir.types.dotdims.batched`): under ``vmap`` the op stays one op.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.hijax import ShapedArray
from jax.interpreters import batching

from hxmlir.lowering.primitives import dense_shape, hx_matmul_q_p
from hxmlir.types import dotdims, matmul_q_typing
from hxmlir.types import shardings as shd


@hx_matmul_q_p.def_abstract_eval
def _matmul_q_abstract_eval(x, q, s, *o, dimension_numbers=None):
  # o: the offsets of a format with one; the scales are per group when as deep as q
  try:
    dims, shape, dtype = matmul_q_typing.result_type(
        x.shape, x.dtype, dense_shape(q), s.ndim == q.ndim,
        dimension_numbers or dotdims.v1_dims(x.ndim), dtypes=matmul_q_typing.LO_DENSE_DTYPES,
        operands=lambda: ", ".join(shd.short(a) for a in (x, q, s, *o)))
  except matmul_q_typing.MatmulQTypeError as e:
    raise TypeError(e.for_caller(hx_matmul_q_p.name)) from None
  parts = dotdims.result_parts(shd.partitions(x.sharding, x.ndim),
                               shd.partitions(q.sharding, q.ndim), dims)
  return ShapedArray(shape, dtype,
                     sharding=shd.with_partitions(shd.pick_mesh_sharding(x.sharding, q.sharding),
                                                  parts),
                     manual_axis_type=shd.join_mat(x, q, s))


def _batch_matmul_q(args, dims, *, dimension_numbers=None):
  # a format with an offset has a fourth operand, mapped with the scales
  x, q, s, *o = args
  dx, dq, ds, *do = dims
  dimension_numbers = dimension_numbers or dotdims.v1_dims(x.ndim - (dx is not batching.not_mapped))
  nm = batching.not_mapped
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not nm)
  def lead(a, d):
    return jnp.broadcast_to(a, (size, *a.shape)) if d is nm else jnp.moveaxis(a, d, 0)
  q_mapped = dq is not nm or ds is not nm or any(d is not nm for d in do)
  if q_mapped:
    q, s = lead(q, dq), lead(s, ds)
    o = [lead(a, d) for a, d in zip(o, do)]
  batched = dotdims.batched(dimension_numbers, x.ndim, q.ndim - q_mapped, dx is not nm,
                            q_mapped)
  if batched is None:  # only q mapped, the scales need x mapped too
    dx = 0
    x = lead(x, nm)
    batched = dotdims.batched(dimension_numbers, x.ndim - 1, q.ndim - 1, True, True)
  elif dx is not nm:
    x = jnp.moveaxis(x, dx, 0)
  new, out = batched
  return hx_matmul_q_p.bind(x, q, s, *o, dimension_numbers=new), out


batching.primitive_batchers[hx_matmul_q_p] = _batch_matmul_q
