// `expected-*-re`: literal text in which {{...}} parts are regular expressions.
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error-re @+1 {{'hx.{{[a-z]+}}' is not a known hx {{(composite|op)}}}}
  %0 = stablehlo.composite "hx.bogus" %x {decomposition = @id, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @id(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
