// The XLA FFI handler of hx.matmul_q on CPU with integer activations, in the [out, in]
// layout (custom call target "hx_matmul_q_cpu_i8x_v1"; semantics and numerics in
// matmul_q_i8x.h): operands and attributes exactly as hx_matmul_q_cpu_v3's
// (matmul_q_nk_ffi.cc), dtypes int8, int4 and uint4 (float8_e4m3fn is refused).
//
// x is quantized once per call, in tasks of rows taken first by whichever threads are
// there (its buffers are read by every thread; on the row path, x of at most 16 rows and
// B = 32, in the row layout); then the rows of W are cut into blocks of whole tiles (each
// block decoded once into a thread's scratch, rows x row_bytes fitting half the L2 cache;
// on the row path read in place, no scratch), about
// kBlocksPerThread per thread of XLA's intra-op pool (matmul_q_parallel.h); each output
// is computed by one thread in an order fixed by the shapes alone.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "matmul_q_i8x.h"
#include "matmul_q_i8x_blocks.h"
#include "matmul_q_nk_ffi.h"
#include "matmul_q_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hxmlir {

namespace {
std::atomic<const I8xKernels*> g_i8x_kernels{nullptr};
}  // namespace

void SelectI8xKernels(const I8xKernels* k) { g_i8x_kernels.store(k, std::memory_order_release); }

const I8xKernels* SelectedI8xKernels() {
  const I8xKernels* k = g_i8x_kernels.load(std::memory_order_acquire);
  return k == nullptr ? I8xKernelsGeneric() : k;
}

namespace {

constexpr char kTarget[] = "hx_matmul_q_cpu_i8x_v1";

// Tasks [0, qtasks) quantize x, `qrows` rows each (on whichever threads take them first);
// tasks [qtasks, total) are the blocks of rows of W, each waiting for every quantize task
// (all begun by then: tasks are taken in order) before it reads x. Job supplies p (with m
// and n), row_bytes, Quantize(r0, r1) and Blocks(j0, j1, scratch).
template <class Job>
struct QuantizeThenBlocks : BlockedJob {
  const I8xKernels* kern = nullptr;
  const float* x = nullptr;
  int64_t row_bytes = 0, qtasks = 0, qrows = 0;
  std::atomic<int64_t> quantized{0};

  void Run(int64_t t) {
    Job& job = static_cast<Job&>(*this);
    if (t < qtasks) {
      job.Quantize(t * qrows, std::min(job.p.m, (t + 1) * qrows));
      quantized.fetch_add(1, std::memory_order_release);
      return;
    }
    while (quantized.load(std::memory_order_acquire) < qtasks) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    const int64_t j0 = (t - qtasks) * block_len, j1 = std::min(job.p.n, j0 + block_len);
    float* buf = ThreadBuffer(kScratch, CeilDiv(block_len * row_bytes, 4));
    job.Blocks(j0, j1, reinterpret_cast<uint8_t*>(buf));
  }

  // Quantize tasks of `rows` rows (threads > 1), else one; then RunBlocks.
  void QuantizeIn(int64_t m, int64_t rows, int64_t threads) {
    qrows = threads > 1 ? rows : m;
    qtasks = CeilDiv(m, qrows);
    total += qtasks;
  }
};

struct I8xJob : QuantizeThenBlocks<I8xJob> {
  I8xProblem p;
  int8_t* qx = nullptr;
  float *sx = nullptr, *xsum = nullptr;
  int32_t* qsum = nullptr;

  void Quantize(int64_t r0, int64_t r1) { kern->quantize(p, x, r0, r1, qx, sx, xsum, qsum); }
  void Blocks(int64_t j0, int64_t j1, uint8_t* scratch) { kern->blocks(p, j0, j1, scratch); }
};

// hx_matmul_q_cpu_i8x_v2 (matmul_q_i8x_blocks.h): x quantized in tasks of whole panels (16
// rows; the GEMV's x, a few KiB, in one task), then the blocks of rows of W.
struct I8xBlockJob : QuantizeThenBlocks<I8xBlockJob> {
  I8xBlockProblem p;

