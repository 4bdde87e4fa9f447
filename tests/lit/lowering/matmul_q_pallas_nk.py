# RUN: %python %s | filecheck %s
# hx.einsum("...k,nk->...n") of a weight in the checkpoint layout W[out, in] (GGUF's Q4_1:
# u4o g32 with f16 scales and offsets), exported for cuda and tpu while hxmlir is
# installed: on cuda the composite's decomposition calls the registered Pallas kernel
# hx_matmul_q_nk_v1 (lowering/matmul_q/pallas/) on x, the packed values, the f16 scales
# and the f16 offsets as stored; on tpu (not a format Mosaic compiles) and without install,
# the reference decomposition. Then the block formats' Mosaic kernel, called directly.
import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir.lowering.matmul_q import pallas as mqp
from hxmlir.testing import print_exported

x = np.ones((2, 3, 96), np.float32)
q = hx.quantize(np.ones((40, 96), np.float32), jnp.uint4, group_size=32, method="minmax")
v, s, o = hx.qarray_parts(q)
w = hx.make_qarray(v, s.astype(jnp.float16), o.astype(jnp.float16))


def einsum(x, w):
  return hx.einsum("bsk,nk->bsn", x, w)


with hx.installed():
  print_exported("matmul_q_nk_cuda", jax.export.export(jax.jit(einsum), platforms=["cuda"])(x, w))
  # TPU: Q4_1's int4 pairs are not a format Mosaic compiles: the reference decomposition
  print_exported("matmul_q_nk_tpu", jax.export.export(jax.jit(einsum), platforms=["tpu"])(x, w))

# The block formats' Mosaic kernel, called directly (GGUF's Q4_K: one block of 256 per row,
# 70 words of values, f16 d and dmin), lowered for tpu.
rs = np.random.RandomState(0)
heads = (rs.randn(40, 1) * 0.02).astype(np.float16)
parts = (rs.randint(0, 65536, (40, 1, 70)).astype(np.uint16), heads, heads)
print_exported("matmul_q_nk_blocks_tpu", jax.export.export(
    jax.jit(lambda x, *c: mqp.matmul_q_nk_pallas(x, *c, backend="mosaic_tpu")),
    platforms=["tpu"])(np.ones((6, 256), np.float32), *parts))
# ... and its Triton kernel, lowered for cuda (exported while installed: hxmlir registers the kernel)
with hx.installed():
  print_exported("matmul_q_nk_blocks_cuda", jax.export.export(
      jax.jit(lambda x, *c: mqp.matmul_q_nk_pallas(x, *c, backend="triton")),
      platforms=["cuda"])(np.ones((6, 256), np.float32), *parts))
# CHECK-LABEL: TEST: matmul_q_nk_cuda cuda
# CHECK: stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2, %arg3 {composite_attributes = {dtype = "uint4_f16", group_size = 32 : i64, layout = "uint4_pairs_v1", lhs_batching_dimensions = dense<> : tensor<0xi64>, lhs_contracting_dimensions = dense<2> : tensor<1xi64>, offset = true, rhs_batching_dimensions = dense<> : tensor<0xi64>, rhs_contracting_dimensions = dense<1> : tensor<1xi64>, scale_dtype = "f16"}, decomposition = @[[IMPL:hx.matmul_q.impl]], version = 4 : i32} : (tensor<2x3x96xf32>, tensor<40x48xui8>, tensor<40x3xf16>, tensor<40x3xf16>) -> tensor<2x3x40xf32>
# CHECK: func.func private @[[IMPL]](%[[X:[a-z0-9]+]]: tensor<2x3x96xf32>, %[[Q:[a-z0-9]+]]: tensor<40x48xui8>, %[[S:[a-z0-9]+]]: tensor<40x3xf16>, %[[O:[a-z0-9]+]]: tensor<40x3xf16>) -> tensor<2x3x40xf32>
# x's leading dims become rows, padded to whole blocks (16 rows for tl.dot, k to 128);
# the packed values, f16 scales and f16 offsets go as stored (a reshape is a bitcast).
# CHECK-DAG: %[[X2:[0-9]+]] = stablehlo.reshape %[[X]] : (tensor<2x3x96xf32>) -> tensor<6x96xf32>
# CHECK-DAG: %[[Q3:[0-9]+]] = stablehlo.reshape %[[Q]] : (tensor<40x48xui8>) -> tensor<1x40x48xui8>
# CHECK-DAG: %[[S3:[0-9]+]] = stablehlo.reshape %[[S]] : (tensor<40x3xf16>) -> tensor<1x40x3xf16>
# CHECK-DAG: %[[O3:[0-9]+]] = stablehlo.reshape %[[O]] : (tensor<40x3xf16>) -> tensor<1x40x3xf16>
# CHECK-DAG: %[[XP:[0-9]+]] = stablehlo.pad %{{[0-9]+}}, {{.*}} -> tensor<1x16x128xf32>
# CHECK: %[[K:[0-9]+]] = stablehlo.custom_call @__gpu$xla.gpu.triton(%[[XP]], %[[Q3]], %[[S3]], %[[O3]]) {mhlo.backend_config = {{{.*}}name = "hx_matmul_q_nk_v1", num_stages = 3 : i32, num_warps = 4 : i32}{{.*}} : (tensor<1x16x128xf32>, tensor<1x40x48xui8>, tensor<1x40x3xf16>, tensor<1x40x3xf16>) -> tensor<1x16x128xf32>
# CHECK-NEXT: %[[YS:[0-9]+]] = stablehlo.slice %[[K]] [0:1, 0:6, 0:40]
# CHECK-NEXT: %[[Y2:[0-9]+]] = stablehlo.reshape %[[YS]] : (tensor<1x6x40xf32>) -> tensor<6x40xf32>
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.reshape %[[Y2]] : (tensor<6x40xf32>) -> tensor<2x3x40xf32>
# CHECK-NEXT: return %[[Y]]

