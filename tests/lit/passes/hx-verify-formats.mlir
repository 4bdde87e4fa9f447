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

// -----

// A sharded quantized (last) axis must split into whole groups, as the type check
// requires at trace time (README, "Sharding is checked by the type").
sdy.mesh @mesh = <["i"=8]>
func.func @groups_split(%q: tensor<4x64xui8>, %s: tensor<4x4xf32>) -> tensor<4x128xf32> {
  %qc = sdy.sharding_constraint %q <@mesh, [{}, {"i"}]> : tensor<4x64xui8>
  %sc = sdy.sharding_constraint %s <@mesh, [{}, {"i"}]> : tensor<4x4xf32>
  // expected-error @+1 {{'hx.dequantize' operand: q4[4,128@i:g32] sharded over mesh axis 'i'=8: 4 groups of 32 cannot be split 8 ways (a shard would split a group); shard another axis, or use a group size that divides 16 (128 / 8)}}
  %0 = stablehlo.composite "hx.dequantize" %qc, %sc {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<4x64xui8>, tensor<4x4xf32>) -> tensor<4x128xf32>
  return %0 : tensor<4x128xf32>
}
func.func private @deq(%q: tensor<4x64xui8>, %s: tensor<4x4xf32>) -> tensor<4x128xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x128xf32>
  return %0 : tensor<4x128xf32>
}

// -----

// Whole groups on every shard: 4 groups of 32 over 4 devices.
// CHECK-LABEL: func.func @groups_whole
sdy.mesh @mesh = <["i"=4]>
func.func @groups_whole(%q: tensor<4x64xui8>, %s: tensor<4x4xf32>) -> tensor<4x128xf32> {
  %qc = sdy.sharding_constraint %q <@mesh, [{}, {"i"}]> : tensor<4x64xui8>
  %sc = sdy.sharding_constraint %s <@mesh, [{}, {"i"}]> : tensor<4x4xf32>
  %0 = stablehlo.composite "hx.dequantize" %qc, %sc {composite_attributes = {dtype = "int4", group_size = 32 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<4x64xui8>, tensor<4x4xf32>) -> tensor<4x128xf32>
  return %0 : tensor<4x128xf32>
}
func.func private @deq(%q: tensor<4x64xui8>, %s: tensor<4x4xf32>) -> tensor<4x128xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x128xf32>
  return %0 : tensor<4x128xf32>
}

// -----

