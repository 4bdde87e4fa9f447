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

``hx_matmul_q_p``'s rules (the default and the platforms', side by side) are in
:mod:`hxmlir.lowering.matmul_q`. A platform-specific implementation replaces a rule for one
platform only::

  mlir.register_lowering(hx_matmul_q_p, my_cpu_rule, platform="cpu")

where ``my_cpu_rule(ctx, x, q, s)`` returns
``lower_composite(ctx, "hx.matmul_q", x, q, s, builder=my_builder)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import mlir

from hxmlir import _jax, formats
from hxmlir.lowering import reference, schema
from hxmlir.lowering.composite import lower_composite
from hxmlir.lowering.primitives import (
  hx_dequantize_p,
  hx_matmul_q_p,
  hx_matmul_r1_p,
  hx_outer_p,
  hx_quantize_p,
)

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


def format_attributes(q_aval, s_aval, o_aval=None) -> dict:
  """The format ``composite_attributes`` of stored values ``q_aval`` with scales ``s_aval``
  and offsets ``o_aval`` (``None``: a format without; :func:`schema.format_attributes_of`)."""
  return schema.format_attributes_of(*(schema.TensorType.of(a) for a in (q_aval, s_aval, o_aval)
                                       if a is not None))


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
  if _prim not in (hx_matmul_q_p, hx_quantize_p, hx_dequantize_p):  # (hx_matmul_q_p: matmul_q/)
    mlir.register_lowering(_prim, composite_rule(_op.name, _ref, _op.attribute_values))
mlir.register_lowering(hx_quantize_p, lower_quantize)
mlir.register_lowering(hx_dequantize_p, lower_dequantize)


# --- hxmlir's lo primitives inside Pallas kernels ------------------------------
# A kernel over hi refs (hxmlir.pallas) calls hx.dequantize, hx.matmul_q, ...:
# inside a Mosaic or Triton kernel each lo primitive lowers as its reference
# semantics, the composite's decomposition, written inline (Pallas has no
# composites). Registered with Pallas when a hi type first meets pallas_call.

def quantize_in_kernel(x, fmt="int8", group_size=None, method="absmax",
                       round_half_even=jnp.round):
  """``reference.quantize`` in a kernel: no generic reduce there, and Triton's max drops NaN.

  ``amax`` is a max reduction of the (never empty) block, made NaN for rows (or groups)
  holding a NaN or an infinity (counted with a sum), which the reference turns into a
  NaN scale and zero values just as for its own ``amax``.
  """
  f = formats.lookup(fmt)
  xg = formats.split_groups(x, group_size)
  bad = jnp.sum(jnp.where(jnp.isfinite(xg), 0.0, 1.0), axis=-1) > 0
  amax = jnp.where(bad, jnp.nan, jnp.max(jnp.abs(xg), axis=-1))
  if method == "mse":
    amax = reference.mse_amax(xg, amax, f, round_half_even)
  q, s = reference.quantize_with_amax(xg, amax, round_half_even, f)
  return formats.store(q.reshape(x.shape), f), s


def round_half_even_by_floor(v):
  """``round_half_even(v)`` for finite f32 ``|v| < 2**23`` with ``floor`` (Triton kernels have no ``round``).

  ``v - floor(v)`` is exact there; a fraction above 1/2 rounds up, exactly 1/2
  rounds to the even neighbour.
  """
  f = jnp.floor(v)
  frac = v - f
  odd = (f - 2 * jnp.floor(f * 0.5)) == 1
  return f + jnp.where((frac > 0.5) | ((frac == 0.5) & odd), 1.0, 0.0).astype(v.dtype)


for _prim, _ref in REFERENCES.items():
  if _prim is hx_quantize_p:
    _jax.add_pallas_kernel_rule(
        _prim, quantize_in_kernel,
        triton_fn=functools.partial(quantize_in_kernel,
                                    round_half_even=round_half_even_by_floor))
  else:
    _jax.add_pallas_kernel_rule(_prim, _ref)
