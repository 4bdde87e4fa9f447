// hx_attention_cpu_v1's kernels for generic (see setup.py for this file's -m flags).
#define HX_NS attention_generic
#define HX_ISA_NAME "generic"
#include "attention.inc"

const hxmlir::AttentionKernels* hxmlir::AttentionKernelsGeneric() {
  return &attention_generic::kAttentionKernels;
}