// The group scale alone carries the sharding (the values' is not fixed): still checked.
sdy.mesh @mesh = <["i"=8]>
func.func @groups_split_by_scale(%q: tensor<4x64xi8>, %s: tensor<4x4xf32>) -> tensor<4x64xf32> {
  %sc = sdy.sharding_constraint %s <@mesh, [{}, {"i"}]> : tensor<4x4xf32>
  // expected-error @+1 {{'hx.dequantize' operand: q8[4,64@i:g16] sharded over mesh axis 'i'=8: 4 groups of 16 cannot be split 8 ways}}
  %0 = stablehlo.composite "hx.dequantize" %q, %sc {composite_attributes = {dtype = "int8", group_size = 16 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<4x64xi8>, tensor<4x4xf32>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
func.func private @deq(%q: tensor<4x64xi8>, %s: tensor<4x4xf32>) -> tensor<4x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}

// -----

// hx.matmul_q's weight, its last axis over two mesh axes (2 x 4 = 8 ways, 4 groups).
sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @matmul_q_groups_split(%x: tensor<2x16xf32>, %q: tensor<16x64xi8>, %s: tensor<16x4xf32>) -> tensor<2x64xf32> {
  %qc = sdy.sharding_constraint %q <@mesh, [{}, {"i", "j"}]> : tensor<16x64xi8>
  %sc = sdy.sharding_constraint %s <@mesh, [{}, {"i", "j"}]> : tensor<16x4xf32>
  // expected-error @+1 {{'hx.matmul_q' weight: q8[16,64@(i,j):g16] sharded over mesh axis 'i'=2, 'j'=4: 4 groups of 16 cannot be split 8 ways}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %qc, %sc {composite_attributes = {dtype = "int8", group_size = 16 : i64, layout = "plain", lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @mm, version = 3 : i32} : (tensor<2x16xf32>, tensor<16x64xi8>, tensor<16x4xf32>) -> tensor<2x64xf32>
  return %0 : tensor<2x64xf32>
}
func.func private @mm(%x: tensor<2x16xf32>, %q: tensor<16x64xi8>, %s: tensor<16x4xf32>) -> tensor<2x64xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<2x64xf32>
  return %0 : tensor<2x64xf32>
}

// -----

// hx.quantize's results (their sharding on the composite); per row, the stored values
// must split evenly: 6 int8 values do not split 4 ways.
sdy.mesh @mesh = <["i"=4]>
func.func @quantize_values_split(%x: tensor<4x6xf32>) -> (tensor<4x6xi8>, tensor<4xf32>) {
  // expected-error @+1 {{'hx.quantize' result: q8[4,6@i] sharded over mesh axis 'i'=4: its 6 stored i8 values cannot be split 4 ways}}
  %0:2 = stablehlo.composite "hx.quantize" %x {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain", method = "absmax", qmax = 127 : i64}, decomposition = @quant, sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{}, {"i"}]>, <@mesh, [{}]>]>, version = 2 : i32} : (tensor<4x6xf32>) -> (tensor<4x6xi8>, tensor<4xf32>)
  return %0#0, %0#1 : tensor<4x6xi8>, tensor<4xf32>
}
func.func private @quant(%x: tensor<4x6xf32>) -> (tensor<4x6xi8>, tensor<4xf32>) {
  %0 = stablehlo.constant dense<0> : tensor<4x6xi8>
  %1 = stablehlo.constant dense<1.0> : tensor<4xf32>
  return %0, %1 : tensor<4x6xi8>, tensor<4xf32>
}

// -----

// An inline mesh (not the module's @mesh): int4 pairs, 4 stored bytes per row over 8.
sdy.mesh @mesh = <["i"=16]>
func.func @packed_values_split(%q: tensor<4x4xui8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %qc = sdy.sharding_constraint %q <mesh<["i"=8]>, [{}, {"i"}]> : tensor<4x4xui8>
  // expected-error @+1 {{'hx.dequantize' operand: q4[4,8@i] sharded over mesh axis 'i'=8: its 4 stored ui8 values cannot be split 8 ways}}
  %0 = stablehlo.composite "hx.dequantize" %qc, %s {composite_attributes = {dtype = "int4", group_size = 0 : i64, layout = "int4_pairs_v1"}, decomposition = @deq, version = 2 : i32} : (tensor<4x4xui8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x4xui8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// A sub-axis splits as many ways as its size: "i":(2)8 is 8 of the 16 devices of "i".
sdy.mesh @mesh = <["i"=16]>
func.func @sub_axis_split(%q: tensor<4x12xi8>, %s: tensor<4xf32>) -> tensor<4x12xf32> {
  %qc = sdy.sharding_constraint %q <@mesh, [{}, {"i":(2)8}]> : tensor<4x12xi8>
  // expected-error @+1 {{'hx.dequantize' operand: q8[4,12@i:(2)8] sharded over mesh axis 'i:(2)8'=8: its 12 stored i8 values cannot be split 8 ways}}
  %0 = stablehlo.composite "hx.dequantize" %qc, %s {composite_attributes = {dtype = "int8", group_size = 0 : i64, layout = "plain"}, decomposition = @deq, version = 2 : i32} : (tensor<4x12xi8>, tensor<4xf32>) -> tensor<4x12xf32>
  return %0 : tensor<4x12xf32>
}
func.func private @deq(%q: tensor<4x12xi8>, %s: tensor<4xf32>) -> tensor<4x12xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x12xf32>
  return %0 : tensor<4x12xf32>
}
