// hx.matmul_q block kernels for AVX-512 (compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq -mavx2 -mfma; chosen at run time only on CPUs that have them).
#define HX_NS avx512
#define HX_ISA_NAME "avx512"
#define HX_W 16
#define HX_PANEL_MR 6
#define HX_PANEL_NV 4
#define HX_PACKED_MR 8
#define HX_PACKED_NV 2
#include "matmul_q_kernels.inc"
#define HX_DOT_MR 8
#define HX_DOT_MAX_M 8
#define HX_NKP_MR 12
#define HX_NKP_NV 2
#include "matmul_q_formats.inc"
#include "matmul_q_nk.inc"

const hxmlir::Kernels* hxmlir::KernelsAvx512() { return &avx512::kKernels; }
const hxmlir::FormatKernels* hxmlir::FormatKernelsAvx512() { return &avx512::kFormatKernels; }
const hxmlir::NkKernels* hxmlir::NkKernelsAvx512() { return &avx512::kNkKernels; }
