// RUN: hxmlir-opt %s -p hx-fold-scales --split-input-file | filecheck %s
// Idempotent: a second run changes nothing.
// RUN: hxmlir-opt %s -p hx-fold-scales --split-input-file | hxmlir-opt -p hx-fold-scales --split-input-file | filecheck %s
// RUN: hxmlir-opt %s -p "hx-fold-scales{form-matmul-q=false}" --split-input-file | filecheck %s --check-prefix=NOMQ
// RUN: hxmlir-opt %s -p "hx-fold-scales{impl=streaming}" --split-input-file | filecheck %s --check-prefix=STREAM
// RUN: not hxmlir-opt %s -p "hx-fold-scales{impl=fast}" 2>&1 | filecheck %s --check-prefix=BADIMPL
// BADIMPL: error: hx-fold-scales: option impl='fast' is not one of auto, reference, streaming

// x @ dequantize(q, s): the row scales lie along the contraction, so this is
// exactly hx.matmul_q's contract.
// CHECK-LABEL: func.func @composite_to_matmul_q
// CHECK-SAME: (%[[X:.*]]: tensor<4x6xf32>, %[[Q:.*]]: tensor<6x8xi8>, %[[S:.*]]: tensor<6xf32>)
// CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]], %[[S]] {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], version = 3 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: return %[[Y]]
// The dequantize composite is gone, and so is its decomposition.
// CHECK-NOT: @deq
// CHECK: func.func private @[[IMPL]](%[[A:.*]]: tensor<4x6xf32>, %[[B:.*]]: tensor<6x8xi8>, %[[C:.*]]: tensor<6xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[C]], dims = [1] : (tensor<6xf32>) -> tensor<4x6xf32>
// CHECK-NEXT: %[[XS:.*]] = stablehlo.multiply %[[A]], %[[SB]] : tensor<4x6xf32>
// CHECK-NEXT: %[[QF:.*]] = stablehlo.convert %[[B]] : (tensor<6x8xi8>) -> tensor<6x8xf32>
// CHECK-NEXT: %[[R:.*]] = stablehlo.dot_general %[[XS]], %[[QF]], contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: return %[[R]]
// Without matmul_q formation the scale is multiplied into x:
// NOMQ-LABEL: func.func @composite_to_matmul_q
// NOMQ-SAME: (%[[X:.*]]: tensor<4x6xf32>, %[[Q:.*]]: tensor<6x8xi8>, %[[S:.*]]: tensor<6xf32>)
// NOMQ-NEXT: %[[QF:.*]] = stablehlo.convert %[[Q]] : (tensor<6x8xi8>) -> tensor<6x8xf32>
// NOMQ-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[S]], dims = [1] : (tensor<6xf32>) -> tensor<4x6xf32>
// NOMQ-NEXT: %[[XS:.*]] = stablehlo.multiply %[[X]], %[[SB]] : tensor<4x6xf32>
// NOMQ-NEXT: %[[R:.*]] = stablehlo.dot_general %[[XS]], %[[QF]], contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT]
// NOMQ-NEXT: return %[[R]]
func.func @composite_to_matmul_q(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %r = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<6xf32>) -> tensor<6x8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<6x8xf32>
  return %2 : tensor<6x8xf32>
}

// -----

// The open-coded form JAX emits for q.astype(f32) * s[:, None] (two broadcasts).
// CHECK-LABEL: func.func @open_coded_to_matmul_q
// CHECK-SAME: (%[[X:.*]]: tensor<4x6xf32>, %[[Q:.*]]: tensor<6x8xi8>, %[[S:.*]]: tensor<6xf32>)
// CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]], %[[S]]
// CHECK-NEXT: return %[[Y]]
func.func @open_coded_to_matmul_q(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<6xf32>) -> tensor<6x1xf32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [0, 1] : (tensor<6x1xf32>) -> tensor<6x8xf32>
  %3 = stablehlo.multiply %0, %2 : tensor<6x8xf32>
  %r = stablehlo.dot_general %x, %3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}

// -----

// Scale first in the multiply, and a unit-dim reshape instead of the first broadcast.
// CHECK-LABEL: func.func @open_coded_reshape_operand_order
// CHECK-NEXT: stablehlo.composite "hx.matmul_q"
// CHECK-NEXT: return
func.func @open_coded_reshape_operand_order(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xf32>
  %1 = stablehlo.reshape %s : (tensor<6xf32>) -> tensor<6x1xf32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [0, 1] : (tensor<6x1xf32>) -> tensor<6x8xf32>
  %3 = stablehlo.multiply %2, %0 : tensor<6x8xf32>
  %r = stablehlo.dot_general %x, %3, contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}

