// hx.matmul_q block kernels in portable C++ (the compiler's baseline flags: SSE2 on
// x86-64, whatever the target has elsewhere); used when no ISA-specific copy fits.
#define HX_NS generic
#define HX_ISA_NAME "generic"
#define HX_W 4
#define HX_PANEL_MR 4
#define HX_PANEL_NV 2
#define HX_PACKED_MR 4
#define HX_PACKED_NV 2
#include "matmul_q_kernels.inc"
#define HX_DOT_MR 4
#define HX_DOT_MAX_M 8
#define HX_NKP_MR 4
#define HX_NKP_NV 2
#include "matmul_q_formats.inc"
#include "matmul_q_nk.inc"

const hxmlir::Kernels* hxmlir::KernelsGeneric() { return &generic::kKernels; }
const hxmlir::FormatKernels* hxmlir::FormatKernelsGeneric() { return &generic::kFormatKernels; }
const hxmlir::NkKernels* hxmlir::NkKernelsGeneric() { return &generic::kNkKernels; }
