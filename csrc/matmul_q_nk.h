// hx.matmul_q on CPU in the checkpoint layout [out, in] (GGUF's, torch Linear's): the
// weight W[n, k] is quantized along k, the contraction axis, and
//
//   x: f32[*b, k]   q: stored values [n, k / pack]   s: [n] or [n, k / g]   (o: like s)
//   y[.., j] = sum_kk x[.., kk] * (value(q[j, kk]) * s[j, kk / g] + o[j, kk / g])   (f32[*b, n])
//
// for every format of hxmlir/formats.py: values int8 (s8, "plain"), int4 (u8,
// "int4_pairs_v1": dense element 2i is the low nibble of byte i, 2i + 1 the high one,
// each two's complement in [-8, 7]), uint4 (u8, "uint4_pairs_v1": the same nibbles,
// unsigned in [0, 15]) and float8_e4m3fn ("plain", decoded exactly as in
// matmul_q_formats.h); scales f32 or f16 (widened to f32 exactly on the fly), one per row
// of W (per row: g = k) or per group of g along k; an offset o of the scale's dtype and
// shape for the offset formats (u4o, q8o). x's leading dims are rows of one f32[m, k].
//
// Two regimes by m:
// - "dot" (m <= NkKernels::dot_max_m): each thread owns a range of rows of W and takes
//   each row once, as row dot products with up to dot_mr rows of x at a time: per group,
//   sum_{i in g} x_i q_i in f32 vector lanes, times the group's scale, added into the
//   row's accumulator; the offset term sum_g o_g * X_g from the per-group sums X_g of x
//   (computed once per row of x, shared by all n rows of W). int4 chunks of 2W values are
//   decoded without interleaving (low nibbles, high nibbles) and x is put in that order
//   once per call (NkChunkOrder). One row of x (m = 1, the decode step) with groups of
//   whole chunks has a loop of its own (NkDotRow) that keeps several sums in flight.
// - "blocks" (larger m): a GEMM on packed panels, computed transposed (y^T = W x^T): x
//   is transposed once per call (xt: f32[k, mp], m padded to whole vectors with zeros,
//   shared by the threads); each thread owns a range of rows of W and, k in blocks of
//   kPackedKc, decodes tile_mr rows of W at a time to f32 (v * s + o; in L1), then runs
//   the "packed" regime's register-tiled loop over them: each decoded weight broadcast
//   and multiplied by vectors of a row of xt (m's rows in the lanes), the tile's
//   accumulators in registers. Every weight is decoded once per call whatever m is, and
//   nothing is summed across lanes.
//
// Numerics: "dot" adds, per output, f32 products x * value within each group, times the
// scale, and o * X_g; "blocks" adds x * fl(fl(value * s) + o) over k in ascending order
// into one f32 sum (the rounding of a fused multiply-add where the compiler contracts;
// the order is fixed by the shapes, not by the thread count or the vector width). Both
// are within
// gamma_{k+2} * sum_kk |x| (|value * s| + |o|) of the exact value (Higham, Accuracy and
// Stability of Numerical Algorithms, 2nd ed., section 3.1), tested against float64.
#ifndef HXMLIR_CSRC_MATMUL_Q_NK_H_
#define HXMLIR_CSRC_MATMUL_Q_NK_H_

#include <cstdint>
#include <cstring>

#include "matmul_q_cpu.h"
#include "matmul_q_format_table.h"