# CHECK-LABEL: TEST: matmul_q_nk_tpu tpu
# CHECK: stablehlo.composite "hx.matmul_q" {{.*}}offset = true{{.*}}scale_dtype = "f16"}, decomposition = @[[IMPL:hx.matmul_q.impl]], version = 4 : i32}
# CHECK: func.func private @[[IMPL]](
# CHECK-NOT: custom_call
# CHECK: stablehlo.dot_general
# CHECK-NOT: custom_call

# CHECK-LABEL: TEST: matmul_q_nk_blocks_tpu tpu
# CHECK: func.func public @main(%[[X:[a-z0-9]+]]: tensor<6x256xf32>{{.*}}, %[[Q:[a-z0-9]+]]: tensor<40x1x70xui16>{{.*}}, %{{.*}}: tensor<40x1xf16>{{.*}}, %{{.*}}: tensor<40x1xf16>{{.*}})
# x is permuted into the words' order, one row of 70 words per bit plane (4 nibble planes),
# and summed per sub-block of 32 (8); the words go as stored (a reshape is a bitcast), d and
# dmin widened to f32; then the one-hot tables (block, sub-block, factor gathers).
# CHECK: %[[Q3:[0-9]+]] = stablehlo.reshape %[[Q]] : (tensor<40x1x70xui16>) -> tensor<1x40x70xui16>
# CHECK: stablehlo.custom_call @tpu_custom_call(%{{.*}}, %{{.*}}, %[[Q3]], %{{.*}}) {backend_config = {{.*}}kernel_name = "hx_matmul_q_nk_blocks_v1"{{.*}} : (tensor<1x4x8x70xf32>, tensor<1x8x8xf32>, tensor<1x40x70xui16>, tensor<1x40x1xf32>, tensor<1x40x1xf32>, tensor<1x70xf32>, tensor<1x8xf32>, tensor<4x8x70xbf16>, tensor<8x70x8xbf16>, tensor<12x8xi32>) -> tensor<1x8x40xf32>

# CHECK-LABEL: TEST: matmul_q_nk_blocks_cuda cuda
# CHECK: func.func public @main(%[[X:[a-z0-9]+]]: tensor<6x256xf32>{{.*}}, %[[Q:[a-z0-9]+]]: tensor<40x1x70xui16>{{.*}}, %{{.*}}: tensor<40x1xf16>{{.*}}, %{{.*}}: tensor<40x1xf16>{{.*}})
# x padded to 16 rows (Triton's dot), the words as stored, d and dmin widened to f32, then the
# gather table: 2 rows for Q4_K's one value field, 4 per factor piece (2 scale, 2 min pieces)
# CHECK: %[[Q3:[0-9]+]] = stablehlo.reshape %[[Q]] : (tensor<40x1x70xui16>) -> tensor<1x40x70xui16>
# CHECK: %[[K:[0-9]+]] = stablehlo.custom_call @__gpu$xla.gpu.triton(%{{.*}}, %[[Q3]], %{{.*}}, %{{.*}}, %{{.*}}) {mhlo.backend_config = {{{.*}}name = "hx_matmul_q_nk_blocks_v1", num_stages = 3 : i32, num_warps = 4 : i32}{{.*}} : (tensor<1x16x256xf32>, tensor<1x40x70xui16>, tensor<1x40x1xf32>, tensor<1x40x1xf32>, tensor<18x256xi32>) -> tensor<1x16x64xf32>
# CHECK-NEXT: stablehlo.slice %[[K]] [0:1, 0:6, 0:40]

print_exported("matmul_q_nk_not_installed",
               jax.export.export(jax.jit(einsum), platforms=["cuda"])(x, w))
# CHECK-LABEL: TEST: matmul_q_nk_not_installed cuda
# CHECK: func.func private @hx.matmul_q.impl
# CHECK-NOT: custom_call
# CHECK: stablehlo.dot_general
# CHECK-NOT: custom_call
