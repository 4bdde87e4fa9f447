// RUN: hxmlir-opt %s -p hx-verify --split-input-file --verify-diagnostics | filecheck %s
// hx-verify checks every hx.* composite against lowering/schema.py. Valid IR passes
// through unchanged (CHECK lines); each invalid case carries the expected diagnostics. Cases the StableHLO verifier already rejects at parse time (an
// unknown decomposition, a signature mismatch) are annotated with its message.

// CHECK-LABEL: func.func @dequantize_ok
// CHECK: stablehlo.composite "hx.dequantize" %arg0, %arg1 {decomposition = @deq, version = 1 : i32}
func.func @dequantize_ok(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.convert %q : (tensor<4x8xi8>) -> tensor<4x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}

// -----

// CHECK-LABEL: func.func @quantize_ok
// CHECK: stablehlo.composite "hx.quantize" %arg0 {composite_attributes = {qmax = 127 : i64}
func.func @quantize_ok(%x: tensor<2x3x8xf32>) -> (tensor<2x3x8xi8>, tensor<2x3xf32>) {
  %0:2 = stablehlo.composite "hx.quantize" %x {composite_attributes = {qmax = 127 : i64}, decomposition = @quant, version = 1 : i32} : (tensor<2x3x8xf32>) -> (tensor<2x3x8xi8>, tensor<2x3xf32>)
  return %0#0, %0#1 : tensor<2x3x8xi8>, tensor<2x3xf32>
}
func.func private @quant(%x: tensor<2x3x8xf32>) -> (tensor<2x3x8xi8>, tensor<2x3xf32>) {
  %0 = stablehlo.constant dense<0> : tensor<2x3x8xi8>
  %1 = stablehlo.constant dense<1.0> : tensor<2x3xf32>
  return %0, %1 : tensor<2x3x8xi8>, tensor<2x3xf32>
}

// -----

// CHECK-LABEL: func.func @matmul_q_batched_ok
// CHECK: stablehlo.composite "hx.matmul_q"
func.func @matmul_q_batched_ok(%x: tensor<3x2x6xf32>, %q: tensor<3x6x5xi8>, %s: tensor<3x6xf32>) -> tensor<3x2x5xf32> {
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {decomposition = @mm, version = 1 : i32} : (tensor<3x2x6xf32>, tensor<3x6x5xi8>, tensor<3x6xf32>) -> tensor<3x2x5xf32>
  return %0 : tensor<3x2x5xf32>
}
func.func private @mm(%x: tensor<3x2x6xf32>, %q: tensor<3x6x5xi8>, %s: tensor<3x6xf32>) -> tensor<3x2x5xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<3x2x5xf32>
  return %0 : tensor<3x2x5xf32>
}

// -----

// CHECK-LABEL: func.func @outer_and_matmul_r1_ok
// CHECK: stablehlo.composite "hx.outer"
// CHECK: stablehlo.composite "hx.matmul_r1"
func.func @outer_and_matmul_r1_ok(%x: tensor<2x4xf32>, %c: tensor<4xf32>, %r: tensor<5xf32>) -> tensor<2x5xf32> {
  %0:2 = stablehlo.composite "hx.outer" %c, %r {decomposition = @outer, version = 1 : i32} : (tensor<4xf32>, tensor<5xf32>) -> (tensor<4xf32>, tensor<5xf32>)
  %1 = stablehlo.composite "hx.matmul_r1" %x, %0#0, %0#1 {decomposition = @mr1, version = 1 : i32} : (tensor<2x4xf32>, tensor<4xf32>, tensor<5xf32>) -> tensor<2x5xf32>
  return %1 : tensor<2x5xf32>
}
func.func private @outer(%c: tensor<4xf32>, %r: tensor<5xf32>) -> (tensor<4xf32>, tensor<5xf32>) {
  return %c, %r : tensor<4xf32>, tensor<5xf32>
}
func.func private @mr1(%x: tensor<2x4xf32>, %c: tensor<4xf32>, %r: tensor<5xf32>) -> tensor<2x5xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<2x5xf32>
  return %0 : tensor<2x5xf32>
}

