# RUN: %python %s | filecheck %s
# hx.matmul_q on CPU: the composite is unchanged, its decomposition streams the
# int8 weight through a stablehlo.while (lowering/matmul_q/streaming.py).
import numpy as np

import hxmlir as hx
from hxmlir.lowering.matmul_q import streaming
from hxmlir.testing import print_ir

# Small shapes keep this file readable: N-block weights above 64K elements
# (by default weights of up to 1M elements are converted whole when m > 32).
streaming.N_BLOCKING_MIN_WEIGHT = 64 * 1024

# m = 1 with a batch dim: rank-1 updates of the accumulator, four rows of q per
# step (k = 601: 150 steps, then the one row left with static slices), each
# written elementwise from its own int8 row so XLA fuses a step into one loop.
x = np.ones((2, 1, 601), np.float32)
qw = hx.quantize(np.ones((2, 601, 300), np.float32))
print_ir("matmul_q_cpu_rows", hx.matmul_q, x, qw)
# CHECK-LABEL: TEST: matmul_q_cpu_rows f32[2,1,601] q8[2,601,300]
# CHECK: func.func private @[[IMPL:hx.matmul_q.impl]](%[[X:[a-z0-9]+]]: tensor<2x1x601xf32>, %[[Q:[a-z0-9]+]]: tensor<2x601x300xi8>, %[[S:[a-z0-9]+]]: tensor<2x601xf32>) -> tensor<2x1x300xf32>
# CHECK-NEXT: %[[SB:[0-9]+]] = stablehlo.broadcast_in_dim %[[S]], dims = [0, 2] : (tensor<2x601xf32>) -> tensor<2x1x601xf32>
# CHECK-NEXT: %[[XS:[0-9]+]] = stablehlo.multiply %[[X]], %[[SB]] : tensor<2x1x601xf32>
# CHECK: %[[ACC0:[0-9]+]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<2x1x300xf32>
# CHECK: %[[W:[0-9]+]]:4 = stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %{{.*}}, %[[ACC:[a-zA-Z0-9_]+]] = %[[ACC0]], %[[LX:[a-zA-Z0-9_]+]] = %[[XS]], %[[LQ:[a-zA-Z0-9_]+]] = %[[Q]])
# CHECK: stablehlo.constant dense<150> : tensor<i32>
# CHECK: stablehlo.compare LT, %[[I]]
# CHECK: } do {
# CHECK: %[[R0:[0-9]+]] = stablehlo.multiply %[[I]], %{{.*}} : tensor<i32>
# CHECK: %[[XC0:[0-9]+]] = stablehlo.dynamic_slice %[[LX]], %{{.*}}, %{{.*}}, %[[R0]], sizes = [2, 1, 1]
# CHECK: %[[QR0:[0-9]+]] = stablehlo.dynamic_slice %[[LQ]], %{{.*}}, %[[R0]], %{{.*}}, sizes = [2, 1, 300] : (tensor<2x601x300xi8>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x1x300xi8>
# CHECK-NEXT: %[[XB0:[0-9]+]] = stablehlo.broadcast_in_dim %[[XC0]], dims = [0, 1, 2] : (tensor<2x1x1xf32>) -> tensor<2x1x300xf32>
# CHECK-NEXT: %[[QF0:[0-9]+]] = stablehlo.convert %[[QR0]] : (tensor<2x1x300xi8>) -> tensor<2x1x300xf32>
# CHECK-NEXT: %[[P0:[0-9]+]] = stablehlo.multiply %[[XB0]], %[[QF0]] : tensor<2x1x300xf32>
# CHECK-NEXT: %[[A0:[0-9]+]] = stablehlo.add %[[ACC]], %[[P0]] : tensor<2x1x300xf32>
# Rows 1..3 of the step, each from its own int8 row at offset R0 + j.
# CHECK: %[[R1:[0-9]+]] = stablehlo.add %[[R0]], %{{.*}} : tensor<i32>
# CHECK: stablehlo.dynamic_slice %[[LQ]], %{{.*}}, %[[R1]], %{{.*}}, sizes = [2, 1, 300]
# CHECK: %[[A1:[0-9]+]] = stablehlo.add %[[A0]], %{{.*}} : tensor<2x1x300xf32>
# CHECK: %[[R2:[0-9]+]] = stablehlo.add %[[R0]], %{{.*}} : tensor<i32>
# CHECK: stablehlo.dynamic_slice %[[LQ]], %{{.*}}, %[[R2]], %{{.*}}, sizes = [2, 1, 300]
# CHECK: %[[A2:[0-9]+]] = stablehlo.add %[[A1]], %{{.*}} : tensor<2x1x300xf32>
# CHECK: %[[R3:[0-9]+]] = stablehlo.add %[[R0]], %{{.*}} : tensor<i32>
# CHECK: stablehlo.dynamic_slice %[[LQ]], %{{.*}}, %[[R3]], %{{.*}}, sizes = [2, 1, 300]
# CHECK: %[[A3:[0-9]+]] = stablehlo.add %[[A2]], %{{.*}} : tensor<2x1x300xf32>
# CHECK-NOT: stablehlo.dynamic_slice
# CHECK: stablehlo.return %{{.*}}, %[[A3]], %[[LX]], %[[LQ]]
# The row left, k = 600, with static slices; no dot anywhere.
# CHECK: %[[XL:[0-9]+]] = stablehlo.slice %[[XS]] [0:2, 0:1, 600:601]
# CHECK-NEXT: %[[QL:[0-9]+]] = stablehlo.slice %[[Q]] [0:2, 600:601, 0:300]
# CHECK: %[[PL:[0-9]+]] = stablehlo.multiply
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.add %[[W]]#1, %[[PL]] : tensor<2x1x300xf32>
# CHECK-NOT: stablehlo.dot_general
# CHECK: return %[[Y]] : tensor<2x1x300xf32>

