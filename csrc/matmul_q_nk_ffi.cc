// The XLA FFI handler of hx.matmul_q on CPU in the [out, in] layout (custom call target
// "hx_matmul_q_cpu_v3"; layout, formats, regimes and numerics in matmul_q_nk.h):
//
//   x: f32[*b, k], q: T[n, k / pack], s: S[n] or S[n, k / g] (, o: like s) -> y: f32[*b, n]
//
// Attributes (part of the IR contract; the call is refused unless they agree with the
// operands): dtype ("int8", "int4", "uint4", "float8_e4m3fn": the values), layout
// ("plain", "int4_pairs_v1", "uint4_pairs_v1" respectively), group_size (0: one scale
// per row of W, else g > 0 dividing k, even for 4-bit values), scale_dtype ("f32" or
// "f16": S, the scales' and offsets' dtype) and offset (whether the operand o follows s).
// T is s8, u8, u8 and f8E4M3FN.
//
// Threads: the rows of W are cut into blocks (whole tiles; fewer rows when a block of
// decoded weight would not fit half the L2 cache this CPU reports), about
// kBlocksPerThread per thread of XLA's intra-op pool (matmul_q_parallel.h); each output
// is computed by one thread in an order fixed by the shapes alone, so results never
// depend on the thread count.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "matmul_q_nk.h"
#include "matmul_q_nk_ffi.h"
#include "matmul_q_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hxmlir {

namespace {
std::atomic<const NkKernels*> g_nk_kernels{nullptr};
}  // namespace

void SelectNkKernels(const NkKernels* k) { g_nk_kernels.store(k, std::memory_order_release); }

namespace {

struct NkSpec {
  std::string_view dtype, layout, storage;
  ffi::DataType type;
  NkValues values;
};

// Every format of the table (matmul_q_format_table.h) is taken in [out, in].
constexpr NkSpec kNkSpecs[] = {
#define HX_X(id, D, dtype, layout, storage, type, ...) \
  {dtype, layout, storage, ffi::DataType::type, ValueFormat::id},
    HX_VALUE_FORMATS(HX_X)
#undef HX_X
};

// The L2 cache's bytes as this CPU reports them (256 KiB when it does not say).
int64_t L2Bytes() {
  static const int64_t bytes = [] {
    long b = -1;
#if defined(_SC_LEVEL2_CACHE_SIZE)
    b = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return b > 0 ? static_cast<int64_t>(b) : int64_t{256} << 10;
  }();
  return bytes;
}

struct NkJob : BlockedJob {
  NkProblem p;
  const NkKernels* kern;
  bool blocks = false;

  void Run(int64_t t) {
    const int64_t j0 = t * block_len, j1 = std::min(p.n, j0 + block_len);
    if (!blocks) return kern->dot(p, j0, j1);
    kern->blocks(p, j0, j1, ThreadBuffer(kScratch, NkBlocksScratch(kern->tile_mr, j1 - j0, p.mp)));
  }
};

std::string NkTypeName(ffi::DataType t) {
  for (const NkSpec& s : kNkSpecs)
    if (s.type == t) return std::string(s.storage);
  if (t == ffi::DataType::F32) return "f32";
  if (t == ffi::DataType::F16) return "f16";
  if (t == ffi::DataType::U16) return "u16";
  return "dtype#" + std::to_string(static_cast<int>(t));
}

// x in "dot"'s chunk order (matmul_q_nk.h): in each group, each whole chunk of cw dense
// elements [e0, e1, ..., e_{cw-1}] as [e0, e2, ..., e1, e3, ...] (pack 2: the low
// nibbles' lanes, then the high nibbles'); the group's elements past them unchanged.
void NkChunkOrder(const float* x, int64_t m, int64_t k, int64_t g, int64_t cw, float* out) {
  const int64_t half = cw / 2;
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * k;
    float* oi = out + i * k;
    for (int64_t kb = 0; kb < k; kb += g) {
      const int64_t gv = g / cw * cw;
      for (int64_t c = kb; c < kb + gv; c += cw)
        for (int64_t l = 0; l < half; ++l) {
          oi[c + l] = xi[c + 2 * l];
          oi[c + half + l] = xi[c + 2 * l + 1];
        }
      std::copy(xi + kb + gv, xi + kb + g, oi + kb + gv);
    }
  }
}

