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
  // x * s (regimes "panel" and "packed"; else null). "panel": packed by PackXs, the
  // rows of each batch element in groups of mr (panel_mr; the last group may be
  // smaller), each group column after column: xs[b, i, kk] at
  // xs + b * m * k + i0 * k + kk * g + (i - i0), i0 = i / mr * mr, g = min(mr, m - i0).
  // "packed": row-major like x (ScaleRows), the layout PackXs gives for mr = 1.
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
  int64_t panel_mr;    // rows of xs per group in the "panel" regime (PackXs)
  int64_t packed_mr;   // rows of x per register tile in the "packed" regime
  // Regime "rows" (small m): acc[m, n] = sum_{kk in [k0, k1)} (x[b, :, kk] * s[b, kk]) q[b, kk, :]
  // (overwrites acc; the whole rows of q in [k0, k1) are read once, contiguously).
  void (*rows)(const Problem& p, int64_t b, int64_t k0, int64_t k1, float* acc);
  // Regimes "panel" (mid m) and "packed" (large m): y[b, :, j0:j1] = (x[b] * s[b]) @
  // f32(q[b, :, j0:j1]), q copied block by block (kPanelKc / kPackedKc rows of the
  // columns) into `scratch` (at least ScratchBytes(j1 - j0) bytes): "panel" as int8,
  // converted in registers by a loop holding rows of xs in registers; "packed"
  // converted once to f32 for a register-tiled f32 loop reading rows of xs in place.
  void (*panel)(const Problem& p, int64_t b, int64_t j0, int64_t j1, void* scratch);
  void (*packed)(const Problem& p, int64_t b, int64_t j0, int64_t j1, void* scratch);
};

// Rows of q per block in the "panel" and "packed" regimes.
constexpr int64_t kPanelKc = 256;
constexpr int64_t kPackedKc = 256;

// Scratch bytes the "panel" / "packed" kernels need for `width` columns.
constexpr int64_t ScratchBytes(int64_t width) {
  return width * (kPanelKc > 4 * kPackedKc ? kPanelKc : 4 * kPackedKc);
}

// Writes x * s of batch elements [b0, b1) into out (the whole f32[nb, m, k]
// buffer) in the layout of Problem::xs for groups of mr rows.
inline void PackXs(const Problem& p, int64_t mr, int64_t b0, int64_t b1, float* out) {
  const int64_t m = p.m, k = p.k;
  for (int64_t b = b0; b < b1; ++b) {
    const float* s = p.s + b * k;
    for (int64_t i0 = 0; i0 < m; i0 += mr) {
      const int64_t g = m - i0 < mr ? m - i0 : mr;
      const float* x = p.x + (b * m + i0) * k;
      float* d = out + (b * m + i0) * k;
      for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t r = 0; r < g; ++r) d[kk * g + r] = x[r * k + kk] * s[kk];
    }
  }
}

// Writes x * s of every batch element into out (f32[nb, m, k], row-major like x):
// Problem::xs of the "packed" regime. One pass the compiler vectorises.
inline void ScaleRows(const Problem& p, float* out) {
  for (int64_t b = 0; b < p.nb; ++b) {
    const float* s = p.s + b * p.k;
    for (int64_t i = 0; i < p.m; ++i) {
      const float* x = p.x + (b * p.m + i) * p.k;
      float* d = out + (b * p.m + i) * p.k;
      for (int64_t kk = 0; kk < p.k; ++kk) d[kk] = x[kk] * s[kk];
    }
  }
}

const Kernels* KernelsGeneric();
#if defined(HXMLIR_HAVE_X86_ISAS)
const Kernels* KernelsAvx2();
const Kernels* KernelsAvx512();
#endif

}  // namespace hxmlir

#endif  // HXMLIR_CSRC_MATMUL_Q_CPU_H_
