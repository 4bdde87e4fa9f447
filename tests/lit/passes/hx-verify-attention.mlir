// RUN: hxmlir-opt %s -p hx-verify --split-input-file --verify-diagnostics | filecheck %s
// hx-verify on hx.attention (lowering/schema.py): q: f32[T, kv, g, d], k: f32[kv, C, d],
// v: f32[kv, d, C], start: i32[] -> q's type, the scale in composite_attributes.

// CHECK-LABEL: func.func @attention_ok
// CHECK: stablehlo.composite "hx.attention" %arg0, %arg1, %arg2, %arg3 {composite_attributes = {scale = 1.250000e-01 : f32}, decomposition = @att, version = 1 : i32}
func.func @attention_ok(%q: tensor<2x3x3x64xf32>, %k: tensor<3x8x64xf32>, %v: tensor<3x64x8xf32>, %s: tensor<i32>) -> tensor<2x3x3x64xf32> {
  %0 = stablehlo.composite "hx.attention" %q, %k, %v, %s {composite_attributes = {scale = 1.250000e-01 : f32}, decomposition = @att, version = 1 : i32} : (tensor<2x3x3x64xf32>, tensor<3x8x64xf32>, tensor<3x64x8xf32>, tensor<i32>) -> tensor<2x3x3x64xf32>
  return %0 : tensor<2x3x3x64xf32>
}
func.func private @att(%q: tensor<2x3x3x64xf32>, %k: tensor<3x8x64xf32>, %v: tensor<3x64x8xf32>, %s: tensor<i32>) -> tensor<2x3x3x64xf32> {
  return %q : tensor<2x3x3x64xf32>
}

// -----

func.func @attention_bad_k(%q: tensor<1x3x3x64xf32>, %k: tensor<3x8x32xf32>, %v: tensor<3x64x8xf32>, %s: tensor<i32>) -> tensor<1x3x3x64xf32> {
  // expected-error @+1 {{'hx.attention' expects (q: f32[T, kv, g, d], k: f32[kv, C, d], v: f32[kv, d, C], start: i32[]) -> f32[T, kv, g, d], got q: f32[1,3,3,64], k: f32[3,8,32], v: f32[3,64,8], start: i32[]}}
  %0 = stablehlo.composite "hx.attention" %q, %k, %v, %s {composite_attributes = {scale = 1.250000e-01 : f32}, decomposition = @att, version = 1 : i32} : (tensor<1x3x3x64xf32>, tensor<3x8x32xf32>, tensor<3x64x8xf32>, tensor<i32>) -> tensor<1x3x3x64xf32>
  return %0 : tensor<1x3x3x64xf32>
}
func.func private @att(%q: tensor<1x3x3x64xf32>, %k: tensor<3x8x32xf32>, %v: tensor<3x64x8xf32>, %s: tensor<i32>) -> tensor<1x3x3x64xf32> {
  return %q : tensor<1x3x3x64xf32>
}

// -----

func.func @attention_no_scale(%q: tensor<1x3x3x64xf32>, %k: tensor<3x8x64xf32>, %v: tensor<3x64x8xf32>, %s: tensor<i32>) -> tensor<1x3x3x64xf32> {
  // expected-error @+1 {{'hx.attention' composite_attributes must have keys ['scale'], got []}}
  %0 = stablehlo.composite "hx.attention" %q, %k, %v, %s {decomposition = @att, version = 1 : i32} : (tensor<1x3x3x64xf32>, tensor<3x8x64xf32>, tensor<3x64x8xf32>, tensor<i32>) -> tensor<1x3x3x64xf32>
  return %0 : tensor<1x3x3x64xf32>
}
func.func private @att(%q: tensor<1x3x3x64xf32>, %k: tensor<3x8x64xf32>, %v: tensor<3x64x8xf32>, %s: tensor<i32>) -> tensor<1x3x3x64xf32> {
  return %q : tensor<1x3x3x64xf32>
}

// -----

