# RUN: env HXMLIR_CPU_ISA=generic %python %s | filecheck %s
# hx.attention (lowering/attention/): one stablehlo.composite "hx.attention" version 1 with
# the scale in composite_attributes; its decomposition is the reference (the scores masked
# by c <= start + t, softmax, the weighted sum over every position) without install, and a
# call of the native kernel hx_attention_cpu_v1 on CPU while installed (csrc/attention.h).
# Exports keep the reference unless hx.keep_native_cpu_calls().
import jax
import numpy as np

import hxmlir as hx
import hxmlir.export as hxe
from hxmlir.testing import print_exported, print_ir

q = np.ones((2, 3, 3, 64), np.float32)
k = np.ones((3, 16, 64), np.float32)
v = np.ones((3, 64, 16), np.float32)
start = np.int32(5)


def f(q, k, v, start):
  return hx.attention(q, k, v, start, scale=0.125)


print_ir("attention_not_installed", f, q, k, v, start)
# CHECK-LABEL: TEST: attention_not_installed f32[2,3,3,64] f32[3,16,64] f32[3,64,16] i32[]
# CHECK: %[[R:[0-9]+]] = stablehlo.composite "hx.attention" %arg0, %arg1, %arg2, %arg3 {composite_attributes = {scale = 1.250000e-01 : f32}, decomposition = @[[D:hx.attention.impl[_0-9]*]], version = 1 : i32} : (tensor<2x3x3x64xf32>, tensor<3x16x64xf32>, tensor<3x64x16xf32>, tensor<i32>) -> tensor<2x3x3x64xf32>
# CHECK: func.func private @[[D]](%[[Q:[a-z0-9]+]]: tensor<2x3x3x64xf32>, %[[K:[a-z0-9]+]]: tensor<3x16x64xf32>, %[[V:[a-z0-9]+]]: tensor<3x64x16xf32>, %[[S:[a-z0-9]+]]: tensor<i32>) -> tensor<2x3x3x64xf32>
# CHECK-NOT: custom_call
# CHECK: stablehlo.dot_general %[[K]], %[[Q]], batching_dims = [0] x [1], contracting_dims = [2] x [3]
# CHECK: %[[P:[0-9]+]] = stablehlo.broadcast_in_dim %[[S]], dims = []
# CHECK: stablehlo.compare LE
# CHECK: stablehlo.select
# v past the last query's bound read as 0
# CHECK: %[[VM:[0-9]+]] = stablehlo.select %{{[0-9]+}}, %[[V]], %{{[0-9]+}} : tensor<3x64x16xi1>, tensor<3x64x16xf32>
# CHECK: stablehlo.exponential
# CHECK: stablehlo.dot_general %[[VM]], %{{[0-9]+}}, batching_dims = [0] x [1], contracting_dims = [2] x [3]
# CHECK-NOT: custom_call

with hx.installed():
  print_ir("attention_cpu_installed", f, q, k, v, start)
# CHECK-LABEL: TEST: attention_cpu_installed
# CHECK: stablehlo.composite "hx.attention" {{.*}}composite_attributes = {scale = 1.250000e-01 : f32}{{.*}}version = 1 : i32
# CHECK: func.func private @{{hx.attention.impl[_0-9]*}}(%[[Q:[a-z0-9]+]]: tensor<2x3x3x64xf32>, %[[K:[a-z0-9]+]]: tensor<3x16x64xf32>, %[[V:[a-z0-9]+]]: tensor<3x64x16xf32>, %[[S:[a-z0-9]+]]: tensor<i32>) -> tensor<2x3x3x64xf32>
# CHECK-NEXT: %[[C:[0-9]+]] = stablehlo.custom_call @hx_attention_cpu_v1(%[[Q]], %[[K]], %[[V]], %[[S]]) {{{.*}}mhlo.backend_config = {scale = 1.250000e-01 : f32}{{.*}}} : (tensor<2x3x3x64xf32>, tensor<3x16x64xf32>, tensor<3x64x16xf32>, tensor<i32>) -> tensor<2x3x3x64xf32>
# CHECK-NEXT: return %[[C]]

with hx.installed():
  portable = hxe.export(f)(q, k, v, start)
  with hx.keep_native_cpu_calls():
    kept = hxe.export(f)(q, k, v, start)
print_exported("attention_export_default", portable.lo)
# CHECK-LABEL: TEST: attention_export_default cpu
# CHECK: stablehlo.composite "hx.attention"
# CHECK-NOT: custom_call
print_exported("attention_export_kept", kept.lo)
# CHECK-LABEL: TEST: attention_export_kept cpu
# CHECK: stablehlo.custom_call @hx_attention_cpu_v1


