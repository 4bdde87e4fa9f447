# RUN: env XLA_FLAGS=--xla_force_host_platform_device_count=8 %python %s | filecheck %s
# hx.matmul_q version 2: dot_general(x, q * s[..., None]) with the dot's dimension numbers in
# composite_attributes (StableHLO's names); hx.matmul_q and hx.einsum both emit it.
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
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]], %[[S]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:hx.matmul_q.impl]], version = 3 : i32} : (tensor<2x6xf32>, tensor<6x5xi8>, tensor<6xf32>) -> tensor<2x5xf32>
# CHECK-NEXT: return %[[Y]] : tensor<2x5xf32>
# The decomposition: the weight's row scales fold into x's columns, then an f32 dot.
# CHECK: func.func private @[[IMPL]](%[[A:[a-z0-9]+]]: tensor<2x6xf32>, %[[B:[a-z0-9]+]]: tensor<6x5xi8>, %[[C:[a-z0-9]+]]: tensor<6xf32>) -> tensor<2x5xf32>
# CHECK-NEXT: %[[QF:[0-9]+]] = stablehlo.convert %[[B]] : (tensor<6x5xi8>) -> tensor<6x5xf32>
# CHECK-NEXT: %[[S2:[0-9]+]] = stablehlo.broadcast_in_dim %[[C]], dims = [1] : (tensor<6xf32>) -> tensor<2x6xf32>
# CHECK-NEXT: %[[XS:[0-9]+]] = stablehlo.multiply %[[A]], %[[S2]] : tensor<2x6xf32>
# CHECK-NEXT: %[[R:[0-9]+]] = stablehlo.dot_general %[[XS]], %[[QF]], contracting_dims = [1] x [0]{{.*}} : (tensor<2x6xf32>, tensor<6x5xf32>) -> tensor<2x5xf32>
# CHECK-NEXT: return %[[R]] : tensor<2x5xf32>

x3 = jnp.ones((2, 5, 6), "float32")
print_ir("matmul_q_transformer", hx.matmul_q, x3, qw)
# A transformer layer: f32[b, s, d] @ q8[d, f]; x's leading dims stay free dims of the dot.
# CHECK-LABEL: TEST: matmul_q_transformer f32[2,5,6] q8[6,5]
# CHECK: stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 2>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], version = 3 : i32} : (tensor<2x5x6xf32>, tensor<6x5xi8>, tensor<6xf32>) -> tensor<2x5x5xf32>
# CHECK: func.func private @[[IMPL]]
# CHECK: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [2] x [0]{{.*}} -> tensor<2x5x5xf32>

xo = jnp.ones((3, 6), "float32")
qo = hx.quantize(jnp.ones((4, 6), "float32"))
print_ir("einsum_out_in", lambda x, q: hx.einsum("mk,nk->mn", x, q), xo, qo)
# The [out, in] checkpoint layout: the sum runs over the quantized axis, so the scale
# multiplies the dot's result (broadcast along its columns), not x.
# CHECK-LABEL: TEST: einsum_out_in f32[3,6] q8[4,6]
# CHECK: stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1>}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], version = 3 : i32} : (tensor<3x6xf32>, tensor<4x6xi8>, tensor<4xf32>) -> tensor<3x4xf32>
# CHECK: func.func private @[[IMPL]](%[[A:[a-z0-9]+]]: tensor<3x6xf32>, %[[B:[a-z0-9]+]]: tensor<4x6xi8>, %[[C:[a-z0-9]+]]: tensor<4xf32>)
# CHECK-NEXT: %[[QF:[0-9]+]] = stablehlo.convert %[[B]]
# CHECK-NEXT: %[[D:[0-9]+]] = stablehlo.dot_general %[[A]], %[[QF]], contracting_dims = [1] x [1]{{.*}} -> tensor<3x4xf32>
# CHECK-NEXT: %[[SB:[0-9]+]] = stablehlo.broadcast_in_dim %[[C]], dims = [1] : (tensor<4xf32>) -> tensor<3x4xf32>
# CHECK-NEXT: %[[R:[0-9]+]] = stablehlo.multiply %[[D]], %[[SB]] : tensor<3x4xf32>
# CHECK-NEXT: return %[[R]]

xh = jnp.ones((2, 3, 4), "float32")
qh = hx.quantize(jnp.ones((5, 4, 6), "float32"))
print_ir("einsum_stacked", lambda x, q: hx.einsum("...ij,hjk->...ik", x, q), xh, qh)
# A stack of weights q8[h, j, k] summed over h (google/aqt#498): the scale s[h, j] makes
# h a new batch axis of the scaled x, contracted with q's h; one composite.
# CHECK-LABEL: TEST: einsum_stacked f32[2,3,4] q8[5,4,6]
# CHECK: stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 2, 3>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1, 0>}
# CHECK-SAME: -> tensor<2x3x6xf32>
# CHECK-NOT: stablehlo.composite "hx.matmul_q"
# CHECK-LABEL: func.func private

print_ir("matmul_q_vmap", jax.vmap(hx.matmul_q, in_axes=(0, None)), x3, qw)
# vmap of it stays one op: the mapped axis becomes one more free dim of x.
# CHECK-LABEL: TEST: matmul_q_vmap f32[2,5,6] q8[6,5]
# CHECK: stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 2>
# CHECK-NOT: stablehlo.composite
# CHECK-NOT: stablehlo.while

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
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.composite "hx.matmul_q" %[[XC]], %[[QC]], %[[SC]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64: 0>, lhs_contracting_dimensions = array<i64: 2>, rhs_batching_dimensions = array<i64: 0>, rhs_contracting_dimensions = array<i64: 1>}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {"j"}, {}]>]>, version = 3 : i32} : (tensor<4x8x6xf32>, tensor<4x6x5xi8>, tensor<4x6xf32>) -> tensor<4x8x5xf32>
# CHECK-NEXT: return %[[Y]]
# CHECK: func.func private @[[IMPL]](%{{.*}}: tensor<4x8x6xf32>, %{{.*}}: tensor<4x6x5xi8>, %{{.*}}: tensor<4x6xf32>) -> tensor<4x8x5xf32>
# CHECK-NOT: sdy.
# CHECK: stablehlo.dot_general %{{.*}}, %{{.*}}, batching_dims = [0] x [0], contracting_dims = [2] x [1]
# CHECK-NOT: sdy.
# CHECK: return
