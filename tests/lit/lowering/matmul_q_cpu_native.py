# RUN: env HXMLIR_CPU_ISA=generic %python %s | filecheck %s
# hx.matmul_q on CPU while installed: the composite is unchanged, its
# decomposition calls the native kernel's FFI target (lowering/matmul_q/cpu.py).
# HXMLIR_CPU_ISA=generic: the portable build runs on every CPU, so this test
# needs only the extension (CI builds it), not AVX2.
import numpy as np

import hxmlir as hx
import hxmlir.export as hxe
from hxmlir.testing import print_exported, print_ir

print(hx.cpu_kernel_info())
# CHECK: native CPU kernel hx_matmul_q_cpu_v1 (generic; forced by $HXMLIR_CPU_ISA)

x = np.ones((2, 3, 512), np.float32)
qw = hx.quantize(np.ones((2, 512, 300), np.float32))
with hx.installed():
  print_ir("matmul_q_cpu_native", hx.matmul_q, x, qw)
# CHECK-LABEL: TEST: matmul_q_cpu_native f32[2,3,512] q8[2,512,300]
# CHECK: %[[Y:[0-9]+]] = stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2 {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64: 0>, lhs_contracting_dimensions = array<i64: 2>, rhs_batching_dimensions = array<i64: 0>, rhs_contracting_dimensions = array<i64: 1>}, decomposition = @[[IMPL:hx.matmul_q.impl]], version = 3 : i32} : (tensor<2x3x512xf32>, tensor<2x512x300xi8>, tensor<2x512xf32>) -> tensor<2x3x300xf32>
# CHECK: func.func private @[[IMPL]](%[[X:[a-z0-9]+]]: tensor<2x3x512xf32>, %[[Q:[a-z0-9]+]]: tensor<2x512x300xi8>, %[[S:[a-z0-9]+]]: tensor<2x512xf32>) -> tensor<2x3x300xf32>
# CHECK-NEXT: %[[C:[0-9]+]] = stablehlo.custom_call @hx_matmul_q_cpu_v1(%[[X]], %[[Q]], %[[S]]) {{.*}}mhlo.backend_config = {}{{.*}} : (tensor<2x3x512xf32>, tensor<2x512x300xi8>, tensor<2x512xf32>) -> tensor<2x3x300xf32>
# CHECK-NEXT: return %[[C]] : tensor<2x3x300xf32>

# Without install: the portable streaming decomposition.
print_ir("matmul_q_cpu_not_installed", hx.matmul_q, x, qw)
# CHECK-LABEL: TEST: matmul_q_cpu_not_installed
# CHECK-NOT: custom_call
# CHECK: stablehlo.while

# Exported while installed: portable unless hx.keep_native_cpu_calls().
x2, qw2 = x[0], hx.quantize(np.ones((512, 300), np.float32))
with hx.installed():
  portable = hxe.export(hx.matmul_q)(x2, qw2)
  with hx.keep_native_cpu_calls():
    kept = hxe.export(hx.matmul_q)(x2, qw2)
print_exported("export_default", portable.lo)
# CHECK-LABEL: TEST: export_default cpu
# CHECK-NOT: custom_call
# CHECK: stablehlo.composite "hx.matmul_q"
# CHECK-NOT: custom_call
print_exported("export_keep_native", kept.lo)
# CHECK-LABEL: TEST: export_keep_native cpu
# CHECK: stablehlo.composite "hx.matmul_q"
# CHECK: stablehlo.custom_call @hx_matmul_q_cpu_v1(

# The transformer layout f32[..., k] @ q8[k, n]: x's leading dims collapsed into the
# kernel's rows by a reshape, one call, the result reshaped back.
x3 = np.ones((2, 3, 512), np.float32)
with hx.installed():
  print_ir("matmul_q_cpu_native_nd", hx.matmul_q, x3, qw2)
# CHECK-LABEL: TEST: matmul_q_cpu_native_nd f32[2,3,512] q8[512,300]
# CHECK: func.func private @{{hx.matmul_q.impl[_0-9]*}}(%[[X:[a-z0-9]+]]: tensor<2x3x512xf32>, %[[Q:[a-z0-9]+]]: tensor<512x300xi8>, %[[S:[a-z0-9]+]]: tensor<512xf32>) -> tensor<2x3x300xf32>
# CHECK-NEXT: %[[X2:[0-9]+]] = stablehlo.reshape %[[X]] : (tensor<2x3x512xf32>) -> tensor<6x512xf32>
# CHECK-NEXT: %[[C:[0-9]+]] = stablehlo.custom_call @hx_matmul_q_cpu_v1(%[[X2]], %[[Q]], %[[S]])
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.reshape %[[C]] : (tensor<6x300xf32>) -> tensor<2x3x300xf32>
# CHECK-NEXT: return %[[Y]]
