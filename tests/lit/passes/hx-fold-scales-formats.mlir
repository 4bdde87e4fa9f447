// RUN: hxmlir-opt %s -p hx-fold-scales --split-input-file | filecheck %s
// Idempotent: a second run changes nothing.
// RUN: hxmlir-opt %s -p hx-fold-scales --split-input-file | hxmlir-opt -p hx-fold-scales --split-input-file | filecheck %s
// Without matmul_q formation, dequantizations of other formats than int8 per row are
// left alone (their scales never fold open-coded).
// RUN: hxmlir-opt %s -p "hx-fold-scales{form-matmul-q=false}" --split-input-file | filecheck %s --check-prefix=NOMQ
//
// hx-fold-scales on the MLIR module: x @ dequantize(q, s) of every format (int4 pairs,
// fp8 values, group scales) becomes the hx.matmul_q v3 of the dot's own dimension
// numbers, with the dequantize's format attributes and the reference decomposition
// (lowering/reference.py: groups split off the quantized axis, scales into x, the
// result or each group's partial sum, never into the weight). Anything that is not
// exactly such an hx.matmul_q is left alone, never folded as if it were int8 per row.

// [in, out] layout, int4 pairs, groups along the free (quantized) axis: the group
// scales go into x, the groups a batch dim of the scaled x.
// CHECK-LABEL: func.func @q4_grouped_in_out
// CHECK-SAME: (%[[X:.*]]: tensor<4x64xf32>, %[[Q:.*]]: tensor<64x8xui8>, %[[S:.*]]: tensor<64x1xf32>)
// CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]], %[[S]] {composite_attributes = {dtype = "int4", group_size = 16 : i64, layout = "int4_pairs_v1", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], version = 3 : i32} : (tensor<4x64xf32>, tensor<64x8xui8>, tensor<64x1xf32>) -> tensor<4x16xf32>
// CHECK-NEXT: return %[[Y]]
// CHECK-NOT: @deq
// CHECK: func.func private @[[IMPL]](%[[A:.*]]: tensor<4x64xf32>, %[[B:.*]]: tensor<64x8xui8>, %[[C:.*]]: tensor<64x1xf32>) -> tensor<4x16xf32>
// The pairs unpacked as formats.unpack_int4: low nibble first, sign-extended.
// CHECK-NEXT: %[[BI:.*]] = stablehlo.convert %[[B]] : (tensor<64x8xui8>) -> tensor<64x8xi8>
// CHECK-NEXT: %[[FOUR:.*]] = stablehlo.constant dense<4> : tensor<64x8xi8>
// CHECK-NEXT: %[[SL:.*]] = stablehlo.shift_left %[[BI]], %[[FOUR]]
// CHECK-NEXT: %[[LO:.*]] = stablehlo.shift_right_arithmetic %[[SL]], %[[FOUR]]
// CHECK-NEXT: %[[HI:.*]] = stablehlo.shift_right_arithmetic %[[BI]], %[[FOUR]]
// CHECK-NEXT: %[[LO1:.*]] = stablehlo.reshape %[[LO]] : (tensor<64x8xi8>) -> tensor<64x8x1xi8>
// CHECK-NEXT: %[[HI1:.*]] = stablehlo.reshape %[[HI]] : (tensor<64x8xi8>) -> tensor<64x8x1xi8>
// CHECK-NEXT: %[[P:.*]] = stablehlo.concatenate %[[LO1]], %[[HI1]], dim = 2
// CHECK-NEXT: %[[V:.*]] = stablehlo.reshape %[[P]] : (tensor<64x8x2xi8>) -> tensor<64x16xi8>
// CHECK-NEXT: %[[VF:.*]] = stablehlo.convert %[[V]] : (tensor<64x16xi8>) -> tensor<64x16xf32>
// CHECK-NEXT: %[[VG:.*]] = stablehlo.reshape %[[VF]] : (tensor<64x16xf32>) -> tensor<64x1x16xf32>
// CHECK-NEXT: %[[XB:.*]] = stablehlo.broadcast_in_dim %[[A]], dims = [0, 1] : (tensor<4x64xf32>) -> tensor<4x64x1xf32>
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[C]], dims = [1, 2] : (tensor<64x1xf32>) -> tensor<4x64x1xf32>
// CHECK-NEXT: %[[XS:.*]] = stablehlo.multiply %[[XB]], %[[SB]] : tensor<4x64x1xf32>
// CHECK-NEXT: %[[D:.*]] = stablehlo.dot_general %[[XS]], %[[VG]], batching_dims = [2] x [1], contracting_dims = [1] x [0] : (tensor<4x64x1xf32>, tensor<64x1x16xf32>) -> tensor<1x4x16xf32>
// CHECK-NEXT: %[[T:.*]] = stablehlo.transpose %[[D]], dims = [1, 0, 2]
// CHECK-NEXT: %[[R:.*]] = stablehlo.reshape %[[T]] : (tensor<4x1x16xf32>) -> tensor<4x16xf32>
// CHECK-NEXT: return %[[R]]
// NOMQ-LABEL: func.func @q4_grouped_in_out
// NOMQ-NEXT: %[[D:.*]] = stablehlo.composite "hx.dequantize"
// NOMQ-NEXT: stablehlo.dot_general %arg0, %[[D]]
// NOMQ-NOT: hx.matmul_q
func.func @q4_grouped_in_out(%x: tensor<4x64xf32>, %q: tensor<64x8xui8>, %s: tensor<64x1xf32>) -> tensor<4x16xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int4", group_size = 16 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<64x8xui8>, tensor<64x1xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
func.func private @deq(%q: tensor<64x8xui8>, %s: tensor<64x1xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// int8 with groups along the free axis, the dequantized operand on the left: the dot's
// result is the composite's transposed.
// CHECK-LABEL: func.func @q8_grouped_lhs
// CHECK-SAME: (%[[X:.*]]: tensor<64x4xf32>, %[[Q:.*]]: tensor<64x16xi8>, %[[S:.*]]: tensor<64x2xf32>)
// CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]], %[[S]] {composite_attributes = {dtype = "int8", group_size = 8 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 0>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], version = 3 : i32} : (tensor<64x4xf32>, tensor<64x16xi8>, tensor<64x2xf32>) -> tensor<4x16xf32>
// CHECK-NEXT: %[[T:.*]] = stablehlo.transpose %[[Y]], dims = [1, 0] : (tensor<4x16xf32>) -> tensor<16x4xf32>
// CHECK-NEXT: return %[[T]]
// CHECK: func.func private @[[IMPL]]
// CHECK-NEXT: stablehlo.convert %{{.*}} : (tensor<64x16xi8>) -> tensor<64x16xf32>
// CHECK-NEXT: stablehlo.reshape %{{.*}} : (tensor<64x16xf32>) -> tensor<64x2x8xf32>
// CHECK: stablehlo.dot_general %{{.*}}, %{{.*}}, batching_dims = [2] x [1], contracting_dims = [0] x [0] : (tensor<64x4x2xf32>, tensor<64x2x8xf32>) -> tensor<2x4x8xf32>
func.func @q8_grouped_lhs(%x: tensor<64x4xf32>, %q: tensor<64x16xi8>, %s: tensor<64x2xf32>) -> tensor<16x4xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int8", group_size = 8 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<64x16xi8>, tensor<64x2xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %d, %x, contracting_dims = [0] x [0] : (tensor<64x16xf32>, tensor<64x4xf32>) -> tensor<16x4xf32>
  return %y : tensor<16x4xf32>
}
func.func private @deq(%q: tensor<64x16xi8>, %s: tensor<64x2xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// fp8 values with per-row scales, N-d activations: scales into x, values converted.
// CHECK-LABEL: func.func @f8_per_row
// CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2 {composite_attributes = {dtype = "float8_e4m3fn", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 2>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], version = 3 : i32} : (tensor<2x4x64xf32>, tensor<64x16xf8E4M3FN>, tensor<64xf32>) -> tensor<2x4x16xf32>
// CHECK-NEXT: return %[[Y]]
// CHECK: func.func private @[[IMPL]](%[[A:.*]]: tensor<2x4x64xf32>, %[[B:.*]]: tensor<64x16xf8E4M3FN>, %[[C:.*]]: tensor<64xf32>)
// CHECK-NEXT: %[[QF:.*]] = stablehlo.convert %[[B]] : (tensor<64x16xf8E4M3FN>) -> tensor<64x16xf32>
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[C]], dims = [2] : (tensor<64xf32>) -> tensor<2x4x64xf32>
// CHECK-NEXT: %[[XS:.*]] = stablehlo.multiply %[[A]], %[[SB]]
// CHECK-NEXT: %[[R:.*]] = stablehlo.dot_general %[[XS]], %[[QF]], contracting_dims = [2] x [0] : (tensor<2x4x64xf32>, tensor<64x16xf32>) -> tensor<2x4x16xf32>
// CHECK-NEXT: return %[[R]]
func.func @f8_per_row(%x: tensor<2x4x64xf32>, %q: tensor<64x16xf8E4M3FN>, %s: tensor<64xf32>) -> tensor<2x4x16xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "float8_e4m3fn", group_size = 0 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<64x16xf8E4M3FN>, tensor<64xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [2] x [0] : (tensor<2x4x64xf32>, tensor<64x16xf32>) -> tensor<2x4x16xf32>
  return %y : tensor<2x4x16xf32>
}
func.func private @deq(%q: tensor<64x16xf8E4M3FN>, %s: tensor<64xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// The [out, in] (torch) layout through a transpose, groups along the contraction:
// hx.matmul_q contracts q's last axis; each group's partial sum is scaled, then summed.
// CHECK-LABEL: func.func @q4_out_in_transposed
// CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2 {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1>}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], version = 3 : i32} : (tensor<4x64xf32>, tensor<48x32xui8>, tensor<48x2xf32>) -> tensor<4x48xf32>
// CHECK-NEXT: return %[[Y]]
// CHECK-NOT: stablehlo.transpose %{{.*}} : (tensor<48x64xf32>)
// CHECK: func.func private @[[IMPL]]
// CHECK: %[[XG:.*]] = stablehlo.reshape %{{.*}} : (tensor<4x64xf32>) -> tensor<4x2x32xf32>
// CHECK-NEXT: %[[QG:.*]] = stablehlo.reshape %{{.*}} : (tensor<48x64xf32>) -> tensor<48x2x32xf32>
// CHECK-NEXT: %[[P:.*]] = stablehlo.dot_general %[[XG]], %[[QG]], batching_dims = [1] x [1], contracting_dims = [2] x [2] : (tensor<4x2x32xf32>, tensor<48x2x32xf32>) -> tensor<2x4x48xf32>
// CHECK-NEXT: %[[ST:.*]] = stablehlo.transpose %{{.*}}, dims = [1, 0] : (tensor<48x2xf32>) -> tensor<2x48xf32>
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[ST]], dims = [0, 2] : (tensor<2x48xf32>) -> tensor<2x4x48xf32>
// CHECK-NEXT: %[[PS:.*]] = stablehlo.multiply %[[P]], %[[SB]] : tensor<2x4x48xf32>
// CHECK-NEXT: %[[Z:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<f32>
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce(%[[PS]] init: %[[Z]]) applies stablehlo.add across dimensions = [0] : (tensor<2x4x48xf32>, tensor<f32>) -> tensor<4x48xf32>
// CHECK-NEXT: return %[[R]]
func.func @q4_out_in_transposed(%x: tensor<4x64xf32>, %q: tensor<48x32xui8>, %s: tensor<48x2xf32>) -> tensor<4x48xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<48x32xui8>, tensor<48x2xf32>) -> tensor<48x64xf32>
  %t = stablehlo.transpose %d, dims = [1, 0] : (tensor<48x64xf32>) -> tensor<64x48xf32>
  %y = stablehlo.dot_general %x, %t, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x48xf32>) -> tensor<4x48xf32>
  return %y : tensor<4x48xf32>
}
func.func private @deq(%q: tensor<48x32xui8>, %s: tensor<48x2xf32>) -> tensor<48x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<48x64xf32>
  return %0 : tensor<48x64xf32>
}