// -----

// Batched: f32[3,4,6] x dequantize(i8[3,6,8], f32[3,6]) is hx.matmul_q with *b = [3].
// CHECK-LABEL: func.func @batched_to_matmul_q
// CHECK-NEXT: stablehlo.composite "hx.matmul_q" {{.*}} : (tensor<3x4x6xf32>, tensor<3x6x8xi8>, tensor<3x6xf32>) -> tensor<3x4x8xf32>
// CHECK: func.func private @hx.matmul_q.impl
// CHECK-NEXT: stablehlo.broadcast_in_dim %{{.*}}, dims = [0, 2] : (tensor<3x6xf32>) -> tensor<3x4x6xf32>
// CHECK: stablehlo.dot_general {{.*}}, batching_dims = [0] x [0], contracting_dims = [2] x [1]
func.func @batched_to_matmul_q(%x: tensor<3x4x6xf32>, %q: tensor<3x6x8xi8>, %s: tensor<3x6xf32>) -> tensor<3x4x8xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<3x6x8xi8>, tensor<3x6xf32>) -> tensor<3x6x8xf32>
  %r = stablehlo.dot_general %x, %d, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<3x4x6xf32>, tensor<3x6x8xf32>) -> tensor<3x4x8xf32>
  return %r : tensor<3x4x8xf32>
}
func.func private @deq(%q: tensor<3x6x8xi8>, %s: tensor<3x6xf32>) -> tensor<3x6x8xf32> {
  %0 = stablehlo.convert %q : (tensor<3x6x8xi8>) -> tensor<3x6x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0, 1] : (tensor<3x6xf32>) -> tensor<3x6x8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<3x6x8xf32>
  return %2 : tensor<3x6x8xf32>
}

// -----

// N-d activations: f32[2,4,6] x dequantize(i8[6,8], f32[6]) (a transformer layer, several
// free dims on the dense side) is hx.matmul_q v2 with the dot's own dimension numbers; its
// decomposition collapses x's leading dims into m (reshape), dots, and reshapes back.
// CHECK-LABEL: func.func @nd_to_matmul_q
// CHECK-NEXT: stablehlo.composite "hx.matmul_q" {{.*}} {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 2>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @[[IMPL:hx.matmul_q.impl[_0-9]*]], version = 3 : i32} : (tensor<2x4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<2x4x8xf32>
// CHECK-NOT: @deq
// CHECK: func.func private @[[IMPL]]
// CHECK-NEXT: stablehlo.reshape %{{.*}} : (tensor<2x4x6xf32>) -> tensor<8x6xf32>
// CHECK: stablehlo.dot_general {{.*}} contracting_dims = [1] x [0]
// CHECK: stablehlo.reshape %{{.*}} : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
// STREAM-LABEL: func.func @nd_to_matmul_q
// STREAM-NEXT: stablehlo.composite "hx.matmul_q"
// NOMQ-LABEL: func.func @nd_to_matmul_q
// NOMQ-NOT: hx.matmul_q
// NOMQ: stablehlo.dot_general {{.*}} contracting_dims = [2] x [0]
func.func @nd_to_matmul_q(%x: tensor<2x4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<2x4x8xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %r = stablehlo.dot_general %x, %d, contracting_dims = [2] x [0] : (tensor<2x4x6xf32>, tensor<6x8xf32>) -> tensor<2x4x8xf32>
  return %r : tensor<2x4x8xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<6xf32>) -> tensor<6x8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<6x8xf32>
  return %2 : tensor<6x8xf32>
}

// -----

