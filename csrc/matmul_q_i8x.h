// hx.matmul_q on CPU in the checkpoint layout [out, in] with integer activations (custom
// call target "hx_matmul_q_cpu_i8x_v1", opt-in: hx.install(activations="int8")): the
// weight W[n, k] as for hx_matmul_q_cpu_v3 (matmul_q_nk.h: values int8, int4 or uint4,
// scales f32 or f16 per row or per group of g along k, offsets for the offset formats),
// and x: f32[*b, k] quantized at run time.
//
// Semantics (the contract tests check against float64):
//   x is cut along k into blocks of B elements, B = 32 when W has one scale per row or
//   g is a multiple of 32, else B = g (the last block of a row may be shorter: k % B).
//   Per row r of x and block b: amax = max |x| over the block, s_x = fl(amax / 127),
//   qx = round-half-even(fl(x / s_x)) in [-127, 127] (0 where amax = 0; a NaN or an
//   infinity in the block makes s_x NaN, and the row's outputs NaN).
//   y[r, j] = sum_b sum_{kk in b} (s_x qx[r, kk]) * (value(q[j, kk]) s[j, kk / g] + o[j, kk / g])
// evaluated (but on the panels, below) as
//   y[r, j] = sum_b fl(s_w s_x) * D + fl(o - c s_w) * fl(s_x * Sq)
// with D = sum_{kk in b} u[j, kk] qx[r, kk] exact in int32, u = value + c the weight as an
// unsigned byte (c = 128 for int8: u = value ^ 0x80; c = 8 for int4: u = nibble ^ 8;
// c = 0 for uint4: the nibble itself), Sq = sum_{kk in b} qx[r, kk] (exact), s_w and o the
// block's scale and offset (0 without one), f32 arithmetic; D is exact for any B up to
// 2^31 / (255 * 127) (the kernel is refused above I8xMaxBlock). A block's D may be summed
// in parts (each exact, below 2^24, converted exactly to f32), each part scaled by
// fl(s_w s_x) apart. Three orders of the f32 sums, by the rows m of x (I8xRowPath) and
// W's groups:
//
//   super-blocks (m > 16 and not the panels' weights, or B != 32): the terms are added in
//   16 f32 lanes over the blocks (lane = block mod 16), the lanes then as a tree: within
//   gamma_{2 * nsb + 6} * T of the exact value of the expression (nsb <= nb / 16 + 4
//   super-blocks), T = sum_b (s_w s_x sum_{kk in b} |u qx| + |(o - c s_w) s_x Sq|);
//   row path (m <= 16 and B = 32, but not the panels): per row of W and of x, 16 f32 lanes acc get one term
//   fl(fl(s_w s_x) * D_part) per unit of 64 stored bytes (2 blocks of int8 values, 4 of
//   4-bit ones: nu = ceil(nb / (2 pack)) <= ceil(nb / 2) terms per lane), 16 lanes acco
//   one term fl(fl(o - c s_w) * fl(s_x Sq)) per block (lane = block mod 16: ceil(nb / 16)
//   <= nu terms), then acc + acco and the tree of 16 lanes (1 + 4 adds): a term has at
//   most 3 roundings of its own (2 for acc's) and at most nu + 5 adds after it, within
//   gamma_{ceil(nb / 2) + 8} * T. Any FMA the compiler forms only removes roundings.
//
//   panels (m > 8, g = 32, f16 scales: GGUF's Q8_0, Q4_0, Q4_1): hx_matmul_q_cpu_i8x_v2's
//   panels (matmul_q_i8x_blocks.h), each group a block of one sub-block with sc = s_w,
//   mn = -o and q the values themselves, i.e. y[r, j] = sum_b fl(s_w s_x) D' + fl(o s_x) Sq
//   with D' = sum_{kk in b} value qx (exact): one f32 sum per output over the ns =
//   8 ceil(k / 256) block slots in ascending order, within gamma_{2 ns + 2} * T',
//   T' = sum_b (|s_w s_x| sum_{kk in b} |value qx| + |o s_x Sq|).
//
// (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1.) Against
// f32 activations the difference is the quantization of x: |s_x qx - x| <= s_x / 2 per
// element.
//
// Layout of the work (super-blocks): each block padded with zeros to S = ceil(B / 4)
// words of 4 bytes;
// the blocks of a row in super-blocks (I8xPlan): whole ones of 16 blocks, lane l holding
// block l, S steps of 64 bytes (step s: word s of each block), then the rest of the row
// in at most 4 narrower super-blocks of G = 8, 4 or 2 blocks (when p = 16 / G divides S;
// else one of 16 blocks, padded), each block spread over p lanes: lane l holds block
// l / p, its step s word s * p + l % p (S / p steps: no lane idles at k = 576, 18 blocks:
// 16 + 2, 8 + 1 steps). The same plan for x and W. One step of a row of x against one
// step of a row of W is one vpdpbusd (u8 weights x s8 activations, 16 int32 lanes: 4
// products each); after a super-block's steps each lane holds part of its block's D,
// converted to f32 and scaled once (the term of o: in a block's first lane only).
//
// Layout of the work (row path, decode): W is read in place, 64 stored bytes (a unit) at
// a time, the last unit of a row masked; x is quantized once per call into the row
// layout that faces it: per row of x, chunks of 16 blocks (512 bytes); for int8 values
// element e at byte e (a unit's 64 bytes against 64 bytes of qx: lane l holds 4 elements
// of block 2t + l / 8 of unit t); for 4-bit values a unit holds 128 elements, byte i the
// elements 2i (low nibble) and 2i + 1 (high nibble): the unit's qx is its 64 even
// elements, then its 64 odd ones, so the low nibbles (as bytes) against the first half
// and the high nibbles against the second are two vpdpbusd into the same lanes, lane l
// holding 8 elements of block 4t + l / 4. The scales of a chunk's 16 blocks are one
// vector (f16 converted once), fl(s_w s_x) a product of two vectors, spread to the
// lanes of each unit by one vpermps. The rows of x go in tiles of at most 4: a unit of W,
// loaded and expanded once, is used against each row of the tile (a row of W is read from
// memory once, then from L1 for the next tiles).
#ifndef HXMLIR_CSRC_MATMUL_Q_I8X_H_
#define HXMLIR_CSRC_MATMUL_Q_I8X_H_

