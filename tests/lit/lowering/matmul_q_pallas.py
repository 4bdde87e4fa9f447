# RUN: %python %s | filecheck %s
# hx.matmul_q exported for cuda and tpu while hxmlir is installed: the composite's
# decomposition calls the registered Pallas kernel hx_matmul_q_v1
# (lowering/matmul_q/pallas/); without install, the reference decomposition.
import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir import export as hxe
from hxmlir.testing import print_exported

x = np.ones((3, 40), np.float32)
qw = hx.quantize(np.ones((40, 50), np.float32))
with hx.installed():
  for platform in ("cuda", "tpu"):
    print_exported(f"matmul_q_pallas_{platform}",
                   jax.export.export(jax.jit(hx.matmul_q), platforms=[platform])(x, qw))
# CHECK-LABEL: TEST: matmul_q_pallas_cuda cuda
# CHECK: %[[Y:[0-9]+]] = stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = dense<> : tensor<0xi64>, lhs_contracting_dimensions = dense<1> : tensor<1xi64>, rhs_batching_dimensions = dense<> : tensor<0xi64>, rhs_contracting_dimensions = dense<0> : tensor<1xi64>}, decomposition = @[[IMPL:hx.matmul_q.impl]], version = 3 : i32} : (tensor<3x40xf32>, tensor<40x50xi8>, tensor<40xf32>) -> tensor<3x50xf32>
# CHECK: func.func private @[[IMPL]](%[[X:[a-z0-9]+]]: tensor<3x40xf32>, %[[Q:[a-z0-9]+]]: tensor<40x50xi8>, %[[S:[a-z0-9]+]]: tensor<40xf32>) -> tensor<3x50xf32>
# The int8 weight goes to the kernel as it is (a reshape is a bitcast); x and s
# are zero-padded to whole blocks (16 rows for tl.dot, k to 128).
# CHECK-DAG: %[[X3:[0-9]+]] = stablehlo.reshape %[[X]] : (tensor<3x40xf32>) -> tensor<1x3x40xf32>
# CHECK-DAG: %[[Q3:[0-9]+]] = stablehlo.reshape %[[Q]] : (tensor<40x50xi8>) -> tensor<1x40x50xi8>
# CHECK-DAG: %[[S3:[0-9]+]] = stablehlo.reshape %[[S]] : (tensor<40xf32>) -> tensor<1x1x40xf32>
# CHECK-DAG: %[[XP:[0-9]+]] = stablehlo.pad %[[X3]], {{.*}} -> tensor<1x16x128xf32>
# CHECK-DAG: %[[SP:[0-9]+]] = stablehlo.pad %[[S3]], {{.*}} -> tensor<1x1x128xf32>
# CHECK: %[[K:[0-9]+]] = stablehlo.custom_call @__gpu$xla.gpu.triton(%[[XP]], %[[SP]], %[[Q3]]) {mhlo.backend_config = {{{.*}}name = "hx_matmul_q_v1", num_stages = 3 : i32, num_warps = 4 : i32}{{.*}} : (tensor<1x16x128xf32>, tensor<1x1x128xf32>, tensor<1x40x50xi8>) -> tensor<1x16x128xf32>
# CHECK-NEXT: %[[YS:[0-9]+]] = stablehlo.slice %[[K]] [0:1, 0:3, 0:50]
# CHECK-NEXT: %[[YR:[0-9]+]] = stablehlo.reshape %[[YS]] : (tensor<1x3x50xf32>) -> tensor<3x50xf32>
# CHECK-NEXT: return %[[YR]]

# CHECK-LABEL: TEST: matmul_q_pallas_tpu tpu
# CHECK: stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = dense<> : tensor<0xi64>, lhs_contracting_dimensions = dense<1> : tensor<1xi64>, rhs_batching_dimensions = dense<> : tensor<0xi64>, rhs_contracting_dimensions = dense<0> : tensor<1xi64>}, decomposition = @[[IMPL:hx.matmul_q.impl]], version = 3 : i32}
# CHECK: func.func private @[[IMPL]](
# Mosaic: 8-row blocks.
# CHECK: stablehlo.custom_call @tpu_custom_call(%{{.*}}, %{{.*}}, %{{.*}}) {backend_config = {{.*}}kernel_name = "hx_matmul_q_v1"{{.*}} : (tensor<1x8x128xf32>, tensor<1x1x128xf32>, tensor<1x40x50xi8>) -> tensor<1x8x128xf32>

print_exported("matmul_q_not_installed",
               jax.export.export(jax.jit(hx.matmul_q), platforms=["cuda"])(x, qw))