// The quantized operand on the left, contracting its first axis: the scale goes
// into the other operand along its contracting axis (not matmul_q's form).
// CHECK-LABEL: func.func @quantized_lhs_into_operand
// CHECK-SAME: (%[[X:.*]]: tensor<6x4xf32>, %[[Q:.*]]: tensor<6x8xi8>, %[[S:.*]]: tensor<6xf32>)
// CHECK-NEXT: %[[QF:.*]] = stablehlo.convert %[[Q]]
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[S]], dims = [0] : (tensor<6xf32>) -> tensor<6x4xf32>
// CHECK-NEXT: %[[XS:.*]] = stablehlo.multiply %[[X]], %[[SB]] : tensor<6x4xf32>
// CHECK-NEXT: %[[R:.*]] = stablehlo.dot_general %[[QF]], %[[XS]], contracting_dims = [0] x [0] : (tensor<6x8xf32>, tensor<6x4xf32>) -> tensor<8x4xf32>
// CHECK-NEXT: return %[[R]]
func.func @quantized_lhs_into_operand(%x: tensor<6x4xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<8x4xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %r = stablehlo.dot_general %d, %x, contracting_dims = [0] x [0] : (tensor<6x8xf32>, tensor<6x4xf32>) -> tensor<8x4xf32>
  return %r : tensor<8x4xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// -----

// x @ dequantize(q, s).T: contracting the quantized axis, the scale is along a free
// axis of the weight, so it multiplies the result's columns.
// CHECK-LABEL: func.func @free_axis_into_result
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[Q:.*]]: tensor<6x8xi8>, %[[S:.*]]: tensor<6xf32>)
// CHECK-NEXT: %[[QF:.*]] = stablehlo.convert %[[Q]]
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[S]], dims = [1] : (tensor<6xf32>) -> tensor<4x6xf32>
// CHECK-NEXT: %[[R:.*]] = stablehlo.dot_general %[[X]], %[[QF]], contracting_dims = [1] x [1] : (tensor<4x8xf32>, tensor<6x8xf32>) -> tensor<4x6xf32>
// CHECK-NEXT: %[[Y:.*]] = stablehlo.multiply %[[R]], %[[SB]] : tensor<4x6xf32>
// CHECK-NEXT: return %[[Y]]
func.func @free_axis_into_result(%x: tensor<4x8xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x6xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %r = stablehlo.dot_general %x, %d, contracting_dims = [1] x [1] : (tensor<4x8xf32>, tensor<6x8xf32>) -> tensor<4x6xf32>
  return %r : tensor<4x6xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// -----

// Scale along the batch axis only (an outer product per batch): either side works;
// x (3x4) is smaller than the result (3x4x8), so x gets the multiply.
// CHECK-LABEL: func.func @batch_only_smaller_side
// CHECK-SAME: (%[[X:.*]]: tensor<3x4xf32>, %[[Q:.*]]: tensor<3x8xi8>, %[[S:.*]]: tensor<3xf32>)
// CHECK-NEXT: %[[QF:.*]] = stablehlo.convert %[[Q]]
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[S]], dims = [0] : (tensor<3xf32>) -> tensor<3x4xf32>
// CHECK-NEXT: %[[XS:.*]] = stablehlo.multiply %[[X]], %[[SB]]
// CHECK-NEXT: stablehlo.dot_general %[[XS]], %[[QF]], batching_dims = [0] x [0]
func.func @batch_only_smaller_side(%x: tensor<3x4xf32>, %q: tensor<3x8xi8>, %s: tensor<3xf32>) -> tensor<3x4x8xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<3x8xi8>, tensor<3xf32>) -> tensor<3x8xf32>
  %r = stablehlo.dot_general %x, %d, batching_dims = [0] x [0], contracting_dims = [] x [] : (tensor<3x4xf32>, tensor<3x8xf32>) -> tensor<3x4x8xf32>
  return %r : tensor<3x4x8xf32>
}
func.func private @deq(%q: tensor<3x8xi8>, %s: tensor<3xf32>) -> tensor<3x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<3x8xf32>
  return %0 : tensor<3x8xf32>
}

// -----

// The scale varies along a contracting axis (0) and a free axis (1) at once: it does
// not factor, so the dot is left alone.
// CHECK-LABEL: func.func @mixed_axes_left_alone
// CHECK-NEXT: %[[D:.*]] = stablehlo.composite "hx.dequantize"
// CHECK-NEXT: stablehlo.dot_general %{{.*}}, %[[D]]
func.func @mixed_axes_left_alone(%x: tensor<4x6xf32>, %q: tensor<6x5x8xi8>, %s: tensor<6x5xf32>) -> tensor<4x5x8xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x5x8xi8>, tensor<6x5xf32>) -> tensor<6x5x8xf32>
  %r = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x5x8xf32>) -> tensor<4x5x8xf32>
  return %r : tensor<4x5x8xf32>
}
func.func private @deq(%q: tensor<6x5x8xi8>, %s: tensor<6x5xf32>) -> tensor<6x5x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<6x5x8xf32>
  return %0 : tensor<6x5x8xf32>
}

// -----

