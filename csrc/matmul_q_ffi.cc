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

#include "attention.h"
#include "matmul_q_cpu.h"
#include "matmul_q_formats.h"
#include "matmul_q_i8x.h"
#include "matmul_q_nk.h"
#include "matmul_q_nkt.h"
#include "matmul_q_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hxmlir {
namespace {

std::atomic<const Kernels*> g_kernels{nullptr};

enum class Regime { kRows, kPanel, kPacked };

struct Job : BlockedJob {
  Problem p;
  const Kernels* kern;
  Regime regime;

  void Run(int64_t t) {
    const int64_t b = t / blocks_per_batch, c = t % blocks_per_batch, lo = c * block_len;
    if (regime == Regime::kRows)
      return kern->rows(p, b, lo, std::min(p.k, lo + block_len), RowsAcc(p.y, b, c, p.m * p.n));
    const int64_t hi = std::min(p.n, lo + block_len);
    if (regime == Regime::kPanel) return kern->panel(p, b, lo, hi);
    kern->packed(p, b, lo, hi, ThreadBuffer(kScratch, ScratchFloats(block_len)));
  }
};

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
        ShapeText(xd) + ", s8" + ShapeText(qd) + ", f32" + ShapeText(sd) + " -> f32" +
        ShapeText(yd));
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
  p.nb = BatchSize(xd);
  if (NothingToCompute(p.nb, p.m, p.k, p.n, p.y)) return ffi::Error::Success();
  job->kern = kern;
  const int64_t threads = ThreadsFor(pool, p.nb * p.m * p.k * p.n);
  if (p.m <= kRowsMaxM) {
    job->regime = Regime::kRows;
    job->PlanRows(p.nb, p.m, p.k, p.n);
  } else {
    job->regime = p.m <= kPanelMaxM ? Regime::kPanel : Regime::kPacked;
    // x * s: "panel" in groups of panel_mr rows, "packed" row-major
    float* xs = ThreadBuffer(kXs, p.nb * p.m * p.k);  // filled by the job's first tasks
    job->pack.Plan(p.x, p.s, p.nb, p.m, p.k, job->regime == Regime::kPanel ? kern->panel_mr : 1, xs);
    p.xs = xs;
    job->Plan(p.nb, ColumnBlocks(p.n, p.nb,
                                 job->regime == Regime::kPanel ? kern->panel_nr : kern->packed_nr,
                                 threads));
  }
  RunBlocks(pool, threads, job);
  if (job->regime == Regime::kRows) job->AddPartials(p.y, p.nb, p.m * p.n);
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
  const hxmlir::NkKernels* (*nk_kernels)();          // hx_matmul_q_cpu_v3's
  const hxmlir::I8xKernels* (*i8x_kernels)();        // hx_matmul_q_cpu_i8x_v1's and _v2's
  bool (*supported)();
};

const Isa kIsas[] = {
#if defined(HXMLIR_HAVE_X86_ISAS)
    {"avx512", &hxmlir::KernelsAvx512, &hxmlir::FormatKernelsAvx512, &hxmlir::NkKernelsAvx512,
     [] {  // VNNI where the CPU has it, else the AVX2 copy (AVX-512 without VNNI: Skylake-X)
       __builtin_cpu_init();
       return __builtin_cpu_supports("avx512vnni") ? hxmlir::I8xKernelsAvx512Vnni()
                                                   : hxmlir::I8xKernelsAvx2();
     },
     [] {
       __builtin_cpu_init();
       return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
     }},
    {"avx2", &hxmlir::KernelsAvx2, &hxmlir::FormatKernelsAvx2, &hxmlir::NkKernelsAvx2, &hxmlir::I8xKernelsAvx2,
     [] {
       __builtin_cpu_init();
       return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("f16c");
     }},
#endif
    {"generic", &hxmlir::KernelsGeneric, &hxmlir::FormatKernelsGeneric, &hxmlir::NkKernelsGeneric,
     &hxmlir::I8xKernelsGeneric, [] { return true; }},
};

PyObject* PyHandler(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxMatmulQCpuV1), nullptr, nullptr);
}

PyObject* PyHandlerV2(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxMatmulQCpuV2), nullptr, nullptr);
}

PyObject* PyHandlerV3(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxMatmulQCpuV3), nullptr, nullptr);
}

