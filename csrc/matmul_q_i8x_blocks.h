// hx.matmul_q on CPU with integer activations for GGUF's block formats in the checkpoint
// layout [out, in] (custom call target "hx_matmul_q_cpu_i8x_v2", opt-in:
// hx.install(activations="int8")): the weight W[n, k] as hx_matmul_q_cpu_v4 takes it
// (matmul_q_nk.h, BlockProblem: Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS at
// the file's bytes, q: u16[n, k / B, bytes / 2], d (, dmin): f16[n, k / B]), and
// x: f32[*b, k] quantized at run time. hx_matmul_q_cpu_i8x_v1 (matmul_q_i8x.h) is unchanged.
//
// Semantics (the contract tests check against float64):
//   x is cut along k into blocks of 32 (k is a multiple of 32: B is 32 or 256). Per row r of
//   x and block b, exactly as i8x_v1: amax = max |x| over the block, s_x = fl(amax / 127),
//   qx = round-half-even(fl(x / s_x)) clamped to [-127, 127] (0 where amax = 0; a NaN or an
//   infinity in the block makes s_x NaN, and the row's outputs NaN).
//   W's block is B / kSub sub-blocks of kSub (16 or 32) elements, element e the integer q_e
//   (|q_e| <= 127) and the f32 factors sc_s, mn_s of its sub-block s (formats/gguf_blocks.inc:
//   Ints and Scales; w_e = fl(fl(sc_s q_e) - mn_s), mn_s = 0 without an offset). A sub-block
//   lies inside one block of x (kSub divides 32). With D_s = sum_{e in s} q_e qx_e and
//   Sq_s = sum_{e in s} qx_e (exact integers), c_s = fl(sc_s s_x), o_s = fl(mn_s s_x):
//
//     y[r, j] = sum_s c_s D_s - o_s Sq_s          (the exact value of this expression)
//
// Evaluation: x's row in chunks of 256 elements (nc = ceil(k / 256) per row; the last chunk
// of a 32-element format padded with zeros), each chunk 4 steps of 64 elements; step t's 16
// lanes hold 4 consecutive elements each (a lane never straddles a sub-block). Lane l's part
// of D_s is an exact int32 (vpdpbusd on u = q + 128 as a byte against qx, minus 128 times
// the lane's 4 qx, or on q itself where every q >= 0; AVX2: vpmaddubsw of |q| and
// sign(qx, q), exact as |q qx| <= 127 * 127 per product; scalar elsewhere;
// |part| <= 4 * 127 * 127 < 2^24, converted to f32 exactly),
// multiplied by its lane's c_s and added into step t's 16 f32 lanes acc_t (one term per
// lane per chunk: nc terms); the terms fl(o_s * Sq_s) into 16 lanes acco (lane = sub-block
// of the chunk: nc terms); then ((acc_0 + acc_1) + (acc_2 + acc_3)) - acco lane by lane and
// the 16 lanes as a tree (4 adds). With AVX-512 VNNI a format with a spread order
// (IQ4_XS, IQ4_NL: formats/gguf_blocks.inc, SpreadU) takes its steps in that order instead,
// x's chunk put in it when quantized: lane l holds elements of one sub-block s in all 4
// steps (a partial last chunk's integers put in it in the scratch), so its exact
// int32 over the chunk (16 elements, |part| <= 16 * 127 * 127 < 2^24) times c_s is the
// lane's one term per chunk, into one f32 acc (nc terms), then acc - acco and the tree. A
// term has one rounding of its own and at most nc + 7 adds after it:
//
//   |y - exact| <= gamma_{nc + 8} * T,   T = sum_s (|c_s| sum_{e in s} |q_e qx_e| + |o_s Sq_s|)
//
// (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1, gamma_n =
// n u / (1 - n u), u = 2^-24; an FMA the compiler forms only removes roundings). Each output
// is one thread's sum in this order, fixed by the shapes alone. Against f32 activations the
// difference is x's quantization, |s_x qx - x| <= s_x / 2 per element, and c_s, o_s's
// roundings (u each).
//
// That order is the GEMV's (x of at most kI8xbGemvRows rows). Larger x takes the panels
// (below), whose order is one f32 sum per output over the sub-blocks in ascending order,
// each adding fl(c_s D_s) and (with an offset) subtracting fl(o_s Sq_s): 2 ns terms
// (ns = 256 nc / kSub sub-block slots), a term with 2 roundings of its own, so
//
//   |y - exact| <= gamma_{2 ns + 2} * T         (panels: x of more than 8 rows)
//
// Which order a call takes is fixed by its shapes (m), not by the ISA.
//
// Work: the rows of W in blocks (threads split over rows of W only); each row of W is decoded
// once into the thread's scratch (I8xBlockScratch bytes: the row's integers q as int8, each
// chunk's 16 sc_s and 16 mn_s slots, each slot's correction -128 Sum q (panels with VNNI),
// the row's d and dmin as f32). The GEMV (x of at most kI8xbGemvRows rows) takes one row
// at a time: its factors into the scratch (the 32-element formats', a block's d and -dmin,
// taken from the row's d and dmin as f32, 8 a chunk: no copy), its integers decoded in
// registers 64 at a time
// (the format's StepU with AVX-512 VNNI, u = q + kBias against the lanes' correction
// -kBias Sum qx; Step elsewhere) as the dot products take them (but a partial last
// chunk's, from the scratch), the weight's bytes prefetched 12 KiB ahead a chunk at a time; per chunk and row
// of x, the 16 c_s are one product of vectors, spread to each step's lanes by a permute.
// The panels (more rows, a GEMM computed as y^T = W x^T): x's rows in groups of 16 (one per
// lane), quantized then transposed so that step L of a group (elements 4L .. 4L + 3 of its
// 16 rows) is 64 contiguous bytes; a block of rows of W
// decoded first, then register tiles of MR rows of W by NV groups of x (6 x 2 with AVX-512
// VNNI: 12 int32 accumulators per sub-block, each step one vpdpbusd of the group's bytes,
// as qx + 128, against 4 of W's q broadcast from memory; the correction -128 Sum q of the
// sub-block is the accumulator's start), each sub-block's integers converted and scaled
// by c_s = fl(sc_s s_x) (one product of W's sc_s broadcast and the group's 16 s_x).
#ifndef HXMLIR_CSRC_MATMUL_Q_I8X_BLOCKS_H_
#define HXMLIR_CSRC_MATMUL_Q_I8X_BLOCKS_H_

