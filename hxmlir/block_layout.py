"""Where each bit of a block format's values lies: the block formats of
:mod:`hxmlir.block_formats` as tables of bit fields, for kernels that decode a block with
shifts and masks of whole words (the Pallas ``[out, in]`` kernel,
``lowering/matmul_q/pallas/nk_blocks.py``).

A block's values (its bytes without the f16 ``d``/``dmin``, llama.cpp's ``block_*`` structs in
``ggml-common.h``) hold two kinds of quantity, each a sum of bit fields:

* per element ``e`` of the block, the stored value ``q_e = sum_f ((byte >> shift) & mask) <<
  dest`` over the format's :class:`ValueField` s, then ``q_e - minus``, or, for the non-linear
  formats, ``table[q_e]`` (IQ4_NL, IQ4_XS: :data:`hxmlir.block_decode.IQ4_VALUES`);
* per sub-block ``s`` (``sub`` consecutive elements), the scale factor ``sc_s`` and the min
  factor ``m_s``, each a sum of :class:`FactorPiece` s, then ``- factor_minus`` or read as a
  signed byte (Q6_K). A format without sub-block factors has ``sc = 1`` and no ``m``.

The dense value is then ``x_e = d * sc_s * q_e - dmin * m_s`` (``+ dmin`` for Q5_1's offset),
as :mod:`hxmlir.block_decode` computes it (``u = sc * q``, ``v = -m``). :func:`decode` evaluates
these tables with NumPy; the tests compare it with :func:`hxmlir.block_decode.units` bit for
bit for every format, so the tables and the decoders describe the same bits. Sources: the
structs in ``ggml-common.h`` and ``dequantize_row_*`` in ``ggml-quants.c`` (llama.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hxmlir.block_decode import IQ4_VALUES, OFFSET_AS_IS


@dataclass(frozen=True)
class ValueField:
  """``nbytes`` bytes from byte ``offset`` of the block's values, each holding ``8 // width``
  fields of ``width`` bits (slot ``t`` at bits ``[t * width, (t + 1) * width)``); slot ``t``
  of byte ``offset + i`` gives bits ``[dest, dest + width)`` of element ``elements[i, t]``'s
  stored value."""
  offset: int
  nbytes: int
  width: int
  dest: int
  elements: np.ndarray  # int64[nbytes, 8 // width]


@dataclass(frozen=True)
class FactorPiece:
  """Per sub-block ``s``: bits ``[shift[s], shift[s] + width[s])`` of byte ``at[s]`` give bits
  ``[dest[s], dest[s] + width[s])`` of its factor (``width[s] = 0``: nothing for ``s``)."""
  at: np.ndarray
  shift: np.ndarray
  width: np.ndarray
  dest: np.ndarray


@dataclass(frozen=True)
class BlockLayout:
  """The bit layout of one block format (see the module docstring): ``block`` elements,
  ``nbytes`` bytes of values, sub-blocks of ``sub`` elements."""
  name: str
  block: int
  nbytes: int
  fields: tuple[ValueField, ...]
  minus: int = 0
  table: tuple[int, ...] | None = None
  sub: int | None = None
  scale: tuple[FactorPiece, ...] = ()
  factor_minus: int = 0
  signed_scale: bool = False
  mins: tuple[FactorPiece, ...] = ()

  @property
  def subs(self) -> int:
    """Sub-blocks per block (1 without sub-block factors)."""
    return self.block // (self.sub or self.block)

  @property
  def offset_as_is(self) -> bool:
    """Whether the offset ``dmin`` is added to every element as it is (Q5_1)."""
    return self.name in OFFSET_AS_IS


def _field(offset, nbytes, width, dest, element) -> ValueField:
  """A :class:`ValueField` whose element of (byte ``i``, slot ``t``) is ``element(i, t)``."""
  i, t = np.meshgrid(np.arange(nbytes), np.arange(8 // width), indexing="ij")
  return ValueField(offset, nbytes, width, dest, np.asarray(element(i, t), np.int64))


def _piece(at, shift, width, dest=0) -> FactorPiece:
  return FactorPiece(*(np.broadcast_to(np.asarray(a, np.int64), np.shape(at)).copy()
                       for a in (at, shift, width, dest)))


_S8 = np.arange(8)
_S16 = np.arange(16)
_LOW8 = np.where(_S8 < 4, 6, 4)      # Q4_K/Q5_K: 6 bits for sub-blocks 0-3, 4 for 4-7
_HIGH8 = np.where(_S8 < 4, 0, 2)     # ... and the top 2 bits of 4-7
_K_SCALE = (_piece(np.where(_S8 < 4, _S8, _S8 + 4), 0, _LOW8),
            _piece(np.where(_S8 < 4, 0, _S8 - 4), 6, _HIGH8, 4))
_K_MIN = (_piece(_S8 + 4, np.where(_S8 < 4, 0, 4), _LOW8),
          _piece(np.where(_S8 < 4, 0, _S8), 6, _HIGH8, 4))


def _nibbles32(offset):  # element l low nibble of byte l, l + 16 its high nibble
  return _field(offset, 16, 4, 0, lambda i, t: i + 16 * t)


def _qh32():  # element j's fifth bit: bit j of 4 bytes read as a little-endian u32
  return _field(0, 4, 1, 4, lambda i, t: 8 * i + t)


def _k_qs(offset):  # per 64 elements 32 bytes: byte 32c + l, low nibble 64c + l, high + 32
  return _field(offset, 128, 4, 0, lambda i, t: 64 * (i // 32) + 32 * t + i % 32)


def _two_bits(offset, dest):  # per 128 elements 32 bytes: byte 32h + l, slot t: 128h + 32t + l
  return _field(offset, 64, 2, dest, lambda i, t: 128 * (i // 32) + 32 * t + i % 32)


def _bit_planes(offset, nbytes, dest):  # element 32c + l: bit c of byte l
  return _field(offset, nbytes, 1, dest, lambda i, t: 32 * t + i)


LAYOUTS: dict[str, BlockLayout] = {lay.name: lay for lay in (
    BlockLayout("q5_0", 32, 20, (_qh32(), _nibbles32(4)), minus=16),
    BlockLayout("q5_1", 32, 20, (_qh32(), _nibbles32(4))),
    BlockLayout("iq4_nl", 32, 16, (_nibbles32(0),), table=IQ4_VALUES),
    BlockLayout("q4_k", 256, 140, (_k_qs(12),), sub=32, scale=_K_SCALE, mins=_K_MIN),
    BlockLayout("q5_k", 256, 172, (_bit_planes(12, 32, 4), _k_qs(44)), sub=32, scale=_K_SCALE,
                mins=_K_MIN),
    BlockLayout("q6_k", 256, 208, (
        _field(0, 128, 4, 0, lambda i, t: 128 * (i // 64) + 64 * t + i % 64),
        _two_bits(128, 4)), minus=32, sub=16, scale=(_piece(192 + _S16, 0, 8),),
        signed_scale=True),
    BlockLayout("q2_k", 256, 80, (_two_bits(16, 0),), sub=16, scale=(_piece(_S16, 0, 4),),
                mins=(_piece(_S16, 4, 4),)),
    BlockLayout("q3_k", 256, 108, (_bit_planes(0, 32, 2), _two_bits(32, 0)), minus=4, sub=16,
                scale=(_piece(96 + _S16 % 8, 4 * (_S16 // 8), 4),
                       _piece(104 + _S16 % 4, 2 * (_S16 // 4), 2, 4)), factor_minus=32),
    BlockLayout("iq4_xs", 256, 134, (
        _field(6, 128, 4, 0, lambda i, t: 32 * (i // 16) + 16 * t + i % 16),),
        table=IQ4_VALUES, sub=32,
        scale=(_piece(2 + _S8 // 2, 4 * (_S8 % 2), 4), _piece(_S8 // 4, 2 * (_S8 % 4), 2, 4)),
        factor_minus=32),
)}
"""Each block format's :class:`BlockLayout`, by format name (:data:`hxmlir.formats.FORMATS`)."""


