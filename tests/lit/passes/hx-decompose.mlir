// RUN: hxmlir-opt %s -p hx-decompose --split-input-file | filecheck %s
// Idempotent, and what is left passes hx-verify trivially (no hx.* ops).
// RUN: hxmlir-opt %s -p hx-decompose,hx-decompose,hx-verify --split-input-file | filecheck %s
// RUN: hxmlir-opt %s -p hx-decompose --split-input-file | filecheck %s --check-prefix=NOHX
// NOHX-NOT: "hx.

// CHECK-LABEL: func.func @matmul_q_inlined
// CHECK-SAME: (%[[X:.*]]: tensor<4x6xf32>, %[[Q:.*]]: tensor<6x8xi8>, %[[S:.*]]: tensor<6xf32>)
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[S]], dims = [1] : (tensor<6xf32>) -> tensor<4x6xf32>
// CHECK-NEXT: %[[XS:.*]] = stablehlo.multiply %[[X]], %[[SB]] : tensor<4x6xf32>
// CHECK-NEXT: %[[QF:.*]] = stablehlo.convert %[[Q]] : (tensor<6x8xi8>) -> tensor<6x8xf32>
// CHECK-NEXT: %[[R:.*]] = stablehlo.dot_general %[[XS]], %[[QF]], contracting_dims = [1] x [0]
// CHECK-NEXT: %[[Y:.*]] = stablehlo.add %[[R]], %[[R]]
// CHECK-NEXT: return %[[Y]]
// The decomposition is gone once nothing uses it.
// CHECK-NOT: func.func private @mm
func.func @matmul_q_inlined(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.composite "hx.matmul_q" %x, %q, %s {decomposition = @mm, version = 1 : i32} : (tensor<4x6xf32>, tensor<6x8xi8>, tensor<6xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.add %0, %0 : tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}
func.func private @mm(%x: tensor<4x6xf32>, %q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<6xf32>) -> tensor<4x6xf32>
  %1 = stablehlo.multiply %x, %0 : tensor<4x6xf32>
  %2 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xf32>
  %3 = stablehlo.dot_general %1, %2, contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x8xf32>) -> tensor<4x8xf32>
  return %3 : tensor<4x8xf32>
}

// -----

// Two results, a region op (reduce) in the body, one decomposition shared by two ops.
// CHECK-LABEL: func.func @quantize_two_results_shared
// CHECK: stablehlo.reduce
// CHECK: stablehlo.reduce
// CHECK: return %{{.*}}, %{{.*}} : tensor<4x8xi8>, tensor<4xf32>
// CHECK-NOT: @quant
func.func @quantize_two_results_shared(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>) {
  %0:2 = stablehlo.composite "hx.quantize" %x {composite_attributes = {qmax = 127 : i64}, decomposition = @quant, version = 1 : i32} : (tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>)
  %1:2 = stablehlo.composite "hx.quantize" %y {composite_attributes = {qmax = 127 : i64}, decomposition = @quant, version = 1 : i32} : (tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>)
  %2 = stablehlo.add %0#1, %1#1 : tensor<4xf32>
  return %0#0, %2 : tensor<4x8xi8>, tensor<4xf32>
}
func.func private @quant(%x: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4xf32>) {
  %init = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.abs %x : tensor<4x8xf32>
  %1 = stablehlo.reduce(%0 init: %init) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %2 = stablehlo.convert %x : (tensor<4x8xf32>) -> tensor<4x8xi8>
  return %2, %1 : tensor<4x8xi8>, tensor<4xf32>
}

// -----

