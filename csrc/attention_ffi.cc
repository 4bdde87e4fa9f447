// The XLA FFI handlers of hx.attention on CPU (custom call targets "hx_attention_cpu_v1",
// "_v2" and "_v3"; semantics in attention.h) and the choice of its ISA copy.
//
//   q: f32[T, kv, g, d], k: f32[kv, C, d], v: f32[kv, d, C], start: s32[]  (attributes
//   scale: f32; v2 also window: s64 >= 0, softcap: f32 >= 0)  ->  f32[T, kv, g, d]
//   v3 (v2's attributes): q: f32[B, T, kv, g, d], k: f32[B, kv, C, d] or f32[kv, C, d],
//   v: f32[B, kv, d, C] or f32[kv, d, C], start: s32[B]  ->  f32[B, T, kv, g, d]
//
// Operands of other types or shapes are refused with InvalidArgument naming them. The
// work is one block per (query t, KV head h) (v3: per (element b, t, h), B T kv blocks).
// A call of fewer than kSerialMacs multiply-adds over the positions it reads, or of fewer
// than kMinBlocksPerThread blocks per core (decode: T = 1, kv blocks), runs on the calling
// thread; above (prefill, a batch of decode steps) the blocks are shared with XLA's
// intra-op pool (RunBlocks, matmul_q_parallel.h). Each output is computed by one thread
// in an order fixed by the shapes alone.
#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "attention.h"
#include "matmul_q_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hxmlir {

namespace {

std::atomic<const AttentionKernels*> g_attention_kernels{nullptr};

constexpr char kTargetV1[] = "hx_attention_cpu_v1";
constexpr char kTargetV2[] = "hx_attention_cpu_v2";
constexpr char kTargetV3[] = "hx_attention_cpu_v3";

// Calls of fewer blocks than this many per usable core run on the calling thread.
constexpr int64_t kMinBlocksPerThread = 4;

// The blocks of one call: (query t, KV head h) of batch element i, block (i * T + t) * kv + h
// (one element, i = 0, for v1 and v2).
struct AttentionJob : BlockCounter {
  AttentionProblem p;  // batch element 0 (v3), or the problem (v1, v2)
  const AttentionKernels* kern;
  const int32_t* starts = nullptr;  // v3: each element's start
  int64_t q_stride = 0;             // floats from one element's q (and out) to the next
  int64_t kv_stride = 0;            // ... k's and v's (0: one cache shared by every element)

  void Block(int64_t b, float* scratch) const {
    const int64_t per = p.t * p.kv, i = b / per, r = b % per;
    if (starts == nullptr) {
      kern->head(p, r / p.kv, r % p.kv, scratch);
      return;
    }
    AttentionProblem e = p;
    e.q += i * q_stride;
    e.out += i * q_stride;
    e.k += i * kv_stride;
    e.v += i * kv_stride;
    e.start = starts[i];
    kern->head(e, r / p.kv, r % p.kv, scratch);
  }

  void Run(int64_t b) { Block(b, ThreadBuffer(kScratch, AttentionScratchFloats(p.c))); }
};

// "f32", "s32", ...: a buffer's element type as the error messages spell it.
std::string ElementTypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return "f32";
    case ffi::DataType::F64: return "f64";
    case ffi::DataType::F16: return "f16";
    case ffi::DataType::BF16: return "bf16";
    case ffi::DataType::S32: return "s32";
    case ffi::DataType::S64: return "s64";
    case ffi::DataType::S8: return "s8";
    case ffi::DataType::U8: return "u8";
    case ffi::DataType::U32: return "u32";
    case ffi::DataType::PRED: return "pred";
    default: return "type" + std::to_string(static_cast<int>(t));
  }
}

std::string TypeText(const ffi::AnyBuffer& b) {
  return ElementTypeName(b.element_type()) + ShapeText(b.dimensions());
}

ffi::Error Execute(ffi::ThreadPool& pool, const std::shared_ptr<AttentionJob>& job,
                   int64_t batch);

// InvalidArgument naming `target` unless window >= 0 and softcap is finite and >= 0.
ffi::Error CheckCaps(const char* target, int64_t window, float softcap) {
  if (window < 0 || !(softcap >= 0.f) || std::isinf(softcap))
    return ffi::Error::InvalidArgument(
        std::string(target) + " expects window >= 0 and a finite softcap >= 0, got window " +
        std::to_string(window) + ", softcap " + std::to_string(softcap));
  return ffi::Error::Success();
}

