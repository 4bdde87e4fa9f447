"""GGUF's block formats at the file's bytes: their :class:`~hxmlir.format_spec.Format`s and
their values' field tables (:mod:`hxmlir.formats` re-exports every name here).

Each block format (:data:`BLOCK_FORMATS`) holds one GGUF type exactly: a tensor
``[*lead, n]`` is ``n // B`` blocks of ``B`` elements along its last axis, and a block is
llama.cpp's ``block_*`` struct (``ggml-common.h``) split into three components: the
block's f16 ``d`` (the **scale**, ``f16[*lead, n // B]``: one group per block, the type's
group size is ``B``), its f16 ``dmin`` (the **offset**, like the scale,
where the format has one: Q4_K, Q5_K, Q2_K; Q5_1's ``m``) and the block's other bytes, in
the file's order (the **values**, ``ui16[*lead, n // B, W]``: the bytes as little-endian
16-bit words, byte ``2i`` the low byte of word ``i``; ``W`` words per block). The values
hold the sub-block factors (the second level of the scales: 6-bit for Q4_K, Q5_K, Q3_K,
IQ4_XS, int8 for Q6_K, 4-bit for Q2_K) and the quantized values packed at their bit width
in the file's bit planes (4 + 1 bits for 5-bit values, 4 + 2 for 6-bit, 2 + 1 for 3-bit, 2
for 2-bit; IQ4's 4-bit indices into the fixed table :data:`hxmlir.block_decode.IQ4_VALUES`).
No byte is added: device bytes equal the file's. The dense value is
``x = d · sc · q − dmin · m`` (K-quants with mins), ``d · sc · q`` (Q6_K, Q3_K), ``d · sc ·
T[i]`` (IQ4_XS), ``d · q (+ m)`` (Q5_0, Q5_1), ``d · T[i]`` (IQ4_NL), as llama.cpp's
``dequantize_row_*`` (``ggml-quants.c``) computes it; :mod:`hxmlir.block_decode` decodes
them (bit for bit ``gguf.quants.dequantize``'s result).

=============  ===========  =====  ===  ==============  ==============  =================================
format         GGUF         B      W    bytes / block   bits / value    fields of the values (bytes)
=============  ===========  =====  ===  ==============  ==============  =================================
``q5_0``       Q5_0         32     10   22              5.5             qh 4, qs 16; ``q - 16``
``q5_1``       Q5_1         32     10   24 (offset m)   6               qh 4, qs 16; ``d·q + m``
``iq4_nl``     IQ4_NL       32     8    18              4.5             qs 16: table indices
``q4_k``       Q4_K         256    70   144 (dmin)      4.5             scales 12, qs 128
``q5_k``       Q5_K         256    86   176 (dmin)      5.5             scales 12, qh 32, qs 128
``q6_k``       Q6_K         256    104  210             6.5625          ql 128, qh 64, scales 16 (int8)
``q2_k``       Q2_K         256    40   84 (dmin)       2.625           scales 16 (4+4 bit), qs 64
``q3_k``       Q3_K         256    54   110             3.4375          hmask 32, qs 64, scales 12
``iq4_xs``     IQ4_XS       256    67   136             4.25            scales_h 2, scales_l 4, qs 128
=============  ===========  =====  ===  ==============  ==============  =================================

Each :class:`Format`'s ``fields`` spells its values' fields (name, bytes, meaning: which
bits of which byte hold which element). Their types print ``q4_k[576,1536:g256,f16]`` (the
format's name, the block as the group size, the f16 scales). A block format is identified
by its components like every format (:func:`hxmlir.formats.of_components`): ``ui16``
values, which no other format has, and their words per block ``W`` (with the offset, Q5_0
and Q5_1 differ by it). A sharding of the last axis must keep whole blocks
(:func:`hxmlir.formats.split_problem`). ``hx.quantize`` does not make them
(:func:`hxmlir.formats.check_method`). Kernels: the native CPU kernel ``hx_matmul_q_cpu_v4``
in the checkpoints' ``"nk"`` layout (``native_cpu = ("nk",)``, ``docs/kernels.md``). The
Pallas kernels ``hx_matmul_q_nk_blocks_v1`` take the same layout (``pallas = ("nk",)``; on
Mosaic they decode the bit planes of :mod:`hxmlir.block_layout`, on Triton they gather each
element's bits by the same tables). They are direct calls: the lowering rules keep the
StableHLO decomposition on TPU, which was faster there, and on GPUs, where the Triton kernel
has not run. Other platforms and layouts emit the decomposition too.
"""

from __future__ import annotations

import numpy as np

from hxmlir.format_spec import F16, Format

