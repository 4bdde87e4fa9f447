// hx.attention on CPU (custom call targets "hx_attention_cpu_v1" and "_v2"): grouped-query
// attention of T queries over one layer's KV cache with a causal position bound, and (v2) a
// sliding window and a soft cap on the scores.
//
//   q: f32[T, kv, g, d]   k: f32[kv, C, d]   v: f32[kv, d, C]   start: s32[]
//     -> out: f32[T, kv, g, d]
//   n(t) = clamp(start + t + 1, 0, C)           (positions query t may read)
//   l(t) = window > 0 ? clamp(start + t + 1 - window, 0, n(t)) : 0      (v2: the first)
//   s[t, h, j, c] = scale * (q[t, h, j, :] . k[h, c, :])          c in [l(t), n(t))
//   s = softcap * tanh(s / softcap)                               (v2, softcap > 0)
//   out[t, h, j, :] = sum_c softmax_c(s[t, h, j, :]) * v[h, :, c]
//
// v3: a batch of B >= 1 such problems in one call, each element b its own start[b] (v2's
// attributes):
//
//   q: f32[B, T, kv, g, d]   k: f32[B, kv, C, d] or f32[kv, C, d] (one cache shared by
//   every element)   v: f32[B, kv, d, C] or f32[kv, d, C]   start: s32[B]
//     -> out: f32[B, T, kv, g, d],  out[b] = v2(q[b], k[b], v[b], start[b])
//
// Positions outside [l(t), n(t)) are never read, so the cache beyond start + t may hold anything
// (NaN included). start + t >= C reads all C positions (clamped: never out of bounds). A
// query with no position (start + t < 0) gets the mean of v[h, :, c] over all C positions,
// which is what the reference (lowering/reference.py: attention, a where-mask filling
// f32's lowest value, then softmax) computes for a row masked everywhere.
//
// This header is the interface between the FFI handler (attention_ffi.cc: checks,
// threading, ISA choice) and the per-ISA kernels (attention.inc, compiled once per ISA).
#ifndef HXMLIR_CSRC_ATTENTION_H_
#define HXMLIR_CSRC_ATTENTION_H_

#include <cstdint>

namespace hxmlir {

struct AttentionProblem {
  const float* q;  // f32[T, kv, g, d]
  const float* k;  // f32[kv, C, d]
  const float* v;  // f32[kv, d, C]
  float* out;      // f32[T, kv, g, d]
  int64_t t, kv, g, d, c;
  int64_t start;
  float scale;
  int64_t window = 0;   // 0: no window (v1)
  float softcap = 0.f;  // 0: no cap (v1)
};

// The kernels of one ISA.
struct AttentionKernels {
  const char* isa;  // "avx512", "avx2", "generic"
  // out[t, h, :, :] for query t and KV head h: the g queries of the head together (each
  // key row and value row read once for all g). `scratch`: at least
  // AttentionScratchFloats(p.c) floats (the scores, then the probabilities, of up to four
  // queries).
  void (*head)(const AttentionProblem& p, int64_t t, int64_t h, float* scratch);
};

constexpr int64_t AttentionScratchFloats(int64_t c) { return 4 * ((c + 15) / 16 * 16); }

const AttentionKernels* AttentionKernelsGeneric();
#if defined(HXMLIR_HAVE_X86_ISAS)
const AttentionKernels* AttentionKernelsAvx2();
const AttentionKernels* AttentionKernelsAvx512();
#endif

// Use the kernels of ISA `name` ("avx512", "avx2", "generic") from now on; false if none
// of that name were compiled in. hxmlir._matmul_q_cpu.select_isa calls it.
bool SelectAttentionIsa(const char* name);
const AttentionKernels* SelectedAttentionKernels();

}  // namespace hxmlir

struct XLA_FFI_Error;
struct XLA_FFI_CallFrame;
// The FFI handlers of "hx_attention_cpu_v1", "_v2" and "_v3" (attention_ffi.cc).
extern "C" XLA_FFI_Error* HxAttentionCpuV1(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* HxAttentionCpuV2(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* HxAttentionCpuV3(XLA_FFI_CallFrame* call_frame);

#endif  // HXMLIR_CSRC_ATTENTION_H_
