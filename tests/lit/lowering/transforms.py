# RUN: env XLA_FLAGS=--xla_force_host_platform_device_count=8 %python %s | filecheck %s
# The composites survive grad, vmap and scan, and tuples leave none.
import jax
import jax.numpy as jnp

import hxmlir as hx
from hxmlir.testing import print_ir

x, w = jnp.ones((2, 3), "float32"), jnp.ones((3, 4), "float32")


def loss(x, w):
  return hx.matmul_q(x, hx.quantize(w)).sum()


print_ir("value_and_grad", jax.value_and_grad(loss, argnums=(0, 1)), x, w)
# The forward pass keeps quantize and matmul_q; so does the backward pass in x (MatmulQ's
# VJP: gx = g @ qw^T is matmul_q with the weight's other dimension contracted, the weight
# never dequantized); the gradient in w is a plain dot_general.
# CHECK-LABEL: TEST: value_and_grad f32[2,3] f32[3,4]
# CHECK: func.func public @main(%[[X:[a-z0-9]+]]: tensor<2x3xf32>, %[[W:[a-z0-9]+]]: tensor<3x4xf32>)
# CHECK: %[[Q:[0-9]+]]:2 = stablehlo.composite "hx.quantize" %[[W]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", method = "absmax", qmax = 127 : i64}, decomposition = @hx.quantize.impl, version = 2 : i32}
# CHECK: stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]]#0, %[[Q]]#1 {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @hx.matmul_q.impl, version = 3 : i32} : (tensor<2x3xf32>, tensor<3x4xi8>, tensor<3xf32>) -> tensor<2x4xf32>
# CHECK: stablehlo.dot_general %[[G:[0-9]+]], %[[X]], contracting_dims = [0] x [0]
# CHECK: %[[GX:[0-9]+]] = stablehlo.composite "hx.matmul_q" %[[G]], %[[Q]]#0, %[[Q]]#1 {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1>}, decomposition = @hx.matmul_q.impl_0, version = 3 : i32} : (tensor<2x4xf32>, tensor<3x4xi8>, tensor<3xf32>) -> tensor<2x3xf32>
# CHECK: return %{{[0-9]+}}, %[[GX]], %{{[0-9]+}}
# CHECK-NOT: hx.dequantize
# CHECK: func.func private @hx.quantize.impl(
# CHECK: func.func private @hx.matmul_q.impl(
# CHECK: func.func private @hx.matmul_q.impl_0(

print_ir("vmap", jax.vmap(lambda x, w: hx.matmul_q(x, hx.quantize(w))),
         jnp.ones((5, 2, 3), "float32"), jnp.ones((5, 3, 4), "float32"))
# vmap adds a leading batch dimension to every operand and result of the composites.
# CHECK-LABEL: TEST: vmap f32[5,2,3] f32[5,3,4]
# CHECK: %[[Q:[0-9]+]]:2 = stablehlo.composite "hx.quantize" %{{.*}} : (tensor<5x3x4xf32>) -> (tensor<5x3x4xi8>, tensor<5x3xf32>)
# CHECK-NEXT: stablehlo.composite "hx.matmul_q" %{{.*}}, %[[Q]]#0, %[[Q]]#1 {{.*}} : (tensor<5x2x3xf32>, tensor<5x3x4xi8>, tensor<5x3xf32>) -> tensor<5x2x4xf32>
# CHECK: func.func private @hx.quantize.impl(%{{.*}}: tensor<5x3x4xf32>) -> (tensor<5x3x4xi8>, tensor<5x3xf32>)
# CHECK: stablehlo.reduce({{.*}}) across dimensions = [2]
# CHECK: func.func private @hx.matmul_q.impl(%{{.*}}: tensor<5x2x3xf32>, %{{.*}}: tensor<5x3x4xi8>, %{{.*}}: tensor<5x3xf32>) -> tensor<5x2x4xf32>
# CHECK: stablehlo.dot_general {{.*}} batching_dims = [0] x [0], contracting_dims = [2] x [1]


def body(c, w):
  return c + hx.matmul_q(x, hx.quantize(w)).sum(), None


print_ir("scan", lambda ws: jax.lax.scan(body, 0.0, ws)[0], jnp.ones((5, 3, 4), "float32"))
# The loop body (a called function) holds the composites, once per iteration.
# CHECK-LABEL: TEST: scan f32[5,3,4]
# CHECK: stablehlo.while
# CHECK: func.call @[[BODY:closed_call[_0-9]*]](
# CHECK: func.func private @[[BODY]](
# CHECK: stablehlo.composite "hx.quantize" {{.*}} : (tensor<3x4xf32>) -> (tensor<3x4xi8>, tensor<3xf32>)
# CHECK-NEXT: stablehlo.composite "hx.matmul_q" {{.*}} : (tensor<2x3xf32>, tensor<3x4xi8>, tensor<3xf32>) -> tensor<2x4xf32>
# CHECK: func.func private @hx.quantize.impl(
# CHECK: func.func private @hx.matmul_q.impl(

print_ir("tuple", lambda a, b: hx.get_tuple_element(hx.make_tup(a, hx.quantize(b)), 1), x, w)
# make_tup / get_tuple_element exist only in the hi jaxpr: only hx.quantize is left.
# CHECK-LABEL: TEST: tuple f32[2,3] f32[3,4]
# CHECK: func.func public @main(
# CHECK-NOT: hx.tup
# CHECK: %[[Q:[0-9]+]]:2 = stablehlo.composite "hx.quantize"
# CHECK-NOT: stablehlo.composite
# CHECK: return %[[Q]]#0, %[[Q]]#1 : tensor<3x4xi8>, tensor<3xf32>
# CHECK-NOT: stablehlo.composite
# CHECK: func.func private @hx.quantize.impl(


# hx.make_qarray and hx.qarray_parts leave no composite (like tuples): the q8 built
# from an int8 and an f32 argument is those arguments, and taking one apart returns
# its components.
qv, sc = jnp.ones((3, 4), jnp.int8), jnp.ones(3, jnp.float32)
print_ir("make_qarray", lambda qv, s, x: hx.matmul_q(x, hx.make_qarray(qv, s)), qv, sc, x)
# CHECK-LABEL: TEST: make_qarray i8[3,4] f32[3] f32[2,3]
# CHECK: func.func public @main(%[[QV:[a-z0-9]+]]: tensor<3x4xi8>, %[[S:[a-z0-9]+]]: tensor<3xf32>, %[[X:[a-z0-9]+]]: tensor<2x3xf32>)
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.composite "hx.matmul_q" %[[X]], %[[QV]], %[[S]]
# CHECK-NEXT: return %[[Y]]
# CHECK-NOT: hx.make_qarray

print_ir("qarray_parts", hx.qarray_parts, hx.quantize(w))
# CHECK-LABEL: TEST: qarray_parts q8[3,4]
# CHECK: func.func public @main(%[[QV:[a-z0-9]+]]: tensor<3x4xi8>, %[[S:[a-z0-9]+]]: tensor<3xf32>)
# CHECK-NEXT: return %[[QV]], %[[S]] : tensor<3x4xi8>, tensor<3xf32>
