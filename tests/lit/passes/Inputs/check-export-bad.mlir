// Input of hx-check-export.mlir: custom calls that are not export-stable.
// A user's Triton kernel, a Triton kernel named like an unregistered hxmlir
// kernel version, and an unknown FFI target: one error lists all three.

func.func @unstable(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.custom_call @__gpu$xla.gpu.triton(%arg0) {backend_config = "", mhlo.backend_config = {name = "my_kernel", num_warps = 4 : i32}} : (tensor<8xf32>) -> tensor<8xf32> // expected-error {{3 custom calls are not export-stable}}
  %1 = stablehlo.custom_call @__gpu$xla.gpu.triton(%0) {backend_config = "", mhlo.backend_config = {name = "hx_matmul_q_v999", num_warps = 4 : i32}} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = stablehlo.custom_call @my_ffi(%1) {api_version = 4 : i32} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