// A composite inside a decomposition is inlined too.
// CHECK-LABEL: func.func @nested_composites
// CHECK-SAME: (%[[Q:.*]]: tensor<6x8xi8>, %[[S:.*]]: tensor<6xf32>)
// CHECK-NEXT: %[[QF:.*]] = stablehlo.convert %[[Q]]
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[S]], dims = [0]
// CHECK-NEXT: %[[D:.*]] = stablehlo.multiply %[[QF]], %[[SB]]
// CHECK-NEXT: %[[N:.*]] = stablehlo.negate %[[D]]
// CHECK-NEXT: return %[[N]]
// CHECK-NOT: func.func private
func.func @nested_composites(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.composite "hx.outer_thing" %q, %s {decomposition = @outer_thing, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}
func.func private @outer_thing(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  %1 = stablehlo.negate %0 : tensor<6x8xf32>
  return %1 : tensor<6x8xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<6xf32>) -> tensor<6x8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<6x8xf32>
  return %2 : tensor<6x8xf32>
}

// -----

// A composite's result sharding survives as a sharding constraint on the inlined value.
// CHECK-LABEL: func.func @sharding_kept
// CHECK: %[[D:.*]] = stablehlo.multiply
// CHECK-NEXT: %[[C:.*]] = sdy.sharding_constraint %[[D]] <@mesh, [{"i"}, {}]> : tensor<6x8xf32>
// CHECK-NEXT: return %[[C]]
sdy.mesh @mesh = <["i"=2]>
func.func @sharding_kept(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>, version = 1 : i32} : (tensor<6x8xi8>, tensor<6xf32>) -> tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}
func.func private @deq(%q: tensor<6x8xi8>, %s: tensor<6xf32>) -> tensor<6x8xf32> {
  %0 = stablehlo.convert %q : (tensor<6x8xi8>) -> tensor<6x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<6xf32>) -> tensor<6x8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<6x8xf32>
  return %2 : tensor<6x8xf32>
}

// -----

// Calls inside a decomposition stay calls; their callee stays. Other composites and
// a decomposition that is still referenced elsewhere are untouched.
// CHECK-LABEL: func.func @calls_and_foreign_composites
// CHECK-NEXT: %[[C:.*]] = call @helper
// CHECK-NEXT: %[[F:.*]] = stablehlo.composite "my.op" %[[C]] {decomposition = @id
// CHECK-NEXT: return %[[F]]
// CHECK: func.func private @helper
// CHECK: func.func private @id
func.func @calls_and_foreign_composites(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.composite "hx.wrapped" %x {decomposition = @wrapped, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  %1 = stablehlo.composite "my.op" %0 {decomposition = @id, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}
func.func private @wrapped(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = func.call @helper(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @helper(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.exponential %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @id(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

// A decomposition that returns an argument directly (hx.outer is the identity).
// CHECK-LABEL: func.func @identity_decomposition
// CHECK-SAME: (%[[C:.*]]: tensor<4xf32>, %[[R:.*]]: tensor<5xf32>)
// CHECK-NEXT: return %[[C]], %[[R]]
func.func @identity_decomposition(%c: tensor<4xf32>, %r: tensor<5xf32>) -> (tensor<4xf32>, tensor<5xf32>) {
  %0:2 = stablehlo.composite "hx.outer" %c, %r {decomposition = @outer, version = 1 : i32} : (tensor<4xf32>, tensor<5xf32>) -> (tensor<4xf32>, tensor<5xf32>)
  return %0#0, %0#1 : tensor<4xf32>, tensor<5xf32>
}
func.func private @outer(%c: tensor<4xf32>, %r: tensor<5xf32>) -> (tensor<4xf32>, tensor<5xf32>) {
  return %c, %r : tensor<4xf32>, tensor<5xf32>
}

// -----

// A composite in a nested module resolves its decomposition in that module.
// CHECK-LABEL: module @outer
// CHECK: module @inner
// CHECK: func.func @nested(%[[X:.*]]: tensor<4xf32>)
// CHECK-NEXT: %[[E:.*]] = stablehlo.exponential %[[X]]
// CHECK-NEXT: return %[[E]]
module @outer {
  module @inner {
    func.func @nested(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.composite "hx.wrapped" %x {decomposition = @impl, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }
    func.func private @impl(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.exponential %x : tensor<4xf32>
      return %0 : tensor<4xf32>
    }
  }
}
