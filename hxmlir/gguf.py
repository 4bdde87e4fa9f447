"""GGUF checkpoints (llama.cpp's file format) as hx values, exactly and without an f32 copy.

:func:`load` reads a ``.gguf`` file through a memory map (the ``gguf`` package's
``GGUFReader``; ``pip install 'hxmlir[gguf]'``) and returns a :class:`Checkpoint`: its
``metadata`` (the file's key/value pairs as Python values) and its ``tensors`` (every
tensor by its GGUF name, ``blk.0.attn_q.weight``, in NumPy order: ``[out, in]``),
each the hx value that holds the file's numbers exactly:

========  ==================================  ===========================================
GGUF      hx value                            how
========  ==================================  ===========================================
F32       ``f32[...]``                        as stored
F16       ``f16[...]``                        as stored
BF16      ``bf16[...]``                       as stored
F64, I8   ``f64[...]``, ``i8[...]``, ...       as stored (I16, I32, I64 too); 64-bit ones stay
                                              NumPy arrays unless ``jax_enable_x64``
Q8_0      ``q8[out, in:g32,f16]``             int8 values, the block's f16 ``d``
Q4_0      ``q4[out, in:g32,f16]``             ``q - 8`` in [-8, 7], repacked; f16 ``d``
Q4_1      ``u4o[out, in:g32,f16]``            ``q`` in [0, 15], repacked; f16 ``d`` and ``m``
Q5_0      ``q5_0[out, in:g32,f16]``           the file's blocks: ``qh``, ``qs`` words; f16 ``d``
Q5_1      ``q5_1[out, in:g32,f16]``           the file's blocks; f16 ``d`` and ``m``
IQ4_NL    ``iq4_nl[out, in:g32,f16]``         the file's blocks (table indices); f16 ``d``
Q2_K      ``q2_k[out, in:g256,f16]``          the file's blocks; f16 ``d`` and ``dmin``
Q3_K      ``q3_k[out, in:g256,f16]``          the file's blocks; f16 ``d``
Q4_K      ``q4_k[out, in:g256,f16]``          the file's blocks; f16 ``d`` and ``dmin``
Q5_K      ``q5_k[out, in:g256,f16]``          the file's blocks; f16 ``d`` and ``dmin``
Q6_K      ``q6_k[out, in:g256,f16]``          the file's blocks; f16 ``d``
IQ4_XS    ``iq4_xs[out, in:g256,f16]``        the file's blocks; f16 ``d``
========  ==================================  ===========================================

The block formats (:data:`hxmlir.formats.BLOCK_FORMATS`) hold each block as the file has
it: its f16 ``d`` (and ``dmin``) as the scale (and offset) components, its other bytes (the
sub-block factors, the values' bit planes) unchanged as ``ui16`` words
(:func:`block_parts`: a slice of the file's bytes, no decoding), so every supported type
takes the file's bytes on the device, no more (:func:`hx_bytes`, ``hxmlir inspect``).
``hx.dequantize`` of them equals ``gguf.quants.dequantize`` of the same bytes bit for bit
(:mod:`hxmlir.block_decode`).

Every block of 32 elements along ``in`` (GGUF's ``ne[0]``, the rows' contiguous axis) of
Q4_0, Q4_1 and Q8_0 is one group, and the scale (and offset) bytes stay the file's f16
(18, 20, 34 bytes per 32 values).

Nibbles. In a GGUF Q4_0/Q4_1 block, byte ``j`` of ``qs`` (``j < 16``) holds element
``j`` in its low nibble and element ``j + 16`` in its high nibble (llama.cpp's
``dequantize_row_q4_0``). hxmlir's int4 layouts (``int4_pairs_v1``, ``uint4_pairs_v1``,
:mod:`hxmlir.formats`) hold elements ``2i`` (low) and ``2i + 1`` (high) in byte ``i``.
For these the loader takes each block's 32 nibbles apart in element order and packs them again in
pairs (``uint8`` NumPy work on a copy of the values' bytes, twice their size at most for a
moment; never f32). Q4_0's ``q - 8`` as a 4-bit two's-complement nibble is ``q ^ 8``.

Other types (Q8_K, IQ1/IQ2/IQ3 grid codebooks, TQ*, MXFP4, ...) are a
:class:`GGUFError` naming the tensor, its type and the supported ones, unless the caller
asks for ``dequantize_unsupported=True``: then they are f32 arrays
(``gguf.quants.dequantize``), which is not exact storage and says so nowhere else.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hxmlir import formats

BLOCK = 32
"""Elements per block of GGUF's legacy types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)."""

