// hxmlir-opt, the driver: input and output forms, flags, and every kind of bad
// command line. Errors are `file:line:col: error: ...` on stderr with status 1.
// UNSUPPORTED: fast

// Round trip: the output parses again and prints the same.
// RUN: hxmlir-opt %s > %t.1.mlir
// RUN: hxmlir-opt %t.1.mlir > %t.2.mlir
// RUN: diff %t.1.mlir %t.2.mlir
// RUN: filecheck %s --input-file=%t.2.mlir

// Every dialect JAX emits parses: func, StableHLO, CHLO, MHLO, sdy (and round-trips).
// RUN: hxmlir-opt %S/Inputs/opt-dialects.mlir -p hx-verify | hxmlir-opt | filecheck %s --check-prefix=DIALECTS
// DIALECTS: sdy.mesh @mesh = <["i"=2]>
// DIALECTS: chlo.erf
// DIALECTS: mhlo.add
// DIALECTS: stablehlo.multiply
// DIALECTS: sdy.sharding_constraint

// Standard input, and a pipeline mixing our passes with MLIR's (nested ones too).
// RUN: hxmlir-opt -p "hx-verify,canonicalize,func.func(cse),symbol-dce" < %s | filecheck %s
// RUN: hxmlir-opt -p "builtin.module(hx-verify,hx-decompose)" %s | filecheck %s --check-prefix=DECOMP

// Bytecode out (-o) and back in.
// RUN: hxmlir-opt %s --emit-bytecode -o %t.mlirbc
// RUN: hxmlir-opt %t.mlirbc | filecheck %s

// mlir-opt's single-dash spellings of the long flags.
// RUN: hxmlir-opt -pass-pipeline=hx-verify,hx-decompose -split-input-file -allow-unregistered-dialect %s | filecheck %s --check-prefix=DECOMP
// RUN: hxmlir-opt %s -emit-bytecode -o %t.dash.mlirbc
// RUN: hxmlir-opt %t.dash.mlirbc -mlir-print-debuginfo | filecheck %s --check-prefix=LOC
// RUN: hxmlir-opt -list-passes | filecheck %s --check-prefix=LIST

// Locations on request.
// RUN: hxmlir-opt %s --mlir-print-debuginfo | filecheck %s --check-prefix=LOC
// LOC: stablehlo.composite "hx.dequantize"{{.*}} loc(#[[L:loc[0-9]*]])
// LOC: #[[L]] = loc("{{.*}}hxmlir-opt.mlir":{{[0-9]+}}:{{[0-9]+}})

// IR after each pass, and timings, on stderr.
// RUN: hxmlir-opt %s -p hx-verify,canonicalize --print-ir-after-all 2>&1 >/dev/null | filecheck %s --check-prefix=AFTER
// AFTER: // -----// IR Dump After hx-verify //----- //
// AFTER: func.func @main
// AFTER: // -----// IR Dump After canonicalize //----- //
// RUN: hxmlir-opt %s -p hx-verify --timing 2>&1 >/dev/null | filecheck %s --check-prefix=TIME
// TIME: Execution time report
// TIME: hx-verify
// TIME: Total

// RUN: hxmlir-opt --list-passes | filecheck %s --check-prefix=LIST
// LIST: hxmlir passes:
// LIST: hx-check-export
// LIST-NEXT: allow-targets=str, ';'-separated list (default '')
// LIST: hx-decompose
// LIST: hx-fold-scales
// LIST-NEXT: form-matmul-q=bool (default True)
// LIST: hx-verify
// LIST: MLIR passes
// LIST: canonicalize
// RUN: hxmlir-opt --version | filecheck %s --check-prefix=VERSION
// VERSION: hxmlir-opt (hxmlir {{[0-9.]+}}), jax 0.10.{{[0-9]+}}, jaxlib 0.10.{{[0-9]+}}