// -----

// Shardings: the values and the group scales (group axis like the last axis) are
// constrained like the dequantized value was; the composite carries the dot's sharding.
// CHECK-LABEL: func.func @q4_sharded
// CHECK-SAME: %[[Q:[^:]*]]: tensor<64x8xui8>, %[[S:[^:]*]]: tensor<64x2xf32>)
// CHECK-NEXT: %[[QC:.*]] = sdy.sharding_constraint %[[Q]] <@mesh, [{}, {"j"}]> : tensor<64x8xui8>
// CHECK-NEXT: %[[SC:.*]] = sdy.sharding_constraint %[[S]] <@mesh, [{}, {"j"}]> : tensor<64x2xf32>
// CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q" %arg0, %[[QC]], %[[SC]] {composite_attributes = {dtype = "int4", group_size = 8 : i64, {{.*}}sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {"j"}]>]>, version = 3 : i32}
// CHECK-NEXT: return %[[Y]]
sdy.mesh @mesh = <["i"=2, "j"=2]>
func.func @q4_sharded(%x: tensor<4x64xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"i"}, {}]>}, %q: tensor<64x8xui8>, %s: tensor<64x2xf32>) -> tensor<4x16xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int4", group_size = 8 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<64x8xui8>, tensor<64x2xf32>) -> tensor<64x16xf32>
  %dc = sdy.sharding_constraint %d <@mesh, [{}, {"j"}]> : tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %dc, contracting_dims = [1] x [0] {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {"j"}]>]>} : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
