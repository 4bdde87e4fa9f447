// A thread's reusable float buffer on a cache line (ThreadBuffer in matmul_q_parallel.h,
// RowBuffer in matmul_q_vec.inc). A std::vector's data is only 16-byte aligned (an mmap'd
// one 16 bytes past a page), and the kernels' 64-byte loads from it then each span two
// lines (_i8x_v2's GEMV, weight in L2, one thread: Q5_0 1.14x, Q4_K 1.10x once x's buffers
// were aligned).
#ifndef HXMLIR_CSRC_THREAD_BUFFER_H_
#define HXMLIR_CSRC_THREAD_BUFFER_H_

#include <cstdint>
#include <vector>

namespace hxmlir {

// b grown to hold at least n floats from its first cache line on; that line's address.
inline float* AlignedFloats(std::vector<float>& b, int64_t n) {
  constexpr int64_t kLine = 64 / sizeof(float);
  if (b.size() < static_cast<size_t>(n + kLine)) b.resize(static_cast<size_t>(n + kLine));
  const uintptr_t a = reinterpret_cast<uintptr_t>(b.data());
  return reinterpret_cast<float*>((a + 63) & ~uintptr_t{63});
}

}  // namespace hxmlir

#endif  // HXMLIR_CSRC_THREAD_BUFFER_H_
