// hx_matmul_q_cpu_i8x_v1's kernels for AVX-512 VNNI (compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512vnni; chosen at run time only on CPUs that have them).
#define HX_NS avx512_vnni
#define HX_ISA_NAME "avx512_vnni"
#define HX_W 16
#define HX_I8X_MR 4
#define HX_I8X_NR 3
#define HX_I8P_MR 6
#define HX_I8P_NV 2
#include "matmul_q_i8x.inc"

const hxmlir::I8xKernels* hxmlir::I8xKernelsAvx512Vnni() { return &avx512_vnni::kI8xKernels; }