# m = 5, k = 600: K-streaming, 18 blocks of 32 rows (600 // 16 rounded down to
# a multiple of 8) in a loop, then one static remainder step of 24 rows.
x = np.ones((5, 600), np.float32)
qw = hx.quantize(np.ones((600, 300), np.float32))
print_ir("matmul_q_cpu_k", hx.matmul_q, x, qw)
# CHECK-LABEL: TEST: matmul_q_cpu_k f32[5,600] q8[600,300]
# CHECK: stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:hx.matmul_q.impl]], version = 3 : i32}
# CHECK: func.func private @[[IMPL]](%[[X:[a-z0-9]+]]: tensor<5x600xf32>, %[[Q:[a-z0-9]+]]: tensor<600x300xi8>, %[[S:[a-z0-9]+]]: tensor<600xf32>) -> tensor<5x300xf32>
# The scale folds into x once, before the loop.
# CHECK-NEXT: %[[SB:[0-9]+]] = stablehlo.broadcast_in_dim %[[S]], dims = [1] : (tensor<600xf32>) -> tensor<5x600xf32>
# CHECK-NEXT: %[[XS:[0-9]+]] = stablehlo.multiply %[[X]], %[[SB]] : tensor<5x600xf32>
# CHECK: %[[ACC0:[0-9]+]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<5x300xf32>
# CHECK: %[[W:[0-9]+]]:4 = stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %{{.*}}, %[[ACC:[a-zA-Z0-9_]+]] = %[[ACC0]], %[[LX:[a-zA-Z0-9_]+]] = %[[XS]], %[[LQ:[a-zA-Z0-9_]+]] = %[[Q]])
# CHECK: stablehlo.constant dense<18> : tensor<i32>
# CHECK: stablehlo.compare LT, %[[I]]
# CHECK: } do {
# CHECK: %[[OFF:[0-9]+]] = stablehlo.multiply %[[I]], %{{.*}} : tensor<i32>
# Only a 32-row block of the weight is ever converted to f32.
# CHECK: %[[QB:[0-9]+]] = stablehlo.dynamic_slice %[[LQ]], %[[OFF]], %{{.*}}, sizes = [32, 300] : (tensor<600x300xi8>, tensor<i32>, tensor<i32>) -> tensor<32x300xi8>
# CHECK-NEXT: %[[QF:[0-9]+]] = stablehlo.convert %[[QB]] : (tensor<32x300xi8>) -> tensor<32x300xf32>
# CHECK: %[[XB:[0-9]+]] = stablehlo.dynamic_slice %[[LX]], %{{.*}}, %[[OFF]], sizes = [5, 32]
# CHECK-NEXT: %[[D:[0-9]+]] = stablehlo.dot_general %[[XB]], %[[QF]], contracting_dims = [1] x [0] : (tensor<5x32xf32>, tensor<32x300xf32>) -> tensor<5x300xf32>
# CHECK-NEXT: %[[NEW:[0-9]+]] = stablehlo.add %[[ACC]], %[[D]] : tensor<5x300xf32>
# CHECK: stablehlo.return %{{.*}}, %[[NEW]], %[[LX]], %[[LQ]]
# The remainder: rows 576..600, static slices.
# CHECK: %[[XR:[0-9]+]] = stablehlo.slice %[[XS]] [0:5, 576:600]
# CHECK-NEXT: %[[QR:[0-9]+]] = stablehlo.slice %[[Q]] [576:600, 0:300]
# CHECK-NEXT: %[[QRF:[0-9]+]] = stablehlo.convert %[[QR]] : (tensor<24x300xi8>) -> tensor<24x300xf32>
# CHECK-NEXT: %[[DR:[0-9]+]] = stablehlo.dot_general %[[XR]], %[[QRF]]
# CHECK-NEXT: %[[Y:[0-9]+]] = stablehlo.add %[[W]]#1, %[[DR]] : tensor<5x300xf32>
# CHECK-NEXT: return %[[Y]] : tensor<5x300xf32>

