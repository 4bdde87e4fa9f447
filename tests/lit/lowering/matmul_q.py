# RUN: env XLA_FLAGS=--xla_force_host_platform_device_count=8 %python %s | filecheck %s
# hx.matmul_q: (f32[*b, m, k], i8[*b, k, n], f32[*b, k]) -> f32[*b, m, n], no attributes.
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import hxmlir as hx
from hxmlir.testing import mesh, print_ir

x = jnp.ones((2, 6), "float32")
qw = hx.quantize(jnp.ones((6, 5), "float32"))
print_ir("matmul_q", hx.matmul_q, x, qw)
# CHECK-LABEL: TEST: matmul_q f32[2,6] q8[6,5]
# CHECK: func.func public @main(%[[X:[a-z0-9]+]]: tensor<2x6xf32>, %[[Q:[a-z0-9]+]]: tensor<6x5xi8>, %[[S:[a-z0-9]+]]: tensor<6xf32>)
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]], %[[S]] {decomposition = @[[IMPL:hx.matmul_q.impl]], version = 1 : i32} : (tensor<2x6xf32>, tensor<6x5xi8>, tensor<6xf32>) -> tensor<2x5xf32>
# CHECK-NEXT: return %[[Y]] : tensor<2x5xf32>
# The decomposition: the weight's row scales fold into x's columns, then an f32 dot.
# CHECK: func.func private @[[IMPL]](%[[A:[a-z0-9]+]]: tensor<2x6xf32>, %[[B:[a-z0-9]+]]: tensor<6x5xi8>, %[[C:[a-z0-9]+]]: tensor<6xf32>) -> tensor<2x5xf32>
# CHECK-NEXT: %[[S1:[0-9]+]] = stablehlo.broadcast_in_dim %[[C]], dims = [1] : (tensor<6xf32>) -> tensor<1x6xf32>
# CHECK-NEXT: %[[S2:[0-9]+]] = stablehlo.broadcast_in_dim %[[S1]], dims = [0, 1] : (tensor<1x6xf32>) -> tensor<2x6xf32>
# CHECK-NEXT: %[[XS:[0-9]+]] = stablehlo.multiply %[[A]], %[[S2]] : tensor<2x6xf32>
# CHECK-NEXT: %[[QF:[0-9]+]] = stablehlo.convert %[[B]] : (tensor<6x5xi8>) -> tensor<6x5xf32>
# CHECK-NEXT: %[[R:[0-9]+]] = stablehlo.dot_general %[[XS]], %[[QF]], contracting_dims = [1] x [0]{{.*}} : (tensor<2x6xf32>, tensor<6x5xf32>) -> tensor<2x5xf32>
# CHECK-NEXT: return %[[R]] : tensor<2x5xf32>

with jax.set_mesh(mesh("i=4,j=2")):
  xs = jax.device_put(jnp.ones((4, 8, 6), "float32"), P("i", "j", None))
  qws = hx.quantize(jax.device_put(jnp.ones((4, 6, 5), "float32"), P("i", None, None)))
  print_ir("matmul_q_sharded", hx.matmul_q, xs, qws)
# Batch sharded over "i", x's rows over "j"; contraction and quantized axes unsharded.
# The result's rows are sharded like x's rows, its columns like the weight's columns.
# CHECK-LABEL: TEST: matmul_q_sharded f32[4@i,8@j,6] q8[4@i,6,5]
# CHECK: func.func public @main(%[[X:[a-z0-9]+]]: tensor<4x8x6xf32> {{.*}}, %[[Q:[a-z0-9]+]]: tensor<4x6x5xi8>, %[[S:[a-z0-9]+]]: tensor<4x6xf32>)
# CHECK-NEXT: %[[XC:[0-9]+]] = sdy.sharding_constraint %[[X]] <@mesh, [{"i"}, {"j"}, {}]> : tensor<4x8x6xf32>
# CHECK-NEXT: %[[QC:[0-9]+]] = sdy.sharding_constraint %[[Q]] <@mesh, [{"i"}, {}, {}]> : tensor<4x6x5xi8>
# CHECK-NEXT: %[[SC:[0-9]+]] = sdy.sharding_constraint %[[S]] <@mesh, [{"i"}, {}]> : tensor<4x6xf32>
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.composite "hx.matmul_q" %[[XC]], %[[QC]], %[[SC]] {decomposition = @[[IMPL:hx.matmul_q.impl]], sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {"j"}, {}]>]>, version = 1 : i32} : (tensor<4x8x6xf32>, tensor<4x6x5xi8>, tensor<4x6xf32>) -> tensor<4x8x5xf32>
# CHECK-NEXT: return %[[Y]]
# CHECK: func.func private @[[IMPL]](%{{.*}}: tensor<4x8x6xf32>, %{{.*}}: tensor<4x6x5xi8>, %{{.*}}: tensor<4x6xf32>) -> tensor<4x8x5xf32>
# CHECK-NOT: sdy.
# CHECK: stablehlo.dot_general %{{.*}}, %{{.*}}, batching_dims = [0] x [0], contracting_dims = [2] x [1]
# CHECK-NOT: sdy.
# CHECK: return
