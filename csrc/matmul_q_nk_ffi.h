// What the FFI handlers of the [out, in] layout share (hx_matmul_q_cpu_v3, _v4,
// hx_matmul_q_cpu_i8x_v1, _v2, hx_matmul_q_cpu_nkt_v1): the check of their operands and attributes, and the cache
// size their blocks are planned by, and their FFI binding. Defined in matmul_q_nk_ffi.cc.
#ifndef HXMLIR_CSRC_MATMUL_Q_NK_FFI_H_
#define HXMLIR_CSRC_MATMUL_Q_NK_FFI_H_

#include <cstdint>
#include <string_view>

#include "matmul_q_nk.h"
#include "matmul_q_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace hxmlir {

// Checks a call's operands x: f32[*b, k], q, s (, o) -> y: f32[*b, n] against its attributes
// (matmul_q_nk_ffi.cc's contract; errors are InvalidArgument, prefixed with `target` and
// naming the operands' types) and fills p's x, q, s, o, f16, y, m, k, n, g, ns, values.
// `transposed`: the product with W along its rows instead (hx_matmul_q_cpu_nkt_v1),
// x: f32[*b, n] -> y: f32[*b, k], the same W.
xla::ffi::Error BindNk(std::string_view target, xla::ffi::Buffer<xla::ffi::F32> x,
                       xla::ffi::AnyBuffer q, xla::ffi::AnyBuffer s,
                       xla::ffi::RemainingArgs rest, xla::ffi::Buffer<xla::ffi::F32>* y,
                       std::string_view dtype, std::string_view layout, int64_t group_size,
                       std::string_view scale_dtype, bool offset, NkProblem* p,
                       bool transposed = false);

// Checks a call's operands x: f32[*b, k], q: u16[n, k / B, bytes / 2], d (, dmin):
// f16[n, k / B] -> y: f32[*b, n] against its attributes (a GGUF block format: dtype its name,
// its layout, group_size B, scale_dtype f16, offset as the format has one; errors are
// InvalidArgument, prefixed with `target`, naming the operands' types) and fills p's x, q,
// d, dmin, y, m, k, n, nb, fmt. `transposed`: as for BindNk, x: f32[*b, n] -> y: f32[*b, k].
xla::ffi::Error BindBlock(std::string_view target, xla::ffi::Buffer<xla::ffi::F32> x,
                          xla::ffi::AnyBuffer q, xla::ffi::AnyBuffer s,
                          xla::ffi::RemainingArgs rest, xla::ffi::Buffer<xla::ffi::F32>* y,
                          std::string_view dtype, std::string_view layout, int64_t group_size,
                          std::string_view scale_dtype, bool offset, BlockProblem* p,
                          bool transposed = false);

// Blocks of rows of W: about kBlocksPerThread per thread, whole tiles of nr rows, and no
// more rows than fill half the L2 cache this CPU reports (256 KiB when it does not say)
// at row_bytes bytes each (the block's decoded rows, in a thread's scratch).
Blocking NkRowBlocks(int64_t n, int64_t nr, int64_t threads, int64_t row_bytes);

}  // namespace hxmlir

// The operands and attributes these handlers bind (BindNk, BindBlock check them).
#define HX_NK_FFI_BINDING()                                                   \
  ::xla::ffi::Ffi::Bind()                                                     \
      .Ctx<::xla::ffi::ThreadPool>()                                          \
      .Arg<::xla::ffi::Buffer<::xla::ffi::F32>>() /* x */                     \
      .Arg<::xla::ffi::AnyBuffer>()               /* q */                     \
      .Arg<::xla::ffi::AnyBuffer>()               /* s (f32, f16) */          \
      .RemainingArgs()                            /* o (offset formats) */    \
      .Ret<::xla::ffi::Buffer<::xla::ffi::F32>>() /* y */                     \
      .Attr<std::string_view>("dtype")                                        \
      .Attr<std::string_view>("layout")                                       \
      .Attr<int64_t>("group_size")                                            \
      .Attr<std::string_view>("scale_dtype")                                  \
      .Attr<bool>("offset")

#endif  // HXMLIR_CSRC_MATMUL_Q_NK_FFI_H_
