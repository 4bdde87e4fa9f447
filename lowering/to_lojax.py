"""``to_lojax`` rules: each hi primitive expressed with hxmlir's lo primitives.

JAX calls these when it lowers a hi jaxpr: hi operands arrive as their value
classes (``QArray``, ``Rank1``, ``HiTup``) holding lo arrays, and the rule binds
lo primitives on the components. Tuples bind nothing: they exist only in the
hi jaxpr.
"""

from __future__ import annotations

from hxmlir.hiprim import register_to_lojax
from hxmlir.lowering.primitives import (
    hx_dequantize_p,
    hx_matmul_q_p,
    hx_matmul_r1_p,
    hx_outer_p,
    hx_quantize_p,
)
from hxmlir.qarray import Dequantize, MatmulQ, QArray, Quantize
from hxmlir.rank1 import Factors, MatmulR1, Outer, Rank1
from hxmlir.tuples import GetTupElt, HiTup, MakeTup


@register_to_lojax(Quantize)
def _quantize(prim, x):
  q, s = hx_quantize_p.bind(x)
  return QArray(q, s)


@register_to_lojax(Dequantize)
def _dequantize(prim, qx):
  return hx_dequantize_p.bind(qx.qvalue, qx.scale)


@register_to_lojax(MatmulQ)
def _matmul_q(prim, x, qw):
  return hx_matmul_q_p.bind(x, qw.qvalue, qw.scale)


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