UI16 = np.dtype(np.uint16)


def _block_format(gguf: str, block: int, fields, value_range, offset: bool = False) -> Format:
  """A block format (see the module docstring): GGUF type ``gguf``'s blocks of
  ``block`` elements, stored as ``fields`` in ``ui16`` words with an f16 scale (and
  offset) per block; in ``[out, in]`` the native CPU kernel ``hx_matmul_q_cpu_v4`` (and the
  Pallas kernels ``hx_matmul_q_nk_blocks_v1``, called directly), StableHLO
  decompositions elsewhere."""
  name = gguf.lower()
  return Format(name, name, UI16, UI16, "ui16", 1, 0, f"gguf_{name}_v1", scale_dtype=F16,
                offset=offset, value_range=value_range, native_cpu=("nk",), pallas=("nk",),
                block=block, fields=tuple(fields), gguf=gguf)


_NIBBLES_32 = ("qs", 16, "low 4 bits: element j in the low nibble of byte j, j + 16 in its "
               "high nibble")
_QH_32 = ("qh", 4, "fifth bits: element j's is bit j of qh as a little-endian u32")
_K_SCALES = ("scales", 12, "6-bit factors of the 8 sub-blocks of 32: scales sc and mins m "
             "(llama.cpp's get_scale_min_k4: sub-blocks 0-3 bits 0-5 of bytes 0-3 (sc) and "
             "4-7 (m); 4-7 the nibbles of bytes 8-11 (sc low, m high) with bits 6-7 of "
             "bytes 0-7 on top)")
_K_QS = ("qs", 128, "low 4 bits: per 64 elements 32 bytes, element l in the low nibble of "
         "byte l, 32 + l in its high nibble")
Q5_0 = _block_format("Q5_0", 32, [_QH_32, _NIBBLES_32], (-16, 15))
Q5_1 = _block_format("Q5_1", 32, [_QH_32, _NIBBLES_32], (0, 31), offset=True)
IQ4_NL = _block_format("IQ4_NL", 32, [("qs", 16, "4-bit indices i into IQ4_VALUES, "
                                                 "ordered as Q4_0's nibbles")], (-127, 113))
Q4_K = _block_format("Q4_K", 256, [_K_SCALES, _K_QS], (0, 15), offset=True)
Q5_K = _block_format("Q5_K", 256, [_K_SCALES, ("qh", 32, "fifth bits: element 32c + l's is "
                                               "bit c of byte l"), _K_QS], (0, 31), offset=True)
Q6_K = _block_format("Q6_K", 256, [
    ("ql", 128, "low 4 bits: per 128 elements 64 bytes, element l (l < 64) the low nibble "
                "of byte l, 64 + l its high nibble"),
    ("qh", 64, "high 2 bits: per 128 elements 32 bytes, element 32s + l's are bits 2s, "
               "2s + 1 of byte l"),
    ("scales", 16, "int8 factor of each sub-block of 16")], (-32, 31))
Q2_K = _block_format("Q2_K", 256, [
    ("scales", 16, "per sub-block of 16: the 4-bit factor of d (low nibble) and of dmin "
                   "(high nibble)"),
    ("qs", 64, "2-bit values: per 128 elements 32 bytes, element 32s + l's are bits 2s, "
               "2s + 1 of byte l")], (0, 3), offset=True)
Q3_K = _block_format("Q3_K", 256, [
    ("hmask", 32, "third bits: element 32c + l's is bit c of byte l; a clear bit "
                  "subtracts 4"),
    ("qs", 64, "low 2 bits, as Q2_K's"),
    ("scales", 12, "6-bit factors - 32 of the 16 sub-blocks of 16: low 4 bits the nibbles "
                   "of bytes 0-7 (sub-block 8n + b: nibble n of byte b), high 2 bits "
                   "bits 2s, 2s + 1 of bytes 8-11 (sub-block 4s + b)")], (-4, 3))
IQ4_XS = _block_format("IQ4_XS", 256, [
    ("scales_h", 2, "high 2 bits of the 8 sub-blocks' 6-bit factors - 32: bits 2j, 2j + 1 "
                    "of a little-endian u16"),
    ("scales_l", 4, "low 4 bits of those factors: sub-block 2b + n in nibble n of byte b"),
    ("qs", 128, "4-bit indices i into IQ4_VALUES: per sub-block of 32, 16 bytes, element "
                "l in the low nibble of byte l, 16 + l in its high nibble")], (-127, 113))
BLOCK_FORMATS = (Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS)
"""The block formats (GGUF's blocks at the file's bytes), in
:data:`hxmlir.formats.FORMATS`' order."""
