// hx_matmul_q_cpu_nkt_v1's kernels for AVX-512 (compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq -mavx2 -mfma; chosen at run time only on CPUs that have them).
#define HX_NS nkt_avx512
#define HX_ISA_NAME "avx512"
#define HX_W 16
#define HX_NKT_MR 6
#define HX_NKT_NV 4
#include "matmul_q_nkt.inc"

const hxmlir::NktKernels* hxmlir::NktKernelsAvx512() { return &nkt_avx512::kNktKernels; }
