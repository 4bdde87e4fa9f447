// The same layer from the command line: `hxmlir lower MODULE:FUNCTION --arg TYPE`
// prints its StableHLO (through the installed pass pipeline unless --no-passes), and
// hxmlir-opt runs passes on it like any other module.

// RUN: hxmlir lower %src/mylayer.py:dense --arg 'f32[8,512]' --arg '{w: q8[512,256], b: f32[256]}' | filecheck %s
// CHECK-LABEL: func.func public @main
// CHECK: stablehlo.composite "hx.matmul_q"
// CHECK-NOT: hx.dequantize

// RUN: hxmlir lower mylayer:dense --arg 'f32[8,512]' --arg '{w: q8[512,256], b: f32[256]}' --no-passes \
// RUN:   | hxmlir-opt -p hx-verify,hx-fold-scales | filecheck %s --check-prefix=OPT
// OPT-LABEL: func.func public @main
// OPT: stablehlo.composite "hx.matmul_q"
// OPT-NOT: hx.dequantize

// RUN: not hxmlir lower mylayer:dense --arg 'f32[8,x]' 2>&1 | filecheck %s --check-prefix=BAD
// BAD: hxmlir lower: error: TypeStrError: --arg 1 'f32[8,x]': column 7: expected a dimension size (an integer), got 'x'
