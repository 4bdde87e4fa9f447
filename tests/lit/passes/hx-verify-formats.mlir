// RUN: hxmlir-opt %s -p hx-verify --split-input-file --verify-diagnostics | filecheck %s
// hx-verify on quantization formats: the format attributes must agree with the types,
// group scales have the values' shape with n / g last and the values' sharding, and
// old versions hold int8 per-row values only.

// CHECK-LABEL: func.func @q4_groups_ok
func.func @q4_groups_ok(%q: tensor<4x32xui8>, %s: tensor<4x2xf32>) -> tensor<4x64xf32> {
  %0 = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<4x32xui8>, tensor<4x2xf32>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
func.func private @deq(%q: tensor<4x32xui8>, %s: tensor<4x2xf32>) -> tensor<4x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}

// -----

func.func @attributes_disagree(%q: tensor<4x64xi8>, %s: tensor<4x2xf32>) -> tensor<4x64xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: composite_attributes say dtype = 'int4', group_size = 32, layout = 'int4_pairs_v1' but the types i8[4,64], f32[4,2] are dtype = 'int8', group_size = 32, layout = 'plain'}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<4x64xi8>, tensor<4x2xf32>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
func.func private @deq(%q: tensor<4x64xi8>, %s: tensor<4x2xf32>) -> tensor<4x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}

// -----

func.func @group_scale_shape(%q: tensor<4x64xi8>, %s: tensor<4x3xf32>) -> tensor<4x64xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: scale shape must be the value shape without its last axis: values i8[4,64], scale f32[4,3]}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<4x64xi8>, tensor<4x3xf32>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
func.func private @deq(%q: tensor<4x64xi8>, %s: tensor<4x3xf32>) -> tensor<4x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}

// -----

func.func @old_version_is_int8_per_row(%q: tensor<4x32xui8>, %s: tensor<4xf32>) -> tensor<4x64xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: this version holds int8 values with per-row scales only, got ui8[4,32], f32[4]}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x32xui8>, tensor<4xf32>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
func.func private @deq(%q: tensor<4x32xui8>, %s: tensor<4xf32>) -> tensor<4x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}

// -----

sdy.mesh @mesh = <["i"=4]>
func.func @group_scale_sharding(%q: tensor<8x64xi8>, %s: tensor<8x4xf32>) -> tensor<8x64xf32> {
  %qc = sdy.sharding_constraint %q <@mesh, [{}, {"i"}]> : tensor<8x64xi8>
  %sc = sdy.sharding_constraint %s <@mesh, [{}, {}]> : tensor<8x4xf32>
  // expected-error @+1 {{'hx.dequantize' operand: group scale sharding [{}, {}] must be the values' sharding [{}, {"i"}]}}
  %0 = stablehlo.composite "hx.dequantize" %qc, %sc {composite_attributes = {dtype = "int8", group_size = 16 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<8x64xi8>, tensor<8x4xf32>) -> tensor<8x64xf32>
  return %0 : tensor<8x64xf32>
}
func.func private @deq(%q: tensor<8x64xi8>, %s: tensor<8x4xf32>) -> tensor<8x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<8x64xf32>
  return %0 : tensor<8x64xf32>
}

// -----

func.func @matmul_q_groups_ok(%x: tensor<2x64xf32>, %q: tensor<48x32xui8>, %s: tensor<48x2xf32>) -> tensor<2x48xf32> {
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1>}, decomposition = @mm, version = 3 : i32} : (tensor<2x64xf32>, tensor<48x32xui8>, tensor<48x2xf32>) -> tensor<2x48xf32>
  return %0 : tensor<2x48xf32>
}
func.func private @mm(%x: tensor<2x64xf32>, %q: tensor<48x32xui8>, %s: tensor<48x2xf32>) -> tensor<2x48xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<2x48xf32>
  return %0 : tensor<2x48xf32>
}
