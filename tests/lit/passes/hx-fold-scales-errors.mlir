// RUN: hxmlir-opt %s -p hx-fold-scales --split-input-file --verify-diagnostics
// The exit status and the location, without --verify-diagnostics:
// RUN: not hxmlir-opt %s -p hx-fold-scales --split-input-file 2>&1 | filecheck %s --check-prefix=EXIT
//
// hx-fold-scales reads an hx.dequantize's format from its composite_attributes (and its
// version); where they disagree with the operand types it reports an error at the
// dequantize and leaves it and its dot alone, so nothing inconsistent is copied into an
// hx.matmul_q, even without hx-verify.

// EXIT: hx-fold-scales: 1 problem found
// EXIT-NEXT: hx-fold-scales-errors.mlir:14:8: error: 'hx.dequantize' operand: composite_attributes say dtype = 'int4', group_size = 16, layout = 'int4_pairs_v1' but the types ui8[64,16], f32[64,1] are dtype = 'int4', group_size = 32, layout = 'int4_pairs_v1'; hx-fold-scales reads the format from these attributes
func.func @group_size_disagrees(%x: tensor<4x64xf32>, %q: tensor<64x16xui8>, %s: tensor<64x1xf32>) -> tensor<4x32xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: composite_attributes say dtype = 'int4', group_size = 16, layout = 'int4_pairs_v1' but the types ui8[64,16], f32[64,1] are dtype = 'int4', group_size = 32, layout = 'int4_pairs_v1'; hx-fold-scales reads the format from these attributes and leaves the op alone (hx-verify checks every composite)}}
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int4", group_size = 16 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<64x16xui8>, tensor<64x1xf32>) -> tensor<64x32xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x32xf32>) -> tensor<4x32xf32>
  return %y : tensor<4x32xf32>
}
func.func private @deq(%q: tensor<64x16xui8>, %s: tensor<64x1xf32>) -> tensor<64x32xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x32xf32>
  return %0 : tensor<64x32xf32>
}

// -----

// int8 per-row types claiming groups of 16: the int8 per-row fold reads the format too.
// Reported once, though the dequantize feeds two dots.
// EXIT: hx-fold-scales: 1 problem found
// EXIT-NEXT: hx-fold-scales-errors.mlir:31:8: error: 'hx.dequantize' operand: composite_attributes say dtype = 'int8', group_size = 16
func.func @int8_claims_groups(%x: tensor<4x64xf32>, %q: tensor<64x32xi8>, %s: tensor<64xf32>) -> (tensor<4x32xf32>, tensor<4x32xf32>) {
  // expected-error @+1 {{'hx.dequantize' operand: composite_attributes say dtype = 'int8', group_size = 16, layout = 'plain' but the types i8[64,32], f32[64] are dtype = 'int8', group_size = 0, layout = 'plain'}}
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int8", group_size = 16 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<64x32xi8>, tensor<64xf32>) -> tensor<64x32xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x32xf32>) -> tensor<4x32xf32>
  %z = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x32xf32>) -> tensor<4x32xf32>
  return %y, %z : tensor<4x32xf32>, tensor<4x32xf32>
}
func.func private @deq(%q: tensor<64x32xi8>, %s: tensor<64xf32>) -> tensor<64x32xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x32xf32>
  return %0 : tensor<64x32xf32>
}

// -----

// A layout this code does not know.
// EXIT: hx-fold-scales: 1 problem found
// EXIT-NEXT: hx-fold-scales-errors.mlir:48:8: error: 'hx.dequantize' operand: composite_attributes say dtype = 'int4', group_size = 0, layout = 'int4_pairs_v2'
func.func @unknown_layout(%x: tensor<4x64xf32>, %q: tensor<64x8xui8>, %s: tensor<64xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: composite_attributes say dtype = 'int4', group_size = 0, layout = 'int4_pairs_v2' but the types ui8[64,8], f32[64] are dtype = 'int4', group_size = 0, layout = 'int4_pairs_v1'}}
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int4", group_size = 0 : i64, layout = "int4_pairs_v2"}, decomposition = @deq, version = 2 : i32} : (tensor<64x8xui8>, tensor<64xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
func.func private @deq(%q: tensor<64x8xui8>, %s: tensor<64xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// A scale shape no format has (16 values in 3 groups).
// EXIT: hx-fold-scales: 1 problem found
// EXIT-NEXT: hx-fold-scales-errors.mlir:64:8: error: 'hx.dequantize' operand: scale shape must be the value shape without its last axis
func.func @wrong_scale_shape(%x: tensor<4x64xf32>, %q: tensor<64x8xui8>, %s: tensor<64x3xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: scale shape must be the value shape without its last axis: values ui8[64,8], scale f32[64,3]}}
  %d = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int4", group_size = 5 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<64x8xui8>, tensor<64x3xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
func.func private @deq(%q: tensor<64x8xui8>, %s: tensor<64x3xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// Version 1 has no format attributes and means int8 per row: an int4 value is no such op.
// EXIT: hx-fold-scales: 1 problem found
// EXIT-NEXT: hx-fold-scales-errors.mlir:80:8: error: 'hx.dequantize' operand: this version holds int8 values with per-row scales only
func.func @version_1_int4(%x: tensor<4x64xf32>, %q: tensor<64x8xui8>, %s: tensor<64xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: this version holds int8 values with per-row scales only, got ui8[64,8], f32[64]}}
  %d = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<64x8xui8>, tensor<64xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %d, contracting_dims = [1] x [0] : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
func.func private @deq(%q: tensor<64x8xui8>, %s: tensor<64xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}
