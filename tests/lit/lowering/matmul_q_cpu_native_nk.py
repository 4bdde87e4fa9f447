# RUN: env HXMLIR_CPU_ISA=generic %python %s | filecheck %s
# The checkpoint layout [out, in] on CPU while installed: hx.einsum("...k,nk->...n", x, w)
# with W[n, k] quantized along k calls hx_matmul_q_cpu_v3 (lowering/matmul_q/cpu.py) for
# every format, its dtype (the values'), layout, group_size, scale_dtype and offset
# attributes naming the format (csrc/matmul_q_nk.h); x's leading dims go to the kernel
# as they are.
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
import hxmlir.export as hxe
from hxmlir.testing import print_exported, print_ir

w = np.linspace(-1, 1, 320 * 512, dtype=np.float32).reshape(320, 512)
x = np.ones((2, 3, 512), np.float32)


def f16(q):
  v, *rest = hx.qarray_parts(q)
  return hx.make_qarray(v, *(c.astype(jnp.float16) for c in rest))


u4o = f16(hx.quantize(w, jnp.uint4, group_size=32, method="minmax"))
with hx.installed():
  print_ir("matmul_q_cpu_v3_u4o_f16", lambda x, w: hx.einsum("bmk,nk->bmn", x, w), x, u4o)
# CHECK-LABEL: TEST: matmul_q_cpu_v3_u4o_f16 f32[2,3,512] u4o[320,512:g32,f16]
# CHECK: stablehlo.composite "hx.matmul_q" {{.*}}version = 4
# CHECK: func.func private @{{hx.matmul_q.impl[_0-9]*}}(%[[X:[a-z0-9]+]]: tensor<2x3x512xf32>, %[[Q:[a-z0-9]+]]: tensor<320x256xui8>, %[[S:[a-z0-9]+]]: tensor<320x16xf16>, %[[O:[a-z0-9]+]]: tensor<320x16xf16>) -> tensor<2x3x320xf32>
# CHECK-NEXT: %[[C:[0-9]+]] = stablehlo.custom_call @hx_matmul_q_cpu_v3(%[[X]], %[[Q]], %[[S]], %[[O]]) {{{.*}}mhlo.backend_config = {dtype = "uint4", group_size = 32 : i64, layout = "uint4_pairs_v1", offset = true, scale_dtype = "f16"}{{.*}}} : (tensor<2x3x512xf32>, tensor<320x256xui8>, tensor<320x16xf16>, tensor<320x16xf16>) -> tensor<2x3x320xf32>
# CHECK-NEXT: return %[[C]]

# Q8_0-like (f16 scales, no offset), int4 and fp8 per row (legacy formats, version 3).
with hx.installed():
  print_ir("matmul_q_cpu_v3_q8_f16", lambda x, w: hx.einsum("mk,nk->mn", x, w), x[0],
           f16(hx.quantize(w, jnp.int8, group_size=32)))
  print_ir("matmul_q_cpu_v3_q4", lambda x, w: hx.einsum("mk,nk->mn", x, w), x[0],
           hx.quantize(w, jnp.int4))
  print_ir("matmul_q_cpu_v3_f8", lambda x, w: hx.einsum("mk,nk->mn", x, w), x[0],
           hx.quantize(w, jnp.float8_e4m3fn, group_size=64))
# CHECK-LABEL: TEST: matmul_q_cpu_v3_q8_f16 f32[3,512] q8[320,512:g32,f16]
# CHECK: stablehlo.custom_call @hx_matmul_q_cpu_v3(%{{[a-z0-9]+}}, %{{[a-z0-9]+}}, %{{[a-z0-9]+}}) {{{.*}}dtype = "int8", group_size = 32 : i64, layout = "plain", offset = false, scale_dtype = "f16"{{.*}}} : (tensor<3x512xf32>, tensor<320x512xi8>, tensor<320x16xf16>) -> tensor<3x320xf32>
# CHECK-LABEL: TEST: matmul_q_cpu_v3_q4 f32[3,512] q4[320,512]
# CHECK: stablehlo.composite "hx.matmul_q" {{.*}}version = 3
# CHECK: stablehlo.custom_call @hx_matmul_q_cpu_v3({{.*}}dtype = "int4", group_size = 0 : i64, layout = "int4_pairs_v1", offset = false, scale_dtype = "f32"{{.*}} : (tensor<3x512xf32>, tensor<320x256xui8>, tensor<320xf32>) -> tensor<3x320xf32>
# CHECK-LABEL: TEST: matmul_q_cpu_v3_f8 f32[3,512] f8[320,512:g64]
# CHECK: stablehlo.custom_call @hx_matmul_q_cpu_v3({{.*}}dtype = "float8_e4m3fn", group_size = 64 : i64, layout = "plain", offset = false, scale_dtype = "f32"

# Without install: the blocked StableHLO loop, no custom call.
print_ir("matmul_q_cpu_v3_not_installed", lambda x, w: hx.einsum("bmk,nk->bmn", x, w), x, u4o)
# CHECK-LABEL: TEST: matmul_q_cpu_v3_not_installed
# CHECK-NOT: custom_call
# CHECK: stablehlo.while

# Exported while installed: portable unless hx.keep_native_cpu_calls(), which names v3.
with hx.installed():
  g = lambda x, w: hx.einsum("bmk,nk->bmn", x, w)  # noqa: E731
  portable = hxe.export(g)(x, u4o)
  with hx.keep_native_cpu_calls():
    kept = hxe.export(g)(x, u4o)
print_exported("export_v3_default", portable.lo)
# CHECK-LABEL: TEST: export_v3_default cpu
# CHECK-NOT: custom_call
# CHECK: stablehlo.composite "hx.matmul_q"
# CHECK-NOT: custom_call
print_exported("export_v3_keep_native", kept.lo)
# CHECK-LABEL: TEST: export_v3_keep_native cpu
# CHECK: stablehlo.composite "hx.matmul_q"
# CHECK: stablehlo.custom_call @hx_matmul_q_cpu_v3(