// A job over the (checked) operands: one element's shape t, kv, g, d, c and the attributes;
// its start (or starts) the caller's to set.
std::shared_ptr<AttentionJob> NewJob(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                                     const ffi::AnyBuffer& v, ffi::Result<ffi::AnyBuffer>& out,
                                     int64_t t, int64_t kv, int64_t g, int64_t d, int64_t c,
                                     float scale, int64_t window, float softcap) {
  auto job = std::make_shared<AttentionJob>();
  AttentionProblem& p = job->p;
  p.q = static_cast<const float*>(q.untyped_data());
  p.k = static_cast<const float*>(k.untyped_data());
  p.v = static_cast<const float*>(v.untyped_data());
  p.out = static_cast<float*>(out->untyped_data());
  p.t = t, p.kv = kv, p.g = g, p.d = d, p.c = c;
  p.start = 0;
  p.scale = scale;
  p.window = window;
  p.softcap = softcap;
  return job;
}

// Both versions' work; `target` names the caller's target in errors.
ffi::Error Run(const char* target, ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
               ffi::AnyBuffer v, ffi::AnyBuffer start, ffi::Result<ffi::AnyBuffer> out,
               float scale, int64_t window, float softcap) {
  if (ffi::Error e = CheckCaps(target, window, softcap); e.failure()) return e;
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(),
             od = out->dimensions();
  const auto f32 = ffi::DataType::F32;
  bool ok = q.element_type() == f32 && k.element_type() == f32 && v.element_type() == f32 &&
            start.element_type() == ffi::DataType::S32 && out->element_type() == f32 &&
            qd.size() == 4 && kd.size() == 3 && vd.size() == 3 && start.dimensions().size() == 0 &&
            od.size() == 4;
  ok = ok && kd[0] == qd[1] && kd[2] == qd[3] && vd[0] == qd[1] && vd[1] == qd[3] &&
       vd[2] == kd[1] && std::equal(od.begin(), od.end(), qd.begin());
  if (!ok)
    return ffi::Error::InvalidArgument(
        std::string(target) + " expects q: f32[T, kv, g, d], k: f32[kv, C, d], v: f32[kv, d, C], "
        "start: s32[] -> f32[T, kv, g, d], got " + TypeText(q) + ", " + TypeText(k) + ", " +
        TypeText(v) + ", " + TypeText(start) + " -> " + TypeText(*out));
  auto job = NewJob(q, k, v, out, qd[0], qd[1], qd[2], qd[3], kd[1], scale, window, softcap);
  int32_t s0;
  std::memcpy(&s0, start.untyped_data(), sizeof s0);
  job->p.start = s0;
  return Execute(pool, job, 1);
}

// Runs `job` over `batch` elements (each with the start job->starts gives, or job->p.start):
// the blocks on the calling thread or shared with the pool.
ffi::Error Execute(ffi::ThreadPool& pool, const std::shared_ptr<AttentionJob>& job,
                   int64_t batch) {
  const AttentionProblem& p = job->p;
  const int64_t blocks = batch * p.t * p.kv;
  if (blocks == 0 || p.g == 0 || p.d == 0) return ffi::Error::Success();
  if (p.c == 0) {  // no position at all: the reference's sum over no position is 0
    std::fill(p.out, p.out + blocks * p.g * p.d, 0.f);
    return ffi::Error::Success();
  }
  job->kern = SelectedAttentionKernels();
  // multiply-adds over the positions read: both products, every query of every element
  int64_t macs = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t start = job->starts == nullptr ? p.start : job->starts[i];
    for (int64_t t = 0; t < p.t; ++t)
      macs += 2 * p.kv * p.g * p.d *
              std::clamp<int64_t>(start + t + 1, 1, p.window > 0 ? std::min(p.c, p.window) : p.c);
  }
  // the pool only with a few blocks per core: a decode step's kv blocks (T = 1) are fewer
  // than that, and shared they run slower than on the calling thread alone (SmolLM2, 3
  // heads at 512 positions, 2 cores: 74 us a call against 36)
  const int64_t threads =
      blocks >= kMinBlocksPerThread * UsableCores() ? ThreadsFor(pool, macs) : 1;
  if (threads <= 1) {
    float* scratch = ThreadBuffer(kScratch, AttentionScratchFloats(p.c));
    for (int64_t b = 0; b < blocks; ++b) job->Block(b, scratch);
    return ffi::Error::Success();
  }
  job->total = blocks;
  RunBlocks(pool, threads, job);
  return ffi::Error::Success();
}

