// hx_matmul_q_cpu_nkt_v1's kernels for AVX2 + FMA + F16C (compiled with -mavx2 -mfma
// -mf16c; chosen at run time only on CPUs that have them).
#define HX_NS nkt_avx2
#define HX_ISA_NAME "avx2"
#define HX_W 8
#define HX_NKT_MR 6
#define HX_NKT_NV 2
#include "matmul_q_nkt.inc"

const hxmlir::NktKernels* hxmlir::NktKernelsAvx2() { return &nkt_avx2::kNktKernels; }
