// The transposed product of hx.matmul_q's checkpoint layout [out, in] on CPU (custom call
// target "hx_matmul_q_cpu_nkt_v1"): the backward pass of y = x @ W.T in x, dx = g @ W,
// for a quantized weight W[n, k] (n = out, k = in) stored as hx_matmul_q_cpu_v3 and _v4
// take it (quantized along k, the axis that is now the result's):
//
//   x: f32[*b, n]   q, s (, o): W's components, as _v3 (a value format) or _v4 (a GGUF
//   block format) take them   ->   y: f32[*b, k]
//   y[.., kk] = sum_j x[.., j] * w[j, kk],   w = hx.dequantize(W)
//
// w is decoded as the forward kernels decode it, by the same decoders (formats/all.inc):
// fl(fl(value * s) + o) for a value format (int8, int4, uint4, float8_e4m3fn; f32 or f16
// scales, per row or per group of g along k, with or without an offset), llama.cpp's
// dequantize_row_* operations for a block format (hx.dequantize's value bit for bit).
//
// The work is cut into panels of kc columns of W (whole groups of elements: kc a multiple
// of 256, so of every block size) and blocks of at most kRowBlock rows of x; each task (a
// panel and a block of rows of x) walks the n rows of W in chunks of nc, decodes the
// chunk's part of the panel to f32 once (nc x kc floats, in L2), and adds its products
// into the task's accumulators (rows of x x kc columns) in register tiles of MR rows of x
// x NV vectors of columns: per row j of the chunk, a broadcast of x[i, j] times NV vectors
// of w[j, :]. Every output is one thread's sum over j in ascending order (fixed by the
// shapes alone, never by the thread count): within gamma_n * sum_j |x| |w| of the exact
// sum of products with w (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
// section 3.1), and w within u (|value * s| + |o|) of the exact value * s + o (no rounding
// for the block formats, where w is hx.dequantize's value).
#ifndef HXMLIR_CSRC_MATMUL_Q_NKT_H_
#define HXMLIR_CSRC_MATMUL_Q_NKT_H_

#include <cstdint>

#include "matmul_q_format_table.h"

namespace hxmlir {

struct NktProblem {
  const float* x;           // f32[m, n]
  const uint8_t* q;         // value format: [n, k / pack] bytes; block format: [n, k / B, bytes]
  const void* s;            // f32 or f16 (f16 true) [n, ns]; d: f16[n, k / B]
  const void* o = nullptr;  // like s, or null (no offset)
  bool f16 = false;
  float* y;                 // f32[m, k]
  int64_t m, n, k;
  int64_t g = 0, ns = 0;    // value format: group size along k (k for one scale per row),
                            // scales per row of W
  bool block = false;       // a block format (fmt) or a value format (values)
  ValueFormat values = ValueFormat::kInt8;
  BlockFormat fmt = BlockFormat::kQ5_0;
};

// Columns of W per panel: a multiple of every block size (32, 256) and of every ISA's
// tile width.
constexpr int64_t kNktPanel = 256;
// Rows of x per task at most (the task's accumulators: this many rows x kNktPanel floats).
constexpr int64_t kNktRowBlock = 128;
// Rows of W per chunk decoded at once (nc x kNktPanel floats: 64 KiB).
constexpr int64_t kNktChunk = 64;

struct NktKernels {
  const char* isa;
  int64_t w;  // f32 lanes per vector
  // y[i0:i1, k0:k1] (k0 a multiple of kNktPanel, k1 - k0 <= kNktPanel, i1 - i0 <=
  // kNktRowBlock); wt: kNktChunk * kNktPanel floats, acc: kNktRowBlock * kNktPanel floats.
  void (*panel)(const NktProblem& p, int64_t k0, int64_t k1, int64_t i0, int64_t i1, float* wt,
                float* acc);
};

const NktKernels* NktKernelsGeneric();
#if defined(HXMLIR_HAVE_X86_ISAS)
const NktKernels* NktKernelsAvx2();
const NktKernels* NktKernelsAvx512();
#endif

// Use the kernels of the named ISA ("avx512", "avx2", "generic") from now on; false when
// none by that name were compiled in.
bool SelectNktIsa(const char* name);

}  // namespace hxmlir

struct XLA_FFI_Error;
struct XLA_FFI_CallFrame;
// The FFI handler of "hx_matmul_q_cpu_nkt_v1" (matmul_q_nkt_ffi.cc).
extern "C" XLA_FFI_Error* HxMatmulQCpuNktV1(XLA_FFI_CallFrame* call_frame);

#endif  // HXMLIR_CSRC_MATMUL_Q_NKT_H_