func.func @attention_bad_result(%q: tensor<1x3x3x64xf32>, %k: tensor<3x8x64xf32>, %v: tensor<3x64x8xf32>, %s: tensor<i32>) -> tensor<1x3x3x8xf32> {
  // expected-error @+1 {{'hx.attention' result must be q's type f32[1,3,3,64], got f32[1,3,3,8]}}
  %0 = stablehlo.composite "hx.attention" %q, %k, %v, %s {composite_attributes = {scale = 1.250000e-01 : f32}, decomposition = @att, version = 1 : i32} : (tensor<1x3x3x64xf32>, tensor<3x8x64xf32>, tensor<3x64x8xf32>, tensor<i32>) -> tensor<1x3x3x8xf32>
  return %0 : tensor<1x3x3x8xf32>
}
func.func private @att(%q: tensor<1x3x3x64xf32>, %k: tensor<3x8x64xf32>, %v: tensor<3x64x8xf32>, %s: tensor<i32>) -> tensor<1x3x3x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<1x3x3x8xf32>
  return %0 : tensor<1x3x3x8xf32>
}

// -----

// Version 3 (jax.vmap of hx.attention): a batch of 2, each its own start, over one cache
// shared by both (k and v without the batch axis).
// CHECK-LABEL: func.func @attention_batch_ok
// CHECK: stablehlo.composite "hx.attention" %arg0, %arg1, %arg2, %arg3 {{.*}}version = 3 : i32}
func.func @attention_batch_ok(%q: tensor<2x1x3x3x64xf32>, %k: tensor<3x8x64xf32>, %v: tensor<3x64x8xf32>, %s: tensor<2xi32>) -> tensor<2x1x3x3x64xf32> {
  %0 = stablehlo.composite "hx.attention" %q, %k, %v, %s {composite_attributes = {scale = 1.250000e-01 : f32, softcap = 0.000000e+00 : f32, window = 0 : i64}, decomposition = @att, version = 3 : i32} : (tensor<2x1x3x3x64xf32>, tensor<3x8x64xf32>, tensor<3x64x8xf32>, tensor<2xi32>) -> tensor<2x1x3x3x64xf32>
  return %0 : tensor<2x1x3x3x64xf32>
}
func.func private @att(%q: tensor<2x1x3x3x64xf32>, %k: tensor<3x8x64xf32>, %v: tensor<3x64x8xf32>, %s: tensor<2xi32>) -> tensor<2x1x3x3x64xf32> {
  return %q : tensor<2x1x3x3x64xf32>
}

// -----

func.func @attention_batch_bad_start(%q: tensor<2x1x3x3x64xf32>, %k: tensor<2x3x8x64xf32>, %v: tensor<2x3x64x8xf32>, %s: tensor<3xi32>) -> tensor<2x1x3x3x64xf32> {
  // expected-error @+1 {{'hx.attention' expects (q: f32[B, T, kv, g, d], k: f32[B, kv, C, d] or f32[kv, C, d], v: f32[B, kv, d, C] or f32[kv, d, C] (as k), start: i32[B]) -> f32[B, T, kv, g, d], got q: f32[2,1,3,3,64], k: f32[2,3,8,64], v: f32[2,3,64,8], start: i32[3]}}
  %0 = stablehlo.composite "hx.attention" %q, %k, %v, %s {composite_attributes = {scale = 1.250000e-01 : f32, softcap = 0.000000e+00 : f32, window = 0 : i64}, decomposition = @att, version = 3 : i32} : (tensor<2x1x3x3x64xf32>, tensor<2x3x8x64xf32>, tensor<2x3x64x8xf32>, tensor<3xi32>) -> tensor<2x1x3x3x64xf32>
  return %0 : tensor<2x1x3x3x64xf32>
}
func.func private @att(%q: tensor<2x1x3x3x64xf32>, %k: tensor<2x3x8x64xf32>, %v: tensor<2x3x64x8xf32>, %s: tensor<3xi32>) -> tensor<2x1x3x3x64xf32> {
  return %q : tensor<2x1x3x3x64xf32>
}