// x^T for "blocks" (matmul_q_nk.h), in the calling thread's kXs buffer: f32[k, mp], mp
// (set here) m rounded up to whole vectors of w lanes, zeros past m.
const float* NkTransposed(const float* x, int64_t m, int64_t k, int64_t w, int64_t* mp) {
  *mp = CeilDiv(m, w) * w;
  float* xt = ThreadBuffer(kXs, k * *mp);
  for (int64_t kk = 0; kk < k; ++kk) std::fill(xt + kk * *mp + m, xt + (kk + 1) * *mp, 0.f);
  constexpr int64_t kTile = 16;  // a tile of x read and written within L1
  for (int64_t i0 = 0; i0 < m; i0 += kTile)
    for (int64_t k0 = 0; k0 < k; k0 += kTile)
      for (int64_t i = i0; i < std::min(m, i0 + kTile); ++i)
        for (int64_t kk = k0; kk < std::min(k, k0 + kTile); ++kk) xt[kk * *mp + i] = x[i * k + kk];
  return xt;
}

// x's and y's leading dims agree, x's last is xk and y's is yk.
bool LeadingDims(ffi::Span<const int64_t> xd, ffi::Span<const int64_t> yd, int64_t xk,
                 int64_t yk) {
  const size_t r = xd.size();
  if (r < 1 || yd.size() != r || xd[r - 1] != xk || yd[r - 1] != yk) return false;
  for (size_t i = 0; i + 1 < r; ++i)
    if (xd[i] != yd[i]) return false;
  return true;
}

}  // namespace