func.func private @deq(%q: tensor<64x8xui8>, %s: tensor<64x2xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// A sharded contraction axis (whole groups per shard) is hx.matmul_q's too, as for the
// dot: partial sums the partitioner adds. The values and the group scale are
// constrained like the dequantized value.
// CHECK-LABEL: func.func @contraction_sharded
// CHECK-NEXT: %[[QC:.*]] = sdy.sharding_constraint %arg1 <@mesh, [{"i"}, {}]> : tensor<64x8xui8>
// CHECK-NEXT: %[[SC:.*]] = sdy.sharding_constraint %arg2 <@mesh, [{"i"}, {}]> : tensor<64x2xf32>
// CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q" %arg0, %[[QC]], %[[SC]] {composite_attributes = {dtype = "int4", group_size = 8 : i64, layout = "int4_pairs_v1", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}
// CHECK-NEXT: return %[[Y]]
sdy.mesh @mesh = <["i"=2, "j"=2]>
func.func @contraction_sharded(%x: tensor<4x64xf32>, %q: tensor<64x8xui8>, %s: tensor<64x2xf32>) -> tensor<4x16xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int4", group_size = 8 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<64x8xui8>, tensor<64x2xf32>) -> tensor<64x16xf32>
  %dc = sdy.sharding_constraint %d <@mesh, [{"i"}, {}]> : tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %dc, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
func.func private @deq(%q: tensor<64x8xui8>, %s: tensor<64x2xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// Dims that are no hx.matmul_q contract for group scales: the scale spans a contracted
// axis (0) and a free one (1) besides the groups along the contracted last axis. (Per
// row the same dims would not fold either.)
// CHECK-LABEL: func.func @groups_do_not_fold
// CHECK-NEXT: %[[D:.*]] = stablehlo.composite "hx.dequantize"
// CHECK-NEXT: stablehlo.dot_general %arg0, %[[D]]
// CHECK-NOT: hx.matmul_q
func.func @groups_do_not_fold(%x: tensor<4x2x16xf32>, %q: tensor<2x3x16xi8>, %s: tensor<2x3x2xf32>) -> tensor<4x3xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int8", group_size = 8 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<2x3x16xi8>, tensor<2x3x2xf32>) -> tensor<2x3x16xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1, 2] x [0, 2] : (tensor<4x2x16xf32>, tensor<2x3x16xf32>) -> tensor<4x3xf32>
  return %y : tensor<4x3xf32>
}
func.func private @deq(%q: tensor<2x3x16xi8>, %s: tensor<2x3x2xf32>) -> tensor<2x3x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<2x3x16xf32>
  return %0 : tensor<2x3x16xf32>
}

