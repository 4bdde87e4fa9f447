// hx.matmul_q on CPU for every quantization format of hxmlir (hxmlir/formats.py,
// the one place that defines them), in hx.matmul_q's main layout: the weight
// Q[k, n] is quantized along n (its last, free axis) and y = x @ dequantize(Q):
//
//   x: f32[nb, m, k]   q: stored values [nb, k, n / pack]   s: f32[nb, k] or f32[nb, k, n / g]
//   y[b, i, j] = sum_kk x[b, i, kk] * value(q[b, kk, j]) * s[b, kk, j / g]     (f32[nb, m, n])
//
// Formats (value(.) of one dense element; formats.py, "Layout"):
//   int8            s8, one byte per value, layout "plain".
//   int4            u8, two values per byte, layout "int4_pairs_v1": dense element 2j
//                   is the low nibble (bits 0-3) of byte j, 2j + 1 the high nibble,
//                   each a 4-bit two's-complement integer in [-8, 7].
//   float8_e4m3fn   one byte per value, layout "plain": sign bit 7, exponent bits 6-3
//                   (bias 7), mantissa bits 2-0; exponent 0 is subnormal (m / 8 * 2^-6);
//                   0x7F and 0xFF are NaN (no infinities). Decoded exactly, as
//                   hx.dequantize's convert does.
// Scales: one per row of q (g = n, ns = 1) or one per group of g consecutive dense
// elements of a row (ns = n / g; int4 needs g even, so a byte never straddles groups).
//
// This header is the interface between the FFI handler (matmul_q_formats_ffi.cc,
// target "hx_matmul_q_cpu_v2": threading, dispatch, validation) and the per-ISA
// kernels (matmul_q_formats.inc, compiled into each ISA's translation unit after
// matmul_q_kernels.inc, whose register-tiled Micro loop it reuses).
#ifndef HXMLIR_CSRC_MATMUL_Q_FORMATS_H_
#define HXMLIR_CSRC_MATMUL_Q_FORMATS_H_

#include <cstdint>

#include "matmul_q_format_table.h"

namespace hxmlir {

struct FormatProblem {
  const float* x;    // f32[nb, m, k]
  const uint8_t* q;  // stored values, [nb, k, n / pack] bytes
  const float* s;    // f32[nb, k, ns]
  // Regimes "blocks" and "panel" only (else null): x packed by PackRowGroups
  // (matmul_q_parallel.h) in groups of the kernels' block_mr / panel_mr rows, without a scale.
  const float* xp;
  float* y;          // f32[nb, m, n]
  int64_t nb, m, k, n;
  int64_t g;         // group size along n (n for one scale per row)
  int64_t ns;        // scales per row of q: n / g
  QFormat fmt;
};

// The format kernels of one ISA. Every function computes a disjoint part of the
// work and may run on any thread; none allocates shared state.
//
// Numerics: every output element is an f32 sum over k, in increasing kk, of one
// product per kk: regime "rows" adds fl(x * s) * value(q) (the scale folded into x,
// as the int8 kernel does), regimes "panel" and "blocks" add x * fl(value(q) * s) (the
// weight decoded in registers, or a block of it decoded once, scale applied). Each is within gamma_{k+1} * sum_kk |x s q| of
// the exact value (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
// section 3.1); "rows" adds its chunks of k at the end, in chunk order.
struct FormatKernels {
  const char* isa;    // "avx512", "avx2", "generic"
  int64_t block_nr;   // "blocks": column blocks are multiples of this
  int64_t block_mr;   // "blocks": rows of x per group (PackRowGroups)
  int64_t panel_nr;   // "panel": column blocks are multiples of this
  int64_t panel_mr;   // "panel": rows of x per group (PackRowGroups)
  // Regime "rows" (small m): acc[m, n] = sum_{kk in [k0, k1)} x[b, :, kk] w[b, kk, :]
  // (overwrites acc, row stride n), in the lane order of RowsOrder: rows_finish
  // turns a row of acc (after the chunks are added) into y's order, in place.
  void (*rows)(const FormatProblem& p, int64_t b, int64_t k0, int64_t k1, float* acc);
  void (*rows_finish)(const FormatProblem& p, float* row);
  // Regime "blocks" (larger m): y[b, :, j0:j1] = x[b] @ w[b, :, j0:j1], the weight
  // decoded kFormatKc rows at a time into `scratch` (FormatScratchFloats(j1 - j0)
  // floats) as f32 micro-panels, then the register-tiled f32 loop.
  void (*blocks)(const FormatProblem& p, int64_t b, int64_t j0, int64_t j1, float* scratch);
  // Regime "panel" (m > 4 where panel_for(p): m small for the format's decode cost, every
  // vector of columns inside one group of scales): y[b, :, j0:j1] = x[b] @ w[b, :, j0:j1],
  // the weight read in place and decoded in registers (no scratch), the same results as
  // "blocks".
  bool (*panel_for)(const FormatProblem& p);
  void (*panel)(const FormatProblem& p, int64_t b, int64_t j0, int64_t j1);
};

// Rows of q decoded per block in the "blocks" regime.
constexpr int64_t kFormatKc = 256;

constexpr int64_t FormatScratchFloats(int64_t width) { return kFormatKc * width; }

// The kernels the v2 handler uses from now on (the ISA hxmlir._matmul_q_cpu selected;
// the portable ones until then).
void SelectFormatKernels(const FormatKernels* k);

const FormatKernels* FormatKernelsGeneric();
#if defined(HXMLIR_HAVE_X86_ISAS)
const FormatKernels* FormatKernelsAvx2();
const FormatKernels* FormatKernelsAvx512();
#endif

}  // namespace hxmlir

struct XLA_FFI_Error;
struct XLA_FFI_CallFrame;
// The FFI handler of "hx_matmul_q_cpu_v2" (matmul_q_formats_ffi.cc).
extern "C" XLA_FFI_Error* HxMatmulQCpuV2(XLA_FFI_CallFrame* call_frame);

#endif  // HXMLIR_CSRC_MATMUL_Q_FORMATS_H_