DENSE = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
         "I16": np.int16, "I32": np.int32, "I64": np.int64}
"""The GGUF types held as NumPy arrays of their own dtype (BF16 too, as ml_dtypes')."""

SUPPORTED = ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
             "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
"""The GGUF tensor types :func:`load` holds exactly."""


class GGUFError(ValueError):
  """A GGUF file or tensor :func:`load` cannot hold: names the file, the tensor and its type."""


@dataclass
class Checkpoint:
  """A loaded GGUF file: ``metadata`` (key -> Python value: ``general.architecture`` ->
  ``"llama"``, arrays as lists), ``tensors`` (name -> hx value or array, placed on the
  default device), ``gguf_types`` (name -> GGUF type name, ``"Q4_1"``) and
  ``file_bytes`` (name -> the tensor's bytes in the file)."""
  path: str
  metadata: dict[str, Any]
  tensors: dict[str, Any]
  gguf_types: dict[str, str] = field(default_factory=dict)
  file_bytes: dict[str, int] = field(default_factory=dict)

  def __iter__(self) -> Iterator[str]:
    return iter(self.tensors)

  def __getitem__(self, name: str):
    return self.tensors[name]


@dataclass(frozen=True)
class Header:
  """A GGUF file's header, read once (:func:`read_header`): ``path``, ``reader`` (the
  ``gguf`` package's ``GGUFReader``, memory-mapping the file: its tensors are not read
  until :func:`load` places them) and ``metadata`` (:func:`metadata`: key -> Python
  value). :func:`load` takes one instead of a path, so a caller that needs the metadata
  first (:meth:`hxmlir.models.llama.Llama.from_gguf`) reads the header once."""
  path: str
  reader: Any
  metadata: dict[str, Any]


def read_header(path: str | os.PathLike) -> Header:
  """The :class:`Header` of the GGUF file ``path``: its header and metadata, read once; no
  tensor is placed. The file is checked as a whole first (:func:`hxmlir.gguf_check.check_file`:
  the header, every metadata value's type and UTF-8, the tensor table against itself and
  the file). Raises :class:`GGUFError` naming the file and, one line per problem, the key or
  tensor and what was expected (a file without the GGUF magic, a truncated or malformed
  header, a data section shorter than a tensor needs, overlapping tensors, ...);
  ``ImportError`` with the install command when the ``gguf`` package is missing."""
  reader = _reader(path)
  try:
    meta = metadata(reader)
  except Exception as e:  # the gguf package's own errors, on a file the check passed
    raise GGUFError(f"{os.fspath(path)}: not a readable GGUF file: its metadata cannot be "
                    f"read ({type(e).__name__}: {e})") from None
  return Header(os.fspath(path), reader, meta)


def _gguf():
  """The ``gguf`` package; ``ImportError`` with the install command when it is missing."""
  try:
    import gguf
  except ImportError:
    raise ImportError("hxmlir.gguf needs the gguf package: pip install 'hxmlir[gguf]' "
                      "(or pip install gguf)") from None
  return gguf


def _reader(path):
  """The ``GGUFReader`` of ``path`` (:func:`read_header`'s errors)."""
  gguf = _gguf()
  p = os.fspath(path)
  try:
    with open(p, "rb") as f:
      head = f.read(len(MAGIC))
  except OSError as e:
    raise GGUFError(f"{p}: not a readable GGUF file: {e}") from None
  if head != MAGIC:
    raise GGUFError(f"{p}: not a GGUF file: it starts with {head!r}, not the GGUF magic "
                    f"{MAGIC!r}")

  from hxmlir import gguf_check
  gguf_check.check_file(p)  # the whole header and tensor table, before the reader
  try:
    return gguf.GGUFReader(p, "r")
  except Exception as e:  # the gguf package's own errors, on a file the check passed
    raise GGUFError(f"{p}: not a readable GGUF file: the gguf package's reader failed "
                    f"({type(e).__name__}: {e})") from None


def metadata(reader) -> dict[str, Any]:
  """The key/value metadata of a ``GGUFReader`` as Python values (strings, numbers,
  lists); the header's ``GGUF.*`` entries are left out."""
  return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
  """The key/value metadata of the GGUF file ``path`` (:func:`metadata`), reading its header
  only (no tensor is placed). Raises :func:`load`'s errors for a file that is not GGUF."""
  return read_header(path).metadata


