// The XLA FFI handler of hx.matmul_q on CPU for every quantization format
// (custom call target "hx_matmul_q_cpu_v2"; formats and layout in
// matmul_q_formats.h, defined by hxmlir/formats.py):
//
//   x: f32[*b, m, k], q: T[*b, k, n / pack], s: f32[*b, k] or f32[*b, k, n / g]
//     -> y: f32[*b, m, n],  y = x @ dequantize(q, s)
//
// Attributes (part of the IR contract; the call is refused unless they agree with
// the operands): dtype ("int8", "int4", "float8_e4m3fn"), layout ("plain" for int8
// and float8_e4m3fn, "int4_pairs_v1" for int4) and group_size (0: one scale per row
// of q, else g > 0 dividing n, even for int4). T is s8, u8 and f8E4M3FN respectively.
//
// Three regimes by m (rows of x per batch element): "rows" (m <= 4) splits k into
// chunks fixed by k alone and adds them at the end in chunk order; "panel" (small m
// for the format, FormatKernels::panel_for) and "blocks" (the rest) cut the columns
// into blocks. The blocks run on XLA's intra-op pool
// (matmul_q_parallel.h); each result element is summed in an order fixed by the
// shapes alone, so results never depend on the thread count.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "matmul_q_formats.h"
#include "matmul_q_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hxmlir {

namespace {
std::atomic<const FormatKernels*> g_format_kernels{nullptr};
}  // namespace

void SelectFormatKernels(const FormatKernels* k) {
  g_format_kernels.store(k, std::memory_order_release);
}

namespace {

// Regimes and block plans: matmul_q_parallel.h's, shared with the int8 kernel.

struct Spec {
  std::string_view dtype, layout, storage;
  ffi::DataType type;
  QFormat fmt;
  bool kn;
};

// The formats of the table (matmul_q_format_table.h) taken in the [in, out] layout.
constexpr Spec kAllSpecs[] = {
#define HX_X(id, D, dtype, layout, storage, type, pack, kn, i8x) \
  {dtype, layout, storage, ffi::DataType::type, ValueFormat::id, kn},
    HX_VALUE_FORMATS(HX_X)
#undef HX_X
};

struct FormatJob : BlockedJob {
  FormatProblem p;
  const FormatKernels* kern;
  bool rows = false, panel = false;

