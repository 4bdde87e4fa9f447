func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{this message is not what hx-verify says}}
  %0 = stablehlo.composite "hx.bogus" %x {decomposition = @id, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  // expected-warning @+1 {{nothing warns here}}
  return %0 : tensor<4xf32>
}
func.func private @id(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
