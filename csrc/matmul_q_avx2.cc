// hx.matmul_q block kernels for AVX2 + FMA + F16C (compiled with -mavx2 -mfma -mf16c;
// chosen at run time only on CPUs that have them).
#define HX_NS avx2
#define HX_ISA_NAME "avx2"
#define HX_W 8
#define HX_PANEL_MR 6
#define HX_PANEL_NV 2
#define HX_PACKED_MR 6
#define HX_PACKED_NV 2
#include "matmul_q_kernels.inc"
#define HX_DOT_MR 4
#define HX_DOT_MAX_M 8
#define HX_NKP_MR 6
#define HX_NKP_NV 2
#include "matmul_q_formats.inc"
#include "matmul_q_nk.inc"

const hxmlir::Kernels* hxmlir::KernelsAvx2() { return &avx2::kKernels; }
const hxmlir::FormatKernels* hxmlir::FormatKernelsAvx2() { return &avx2::kFormatKernels; }
const hxmlir::NkKernels* hxmlir::NkKernelsAvx2() { return &avx2::kNkKernels; }