ffi::Error BindNk(std::string_view target, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q,
                  ffi::AnyBuffer s, ffi::RemainingArgs rest, ffi::Buffer<ffi::F32>* y,
                  std::string_view dtype, std::string_view layout, int64_t group_size,
                  std::string_view scale_dtype, bool offset, NkProblem* out, bool transposed) {
  auto Invalid = [&](std::string msg) {
    return ffi::Error::InvalidArgument(std::string(target) + ": " + msg);
  };
  const NkSpec* spec = nullptr;
  for (const NkSpec& c : kNkSpecs)
    if (c.dtype == dtype) spec = &c;
  if (spec == nullptr)
    return Invalid("unknown dtype attribute '" + std::string(dtype) + "' (expected " +
                   DtypeList([](const ValueFormatInfo&) { return true; }) + ")");
  if (layout != spec->layout)
    return Invalid("dtype " + std::string(dtype) + " is stored in layout '" +
                   std::string(spec->layout) + "', got layout '" + std::string(layout) + "'");
  if (scale_dtype != "f32" && scale_dtype != "f16")
    return Invalid("scale_dtype must be f32 or f16, got '" + std::string(scale_dtype) + "'");
  const ffi::DataType st = scale_dtype == "f16" ? ffi::DataType::F16 : ffi::DataType::F32;
  const int64_t pack = NkPackOf(spec->values);
  if (group_size < 0 || (group_size > 0 && group_size % pack != 0))
    return Invalid("group_size must be 0 (one scale per row) or positive" +
                   std::string(pack > 1 ? " and even" : "") + ", got " +
                   std::to_string(group_size));
  if (rest.size() != (offset ? 1u : 0u))
    return Invalid(std::string(offset ? "offset=true expects the operand o after s"
                                      : "offset=false expects no operand after s") +
                   ", got " + std::to_string(3 + rest.size()) + " operands");
  const auto xd = x.dimensions(), qd = q.dimensions(), sd = s.dimensions(), yd = y->dimensions();
  std::string got = ", got f32" + ShapeText(xd) + ", " + NkTypeName(q.element_type()) +
                    ShapeText(qd) + ", " + NkTypeName(s.element_type()) + ShapeText(sd);
  const void* o_data = nullptr;
  bool o_ok = true;
  if (offset) {
    auto o = rest.get<ffi::AnyBuffer>(0);
    if (!o.has_value()) return Invalid("cannot read the offset operand");
    got += ", " + NkTypeName(o->element_type()) + ShapeText(o->dimensions());
    o_ok = o->element_type() == st && o->dimensions() == sd;
    o_data = o->untyped_data();
  }
  got += " -> f32" + ShapeText(yd);
  const std::string sn(scale_dtype), g = std::to_string(group_size);
  const std::string scales = group_size == 0 ? sn + "[n]" : sn + "[n, k / " + g + "]";
  const std::string xs = transposed ? "f32[*b, n]" : "f32[*b, k]";
  const std::string ys = transposed ? "f32[*b, k]" : "f32[*b, n]";
  const std::string want = "expects " + xs + ", " + std::string(spec->storage) + "[n, k" +
                           (pack > 1 ? " / " + std::to_string(pack) : "") + "], " + scales +
                           (offset ? ", " + scales : "") + " -> " + ys + " for dtype " +
                           std::string(dtype) + ", group_size " + g + ", scale_dtype " + sn +
                           ", offset " + (offset ? "true" : "false");
  const size_t r = xd.size();
  bool ok = q.element_type() == spec->type && s.element_type() == st && o_ok &&
            qd.size() == 2 && sd.size() == (group_size == 0 ? 1u : 2u);
  const int64_t k = ok ? qd[1] * pack : 0, n = ok ? qd[0] : 0;
  ok = ok && sd[0] == n && LeadingDims(xd, yd, transposed ? n : k, transposed ? k : n);
  if (ok && group_size > 0) ok = k % group_size == 0 && sd[1] == k / group_size;
  if (!ok) return Invalid(want + got);

  NkProblem& p = *out;
  p.x = x.typed_data();
  p.q = static_cast<const uint8_t*>(q.untyped_data());
  p.s = s.untyped_data();
  p.o = o_data;
  p.f16 = st == ffi::DataType::F16;
  p.y = y->typed_data();
  p.m = 1;
  for (size_t i = 0; i + 1 < r; ++i) p.m *= xd[i];
  p.k = k;
  p.n = n;
  p.g = group_size == 0 ? std::max<int64_t>(k, 1) : group_size;
  p.ns = group_size == 0 ? 1 : k / group_size;
  p.values = spec->values;
  return ffi::Error::Success();
}

Blocking NkRowBlocks(int64_t n, int64_t nr, int64_t threads, int64_t row_bytes) {
  const Blocking b = ColumnBlocks(n, 1, nr, threads);
  const int64_t fit = std::max(nr, L2Bytes() / 2 / row_bytes / nr * nr);
  return b.len > fit ? Blocking{fit, CeilDiv(n, fit)} : b;
}