def load(path: str | os.PathLike | Header, *, dequantize_unsupported: bool = False,
         names: Collection[str] | None = None) -> Checkpoint:
  """Load the GGUF file ``path`` (module docstring: the types and how each is held), or the
  file of a :class:`Header` already read (:func:`read_header`: its header is not read again).

  ``names``: only these tensors (any container of names; default all).
  ``dequantize_unsupported=True``: tensors of a type outside :data:`SUPPORTED` load as
  f32 arrays (``gguf.quants.dequantize``) instead of raising. Raises :class:`GGUFError`
  for a file that is not GGUF, a tensor of an unsupported type (naming the tensor, the
  type and :data:`SUPPORTED`), or a tensor whose bytes do not fit its shape;
  ``ImportError`` with the install command when the ``gguf`` package is missing.
  """
  import jax
  header = path if isinstance(path, Header) else read_header(path)
  out = Checkpoint(header.path, header.metadata, {})
  for t in header.reader.tensors:
    if names is not None and t.name not in names:
      continue
    kind = t.tensor_type.name
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # NumPy order: [out, in]
    out.gguf_types[t.name] = kind
    out.file_bytes[t.name] = int(t.n_bytes)
    if kind in SUPPORTED:
      parts = tensor_parts(t.data, kind, shape, where=f"{out.path}: tensor {t.name!r}")
    elif dequantize_unsupported:
      try:
        parts = np.asarray(_gguf().quants.dequantize(np.asarray(t.data), t.tensor_type),
                           np.float32).reshape(shape)
      except Exception as e:  # gguf.quants: NotImplementedError for types it cannot read
        raise GGUFError(f"{out.path}: tensor {t.name!r} has GGUF type {kind}, which hxmlir "
                        f"cannot hold exactly and gguf.quants cannot dequantize "
                        f"({type(e).__name__}: {e})") from None
    else:
      raise GGUFError(f"{out.path}: tensor {t.name!r} has GGUF type {kind}, which hxmlir "
                      f"cannot hold exactly; supported: {', '.join(SUPPORTED)} (load(..., "
                      "dequantize_unsupported=True) gives f32 arrays for the others)")
    out.tensors[t.name] = _place(jax, parts)
  return out


def _place(jax, parts):
  """``parts`` (an array, or ``(values, scale[, offset])``) on the default device, once;
  a 64-bit array (I64, F64) stays a NumPy array unless ``jax_enable_x64`` is on (JAX
  would narrow it to 32 bits)."""
  from hxmlir.types.qarray import QArray
  if isinstance(parts, tuple):
    return QArray(*(jax.device_put(p) for p in parts))
  if parts.dtype.itemsize == 8 and not jax.config.jax_enable_x64:
    return parts
  return jax.device_put(parts)


def hx_type_name(kind: str, shape: tuple[int, ...]) -> str:
  """The hx type a tensor of GGUF type ``kind`` and NumPy ``shape`` loads as
  (``u4o[576,1536:g32,f16]``), or ``"unsupported"``."""
  dims = ",".join(map(str, shape))
  if kind == "BF16":
    return f"bf16[{dims}]"
  if kind in DENSE:
    return f"{kind.lower()}[{dims}]"
  fmt = _FORMATS.get(kind)
  return formats.type_name(formats.FORMATS[fmt], dims, _GROUPS.get(kind, BLOCK)) if fmt \
      else "unsupported"


_FORMATS = {"Q8_0": "int8_f16", "Q4_0": "int4_f16", "Q4_1": "uint4_f16",
            **{f.gguf: f.name for f in formats.BLOCK_FORMATS}}
_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "IQ4_NL": 18,
                "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q2_K": 84, "Q3_K": 110, "IQ4_XS": 136}
_BLOCK_SIZES = {f.gguf: f.block for f in formats.BLOCK_FORMATS}  # elements per block (else BLOCK)
_GROUPS = {f.gguf: f.block for f in formats.BLOCK_FORMATS}  # elements per group (else BLOCK)
_HEADERS = {"Q5_0": (0, None, 2), "Q5_1": (0, 2, 4), "IQ4_NL": (0, None, 2), "Q4_K": (0, 2, 4),
            "Q5_K": (0, 2, 4), "Q6_K": (208, None, 0), "Q2_K": (80, 82, 0), "Q3_K": (108, None, 0),
            "IQ4_XS": (0, None, 2)}
