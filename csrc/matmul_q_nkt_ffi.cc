// The XLA FFI handler of the transposed product of hx.matmul_q's [out, in] layout (custom
// call target "hx_matmul_q_cpu_nkt_v1"; layout, tiles and numerics in matmul_q_nkt.h):
//
//   x: f32[*b, n], q, s (, o) -> y: f32[*b, k],   y = x @ dequantize(W),  W[n, k]
//
// W's components and the attributes are hx_matmul_q_cpu_v3's for a value format (dtype
// "int8", "int4", "uint4", "float8_e4m3fn"; q: T[n, k / pack], s: S[n] or S[n, k / g],
// o like s) and hx_matmul_q_cpu_v4's for a GGUF block format (dtype the format's name;
// q: u16[n, k / B, bytes / 2], d: f16[n, k / B], dmin like d): dtype, layout, group_size,
// scale_dtype, offset. The call is refused (InvalidArgument naming the operands' types)
// unless they agree with the operands: BindNk's and BindBlock's checks (matmul_q_nk_ffi.h),
// transposed.
//
// Threads: tasks of a panel of columns of W and a block of rows of x (matmul_q_nkt.h),
// enough for about kBlocksPerThread per thread where the shapes allow; each output is
// computed by one task in an order fixed by the shapes alone.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "matmul_q_nk_ffi.h"
#include "matmul_q_nkt.h"
#include "matmul_q_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hxmlir {
namespace {

std::atomic<const NktKernels*> g_nkt_kernels{nullptr};

// A buffer of this thread for at least n floats (slot 0: a chunk of decoded W, 1: a task's
// accumulators), kept for its next tasks.
float* NktBuffer(int slot, int64_t n) {
  thread_local std::vector<float> bufs[2];
  if (bufs[slot].size() < static_cast<size_t>(n)) bufs[slot].resize(static_cast<size_t>(n));
  return bufs[slot].data();
}

struct NktJob : BlockedJob {
  NktProblem p;
  const NktKernels* kern;
  int64_t rows = 0;  // rows of x per task

  void Run(int64_t t) {
    const int64_t rb = t / blocks_per_batch, c = t % blocks_per_batch;
    const int64_t k0 = c * kNktPanel, k1 = std::min(p.k, k0 + kNktPanel);
    const int64_t i0 = rb * rows, i1 = std::min(p.m, i0 + rows);
    kern->panel(p, k0, k1, i0, i1, NktBuffer(0, kNktChunk * kNktPanel),
                NktBuffer(1, kNktRowBlock * kNktPanel));
  }
};

ffi::Error MatmulQNktV1(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q,
                        ffi::AnyBuffer s, ffi::RemainingArgs rest, ffi::ResultBuffer<ffi::F32> y,
                        std::string_view dtype, std::string_view layout, int64_t group_size,
                        std::string_view scale_dtype, bool offset) {
  constexpr std::string_view kTarget = "hx_matmul_q_cpu_nkt_v1";
  bool value = false, block = false;
  for (const ValueFormatInfo& f : kValueFormats) value = value || f.dtype == dtype;
  std::string names = DtypeList([](const ValueFormatInfo&) { return true; }, "and");
  for (const BlockFormatInfo& f : kBlockFormats) {
    block = block || f.dtype == dtype;
    names += std::string(", ") + f.dtype;
  }
  if (!value && !block)
    return ffi::Error::InvalidArgument(std::string(kTarget) + ": unknown dtype attribute '" +
                                       std::string(dtype) + "' (expected one of " + names + ")");
  auto job = std::make_shared<NktJob>();
  NktProblem& p = job->p;
  if (value) {  // a value format: hx_matmul_q_cpu_v3's operands
    NkProblem v;
    if (ffi::Error e = BindNk(kTarget, x, q, s, rest, &*y, dtype, layout, group_size,
                              scale_dtype, offset, &v, /*transposed=*/true);
        e.failure())
      return e;
    p = NktProblem{v.x, v.q, v.s, v.o, v.f16, v.y, v.m, v.n, v.k, v.g, v.ns};
    p.values = v.values;
  } else {  // a block format: hx_matmul_q_cpu_v4's operands
    BlockProblem b;
    if (ffi::Error e = BindBlock(kTarget, x, q, s, rest, &*y, dtype, layout, group_size,
                                 scale_dtype, offset, &b, /*transposed=*/true);
        e.failure())
      return e;
    p = NktProblem{b.x, b.q, b.d, b.dmin, true, b.y, b.m, b.n, b.k};
    p.block = true;
    p.fmt = b.fmt;
  }
  if (p.m == 0 || p.k == 0) return ffi::Error::Success();
  if (p.n == 0) {
    std::fill(p.y, p.y + p.m * p.k, 0.f);
    return ffi::Error::Success();
  }
  const NktKernels* kern = g_nkt_kernels.load(std::memory_order_acquire);
  job->kern = kern == nullptr ? NktKernelsGeneric() : kern;
  const int64_t threads = ThreadsFor(pool, p.m * p.n * p.k);
  const int64_t panels = CeilDiv(p.k, kNktPanel);
  // rows of x per task: at most kNktRowBlock; fewer (whole tiles of 8) only when there are
  // fewer panels than threads (each block of rows decodes the weight once more: at m = 64,
  // W[1536, 576], 2 threads, four blocks of 16 rows made Q3_K's product 8x XLA's f32 dot)
  const int64_t want_blocks = panels >= threads ? 1 : CeilDiv(threads, panels);
  int64_t blocks = std::max(CeilDiv(p.m, kNktRowBlock), std::min(want_blocks, CeilDiv(p.m, 8)));
  job->rows = std::min(kNktRowBlock, CeilDiv(CeilDiv(p.m, blocks), 8) * 8);
  blocks = CeilDiv(p.m, job->rows);
  job->Plan(blocks, Blocking{kNktPanel, panels});
  RunBlocks(pool, threads, job);
  return ffi::Error::Success();
}

}  // namespace

bool SelectNktIsa(const char* name) {
  struct Named {
    const char* name;
    const NktKernels* (*kernels)();
  };
  static const Named kNamed[] = {
#if defined(HXMLIR_HAVE_X86_ISAS)
      {"avx512", &NktKernelsAvx512},
      {"avx2", &NktKernelsAvx2},
#endif
      {"generic", &NktKernelsGeneric},
  };
  for (const Named& n : kNamed)
    if (std::strcmp(n.name, name) == 0) {
      g_nkt_kernels.store(n.kernels(), std::memory_order_release);
      return true;
    }
  return false;
}

}  // namespace hxmlir

XLA_FFI_DEFINE_HANDLER_SYMBOL(HxMatmulQCpuNktV1, hxmlir::MatmulQNktV1, HX_NK_FFI_BINDING());