# m = 40 > 32 with a batch dim: N-blocking, 18 blocks of 32 columns written
# with dynamic_update_slice, then a static remainder of 24 columns.
x = np.ones((2, 40, 300), np.float32)
qw = hx.quantize(np.ones((2, 300, 600), np.float32))
print_ir("matmul_q_cpu_n", hx.matmul_q, x, qw)
# CHECK-LABEL: TEST: matmul_q_cpu_n f32[2,40,300] q8[2,300,600]
# CHECK: func.func private @[[IMPL:hx.matmul_q.impl]](%[[X:[a-z0-9]+]]: tensor<2x40x300xf32>, %[[Q:[a-z0-9]+]]: tensor<2x300x600xi8>, %[[S:[a-z0-9]+]]: tensor<2x300xf32>) -> tensor<2x40x600xf32>
# CHECK-NEXT: %[[SB:[0-9]+]] = stablehlo.broadcast_in_dim %[[S]], dims = [0, 2] : (tensor<2x300xf32>) -> tensor<2x40x300xf32>
# CHECK-NEXT: %[[XS:[0-9]+]] = stablehlo.multiply %[[X]], %[[SB]]
# CHECK: %[[W:[0-9]+]]:4 = stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %{{.*}}, %[[OUT:[a-zA-Z0-9_]+]] = %{{.*}}, %[[LX:[a-zA-Z0-9_]+]] = %[[XS]], %[[LQ:[a-zA-Z0-9_]+]] = %[[Q]])
# CHECK: } do {
# CHECK: %[[OFF:[0-9]+]] = stablehlo.multiply %[[I]]
# CHECK: %[[QB:[0-9]+]] = stablehlo.dynamic_slice %[[LQ]], %{{.*}}, %{{.*}}, %[[OFF]], sizes = [2, 300, 32]
# CHECK-NEXT: %[[QF:[0-9]+]] = stablehlo.convert %[[QB]] : (tensor<2x300x32xi8>) -> tensor<2x300x32xf32>
# CHECK: %[[D:[0-9]+]] = stablehlo.dot_general %[[LX]], %[[QF]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x40x300xf32>, tensor<2x300x32xf32>) -> tensor<2x40x32xf32>
# CHECK-NEXT: %[[NEW:[0-9]+]] = stablehlo.dynamic_update_slice %[[OUT]], %[[D]], %{{.*}}, %{{.*}}, %[[OFF]]
# CHECK: stablehlo.return %{{.*}}, %[[NEW]], %[[LX]], %[[LQ]]
# CHECK: %[[QR:[0-9]+]] = stablehlo.slice %[[Q]] [0:2, 0:300, 576:600]
# CHECK-NEXT: %[[QRF:[0-9]+]] = stablehlo.convert %[[QR]]
# CHECK-NEXT: %[[DR:[0-9]+]] = stablehlo.dot_general %[[XS]], %[[QRF]]
# CHECK: %[[Y:[0-9]+]] = stablehlo.dynamic_update_slice %[[W]]#1, %[[DR]]
# CHECK-NEXT: return %[[Y]] : tensor<2x40x600xf32>