// -----

// (A dequantize whose attributes or scale shape disagree with its types is an error:
// hx-fold-scales-errors.mlir.)

// -----

// Non-default precision: the composite's decomposition uses the default one.
// CHECK-LABEL: func.func @precision_highest_left_alone
// CHECK-NEXT: %[[D:.*]] = stablehlo.composite "hx.dequantize"
// CHECK-NEXT: stablehlo.dot_general %arg0, %[[D]]
// CHECK-NOT: hx.matmul_q
func.func @precision_highest_left_alone(%x: tensor<4x64xf32>, %q: tensor<64x16xf8E4M3FN>, %s: tensor<64xf32>) -> tensor<4x16xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "float8_e4m3fn", group_size = 0 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<64x16xf8E4M3FN>, tensor<64xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
func.func private @deq(%q: tensor<64x16xf8E4M3FN>, %s: tensor<64xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// int8 per row in a version-2 dequantize still folds as before, into hx.matmul_q v3.
// CHECK-LABEL: func.func @int8_per_row_v2_folds
// CHECK-NEXT: stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2 {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", {{.*}}version = 3 : i32}
func.func @int8_per_row_v2_folds(%x: tensor<4x64xf32>, %q: tensor<64x16xi8>, %s: tensor<64xf32>) -> tensor<4x16xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<64x16xi8>, tensor<64xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
func.func private @deq(%q: tensor<64x16xi8>, %s: tensor<64xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}