PyObject* PyHandlerV4(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxMatmulQCpuV4), nullptr, nullptr);
}

PyObject* PyHandlerI8xV1(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxMatmulQCpuI8xV1), nullptr, nullptr);
}

PyObject* PyHandlerI8xV2(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxMatmulQCpuI8xV2), nullptr, nullptr);
}

PyObject* PyHandlerNktV1(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxMatmulQCpuNktV1), nullptr, nullptr);
}

PyObject* PyHandlerAttentionV1(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxAttentionCpuV1), nullptr, nullptr);
}

PyObject* PyHandlerAttentionV2(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxAttentionCpuV2), nullptr, nullptr);
}

PyObject* PyHandlerAttentionV3(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&HxAttentionCpuV3), nullptr, nullptr);
}

PyObject* PyI8xIsa(PyObject*, PyObject*) {
  return PyUnicode_FromString(hxmlir::SelectedI8xKernels()->isa);
}

// A list of name(item) for the items whose name is not null.
template <class Items, class Name>
PyObject* NameList(const Items& items, Name name) {
  PyObject* out = PyList_New(0);
  for (const auto& item : items) {
    const char* n = name(item);
    if (n == nullptr) continue;
    PyObject* str = PyUnicode_FromString(n);
    PyList_Append(out, str);
    Py_DECREF(str);
  }
  return out;
}

// Every (dtype, layout, weight layout, scale dtype, offset) the kernels decode, from the
// format table (matmul_q_format_table.h): "kn" (hx_matmul_q_cpu_v2) with f32 scales and no
// offset, "nk" (hx_matmul_q_cpu_v3) with f32 or f16 scales, with or without offsets; the
// block formats (hx_matmul_q_cpu_v4: dtype the format's name) in "nk" with f16 scales.
PyObject* PyNativeFormats(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  auto add = [&](const auto& f, const char* wl, const char* sd, bool off) {
    PyObject* t = Py_BuildValue("(ssssO)", f.dtype, f.layout, wl, sd, off ? Py_True : Py_False);
    PyList_Append(out, t);
    Py_DECREF(t);
  };
  for (const hxmlir::ValueFormatInfo& f : hxmlir::kValueFormats) {
    if (f.kn) add(f, "kn", "f32", false);
    for (const char* sd : {"f32", "f16"})
      for (bool off : {false, true}) add(f, "nk", sd, off);
  }
  for (const hxmlir::BlockFormatInfo& f : hxmlir::kBlockFormats) add(f, "nk", "f16", f.offset);
  return out;
}

// The dtypes with an integer-activation kernel (hx_matmul_q_cpu_i8x_v1).
PyObject* PyI8xFormats(PyObject*, PyObject*) {
  return NameList(hxmlir::kValueFormats, [](const hxmlir::ValueFormatInfo& f) {
    return f.i8x ? f.dtype : nullptr;
  });
}

PyObject* PyCompiledIsas(PyObject*, PyObject*) {
  return NameList(kIsas, [](const Isa& isa) { return isa.name; });
}

