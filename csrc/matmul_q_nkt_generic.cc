// hx_matmul_q_cpu_nkt_v1's kernels in portable C++ (the compiler's baseline flags); used
// when no ISA-specific copy fits.
#define HX_NS nkt_generic
#define HX_ISA_NAME "generic"
#define HX_W 4
#define HX_NKT_MR 4
#define HX_NKT_NV 2
#include "matmul_q_nkt.inc"

const hxmlir::NktKernels* hxmlir::NktKernelsGeneric() { return &nkt_generic::kNktKernels; }
