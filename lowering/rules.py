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

from hxmlir.lowering import reference, schema
from hxmlir.lowering.composite import lower_composite
from hxmlir.lowering.primitives import (
  hx_dequantize_p,
  hx_matmul_q_p,
  hx_matmul_r1_p,
  hx_outer_p,
  hx_quantize_p,
)

# lo primitive -> (composite name, reference function, composite_attributes)
COMPOSITES: dict[Primitive, tuple[str, Callable, dict]] = {
    hx_quantize_p: ("hx.quantize", reference.quantize, {"qmax": schema.QMAX}),
    hx_dequantize_p: ("hx.dequantize", reference.dequantize, {}),
    hx_matmul_q_p: ("hx.matmul_q", reference.matmul_q, {}),
    hx_outer_p: ("hx.outer", reference.outer, {}),
    hx_matmul_r1_p: ("hx.matmul_r1", reference.matmul_r1, {}),
}


def composite_rule(name: str, ref: Callable, attributes: dict) -> Callable:
  """The lowering rule ``rule(ctx, *operands)`` emitting composite ``name`` around ``ref``."""
  def rule(ctx: mlir.LoweringRuleContext, *operands):
    return lower_composite(ctx, name, *operands, reference=ref, attributes=attributes)
  rule.__name__ = f"lower_{name.removeprefix(schema.PREFIX)}"
  return rule


for _prim, (_name, _ref, _attrs) in COMPOSITES.items():
  mlir.register_lowering(_prim, composite_rule(_name, _ref, _attrs))
