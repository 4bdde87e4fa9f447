// hx.matmul_q on CPU: y = (x * s[..., None, :]) @ f32(q), the q8 format of
// hxmlir (hxmlir/qarray.py: int8 values quantized along their last axis, one
// f32 scale per row of q, i.e. per index of the contraction axis).
//
//   x: f32[nb, m, k]   q: s8[nb, k, n]   s: f32[nb, k]   ->   y: f32[nb, m, n]
//
// (nb: the leading batch dims flattened). This header is the interface between
// the FFI handler (matmul_q_ffi.cc: threading, dispatch) and the per-ISA block
// kernels (matmul_q_kernels.inc, compiled once per ISA with its own -m flags).
#ifndef HXMLIR_CSRC_MATMUL_Q_CPU_H_
#define HXMLIR_CSRC_MATMUL_Q_CPU_H_

#include <cstdint>

namespace hxmlir {

struct Problem {
  const float* x;     // f32[nb, m, k]
  const int8_t* q;    // s8[nb, k, n]
  const float* s;     // f32[nb, k]
  // x * s (regimes "panel" and "packed"; else null), in the layout of PackRowGroups
  // (matmul_q_parallel.h): "panel" in groups of panel_mr rows, "packed" row-major
  // like x (groups of one row).
  const float* xs;
  float* y;           // f32[nb, m, n]
  int64_t nb, m, k, n;
};

// The block kernels of one ISA. Every function computes a disjoint part of the
// work and may run on any thread; none allocates shared state.
struct Kernels {
  const char* isa;     // "avx512", "avx2", "generic"
  int64_t panel_nr;    // column block of the "panel" regime (int8 converted in registers)
  int64_t packed_nr;   // column block of the "packed" regime (f32 micro-panels)
  int64_t panel_mr;    // rows of xs per group in the "panel" regime (PackRowGroups)
  int64_t packed_mr;   // rows of x per register tile in the "packed" regime
  // Regime "rows" (small m): acc[m, n] = sum_{kk in [k0, k1)} (x[b, :, kk] * s[b, kk]) q[b, kk, :]
  // (overwrites acc; the whole rows of q in [k0, k1) are read once, contiguously).
  void (*rows)(const Problem& p, int64_t b, int64_t k0, int64_t k1, float* acc);
  // Regimes "panel" (mid m) and "packed" (large m): y[b, :, j0:j1] = (x[b] * s[b]) @
  // f32(q[b, :, j0:j1]), kPanelKc / kPackedKc rows of q at a time. "panel" reads the
  // int8 values in place and converts them in registers, under rows of xs held in
  // registers; "packed" converts each block once to f32 into `scratch` (at least
  // ScratchFloats(j1 - j0) floats) for a register-tiled f32 loop reading rows of xs in place.
  void (*panel)(const Problem& p, int64_t b, int64_t j0, int64_t j1);
  void (*packed)(const Problem& p, int64_t b, int64_t j0, int64_t j1, void* scratch);
};

// The bound between the "panel" and "packed" regimes (v1; v2's "panel" stops at or
// below it, by format).
constexpr int64_t kPanelMaxM = 64;

// Rows of q per block in the "panel" and "packed" regimes.
constexpr int64_t kPanelKc = 256;
constexpr int64_t kPackedKc = 256;

// Scratch floats the "packed" kernel needs for `width` columns (a block converted to f32).
constexpr int64_t ScratchFloats(int64_t width) { return width * kPackedKc; }

const Kernels* KernelsGeneric();
#if defined(HXMLIR_HAVE_X86_ISAS)
const Kernels* KernelsAvx2();
const Kernels* KernelsAvx512();
#endif

}  // namespace hxmlir

#endif  // HXMLIR_CSRC_MATMUL_Q_CPU_H_