# CHECK-LABEL: TEST: matmul_q_not_installed cuda
# CHECK: func.func private @hx.matmul_q.impl
# CHECK-NOT: custom_call
# CHECK: stablehlo.dot_general
# CHECK-NOT: custom_call

# Every other format uses the kernel too on GPU, under the name hx_matmul_q_v2:
# int4 pairs (ui8, half the columns), fp8, and group scales f32[k, n/g] passed whole
# (not padded: the kernel masks or selects rows past k). On TPU the formats Mosaic compiles
# (mosaic_compiles: int8 and fp8 per row).
xs = np.ones((3, 64), np.float32)
w = np.ones((64, 256), np.float32)
with hx.installed():
  for label, qf in (("q4", hx.quantize(w, jnp.int4)),
                    ("f8", hx.quantize(w, jnp.float8_e4m3fn)),
                    ("q4_g32", hx.quantize(w, jnp.int4, group_size=32))):
    print_exported(f"matmul_q_pallas_{label}",
                   hxe.export(hx.matmul_q, platforms=["cuda", "tpu"])(xs, qf))
# Each platform branch has its composite; the decompositions follow.
# CHECK-LABEL: TEST: matmul_q_pallas_q4 cuda,tpu
# CHECK: stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "int4", group_size = 0 : i64, layout = "int4_pairs_v1", {{.*}}}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], version = 3 : i32} : (tensor<3x64xf32>, tensor<64x128xui8>, tensor<64xf32>) -> tensor<3x256xf32>
# CHECK: stablehlo.composite "hx.matmul_q" {{.*}}layout = "int4_pairs_v1"{{.*}}decomposition = @[[TIMPL:hx.matmul_q.impl[_0-9]*]]
# CHECK: func.func private @[[IMPL]](
# The packed weight goes to the kernel as it is; x and the per-row scales are padded.
# CHECK: stablehlo.custom_call @__gpu$xla.gpu.triton({{.*}}) {mhlo.backend_config = {{{.*}}name = "hx_matmul_q_v2"{{.*}} : (tensor<1x16x128xf32>, tensor<1x1x128xf32>, tensor<1x64x128xui8>) -> tensor<1x16x256xf32>
# TPU: Mosaic does not compile the int4 interleave (seen on a TPU v5e): the decomposition.
# CHECK: func.func private @[[TIMPL]](
# CHECK-NOT: custom_call
# CHECK: stablehlo.dot_general
# CHECK-NOT: custom_call

# CHECK-LABEL: TEST: matmul_q_pallas_f8 cuda,tpu
# CHECK: stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "float8_e4m3fn", group_size = 0 : i64, layout = "plain", {{.*}}} : (tensor<3x64xf32>, tensor<64x256xf8E4M3FN>, tensor<64xf32>) -> tensor<3x256xf32>
# CHECK: stablehlo.custom_call @__gpu$xla.gpu.triton({{.*}}name = "hx_matmul_q_v2"{{.*}} : (tensor<1x16x128xf32>, tensor<1x1x128xf32>, tensor<1x64x256xf8E4M3FN>) -> tensor<1x16x256xf32>
# CHECK: stablehlo.custom_call @tpu_custom_call({{.*}}kernel_name = "hx_matmul_q_v2"{{.*}} : (tensor<1x8x128xf32>, tensor<1x1x128xf32>, tensor<1x64x256xf8E4M3FN>) -> tensor<1x8x256xf32>

# CHECK-LABEL: TEST: matmul_q_pallas_q4_g32 cuda,tpu
# CHECK: stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1", {{.*}}} : (tensor<3x64xf32>, tensor<64x128xui8>, tensor<64x8xf32>) -> tensor<3x256xf32>
# CHECK: func.func private @{{.*}}(%{{.*}}: tensor<3x64xf32>, %{{.*}}: tensor<64x128xui8>, %[[GS:[a-z0-9]+]]: tensor<64x8xf32>)
# The group scales go to the kernel as they are (a reshape is a bitcast), never padded.
# CHECK: %[[GS3:[0-9]+]] = stablehlo.reshape %[[GS]] : (tensor<64x8xf32>) -> tensor<1x64x8xf32>
# CHECK: stablehlo.custom_call @__gpu$xla.gpu.triton(%{{.*}}, %[[GS3]], %{{.*}}) {{.*}}name = "hx_matmul_q_v2"{{.*}} : (tensor<1x16x128xf32>, tensor<1x64x8xf32>, tensor<1x64x128xui8>) -> tensor<1x16x256xf32>
# TPU: group scales take the decomposition (Mosaic refuses their lane slice at a traced offset).
# CHECK-NOT: tpu_custom_call