// Bad command lines.
// RUN: not hxmlir-opt %s -p canonicalize,hx-verfy 2>&1 | filecheck %s --check-prefix=UNKNOWN
// UNKNOWN: <pass-pipeline>:1:14: error: unknown pass 'hx-verfy' (did you mean 'hx-verify'?): 'hx-verfy' does not refer to a registered pass or pass pipeline
// UNKNOWN-NEXT: hxmlir passes: hx-check-export, hx-decompose, hx-fold-scales, hx-verify
// UNKNOWN-NEXT: MLIR passes (jaxlib): canonicalize,
// RUN: not hxmlir-opt %s -p "hx-verify,hx-fold-scales{bogus=1}" 2>&1 | filecheck %s --check-prefix=BADOPT
// BADOPT: <pass-pipeline>:1:26: error: hx-fold-scales: unknown option 'bogus'; valid options: form-matmul-q
// RUN: not hxmlir-opt %s -p "hx-fold-scales{form-matmul-q=maybe}" 2>&1 | filecheck %s --check-prefix=BADVAL
// BADVAL: error: hx-fold-scales: option 'form-matmul-q' must be true or false, got 'maybe'
// Options of MLIR's own passes: the option is named, not the pass, and MLIR's own
// stderr line is part of the one diagnostic.
// RUN: not hxmlir-opt %s -p "canonicalize{bogus=1}" 2>&1 | filecheck %s --check-prefix=NATIVEOPT
// NATIVEOPT: <pass-pipeline>:1:1: error: canonicalize: bad option for MLIR pass 'canonicalize': no such option bogus (in 'canonicalize{bogus=1}')
// NATIVEOPT-NOT: did you mean
// RUN: not hxmlir-opt %s -p "cse,canonicalize{max-iterations=abc}" 2>&1 | filecheck %s --check-prefix=NATIVEVAL
// NATIVEVAL: <pass-pipeline>:1:5: error: canonicalize: bad option for MLIR pass 'canonicalize': for the --max-iterations option: 'abc' value invalid for long argument! (in 'canonicalize{max-iterations=abc}')
// NATIVEVAL-NOT: {{.}}
// An output file that cannot be opened, and a flag given twice.
// RUN: not hxmlir-opt %s -o %t.no/such/dir/x.mlir 2>&1 | filecheck %s --check-prefix=NOOUT
// NOOUT: hxmlir-opt: error: could not open output file '{{.*}}x.mlir': No such file or directory
// RUN: not hxmlir-opt %s -o %S 2>&1 | filecheck %s --check-prefix=DIROUT
// DIROUT: hxmlir-opt: error: could not open output file '{{.*}}': Is a directory
// RUN: not hxmlir-opt %s -p cse -p canonicalize 2>&1 | filecheck %s --check-prefix=TWICE
// TWICE: hxmlir-opt: error: -p given twice ('cse', then 'canonicalize'); give one pipeline, its passes separated by ','
// Empty pass names, and ',' inside a ';'-separated option value.
// RUN: not hxmlir-opt %s -p "hx-verify,," 2>&1 | filecheck %s --check-prefix=EMPTY
// EMPTY: <pass-pipeline>:1:11: error: empty pass name in pipeline 'hx-verify,,' (a stray ','?)
// RUN: not hxmlir-opt %s -p "hx-check-export{allow-targets=a,b}" 2>&1 | filecheck %s --check-prefix=LISTSEP
// LISTSEP: error: hx-check-export: option 'allow-targets' separates its values with ';', got 'a,b'; ',' separates passes (write allow-targets=a;b)
// RUN: not hxmlir-opt %s -p "hx-verify,{" 2>&1 | filecheck %s --check-prefix=BRACE
// BRACE: error: unbalanced brackets or quotes in pass pipeline
// RUN: not hxmlir-opt %s --frobnicate 2>&1 | filecheck %s --check-prefix=FLAG
// FLAG: hxmlir-opt: error: unrecognized arguments: --frobnicate
// RUN: not hxmlir-opt %S/Inputs/does-not-exist.mlir 2>&1 | filecheck %s --check-prefix=MISSING
// MISSING: hxmlir-opt: error: could not open input file '{{.*}}does-not-exist.mlir': No such file or directory

// Malformed input: the parser's diagnostic, with the file's line and column.
// RUN: not hxmlir-opt %S/Inputs/opt-malformed.mlir 2>&1 | filecheck %s --check-prefix=MALFORMED
// MALFORMED: opt-malformed.mlir:3:10: error: use of value '%0' expects different type than prior uses: 'tensor<3xf32>' vs 'tensor<4xf32>'
// MALFORMED-NEXT: opt-malformed.mlir:2:3: note: prior use here
// MALFORMED-NOT: Traceback

// Ops of unregistered dialects need the flag.
// RUN: not hxmlir-opt %S/Inputs/opt-unregistered.mlir 2>&1 | filecheck %s --check-prefix=UNREG
// UNREG: opt-unregistered.mlir:2:24: error: operation being parsed with an unregistered dialect
// RUN: hxmlir-opt --allow-unregistered-dialect %S/Inputs/opt-unregistered.mlir | filecheck %s --check-prefix=UNREGOK
// UNREGOK: "mydialect.frob"(%arg0)

// A pass that reports problems fails the run: every problem, then the pass's name.
// RUN: not hxmlir-opt -p hx-verify %S/Inputs/opt-wrong-expectations.mlir 2>&1 | filecheck %s --check-prefix=PASSFAIL
// PASSFAIL: hx-verify: 1 problem found
// PASSFAIL-NEXT: opt-wrong-expectations.mlir:3:8: error: 'hx.bogus' is not a known hx composite

// --verify-diagnostics reports expectations that were not met, and unexpected diagnostics.
// RUN: not hxmlir-opt -p hx-verify --verify-diagnostics %S/Inputs/opt-wrong-expectations.mlir 2>&1 | filecheck %s --check-prefix=EXPECT
// EXPECT-DAG: opt-wrong-expectations.mlir:3:8: error: unexpected error: 'hx.bogus' is not a known hx composite
// EXPECT-DAG: opt-wrong-expectations.mlir:2:6: error: expected error "this message is not what hx-verify says" was not produced
// EXPECT-DAG: opt-wrong-expectations.mlir:4:6: error: expected warning "nothing warns here" was not produced

// Regex annotations (MLIR's -re kinds): a match passes; a miss, or an unknown kind, fails.
// RUN: hxmlir-opt -p hx-verify --verify-diagnostics %S/Inputs/opt-expected-re.mlir
// RUN: not hxmlir-opt -p hx-verify --verify-diagnostics --split-input-file %S/Inputs/opt-expected-re-wrong.mlir 2>&1 | filecheck %s --check-prefix=EXPECTRE
// EXPECTRE-DAG: opt-expected-re-wrong.mlir:4:8: error: unexpected error: 'hx.bogus' is not a known hx composite
// EXPECTRE-DAG: opt-expected-re-wrong.mlir:3:6: error: expected error matching "'hx.{{[{][{]}}[0-9]+{{[}][}]}}' is not a known hx composite" was not produced
// EXPECTRE-DAG: opt-expected-re-wrong.mlir:15:6: error: unknown annotation 'expected-errors'

// CHECK-LABEL: func.func @main
// CHECK-NEXT: stablehlo.composite "hx.dequantize"
// DECOMP-LABEL: func.func @main
// DECOMP-NEXT: stablehlo.convert
// DECOMP-NOT: hx.dequantize
func.func @main(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.convert %q : (tensor<4x8xi8>) -> tensor<4x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}
