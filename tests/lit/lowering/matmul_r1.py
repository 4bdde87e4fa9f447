# RUN: env XLA_FLAGS=--xla_force_host_platform_device_count=8 %python %s | filecheck %s
# hx.matmul_r1: (f32[*b, p, m], f32[*b, m], f32[*b, n]) -> f32[*b, p, n]: x @ (col ⊗ row).
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import hxmlir as hx
from hxmlir.testing import mesh, print_ir

x = jnp.ones((2, 3), "float32")
r1 = hx.outer(jnp.ones((3,), "float32"), jnp.ones((5,), "float32"))
print_ir("matmul_r1", hx.matmul_r1, x, r1)
# CHECK-LABEL: TEST: matmul_r1 f32[2,3] r1[3,5]
# CHECK: func.func public @main(%[[X:[a-z0-9]+]]: tensor<2x3xf32>, %[[C:[a-z0-9]+]]: tensor<3xf32>, %[[R:[a-z0-9]+]]: tensor<5xf32>)
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.composite "hx.matmul_r1" %[[X]], %[[C]], %[[R]] {decomposition = @[[IMPL:hx.matmul_r1.impl]], version = 1 : i32} : (tensor<2x3xf32>, tensor<3xf32>, tensor<5xf32>) -> tensor<2x5xf32>
# CHECK-NEXT: return %[[Y]] : tensor<2x5xf32>
# The decomposition: (x @ col) ⊗ row, never materialising col ⊗ row.
# CHECK: func.func private @[[IMPL]](%[[A:[a-z0-9]+]]: tensor<2x3xf32>, %[[B:[a-z0-9]+]]: tensor<3xf32>, %[[D:[a-z0-9]+]]: tensor<5xf32>) -> tensor<2x5xf32>
# CHECK-NEXT: %[[XC:[0-9]+]] = stablehlo.dot_general %[[A]], %[[B]], contracting_dims = [1] x [0]{{.*}} : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2xf32>
# CHECK: stablehlo.broadcast_in_dim %[[XC]], dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
# CHECK: stablehlo.broadcast_in_dim %[[D]], dims = [1] : (tensor<5xf32>) -> tensor<1x5xf32>
# CHECK: %[[R2:[0-9]+]] = stablehlo.multiply %{{.*}}, %{{.*}} : tensor<2x5xf32>
# CHECK-NEXT: return %[[R2]] : tensor<2x5xf32>

with jax.set_mesh(mesh("i=4,j=2")):
  xs = jax.device_put(jnp.ones((4, 8), "float32"), P("i", None))
  r1s = hx.outer(jax.device_put(jnp.ones((8,), "float32"), P(None)),
                 jax.device_put(jnp.ones((6,), "float32"), P("j")))
  print_ir("matmul_r1_sharded", hx.matmul_r1, xs, r1s)
# Result rows sharded like x's rows ("i"), columns like row's ("j"); contraction unsharded.
# CHECK-LABEL: TEST: matmul_r1_sharded f32[4@i,8] r1[8,6@j]
# CHECK: func.func public @main(%[[X:[a-z0-9]+]]: tensor<4x8xf32> {{.*}}, %[[C:[a-z0-9]+]]: tensor<8xf32>, %[[R:[a-z0-9]+]]: tensor<6xf32>)
# CHECK-NEXT: %[[XC:[0-9]+]] = sdy.sharding_constraint %[[X]] <@mesh, [{"i"}, {}]> : tensor<4x8xf32>
# CHECK-NEXT: %[[CC:[0-9]+]] = sdy.sharding_constraint %[[C]] <@mesh, [{}]> : tensor<8xf32>
# CHECK-NEXT: %[[RC:[0-9]+]] = sdy.sharding_constraint %[[R]] <@mesh, [{"j"}]> : tensor<6xf32>
# CHECK-NEXT: stablehlo.composite "hx.matmul_r1" %[[XC]], %[[CC]], %[[RC]] {decomposition = @[[IMPL:hx.matmul_r1.impl]], sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {"j"}]>]>, version = 1 : i32} : (tensor<4x8xf32>, tensor<8xf32>, tensor<6xf32>) -> tensor<4x6xf32>
# CHECK: func.func private @[[IMPL]](%{{.*}}: tensor<4x8xf32>, %{{.*}}: tensor<8xf32>, %{{.*}}: tensor<6xf32>) -> tensor<4x6xf32>
# CHECK-NOT: sdy.
# CHECK: return