#include <cstdint>

#include "matmul_q_format_table.h"

namespace hxmlir {

constexpr int64_t kI8xbChunk = 256;       // elements of k per chunk
constexpr int64_t kI8xbChunkLanes = 64;   // 4-element lanes per chunk (4 steps x 16)
constexpr int64_t kI8xbChunkSubs = 16;    // sub-block slots per chunk (8 of 32 or 16 of 16)

// x of at most this many rows: the GEMV (W decoded a row at a time); more: the panels.
constexpr int64_t kI8xbGemvRows = 8;
constexpr int64_t kI8xbPanelRows = 16;    // rows of x per panel (one per int32 lane)

struct I8xBlockProblem {
  // x, quantized (quantize, below): per row of x, nc chunks
  int8_t* qx;       // s8[m, nc, 256]: qx (0 past k)
  int32_t* corr;    // s32[m, nc, 64]: -kBias (W's format) * the sum of each lane's 4 qx
  float* sxs;       // f32[m, nc, 16]: s_x of each sub-block (kSub elements; 0 past k)
  float* sq;        // f32[m, nc, 16]: Sq of each sub-block (exact)
  // the panels (m > kI8xbGemvRows; null for the GEMV): mv = ceil(m / 16) groups of 16 rows
  // (rows past m: qx 0, s_x 0), transposed from the buffers above
  uint8_t* px = nullptr;  // [mv, nc * 64, 16, 4]: step L, row i: qx[16 v + i, 4L .. 4L + 3]
                    // (+ 128 with AVX-512 VNNI: vpdpbusd's unsigned operand)
  float* psx = nullptr;   // f32[mv, nc * 16, 16]: sxs, slot s, row i
  float* psq = nullptr;   // f32[mv, nc * 16, 16]: sq, slot s, row i (the offset formats read it)
  int64_t mv = 0;
  // W: hx_matmul_q_cpu_v4's operands
  const uint8_t* q;        // [n, nb, bytes]
  const uint16_t* d;       // f16[n, nb]
  const uint16_t* dmin;    // f16[n, nb], or null without an offset
  float* y;                // f32[m, n]
  int64_t m, k, n, nb;     // nb: blocks per row of W, k / B
  int64_t nc;              // chunks per row: ceil(k / 256)
  BlockFormat fmt;
  // hx_matmul_q_cpu_i8x_v1's panels (matmul_q_i8x.h): W's values (kInt8, kInt4, kUInt4) with
  // f16 scales (d) and offsets (dmin, or null) per group of 32 taken as blocks of one
  // sub-block of 32 (sc = s, mn = -o: w = s v + o); fmt unused. False: a GGUF block format.
  bool value_blocks = false;
  ValueFormat values = ValueFormat::kInt8;
};

// Bytes of a thread's scratch for one decoded row of W: q, sc, mn, corr, d and dmin.
constexpr int64_t I8xBlockScratch(int64_t nc) {
  return nc * (kI8xbChunk + 12 * kI8xbChunkSubs + 2 * 4 * (kI8xbChunk / 32));
}

}  // namespace hxmlir

struct XLA_FFI_Error;
struct XLA_FFI_CallFrame;
// The FFI handler of "hx_matmul_q_cpu_i8x_v2" (matmul_q_i8x_ffi.cc).
extern "C" XLA_FFI_Error* HxMatmulQCpuI8xV2(XLA_FFI_CallFrame* call_frame);

#endif  // HXMLIR_CSRC_MATMUL_Q_I8X_BLOCKS_H_
