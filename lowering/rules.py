"""``mlir.register_lowering`` rules of hxmlir's lo primitives."""

from __future__ import annotations

from jax.interpreters import mlir

from hxmlir.lowering import reference
from hxmlir.lowering.primitives import (
    hx_dequantize_p,
    hx_matmul_q_p,
    hx_matmul_r1_p,
    hx_outer_p,
    hx_quantize_p,
)

mlir.register_lowering(hx_quantize_p, mlir.lower_fun(reference.quantize, multiple_results=True))
mlir.register_lowering(hx_dequantize_p,
                       mlir.lower_fun(reference.dequantize, multiple_results=False))
mlir.register_lowering(hx_matmul_q_p, mlir.lower_fun(reference.matmul_q, multiple_results=False))
mlir.register_lowering(hx_outer_p, mlir.lower_fun(reference.outer, multiple_results=True))
mlir.register_lowering(hx_matmul_r1_p,
                       mlir.lower_fun(reference.matmul_r1, multiple_results=False))