namespace hxmlir {

struct NkProblem {
  const float* x;      // f32[m, k]
  const uint8_t* q;    // [n, k / pack] bytes
  const void* s;       // f32 or f16 (f16 true) [n, ns]
  const void* o = nullptr;  // like s, or null (no offset)
  bool f16 = false;
  // "dot": x with each whole chunk of chunk_width(values) inside a group in the chunk's
  // lane order (NkChunkOrder; x itself for one value per byte), and, with an offset, the
  // per-group sums of x, f32[m, ns].
  const float* xd = nullptr;
  const float* xsum = nullptr;
  float* y;            // f32[m, n]
  int64_t m, k, n;
  int64_t g;           // group size along k (k for one scale per row)
  int64_t ns;          // scales per row of W: k / g
  // "blocks": x transposed, f32[k, mp] (mp: m rounded up to whole vectors, zeros past m).
  const float* xt = nullptr;
  int64_t mp = 0;
  NkValues values;
};

// hx_matmul_q_cpu_v4: a GGUF block format in [out, in] (matmul_q_format_table.h):
//   x: f32[m, k]   q: the blocks' bytes [n, k / B, bytes]   d, dmin: f16[n, k / B]
//   y[i, j] = sum_kk x[i, kk] * w[j, kk], w the block's decode (formats/gguf_blocks.inc),
// the f32 operations of llama.cpp's dequantize_row_*, so w is hx.dequantize's value
// bit for bit. "dot" (m <= dot_max_m): each block's integers q decoded once to int8 (in
// L1) with vector shifts, masks and shuffles (formats/gguf_blocks.inc), then W weights at a
// time widened to f32 in registers and scaled, w = fl(fl(sc q) - mn), and x w added into
// one vector accumulator per row of x over the whole row, its lanes summed at the end;
// except one row of x (m = 1, the decode step), which
// sums x q per sub-block in lanes, adds those sums times sc into the accumulator, and
// subtracts sum_s mn_s X_s (X_s: x's sums over the sub-blocks); "blocks": v3's, each block
// decoded whole by Decode<F>. "dot" and "blocks" are within gamma_{k/W + 5} * |x| |w| and
// gamma_k * |x| |w| of the exact dot of x with w, the row of x within gamma_{k + 5} *
// |x| (|sc q| + |mn|) (Higham, section 3.1).
struct BlockProblem {
  const float* x;
  const uint8_t* q;
  const uint16_t* d;
  const uint16_t* dmin = nullptr;  // null without an offset
  float* y;
  int64_t m, k, n, nb;  // nb: blocks per row, k / B
  const float* xt = nullptr;  // "blocks": as NkProblem's
  int64_t mp = 0;
  // "dot"'s row of x: x's sums over each sub-block, f32[m, k / kSub] (NkKernels::block_xsums;
  // null where that loop does not read them)
  const float* xsum = nullptr;
  BlockFormat fmt;
};

struct NkKernels {
  const char* isa;
  int64_t w;            // f32 lanes per vector
  int64_t dot_mr;       // "dot": rows of x per pass over a row of W
  int64_t dot_max_m;    // "dot" for m <= this, "blocks" above
  int64_t tile_mr;      // "blocks": rows of W decoded per pass of the register tile
  // y[:, j0:j1] for rows [j0, j1) of W.
  void (*dot)(const NkProblem& p, int64_t j0, int64_t j1);
  // y[:, j0:j1]; scratch: at least NkBlocksScratch(tile_mr, j1 - j0, mp) floats.
  void (*blocks)(const NkProblem& p, int64_t j0, int64_t j1, float* scratch);
  // hx_matmul_q_cpu_v4's "dot" and "blocks" (scratch as blocks').
  void (*block_dot)(const BlockProblem& p, int64_t j0, int64_t j1);
  void (*block_tiles)(const BlockProblem& p, int64_t j0, int64_t j1, float* scratch);
  // Before block_dot, once per call: BlockProblem::xsum for p, written into out (at least
  // m * k / 16 floats), or null where block_dot does not read it.
  const float* (*block_xsums)(const BlockProblem& p, float* out);
};

// The scratch floats of NkKernels::blocks for rows rows of W and mp columns of x^T: the
// decoded rows (tile_mr x kPackedKc) and the task's y^T (rows x mp).
constexpr int64_t NkBlocksScratch(int64_t tile_mr, int64_t rows, int64_t mp) {
  return tile_mr * kPackedKc + rows * mp;
}

// The exact f32 value of the f16 with bits h (every f16 is an f32; no step is subnormal
// in f32, so XLA's flush-to-zero mode changes nothing).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  uint32_t bits;
  if (e == 0) {
    const float f = static_cast<float>(mant) * 0x1p-24f;  // exact: mant < 2^10
    std::memcpy(&bits, &f, sizeof bits);
    bits |= sign;
  } else if (e == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((e + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Dense elements per chunk decoded at once in "dot" for values of format v with W lanes.
constexpr int64_t NkChunkWidth(NkValues v, int64_t w) { return w * NkPackOf(v); }

const NkKernels* NkKernelsGeneric();
#if defined(HXMLIR_HAVE_X86_ISAS)
const NkKernels* NkKernelsAvx2();
const NkKernels* NkKernelsAvx512();
#endif

// The kernels the v3 handler uses from now on (set with the other ISAs' kernels).
void SelectNkKernels(const NkKernels* k);

}  // namespace hxmlir

struct XLA_FFI_Error;
struct XLA_FFI_CallFrame;
// The FFI handler of "hx_matmul_q_cpu_v3" (matmul_q_nk_ffi.cc).
extern "C" XLA_FFI_Error* HxMatmulQCpuV3(XLA_FFI_CallFrame* call_frame);
// The FFI handler of "hx_matmul_q_cpu_v4" (matmul_q_nk_ffi.cc).
extern "C" XLA_FFI_Error* HxMatmulQCpuV4(XLA_FFI_CallFrame* call_frame);

#endif  // HXMLIR_CSRC_MATMUL_Q_NK_H_