// A sharding constraint between the dequantize and the dot is kept: for matmul_q it
// constrains the values (and the scale, without the last axis) before the composite.
// CHECK-LABEL: func.func @constraint_kept_matmul_q
// CHECK-SAME: (%[[X:.*]]: tensor<4x6xf32>, %[[Q:.*]]: tensor<6x8xi8>, %[[S:.*]]: tensor<6xf32>)
// CHECK-NEXT: %[[QC:.*]] = sdy.sharding_constraint %[[Q]] <@mesh, [{}, {"j"}]> : tensor<6x8xi8>
// CHECK-NEXT: %[[SC:.*]] = sdy.sharding_constraint %[[S]] <@mesh, [{}]> : tensor<6xf32>
// CHECK-NEXT: stablehlo.composite "hx.matmul_q" %[[X]], %[[QC]], %[[SC]] {{.*}}sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{}, {"j"}]>]>
sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @constraint_kept_matmul_q(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %dc = sdy.sharding_constraint %d <@mesh, [{}, {"j"}]> : tensor<6x8xf32>
  %r = stablehlo.dot_general %x, %dc, contracting_dims = [1] x [0] {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{}, {"j"}]>]>} : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// -----

// Plain fold with shardings: the constraint is re-created on the converted values,
// and the new broadcast and multiply carry x's sharding.
// NOMQ-LABEL: func.func @constraint_kept_fold
// NOMQ-SAME: (%[[X:.*]]: tensor<4x6xf32>, %[[Q:.*]]: tensor<6x8xi8>, %[[S:.*]]: tensor<6xf32>)
// NOMQ-NEXT: %[[XC:.*]] = sdy.sharding_constraint %[[X]] <@mesh, [{"i"}, {}]>
// NOMQ-NEXT: %[[QF:.*]] = stablehlo.convert %[[Q]]
// NOMQ-NEXT: %[[QC:.*]] = sdy.sharding_constraint %[[QF]] <@mesh, [{}, {"j"}]> : tensor<6x8xf32>
// NOMQ-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[S]], dims = [1] {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>}
// NOMQ-NEXT: %[[XS:.*]] = stablehlo.multiply %[[XC]], %[[SB]] {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>}
// NOMQ-NEXT: stablehlo.dot_general %[[XS]], %[[QC]]
sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @constraint_kept_fold(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %xc = sdy.sharding_constraint %x <@mesh, [{"i"}, {}]> : tensor<4x6xf32>
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %dc = sdy.sharding_constraint %d <@mesh, [{}, {"j"}]> : tensor<6x8xf32>
  %r = stablehlo.dot_general %xc, %dc, contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// -----

// A result-side fold carries the dot's sharding onto the new broadcast and multiply.
// CHECK-LABEL: func.func @result_fold_sharding
// CHECK: stablehlo.broadcast_in_dim {{.*}}sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>
// CHECK: stablehlo.dot_general
// CHECK-NEXT: stablehlo.multiply {{.*}}sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>
sdy.mesh @mesh = <["i"=2]>
func.func @result_fold_sharding(%x: tensor<4x8xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x6xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %r = stablehlo.dot_general %x, %d, contracting_dims = [1] x [1] {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>} : (tensor<4x8xf32>, tensor<6x8xf32>) -> tensor<4x6xf32>
  return %r : tensor<4x6xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// -----

// Non-default precision: folded, but not turned into matmul_q (whose decomposition
// uses the default precision).
// CHECK-LABEL: func.func @precision_highest_no_matmul_q
// CHECK-NOT: hx.matmul_q
// CHECK: stablehlo.multiply
// CHECK: stablehlo.dot_general {{.*}}precision = [HIGHEST, HIGHEST]
func.func @precision_highest_no_matmul_q(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %r = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// -----

// The dequantized value has another use: the dot is rewritten, the dequantize stays.
// CHECK-LABEL: func.func @other_use_kept
// CHECK-NEXT: %[[D:.*]] = stablehlo.composite "hx.dequantize"
// CHECK-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q"
// CHECK-NEXT: return %[[Y]], %[[D]]
func.func @other_use_kept(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> (tensor<4x8xf32>, tensor<6x8xf32>) {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %r = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %r, %d : tensor<4x8xf32>, tensor<6x8xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// -----

// Not a dequantize: a product of two dense tensors; a multiply by a full-rank
// (non-broadcast) tensor.
// CHECK-LABEL: func.func @not_patterns_left_alone
// CHECK-NEXT: stablehlo.multiply
// CHECK-NEXT: stablehlo.dot_general
// CHECK-NEXT: stablehlo.convert
// CHECK-NEXT: stablehlo.multiply
// CHECK-NEXT: stablehlo.dot_general
// CHECK-NEXT: return
func.func @not_patterns_left_alone(%x: tensor<4x6xf32>, %w: tensor<6x8xf32>, %v: tensor<6x8xf32>, %q: tensor<6x8xi8>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %0 = stablehlo.multiply %w, %v : tensor<6x8xf32>
  %1 = stablehlo.dot_general %x, %0, contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  %2 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xf32>
  %3 = stablehlo.multiply %2, %w : tensor<6x8xf32>
  %4 = stablehlo.dot_general %x, %3, contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %1, %4 : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// x @ dequantize(q, s).T with q: i8[8,6] (what JAX emits for x @ w.T): the transpose
// moves onto the converted values; the scale (along q's rows, the result's columns)
// multiplies the result.
// CHECK-LABEL: func.func @transposed_weight
// CHECK-SAME: (%[[X:.*]]: tensor<4x6xf32>, %[[Q:.*]]: tensor<8x6xi8>, %[[S:.*]]: tensor<8xf32>)
// CHECK-NEXT: %[[QF:.*]] = stablehlo.convert %[[Q]] : (tensor<8x6xi8>) -> tensor<8x6xf32>
// CHECK-NEXT: %[[QT:.*]] = stablehlo.transpose %[[QF]], dims = [1, 0] : (tensor<8x6xf32>) -> tensor<6x8xf32>
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[S]], dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[R:.*]] = stablehlo.dot_general %[[X]], %[[QT]], contracting_dims = [1] x [0]
// CHECK-NEXT: %[[Y:.*]] = stablehlo.multiply %[[R]], %[[SB]]
// CHECK-NEXT: return %[[Y]]
func.func @transposed_weight(%x: tensor<4x6xf32>, %q: tensor<8x6xi8>, %s: tensor<8xf32>) -> tensor<4x8xf32> {
  %2 = stablehlo.convert %q : (tensor<8x6xi8>) -> tensor<8x6xf32>
  %3 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<8xf32>) -> tensor<8x6xf32>
  %4 = stablehlo.multiply %2, %3 : tensor<8x6xf32>
  %5 = stablehlo.transpose %4, dims = [1, 0] : (tensor<8x6xf32>) -> tensor<6x8xf32>
  %6 = stablehlo.dot_general %x, %5, contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %6 : tensor<4x8xf32>
}

// -----

// CHECK-LABEL: func.func @bf16_left_alone
// CHECK-NEXT: stablehlo.convert
// CHECK-NEXT: stablehlo.broadcast_in_dim
// CHECK-NEXT: stablehlo.multiply
// CHECK-NEXT: stablehlo.dot_general
func.func @bf16_left_alone(%x: tensor<4x6xbf16>, %q: tensor<6x8xi8>, %s: tensor<6xbf16>) -> tensor<4x8xbf16> {
  %0 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xbf16>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<6xbf16>) -> tensor<6x8xbf16>
  %2 = stablehlo.multiply %0, %1 : tensor<6x8xbf16>
  %r = stablehlo.dot_general %x, %2, contracting_dims = [1] x [0] : (tensor<4x6xbf16>, tensor<6x8xbf16>) -> tensor<4x8xbf16>
  return %r : tensor<4x8xbf16>
}

// -----

// A weight large enough for the CPU streaming implementation: with
// impl=streaming (what hxmlir.install picks when lowering for CPU alone) the new
// hx.matmul_q's decomposition walks the int8 weight in a while loop (one row per step at
// m = 2) instead of converting the whole weight; the default keeps the reference.
// CHECK-LABEL: func.func @large_weight
// CHECK-NEXT: stablehlo.composite "hx.matmul_q"
// CHECK: func.func private @hx.matmul_q.impl
// CHECK-NOT: stablehlo.while
// CHECK: stablehlo.convert %{{.*}} : (tensor<2048x1024xi8>) -> tensor<2048x1024xf32>
// STREAM-LABEL: func.func @large_weight
// STREAM-NEXT: %[[Y:.*]] = stablehlo.composite "hx.matmul_q"
// STREAM: func.func private @hx.matmul_q.impl
// STREAM: stablehlo.while
// STREAM: stablehlo.dynamic_slice
// STREAM-NOT: tensor<2048x1024xf32>
// STREAM: return
func.func @large_weight(%x: tensor<2x2048xf32>, %q: tensor<2048x1024xi8>, %s: tensor<2048xf32>) -> tensor<2x1024xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq_large, version = 1 : i32} : (tensor<2048x1024xi8>, tensor<2048xf32>) -> tensor<2048x1024xf32>
  %r = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2048xf32>, tensor<2048x1024xf32>) -> tensor<2x1024xf32>
  return %r : tensor<2x1024xf32>
}
func.func private @deq_large(%q: tensor<2048x1024xi8>, %s: tensor<2048xf32>) -> tensor<2048x1024xf32> {
  %0 = stablehlo.convert %q : (tensor<2048x1024xi8>) -> tensor<2048x1024xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<2048xf32>) -> tensor<2048x1024xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<2048x1024xf32>
  return %2 : tensor<2048x1024xf32>
}