# Small weights keep the reference decomposition (the same text on every platform).
x = np.ones((2, 6), np.float32)
qw = hx.quantize(np.ones((6, 5), np.float32))
print_ir("matmul_q_cpu_small", hx.matmul_q, x, qw)
# CHECK-LABEL: TEST: matmul_q_cpu_small f32[2,6] q8[6,5]
# CHECK: func.func private @hx.matmul_q.impl
# CHECK-NOT: stablehlo.while
# CHECK: stablehlo.convert %{{.*}} : (tensor<6x5xi8>) -> tensor<6x5xf32>
# CHECK: stablehlo.dot_general

# A transformer layer f32[b, s, k] @ q8[k, n]: the leading dims collapse into m with a
# reshape inside the decomposition, then the streaming builder (here m = 8: K-streaming).
x = np.ones((2, 4, 600), np.float32)
qw = hx.quantize(np.ones((600, 300), np.float32))
print_ir("matmul_q_cpu_nd", hx.matmul_q, x, qw)
# CHECK-LABEL: TEST: matmul_q_cpu_nd f32[2,4,600] q8[600,300]
# CHECK: stablehlo.composite "hx.matmul_q" %{{.*}} {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 2>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], version = 3 : i32}
# CHECK: func.func private @[[IMPL]](%[[X:[a-z0-9]+]]: tensor<2x4x600xf32>
# CHECK-NEXT: %[[X2:[0-9]+]] = stablehlo.reshape %[[X]] : (tensor<2x4x600xf32>) -> tensor<8x600xf32>
# CHECK: stablehlo.while
# CHECK: %[[Y:[0-9]+]] = stablehlo.reshape %{{.*}} : (tensor<8x300xf32>) -> tensor<2x4x300xf32>
# CHECK-NEXT: return %[[Y]] : tensor<2x4x300xf32>

# The [out, in] layout of a large weight: the CPU rule walks q's rows (the output
# columns) in blocks, scale on each block of the result; the weight is never converted whole.
x = np.ones((8, 300), np.float32)
qw = hx.quantize(np.ones((600, 300), np.float32))
print_ir("einsum_cpu_out_in", lambda x, q: hx.einsum("mk,nk->mn", x, q), x, qw)
# CHECK-LABEL: TEST: einsum_cpu_out_in f32[8,300] q8[600,300]
# CHECK: func.func private @hx.matmul_q.impl
# CHECK-NOT: tensor<600x300xf32>
# CHECK: stablehlo.while
# CHECK: stablehlo.dynamic_slice
# CHECK: stablehlo.dot_general
# CHECK: stablehlo.multiply
# CHECK: stablehlo.dynamic_update_slice
