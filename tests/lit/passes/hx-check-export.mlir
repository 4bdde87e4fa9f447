// RUN: hxmlir-opt -p hx-check-export --split-input-file %s | filecheck %s
// RUN: hxmlir-opt -p hx-check-export --verify-diagnostics %S/Inputs/check-export-bad.mlir
// RUN: not hxmlir-opt -p hx-check-export %S/Inputs/check-export-bad.mlir 2>&1 | filecheck %s --check-prefix=ERR
// RUN: hxmlir-opt -p "hx-check-export{allow-targets=my_ffi}" --split-input-file %S/Inputs/check-export-allowed.mlir | filecheck %s --check-prefix=ALLOW

// Custom calls on JAX's stable list pass untouched (LAPACK FFI, Mosaic TPU).

// CHECK-LABEL: func.func @stable_targets
// CHECK: stablehlo.custom_call @lapack_sgetrf_ffi
// CHECK: stablehlo.custom_call @tpu_custom_call
func.func @stable_targets(%arg0: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %0:3 = stablehlo.custom_call @lapack_sgetrf_ffi(%arg0) {api_version = 4 : i32} : (tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4xi32>, tensor<i32>)
  %1 = stablehlo.custom_call @tpu_custom_call(%0#0) {backend_config = "{}", kernel_name = "anything"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  return %1 : tensor<4x4xf32>
}

// -----

// A module without custom calls passes.

// CHECK-LABEL: func.func @no_custom_calls
// CHECK-NEXT: stablehlo.add
func.func @no_custom_calls(%arg0: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %arg0, %arg0 : tensor<2xf32>
  return %0 : tensor<2xf32>
}

// ERR: check-export-bad.mlir:6:8: error: 3 custom calls are not export-stable (neither on jax.export's stable list nor a registered hxmlir kernel):
// ERR-NEXT: check-export-bad.mlir:6:8: custom call @__gpu$xla.gpu.triton, kernel 'my_kernel' is not registered
// ERR-NEXT: check-export-bad.mlir:7:8: custom call @__gpu$xla.gpu.triton, kernel 'hx_matmul_q_v999' is not registered
// ERR-NEXT: check-export-bad.mlir:8:8: custom call @my_ffi (no kernel name)
// ERR-NEXT: to allow a kernel, register it with hxmlir.targets.register_kernel(target, name, version, platforms)
// ERR-SAME: hx-check-export{allow-targets=<target>}

// ALLOW-LABEL: func.func @allowed
// ALLOW: stablehlo.custom_call @my_ffi
