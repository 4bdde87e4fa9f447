# RUN: env XLA_FLAGS=--xla_force_host_platform_device_count=8 %python %s | filecheck %s
# hx.dequantize v2: (i8[*l, n], f32[*l]) -> f32[*l, n], the format in composite_attributes.
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import hxmlir as hx
from hxmlir.testing import mesh, print_ir

qx = hx.quantize(jnp.ones((4, 6), "float32"))
print_ir("dequantize", hx.dequantize, qx)
# CHECK-LABEL: TEST: dequantize q8[4,6]
# CHECK: func.func public @main(%[[Q:[a-z0-9]+]]: tensor<4x6xi8>, %[[S:[a-z0-9]+]]: tensor<4xf32>)
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.composite "hx.dequantize" %[[Q]], %[[S]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain"}, decomposition = @[[IMPL:hx.dequantize.impl]], version = 2 : i32} : (tensor<4x6xi8>, tensor<4xf32>) -> tensor<4x6xf32>
# CHECK-NEXT: return %[[Y]] : tensor<4x6xf32>
# The decomposition: q * s[..., None].
# CHECK: func.func private @[[IMPL]](%[[A:[a-z0-9]+]]: tensor<4x6xi8>, %[[B:[a-z0-9]+]]: tensor<4xf32>) -> tensor<4x6xf32>
# CHECK-NEXT: %[[QF:[0-9]+]] = stablehlo.convert %[[A]] : (tensor<4x6xi8>) -> tensor<4x6xf32>
# CHECK-NEXT: %[[S1:[0-9]+]] = stablehlo.broadcast_in_dim %[[B]], dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>
# CHECK-NEXT: %[[S2:[0-9]+]] = stablehlo.broadcast_in_dim %[[S1]], dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x6xf32>
# CHECK-NEXT: %[[R:[0-9]+]] = stablehlo.multiply %[[QF]], %[[S2]] : tensor<4x6xf32>
# CHECK-NEXT: return %[[R]] : tensor<4x6xf32>

with jax.set_mesh(mesh("i=4,j=2")):
  qs = hx.quantize(jax.device_put(jnp.ones((8, 6), "float32"), P("i", None)))
  print_ir("dequantize_sharded", hx.dequantize, qs)
# The scale is sharded like the values without their last axis; the result like the values.
# CHECK-LABEL: TEST: dequantize_sharded q8[8@i,6]
# CHECK: func.func public @main(%[[Q:[a-z0-9]+]]: tensor<8x6xi8>, %[[S:[a-z0-9]+]]: tensor<8xf32>)
# CHECK-NEXT: %[[QC:[0-9]+]] = sdy.sharding_constraint %[[Q]] <@mesh, [{"i"}, {}]> : tensor<8x6xi8>
# CHECK-NEXT: %[[SC:[0-9]+]] = sdy.sharding_constraint %[[S]] <@mesh, [{"i"}]> : tensor<8xf32>
# CHECK-NEXT: stablehlo.composite "hx.dequantize" %[[QC]], %[[SC]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain"}, decomposition = @[[IMPL:hx.dequantize.impl]], sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>, version = 2 : i32} : (tensor<8x6xi8>, tensor<8xf32>) -> tensor<8x6xf32>
# CHECK: func.func private @[[IMPL]](%{{.*}}: tensor<8x6xi8>, %{{.*}}: tensor<8xf32>) -> tensor<8x6xf32>
# CHECK-NOT: sdy.
# CHECK: return