def _factor(by, pieces, minus: int = 0, signed: bool = False):
  """``int64[..., S]``: the factor of each sub-block of bytes ``by: uint8[..., nbytes]``."""
  total = 0
  for p in pieces:
    total = total + (((by[..., p.at].astype(np.int64) >> p.shift) & ((1 << p.width) - 1))
                     << p.dest)
  if signed:
    total = np.where(total >= 128, total - 256, total)
  return total - minus


def _blocks(by, lay: BlockLayout) -> np.ndarray:
  by = np.asarray(by)
  if by.dtype != np.uint8 or by.ndim < 1 or by.shape[-1] != lay.nbytes:
    raise ValueError(f"{lay.name} blocks are uint8[..., {lay.nbytes}] (the block without its "
                     f"f16 d/dmin), got {by.dtype}{list(by.shape)}")
  return by


def factors(by, lay: BlockLayout):
  """``(sc, m)``: ``int64[..., S]`` each, the sub-block factors of blocks ``by: uint8[...,
  nbytes]`` (``m``: ``None`` without mins; a format without factors: ``sc`` is 1). Raises
  ``ValueError`` naming the format when ``by`` is not ``uint8[..., nbytes]``."""
  by = _blocks(by, lay)
  sc = _factor(by, lay.scale, lay.factor_minus, lay.signed_scale) if lay.scale else \
      np.ones((*by.shape[:-1], 1), np.int64)
  return sc, _factor(by, lay.mins) if lay.mins else None


def decode(by, lay: BlockLayout):
  """``(u, v)`` of blocks ``by: uint8[..., nbytes]`` (the block's values, without ``d``/``dmin``)
  by the tables of ``lay``: ``f32[..., block]`` each (``v``: ``None`` without an offset), as
  :func:`hxmlir.block_decode.units` defines them (``x = u * d + v * dmin``). Raises
  ``ValueError`` naming the format when ``by`` is not ``uint8[..., nbytes]``."""
  by = _blocks(by, lay)
  q = np.zeros((*by.shape[:-1], lay.block), np.int64)
  for f in lay.fields:
    for t in range(8 // f.width):
      bits = (by[..., f.offset:f.offset + f.nbytes].astype(np.int64) >> (t * f.width)) & \
          ((1 << f.width) - 1)
      q[..., f.elements[:, t]] |= bits << f.dest
  value = np.asarray(lay.table, np.int64)[q] if lay.table else q - lay.minus
  sub = lay.sub or lay.block
  sc, m = factors(by, lay)
  u = (value * np.repeat(sc, sub, axis=-1)).astype(np.float32)
  if m is not None:
    return u, -np.repeat(m, sub, axis=-1).astype(np.float32)
  if lay.offset_as_is:
    return u, np.ones_like(u)
  return u, None
