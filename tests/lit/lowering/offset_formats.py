# RUN: %python %s | filecheck %s
# Formats with an offset or f16 scales (hxmlir/formats.py): hx.quantize v3,
# hx.dequantize v3 and hx.matmul_q v4 carry scale_dtype and offset; the offsets follow
# the scales (one more result or operand); the formats of before keep their versions.
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir.testing import print_ir

x = jnp.ones((4, 64), "float32")
print_ir("quantize_u4o_minmax",
         lambda x: hx.quantize(x, jnp.uint4, group_size=32, method="minmax"), x)
# CHECK-LABEL: TEST: quantize_u4o_minmax f32[4,64]
# CHECK: stablehlo.composite "hx.quantize" %arg0 {composite_attributes = {dtype = "uint4", group_size = 32 : i64, layout = "uint4_pairs_v1", method = "minmax", offset = true, qmax = 15 : i64, scale_dtype = "f32"}, decomposition = @[[IMPL:hx.quantize.impl]], version = 3 : i32} : (tensor<4x64xf32>) -> (tensor<4x32xui8>, tensor<4x2xf32>, tensor<4x2xf32>)
# One pass finds each group's minimum, maximum and non-finite flag ...
# CHECK: func.func private @[[IMPL]]
# CHECK: stablehlo.reduce({{.*}}) across dimensions = [2] : (tensor<4x2x32xf32>, tensor<4x2x32xf32>, tensor<4x2x32xi1>, tensor<f32>, tensor<f32>, tensor<i1>) -> (tensor<4x2xf32>, tensor<4x2xf32>, tensor<4x2xi1>)
# ... and values in [0, 15] are rounded half to even.
# CHECK: stablehlo.round_nearest_even

v = np.zeros((48, 32), np.uint8)
s16 = np.ones((48, 2), np.float16)
q = hx.make_qarray(v, s16, s16)
print_ir("dequantize_u4o_f16", hx.dequantize, q)
# CHECK-LABEL: TEST: dequantize_u4o_f16 u4o[48,64:g32,f16]
# CHECK: stablehlo.composite "hx.dequantize" %arg0, %arg1, %arg2 {composite_attributes = {dtype = "uint4_f16", group_size = 32 : i64, layout = "uint4_pairs_v1", offset = true, scale_dtype = "f16"}, decomposition = @[[IMPL:hx.dequantize.impl]], version = 3 : i32} : (tensor<48x32xui8>, tensor<48x2xf16>, tensor<48x2xf16>) -> tensor<48x64xf32>
# Unsigned nibbles (no sign extension), f16 scales and offsets widened to f32:
# CHECK: func.func private @[[IMPL]]
# CHECK: stablehlo.shift_right_logical %{{.*}}, %{{.*}} : tensor<48x32xui8>
# CHECK: stablehlo.convert %{{.*}} : (tensor<48x2xf16>) -> tensor<48x2xf32>
# CHECK: stablehlo.multiply
# CHECK: stablehlo.add

print_ir("einsum_out_in_u4o_f16", lambda x, q: hx.einsum("...k,nk->...n", x, q), x, q)
# The [out, in] layout, groups along the contraction: the scaled partial sums plus the
# offset term, x summed per group then contracted with the offsets.
# CHECK-LABEL: TEST: einsum_out_in_u4o_f16 f32[4,64] u4o[48,64:g32,f16]
# CHECK: stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2, %arg3 {composite_attributes = {dtype = "uint4_f16", group_size = 32 : i64, layout = "uint4_pairs_v1", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, offset = true, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1>, scale_dtype = "f16"}, decomposition = @[[IMPL:hx.matmul_q.impl]], version = 4 : i32} : (tensor<4x64xf32>, tensor<48x32xui8>, tensor<48x2xf16>, tensor<48x2xf16>) -> tensor<4x48xf32>
# CHECK: func.func private @[[IMPL]]
# CHECK: stablehlo.dot_general %{{.*}}, %{{.*}}, batching_dims = [1] x [1], contracting_dims = [2] x [2]{{.*}} : (tensor<4x2x32xf32>, tensor<48x2x32xf32>) -> tensor<2x4x48xf32>
# CHECK: stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.add across dimensions = [2] : (tensor<4x2x32xf32>, tensor<f32>) -> tensor<4x2xf32>
# CHECK: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1] x [1]{{.*}} : (tensor<4x2xf32>, tensor<48x2xf32>) -> tensor<4x48xf32>
# CHECK: stablehlo.add %{{.*}}, %{{.*}} : tensor<4x48xf32>

q8 = hx.make_qarray(np.zeros((48, 64), np.int8), s16)
print_ir("einsum_q8_f16", lambda x, q: hx.einsum("...k,nk->...n", x, q), x, q8)
# GGUF's Q8_0: int8 values with f16 scales, no offset operand.
# CHECK-LABEL: TEST: einsum_q8_f16 f32[4,64] q8[48,64:g32,f16]
# CHECK: stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2 {composite_attributes = {dtype = "int8_f16", {{.*}}offset = false, {{.*}}scale_dtype = "f16"}, {{.*}}version = 4 : i32} : (tensor<4x64xf32>, tensor<48x64xi8>, tensor<48x2xf16>) -> tensor<4x48xf32>

print_ir("quantize_q4_keeps_version_2", lambda x: hx.quantize(x, jnp.int4, group_size=32), x)
# CHECK-LABEL: TEST: quantize_q4_keeps_version_2 f32[4,64]
# CHECK: stablehlo.composite "hx.quantize" %arg0 {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1", method = "absmax", qmax = 7 : i64}, {{.*}}version = 2 : i32}
