// The value formats the native CPU kernels decode: one row per format, the one list the
// FFI handlers (their operand checks), the per-ISA kernels (their dispatch by format) and
// the Python module (hxmlir._matmul_q_cpu.native_formats(), checked against
// hxmlir.formats.FORMATS by the tests) are generated from. A format's decode is its
// decoder in formats/ (values; scales and offsets are f32 or f16 arrays beside them,
// matmul_q_nk.h).
//
//   X(id, Decoder, dtype, layout, storage, ffi_type, pack, kn, i8x)
//
// id: the ValueFormat enumerator; Decoder: its struct (formats/<name>.inc); dtype, layout:
// the composites' attributes naming it (hxmlir/formats.py: Format.value_dtype's name,
// Format.layout); storage, ffi_type: the stored element type as messages spell it and as
// XLA's FFI does; pack: values per stored byte; kn: also taken in hx.matmul_q's main
// layout [in, out] (hx_matmul_q_cpu_v2; every format is taken in [out, in],
// hx_matmul_q_cpu_v3); i8x: has the integer-activation path (hx_matmul_q_cpu_i8x_v1).
//
// A new format: its decoder in formats/, #included by formats/all.inc, and a row here.
#ifndef HXMLIR_CSRC_MATMUL_Q_FORMAT_TABLE_H_
#define HXMLIR_CSRC_MATMUL_Q_FORMAT_TABLE_H_

#include <cstdint>
#include <string>

#define HX_VALUE_FORMATS(X)                                                                  \
  X(kInt8, Int8Fmt, "int8", "plain", "s8", S8, 1, true, true)                                \
  X(kInt4, Int4Fmt, "int4", "int4_pairs_v1", "u8", U8, 2, true, true)                        \
  X(kUInt4, UInt4Fmt, "uint4", "uint4_pairs_v1", "u8", U8, 2, false, true)                   \
  X(kFp8E4M3Fn, Fp8Fmt, "float8_e4m3fn", "plain", "f8E4M3FN", F8E4M3FN, 1, true, false)

// GGUF's block formats at the file's bytes (hx_matmul_q_cpu_v4, [out, in] only; decoders in
// formats/gguf_blocks.inc):
//
//   X(id, Decoder, dtype, layout, block, bytes, offset)
//
// dtype, layout: the composites' attributes (Format.name, Format.layout); block: elements
// per block (the group size); bytes: the values' bytes per block (the d and dmin of a block
// are the f16 scale and offset operands); offset: whether the format has dmin (or m).
#define HX_BLOCK_FORMATS(X)                                   \
  X(kQ5_0, Q5_0Fmt, "q5_0", "gguf_q5_0_v1", 32, 20, false)    \
  X(kQ5_1, Q5_1Fmt, "q5_1", "gguf_q5_1_v1", 32, 20, true)     \
  X(kIq4Nl, Iq4NlFmt, "iq4_nl", "gguf_iq4_nl_v1", 32, 16, false) \
  X(kQ4_K, Q4_KFmt, "q4_k", "gguf_q4_k_v1", 256, 140, true)   \
  X(kQ5_K, Q5_KFmt, "q5_k", "gguf_q5_k_v1", 256, 172, true)   \
  X(kQ6_K, Q6_KFmt, "q6_k", "gguf_q6_k_v1", 256, 208, false)  \
  X(kQ2_K, Q2_KFmt, "q2_k", "gguf_q2_k_v1", 256, 80, true)    \
  X(kQ3_K, Q3_KFmt, "q3_k", "gguf_q3_k_v1", 256, 108, false)  \
  X(kIq4Xs, Iq4XsFmt, "iq4_xs", "gguf_iq4_xs_v1", 256, 134, false)

namespace hxmlir {

enum class BlockFormat : int {
#define HX_X(id, ...) id,
  HX_BLOCK_FORMATS(HX_X)
#undef HX_X
};

struct BlockFormatInfo {
  const char* dtype;
  const char* layout;
  int64_t block, bytes;
  bool offset;
};

inline constexpr BlockFormatInfo kBlockFormats[] = {
#define HX_X(id, D, dtype, layout, block, bytes, offset) {dtype, layout, block, bytes, offset},
    HX_BLOCK_FORMATS(HX_X)
#undef HX_X
};

constexpr const BlockFormatInfo& InfoOf(BlockFormat f) { return kBlockFormats[static_cast<int>(f)]; }

enum class ValueFormat : int {
#define HX_X(id, ...) id,
  HX_VALUE_FORMATS(HX_X)
#undef HX_X
};

// The v2 kernels' and the [out, in] kernels' names for it (one enumeration).
using QFormat = ValueFormat;
using NkValues = ValueFormat;

struct ValueFormatInfo {
  const char* dtype;
  const char* layout;
  const char* storage;
  int64_t pack;
  bool kn, i8x;
};

inline constexpr ValueFormatInfo kValueFormats[] = {
#define HX_X(id, D, dtype, layout, storage, type, pack, kn, i8x) \
  {dtype, layout, storage, pack, kn, i8x},
    HX_VALUE_FORMATS(HX_X)
#undef HX_X
};

constexpr const ValueFormatInfo& InfoOf(ValueFormat v) {
  return kValueFormats[static_cast<int>(v)];
}

// Dense values per stored byte.
constexpr int64_t PackOf(ValueFormat v) { return InfoOf(v).pack; }
constexpr int64_t NkPackOf(ValueFormat v) { return PackOf(v); }

// The dtypes of the formats `keep` keeps, for messages: "int8, int4 or float8_e4m3fn"
// (conj "or"; "and" for a list of what a path takes).
template <class Keep>
std::string DtypeList(Keep keep, const char* conj = "or") {
  std::string out, last;
  for (const ValueFormatInfo& f : kValueFormats) {
    if (!keep(f)) continue;
    if (!last.empty()) out += (out.empty() ? "" : ", ") + last;
    last = f.dtype;
  }
  return out.empty() ? last : out + " " + conj + " " + last;
}

}  // namespace hxmlir

#endif  // HXMLIR_CSRC_MATMUL_Q_FORMAT_TABLE_H_
