# RUN: env XLA_FLAGS=--xla_force_host_platform_device_count=8 %python %s | filecheck %s
# jax.export for cpu, cuda and tpu at once (on this CPU machine): the lowering adds a
# platform-index argument to main, but never to a composite's decomposition, whose
# signature stays the composite's. The composites survive serialize/deserialize.
import jax
import jax.numpy as jnp
from jax import export

import hxmlir as hx
from hxmlir.testing import print_exported


def f(x, w, col, row):
  qw = hx.quantize(w)
  return (hx.matmul_q(x, qw), hx.dequantize(qw),
          hx.matmul_r1(x, hx.outer(col, row)))


args = (jnp.ones((2, 3), "float32"), jnp.ones((3, 4), "float32"),
        jnp.ones((3,), "float32"), jnp.ones((5,), "float32"))
exp = export.export(jax.jit(f), platforms=["cpu", "cuda", "tpu"])(*args)
print_exported("export_roundtrip", export.deserialize(exp.serialize()))
# CHECK-LABEL: TEST: export_roundtrip cpu,cuda,tpu
# CHECK: func.func public @main(%[[P:[a-z0-9]+]]: tensor<i32> {jax.global_constant = "_platform_index"}, %[[X:[a-z0-9]+]]: tensor<2x3xf32>, %[[W:[a-z0-9]+]]: tensor<3x4xf32>, %[[C:[a-z0-9]+]]: tensor<3xf32>, %[[R:[a-z0-9]+]]: tensor<5xf32>)
# CHECK: %[[Q:[0-9]+]]:2 = stablehlo.composite "hx.quantize" %[[W]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", method = "absmax", qmax = 127 : i64}, decomposition = @hx.quantize.impl, version = 2 : i32} : (tensor<3x4xf32>) -> (tensor<3x4xi8>, tensor<3xf32>)
# CHECK: stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]]#0, %[[Q]]#1 {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = dense<> : tensor<0xi64>, lhs_contracting_dimensions = dense<1> : tensor<1xi64>, rhs_batching_dimensions = dense<> : tensor<0xi64>, rhs_contracting_dimensions = dense<0> : tensor<1xi64>}, decomposition = @hx.matmul_q.impl, version = 3 : i32} : (tensor<2x3xf32>, tensor<3x4xi8>, tensor<3xf32>) -> tensor<2x4xf32>
# CHECK: stablehlo.composite "hx.dequantize" %[[Q]]#0, %[[Q]]#1 {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain"}, decomposition = @hx.dequantize.impl, version = 2 : i32}
# CHECK: %[[O:[0-9]+]]:2 = stablehlo.composite "hx.outer" %[[C]], %[[R]] {decomposition = @hx.outer.impl, version = 1 : i32}
# CHECK: stablehlo.composite "hx.matmul_r1" %[[X]], %[[O]]#0, %[[O]]#1 {decomposition = @hx.matmul_r1.impl, version = 1 : i32}
# No platform index in any decomposition: each takes exactly the composite's operands.
# CHECK: func.func private @hx.quantize.impl(%{{[a-z0-9]+}}: tensor<3x4xf32>) -> (tensor<3x4xi8>, tensor<3xf32>)
# CHECK: func.func private @hx.matmul_q.impl(%{{[a-z0-9]+}}: tensor<2x3xf32>, %{{[a-z0-9]+}}: tensor<3x4xi8>, %{{[a-z0-9]+}}: tensor<3xf32>) -> tensor<2x4xf32>
# CHECK-NOT: stablehlo.case
# CHECK: func.func private @hx.dequantize.impl(%{{[a-z0-9]+}}: tensor<3x4xi8>, %{{[a-z0-9]+}}: tensor<3xf32>) -> tensor<3x4xf32>
# CHECK: func.func private @hx.outer.impl(%{{[a-z0-9]+}}: tensor<3xf32>, %{{[a-z0-9]+}}: tensor<5xf32>) -> (tensor<3xf32>, tensor<5xf32>)
# CHECK: func.func private @hx.matmul_r1.impl(%{{[a-z0-9]+}}: tensor<2x3xf32>, %{{[a-z0-9]+}}: tensor<3xf32>, %{{[a-z0-9]+}}: tensor<5xf32>) -> tensor<2x5xf32>
