# RUN: %python %s | filecheck %s
# The IR of mylayer.dense, printed by hxmlir.testing.print_ir for FileCheck: argument
# types are written as hxmlir prints them (a dict argument in {...}).
import mylayer

from hxmlir.testing import print_ir

ARGS = ("f32[8,512]", "{w: q8[512,256], b: f32[256]}")

# As JAX emits it: the weight is dequantized, then an f32 dot.
print_ir("dense", mylayer.dense, *ARGS)
# CHECK-LABEL: TEST: dense f32[8,512] {b:f32[256],w:q8[512,256]}
# CHECK: func.func public @main(%[[X:.*]]: tensor<8x512xf32>, %[[B:.*]]: tensor<256xf32>, %[[Q:.*]]: tensor<512x256xi8>, %[[S:.*]]: tensor<512xf32>)
# CHECK-NEXT: %[[W:.*]] = stablehlo.composite "hx.dequantize" %[[Q]], %[[S]]
# CHECK-NEXT: stablehlo.dot_general %[[X]], %[[W]]

# Through hxmlir's pass pipeline (what jit compiles after hx.install()): the scales
# are folded, the int8 weight feeds hx.matmul_q and is never expanded.
print_ir("dense_installed", mylayer.dense, *ARGS, passes=True)
# CHECK-LABEL: TEST: dense_installed
# CHECK: func.func public @main(%[[X:.*]]: tensor<8x512xf32>, %{{.*}}: tensor<256xf32>, %[[Q:.*]]: tensor<512x256xi8>, %[[S:.*]]: tensor<512xf32>)
# CHECK-NEXT: stablehlo.composite "hx.matmul_q" %[[X]], %[[Q]], %[[S]]
# CHECK-NOT: hx.dequantize

# Sharded over a 4-device mesh (no devices needed to lower): batch rows over "i".
print_ir("dense_sharded", mylayer.dense, "f32[8@i,512]", "{w: q8[512,256], b: f32[256]}",
         mesh="i=4")
# CHECK-LABEL: TEST: dense_sharded f32[8@i,512]
# CHECK: sdy.mesh @mesh = <["i"=4]>
# CHECK: %{{.*}}: tensor<8x512xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"i"}, {}]>}
