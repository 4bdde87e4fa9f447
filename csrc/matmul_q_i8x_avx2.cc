// hx_matmul_q_cpu_i8x_v1's kernels for AVX2 (compiled with -mavx2 -mfma -mf16c; chosen at
// run time on CPUs with AVX2 and without AVX-512 VNNI).
#define HX_NS i8x_avx2
#define HX_ISA_NAME "avx2"
#define HX_W 8
#define HX_I8X_MR 2
#define HX_I8X_NR 2
#define HX_I8P_MR 2
#define HX_I8P_NV 1
#include "matmul_q_i8x.inc"

const hxmlir::I8xKernels* hxmlir::I8xKernelsAvx2() { return &i8x_avx2::kI8xKernels; }
