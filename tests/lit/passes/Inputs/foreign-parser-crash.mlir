// Two inputs that crash jaxlib 0.10.2's parser (a null type, a division by zero):
// each chunk is a diagnostic at its first line; the process lives on.
func.func @bounded_unregistered(%x: tensor<?x!foo.bar, #stablehlo.bounds<4>>) {
  return
}

// -----

func.func @all_to_all_no_groups(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = "stablehlo.all_to_all"(%x) {split_dimension = 1 : i64, concat_dimension = 0 : i64, split_count = 2 : i64, replica_groups = dense<0> : tensor<0x2xi64>} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
