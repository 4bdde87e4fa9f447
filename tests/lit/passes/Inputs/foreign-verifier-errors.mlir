// Op-verifier errors as StableHLO's tests annotate them: MLIR's "see current
// operation" note is not expected (mlir-opt turns it off in verify mode).
func.func @shape_mismatch(%a: tensor<2xf32>) -> tensor<3xf32> {
  // expected-error @+1 {{op requires the same shape for all operands and results}}
  %0 = "stablehlo.add"(%a, %a) : (tensor<2xf32>, tensor<2xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

func.func @bad_dims(%a: tensor<2x3xf32>) -> tensor<3x2xf32> {
  // expected-error @+2 {{attribute permutation must be a permutation of [0, 1] but got 0, 0}}
  // expected-error @+1 {{'stablehlo.transpose' op failed to infer returned types}}
  %0 = stablehlo.transpose %a, dims = [0, 0] : (tensor<2x3xf32>) -> tensor<3x2xf32>
  return %0 : tensor<3x2xf32>
}

// -----

// expected-error @+1 {{expected non-function type}}
func.func @syntax( {
