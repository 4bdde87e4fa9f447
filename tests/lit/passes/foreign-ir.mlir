// hxmlir-opt on IR nobody here wrote, in the shapes StableHLO's own test corpus has:
// declarations, aliases, complex constants, op-verifier errors under
// --verify-diagnostics, inputs that crash jaxlib's parser, generic printing.
// Every hx pass runs on each chunk; none may fail on IR without hx ops.

// RUN: hxmlir-opt %s --split-input-file -p hx-verify,hx-decompose,hx-fold-scales | filecheck %s
// RUN: hxmlir-opt %s --split-input-file --mlir-print-op-generic | hxmlir-opt --split-input-file | filecheck %s
// RUN: hxmlir-opt %S/Inputs/foreign-verifier-errors.mlir --split-input-file --verify-diagnostics -p hx-verify,hx-decompose,hx-fold-scales
// RUN: not hxmlir-opt %S/Inputs/foreign-parser-crash.mlir --split-input-file -p hx-verify 2>&1 | filecheck %s --check-prefix=CRASH

// CRASH: foreign-parser-crash.mlir:3:1: error: cannot parse this input: MLIR's parser crashed on it (signal SIGSEGV)
// CRASH: foreign-parser-crash.mlir:9:1: error: cannot parse this input: MLIR's parser crashed on it (signal SIGFPE)
// CRASH-NOT: error

// CHECK-LABEL: func.func private @external(tensor<f32>) -> tensor<f32>
// CHECK-LABEL: func.func @calls_external
// CHECK: call @external
func.func private @external(tensor<f32>) -> tensor<f32>
func.func @calls_external(%x: tensor<f32>) -> tensor<f32> {
  %0 = func.call @external(%x) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// Aliases and several top-level ops: wrapped into one module, the aliases outside it.
!vec = tensor<4xf32>
#dims = array<i64: 0>
// CHECK-LABEL: func.func @first(%arg0: tensor<4xf32>) -> tensor<4xf32>
func.func @first(%x: !vec) -> !vec {
  return %x : !vec
}
// CHECK-LABEL: func.func @second
func.func @second(%x: !vec) -> !vec {
  %0 = stablehlo.transpose %x, dims = [0] : (!vec) -> !vec
  return %0 : !vec
}

// -----

// Complex constants (attributes the Python bindings have no class for).
// CHECK-LABEL: func.func @complex_constant
// CHECK: stablehlo.constant dense<(1.000000e+00,2.000000e+00)> : tensor<complex<f32>>
func.func @complex_constant(%x: tensor<complex<f32>>) -> tensor<complex<f32>> {
  %c = stablehlo.constant dense<(1.0, 2.0)> : tensor<complex<f32>>
  %0 = stablehlo.multiply %x, %c : tensor<complex<f32>>
  return %0 : tensor<complex<f32>>
}

// -----

// A while loop whose block types refine its operand types: the generic form
// round-trips it (second RUN line).
// CHECK-LABEL: func.func @while_refines
// CHECK: stablehlo.while
func.func @while_refines(%x: tensor<4xf32>) -> tensor<?xf32> {
  %0 = "stablehlo.while"(%x) ({
  ^bb0(%a: tensor<?xf32>):
    %c = stablehlo.constant dense<false> : tensor<i1>
    stablehlo.return %c : tensor<i1>
  }, {
  ^bb0(%a: tensor<?xf32>):
    stablehlo.return %a : tensor<?xf32>
  }) : (tensor<4xf32>) -> tensor<?xf32>
  return %0 : tensor<?xf32>
}