// -----

// Composites outside the hx namespace are not ours: never checked.
// CHECK-LABEL: func.func @foreign_composite_ignored
// CHECK: stablehlo.composite "my.op"
func.func @foreign_composite_ignored(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.composite "my.op" %x {decomposition = @id, version = 9 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @id(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

// A sharded matmul_q as the lowering emits it: constraints before the composite,
// sdy.sharding on it; rows like x, columns like the weight, contraction unsharded.
// CHECK-LABEL: func.func @matmul_q_sharded_ok
// CHECK: stablehlo.composite "hx.matmul_q" {{.*}}sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>
sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @matmul_q_sharded_ok(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %xc = sdy.sharding_constraint %x <@mesh, [{"i"}, {}]> : tensor<4x6xf32>
  %qc = sdy.sharding_constraint %q <@mesh, [{}, {}]> : tensor<6x8xi8>
  %sc = sdy.sharding_constraint %s <@mesh, [{}]> : tensor<6xf32>
  %0 = stablehlo.composite "hx.matmul_q" %xc, %qc, %sc {decomposition = @mm, sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>, version = 1 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// An open dimension ({?}) is not fixed: such shardings are not checked.
// CHECK-LABEL: func.func @open_sharding_unchecked
sdy.mesh @mesh = <["i"=2]>
func.func @open_sharding_unchecked(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %qc = sdy.sharding_constraint %q <@mesh, [{"i"}, {?}]> : tensor<4x8xi8>
  %0 = stablehlo.composite "hx.dequantize" %qc, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @unknown_name(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'hx.frobnicate' is not a known hx composite; known: hx.attention, hx.dequantize, hx.matmul_q, hx.matmul_r1, hx.outer, hx.quantize}}
  %0 = stablehlo.composite "hx.frobnicate" %x {decomposition = @id, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @id(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

func.func @unknown_version(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.dequantize' version 7 is not accepted; this code accepts 1, 2}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 7 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// No version attribute means version 0, which no hx op has.
func.func @missing_version(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{'hx.dequantize' version 0 is not accepted}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @quantize_missing_qmax(%x: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>) {
  // expected-error @+1 {{'hx.quantize' composite_attributes must have keys ['qmax'], got []}}
  %0:2 = stablehlo.composite "hx.quantize" %x {decomposition = @quant, version = 1 : i32} : (tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>)
  return %0#0, %0#1 : tensor<4x8xi8>, tensor<4xf32>
}
func.func private @quant(%x: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>) {
  %0 = stablehlo.constant dense<0> : tensor<4x8xi8>
  %1 = stablehlo.constant dense<1.0> : tensor<4xf32>
  return %0, %1 : tensor<4x8xi8>, tensor<4xf32>
}

// -----

func.func @quantize_qmax_wrong_type(%x: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>) {
  // expected-error @+1 {{'hx.quantize' attribute 'qmax' must be an i64 integer attribute, got 1.270000e+02 : f32}}
  %0:2 = stablehlo.composite "hx.quantize" %x {composite_attributes = {qmax = 127.0 : f32}, decomposition = @quant, version = 1 : i32} : (tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>)
  return %0#0, %0#1 : tensor<4x8xi8>, tensor<4xf32>
}
func.func private @quant(%x: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>) {
  %0 = stablehlo.constant dense<0> : tensor<4x8xi8>
  %1 = stablehlo.constant dense<1.0> : tensor<4xf32>
  return %0, %1 : tensor<4x8xi8>, tensor<4xf32>
}

// -----

func.func @dequantize_extra_attribute(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.dequantize' composite_attributes must have keys [], got ['axis']}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {composite_attributes = {axis = 1 : i64}, decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @scale_shape(%q: tensor<4x8xi8>, %s: tensor<8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: scale shape must be the value shape without its last axis: values i8[4,8], scale f32[8]}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @scale_dtype(%q: tensor<4x8xi8>, %s: tensor<4xf16>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: scale must be f32, got f16[4]}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf16>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf16>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @values_dtype(%q: tensor<4x8xi32>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: quantized values must be i8[..., n], got i32[4,8]}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi32>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi32>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @matmul_q_contraction_mismatch(%x: tensor<2x5xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<2x8xf32> {
  // expected-error @+1 {{'hx.matmul_q' contracting or batch dims differ in size for dimension numbers (((1,), (0,)), ((), ())): f32[2,5], i8[6,8], f32[6]}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {decomposition = @mm, version = 1 : i32} : (tensor<2x5xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}
func.func private @mm(%x: tensor<2x5xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<2x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

func.func @matmul_q_result_shape(%x: tensor<2x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<8x2xf32> {
  // expected-error @+1 {{'hx.matmul_q' result must be f32[2,8], got f32[8,2]}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {decomposition = @mm, version = 1 : i32} : (tensor<2x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<8x2xf32>
  return %0 : tensor<8x2xf32>
}
func.func private @mm(%x: tensor<2x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<8x2xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<8x2xf32>
  return %0 : tensor<8x2xf32>
}

// -----

func.func @operand_count(%q: tensor<4x8xi8>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.dequantize' (i8[*l, n], f32[*l]) -> f32[*l, n] takes 2 operand(s) and 1 result(s), got 1 and 1}}
  %0 = stablehlo.composite "hx.dequantize" %q {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @dynamic_shape(%q: tensor<?x8xi8>, %s: tensor<?xf32>) -> tensor<?x8xf32> {
  // expected-error @+1 {{'hx.dequantize' needs statically shaped ranked tensors: operand #0 has type tensor<?x8xi8>; operand #1 has type tensor<?xf32>; result #0 has type tensor<?x8xf32>}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<?x8xi8>, tensor<?xf32>) -> tensor<?x8xf32>
  return %0 : tensor<?x8xf32>
}
func.func private @deq(%q: tensor<?x8xi8>, %s: tensor<?xf32>) -> tensor<?x8xf32> {
  %0 = stablehlo.convert %q : (tensor<?x8xi8>) -> tensor<?x8xf32>
  return %0 : tensor<?x8xf32>
}

// -----

// The StableHLO verifier itself rejects a decomposition whose signature differs.
func.func @signature_mismatch(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{operand at index 1 has type 'tensor<4xf32>', but decomposition has type 'tensor<4xf16>'}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf16>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @missing_decomposition(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'nope' does not reference a valid function}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @nope, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @public_decomposition(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.dequantize' decomposition @deq must be private}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// A decomposition must be plain StableHLO, also in the functions it calls.
func.func @decomposition_not_plain(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.dequantize' decomposition @deq is not plain StableHLO: it contains 'chlo.erf'}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.convert %q : (tensor<4x8xi8>) -> tensor<4x8xf32>
  %1 = func.call @helper(%0) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}
func.func private @helper(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = chlo.erf %x : tensor<4x8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// Scale sharding must be the values' sharding without the last axis.
sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @scale_sharding(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %qc = sdy.sharding_constraint %q <@mesh, [{"i"}, {}]> : tensor<4x8xi8>
  %sc = sdy.sharding_constraint %s <@mesh, [{"j"}]> : tensor<4xf32>
  // expected-error @+1 {{'hx.dequantize' operand: scale sharding [{"j"}] must be the values' sharding [{"i"}, {}] without its last axis}}
  %0 = stablehlo.composite "hx.dequantize" %qc, %sc {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// Shardings of block arguments are read from the function's sdy.sharding argument
// attributes. The quantized (last) axis may be sharded (weights shard by columns).
sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @block_argument_shardings(%q: tensor<4x8xi8> {sdy.sharding = #sdy.sharding<@mesh, [{"i"}, {"j"}]>}, %s: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.dequantize' operand: scale sharding [{}] must be the values' sharding [{"i"}, {"j"}] without its last axis}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// Shardings fixed only by the defining op's own sdy.sharding attribute, with an
// inline mesh: no sdy.mesh op, no constraint, no argument attribute in the module.
// The two composites differ in their operands' shardings alone, so they must get
// verdicts of their own (the first is valid).
func.func @op_sharding_only(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %qn = stablehlo.negate %q {sdy.sharding = #sdy.sharding_per_value<[<mesh<["i"=2, "j"=4]>, [{"i"}, {}]>]>} : tensor<4x8xi8>
  %si = stablehlo.negate %s {sdy.sharding = #sdy.sharding_per_value<[<mesh<["i"=2, "j"=4]>, [{"i"}]>]>} : tensor<4xf32>
  %sj = stablehlo.negate %s {sdy.sharding = #sdy.sharding_per_value<[<mesh<["i"=2, "j"=4]>, [{"j"}]>]>} : tensor<4xf32>
  %0 = stablehlo.composite "hx.dequantize" %qn, %si {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  // expected-error @+1 {{'hx.dequantize' operand: scale sharding [{"j"}] must be the values' sharding [{"i"}, {}] without its last axis}}
  %1 = stablehlo.composite "hx.dequantize" %qn, %sj {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0, %1 : tensor<4x8xf32>, tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// A sharded contraction is dot_general's: partial sums per shard, which the partitioner
// all-reduces (an Auto mesh axis: jax.jit(..., in_shardings=...) of a row-parallel
// layer; on Explicit axes the typing rule refuses it at trace time). Accepted.
// CHECK-LABEL: func.func @matmul_q_contraction_sharded
// CHECK: stablehlo.composite "hx.matmul_q" %{{.*}}, %arg1, %arg2
sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @matmul_q_contraction_sharded(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %xc = sdy.sharding_constraint %x <@mesh, [{}, {"i"}]> : tensor<4x6xf32>
  %0 = stablehlo.composite "hx.matmul_q" %xc, %q, %s {decomposition = @mm, version = 1 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @matmul_q_result_rows(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %xc = sdy.sharding_constraint %x <@mesh, [{"i"}, {}]> : tensor<4x6xf32>
  // expected-error @+1 {{'hx.matmul_q' result dims [0] must be sharded like x's (batch like x, else the weight; dimension numbers (((1,), (0,)), ((), ()))): result [{"j"}, {}], x [{"i"}, {}], weight <unknown>}}
  %0 = stablehlo.composite "hx.matmul_q" %xc, %q, %s {decomposition = @mm, sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"j"}, {}]>]>, version = 1 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @result_sharding_count(%x: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>) {
  // The sdy verifier rejects a wrong count at parse time.
  // (MLIR's "see current operation" note is not a diagnostic of the input: not expected)
  // expected-error @+1 {{'stablehlo.composite' op result shardings don't match number of values: 1 shardings vs 2 values}}
  %0:2 = stablehlo.composite "hx.quantize" %x {composite_attributes = {qmax = 127 : i64}, decomposition = @quant, sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>, version = 1 : i32} : (tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>)
  return %0#0, %0#1 : tensor<4x8xi8>, tensor<4xf32>
}
func.func private @quant(%x: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>) {
  %0 = stablehlo.constant dense<0> : tensor<4x8xi8>
  %1 = stablehlo.constant dense<1.0> : tensor<4xf32>
  return %0, %1 : tensor<4x8xi8>, tensor<4xf32>
}

// -----

// Every problem is reported, each at its op; the pass fails once at the end.
func.func @all_problems_reported(%q: tensor<4x8xi8>, %s: tensor<8xf32>, %x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+2 {{'hx.dequantize' version 7 is not accepted}}
  // expected-error @+1 {{'hx.dequantize' operand: scale shape must be the value shape without its last axis}}
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 7 : i32} : (tensor<4x8xi8>, tensor<8xf32>) -> tensor<4x8xf32>
  // expected-error @+1 {{'hx.nothing' is not a known hx composite}}
  %1 = stablehlo.composite "hx.nothing" %x {decomposition = @id, version = 1 : i32} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %2 = stablehlo.add %0, %1 : tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @id(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  return %x : tensor<4x8xf32>
}

// -----

sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @matmul_q_result_columns(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %qc = sdy.sharding_constraint %q <@mesh, [{}, {"j"}]> : tensor<6x8xi8>
  %sc = sdy.sharding_constraint %s <@mesh, [{}]> : tensor<6xf32>
  // expected-error @+1 {{'hx.matmul_q' result dims [1] must be sharded like the weight's (batch like x, else the weight; dimension numbers (((1,), (0,)), ((), ()))): result [{}, {}], x <unknown>, weight [{}, {"j"}]}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %qc, %sc {decomposition = @mm, sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{}, {}]>]>, version = 1 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// hx.quantize: the values keep the operand's sharding; the scale drops the last axis.
sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @quantize_shardings(%x: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>) {
  %xc = sdy.sharding_constraint %x <@mesh, [{"i"}, {}]> : tensor<4x8xf32>
  // expected-error @+2 {{'hx.quantize' result: scale sharding [{"i"}] must be the values' sharding [{"j"}, {}] without its last axis}}
  // expected-error @+1 {{'hx.quantize' result values sharding [{"j"}, {}] must equal the operand's [{"i"}, {}]}}
  %0:2 = stablehlo.composite "hx.quantize" %xc {composite_attributes = {qmax = 127 : i64}, decomposition = @quant, sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"j"}, {}]>, <@mesh, [{"i"}]>]>, version = 1 : i32} : (tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>)
  return %0#0, %0#1 : tensor<4x8xi8>, tensor<4xf32>
}
func.func private @quant(%x: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>) {
  %0 = stablehlo.constant dense<0> : tensor<4x8xi8>
  %1 = stablehlo.constant dense<1.0> : tensor<4xf32>
  return %0, %1 : tensor<4x8xi8>, tensor<4xf32>
}

// -----

func.func @quantize_result_shape(%x: tensor<4x8xf32>) -> (tensor<4x6xi8>, tensor<4xf32>) {
  // expected-error @+1 {{'hx.quantize' result values i8[4,6] must have the operand's shape f32[4,8]}}
  %0:2 = stablehlo.composite "hx.quantize" %x {composite_attributes = {qmax = 127 : i64}, decomposition = @quant, version = 1 : i32} : (tensor<4x8xf32>) -> (tensor<4x6xi8>, tensor<4xf32>)
  return %0#0, %0#1 : tensor<4x6xi8>, tensor<4xf32>
}
func.func private @quant(%x: tensor<4x8xf32>) -> (tensor<4x6xi8>, tensor<4xf32>) {
  %0 = stablehlo.constant dense<0> : tensor<4x6xi8>
  %1 = stablehlo.constant dense<1.0> : tensor<4xf32>
  return %0, %1 : tensor<4x6xi8>, tensor<4xf32>
}

// -----

func.func @outer_batch_mismatch(%c: tensor<2x4xf32>, %r: tensor<3x5xf32>) -> (tensor<2x4xf32>, tensor<3x5xf32>) {
  // expected-error @+1 {{'hx.outer' factors have different batch dimensions: f32[2,4], f32[3,5]}}
  %0:2 = stablehlo.composite "hx.outer" %c, %r {decomposition = @outer, version = 1 : i32} : (tensor<2x4xf32>, tensor<3x5xf32>) -> (tensor<2x4xf32>, tensor<3x5xf32>)
  return %0#0, %0#1 : tensor<2x4xf32>, tensor<3x5xf32>
}
func.func private @outer(%c: tensor<2x4xf32>, %r: tensor<3x5xf32>) -> (tensor<2x4xf32>, tensor<3x5xf32>) {
  return %c, %r : tensor<2x4xf32>, tensor<3x5xf32>
}

// -----

func.func @matmul_r1_shapes(%x: tensor<2x3xf32>, %c: tensor<4xf32>, %r: tensor<5xf32>) -> tensor<2x5xf32> {
  // expected-error @+1 {{'hx.matmul_r1' operand shapes do not match f32[*b, p, m] x r1[*b, m, n]: f32[2,3], f32[4], f32[5]}}
  %0 = stablehlo.composite "hx.matmul_r1" %x, %c, %r {decomposition = @mr1, version = 1 : i32} : (tensor<2x3xf32>, tensor<4xf32>, tensor<5xf32>) -> tensor<2x5xf32>
  return %0 : tensor<2x5xf32>
}
func.func private @mr1(%x: tensor<2x3xf32>, %c: tensor<4xf32>, %r: tensor<5xf32>) -> tensor<2x5xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<2x5xf32>
  return %0 : tensor<2x5xf32>
}

// -----

sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @matmul_r1_contraction_sharded(%x: tensor<2x4xf32>, %c: tensor<4xf32>, %r: tensor<5xf32>) -> tensor<2x5xf32> {
  %cc = sdy.sharding_constraint %c <@mesh, [{"j"}]> : tensor<4xf32>
  // expected-error @+1 {{'hx.matmul_r1' contraction axes must be unsharded, got x <unknown> and col [{"j"}]}}
  %0 = stablehlo.composite "hx.matmul_r1" %x, %cc, %r {decomposition = @mr1, version = 1 : i32} : (tensor<2x4xf32>, tensor<4xf32>, tensor<5xf32>) -> tensor<2x5xf32>
  return %0 : tensor<2x5xf32>
}
func.func private @mr1(%x: tensor<2x4xf32>, %c: tensor<4xf32>, %r: tensor<5xf32>) -> tensor<2x5xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<2x5xf32>
  return %0 : tensor<2x5xf32>
}

// -----

// Symbols resolve in the nearest module: a composite in a nested module finds its
// decomposition there, and the same name in the outer module is another function.
module @outer_scope {
  module @inner_scope {
    func.func @nested_ok(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
      %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {decomposition = @mm, version = 1 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
      return %0 : tensor<4x8xf32>
    }
    func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
      %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
      return %0 : tensor<4x8xf32>
    }
  }
  func.func @outer_bad(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
    // expected-error @+1 {{'hx.matmul_q' decomposition @mm is not plain StableHLO: it contains 'chlo.erf'}}
    %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {decomposition = @mm, version = 1 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
  func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
    %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
    %1 = chlo.erf %0 : tensor<4x8xf32> -> tensor<4x8xf32>
    return %1 : tensor<4x8xf32>
  }
}

// -----

// Version 2 carries dot_general's dimension numbers: f32[b, s, k] x q[k, n] (a transformer
// layer) and the [out, in] layout verify; their result shardings follow the dims.
sdy.mesh @mesh = <["i"=2, "j"=4]>
func.func @matmul_q_v2_ok(%x: tensor<2x5x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>, %qo: tensor<8x6xi8>, %so: tensor<8xf32>) -> (tensor<2x5x8xf32>, tensor<2x5x8xf32>) {
  %xc = sdy.sharding_constraint %x <@mesh, [{"i"}, {}, {}]> : tensor<2x5x6xf32>
  %0 = stablehlo.composite "hx.matmul_q" %xc, %q, %s {composite_attributes = {lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 2>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @mm, sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}, {}]>]>, version = 2 : i32} : (tensor<2x5x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<2x5x8xf32>
  %1 = stablehlo.composite "hx.matmul_q" %xc, %qo, %so {composite_attributes = {lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 2>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1>}, decomposition = @mmo, version = 2 : i32} : (tensor<2x5x6xf32>, tensor<8x6xi8>, tensor<8xf32>) -> tensor<2x5x8xf32>
  return %0, %1 : tensor<2x5x8xf32>, tensor<2x5x8xf32>
}
func.func private @mm(%x: tensor<2x5x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<2x5x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<2x5x8xf32>
  return %0 : tensor<2x5x8xf32>
}
func.func private @mmo(%x: tensor<2x5x6xf32>, %q: tensor<8x6xi8>, %s: tensor<8xf32>) -> tensor<2x5x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<2x5x8xf32>
  return %0 : tensor<2x5x8xf32>
}

// -----

// The quantized axis contracted while the scale spans a contracted and a free axis:
// no place for the scale.
func.func @matmul_q_v2_unfoldable(%x: tensor<5x3x16xf32>, %q: tensor<4x3x16xi8>, %s: tensor<4x3xf32>) -> tensor<5x4xf32> {
  // expected-error @+1 {{'hx.matmul_q' the scales cannot be folded through dimension numbers (((1, 2), (1, 2)), ((), ())): the quantized axis is contracted and the scale has both a contracted and a free axis: f32[5,3,16], i8[4,3,16], f32[4,3]}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {composite_attributes = {lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1, 2>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1, 2>}, decomposition = @mm, version = 2 : i32} : (tensor<5x3x16xf32>, tensor<4x3x16xi8>, tensor<4x3xf32>) -> tensor<5x4xf32>
  return %0 : tensor<5x4xf32>
}
func.func private @mm(%x: tensor<5x3x16xf32>, %q: tensor<4x3x16xi8>, %s: tensor<4x3xf32>) -> tensor<5x4xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<5x4xf32>
  return %0 : tensor<5x4xf32>
}

// -----

// Version 2 without its dimension numbers.
func.func @matmul_q_v2_no_attributes(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.matmul_q' composite_attributes must have keys ['lhs_batching_dimensions', 'lhs_contracting_dimensions', 'rhs_batching_dimensions', 'rhs_contracting_dimensions'], got []}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {decomposition = @mm, version = 2 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// Malformed dimension numbers of version 2 (some keys, or a key of the wrong kind): the
// attribute diagnostics only; the type rules, which read them, are not run (they raised
// KeyError / an internal error before).
// -----

func.func @matmul_q_v2_some_attributes(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.matmul_q' composite_attributes must have keys ['lhs_batching_dimensions', 'lhs_contracting_dimensions', 'rhs_batching_dimensions', 'rhs_contracting_dimensions'], got ['lhs_contracting_dimensions']}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {composite_attributes = {lhs_contracting_dimensions = array<i64: 1>}, decomposition = @mm, version = 2 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @matmul_q_v2_string_dims(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.matmul_q' attribute 'rhs_contracting_dimensions' must be an array<i64: ...> attribute, got "x"}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {composite_attributes = {lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = "x"}, decomposition = @mm, version = 2 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @matmul_q_v2_i32_dims(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.matmul_q' attribute 'lhs_contracting_dimensions' must be an array<i64: ...> attribute, got array<i32: 1>}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {composite_attributes = {lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i32: 1>, rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 0>}, decomposition = @mm, version = 2 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @matmul_q_v2_missing_and_extra(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'hx.matmul_q' composite_attributes must have keys ['lhs_batching_dimensions', 'lhs_contracting_dimensions', 'rhs_batching_dimensions', 'rhs_contracting_dimensions'], got ['axis', 'lhs_batching_dimensions', 'lhs_contracting_dimensions', 'rhs_contracting_dimensions']}}
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {composite_attributes = {lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 1>, rhs_contracting_dimensions = array<i64: 0>, axis = 1 : i64}, decomposition = @mm, version = 2 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
