// hx_matmul_q_cpu_i8x_v1's kernels in portable C++ (the compiler's baseline flags); used
// when no ISA-specific copy fits.
#define HX_NS i8x_generic
#define HX_ISA_NAME "generic"
#define HX_W 4
#define HX_I8X_MR 1
#define HX_I8X_NR 2
#define HX_I8P_MR 1
#define HX_I8P_NV 1
#include "matmul_q_i8x.inc"

const hxmlir::I8xKernels* hxmlir::I8xKernelsGeneric() { return &i8x_generic::kI8xKernels; }
