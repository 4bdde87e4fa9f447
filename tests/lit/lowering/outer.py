# RUN: env XLA_FLAGS=--xla_force_host_platform_device_count=8 %python %s | filecheck %s
# hx.outer: (f32[*b, m], f32[*b, n]) -> (f32[*b, m], f32[*b, n]): marks where a rank-1 value is formed.
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import hxmlir as hx
from hxmlir.testing import mesh, print_ir

col, row = jnp.ones((3,), "float32"), jnp.ones((5,), "float32")
print_ir("outer", hx.outer, col, row)
# CHECK-LABEL: TEST: outer f32[3] f32[5]
# CHECK: func.func public @main(%[[C:[a-z0-9]+]]: tensor<3xf32>, %[[R:[a-z0-9]+]]: tensor<5xf32>)
# CHECK-NEXT: %[[O:[0-9]+]]:2 = stablehlo.composite "hx.outer" %[[C]], %[[R]] {decomposition = @[[IMPL:hx.outer.impl]], version = 1 : i32} : (tensor<3xf32>, tensor<5xf32>) -> (tensor<3xf32>, tensor<5xf32>)
# CHECK-NEXT: return %[[O]]#0, %[[O]]#1 : tensor<3xf32>, tensor<5xf32>
# The decomposition is the identity on the factors: nothing is materialised.
# CHECK: func.func private @[[IMPL]](%[[A:[a-z0-9]+]]: tensor<3xf32>, %[[B:[a-z0-9]+]]: tensor<5xf32>) -> (tensor<3xf32>, tensor<5xf32>)
# CHECK-NEXT: return %[[A]], %[[B]] : tensor<3xf32>, tensor<5xf32>

with jax.set_mesh(mesh("i=4,j=2")):
  cs = jax.device_put(jnp.ones((8,), "float32"), P(None))
  rs = jax.device_put(jnp.ones((6,), "float32"), P("j"))
  print_ir("outer_sharded", hx.outer, cs, rs)
# CHECK-LABEL: TEST: outer_sharded f32[8] f32[6@j]
# CHECK: func.func public @main(%[[C:[a-z0-9]+]]: tensor<8xf32> {{.*}}, %[[R:[a-z0-9]+]]: tensor<6xf32> {{.*}})
# CHECK-NEXT: %[[CC:[0-9]+]] = sdy.sharding_constraint %[[C]] <@mesh, [{}]> : tensor<8xf32>
# CHECK-NEXT: %[[RC:[0-9]+]] = sdy.sharding_constraint %[[R]] <@mesh, [{"j"}]> : tensor<6xf32>
# CHECK-NEXT: stablehlo.composite "hx.outer" %[[CC]], %[[RC]] {decomposition = @[[IMPL:hx.outer.impl]], sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{}]>, <@mesh, [{"j"}]>]>, version = 1 : i32} : (tensor<8xf32>, tensor<6xf32>) -> (tensor<8xf32>, tensor<6xf32>)
# CHECK: func.func private @[[IMPL]](%{{.*}}: tensor<8xf32>, %{{.*}}: tensor<6xf32>) -> (tensor<8xf32>, tensor<6xf32>)
# CHECK-NEXT: return