  void Run(int64_t t) {
    const int64_t b = t / blocks_per_batch, c = t % blocks_per_batch, lo = c * block_len;
    if (rows)
      return kern->rows(p, b, lo, std::min(p.k, lo + block_len), RowsAcc(p.y, b, c, p.m * p.n));
    if (panel) return kern->panel(p, b, lo, std::min(p.n, lo + block_len));
    kern->blocks(p, b, lo, std::min(p.n, lo + block_len),
                 ThreadBuffer(kScratch, FormatScratchFloats(block_len)));
  }
};

std::string TypeName(ffi::DataType t) {
  for (const Spec& s : kAllSpecs)
    if (s.type == t) return std::string(s.storage);
  if (t == ffi::DataType::F32) return "f32";
  return "dtype#" + std::to_string(static_cast<int>(t));
}

ffi::Error Invalid(std::string msg) {
  return ffi::Error::InvalidArgument("hx_matmul_q_cpu_v2: " + msg);
}

ffi::Error MatmulQV2(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q,
                     ffi::Buffer<ffi::F32> s, ffi::ResultBuffer<ffi::F32> y,
                     std::string_view dtype, std::string_view layout, int64_t group_size) {
  const Spec* spec = nullptr;
  for (const Spec& c : kAllSpecs)
    if (c.kn && c.dtype == dtype) spec = &c;
  if (spec == nullptr)
    return Invalid("unknown dtype attribute '" + std::string(dtype) + "' (expected " +
                   DtypeList([](const ValueFormatInfo& f) { return f.kn; }) + ")");
  if (layout != spec->layout)
    return Invalid("dtype " + std::string(dtype) + " is stored in layout '" +
                   std::string(spec->layout) + "', got layout '" + std::string(layout) + "'");
  const int64_t pack = PackOf(spec->fmt);
  const auto xd = x.dimensions(), qd = q.dimensions(), sd = s.dimensions(), yd = y->dimensions();
  const size_t r = xd.size();
  const std::string got = ", got f32" + ShapeText(xd) + ", " + TypeName(q.element_type()) +
                          ShapeText(qd) + ", f32" + ShapeText(sd) + " -> f32" + ShapeText(yd);
  const std::string scales =
      group_size == 0 ? "f32[*b, k]" : "f32[*b, k, n / " + std::to_string(group_size) + "]";
  const std::string want = "expects f32[*b, m, k], " + std::string(spec->storage) + "[*b, k, n" +
                           (pack > 1 ? " / " + std::to_string(pack) : "") + "], " + scales +
                           " -> f32[*b, m, n] for dtype " + std::string(dtype) +
                           ", group_size " + std::to_string(group_size);
  if (q.element_type() != spec->type) return Invalid(want + got);
  if (group_size < 0 || (group_size > 0 && group_size % pack != 0))
    return Invalid("group_size must be 0 (one scale per row) or positive" +
                   std::string(pack > 1 ? " and even" : "") + ", got " +
                   std::to_string(group_size));
  bool ok = r >= 2 && qd.size() == r && yd.size() == r && qd[r - 2] == xd[r - 1] &&
            sd.size() == (group_size == 0 ? r - 1 : r);
  for (size_t i = 0; ok && i + 2 < r; ++i) ok = qd[i] == xd[i] && sd[i] == xd[i] && yd[i] == xd[i];
  const int64_t n = ok ? qd[r - 1] * pack : 0;
  ok = ok && sd[r - 2] == qd[r - 2] && yd[r - 2] == xd[r - 2] && yd[r - 1] == n;
  if (ok && group_size > 0) ok = n % group_size == 0 && sd[r - 1] == n / group_size;
  if (!ok) return Invalid(want + got);

  const FormatKernels* kern = g_format_kernels.load(std::memory_order_acquire);
  if (kern == nullptr) kern = FormatKernelsGeneric();
  auto job = std::make_shared<FormatJob>();
  FormatProblem& p = job->p;
  p.x = x.typed_data();
  p.q = static_cast<const uint8_t*>(q.untyped_data());
  p.s = s.typed_data();
  p.y = y->typed_data();
  p.m = xd[r - 2];
  p.k = xd[r - 1];
  p.n = n;
  p.g = group_size == 0 ? std::max<int64_t>(n, 1) : group_size;
  p.ns = group_size == 0 ? 1 : n / group_size;
  p.fmt = spec->fmt;
  p.nb = BatchSize(xd);
  if (NothingToCompute(p.nb, p.m, p.k, p.n, p.y)) return ffi::Error::Success();
  job->kern = kern;
  const int64_t threads = ThreadsFor(pool, p.nb * p.m * p.k * p.n);
  job->rows = p.m <= kRowsMaxM;
  if (job->rows) {
    job->PlanRows(p.nb, p.m, p.k, p.n);
  } else {
    job->panel = kern->panel_for(p);
    float* xp = ThreadBuffer(kXs, p.nb * p.m * p.k);  // x packed (panel, blocks) by the first tasks
    job->pack.Plan(p.x, nullptr, p.nb, p.m, p.k, job->panel ? kern->panel_mr : kern->block_mr, xp);
    p.xp = xp;
    job->Plan(p.nb, ColumnBlocks(p.n, p.nb, job->panel ? kern->panel_nr : kern->block_nr, threads));
  }
  RunBlocks(pool, threads, job);

  if (job->rows) {
    job->AddPartials(p.y, p.nb, p.m * p.n);
    for (int64_t r = 0; r < p.nb * p.m; ++r) kern->rows_finish(p, p.y + r * p.n);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hxmlir

XLA_FFI_DEFINE_HANDLER_SYMBOL(HxMatmulQCpuV2, hxmlir::MatmulQV2,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // x
                                  .Arg<ffi::AnyBuffer>()          // q (s8, u8, f8E4M3FN)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // s
                                  .Ret<ffi::Buffer<ffi::F32>>()   // y
                                  .Attr<std::string_view>("dtype")
                                  .Attr<std::string_view>("layout")
                                  .Attr<int64_t>("group_size"));
