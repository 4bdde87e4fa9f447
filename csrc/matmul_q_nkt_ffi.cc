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
// unless they agree with the operands.
//
// Threads: tasks of a panel of columns of W and a block of rows of x (matmul_q_nkt.h),
// enough for about kBlocksPerThread per thread where the shapes allow; each output is
// computed by one task in an order fixed by the shapes alone.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "matmul_q_nkt.h"
#include "matmul_q_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hxmlir {
namespace {

std::atomic<const NktKernels*> g_nkt_kernels{nullptr};

struct NktSpec {
  std::string_view dtype, layout, storage;
  ffi::DataType type;
  ValueFormat values;
};

constexpr NktSpec kNktSpecs[] = {
#define HX_X(id, D, dtype, layout, storage, type, ...) \
  {dtype, layout, storage, ffi::DataType::type, ValueFormat::id},
    HX_VALUE_FORMATS(HX_X)
#undef HX_X
};

std::string TypeName(ffi::DataType t) {
  for (const NktSpec& s : kNktSpecs)
    if (s.type == t) return std::string(s.storage);
  if (t == ffi::DataType::F32) return "f32";
  if (t == ffi::DataType::F16) return "f16";
  if (t == ffi::DataType::U16) return "u16";
  return "dtype#" + std::to_string(static_cast<int>(t));
}

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

// The operands' types for messages: ", got f32[..], T[..], S[..](, S[..]) -> f32[..]".
std::string Got(ffi::Span<const int64_t> xd, const ffi::AnyBuffer& q, const ffi::AnyBuffer& s,
                const ffi::AnyBuffer* o, ffi::Span<const int64_t> yd) {
  std::string got = ", got f32" + ShapeText(xd) + ", " + TypeName(q.element_type()) +
                    ShapeText(q.dimensions()) + ", " + TypeName(s.element_type()) +
                    ShapeText(s.dimensions());
  if (o != nullptr) got += ", " + TypeName(o->element_type()) + ShapeText(o->dimensions());
  return got + " -> f32" + ShapeText(yd);
}

// x's and y's leading dims agree, x's last is n and y's is k; p.m = their product.
bool LeadingDims(ffi::Span<const int64_t> xd, ffi::Span<const int64_t> yd, int64_t n, int64_t k,
                 NktProblem* p) {
  const size_t r = xd.size();
  if (r < 1 || yd.size() != r || xd[r - 1] != n || yd[r - 1] != k) return false;
  p->m = 1;
  for (size_t i = 0; i + 1 < r; ++i) {
    if (xd[i] != yd[i]) return false;
    p->m *= xd[i];
  }
  return true;
}

ffi::Error MatmulQNktV1(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q,
                        ffi::AnyBuffer s, ffi::RemainingArgs rest, ffi::ResultBuffer<ffi::F32> y,
                        std::string_view dtype, std::string_view layout, int64_t group_size,
                        std::string_view scale_dtype, bool offset) {
  auto Invalid = [&](std::string msg) {
    return ffi::Error::InvalidArgument("hx_matmul_q_cpu_nkt_v1: " + msg);
  };
  const NktSpec* spec = nullptr;
  for (const NktSpec& c : kNktSpecs)
    if (c.dtype == dtype) spec = &c;
  int fi = -1;
  std::string names = DtypeList([](const ValueFormatInfo&) { return true; }, "and");
  for (int i = 0; i < static_cast<int>(std::size(kBlockFormats)); ++i) {
    if (kBlockFormats[i].dtype == dtype) fi = i;
    names += std::string(", ") + kBlockFormats[i].dtype;
  }
  if (spec == nullptr && fi < 0)
    return Invalid("unknown dtype attribute '" + std::string(dtype) + "' (expected one of " +
                   names + ")");
  const std::string want_layout = spec ? std::string(spec->layout) : kBlockFormats[fi].layout;
  if (layout != want_layout)
    return Invalid("dtype " + std::string(dtype) + " is stored in layout '" + want_layout +
                   "', got layout '" + std::string(layout) + "'");
  if (rest.size() != (offset ? 1u : 0u))
    return Invalid(std::string(offset ? "offset=true expects the operand o after s"
                                      : "offset=false expects no operand after s") +
                   ", got " + std::to_string(3 + rest.size()) + " operands");
  std::optional<ffi::AnyBuffer> o;
  if (offset) {
    auto r = rest.get<ffi::AnyBuffer>(0);
    if (!r.has_value()) return Invalid("cannot read the offset operand");
    o.emplace(*r);
  }
  const auto xd = x.dimensions(), qd = q.dimensions(), sd = s.dimensions(), yd = y->dimensions();
  const std::string got = Got(xd, q, s, o ? &*o : nullptr, yd);

  auto job = std::make_shared<NktJob>();
  NktProblem& p = job->p;
  p.x = x.typed_data();
  p.q = static_cast<const uint8_t*>(q.untyped_data());
  p.s = s.untyped_data();
  p.o = o ? o->untyped_data() : nullptr;
  p.y = y->typed_data();
  if (spec != nullptr) {  // a value format: hx_matmul_q_cpu_v3's operands
    if (scale_dtype != "f32" && scale_dtype != "f16")
      return Invalid("scale_dtype must be f32 or f16, got '" + std::string(scale_dtype) + "'");
    const ffi::DataType st = scale_dtype == "f16" ? ffi::DataType::F16 : ffi::DataType::F32;
    const int64_t pack = PackOf(spec->values);
    if (group_size < 0 || (group_size > 0 && group_size % pack != 0))
      return Invalid("group_size must be 0 (one scale per row) or positive" +
                     std::string(pack > 1 ? " and even" : "") + ", got " +
                     std::to_string(group_size));
    const std::string sn(scale_dtype), g = std::to_string(group_size);
    const std::string scales = group_size == 0 ? sn + "[n]" : sn + "[n, k / " + g + "]";
    const std::string want = "expects f32[*b, n], " + std::string(spec->storage) + "[n, k" +
                             (pack > 1 ? " / " + std::to_string(pack) : "") + "], " + scales +
                             (offset ? ", " + scales : "") + " -> f32[*b, k] for dtype " +
                             std::string(dtype) + ", group_size " + g + ", scale_dtype " + sn +
                             ", offset " + (offset ? "true" : "false");
    bool ok = q.element_type() == spec->type && s.element_type() == st &&
              (!o || (o->element_type() == st && o->dimensions() == sd)) && qd.size() == 2 &&
              sd.size() == (group_size == 0 ? 1u : 2u);
    const int64_t n = ok ? qd[0] : 0, k = ok ? qd[1] * pack : 0;
    ok = ok && sd[0] == n && LeadingDims(xd, yd, n, k, &p);
    if (ok && group_size > 0) ok = k % group_size == 0 && sd[1] == k / group_size;
    if (!ok) return Invalid(want + got);
    p.n = n;
    p.k = k;
    p.f16 = st == ffi::DataType::F16;
    p.g = group_size == 0 ? std::max<int64_t>(k, 1) : group_size;
    p.ns = group_size == 0 ? 1 : k / group_size;
    p.values = spec->values;
  } else {  // a block format: hx_matmul_q_cpu_v4's operands
    const BlockFormatInfo& f = kBlockFormats[fi];
    if (group_size != f.block || scale_dtype != "f16" || offset != f.offset)
      return Invalid("dtype " + std::string(dtype) + " has group_size " +
                     std::to_string(f.block) + ", scale_dtype f16, offset " +
                     (f.offset ? "true" : "false") + "; got group_size " +
                     std::to_string(group_size) + ", scale_dtype " + std::string(scale_dtype) +
                     ", offset " + (offset ? "true" : "false"));
    const std::string blk = std::to_string(f.block);
    const std::string want = "expects f32[*b, n], u16[n, k / " + blk + ", " +
                             std::to_string(f.bytes / 2) + "], f16[n, k / " + blk + "]" +
                             (offset ? ", f16[n, k / " + blk + "]" : "") +
                             " -> f32[*b, k] for dtype " + std::string(dtype);
    bool ok = q.element_type() == ffi::DataType::U16 && s.element_type() == ffi::DataType::F16 &&
              (!o || (o->element_type() == ffi::DataType::F16 && o->dimensions() == sd)) &&
              qd.size() == 3 && sd.size() == 2;
    const int64_t n = ok ? qd[0] : 0, k = ok ? qd[1] * f.block : 0;
    ok = ok && qd[2] * 2 == f.bytes && sd[0] == n && sd[1] == qd[1] &&
         LeadingDims(xd, yd, n, k, &p);
    if (!ok) return Invalid(want + got);
    p.n = n;
    p.k = k;
    p.f16 = true;
    p.block = true;
    p.fmt = static_cast<BlockFormat>(fi);
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(HxMatmulQCpuNktV1, hxmlir::MatmulQNktV1,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x
                                  .Arg<ffi::AnyBuffer>()         // q
                                  .Arg<ffi::AnyBuffer>()         // s (d)
                                  .RemainingArgs()               // o (dmin)
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y
                                  .Attr<std::string_view>("dtype")
                                  .Attr<std::string_view>("layout")
                                  .Attr<int64_t>("group_size")
                                  .Attr<std::string_view>("scale_dtype")
                                  .Attr<bool>("offset"));