"""Where a block format's file block (``ggml-common.h``'s ``block_*``) keeps its f16 ``d``,
its f16 ``dmin`` (``m`` for Q5_1; ``None``: none) and the rest, the format's stored fields
(:data:`hxmlir.formats.FORMATS`), as byte offsets in the block."""


def tensor_parts(data: np.ndarray, kind: str, shape: tuple[int, ...], where: str = "tensor"):
  """The NumPy components of one GGUF tensor: its bytes ``data`` (what ``GGUFReader`` maps:
  ``uint8[rows, row bytes]`` for block types), GGUF type name ``kind`` and NumPy ``shape``
  -> an array (:data:`DENSE` types, BF16) or ``(values, f16 scale[, f16 offset])`` of the format in
  :data:`_FORMATS` with groups of 32 along the last axis. ``where`` names the tensor in
  errors (:class:`GGUFError`: a type outside :data:`SUPPORTED`, or bytes that do not hold
  ``shape``)."""
  if kind not in SUPPORTED:
    raise GGUFError(f"{where}: GGUF type {kind!r} is not one hxmlir holds; supported: "
                    f"{', '.join(SUPPORTED)}")
  if kind in DENSE:
    return np.asarray(data).view(DENSE[kind]).reshape(shape)
  if kind == "BF16":
    import ml_dtypes
    return np.asarray(data).view(np.uint16).view(ml_dtypes.bfloat16).reshape(shape)
  n = shape[-1]
  size, elems = _BLOCK_BYTES[kind], _BLOCK_SIZES.get(kind, BLOCK)
  if n % elems or np.asarray(data).size != int(np.prod(shape[:-1], dtype=np.int64)) * (
      n // elems) * size:
    raise GGUFError(f"{where}: {kind} bytes {list(np.shape(data))} do not hold shape "
                    f"{list(shape)} in blocks of {elems} ({size} bytes each)")
  raw = np.asarray(data).reshape(*shape[:-1], n // elems, size)
  if kind in _HEADERS:
    return block_parts(raw, kind)
  d = raw[..., :2].copy().view(np.float16)[..., 0]  # [*lead, n / 32] f16: the file's bytes
  if kind == "Q8_0":
    return raw[..., 2:].copy().view(np.int8).reshape(shape), d
  if kind == "Q4_1":
    m = raw[..., 2:4].copy().view(np.float16)[..., 0]
    return _pairs(_block_nibbles(raw[..., 4:])).reshape(*shape[:-1], n // 2), d, m
  if kind == "Q4_0":  # q - 8 as a two's-complement nibble: q ^ 8
    return _pairs(_block_nibbles(raw[..., 2:]) ^ np.uint8(8)).reshape(*shape[:-1], n // 2), d
  raise AssertionError(kind)  # every other block type is in _HEADERS


def block_parts(raw: np.ndarray, kind: str):
  """A block format's components from its GGUF blocks ``raw: uint8[*lead, nb, bytes]``:
  ``(ui16[*lead, nb, words] stored fields, f16 d[*lead, nb][, f16 dmin])``, the file's
  bytes (:data:`_HEADERS` says where each is; a copy of the fields, no decoding)."""
  d_at, m_at, at = _HEADERS[kind]
  f = formats.FORMATS[_FORMATS[kind]]
  values = np.ascontiguousarray(raw[..., at:at + f.block_bytes]).view("<u2")
  d = np.ascontiguousarray(raw[..., d_at:d_at + 2]).view("<f2")[..., 0]
  if m_at is None:
    return values, d
  return values, d, np.ascontiguousarray(raw[..., m_at:m_at + 2]).view("<f2")[..., 0]


def _block_nibbles(qs: np.ndarray) -> np.ndarray:
  """``uint8[..., 16]`` GGUF block bytes -> ``uint8[..., 32]`` nibbles in element order
  (element ``j`` low nibble of byte ``j``, ``j + 16`` its high nibble)."""
  return np.concatenate([qs & np.uint8(0xF), qs >> np.uint8(4)], axis=-1)


def _pairs(v: np.ndarray) -> np.ndarray:
  """``uint8[..., 2m]`` nibbles -> ``uint8[..., m]``: element ``2i`` low, ``2i + 1`` high
  (hxmlir's ``int4_pairs_v1`` / ``uint4_pairs_v1``)."""
  return v[..., 0::2] | (v[..., 1::2] << np.uint8(4))


def device_bytes(value) -> int:
  """Bytes of ``value``'s device buffers (an array or a quantized value's components)."""
  from hxmlir.types.qarray import QArray
  comps = value.components if isinstance(value, QArray) else (value,)
  return int(sum(c.nbytes for c in comps))


# --- hxmlir inspect FILE.gguf ---------------------------------------------------------

MAGIC = b"GGUF"


def is_gguf(path: str | os.PathLike) -> bool:
  """Whether the file at ``path`` starts with GGUF's magic bytes."""
  try:
    with open(path, "rb") as f:
      return f.read(4) == MAGIC
  except OSError:
    return False


def hx_bytes(kind: str, shape: tuple[int, ...]) -> int | None:
  """Device bytes of a tensor of GGUF type ``kind`` and NumPy ``shape`` once loaded
  (values, scales and offsets), or ``None`` for an unsupported type."""
  count = int(np.prod(shape, dtype=np.int64))
  if kind == "BF16":
    return count * 2
  if kind in DENSE:
    return count * np.dtype(DENSE[kind]).itemsize
  if kind not in _FORMATS:
    return None
  f = formats.FORMATS[_FORMATS[kind]]
  groups = count // _GROUPS.get(kind, BLOCK)
  if f.block:
    return groups * (f.block_bytes + f.scale_dtype.itemsize * (2 if f.offset else 1))
  return (count // f.pack * f.storage_dtype.itemsize
          + groups * f.scale_dtype.itemsize * (2 if f.offset else 1))


def inspect(path: str | os.PathLike | Header) -> dict:
  """What :func:`load` would make of ``path`` (or a :class:`Header` already read), reading
  only its header and metadata:
  ``{"path", "metadata": {key: value (long lists shortened)}, "tensors": [{"name",
  "gguf_type", "shape", "hx_type", "file_bytes", "hx_bytes"}], "file_bytes", "hx_bytes"}``
  (``hx_bytes`` totals the supported tensors; unsupported ones say ``"unsupported"``).
  Raises :class:`GGUFError` for a file that is not GGUF."""
  header = path if isinstance(path, Header) else read_header(path)
  tensors = []
  for t in header.reader.tensors:
    kind = t.tensor_type.name
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    tensors.append({"name": t.name, "gguf_type": kind, "shape": list(shape),
                    "hx_type": hx_type_name(kind, shape), "file_bytes": int(t.n_bytes),
                    "hx_bytes": hx_bytes(kind, shape)})
  meta = {k: (v if not isinstance(v, list) or len(v) <= 8 else [*v[:8], f"... ({len(v)})"])
          for k, v in header.metadata.items()}
  return {"path": header.path, "metadata": meta, "tensors": tensors,
          "file_bytes": sum(t["file_bytes"] for t in tensors),
          "hx_bytes": sum(t["hx_bytes"] or 0 for t in tensors)}


def format_inspect(info: dict) -> str:
  """:func:`inspect`'s report as text: one line per tensor, one per GGUF type (its tensors,
  file bytes and hx bytes), then the totals."""
  rows = [(t["name"], t["gguf_type"], t["hx_type"], f"{t['file_bytes']:,}",
           "-" if t["hx_bytes"] is None else f"{t['hx_bytes']:,}") for t in info["tensors"]]
  head = ("tensor", "GGUF type", "hx type", "file bytes", "hx bytes")
  widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
  def line(r):
    return "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                     for i, (c, w) in enumerate(zip(r, widths))).rstrip()
  unsupported = sum(t["hx_bytes"] is None for t in info["tensors"])
  arch = info["metadata"].get("general.architecture", "?")
  def count(n, what):
    return f"{n} {what}" + ("" if n == 1 else "s")
  by_type: dict = {}
  for t in info["tensors"]:
    n, fb, hb = by_type.get(t["gguf_type"], (0, 0, 0))
    by_type[t["gguf_type"]] = (n + 1, fb + t["file_bytes"], hb + (t["hx_bytes"] or 0)
                               if t["hx_bytes"] is not None and hb is not None else None)
  types = [f"by type {kind}: {count(n, 'tensor')}, {fb:,} file bytes, "
           + ("unsupported" if hb is None else f"{hb:,} hx bytes ({hb / max(fb, 1):.3f}x)")
           for kind, (n, fb, hb) in by_type.items()]
  out = [f"{info['path']}: GGUF, architecture {arch}, {count(len(rows), 'tensor')}", line(head),
         *map(line, rows), *types,
         f"total: {info['file_bytes']:,} file bytes, {info['hx_bytes']:,} hx bytes"
         + (f" ({count(unsupported, 'unsupported tensor')} not counted)" if unsupported else "")]
  return "\n".join(out) + "\n"
