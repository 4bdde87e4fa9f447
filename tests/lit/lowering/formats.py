# RUN: env XLA_FLAGS=--xla_force_host_platform_device_count=8 %python %s | filecheck %s
# Quantization formats (hxmlir/formats.py): every op's composite_attributes say the format
# (dtype, group_size: 0 per row, layout); int4 values are stored two per ui8.
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import hxmlir as hx
from hxmlir.testing import mesh, print_ir

x = jnp.ones((4, 64), "float32")
print_ir("quantize_q4_g32", lambda x: hx.quantize(x, jnp.int4, group_size=32, method="mse"), x)
# CHECK-LABEL: TEST: quantize_q4_g32 f32[4,64]
# CHECK: func.func public @main(%{{.*}}: tensor<4x64xf32>) -> (tensor<4x32xui8> {{.*}}, tensor<4x2xf32> {{.*}})
# CHECK-NEXT: stablehlo.composite "hx.quantize" %arg0 {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1", method = "mse", qmax = 7 : i64}, decomposition = @[[IMPL:hx.quantize.impl]], version = 2 : i32} : (tensor<4x64xf32>) -> (tensor<4x32xui8>, tensor<4x2xf32>)
# One maximum per group of 32 (the row split into [4, 2, 32]) ...
# CHECK: func.func private @[[IMPL]]
# CHECK: stablehlo.reduce({{.*}}) across dimensions = [2] : (tensor<4x2x32xf32>, tensor<4x2x32xi1>, tensor<f32>, tensor<i1>) -> (tensor<4x2xf32>, tensor<4x2xi1>)
# ... the MSE search sums each candidate's squared error per group ...
# CHECK: stablehlo.reduce({{.*}}) applies stablehlo.add across dimensions = [2] : (tensor<4x2x32xf32>, tensor<f32>) -> tensor<4x2xf32>
# ... and the values are packed: element 2j in the low nibble, 2j + 1 in the high one.
# CHECK: %[[LO:[0-9]+]] = stablehlo.and %{{.*}}, %{{.*}} : tensor<4x32xui8>
# CHECK: %[[HI:[0-9]+]] = stablehlo.shift_left %{{.*}}, %{{.*}} : tensor<4x32xui8>
# CHECK: stablehlo.or %[[LO]], %[[HI]] : tensor<4x32xui8>

q4 = hx.quantize(jnp.ones((48, 64)), jnp.int4, group_size=32)
print_ir("einsum_out_in_q4_g32", lambda x, q: hx.einsum("mk,nk->mn", x, q), x, q4)
# The [out, in] layout with groups along the contraction: each group's partial sum is
# scaled (the groups a batch dim of the dot), then the partial sums are added.
# CHECK-LABEL: TEST: einsum_out_in_q4_g32 f32[4,64] q4[48,64:g32]
# CHECK: stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2 {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1>}, decomposition = @[[IMPL:hx.matmul_q.impl]], version = 3 : i32} : (tensor<4x64xf32>, tensor<48x32xui8>, tensor<48x2xf32>) -> tensor<4x48xf32>
# CHECK: func.func private @[[IMPL]]
# CHECK: stablehlo.shift_right_arithmetic {{.*}} : tensor<48x32xi8>
# CHECK: stablehlo.dot_general %{{.*}}, %{{.*}}, batching_dims = [1] x [1], contracting_dims = [2] x [2]{{.*}} : (tensor<4x2x32xf32>, tensor<48x2x32xf32>) -> tensor<2x4x48xf32>
# CHECK: stablehlo.multiply %{{.*}}, %{{.*}} : tensor<2x4x48xf32>
# CHECK: stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.add across dimensions = [0] : (tensor<2x4x48xf32>, tensor<f32>) -> tensor<4x48xf32>

print_ir("dequantize_f8", hx.dequantize, hx.quantize(jnp.ones((64, 16)), jnp.float8_e4m3fn))
# CHECK-LABEL: TEST: dequantize_f8 f8[64,16]
# CHECK: stablehlo.composite "hx.dequantize" %arg0, %arg1 {composite_attributes = {dtype = "float8_e4m3fn", group_size = 0 : i64, layout = "plain"}, decomposition = @{{.*}}, version = 2 : i32} : (tensor<64x16xf8E4M3FN>, tensor<64xf32>) -> tensor<64x16xf32>

with hx.installed():
  print_ir("fold_q4", lambda x, q: x @ hx.dequantize(q), x,
           hx.quantize(jnp.ones((64, 16)), jnp.int4, group_size=16))
# hx-fold-scales folds x @ dequantize(q4 with groups along the free axis) into one
# hx.matmul_q carrying the format; the groups become a batch dim of the scaled x.
# CHECK-LABEL: TEST: fold_q4 f32[4,64] q4[64,16:g16]
# CHECK: %[[Y:[0-9]+]] = stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2 {composite_attributes = {dtype = "int4", group_size = 16 : i64, layout = "int4_pairs_v1", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @{{.*}}, version = 3 : i32} : (tensor<4x64xf32>, tensor<64x8xui8>, tensor<64x1xf32>) -> tensor<4x16xf32>
# CHECK-NEXT: return %[[Y]]

with jax.set_mesh(mesh("i=4,j=2")):
  qs = hx.quantize(jax.device_put(jnp.ones((8, 64), "float32"), P(None, "i")), jnp.int4,
                   group_size=16)
  print_ir("dequantize_q4_sharded", hx.dequantize, qs)
# The quantized axis sharded over i = 4: 4 groups, one per shard; the group scales are
# sharded like the values (the group axis like the last axis).
# CHECK-LABEL: TEST: dequantize_q4_sharded q4[8,64@i:g16]
# CHECK: sdy.sharding_constraint %arg0 <@mesh, [{}, {"i"}]> : tensor<8x32xui8>
# CHECK-NEXT: sdy.sharding_constraint %arg1 <@mesh, [{}, {"i"}]> : tensor<8x4xf32>
# CHECK-NEXT: stablehlo.composite "hx.dequantize" {{.*}}sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{}, {"i"}]>]>, version = 2 : i32} : (tensor<8x32xui8>, tensor<8x4xf32>) -> tensor<8x64xf32>
