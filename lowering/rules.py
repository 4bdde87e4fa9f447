"""``mlir.register_lowering`` rules of hxmlir's lo primitives.

Each lo primitive lowers to one ``stablehlo.composite "hx.<op>"`` (name,
version and attributes from :mod:`hxmlir.lowering.schema`) whose decomposition
is its reference function (:mod:`hxmlir.lowering.reference`) lowered to
StableHLO; see :func:`hxmlir.lowering.composite.lower_composite`.

The rules are registered cacheable (JAX's default): JAX runs a rule once per
primitive, operand types and platforms inside a detached function and inlines
it at each use, keeping each use's source location (the user's file and line).
Keep per-platform rules cacheable too: ``cacheable=False`` marks the
*primitive* uncacheable, and JAX 0.10.2's multi-platform lowering of an
uncacheable primitive with platform-specific rules fails
(``TypeError: can only concatenate list (not "tuple") to list`` in
``mlir.lower_per_platform``), which breaks ``jax.export`` for several
platforms. Identical decompositions are shared within a module by
``lower_composite``.

A platform-specific implementation replaces a rule for one platform only::

  mlir.register_lowering(hx_matmul_q_p, my_cpu_rule, platform="cpu")

where ``my_cpu_rule(ctx, x, q, s)`` returns
``lower_composite(ctx, "hx.matmul_q", x, q, s, builder=my_builder)``.
"""

from __future__ import annotations

from collections.abc import Callable

from jax.extend.core import Primitive
from jax.interpreters import mlir

from hxmlir import formats
from hxmlir.lowering import reference, schema
from hxmlir.lowering.composite import lower_composite
from hxmlir.lowering.primitives import (
  hx_dequantize_p,
  hx_matmul_q_p,
  hx_matmul_r1_p,
  hx_outer_p,
  hx_quantize_p,
)
from hxmlir.types import dotdims

REFERENCES: dict[Primitive, Callable] = {
    hx_quantize_p: reference.quantize,
    hx_dequantize_p: reference.dequantize,
    hx_matmul_q_p: reference.matmul_q,
    hx_outer_p: reference.outer,
    hx_matmul_r1_p: reference.matmul_r1,
}
"""Each lo primitive's reference function: its composite's decomposition. The
composite's name, version and attributes are the schema's (:func:`schema.for_primitive`)."""


def composite_rule(name: str, ref: Callable, attributes: dict) -> Callable:
  """The lowering rule ``rule(ctx, *operands)`` emitting composite ``name`` around ``ref``."""
  def rule(ctx: mlir.LoweringRuleContext, *operands):
    return lower_composite(ctx, name, *operands, reference=ref, attributes=attributes)
  rule.__name__ = f"lower_{name.removeprefix(schema.PREFIX)}"
  return rule


def matmul_q_dims(x_aval, dimension_numbers) -> dotdims.DotDims:
  """An ``hx_matmul_q`` equation's dims: its ``dimension_numbers`` parameter, or version 1's
  for an equation bound without it (``f32[*b, m, k] x i8[*b, k, n]``)."""
  return dimension_numbers or dotdims.v1_dims(x_aval.ndim)


def format_attributes(q_aval, s_aval, o_aval=None) -> dict:
  """The format ``composite_attributes`` of stored values ``q_aval`` with scales ``s_aval``
  and offsets ``o_aval`` (``None``: a format without; :func:`schema.format_attributes_of`)."""
  return schema.format_attributes_of(*(schema.TensorType.of(a) for a in (q_aval, s_aval, o_aval)
                                       if a is not None))


def matmul_q_attributes(ctx: mlir.LoweringRuleContext, dims) -> dict:
  """``hx.matmul_q``'s ``composite_attributes`` for a rule's operands and ``dims`` (v3's
  keys, v4's for a format with f16 scales or an offset)."""
  return schema.matmul_q_attributes(dims, format_attributes(*ctx.avals_in[1:]))


def weight_format(ctx: mlir.LoweringRuleContext) -> formats.Format:
  """The format of an ``hx_matmul_q`` rule's weight (operands ``x, q, s[, o]``)."""
  q, s, *o = ctx.avals_in[1:]
  return formats.of_components(q.dtype, s.dtype, bool(o))


def lower_matmul_q(ctx: mlir.LoweringRuleContext, x, q, s, *o, dimension_numbers=None):
  """``hx_matmul_q_p`` -> ``hx.matmul_q`` version 3 (version 4 for a format with f16
  scales or offsets ``o``), its dims in ``composite_attributes`` (``stablehlo.dot_general``'s
  names) with the weight's format, decomposition :func:`reference.matmul_q` (or
  :func:`reference.matmul_q_offset`). The platforms' rules use it for the formats
  their kernels do not take (:attr:`hxmlir.formats.Format.native_cpu`)."""
  dims = matmul_q_dims(ctx.avals_in[0], dimension_numbers)
  return lower_composite(ctx, "hx.matmul_q", x, q, s, *o,
                         reference=reference.matmul_q_for(dims, bool(o)),
                         attributes=matmul_q_attributes(ctx, dims))


def lower_quantize(ctx: mlir.LoweringRuleContext, x, *, fmt="int8", group_size=None,
                   method="absmax"):
  """``hx_quantize_p`` -> ``hx.quantize``, decomposition :func:`reference.quantize` of the
  equation's format, group size and method."""
  f = formats.lookup(fmt)
  attrs = {"qmax": int(f.qmax), "method": method, **schema.format_attributes(f, group_size)}
  # (a format with an offset: three results, hx.quantize v3)
  return lower_composite(ctx, "hx.quantize", x,
                         reference=reference.quantize_for(fmt, group_size, method),
                         attributes=attrs)


def lower_dequantize(ctx: mlir.LoweringRuleContext, q, s, *o):
  """``hx_dequantize_p`` -> ``hx.dequantize`` version 2 with its operands' format (version 3
  for a format with f16 scales or offsets ``o``)."""
  return lower_composite(ctx, "hx.dequantize", q, s, *o, reference=reference.dequantize,
                         attributes=format_attributes(*ctx.avals_in))


for _prim, _ref in REFERENCES.items():
  _op = schema.for_primitive(_prim.name)
  if _prim not in (hx_matmul_q_p, hx_quantize_p, hx_dequantize_p):
    mlir.register_lowering(_prim, composite_rule(_op.name, _ref, _op.attribute_values))
mlir.register_lowering(hx_matmul_q_p, lower_matmul_q)
mlir.register_lowering(hx_quantize_p, lower_quantize)
mlir.register_lowering(hx_dequantize_p, lower_dequantize)
