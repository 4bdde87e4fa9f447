// A regex that does not match is reported; the literal parts are not regexes.
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error-re @+1 {{'hx.{{[0-9]+}}' is not a known hx composite}}
  %0 = stablehlo.composite "hx.bogus" %x {decomposition = @id, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @id(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

// An annotation kind MLIR does not know is an error, not silently ignored.
func.func @g(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-errors @+1 {{is not a known hx composite}}
  %0 = stablehlo.composite "hx.bogus" %x {decomposition = @id, version = 1 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @id(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