namespace {

ffi::Error MatmulQV3(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q,
                     ffi::AnyBuffer s, ffi::RemainingArgs rest, ffi::ResultBuffer<ffi::F32> y,
                     std::string_view dtype, std::string_view layout, int64_t group_size,
                     std::string_view scale_dtype, bool offset) {
  auto job = std::make_shared<NkJob>();
  NkProblem& p = job->p;
  if (ffi::Error e = BindNk("hx_matmul_q_cpu_v3", x, q, s, rest, &*y, dtype, layout, group_size,
                            scale_dtype, offset, &p);
      e.failure())
    return e;
  const int64_t pack = NkPackOf(p.values);
  const NkKernels* kern = g_nk_kernels.load(std::memory_order_acquire);
  if (kern == nullptr) kern = NkKernelsGeneric();
  if (NothingToCompute(1, p.m, p.k, p.n, p.y)) return ffi::Error::Success();
  job->kern = kern;
  const int64_t threads = ThreadsFor(pool, p.m * p.k * p.n);
  job->blocks = p.m > kern->dot_max_m;
  if (job->blocks) {
    p.xt = NkTransposed(p.x, p.m, p.k, kern->w, &p.mp);
    job->Plan(1, ColumnBlocks(p.n, 1, kern->tile_mr, threads));
  } else {
    p.xd = p.x;
    if (pack > 1) {
      float* xd_buf = ThreadBuffer(kXs, p.m * p.k);
      NkChunkOrder(p.x, p.m, p.k, p.g, NkChunkWidth(p.values, kern->w), xd_buf);
      p.xd = xd_buf;
    }
    if (offset) {
      float* xs = ThreadBuffer(kPartial, p.m * p.ns);
      for (int64_t i = 0; i < p.m; ++i)
        for (int64_t gi = 0; gi < p.ns; ++gi) {
          const float* xg = p.x + i * p.k + gi * p.g;
          float t = 0.f;
          for (int64_t e = 0; e < p.g; ++e) t += xg[e];
          xs[i * p.ns + gi] = t;
        }
      p.xsum = xs;
    }
    job->Plan(1, ColumnBlocks(p.n, 1, 4, threads));
  }
  RunBlocks(pool, threads, job);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hxmlir

namespace hxmlir {
namespace {

struct BlockJob : BlockedJob {
  BlockProblem p;
  const NkKernels* kern;
  bool tiles = false;

  void Run(int64_t t) {
    const int64_t j0 = t * block_len, j1 = std::min(p.n, j0 + block_len);
    if (!tiles) return kern->block_dot(p, j0, j1);
    kern->block_tiles(p, j0, j1,
                      ThreadBuffer(kScratch, NkBlocksScratch(kern->tile_mr, j1 - j0, p.mp)));
  }
};

}  // namespace

// hx_matmul_q_cpu_v4: x: f32[*b, k], q: u16[n, k / B, bytes / 2] (the blocks' bytes, as
// 16-bit words), d: f16[n, k / B] (, dmin: f16[n, k / B]) -> f32[*b, n] for the block
// format named by dtype and layout (matmul_q_format_table.h), group_size B, scale_dtype
// f16, offset as the format has one.
ffi::Error BindBlock(std::string_view target, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q,
                     ffi::AnyBuffer s, ffi::RemainingArgs rest, ffi::Buffer<ffi::F32>* y,
                     std::string_view dtype, std::string_view layout, int64_t group_size,
                     std::string_view scale_dtype, bool offset, BlockProblem* out,
                     bool transposed) {
  auto Invalid = [&](std::string msg) {
    return ffi::Error::InvalidArgument(std::string(target) + ": " + msg);
  };
  int fi = -1;
  std::string names;
  for (int i = 0; i < static_cast<int>(std::size(kBlockFormats)); ++i) {
    if (kBlockFormats[i].dtype == dtype) fi = i;
    names += (i ? ", " : "") + std::string(kBlockFormats[i].dtype);
  }
  if (fi < 0)
    return Invalid("unknown dtype attribute '" + std::string(dtype) + "' (expected one of " +
                   names + ")");
  const BlockFormatInfo& f = kBlockFormats[fi];
  if (layout != f.layout)
    return Invalid("dtype " + std::string(dtype) + " is stored in layout '" + f.layout +
                   "', got layout '" + std::string(layout) + "'");
  if (group_size != f.block || scale_dtype != "f16" || offset != f.offset)
    return Invalid("dtype " + std::string(dtype) + " has group_size " +
                   std::to_string(f.block) + ", scale_dtype f16, offset " +
                   (f.offset ? "true" : "false") + "; got group_size " +
                   std::to_string(group_size) + ", scale_dtype " + std::string(scale_dtype) +
                   ", offset " + (offset ? "true" : "false"));
  if (rest.size() != (offset ? 1u : 0u))
    return Invalid(std::string(offset ? "offset=true expects the operand dmin after d"
                                      : "offset=false expects no operand after d") +
                   ", got " + std::to_string(3 + rest.size()) + " operands");
  const auto xd = x.dimensions(), qd = q.dimensions(), sd = s.dimensions(), yd = y->dimensions();
  std::string got = ", got f32" + ShapeText(xd) + ", " + NkTypeName(q.element_type()) +
                    ShapeText(qd) + ", " + NkTypeName(s.element_type()) + ShapeText(sd);
  const uint16_t* dmin = nullptr;
  bool o_ok = true;
  if (offset) {
    auto o = rest.get<ffi::AnyBuffer>(0);
    if (!o.has_value()) return Invalid("cannot read the operand dmin");
    got += ", " + NkTypeName(o->element_type()) + ShapeText(o->dimensions());
    o_ok = o->element_type() == ffi::DataType::F16 && o->dimensions() == sd;
    dmin = static_cast<const uint16_t*>(o->untyped_data());
  }
  got += " -> f32" + ShapeText(yd);
  const std::string blk = std::to_string(f.block);
  const std::string want = std::string("expects ") + (transposed ? "f32[*b, n]" : "f32[*b, k]") +
                           ", u16[n, k / " + blk + ", " + std::to_string(f.bytes / 2) +
                           "], f16[n, k / " + blk + "]" + (offset ? ", f16[n, k / " + blk + "]" : "") +
                           " -> " + (transposed ? "f32[*b, k]" : "f32[*b, n]") + " for dtype " +
                           std::string(dtype);
  const size_t r = xd.size();
  bool ok = q.element_type() == ffi::DataType::U16 && s.element_type() == ffi::DataType::F16 &&
            o_ok && qd.size() == 3 && sd.size() == 2;
  const int64_t k = ok ? qd[1] * f.block : 0, n = ok ? qd[0] : 0;
  ok = ok && qd[2] * 2 == f.bytes && sd[0] == n && sd[1] == qd[1] &&
       LeadingDims(xd, yd, transposed ? n : k, transposed ? k : n);
  if (!ok) return Invalid(want + got);

  BlockProblem& p = *out;
  p.x = x.typed_data();
  p.q = static_cast<const uint8_t*>(q.untyped_data());
  p.d = static_cast<const uint16_t*>(s.untyped_data());
  p.dmin = dmin;
  p.y = y->typed_data();
  p.m = 1;
  for (size_t i = 0; i + 1 < r; ++i) p.m *= xd[i];
  p.k = k;
  p.n = n;
  p.nb = k / f.block;
  p.fmt = static_cast<BlockFormat>(fi);
  return ffi::Error::Success();
}

namespace {

// hx_matmul_q_cpu_v4 (BindBlock checks its operands).
ffi::Error MatmulQV4(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q,
                     ffi::AnyBuffer s, ffi::RemainingArgs rest, ffi::ResultBuffer<ffi::F32> y,
                     std::string_view dtype, std::string_view layout, int64_t group_size,
                     std::string_view scale_dtype, bool offset) {
  auto job = std::make_shared<BlockJob>();
  BlockProblem& p = job->p;
  if (ffi::Error e = BindBlock("hx_matmul_q_cpu_v4", x, q, s, rest, &*y, dtype, layout,
                               group_size, scale_dtype, offset, &p);
      e.failure())
    return e;
  const NkKernels* kern = g_nk_kernels.load(std::memory_order_acquire);
  if (kern == nullptr) kern = NkKernelsGeneric();
  if (NothingToCompute(1, p.m, p.k, p.n, p.y)) return ffi::Error::Success();
  job->kern = kern;
  const int64_t threads = ThreadsFor(pool, p.m * p.k * p.n);
  job->tiles = p.m > kern->dot_max_m;
  if (job->tiles) {
    p.xt = NkTransposed(p.x, p.m, p.k, kern->w, &p.mp);
    job->Plan(1, ColumnBlocks(p.n, 1, kern->tile_mr, threads));
  } else {
    p.xsum = kern->block_xsums(p, ThreadBuffer(kPartial, p.m * p.k / 16));
    job->Plan(1, ColumnBlocks(p.n, 1, 4, threads));
  }
  RunBlocks(pool, threads, job);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hxmlir

XLA_FFI_DEFINE_HANDLER_SYMBOL(HxMatmulQCpuV3, hxmlir::MatmulQV3, HX_NK_FFI_BINDING());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HxMatmulQCpuV4, hxmlir::MatmulQV4, HX_NK_FFI_BINDING());
