// What the FFI handlers of the [out, in] layout share (hx_matmul_q_cpu_v3,
// hx_matmul_q_cpu_i8x_v1): the check of their operands and attributes, and the cache size
// their blocks are planned by. Defined in matmul_q_nk_ffi.cc.
#ifndef HXMLIR_CSRC_MATMUL_Q_NK_FFI_H_
#define HXMLIR_CSRC_MATMUL_Q_NK_FFI_H_

#include <cstdint>
#include <string_view>

#include "matmul_q_nk.h"
#include "xla/ffi/api/ffi.h"

namespace hxmlir {

// Checks a call's operands x: f32[*b, k], q, s (, o) -> y against its attributes
// (matmul_q_nk_ffi.cc's contract; errors are InvalidArgument, prefixed with `target` and
// naming the operands' types) and fills p's x, q, s, o, f16, y, m, k, n, g, ns, values.
xla::ffi::Error BindNk(std::string_view target, xla::ffi::Buffer<xla::ffi::F32> x,
                       xla::ffi::AnyBuffer q, xla::ffi::AnyBuffer s,
                       xla::ffi::RemainingArgs rest, xla::ffi::Buffer<xla::ffi::F32>* y,
                       std::string_view dtype, std::string_view layout, int64_t group_size,
                       std::string_view scale_dtype, bool offset, NkProblem* p);

// The L2 cache's bytes as this CPU reports them (256 KiB when it does not say).
int64_t CpuL2Bytes();

}  // namespace hxmlir

#endif  // HXMLIR_CSRC_MATMUL_Q_NK_FFI_H_
