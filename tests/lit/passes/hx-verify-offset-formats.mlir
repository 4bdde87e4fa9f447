// RUN: hxmlir-opt %s -p hx-verify --split-input-file --verify-diagnostics | filecheck %s
// hx-verify on the formats with f16 scales or offsets: hx.dequantize v3 and
// hx.matmul_q v4 say scale_dtype and offset; the offsets follow the scales and have
// their type; the older versions cannot hold these formats.

// CHECK-LABEL: func.func @u4o_f16_ok
func.func @u4o_f16_ok(%q: tensor<4x32xui8>, %s: tensor<4x2xf16>, %o: tensor<4x2xf16>) -> tensor<4x64xf32> {
  %0 = stablehlo.composite "hx.dequantize" %q, %s, %o {composite_attributes = {dtype = "uint4_f16", group_size = 32 : i64, layout = "uint4_pairs_v1", offset = true, scale_dtype = "f16"}, decomposition = @deq, version = 3 : i32} : (tensor<4x32xui8>, tensor<4x2xf16>, tensor<4x2xf16>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
func.func private @deq(%q: tensor<4x32xui8>, %s: tensor<4x2xf16>, %o: tensor<4x2xf16>) -> tensor<4x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}

// -----

func.func @offset_operand_missing(%q: tensor<4x32xui8>, %s: tensor<4x2xf32>) -> tensor<4x64xf32> {
  // expected-error @+1 {{'hx.dequantize' (i8[*l, n], f32[*l]) -> f32[*l, n] takes 3 operand(s) and 1 result(s), got 2 and 1}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "uint4", group_size = 32 : i64, layout = "uint4_pairs_v1", offset = true, scale_dtype = "f32"}, decomposition = @deq, version = 3 : i32} : (tensor<4x32xui8>, tensor<4x2xf32>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
func.func private @deq(%q: tensor<4x32xui8>, %s: tensor<4x2xf32>) -> tensor<4x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}

// -----

func.func @scale_dtype_disagrees(%x: tensor<2x64xf32>, %q: tensor<8x64xi8>, %s: tensor<8x2xf16>) -> tensor<2x8xf32> {
  // expected-error @+1 {{'hx.matmul_q' weight: composite_attributes say dtype = 'int8_f16', group_size = 32, layout = 'plain', scale_dtype = 'f32', offset = False but the types i8[8,64], f16[8,2] are dtype = 'int8_f16', group_size = 32, layout = 'plain', scale_dtype = 'f16', offset = False}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {composite_attributes = {dtype = "int8_f16", group_size = 32 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, offset = false, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1>, scale_dtype = "f32"}, decomposition = @mm, version = 4 : i32} : (tensor<2x64xf32>, tensor<8x64xi8>, tensor<8x2xf16>) -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}
func.func private @mm(%x: tensor<2x64xf32>, %q: tensor<8x64xi8>, %s: tensor<8x2xf16>) -> tensor<2x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

func.func @offset_of_another_type(%q: tensor<4x32xui8>, %s: tensor<4x2xf32>, %o: tensor<4x2xf16>) -> tensor<4x64xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: values ui8[4,32], scale f32[4,2], offsets f16[4,2]: no quantization format has these components}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s, %o {composite_attributes = {dtype = "uint4", group_size = 32 : i64, layout = "uint4_pairs_v1", offset = true, scale_dtype = "f32"}, decomposition = @deq, version = 3 : i32} : (tensor<4x32xui8>, tensor<4x2xf32>, tensor<4x2xf16>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
func.func private @deq(%q: tensor<4x32xui8>, %s: tensor<4x2xf32>, %o: tensor<4x2xf16>) -> tensor<4x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}

// -----

func.func @old_version_cannot_hold_f16_scales(%q: tensor<4x64xi8>, %s: tensor<4x2xf16>) -> tensor<4x64xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: scale must be f32, got f16[4,2]}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {dtype = "int8_f16", group_size = 32 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<4x64xi8>, tensor<4x2xf16>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
func.func private @deq(%q: tensor<4x64xi8>, %s: tensor<4x2xf16>) -> tensor<4x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
