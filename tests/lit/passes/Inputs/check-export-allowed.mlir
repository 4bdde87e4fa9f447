// Input of hx-check-export.mlir: a target accepted through allow-targets.

func.func @allowed(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.custom_call @my_ffi(%arg0) {api_version = 4 : i32} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