PyObject* PySupportedIsas(PyObject*, PyObject*) {
  return NameList(kIsas, [](const Isa& isa) { return isa.supported() ? isa.name : nullptr; });
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
    hxmlir::SelectNkKernels(isa.nk_kernels());
    hxmlir::SelectI8xKernels(isa.i8x_kernels());
    hxmlir::SelectAttentionIsa(isa.name);
    hxmlir::SelectNktIsa(isa.name);
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

PyObject* PyMaxThreads(PyObject*, PyObject*) {
  return PyLong_FromLongLong(static_cast<long long>(hxmlir::UsableCores()));
}

PyObject* PySetLingerUs(PyObject*, PyObject* arg) {
  const long long us = PyLong_AsLongLong(arg);
  if (us == -1 && PyErr_Occurred()) return nullptr;
  hxmlir::SetLingerMicros(us);
  Py_RETURN_NONE;
}

PyObject* PyLingerUs(PyObject*, PyObject*) {
  return PyLong_FromLongLong(static_cast<long long>(hxmlir::Linger().count() / 1000));
}

PyMethodDef kMethods[] = {
    {"handler", PyHandler, METH_NOARGS,
     "PyCapsule of the XLA FFI handler (for jax.ffi.register_ffi_target, api_version=1)."},
    {"handler_v2", PyHandlerV2, METH_NOARGS,
     "PyCapsule of hx_matmul_q_cpu_v2's XLA FFI handler (every format; api_version=1)."},
    {"handler_v3", PyHandlerV3, METH_NOARGS,
     "PyCapsule of hx_matmul_q_cpu_v3's XLA FFI handler (the [out, in] layout; api_version=1)."},
    {"handler_v4", PyHandlerV4, METH_NOARGS,
     "PyCapsule of hx_matmul_q_cpu_v4's XLA FFI handler (GGUF block formats in [out, in]; "
     "api_version=1)."},
    {"handler_i8x_v1", PyHandlerI8xV1, METH_NOARGS,
     "PyCapsule of hx_matmul_q_cpu_i8x_v1's XLA FFI handler (integer activations; "
     "api_version=1)."},
    {"handler_i8x_v2", PyHandlerI8xV2, METH_NOARGS,
     "PyCapsule of hx_matmul_q_cpu_i8x_v2's XLA FFI handler (integer activations, GGUF's "
     "block formats in [out, in]; api_version=1)."},
    {"handler_nkt_v1", PyHandlerNktV1, METH_NOARGS,
     "PyCapsule of hx_matmul_q_cpu_nkt_v1's XLA FFI handler (x @ W for a weight W[out, in] "
     "of any [out, in] format: the backward of the [out, in] layout; api_version=1)."},
    {"handler_attention_v1", PyHandlerAttentionV1, METH_NOARGS,
     "PyCapsule of hx_attention_cpu_v1's XLA FFI handler (hx.attention; api_version=1)."},
    {"handler_attention_v2", PyHandlerAttentionV2, METH_NOARGS,
     "PyCapsule of hx_attention_cpu_v2's XLA FFI handler (hx.attention with a window and "
     "a soft cap; api_version=1)."},
    {"handler_attention_v3", PyHandlerAttentionV3, METH_NOARGS,
     "PyCapsule of hx_attention_cpu_v3's XLA FFI handler (hx.attention over a batch, each "
     "element its own start; api_version=1)."},
    {"i8x_isa", PyI8xIsa, METH_NOARGS,
     "The ISA of hx_matmul_q_cpu_i8x_v1's and _i8x_v2's kernels in use (avx512_vnni, avx2, "
     "generic)."},
    {"native_formats", PyNativeFormats, METH_NOARGS,
     "Every (dtype, layout, weight layout, scale dtype, offset) the kernels decode "
     "(weight layout 'kn': hx_matmul_q_cpu_v2, 'nk': hx_matmul_q_cpu_v3)."},
    {"i8x_formats", PyI8xFormats, METH_NOARGS,
     "The dtypes hx_matmul_q_cpu_i8x_v1 takes (integer activations)."},
    {"compiled_isas", PyCompiledIsas, METH_NOARGS,
     "Names of the kernel sets compiled in, best first."},
    {"supported_isas", PySupportedIsas, METH_NOARGS,
     "Names of the compiled kernel sets this CPU can run, best first."},
    {"select_isa", PySelectIsa, METH_O,
     "Use the named kernel set from now on; ValueError if absent or unsupported."},
    {"selected_isa", PySelectedIsa, METH_NOARGS, "The kernel set in use (None: none chosen)."},
    {"max_threads", PyMaxThreads, METH_NOARGS,
     "The most threads one call runs on: the cores this process may use (read once)."},
    {"set_linger_us", PySetLingerUs, METH_O,
     "How long (microseconds; 0: never) a helper thread spins for the next call's blocks "
     "after its part of a call (matmul_q_parallel.h; default 50; hxmlir sets $HXMLIR_CPU_LINGER_US's at import)."},
    {"linger_us", PyLingerUs, METH_NOARGS, "The helpers' linger time now (microseconds)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_matmul_q_cpu",
                       "hx.matmul_q's native CPU kernels (XLA FFI targets hx_matmul_q_cpu_v1 .. _v4, _i8x_v1, _i8x_v2, _nkt_v1) "
                       "and hx.attention's (hx_attention_cpu_v1).",
                       -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__matmul_q_cpu() { return PyModule_Create(&kModule); }