  void Quantize(int64_t r0, int64_t r1) { kern->block_quantize(p, x, r0, r1); }
  void Blocks(int64_t j0, int64_t j1, uint8_t* scratch) { kern->block_rows(p, j0, j1, scratch); }
};

// Runs the GEMV or the panels (matmul_q_i8x_blocks.h) for x: f32[m, k] against W (w's q, d,
// dmin, y, m, k, n, nb and its format set): x's buffers and the blocks of rows of W here.
void RunI8xBlocks(ffi::ThreadPool& pool, const I8xBlockProblem& w, const float* x) {
  auto job = std::make_shared<I8xBlockJob>();
  job->kern = SelectedI8xKernels();
  job->x = x;
  I8xBlockProblem& p = job->p;
  p = w;
  p.nc = CeilDiv(p.k, kI8xbChunk);
  // x's buffers (the calling thread's, for this call): qx, then corr, sxs, sq, and for the
  // panels px, psx, psq
  const bool panels = p.m > kI8xbGemvRows;
  const int64_t rows = p.m * p.nc;
  p.mv = panels ? CeilDiv(p.m, kI8xbPanelRows) : 0;
  const int64_t prow = p.mv * kI8xbPanelRows * p.nc;  // the panels' rows x chunks
  float* xb = ThreadBuffer(kXs, rows * (kI8xbChunk / 4 + kI8xbChunkLanes + 2 * kI8xbChunkSubs) +
                                    prow * (kI8xbChunk / 4 + 2 * kI8xbChunkSubs));
  p.qx = reinterpret_cast<int8_t*>(xb);
  p.corr = reinterpret_cast<int32_t*>(xb + rows * kI8xbChunk / 4);
  p.sxs = xb + rows * (kI8xbChunk / 4 + kI8xbChunkLanes);
  p.sq = p.sxs + rows * kI8xbChunkSubs;
  if (panels) {
    p.px = reinterpret_cast<uint8_t*>(p.sq + rows * kI8xbChunkSubs);
    p.psx = reinterpret_cast<float*>(p.px) + prow * kI8xbChunk / 4;
    p.psq = p.psx + prow * kI8xbChunkSubs;
  }
  job->row_bytes = I8xBlockScratch(p.nc);
  const int64_t threads = ThreadsFor(pool, p.m * p.k * p.n);
  // GEMV: W in blocks of whole groups of 4 rows, about kBlocksPerThread per thread; the
  // panels: blocks of whole tiles of rows of W whose decoded rows fit half the L2 cache
  const int64_t tile = job->kern->block_tile_mr;
  job->Plan(1, panels ? NkRowBlocks(p.n, tile, threads, job->row_bytes)
                      : ColumnBlocks(p.n, 1, 4, threads));
  job->QuantizeIn(p.m, panels ? kI8xbPanelRows : p.m, threads);
  RunBlocks(pool, threads, job);
}

// Rows of x per quantize task: about 16 KiB of x each, at least 4 rows.
constexpr int64_t kQuantizeFloats = int64_t{1} << 12;

ffi::Error MatmulQI8x(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q,
                      ffi::AnyBuffer s, ffi::RemainingArgs rest, ffi::ResultBuffer<ffi::F32> y,
                      std::string_view dtype, std::string_view layout, int64_t group_size,
                      std::string_view scale_dtype, bool offset) {
  NkProblem nk;
  if (ffi::Error e = BindNk(kTarget, x, q, s, rest, &*y, dtype, layout, group_size, scale_dtype,
                            offset, &nk);
      e.failure())
    return e;
  if (!InfoOf(nk.values).i8x)
    return ffi::Error::InvalidArgument(
        std::string(kTarget) + ": dtype " + std::string(dtype) +
        " has no integer-activation kernel (" +
        DtypeList([](const ValueFormatInfo& f) { return f.i8x; }, "and") +
        " weights only; hx_matmul_q_cpu_v3 takes it)");
  const int64_t b = I8xBlock(group_size);
  if (b > kI8xMaxBlock)
    return ffi::Error::InvalidArgument(
        std::string(kTarget) + ": group_size " + std::to_string(group_size) + " is above " +
        std::to_string(kI8xMaxBlock) + " (the int32 sums of a block could overflow)");
  if (NothingToCompute(1, nk.m, nk.k, nk.n, nk.y)) return ffi::Error::Success();
  if (nk.m > kI8xbGemvRows && nk.g == 32 && nk.f16) {  // the panels (matmul_q_i8x.h)
    I8xBlockProblem w;
    w.q = nk.q, w.d = static_cast<const uint16_t*>(nk.s);
    w.dmin = static_cast<const uint16_t*>(nk.o);
    w.y = nk.y, w.m = nk.m, w.k = nk.k, w.n = nk.n, w.nb = nk.k / 32;
    w.value_blocks = true, w.values = nk.values;
    RunI8xBlocks(pool, w, nk.x);
    return ffi::Error::Success();
  }

  const I8xKernels* kern = SelectedI8xKernels();
  auto job = std::make_shared<I8xJob>();
  job->kern = kern;
  I8xProblem& p = job->p;
  p.q = nk.q, p.s = nk.s, p.o = nk.o, p.f16 = nk.f16, p.values = nk.values, p.y = nk.y;
  p.m = nk.m, p.k = nk.k, p.n = nk.n, p.g = nk.g, p.b = b;
  p.nb = CeilDiv(p.k, b);
  p.steps = CeilDiv(b, 4);
  p.plan = I8xMakePlan(p.nb, p.steps);
  p.nsb = p.plan.full + p.plan.tails;
  int64_t qbytes = p.m * p.plan.steps * kI8xStepBytes, lanes = p.m * p.nsb * kI8xLanes;
  p.rows = I8xRowPath(p.m, b);
  if (p.rows) {  // the row path: W read in place, x in the row layout
    p.nch = CeilDiv(p.nb, kI8xChunkBlocks);
    qbytes = p.m * p.nch * kI8xChunkBytes;
    lanes = p.m * p.nch * kI8xLanes;
  }
  int8_t* qx = reinterpret_cast<int8_t*>(ThreadBuffer(kXs, CeilDiv(qbytes, 4)));
  float* side = ThreadBuffer(kPartial, 3 * lanes);
  job->x = nk.x, job->qx = qx, job->sx = side, job->xsum = side + lanes;
  job->qsum = reinterpret_cast<int32_t*>(side + 2 * lanes);
  p.qx = qx, p.sx = side, p.xsum = side + lanes, p.qsum = job->qsum;

  job->row_bytes = kern->row_bytes(p);
  const int64_t threads = ThreadsFor(pool, p.m * p.k * p.n);
  job->Plan(1, NkRowBlocks(p.n, kern->tile_nr, threads, job->row_bytes));
  job->QuantizeIn(p.m, std::max<int64_t>(4, kQuantizeFloats / p.k), threads);
  RunBlocks(pool, threads, job);
  return ffi::Error::Success();
}

ffi::Error MatmulQI8xV2(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q,
                        ffi::AnyBuffer s, ffi::RemainingArgs rest, ffi::ResultBuffer<ffi::F32> y,
                        std::string_view dtype, std::string_view layout, int64_t group_size,
                        std::string_view scale_dtype, bool offset) {
  BlockProblem b;
  if (ffi::Error e = BindBlock("hx_matmul_q_cpu_i8x_v2", x, q, s, rest, &*y, dtype, layout,
                               group_size, scale_dtype, offset, &b);
      e.failure())
    return e;
  if (NothingToCompute(1, b.m, b.k, b.n, b.y)) return ffi::Error::Success();
  I8xBlockProblem p;
  p.q = b.q, p.d = b.d, p.dmin = b.dmin, p.y = b.y, p.fmt = b.fmt;
  p.m = b.m, p.k = b.k, p.n = b.n, p.nb = b.nb;
  RunI8xBlocks(pool, p, b.x);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hxmlir

XLA_FFI_DEFINE_HANDLER_SYMBOL(HxMatmulQCpuI8xV1, hxmlir::MatmulQI8x, HX_NK_FFI_BINDING());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HxMatmulQCpuI8xV2, hxmlir::MatmulQI8xV2, HX_NK_FFI_BINDING());