#include <algorithm>
#include <cstdint>

#include "matmul_q_i8x_blocks.h"
#include "matmul_q_nk.h"

namespace hxmlir {

constexpr int64_t kI8xLanes = 16;          // blocks per super-block
constexpr int64_t kI8xStepBytes = 64;      // bytes per step: 16 lanes x 4
constexpr int64_t kI8xMaxBlock = 65536;    // D fits int32: B * 255 * 127 < 2^31
// The row path (matmul_q_i8x.h): x of at most this many rows, B = 32 (measured on Zen 4:
// faster than the super-blocks through m = 16 on SmolLM2's projections, 1.6-1.9x the f32
// kernel at m = 1).
constexpr int64_t kI8xRowsMaxM = 16;
constexpr int64_t kI8xUnitBytes = 64;      // stored bytes of W per unit (2 or 4 blocks)
constexpr int64_t kI8xChunkBlocks = 16;    // blocks per chunk (one vector of scales)
constexpr int64_t kI8xChunkBytes = 512;    // qx bytes per chunk: 16 blocks of 32

// The block size B of x for a weight with k columns and groups of g (0: one scale per row).
constexpr int64_t I8xBlock(int64_t g) { return g == 0 || g % 32 == 0 ? 32 : g; }

// The super-blocks of a row of x or W: `full` of 16 blocks (S steps each), then `tails`
// narrower ones (matmul_q_i8x.h's layout).
struct I8xPlan {
  int64_t full = 0, tails = 0;
  int64_t tail_g[4] = {}, tail_p[4] = {};  // blocks and lanes per block of each tail
  int64_t steps = 0;                       // steps of a row, all super-blocks
};

// The plan of nb blocks of S steps.
inline I8xPlan I8xMakePlan(int64_t nb, int64_t S) {
  I8xPlan pl;
  pl.full = nb / kI8xLanes;
  int64_t rest = nb % kI8xLanes;
  pl.steps = pl.full * S;
  auto add = [&](int64_t g, int64_t lanes) {
    pl.tail_g[pl.tails] = g, pl.tail_p[pl.tails] = lanes, ++pl.tails;
    pl.steps += S / lanes;
    rest -= std::min(rest, g);
  };
  for (int64_t g = 8; g >= 2; g /= 2)
    if (S % (kI8xLanes / g) == 0 && rest >= g) add(g, kI8xLanes / g);
  if (rest > 0) {  // the narrowest super-block that holds the rest (padded), else 16 lanes
    int64_t g = 2;
    while (g < kI8xLanes && (g < rest || S % (kI8xLanes / g) != 0)) g *= 2;
    add(g, kI8xLanes / g);
  }
  return pl;
}

// Super-block t of a plan: its first block, lanes per block, first step, steps.
struct I8xSb {
  int64_t b0, p, step0, steps;
};

inline I8xSb I8xSuper(const I8xPlan& pl, int64_t S, int64_t t) {
  if (t < pl.full) return {t * kI8xLanes, 1, t * S, S};
  I8xSb sb{pl.full * kI8xLanes, 1, pl.full * S, S};
  for (int64_t i = 0; i < t - pl.full; ++i) {
    sb.b0 += pl.tail_g[i];
    sb.step0 += S / pl.tail_p[i];
  }
  sb.p = pl.tail_p[t - pl.full];
  sb.steps = S / sb.p;
  return sb;
}

struct I8xProblem {
  // x, quantized (Quantize): per row, the plan's steps of 64 bytes; on the row path
  // (`rows`) per row nch chunks of 512 bytes (the row layout), sx and xsum f32[m, nch, 16]
  // per block (0 past the last block), qsum unused
  const int8_t* qx;    // s8[m, plan.steps, 64]
  const float* sx;     // f32[m, nsb, 16]: s_x of each lane's block (0 past the last block)
  const float* xsum;   // f32[m, nsb, 16]: fl(s_x * Sq) in a block's first lane, else 0
  const int32_t* qsum; // s32[m, nsb, 16]: Sq in a block's first lane, else 0
  // W, as for hx_matmul_q_cpu_v3
  const uint8_t* q;    // [n, k / pack] bytes
  const void* s;       // f32 or f16 [n, ns]
  const void* o;       // like s, or null
  bool f16;
  NkValues values;     // kInt8, kInt4 or kUInt4
  float* y;            // f32[m, n]
  int64_t m, k, n;
  int64_t g;           // group size along k (k for one scale per row)
  int64_t b;           // B: x's block
  int64_t nb, nsb, steps;  // blocks per row (ceil(k / B)), super-blocks, S
  I8xPlan plan;
  bool rows = false;   // the row path: W read in place (I8xRowPath)
  int64_t nch = 0;     // the row path's chunks of 16 blocks per row: ceil(nb / 16)
};

// Whether a call of m rows of x with blocks of B takes the row path.
constexpr bool I8xRowPath(int64_t m, int64_t b) { return m <= kI8xRowsMaxM && b == 32; }

struct I8xKernels {
  const char* isa;     // "avx512_vnni", "avx2", "generic"
  int64_t tile_nr;     // rows of W per register tile (blocks of rows are multiples)
  // Bytes of scratch per decoded row of W (a token 64 on the row path: none is used).
  int64_t (*row_bytes)(const I8xProblem& p);
  // qx, sx, xsum, qsum for rows [r0, r1) of x: f32[m, k] (buffers as in I8xProblem).
  void (*quantize)(const I8xProblem& p, const float* x, int64_t r0, int64_t r1, int8_t* qx,
                   float* sx, float* xsum, int32_t* qsum);
  // y[:, j0:j1]; scratch: (j1 - j0) * row_bytes(p) bytes, 64-byte aligned.
  void (*blocks)(const I8xProblem& p, int64_t j0, int64_t j1, uint8_t* scratch);
  // hx_matmul_q_cpu_i8x_v2 (GGUF's block formats, matmul_q_i8x_blocks.h): the panels'
  // rows of W per register tile (their blocks are multiples); rows [r0, r1) of x: f32[m, k]
  // quantized into p's buffers (and, with p.px, those rows' panels: r0 a multiple of 16,
  // r1 too unless it is m); y[:, j0:j1], scratch (j1 - j0, rounded up to block_tile_mr
  // with p.px) * I8xBlockScratch(p.nc) bytes.
  int64_t block_tile_mr;
  void (*block_quantize)(const I8xBlockProblem& p, const float* x, int64_t r0, int64_t r1);
  void (*block_rows)(const I8xBlockProblem& p, int64_t j0, int64_t j1, uint8_t* scratch);
};

const I8xKernels* I8xKernelsGeneric();
#if defined(HXMLIR_HAVE_X86_ISAS)
const I8xKernels* I8xKernelsAvx2();
const I8xKernels* I8xKernelsAvx512Vnni();
#endif

// The kernels the i8x handler uses from now on.
void SelectI8xKernels(const I8xKernels* k);
const I8xKernels* SelectedI8xKernels();

}  // namespace hxmlir

struct XLA_FFI_Error;
struct XLA_FFI_CallFrame;
// The FFI handler of "hx_matmul_q_cpu_i8x_v1" (matmul_q_i8x_ffi.cc).
extern "C" XLA_FFI_Error* HxMatmulQCpuI8xV1(XLA_FFI_CallFrame* call_frame);

#endif  // HXMLIR_CSRC_MATMUL_Q_I8X_H_