# version 2: a sliding window and a soft cap (Gemma's layers). The decomposition caps the
# scaled scores with tanh and masks c <= start + t - window as well; installed, the native
# kernel's version 2 target takes both as attributes.
def g(q, k, v, start):
  return hx.attention(q, k, v, start, scale=0.125, window=4, softcap=0.5)


print_ir("attention_window_softcap", g, q, k, v, start)
# CHECK-LABEL: TEST: attention_window_softcap f32[2,3,3,64] f32[3,16,64] f32[3,64,16] i32[]
# CHECK: stablehlo.composite "hx.attention" %arg0, %arg1, %arg2, %arg3 {composite_attributes = {scale = 1.250000e-01 : f32, softcap = 5.000000e-01 : f32, window = 4 : i64}, decomposition = @[[D:hx.attention.impl[_0-9]*]], version = 2 : i32}
# CHECK: func.func private @[[D]](
# CHECK-NOT: custom_call
# CHECK: stablehlo.tanh
# CHECK: stablehlo.compare LE
# CHECK: stablehlo.compare GT
# CHECK: stablehlo.and
# CHECK: stablehlo.exponential

with hx.installed():
  print_ir("attention_window_softcap_cpu_installed", g, q, k, v, start)
# CHECK-LABEL: TEST: attention_window_softcap_cpu_installed
# CHECK: stablehlo.composite "hx.attention" {{.*}}version = 2 : i32
# CHECK: stablehlo.custom_call @hx_attention_cpu_v2({{.*}}mhlo.backend_config = {scale = 1.250000e-01 : f32, softcap = 5.000000e-01 : f32, window = 4 : i64}


# version 3: jax.vmap of hx.attention, a batch of 4 each at its own start, over one cache
# shared by all (k and v stay unbatched). Not installed, the decomposition is the reference
# under vmap; installed, one call of hx_attention_cpu_v3 for the whole batch.
def h(qs, starts):
  return jax.vmap(lambda q, s: hx.attention(q, k, v, s, scale=0.125))(qs, starts)


qs = np.ones((4, 2, 3, 3, 64), np.float32)
starts = np.asarray([0, 3, 9, 14], np.int32)
print_ir("attention_vmap", h, qs, starts)
# CHECK-LABEL: TEST: attention_vmap f32[4,2,3,3,64] i32[4]
# CHECK: stablehlo.composite "hx.attention" %arg0, %{{[0-9a-z_]+}}, %{{[0-9a-z_]+}}, %arg1 {composite_attributes = {scale = 1.250000e-01 : f32, softcap = 0.000000e+00 : f32, window = 0 : i64}, decomposition = @[[D:hx.attention.impl[_0-9]*]], version = 3 : i32} : (tensor<4x2x3x3x64xf32>, tensor<3x16x64xf32>, tensor<3x64x16xf32>, tensor<4xi32>) -> tensor<4x2x3x3x64xf32>
# CHECK: func.func private @[[D]](
# CHECK-NOT: custom_call
# CHECK: stablehlo.dot_general

with hx.installed():
  print_ir("attention_vmap_cpu_installed", h, qs, starts)
# CHECK-LABEL: TEST: attention_vmap_cpu_installed
# CHECK: stablehlo.composite "hx.attention" {{.*}}version = 3 : i32
# CHECK: func.func private @{{hx.attention.impl[_0-9]*}}(%[[Q:[a-z0-9]+]]: tensor<4x2x3x3x64xf32>, %[[K:[a-z0-9]+]]: tensor<3x16x64xf32>, %[[V:[a-z0-9]+]]: tensor<3x64x16xf32>, %[[S:[a-z0-9]+]]: tensor<4xi32>) -> tensor<4x2x3x3x64xf32>
# CHECK-NEXT: %[[C:[0-9]+]] = stablehlo.custom_call @hx_attention_cpu_v3(%[[Q]], %[[K]], %[[V]], %[[S]]) {{{.*}}mhlo.backend_config = {scale = 1.250000e-01 : f32, softcap = 0.000000e+00 : f32, window = 0 : i64}{{.*}}} : (tensor<4x2x3x3x64xf32>, tensor<3x16x64xf32>, tensor<3x64x16xf32>, tensor<4xi32>) -> tensor<4x2x3x3x64xf32>
# CHECK-NEXT: return %[[C]]
# CHECK-NOT: dot_general
