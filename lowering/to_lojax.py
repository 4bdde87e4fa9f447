"""``to_lojax`` rules: each hi primitive expressed with hxmlir's lo primitives.

JAX calls these when it lowers a hi jaxpr: hi operands arrive as their value
classes (``QArray``, ``Rank1``, ``HiTup``) holding lo arrays, and the rule binds
lo primitives on the components. Tuples bind nothing: they exist only in the
hi jaxpr; nor do the rules that only take a value apart or build it from its
components (``make_qarray``, ``qarray_parts``, ``factors``, a ``vmap`` broadcast).

This module is the home of every ``to_lojax`` rule of the types' primitives
(``hxmlir.types.qarray``, ``hxmlir.types.rank1``, ``hxmlir.types.tuples``, ``hxmlir.types.hiprim``). The
export package's primitives, which sit above the lowering, register theirs beside
them (``hxmlir/export/``).
"""

from __future__ import annotations

import jax

from hxmlir.lowering.primitives import (
  hx_dequantize_p,
  hx_matmul_q_p,
  hx_matmul_r1_p,
  hx_outer_p,
  hx_quantize_p,
)
from hxmlir.types.hiprim import BroadcastHi, register_to_lojax
from hxmlir.types.qarray import F32, Dequantize, MakeQArray, MatmulQ, QArray, QArrayParts, Quantize
from hxmlir.types.rank1 import Factors, MatmulR1, Outer, Rank1
from hxmlir.types.tuples import GetTupElt, HiTup, MakeTup


@register_to_lojax(Quantize)
def _quantize(prim, x):
  return QArray(*hx_quantize_p.bind(x, **prim.params))  # (q, s) or (q, s, offset)


@register_to_lojax(Dequantize)
def _dequantize(prim, qx):
  return hx_dequantize_p.bind(*qx.components)


@register_to_lojax(MatmulQ)
def _matmul_q(prim, x, qw):
  # a bf16/f16 x (hxmlir.types.matmul_q_typing.DENSE_DTYPES) is converted to f32, exactly,
  # before the composite: hx.matmul_q's contract is f32 x (LO_DENSE_DTYPES), so every kernel
  # takes it as it is
  x = jax.lax.convert_element_type(x, F32)
  return hx_matmul_q_p.bind(x, *qw.components, **prim.params)


@register_to_lojax(Outer)
def _outer(prim, col, row):
  c, r = hx_outer_p.bind(col, row)
  return Rank1(c, r)


@register_to_lojax(Factors)
def _factors(prim, r1):
  return (r1.col, r1.row)


@register_to_lojax(MatmulR1)
def _matmul_r1(prim, x, r1):
  return hx_matmul_r1_p.bind(x, r1.col, r1.row)


@register_to_lojax(MakeTup)
def _make_tup(prim, *elts):
  return HiTup(tuple(elts), prim.out_aval)


@register_to_lojax(GetTupElt)
def _get_tuple_element(prim, tup):
  return tup.elts[prim.idx]


@register_to_lojax(MakeQArray)
def _make_qarray_rule(prim, qvalue, scale, *offset):
  # no lo primitive and no composite (as for tuples): the components are the value.
  # Inside shard_map a component invariant over an axis the other varies over is
  # made varying, so both match the result type's manual-axis type.
  varying = prim.out_aval.mat.varying
  def vary(x, aval):
    missing = tuple(a for a in aval.sharding.mesh.axis_names
                    if a in varying and a not in aval.mat.varying)
    return jax.lax.pcast(x, missing, to="varying") if missing else x
  return QArray(*(vary(c, a) for c, a in zip((qvalue, scale, *offset), prim.in_avals)))


@register_to_lojax(QArrayParts)
def _qarray_parts_rule(prim, q):
  return q.components


@register_to_lojax(BroadcastHi)
def _broadcast_hi(prim, x):
  # lo components only: each gets the new axis
  ty, out = prim.in_avals[0], prim.out_aval
  return out.raise_val(*(prim.broadcast_lo(lo, o) for lo, o in zip(ty.lower_val(x), out.lo_ty())))
