// RUN: hxmlir-opt %s -p hx-decompose --split-input-file --verify-diagnostics
// hx-decompose's errors, each at the composite it concerns.

func.func @missing(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'hx.wrapped' cannot be inlined: decomposition @nowhere is not a func.func with a body in this module}}
  %0 = stablehlo.composite "hx.wrapped" %x {decomposition = @nowhere, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @nowhere(%x: tensor<4xf32>) -> tensor<4xf32>

// -----

// A decomposition that uses itself never inlines away: reported once, at the
// composite inside the decomposition (where every inlined copy comes from).
func.func @recursive(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.composite "hx.loop" %x {decomposition = @loop, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @loop(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'hx.loop' is still present after inlining 64 levels: its decomposition uses itself}}
  %0 = stablehlo.composite "hx.loop" %x {decomposition = @loop, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
