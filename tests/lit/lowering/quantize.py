# RUN: env XLA_FLAGS=--xla_force_host_platform_device_count=8 %python %s | filecheck %s
# hx.quantize: (f32[*l, n]) -> (i8[*l, n], f32[*l]), composite_attributes {qmax = 127 : i64}.
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import hxmlir as hx
from hxmlir.testing import mesh, print_ir

x = jnp.ones((4, 6), "float32")
print_ir("quantize", hx.quantize, x)
# CHECK-LABEL: TEST: quantize f32[4,6]
# CHECK: func.func public @main(%[[X:[a-z0-9]+]]: tensor<4x6xf32>)
# CHECK-NEXT: %[[Q:[a-z0-9]+]]:2 = stablehlo.composite "hx.quantize" %[[X]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", method = "absmax", qmax = 127 : i64}, decomposition = @[[IMPL:hx.quantize.impl]], version = 2 : i32} : (tensor<4x6xf32>) -> (tensor<4x6xi8>, tensor<4xf32>)
# CHECK-NEXT: return %[[Q]]#0, %[[Q]]#1 : tensor<4x6xi8>, tensor<4xf32>
# The decomposition: s = max|x| * f32(1/127) per row (NaN if not finite), q = clip(round(x / s)).
# CHECK: func.func private @[[IMPL]](%[[A:[a-z0-9]+]]: tensor<4x6xf32>) -> (tensor<4x6xi8>, tensor<4xf32>)
# Non-finite rows are found by an OR of ~is_finite carried in the same reduce as the
# maximum, never by the maximum (XLA CPU's vectorised max drops NaN):
# CHECK-NEXT: %[[ABS:[0-9]+]] = stablehlo.abs %[[A]] : tensor<4x6xf32>
# CHECK-NEXT: %[[ISFIN:[0-9]+]] = stablehlo.is_finite %[[A]] : (tensor<4x6xf32>) -> tensor<4x6xi1>
# CHECK-NEXT: %[[BAD:[0-9]+]] = stablehlo.not %[[ISFIN]] : tensor<4x6xi1>
# CHECK: %[[RED:[0-9]+]]:2 = stablehlo.reduce(%[[ABS]] init: %{{.*}}), (%[[BAD]] init: %{{.*}}) across dimensions = [1] : (tensor<4x6xf32>, tensor<4x6xi1>, tensor<f32>, tensor<i1>) -> (tensor<4xf32>, tensor<4xi1>)
# CHECK-NEXT: reducer(%{{.*}}: tensor<f32>, %{{.*}}: tensor<f32>) (%{{.*}}: tensor<i1>, %{{.*}}: tensor<i1>)
# CHECK-NEXT: stablehlo.maximum
# CHECK-NEXT: stablehlo.or
# A non-finite row's amax is NaN, and the scale is NaN where amax is not finite:
# CHECK: %[[AMAX:[0-9]+]] = stablehlo.select %[[RED]]#1, %{{.*}}, %[[RED]]#0 : tensor<4xi1>, tensor<4xf32>
# CHECK: %[[FIN:[0-9]+]] = stablehlo.is_finite %[[AMAX]] : (tensor<4xf32>) -> tensor<4xi1>
# CHECK: %[[POS:[0-9]+]] = stablehlo.compare GT, %[[AMAX]], %{{.*}}, FLOAT
# CHECK: %[[INV:.*]] = stablehlo.constant dense<0.00787401571> : tensor<f32>
# CHECK: %[[S0:[0-9]+]] = stablehlo.multiply %[[AMAX]], %{{.*}} : tensor<4xf32>
# A row that is not all zeros has at least the smallest normal scale (XLA CPU flushes
# a denormal one to zero):
# CHECK: stablehlo.constant dense<1.17549435E-38> : tensor<f32>
# CHECK: %[[SN:[0-9]+]] = stablehlo.maximum %[[S0]], %{{.*}} : tensor<4xf32>
# CHECK: %[[SZ:[0-9]+]] = stablehlo.select %[[POS]], %[[SN]], %{{.*}} : tensor<4xi1>, tensor<4xf32>
# CHECK: %[[S:[0-9]+]] = stablehlo.select %[[FIN]], %[[SZ]], %{{.*}} : tensor<4xi1>, tensor<4xf32>
# CHECK: stablehlo.divide %[[A]], %{{.*}} : tensor<4x6xf32>
# CHECK: stablehlo.round_nearest_even
# CHECK: stablehlo.maximum
# CHECK: stablehlo.minimum
# CHECK: %[[QV:[0-9]+]] = stablehlo.convert %{{.*}} : (tensor<4x6xf32>) -> tensor<4x6xi8>
# CHECK-NEXT: return %[[QV]], %[[S]] : tensor<4x6xi8>, tensor<4xf32>

with jax.set_mesh(mesh("i=4,j=2")):
  xs = jax.device_put(jnp.ones((8, 6), "float32"), P("i", None))
  print_ir("quantize_sharded", hx.quantize, xs)
# Rows sharded over "i": the values keep the operand's sharding, the scale drops the last axis.
# CHECK-LABEL: TEST: quantize_sharded f32[8@i,6]
# CHECK: sdy.mesh @mesh = <["i"=4, "j"=2]>
# CHECK: func.func public @main(%[[X:[a-z0-9]+]]: tensor<8x6xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"i"}, {}]>})
# CHECK-NEXT: %[[XC:[0-9]+]] = sdy.sharding_constraint %[[X]] <@mesh, [{"i"}, {}]> : tensor<8x6xf32>
# CHECK-NEXT: %[[Q:[0-9]+]]:2 = stablehlo.composite "hx.quantize" %[[XC]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", method = "absmax", qmax = 127 : i64}, decomposition = @[[IMPL:hx.quantize.impl]], sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>, <@mesh, [{"i"}]>]>, version = 2 : i32} : (tensor<8x6xf32>) -> (tensor<8x6xi8>, tensor<8xf32>)
# CHECK: func.func private @[[IMPL]](%{{.*}}: tensor<8x6xf32>) -> (tensor<8x6xi8>, tensor<8xf32>)
# The decomposition is plain StableHLO: no sharding ops inside.
# CHECK-NOT: sdy.
# CHECK: return
