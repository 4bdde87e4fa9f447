"""hxmlir's lo primitives: ordinary JAX primitives over arrays, one per ``hx.*`` op.

Each hi primitive's ``to_lojax`` rule binds these. Each has an abstract eval
that propagates shardings (explicit mode), a batching rule, eager dispatch
through its own lowering, and an ``mlir.register_lowering`` rule (see
``hxmlir.lowering.rules``); ``hx_matmul_q_p``'s abstract eval, batching and lowering
rules are in :mod:`hxmlir.lowering.matmul_q`. Operands are the hi types' lo components:

=====================  ================================================  ===========================
primitive              operands                                          results
=====================  ================================================  ===========================
``hx_quantize_p``      ``x: f32[*l, n]``                                 ``q: i8[*l, n], s: f32[*l]``
``hx_dequantize_p``    ``q: i8[*l, n], s: f32[*l]``                      ``f32[*l, n]``
``hx_matmul_q_p``      ``x: f32[...], q: i8[..., n], s: f32[...]``        ``dot_general(x, q*s, dims)``
``hx_outer_p``         ``col: f32[*b, m], row: f32[*b, n]``              ``col, row``
``hx_matmul_r1_p``     ``x: f32[*b, p, m], col: f32[*b, m], row: f32[*b, n]``  ``f32[*b, p, n]``
=====================  ================================================  ===========================

The table shows the ``int8`` per-row format; other formats have other value components
and group scales ``f32[*l, n // g]`` (:mod:`hxmlir.formats`). ``hx_quantize_p`` has parameters ``fmt`` (a format name), ``group_size`` (``None`` or
``g``) and ``method`` (``"absmax"``, ``"mse"``); the other primitives read the format off
their operands' types. ``hx_matmul_q_p`` has one parameter, ``dimension_numbers`` (``lax.dot_general``'s;
:mod:`hxmlir.types.dotdims` has its rules): ``f32[*b, m, k] x i8[*b, k, n] -> f32[*b, m, n]``
is ``dotdims.v1_dims(rank)``.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
from jax.experimental.hijax import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import batching

from hxmlir import formats
from hxmlir._jax import apply_primitive
from hxmlir.types import shardings as shd

F32 = jnp.dtype("float32")
I8 = jnp.dtype("int8")


def _new(name: str, multiple_results: bool) -> Primitive:
  p = Primitive(name)
  p.multiple_results = multiple_results
  p.def_impl(partial(apply_primitive, p))
  return p


hx_quantize_p = _new("hx_quantize", True)
hx_dequantize_p = _new("hx_dequantize", False)
hx_matmul_q_p = _new("hx_matmul_q", False)
hx_outer_p = _new("hx_outer", True)
hx_matmul_r1_p = _new("hx_matmul_r1", False)


def _parts(aval) -> tuple:
  return shd.partitions(aval.sharding, aval.ndim)


def _arr(shape, dtype, base, parts, *operands) -> ShapedArray:
  # inside shard_map, a result varies over the manual axes its operands vary over
  return ShapedArray(tuple(shape), dtype, sharding=shd.with_partitions(base, parts),
                     manual_axis_type=shd.join_mat(*operands))


def _f32(shape, sharding, *operands) -> ShapedArray:
  """An f32 result typed ``sharding``, varying over its operands' manual axes."""
  return ShapedArray(tuple(shape), F32, sharding=sharding, manual_axis_type=shd.join_mat(*operands))


def dense_shape(q) -> tuple[int, ...]:
  """The dense shape of stored values ``q`` (an aval or array) of any format."""
  return formats.dense_shape_of(q.dtype, q.shape)


@hx_quantize_p.def_abstract_eval
def _quantize_abstract_eval(x, *, fmt="int8", group_size=None, method="absmax"):
  p, f = _parts(x), formats.lookup(fmt)
  scale = _arr(formats.scale_shape(x.shape, group_size), f.scale_dtype, x.sharding,
               formats.scale_parts(p, group_size), x)
  return [_arr(f.storage_shape(x.shape), f.storage_dtype, x.sharding, p, x),
          scale] + ([scale] if f.offset else [])  # a format with an offset: (q, s, o)


@hx_dequantize_p.def_abstract_eval
def _dequantize_abstract_eval(q, s, *o):
  # o: the offsets of a format with one (hxmlir.formats), else nothing
  return _arr(dense_shape(q), F32, q.sharding, _parts(q), q, s, *o)


@hx_outer_p.def_abstract_eval
def _outer_abstract_eval(col, row):
  return [col, row]


@hx_matmul_r1_p.def_abstract_eval
def _matmul_r1_abstract_eval(x, col, row):
  xp, rp = _parts(x), _parts(row)
  return _f32((*x.shape[:-1], row.shape[-1]),
              shd.product_sharding(x.sharding, xp[:-2], xp[-2], row.sharding, rp[:-1], rp[-1]),
              x, col, row)


# --- batching: every lo primitive takes leading batch dims natively ----------

def _batch_leading(prim, args, dims, **params):
  """Move each batched operand's batch dim to the front, broadcast the others."""
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not batching.not_mapped)
  moved = [jnp.broadcast_to(a, (size, *a.shape)) if d is batching.not_mapped
           else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
  out = prim.bind(*moved, **params)
  return out, ([0] * len(out) if prim.multiple_results else 0)


for _p in (hx_quantize_p, hx_dequantize_p, hx_outer_p, hx_matmul_r1_p):
  batching.primitive_batchers[_p] = partial(_batch_leading, _p)
