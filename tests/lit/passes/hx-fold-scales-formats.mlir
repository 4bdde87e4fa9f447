// RUN: hxmlir-opt %s -p hx-fold-scales --split-input-file | filecheck %s
// hx-fold-scales on the MLIR module folds int8 per-row dequantizations only; int4 pairs,
// fp8 values and group scales are left alone (the jaxpr stage forms their hx.matmul_q,
// tests/lit/lowering/formats.py), never folded as if they were per-row int8.

// CHECK-LABEL: func.func @group_scales_are_left_alone
// CHECK-NEXT: %[[D:.*]] = stablehlo.composite "hx.dequantize"
// CHECK-NEXT: stablehlo.dot_general %arg0, %[[D]]
// CHECK-NOT: hx.matmul_q
func.func @group_scales_are_left_alone(%x: tensor<4x64xf32>, %q: tensor<64x16xi8>, %s: tensor<64x2xf32>) -> tensor<4x16xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int8", group_size = 8 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<64x16xi8>, tensor<64x2xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
func.func private @deq(%q: tensor<64x16xi8>, %s: tensor<64x2xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// CHECK-LABEL: func.func @int4_pairs_are_left_alone
// CHECK-NEXT: %[[D:.*]] = stablehlo.composite "hx.dequantize"
// CHECK-NEXT: stablehlo.dot_general %arg0, %[[D]]
// CHECK-NOT: hx.matmul_q
func.func @int4_pairs_are_left_alone(%x: tensor<4x64xf32>, %q: tensor<64x8xui8>, %s: tensor<64xf32>) -> tensor<4x16xf32> {
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int4", group_size = 0 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<64x8xui8>, tensor<64xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
func.func private @deq(%q: tensor<64x8xui8>, %s: tensor<64xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// int8 per row in a version-2 dequantize still folds, into hx.matmul_q v3.
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
