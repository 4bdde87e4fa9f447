# RUN: env HXMLIR_CPU_ISA=generic %python %s | filecheck %s
# hx.matmul_q on CPU while installed, for the formats other than int8 per row: the
# decomposition calls hx_matmul_q_cpu_v2 (lowering/matmul_q/cpu.py), whose dtype,
# layout and group_size attributes name the format (csrc/matmul_q_formats.h).
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
import hxmlir.export as hxe
from hxmlir.testing import print_exported, print_ir

w = np.linspace(-1, 1, 512 * 256, dtype=np.float32).reshape(512, 256)
x = np.ones((2, 3, 512), np.float32)
q4 = hx.quantize(w, jnp.int4, group_size=32)
with hx.installed():
  print_ir("matmul_q_cpu_v2_int4_g32", hx.matmul_q, x, q4)
# CHECK-LABEL: TEST: matmul_q_cpu_v2_int4_g32 f32[2,3,512] q4[512,256:g32]
# CHECK: func.func private @{{hx.matmul_q.impl[_0-9]*}}(%[[X:[a-z0-9]+]]: tensor<2x3x512xf32>, %[[Q:[a-z0-9]+]]: tensor<512x128xui8>, %[[S:[a-z0-9]+]]: tensor<512x8xf32>) -> tensor<2x3x256xf32>
# CHECK-NEXT: %[[X2:[0-9]+]] = stablehlo.reshape %[[X]] : (tensor<2x3x512xf32>) -> tensor<6x512xf32>
# CHECK-NEXT: %[[C:[0-9]+]] = stablehlo.custom_call @hx_matmul_q_cpu_v2(%[[X2]], %[[Q]], %[[S]]) {{{.*}}mhlo.backend_config = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1"}{{.*}}} : (tensor<6x512xf32>, tensor<512x128xui8>, tensor<512x8xf32>) -> tensor<6x256xf32>
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.reshape %[[C]] : (tensor<6x256xf32>) -> tensor<2x3x256xf32>
# CHECK-NEXT: return %[[Y]]

# float8 per row, version 1's batched layout: one call, group_size 0.
xb = np.ones((2, 3, 512), np.float32)
f8 = hx.quantize(np.stack([w, -w]), jnp.float8_e4m3fn)
with hx.installed():
  print_ir("matmul_q_cpu_v2_fp8", hx.matmul_q, xb, f8)
# CHECK-LABEL: TEST: matmul_q_cpu_v2_fp8 f32[2,3,512] f8[2,512,256]
# CHECK: stablehlo.custom_call @hx_matmul_q_cpu_v2(%{{.*}}, %{{.*}}, %{{.*}}) {{{.*}}mhlo.backend_config = {dtype = "float8_e4m3fn", group_size = 0 : i64, layout = "plain"}{{.*}}} : (tensor<2x3x512xf32>, tensor<2x512x256xf8E4M3FN>, tensor<2x512xf32>) -> tensor<2x3x256xf32>

# int8 with groups goes to v2 too; int8 per row stays on v1.
with hx.installed():
  print_ir("matmul_q_cpu_v2_int8_g64", hx.matmul_q, x, hx.quantize(w, group_size=64))
  print_ir("matmul_q_cpu_v1_int8", hx.matmul_q, x, hx.quantize(w))
# CHECK-LABEL: TEST: matmul_q_cpu_v2_int8_g64
# CHECK: stablehlo.custom_call @hx_matmul_q_cpu_v2({{.*}}dtype = "int8", group_size = 64 : i64, layout = "plain"
# CHECK-LABEL: TEST: matmul_q_cpu_v1_int8
# CHECK-NOT: hx_matmul_q_cpu_v2
# CHECK: stablehlo.custom_call @hx_matmul_q_cpu_v1(

# Without install: the blocked StableHLO loop, no custom call.
print_ir("matmul_q_cpu_v2_not_installed", hx.matmul_q, x, q4)
# CHECK-LABEL: TEST: matmul_q_cpu_v2_not_installed
# CHECK-NOT: custom_call
# CHECK: stablehlo.while

# Exported while installed: portable unless hx.keep_native_cpu_calls(), which names v2.
with hx.installed():
  portable = hxe.export(hx.matmul_q)(x, q4)
  with hx.keep_native_cpu_calls():
    kept = hxe.export(hx.matmul_q)(x, q4)
print_exported("export_v2_default", portable.lo)
# CHECK-LABEL: TEST: export_v2_default cpu
# CHECK-NOT: custom_call
# CHECK: stablehlo.composite "hx.matmul_q"
# CHECK-NOT: custom_call
print_exported("export_v2_keep_native", kept.lo)
# CHECK-LABEL: TEST: export_v2_keep_native cpu
# CHECK: stablehlo.composite "hx.matmul_q"
# CHECK: stablehlo.custom_call @hx_matmul_q_cpu_v2(
