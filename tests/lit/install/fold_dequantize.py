# RUN: %python %s | filecheck %s
# hx.install() runs the pipeline inside jax.jit(...).lower(): a hand-written
# `x @ hx.dequantize(qw)` comes out folded (the scales multiply x, the int8
# values feed the dot; as hx.matmul_q where its contract fits). Without install,
# and again after hx.uninstall(), it stays dequantize-then-dot.
import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir.testing import print_ir


def dequant_dot(x, qw):
  return x @ hx.dequantize(qw)


rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((2, 3)), jnp.float32)
qw = hx.quantize(jnp.asarray(rng.standard_normal((3, 4)), jnp.float32))
xb = jnp.asarray(rng.standard_normal((5, 2, 3)), jnp.float32)

print_ir("plain", dequant_dot, x, qw)
# CHECK-LABEL: TEST: plain f32[2,3] q8[3,4]
# CHECK: func.func public @main(%[[X:.*]]: tensor<2x3xf32>, %[[Q:.*]]: tensor<3x4xi8>, %[[S:.*]]: tensor<3xf32>)
# CHECK-NEXT: %[[D:.*]] = stablehlo.composite "hx.dequantize" %[[Q]], %[[S]]
# CHECK-NEXT: %[[Y:.*]] = stablehlo.dot_general %[[X]], %[[D]], contracting_dims = [1] x [0]
# CHECK-NEXT: return %[[Y]]

hx.install()
print_ir("installed", dequant_dot, x, qw)
# CHECK-LABEL: TEST: installed f32[2,3] q8[3,4]
# CHECK: func.func public @main(%[[X:.*]]: tensor<2x3xf32>, %[[Q:.*]]: tensor<3x4xi8>, %[[S:.*]]: tensor<3xf32>)
# CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]], %[[S]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:[^,]*]], version = 3 : i32} : (tensor<2x3xf32>, tensor<3x4xi8>, tensor<3xf32>) -> tensor<2x4xf32>
# CHECK-NEXT: return %[[Y]] : tensor<2x4xf32>
# CHECK: func.func private @[[IMPL]](%{{.*}}: tensor<2x3xf32>, %{{.*}}: tensor<3x4xi8>, %{{.*}}: tensor<3xf32>) -> tensor<2x4xf32>

print_ir("installed_batched_x", dequant_dot, xb, qw)
# CHECK-LABEL: TEST: installed_batched_x f32[5,2,3] q8[3,4]
# CHECK: func.func public @main(%[[X:.*]]: tensor<5x2x3xf32>, %[[Q:.*]]: tensor<3x4xi8>, %[[S:.*]]: tensor<3xf32>)
# N-d activations: one hx.matmul_q v2 carrying the dot's dims (never the whole weight
# converted on CPU: the decomposition collapses x's leading dims into rows).
# CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]], %[[S]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 2>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:[^,]*]], version = 3 : i32} : (tensor<5x2x3xf32>, tensor<3x4xi8>, tensor<3xf32>) -> tensor<5x2x4xf32>
# CHECK-NEXT: return %[[Y]]
# CHECK-NOT: "hx.dequantize"

folded = np.asarray(jax.jit(dequant_dot)(x, qw))
hx.uninstall()
print_ir("uninstalled", dequant_dot, x, qw)
# CHECK-LABEL: TEST: uninstalled f32[2,3] q8[3,4]
# CHECK: func.func public @main
# CHECK-NEXT: stablehlo.composite "hx.dequantize"
# CHECK-NEXT: stablehlo.dot_general

# Same numbers as the unfolded program, up to f32 summation order.
plain = np.asarray(jax.jit(dequant_dot)(x, qw))
print("TEST: results close", bool(np.allclose(folded, plain, rtol=1e-6, atol=1e-6)))
# CHECK-LABEL: TEST: results close True
