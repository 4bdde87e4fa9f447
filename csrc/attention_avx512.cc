// hx_attention_cpu_v1's kernels for avx512 (see setup.py for this file's -m flags).
#define HX_NS attention_avx512
#define HX_ISA_NAME "avx512"
#include "attention.inc"

const hxmlir::AttentionKernels* hxmlir::AttentionKernelsAvx512() {
  return &attention_avx512::kAttentionKernels;
}
