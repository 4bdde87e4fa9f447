"""Decoders of the block formats (:mod:`hxmlir.formats`: GGUF's Q5_0 ... IQ4_XS at the file's
bytes), in plain JAX: they run traced, in decompositions and in the types' rules.

Each decoder takes a block format's stored values ``b: ui16[*lead, nb, W]`` (each block's
bytes, the GGUF block without its f16 header ``d``/``dmin``, as little-endian 16-bit words;
:data:`hxmlir.formats.FORMATS` names each format's fields) and returns ``(u, v)``:
``f32[*lead, nb * block]`` each, the dense value's derivatives in the block's scale ``d`` and
offset ``dmin`` (``v``: ``None`` for a format without an offset), so the dense value is
``x = u * d + v * dmin`` per block. ``u`` holds the sub-block factor times the value
(``sc · q``), ``v`` the sub-block min factor (``-m``; ``1`` for Q5_1), both small integers
(exact in f32), so ``u * d`` and ``v * dmin`` are each one rounding of the exact product
llama.cpp's ``dequantize_row_*`` forms, and ``x`` equals ``gguf.quants.dequantize`` of the
same bytes bit for bit.

The layouts are llama.cpp's ``block_q5_0`` ... ``block_iq4_xs`` (``ggml-common.h``) and their
decoding ``dequantize_row_*`` (``ggml-quants.c``); ``gguf.quants`` (the ``gguf`` package)
is the reference the tests compare with.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

OFFSET_AS_IS = frozenset({"q5_1"})
"""The block formats whose ``v`` is 1 at every element: the offset is added to each block's
elements as it is (``x = q * d + m``), as the elementwise formats add theirs."""

IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
"""The fixed 16-entry table of IQ4_NL and IQ4_XS (llama.cpp's ``kvalues_iq4nl``): a 4-bit
index ``i`` decodes to ``IQ4_VALUES[i]`` times the (sub-)block's scale."""


def block_bytes(b):
  """``ui16[*l, nb, W]`` words -> ``ui8[*l, nb, 2W]`` bytes (byte ``2i`` the low byte of word
  ``i``: the file's order)."""
  lo = (b & np.uint16(0xFF)).astype(jnp.uint8)
  hi = (b >> np.uint16(8)).astype(jnp.uint8)
  return jnp.stack([lo, hi], axis=-1).reshape(*b.shape[:-1], 2 * b.shape[-1])


def _bits(x, shifts, mask):
  """``x[..., None, :] >> shifts[:, None] & mask``: one bit field per shift, as ``ui8``."""
  s = jnp.asarray(np.asarray(shifts, np.uint8))[:, None]
  return (x[..., None, :] >> s) & np.uint8(mask)


def _nibbles(qs, order: str):
  """``ui8[..., 16k]`` -> ``ui8[..., 32k]``: per 16 bytes (``order="16"``: IQ4_XS, Q5_0's
  block) or per ``len`` bytes (``"all"``), the low nibbles then the high ones."""
  if order == "all":
    return _bits(qs, [0, 4], 0xF).reshape(*qs.shape[:-1], 2 * qs.shape[-1])
  c = qs.reshape(*qs.shape[:-1], qs.shape[-1] // 16, 16)
  return _bits(c, [0, 4], 0xF).reshape(*qs.shape[:-1], 2 * qs.shape[-1])


def _k_scales(sc):
  """Q4_K/Q5_K's 12 bytes of 6-bit factors -> ``(scales, mins)``, ``ui8[..., 8]`` each
  (llama.cpp's ``get_scale_min_k4``): sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales)
  and 4-7 (mins); 4-7 in the nibbles of bytes 8-11, their top 2 bits in bits 6-7 of bytes
  0-3 and 4-7."""
  a, m, md = sc[..., 0:4], sc[..., 4:8], sc[..., 8:12]
  scales = jnp.concatenate([a & 63, (md & 0xF) | ((a >> 6) << 4)], -1)
  mins = jnp.concatenate([m & 63, (md >> 4) | ((m >> 6) << 4)], -1)
  return scales, mins


def _per(factor, values, sub: int):
  """``factor: [*l, nb, S]`` (one per sub-block of ``sub``) times ``values: [*l, nb, S*sub]``,
  in f32 (small integers: exact)."""
  f = factor.astype(jnp.float32)
  v = values.astype(jnp.float32)
  # the sub-block count spelled out: a -1 cannot be resolved on an empty array
  return (v.reshape(*v.shape[:-1], v.shape[-1] // sub, sub) * f[..., None]).reshape(v.shape)


def _flat(x):
  return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def _q5_0(by):  # qh (4), qs (16); q - 16
  return _flat(_five_bits(by).astype(jnp.float32) - 16), None


def _q5_1(by):  # qh (4), qs (16); d * q + m
  q = _five_bits(by).astype(jnp.float32)
  return _flat(q), _flat(jnp.ones_like(q))


def _five_bits(by):
  """Q5_0/Q5_1 blocks (``qh`` 4 bytes, little-endian: bit ``j`` element ``j``'s fifth bit;
  ``qs`` 16: element ``j`` low nibble of byte ``j``, ``j + 16`` its high nibble) -> ``ui8``
  values in [0, 31]."""
  qh = _bits(by[..., 0:4], range(8), 1)  # [.., 4 bytes, 8 bits] -> element 8 * byte + bit
  hb = jnp.swapaxes(qh, -1, -2).reshape(*by.shape[:-1], 32)
  return _nibbles(by[..., 4:20], "all") | (hb << np.uint8(4))


def _iq4_nl(by):  # qs (16): table index, element j low nibble of byte j, j + 16 high
  table = jnp.asarray(np.asarray(IQ4_VALUES, np.float32))
  return _flat(table[_nibbles(by, "all").astype(jnp.int32)]), None


def _q4_k(by):  # scales (12), qs (128): per 64 elements, 32 bytes, low nibbles then high
  sc, m = _k_scales(by[..., 0:12])
  q = _nibbles(by[..., 12:140].reshape(*by.shape[:-1], 4, 32), "all")
  q = q.reshape(*by.shape[:-1], 256)
  return _flat(_per(sc, q, 32)), _flat(-_per(m, jnp.ones_like(q), 32))


def _q5_k(by):  # scales (12), qh (32), qs (128): chunk c of 64 takes qh bits 2c, 2c + 1
  sc, m = _k_scales(by[..., 0:12])
  lo = _nibbles(by[..., 44:172].reshape(*by.shape[:-1], 4, 32), "all")
  lo = lo.reshape(*by.shape[:-1], 256)
  hi = _bits(by[..., 12:44], range(8), 1).reshape(*by.shape[:-1], 256)
  q = lo | (hi << np.uint8(4))
  return _flat(_per(sc, q, 32)), _flat(-_per(m, jnp.ones_like(q), 32))


def _q6_k(by):  # ql (128), qh (64), scales (16 int8) per 16 elements; q - 32
  lead = by.shape[:-1]
  ql = _nibbles(by[..., 0:128].reshape(*lead, 2, 64), "all")  # [.., half, 128]: 4 x 32
  qh = _bits(by[..., 128:192].reshape(*lead, 2, 32), [0, 2, 4, 6], 3)  # [.., half, 4, 32]
  q = ql.reshape(*lead, 2, 4, 32) | (qh << np.uint8(4))
  q = q.reshape(*lead, 256).astype(jnp.int32) - 32
  sc = _as_int8(by[..., 192:208])
  return _flat(_per(sc, q, 16)), None


def _as_int8(u):
  """``ui8`` bytes read as two's-complement ``int8`` (as ``i32``)."""
  u = u.astype(jnp.int32)
  return jnp.where(u >= 128, u - 256, u)


def _q2_k(by):  # scales (16: low nibble scale, high nibble min, per 16), qs (64)
  lead = by.shape[:-1]
  q = _bits(by[..., 16:80].reshape(*lead, 2, 32), [0, 2, 4, 6], 3).reshape(*lead, 256)
  sc = by[..., 0:16]
  return _flat(_per(sc & 0xF, q, 16)), _flat(-_per(sc >> 4, jnp.ones_like(q), 16))


def _q3_k(by):  # hmask (32), qs (64), scales (12: 16 6-bit factors - 32), per 16
  lead = by.shape[:-1]
  low = _bits(by[..., 32:96].reshape(*lead, 2, 32), [0, 2, 4, 6], 3).reshape(*lead, 256)
  hbit = _bits(by[..., 0:32], range(8), 1).reshape(*lead, 256)
  q = low.astype(jnp.int32) - 4 * (1 - hbit.astype(jnp.int32))
  s = by[..., 96:108]
  ls = _bits(s[..., 0:8], [0, 4], 0xF).reshape(*lead, 16)
  hs = _bits(s[..., 8:12], [0, 2, 4, 6], 3).reshape(*lead, 16)
  sc = (ls | (hs << np.uint8(4))).astype(jnp.int32) - 32
  return _flat(_per(sc, q, 16)), None


def _iq4_xs(by):  # scales_h (2, little-endian u16: 2 bits per sub-block), scales_l (4), qs (128)
  lead = by.shape[:-1]
  sh = by[..., 0].astype(jnp.uint16) | (by[..., 1].astype(jnp.uint16) << np.uint16(8))
  hs = ((sh[..., None] >> jnp.asarray(np.arange(0, 16, 2, dtype=np.uint16)))
        & np.uint16(3)).astype(jnp.uint8)
  ls = _bits(by[..., 2:6], [0, 4], 0xF)  # [.., 2 nibbles, 4 bytes]: sub-block 2 * byte + nib
  ls = jnp.swapaxes(ls, -1, -2).reshape(*lead, 8)
  sc = (ls | (hs << np.uint8(4))).astype(jnp.int32) - 32
  table = jnp.asarray(np.asarray(IQ4_VALUES, np.float32))
  idx = _nibbles(by[..., 6:134], "16").reshape(*lead, 256)
  return _flat(_per(sc, table[idx.astype(jnp.int32)], 32)), None


DECODERS = {"q5_0": _q5_0, "q5_1": _q5_1, "iq4_nl": _iq4_nl, "q4_k": _q4_k, "q5_k": _q5_k,
            "q6_k": _q6_k, "q2_k": _q2_k, "q3_k": _q3_k, "iq4_xs": _iq4_xs}
"""Each block format's decoder by format name: ``ui8[*l, nb, bytes] -> (u, v)``."""


def units(b, name: str):
  """``(u, v)`` of stored values ``b: ui16[*l, nb, W]`` of block format ``name``: ``f32[*l,
  nb * block]`` each (``v``: ``None`` without an offset); the module docstring says what
  they are."""
  return DECODERS[name](block_bytes(b))
