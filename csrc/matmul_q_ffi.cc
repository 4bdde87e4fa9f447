// The XLA FFI handler of hx.matmul_q on CPU (custom call target
// "hx_matmul_q_cpu_v1") and the Python module hxmlir._matmul_q_cpu that hands
// it to jax.ffi.register_ffi_target.
//
//   x: f32[*b, m, k], q: s8[*b, k, n], s: f32[*b, k]  ->  y: f32[*b, m, n]
//   y = (x * s[..., None, :]) @ f32(q)          (hxmlir's q8 format, qarray.py)
//
// Work is cut into blocks (three regimes, by m: "rows" m <= 4, "panel"
// m <= 64, "packed" above; see matmul_q_kernels.inc). The calling thread and
// tasks scheduled on XLA's intra-op thread pool (the FFI execution context's
// ThreadPool) take blocks from one shared atomic counter, so a helper that
// starts late finds no work and returns at once: the call never waits for a
// task that has not begun. No thread is ever created here. All per-call state
// lives in a reference-counted Job, so many calls (many jitted functions) may
// run at once. Each result element is summed in an order fixed by the shapes
// alone (not by the thread count or by which thread took which block), so a
// call's results are the same on every run and machine with the same ISA
// family (the AVX-512 and AVX2 kernels both use FMA in the same order).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "matmul_q_cpu.h"
#include "matmul_q_formats.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hxmlir {
namespace {

std::atomic<const Kernels*> g_kernels{nullptr};

// Regime bounds on m (rows of x per batch element), from the study in issue 16.
constexpr int64_t kRowsMaxM = 4;
constexpr int64_t kPanelMaxM = 64;
// "rows": at least this many rows of q per chunk of the contraction axis, and at
// most this many chunks (enough blocks for the threads of a bandwidth-bound loop).
constexpr int64_t kRowsMinChunk = 256;
constexpr int64_t kRowsMaxChunks = 8;
// "panel" and "packed": at most this many columns per block (the copied block
// of q is kPanelKc x this many int8 or kPackedKc x this many f32: 64 / 256 KiB).
constexpr int64_t kMaxBlockColumns = 256;
constexpr int64_t kBlocksPerThread = 4;
// Problems under this many multiply-adds run on the calling thread alone.
constexpr int64_t kSerialMacs = int64_t{1} << 18;

enum class Regime { kRows, kPanel, kPacked };

struct Job {
  Problem p;
  const Kernels* kern;
  Regime regime;
  int64_t blocks_per_batch;  // rows: chunks of k; panel/packed: column blocks
  int64_t block_len;         // rows of q (rows) or columns (panel/packed) per block
  int64_t total;
  std::vector<float> xs;       // x * s (panel)
  std::vector<float> partial;  // rows: chunks 1.. of each batch element, f32[nb, chunks-1, m, n]
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

void RunBlock(Job& j, int64_t t) {
  const Problem& p = j.p;
  const int64_t b = t / j.blocks_per_batch, c = t % j.blocks_per_batch;
  const int64_t lo = c * j.block_len;
  switch (j.regime) {
    case Regime::kRows: {
      const int64_t hi = std::min(p.k, lo + j.block_len);
      float* acc = c == 0 ? p.y + b * p.m * p.n
                          : j.partial.data() + ((b * (j.blocks_per_batch - 1)) + c - 1) * p.m * p.n;
      j.kern->rows(p, b, lo, hi, acc);
      return;
    }
    case Regime::kPanel:
    case Regime::kPacked: {
      thread_local std::vector<char> scratch;  // one per thread, reused across calls
      const size_t need = static_cast<size_t>(ScratchBytes(j.block_len));
      if (scratch.size() < need) scratch.resize(need);
      const int64_t hi = std::min(p.n, lo + j.block_len);
      (j.regime == Regime::kPanel ? j.kern->panel : j.kern->packed)(p, b, lo, hi, scratch.data());
      return;
    }
  }
}

void Work(Job& j) {
  for (;;) {
    const int64_t t = j.next.fetch_add(1, std::memory_order_relaxed);
    if (t >= j.total) return;
    RunBlock(j, t);
    if (j.done.fetch_add(1, std::memory_order_acq_rel) + 1 == j.total) j.done.notify_all();
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string Shape(ffi::Span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

ffi::Error MatmulQ(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> q,
                   ffi::Buffer<ffi::F32> s, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), qd = q.dimensions(), sd = s.dimensions(), yd = y->dimensions();
  const size_t r = xd.size();
  bool ok = r >= 2 && qd.size() == r && sd.size() == r - 1 && yd.size() == r &&
            qd[r - 2] == xd[r - 1];
  for (size_t i = 0; ok && i + 2 < r; ++i) ok = qd[i] == xd[i] && sd[i] == xd[i] && yd[i] == xd[i];
  ok = ok && sd[r - 2] == qd[r - 2] && yd[r - 2] == xd[r - 2] && yd[r - 1] == qd[r - 1];
  if (!ok)
    return ffi::Error::InvalidArgument(
        "hx_matmul_q_cpu_v1 expects f32[*b, m, k], s8[*b, k, n], f32[*b, k] -> f32[*b, m, n], got f32" +
        Shape(xd) + ", s8" + Shape(qd) + ", f32" + Shape(sd) + " -> f32" + Shape(yd));
  const Kernels* kern = g_kernels.load(std::memory_order_acquire);
  if (kern == nullptr) kern = KernelsGeneric();

  auto job = std::make_shared<Job>();
  Problem& p = job->p;
  p.x = x.typed_data();
  p.q = q.typed_data();
  p.s = s.typed_data();
  p.y = y->typed_data();
  p.m = xd[r - 2];
  p.k = xd[r - 1];
  p.n = qd[r - 1];
  p.nb = 1;
  for (size_t i = 0; i + 2 < r; ++i) p.nb *= xd[i];
  if (p.nb == 0 || p.m == 0 || p.n == 0) return ffi::Error::Success();
  if (p.k == 0) {
    std::fill(p.y, p.y + p.nb * p.m * p.n, 0.f);
    return ffi::Error::Success();
  }
  job->kern = kern;
  const int64_t macs = p.nb * p.m * p.k * p.n;
  const int64_t threads = macs < kSerialMacs ? 1 : std::max<int64_t>(1, pool.num_threads());

  if (p.m <= kRowsMaxM) {
    job->regime = Regime::kRows;
    // Chunks of k fixed by k alone (never by the thread count), so every machine
    // adds the same partial sums in the same order: results do not depend on it.
    const int64_t chunks = std::clamp<int64_t>(p.k / kRowsMinChunk, 1, kRowsMaxChunks);
    job->block_len = CeilDiv(p.k, chunks);
    job->blocks_per_batch = CeilDiv(p.k, job->block_len);
    job->partial.resize(static_cast<size_t>(p.nb * (job->blocks_per_batch - 1) * p.m * p.n));
  } else {
    job->regime = p.m <= kPanelMaxM ? Regime::kPanel : Regime::kPacked;
    if (job->regime == Regime::kPanel) {  // "packed" reads x in place
      job->xs.resize(static_cast<size_t>(p.nb * p.m * p.k));
      PackXs(p, kern->panel_mr, 0, p.nb, job->xs.data());
      p.xs = job->xs.data();
    }
    // Column blocks of whole micro-panels, at most kMaxBlockColumns wide, and
    // narrower when that gives every thread about kBlocksPerThread blocks (the
    // shared counter then evens out a thread that starts late or runs slower).
    const int64_t nr = job->regime == Regime::kPanel ? kern->panel_nr : kern->packed_nr;
    const int64_t per = CeilDiv(CeilDiv(p.n, CeilDiv(kBlocksPerThread * threads, p.nb)), nr);
    job->block_len = std::clamp<int64_t>(per * nr, nr, std::max(nr, kMaxBlockColumns / nr * nr));
    job->blocks_per_batch = CeilDiv(p.n, job->block_len);
  }
  job->total = p.nb * job->blocks_per_batch;

  const int64_t helpers = std::min(threads, job->total) - 1;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([job] { Work(*job); });
  Work(*job);
  for (int64_t d = job->done.load(std::memory_order_acquire); d < job->total;
       d = job->done.load(std::memory_order_acquire))
    job->done.wait(d, std::memory_order_acquire);

  if (job->regime == Regime::kRows && job->blocks_per_batch > 1) {
    const int64_t mn = p.m * p.n;
    for (int64_t b = 0; b < p.nb; ++b) {
      float* yb = p.y + b * mn;
      for (int64_t c = 1; c < job->blocks_per_batch; ++c) {
        const float* pc = job->partial.data() + (b * (job->blocks_per_batch - 1) + c - 1) * mn;
        for (int64_t e = 0; e < mn; ++e) yb[e] += pc[e];
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hxmlir

XLA_FFI_DEFINE_HANDLER_SYMBOL(HxMatmulQCpuV1, hxmlir::MatmulQ,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // x
                                  .Arg<ffi::Buffer<ffi::S8>>()    // q
                                  .Arg<ffi::Buffer<ffi::F32>>()   // s
                                  .Ret<ffi::Buffer<ffi::F32>>());  // y

// --- Python module hxmlir._matmul_q_cpu --------------------------------------------

namespace {

struct Isa {
  const char* name;
  const hxmlir::Kernels* (*kernels)();
  const hxmlir::FormatKernels* (*format_kernels)();  // hx_matmul_q_cpu_v2's
  bool (*supported)();
};

const Isa kIsas[] = {
#if defined(HXMLIR_HAVE_X86_ISAS)
    {"avx512", &hxmlir::KernelsAvx512, &hxmlir::FormatKernelsAvx512,
     [] {
       __builtin_cpu_init();
       return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
     }},
    {"avx2", &hxmlir::KernelsAvx2, &hxmlir::FormatKernelsAvx2,
     [] {
       __builtin_cpu_init();
       return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
     }},
#endif
    {"generic", &hxmlir::KernelsGeneric, &hxmlir::FormatKernelsGeneric, [] { return true; }},
};

PyObject* PyHandler(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxMatmulQCpuV1), nullptr, nullptr);
}

PyObject* PyHandlerV2(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxMatmulQCpuV2), nullptr, nullptr);
}

PyObject* PyCompiledIsas(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  for (const Isa& isa : kIsas) {
    PyObject* name = PyUnicode_FromString(isa.name);
    PyList_Append(out, name);
    Py_DECREF(name);
  }
  return out;
}

PyObject* PySupportedIsas(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  for (const Isa& isa : kIsas) {
    if (!isa.supported()) continue;
    PyObject* name = PyUnicode_FromString(isa.name);
    PyList_Append(out, name);
    Py_DECREF(name);
  }
  return out;
}

PyObject* PySelectIsa(PyObject*, PyObject* arg) {
  const char* want = PyUnicode_AsUTF8(arg);
  if (want == nullptr) return nullptr;
  for (const Isa& isa : kIsas) {
    if (std::string(want) != isa.name) continue;
    if (!isa.supported()) {
      PyErr_Format(PyExc_ValueError, "this CPU does not support the %s kernels", want);
      return nullptr;
    }
    hxmlir::g_kernels.store(isa.kernels(), std::memory_order_release);
    hxmlir::SelectFormatKernels(isa.format_kernels());
    Py_RETURN_NONE;
  }
  PyErr_Format(PyExc_ValueError, "no %s kernels were compiled into hxmlir._matmul_q_cpu", want);
  return nullptr;
}

PyObject* PySelectedIsa(PyObject*, PyObject*) {
  const hxmlir::Kernels* k = hxmlir::g_kernels.load(std::memory_order_acquire);
  if (k == nullptr) Py_RETURN_NONE;
  return PyUnicode_FromString(k->isa);
}

PyMethodDef kMethods[] = {
    {"handler", PyHandler, METH_NOARGS,
     "PyCapsule of the XLA FFI handler (for jax.ffi.register_ffi_target, api_version=1)."},
    {"handler_v2", PyHandlerV2, METH_NOARGS,
     "PyCapsule of hx_matmul_q_cpu_v2's XLA FFI handler (every format; api_version=1)."},
    {"compiled_isas", PyCompiledIsas, METH_NOARGS,
     "Names of the kernel sets compiled in, best first."},
    {"supported_isas", PySupportedIsas, METH_NOARGS,
     "Names of the compiled kernel sets this CPU can run, best first."},
    {"select_isa", PySelectIsa, METH_O,
     "Use the named kernel set from now on; ValueError if absent or unsupported."},
    {"selected_isa", PySelectedIsa, METH_NOARGS, "The kernel set in use (None: none chosen)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_matmul_q_cpu",
                       "hx.matmul_q's native CPU kernels (XLA FFI targets hx_matmul_q_cpu_v1 and _v2).",
                       -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__matmul_q_cpu() { return PyModule_Create(&kModule); }