// v3: a batch of v2 problems, each element its own start (attention.h).
ffi::Error AttentionBatched(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
                            ffi::AnyBuffer v, ffi::AnyBuffer start,
                            ffi::Result<ffi::AnyBuffer> out, float scale, int64_t window,
                            float softcap) {
  constexpr const char* target = kTargetV3;
  if (ffi::Error e = CheckCaps(target, window, softcap); e.failure()) return e;
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(),
             od = out->dimensions(), sd = start.dimensions();
  const auto f32 = ffi::DataType::F32;
  bool ok = q.element_type() == f32 && k.element_type() == f32 && v.element_type() == f32 &&
            start.element_type() == ffi::DataType::S32 && out->element_type() == f32 &&
            qd.size() == 5 && (kd.size() == 3 || kd.size() == 4) && vd.size() == kd.size() &&
            sd.size() == 1 && od.size() == 5;
  // k's and v's dimensions after their batch dimension, if any
  const size_t kb = ok ? kd.size() - 3 : 0;
  ok = ok && sd[0] == qd[0] && (kb == 0 || (kd[0] == qd[0] && vd[0] == qd[0])) &&
       kd[kb] == qd[2] && kd[kb + 2] == qd[4] && vd[kb] == qd[2] && vd[kb + 1] == qd[4] &&
       vd[kb + 2] == kd[kb + 1] && std::equal(od.begin(), od.end(), qd.begin());
  if (!ok)
    return ffi::Error::InvalidArgument(
        std::string(target) + " expects q: f32[B, T, kv, g, d], k: f32[B, kv, C, d] (or "
        "f32[kv, C, d]), v: f32[B, kv, d, C] (or f32[kv, d, C], as k), start: s32[B] -> "
        "f32[B, T, kv, g, d], got " + TypeText(q) + ", " + TypeText(k) + ", " + TypeText(v) +
        ", " + TypeText(start) + " -> " + TypeText(*out));
  auto job = NewJob(q, k, v, out, qd[1], qd[2], qd[3], qd[4], kd[kb + 1], scale, window,
                    softcap);
  const AttentionProblem& p = job->p;
  job->starts = static_cast<const int32_t*>(start.untyped_data());
  job->q_stride = p.t * p.kv * p.g * p.d;
  job->kv_stride = kb == 0 ? 0 : p.kv * p.c * p.d;
  return Execute(pool, job, qd[0]);
}

ffi::Error Attention(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                     ffi::AnyBuffer start, ffi::Result<ffi::AnyBuffer> out, float scale) {
  return Run(kTargetV1, pool, q, k, v, start, out, scale, 0, 0.f);
}

ffi::Error AttentionWindowed(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
                             ffi::AnyBuffer v, ffi::AnyBuffer start,
                             ffi::Result<ffi::AnyBuffer> out, float scale, int64_t window,
                             float softcap) {
  return Run(kTargetV2, pool, q, k, v, start, out, scale, window, softcap);
}

}  // namespace

bool SelectAttentionIsa(const char* name) {
  struct Named {
    const char* name;
    const AttentionKernels* (*kernels)();
  };
  static const Named kNamed[] = {
#if defined(HXMLIR_HAVE_X86_ISAS)
      {"avx512", &AttentionKernelsAvx512},
      {"avx2", &AttentionKernelsAvx2},
#endif
      {"generic", &AttentionKernelsGeneric},
  };
  for (const Named& n : kNamed)
    if (std::strcmp(n.name, name) == 0) {
      g_attention_kernels.store(n.kernels(), std::memory_order_release);
      return true;
    }
  return false;
}

const AttentionKernels* SelectedAttentionKernels() {
  const AttentionKernels* k = g_attention_kernels.load(std::memory_order_acquire);
  return k == nullptr ? AttentionKernelsGeneric() : k;
}

}  // namespace hxmlir

XLA_FFI_DEFINE_HANDLER_SYMBOL(HxAttentionCpuV1, hxmlir::Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // start
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Attr<float>("scale"));

// Versions 2 and 3 take the same operands and attributes (version 3's with a batch dim).
#define HX_ATTENTION_WINDOWED_BINDING()            \
  ffi::Ffi::Bind()                                 \
      .Ctx<ffi::ThreadPool>()                      \
      .Arg<ffi::AnyBuffer>() /* q */               \
      .Arg<ffi::AnyBuffer>() /* k */               \
      .Arg<ffi::AnyBuffer>() /* v */               \
      .Arg<ffi::AnyBuffer>() /* start */           \
      .Ret<ffi::AnyBuffer>() /* out */             \
      .Attr<float>("scale")                        \
      .Attr<int64_t>("window")                     \
      .Attr<float>("softcap")

XLA_FFI_DEFINE_HANDLER_SYMBOL(HxAttentionCpuV2, hxmlir::AttentionWindowed,
                              HX_ATTENTION_WINDOWED_BINDING());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HxAttentionCpuV3, hxmlir::AttentionBatched,
                              HX_ATTENTION_WINDOWED_BINDING());
