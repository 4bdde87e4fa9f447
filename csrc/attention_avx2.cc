// hx_attention_cpu_v1's kernels for avx2 (see setup.py for this file's -m flags).
#define HX_NS attention_avx2
#define HX_ISA_NAME "avx2"
#include "attention.inc"

const hxmlir::AttentionKernels* hxmlir::AttentionKernelsAvx2() {
  return &attention_avx2::kAttentionKernels;
}
