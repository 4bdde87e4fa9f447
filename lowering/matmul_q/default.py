"""The default lowering rule of ``hx_matmul_q_p`` (every platform without its own) and what
the platforms' rules share: the equation's dims, the composite's attributes, the weight's
format.

:func:`lower_matmul_q` emits ``stablehlo.composite "hx.matmul_q"`` whose decomposition is
the reference (:func:`hxmlir.lowering.reference.matmul_q`); the CPU rule
(:mod:`hxmlir.lowering.matmul_q.cpu`) and the accelerators' rules
(:mod:`hxmlir.lowering.matmul_q.pallas`) emit the same composite with another
decomposition, and fall back to this one where their kernels do not take the weight.
"""

from __future__ import annotations

from jax.interpreters import mlir

from hxmlir import formats
from hxmlir.lowering import reference, schema
from hxmlir.lowering.composite import lower_composite
from hxmlir.lowering.rules import format_attributes
from hxmlir.types import dotdims


def matmul_q_dims(x_aval, dimension_numbers) -> dotdims.DotDims:
  """An ``hx_matmul_q`` equation's dims: its ``dimension_numbers`` parameter, or version 1's
  for an equation bound without it (``f32[*b, m, k] x i8[*b, k, n]``)."""
  return dimension_numbers or dotdims.v1_dims(x_aval.ndim)


def matmul_q_attributes(ctx: mlir.LoweringRuleContext, dims) -> dict:
  """``hx.matmul_q``'s ``composite_attributes`` for a rule's operands and ``dims`` (v3's
  keys, v4's for a format with f16 scales or an offset)."""
  return schema.matmul_q_attributes(dims, format_attributes(*ctx.avals_in[1:]))


def weight_format(ctx: mlir.LoweringRuleContext) -> formats.Format:
  """The format of an ``hx_matmul_q`` rule's weight (operands ``x, q, s[, o]``)."""
  q, s, *o = ctx.avals_in[1:]
  return formats.of_components(q.dtype, s.dtype, bool(o), q.shape)


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
