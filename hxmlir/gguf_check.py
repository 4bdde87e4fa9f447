"""A GGUF file checked as a whole before its reader believes it.

:func:`check_file` walks a GGUF file's header (GGUF versions 2 and 3, little-endian; the
format as llama.cpp's ``docs/gguf.md`` and the ``gguf`` package's ``GGUFWriter`` write it)
with every length and count bounded by the bytes the file has, and checks:

- the header: the magic, a version the reader reads, counts that fit in the file;
- every metadata entry: its key valid UTF-8 and unique, its value type known (arrays of
  scalars or strings; hxmlir reads no arrays of arrays), every string valid UTF-8, booleans
  0 or 1, ``general.alignment`` a ``uint32`` power of two, and the keys the loader and the
  decoder read (:data:`KEY_TYPES`: ``general.architecture``, ``<arch>.block_count``,
  ``tokenizer.ggml.tokens``, ...) of the kind they need (a string, an integer, a finite
  number, an array of strings, ...); the BOS and EOS token ids inside the vocabulary (other
  special ids, which hxmlir does not read, are left as they are: llama.cpp ignores a bad one
  with a warning), scores and token types one per token;
- the tensor table against itself and the file: names valid UTF-8 and unique, at most
  :data:`MAX_DIMS` dimensions, a known type id, a first dimension that is a whole number
  of its type's blocks and none 0, each tensor's bytes (its type's block bytes times its shape:
  ``gguf.GGML_QUANT_SIZES``) at an offset that is a multiple of the alignment, inside the
  data section and not overlapping another tensor's; the padding before the data section
  all zero bytes and no bytes after the last tensor's padded end (GGUF writers, llama.cpp's
  and the ``gguf`` package's, write both so: a header whose tensor count leaves tensors out
  would otherwise read its last records as padding and every tensor's bytes from the wrong
  offset).

Problems come back as one :class:`hxmlir.gguf.GGUFError` whose message has one line per
problem (at most :data:`MAX_LINES`), each naming the file, the key or tensor, and what was
expected. A header too damaged to walk on is one line: where the walk stopped. The
metadata's ranges for one architecture (counts of at least 1, head sizes that divide) are
the decoder's to check (:mod:`hxmlir.models.llama`); this module checks what holds for
every GGUF file.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass

MAX_DIMS = 4
"""Dimensions a GGUF tensor may have (ggml's ``GGML_MAX_DIMS``)."""

MAX_LINES = 20
"""Problems listed in one error; the rest are counted."""

VERSIONS = (2, 3)
"""The GGUF versions read (the ``gguf`` package's reader reads these)."""

DEFAULT_ALIGNMENT = 32
"""The data section's alignment when ``general.alignment`` is absent (GGUF's default)."""

# GGUF metadata value types: id -> (name, struct format or None, bytes)
_SCALARS = {0: ("uint8", "B", 1), 1: ("int8", "b", 1), 2: ("uint16", "H", 2),
            3: ("int16", "h", 2), 4: ("uint32", "I", 4), 5: ("int32", "i", 4),
            6: ("float32", "f", 4), 7: ("bool", "B", 1), 10: ("uint64", "Q", 8),
            11: ("int64", "q", 8), 12: ("float64", "d", 8)}
_STRING, _ARRAY = 8, 9
_INTS = {0, 1, 2, 3, 4, 5, 10, 11}
_FLOATS = {6, 12}

# what a key's value must be: a kind -> (test on (type, item type), words for the message)
_KINDS = {
    "string": (lambda t, i: t == _STRING, "a string"),
    "int": (lambda t, i: t in _INTS, "an integer"),
    "uint32": (lambda t, i: t == 4, "a uint32"),
    "number": (lambda t, i: t in _INTS | _FLOATS, "a number"),
    "bool": (lambda t, i: t == 7, "a bool"),
    "ints": (lambda t, i: t in _INTS or (t == _ARRAY and i in _INTS),
             "an integer or an array of integers"),
    "strings": (lambda t, i: t == _ARRAY and i == _STRING, "an array of strings"),
    "numbers": (lambda t, i: t == _ARRAY and i in _INTS | _FLOATS, "an array of numbers"),
    "int_array": (lambda t, i: t == _ARRAY and i in _INTS, "an array of integers"),
}

KEY_TYPES = {
    "general.architecture": "string", "general.name": "string", "general.alignment": "uint32",
    "general.file_type": "int", "general.quantization_version": "int",
    "tokenizer.ggml.model": "string", "tokenizer.ggml.pre": "string",
    "tokenizer.ggml.tokens": "strings", "tokenizer.ggml.merges": "strings",
    "tokenizer.ggml.scores": "numbers", "tokenizer.ggml.token_type": "int_array",
    "tokenizer.ggml.add_bos_token": "bool", "tokenizer.ggml.add_eos_token": "bool",
    "tokenizer.chat_template": "string",
    **{f"tokenizer.ggml.{t}_token_id": "int"
       for t in ("bos", "eos", "unknown", "padding", "separator", "eot", "eom")},
    # "<arch>." + key, for the file's own general.architecture
    "<arch>.context_length": "int", "<arch>.embedding_length": "int",
    "<arch>.block_count": "int", "<arch>.feed_forward_length": "ints",
    "<arch>.vocab_size": "int", "<arch>.expert_count": "int", "<arch>.expert_used_count": "int",
    "<arch>.attention.head_count": "ints", "<arch>.attention.head_count_kv": "ints",
    "<arch>.attention.key_length": "int", "<arch>.attention.value_length": "int",
    "<arch>.attention.sliding_window": "int", "<arch>.rope.dimension_count": "int",
    "<arch>.rope.freq_base": "number", "<arch>.rope.scaling.factor": "number",
    "<arch>.attention.layer_norm_rms_epsilon": "number",
    "<arch>.attention.layer_norm_epsilon": "number",
    "<arch>.attn_logit_softcapping": "number", "<arch>.final_logit_softcapping": "number",
}
"""The kind of value each key the loader and decoder read must have (``<arch>``: the file's
``general.architecture``): ``string``, ``int`` (any integer type), ``uint32``, ``number``
(an integer or a finite float), ``bool``, ``ints`` (an integer or an array of them: per-layer
values), ``strings``, ``numbers``, ``int_array``."""


def _error():
  from hxmlir.gguf import GGUFError
  return GGUFError


class _Stop(Exception):
  """The header cannot be walked further: ``str(self)`` says where and why."""


@dataclass
class _Tensor:
  index: int
  name: str
  dims: tuple[int, ...]  # GGUF order: ne[0] (the rows' contiguous axis) first
  type_id: int
  offset: int  # in the data section


class _Walk:
  """Bounded reads from the file's bytes ``buf`` (``endian``: struct's byte order)."""

  def __init__(self, buf, endian: str = "<"):
    self.buf, self.at, self.endian = buf, 0, endian

  def need(self, n: int, what: str) -> int:
    """Takes ``n`` bytes for ``what``; their offset."""
    at = self.at
    if n > len(self.buf) - at:
      raise _Stop(f"truncated or malformed header: {what} needs {n:,} bytes at offset "
                  f"{at:,}, the file has {max(len(self.buf) - at, 0):,} from there")
    self.at += n
    return at

  def scalar(self, fmt: str, size: int, what: str):
    return struct.unpack_from(self.endian + fmt, self.buf, self.need(size, what))[0]

  def raw_string(self, what: str) -> bytes:
    n = self.scalar("Q", 8, f"{what}'s length")
    at = self.need(n, f"{what} ({n:,} bytes)")
    return bytes(self.buf[at:at + n])

  def string(self, what: str) -> str:
    raw = self.raw_string(what)
    try:
      return raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise _Stop(f"{what} is not valid UTF-8 (byte {raw[e.start]:#04x} at {e.start}): "
                  f"expected a UTF-8 string") from None

  def strings(self, n: int, what: str) -> None:
    """Walks ``n`` strings (an array's items), checking each as :meth:`_Walk.string` does; the
    messages are built only for a bad item (a vocabulary has ~10^5 of them)."""
    buf, size, at, endian = self.buf, len(self.buf), self.at, self.endian + "Q"
    for j in range(n):
      if at + 8 <= size:
        (k,) = struct.unpack_from(endian, buf, at)
        if k <= size - at - 8:
          try:
            bytes(buf[at + 8:at + 8 + k]).decode("utf-8")
            at += 8 + k
            continue
          except UnicodeDecodeError:
            pass
      self.at = at
      self.string(f"{what}[{j}] (string)")  # raises the item's error
    self.at = at


def check_file(path: str | os.PathLike) -> None:
  """Checks the GGUF file ``path`` as the module docstring lists; returns ``None`` when it
  is sound. Raises :class:`hxmlir.gguf.GGUFError` naming the file and, per line, the key
  or tensor and what was expected; ``FileNotFoundError`` and other ``OSError`` as
  ``open`` raises them."""
  p = os.fspath(path)
  with open(p, "rb") as f:
    size = os.fstat(f.fileno()).st_size
    if size == 0:
      raise _error()(f"{p}: not a readable GGUF file: the file is empty")
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
      try:
        problems = _check(buf)
      except _Stop as e:
        raise _error()(f"{p}: not a readable GGUF file: {e}") from None
  if problems:
    lines = [f"{p}: {x}" for x in problems[:MAX_LINES]]
    if len(problems) > MAX_LINES:
      lines.append(f"{p}: ... and {len(problems) - MAX_LINES} more problems")
    raise _error()("\n".join(lines))


def _padded(n: int, align: int) -> int:
  """``n`` bytes rounded up to a multiple of ``align``: where GGUF's padding ends."""
  return -(-n // align) * align


def _check(buf) -> list[str]:
  """The problems of the GGUF file in ``buf``, one line each (raises :class:`_Stop` where
  the header cannot be walked)."""
  w = _Walk(buf)
  if bytes(buf[:4]) != b"GGUF":
    raise _Stop(f"it starts with {bytes(buf[:4])!r}, not the GGUF magic b'GGUF'")
  w.need(4, "the magic")
  version = w.scalar("I", 4, "the GGUF version")
  if version & 0xFFFF == 0 and version:
    raise _Stop(f"GGUF version {version} read little-endian, "
                f"{int.from_bytes(version.to_bytes(4, 'little'), 'big')} big-endian: hxmlir "
                "reads little-endian GGUF files only")
  if version not in VERSIONS:
    raise _Stop(f"GGUF version {version}: expected one of {', '.join(map(str, VERSIONS))}")
  n_tensors = w.scalar("Q", 8, "the tensor count")
  n_kv = w.scalar("Q", 8, "the metadata count")
  left = len(buf) - w.at
  # each entry takes at least: key length 8 + value type 4 + 1; tensor: 8 + 4 + 4 + 8
  if n_kv * 13 > left:
    raise _Stop(f"truncated or malformed header: the header says {n_kv:,} metadata entries; the file's {left:,} bytes after "
                f"it hold at most {left // 13:,}")
  if n_tensors * 24 > left:
    raise _Stop(f"truncated or malformed header: the header says {n_tensors:,} tensors; the file's {left:,} bytes after it "
                f"hold at most {left // 24:,}")
  problems: list[str] = []
  meta: dict[str, tuple[int, int | None, object]] = {}  # key -> (type, item type, value)
  for i in range(n_kv):
    key = w.string(f"metadata entry {i}'s key")
    if key in meta or key.startswith("GGUF."):
      raise _Stop(f"metadata key {key!r} appears twice" if key in meta else
                  f"metadata key {key!r}: the GGUF.* names are the header's own")
    meta[key] = _value(w, f"metadata key {key!r}", problems)
  problems += _check_keys(meta)
  align = DEFAULT_ALIGNMENT
  if "general.alignment" in meta and meta["general.alignment"][0] == 4:
    align = meta["general.alignment"][2]
    if align == 0 or align & (align - 1):
      raise _Stop(f"metadata key 'general.alignment' is {align}: expected a power of two")
  tensors = [_tensor_info(w, i) for i in range(n_tensors)]
  start = _padded(w.at, align)  # the data section: after the header, aligned
  if any(bytes(buf[w.at:min(start, len(buf))])):
    problems.append(f"the {start - w.at} bytes between the tensor table's end (offset "
                    f"{w.at:,}) and the data section (offset {start:,}) are not all zero: "
                    f"expected GGUF's zero padding (does the header's count of {n_tensors:,} "
                    "tensors leave some out?)")
  problems += _check_tensors(tensors, start, len(buf), align)
  return problems


def _value(w: _Walk, what: str, problems: list[str]):
  """Reads one metadata value: ``(type, item type or None, value)`` (an array's value is
  its length, a string's its text)."""
  t = w.scalar("I", 4, f"{what}'s value type")
  if t in _SCALARS:
    name, fmt, size = _SCALARS[t]
    v = w.scalar(fmt, size, f"{what} ({name})")
    if t == 7 and v > 1:
      problems.append(f"{what} is a bool of byte value {v}: expected 0 or 1")
    return t, None, v
  if t == _STRING:
    return t, None, w.string(f"{what} (string)")
  if t != _ARRAY:
    raise _Stop(f"{what} has value type {t}: expected a GGUF value type (0-12)")
  it = w.scalar("I", 4, f"{what}'s array item type")
  n = w.scalar("Q", 8, f"{what}'s array length")
  if it in _SCALARS:
    name, _, size = _SCALARS[it]
    at = w.need(n * size, f"{what} (array of {n:,} {name})")
    if it == 7 and n:
      import numpy as np
      bad = np.flatnonzero(np.frombuffer(w.buf, np.uint8, n, at) > 1)
      if bad.size:
        problems.append(f"{what}[{bad[0]}] is a bool of byte value "
                        f"{w.buf[at + int(bad[0])]}: expected 0 or 1")
    return t, it, n
  if it == _STRING:
    if n * 8 > len(w.buf) - w.at:
      raise _Stop(f"{what} is an array of {n:,} strings: the file's {len(w.buf) - w.at:,} "
                  "bytes from there hold fewer")
    w.strings(n, what)
    return t, it, n
  if it == _ARRAY:
    raise _Stop(f"{what} is an array of arrays: hxmlir reads arrays of numbers or strings "
                "only")
  raise _Stop(f"{what} is an array of value type {it}: expected a GGUF value type (0-12)")


def _check_keys(meta) -> list[str]:
  """Problems with the kinds of the keys in :data:`KEY_TYPES` and the token ids."""
  problems = []
  arch = meta.get("general.architecture", (None, None, None))
  arch = arch[2] if arch[0] == _STRING else None
  for pattern, kind in KEY_TYPES.items():
    if "<arch>" in pattern and arch is None:
      continue
    key = pattern.replace("<arch>", arch) if "<arch>" in pattern else pattern
    if key not in meta:
      continue
    t, it, v = meta[key]
    test, words = _KINDS[kind]
    if not test(t, it):
      problems.append(f"metadata key {key!r} is {_type_words(t, it)}: expected {words}")
    elif kind == "number" and not math.isfinite(v):
      problems.append(f"metadata key {key!r} is {v}: expected a finite number")
  tokens = meta.get("tokenizer.ggml.tokens")
  if tokens and tokens[:2] == (_ARRAY, _STRING):
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):  # those read
      if key not in meta:
        continue
      t, _, v = meta[key]
      if t in _INTS and not 0 <= v < tokens[2]:
        problems.append(f"metadata key {key!r} is {v}: expected a token id in "
                        f"[0, {tokens[2]}) (tokenizer.ggml.tokens has {tokens[2]})")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
      if key in meta and meta[key][0] == _ARRAY and meta[key][2] != tokens[2]:
        problems.append(f"metadata key {key!r} has {meta[key][2]} entries: expected one per "
                        f"token ({tokens[2]}, tokenizer.ggml.tokens)")
  return problems


def _type_words(t: int, it: int | None) -> str:
  if t == _STRING:
    return "a string"
  if t == _ARRAY:
    return f"an array of {'string' if it == _STRING else _SCALARS[it][0]}"
  return f"a {_SCALARS[t][0]}"


def _tensor_info(w: _Walk, i: int) -> _Tensor:
  name = w.string(f"tensor {i}'s name")
  what = f"tensor {name!r}"
  n_dims = w.scalar("I", 4, f"{what}'s dimension count")
  if n_dims > MAX_DIMS:
    raise _Stop(f"{what} has {n_dims} dimensions: expected at most {MAX_DIMS}")
  dims = tuple(w.scalar("Q", 8, f"{what}'s dimensions") for _ in range(n_dims))
  type_id = w.scalar("I", 4, f"{what}'s type")
  offset = w.scalar("Q", 8, f"{what}'s data offset")
  return _Tensor(i, name, dims, type_id, offset)


def _check_tensors(tensors: list[_Tensor], start: int, size: int, align: int) -> list[str]:
  """Problems of the tensor table: names, types, shapes, each tensor's byte range."""
  import gguf
  problems = []
  seen: set[str] = set()
  spans = []  # (offset, end, name) of the tensors whose range is known
  data = max(size - start, 0)
  for t in tensors:
    what = f"tensor {t.name!r}"
    if t.name in seen:
      problems.append(f"{what} appears twice in the tensor table: expected unique names")
      continue
    seen.add(t.name)
    try:
      kind = gguf.GGMLQuantizationType(t.type_id)
      block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
      known = ", ".join(k.name for k in gguf.GGMLQuantizationType
                        if k in gguf.GGML_QUANT_SIZES)
      problems.append(f"{what} has type id {t.type_id}, which is no GGUF tensor type: "
                      f"expected one of {known}")
      continue
    shape = f"{kind.name}[{', '.join(map(str, reversed(t.dims)))}]"  # NumPy order
    if 0 in t.dims:
      problems.append(f"{what} ({shape}) has no elements: expected every dimension to be at "
                      "least 1")
      continue
    if t.dims and t.dims[0] % block:
      problems.append(f"{what} ({shape}): its first GGUF dimension {t.dims[0]} is not a "
                      f"multiple of {kind.name}'s block of {block} elements")
      continue
    count = math.prod(t.dims)
    nbytes = count // block * block_bytes
    if t.offset % align:
      problems.append(f"{what} ({shape}) starts at data offset {t.offset:,}: expected a "
                      f"multiple of the alignment {align}")
    if t.offset + nbytes > data:
      problems.append(f"not a readable GGUF file: truncated data section: tensor {t.name!r} "
                      f"({kind.name}) needs {nbytes} bytes at offset {start + t.offset}, "
                      f"{max(size - start - t.offset, 0)} available")
      continue
    if nbytes:
      spans.append((t.offset, t.offset + nbytes, t.name, shape))
  spans.sort()
  end = max((a1 for _, a1, _, _ in spans), default=0)
  padded = _padded(end, align)
  if spans and not problems and data > padded:
    extra = data - padded
    problems.append(f"the file has {extra:,} byte{'s' * (extra != 1)} after its last tensor's "
                    f"data (data offset {end:,}, padded to {padded:,}): expected it to end "
                    f"there (does the header's count of {len(tensors):,} tensors leave some "
                    "out?)")
  for (a0, a1, an, ashape), (b0, _, bn, _) in zip(spans, spans[1:]):
    if a1 > b0:
      problems.append(f"tensor {an!r} ({ashape}, {a1 - a0:,} bytes from data offset "
                      f"{a0:,}) runs into tensor {bn!r} at data offset {b0:,}: expected "
                      "each tensor's bytes (its type's block bytes times its shape) to end "
                      "before the next tensor's start")
  return problems
