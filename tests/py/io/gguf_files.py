"""Small GGUF files for the GGUF reliability tests, written with ``gguf.GGUFWriter``, and a map
of where each header field lies (read back with the ``gguf`` package's own reader), so that
tests can corrupt one field on purpose."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

QUANTIZED = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # gguf.quants.quantize writes these
K_QUANTS = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}  # block bytes; random blocks


def write_small(path, seed: int = 0):
  """A GGUF file (architecture llama) with metadata of every kind the decoder reads (strings,
  integers, floats, a bool, arrays of strings, floats and integers) and one small tensor
  per type: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (``gguf.quants.quantize``), Q4_K, Q5_K, Q6_K
  (random blocks with finite scales), F32, F16, BF16, I32. Returns ``path``."""
  import gguf
  T = gguf.GGMLQuantizationType
  rs = np.random.RandomState(seed)
  w = gguf.GGUFWriter(os.fspath(path), "llama")
  w.add_string("general.name", "fuzz")
  w.add_uint32("llama.block_count", 1)
  w.add_uint32("llama.context_length", 64)
  w.add_float32("llama.rope.freq_base", 10000.0)
  w.add_bool("tokenizer.ggml.add_bos_token", True)
  w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "b\u00e9"])
  w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0, -3.0])
  w.add_array("tokenizer.ggml.token_type", [3, 3, 1, 1])
  w.add_uint32("tokenizer.ggml.bos_token_id", 0)
  w.add_string("tokenizer.chat_template", "{{ messages[0]['content'] }}")
  for kind in QUANTIZED:
    x = (rs.randn(2, 64) * 2 + 0.3).astype(np.float32)
    q = gguf.quants.quantize(x, T[kind])
    w.add_tensor(f"t.{kind}", q, raw_shape=q.shape, raw_dtype=T[kind])
  for kind, size in K_QUANTS.items():
    raw = rs.randint(0, 256, size=(2, size)).astype(np.uint8)
    for at in ((208,) if kind == "Q6_K" else (0, 2)):
      raw[:, at:at + 2] = (rs.rand(2) + 0.01).astype(np.float16)[:, None].view(np.uint8)
    w.add_tensor(f"t.{kind}", raw, raw_shape=raw.shape, raw_dtype=T[kind])
  w.add_tensor("t.F32", rs.randn(3, 8).astype(np.float32))
  w.add_tensor("t.F16", rs.randn(8).astype(np.float16))
  bf = gguf.quants.quantize(rs.randn(2, 16).astype(np.float32), T.BF16)
  w.add_tensor("t.BF16", bf, raw_shape=bf.shape, raw_dtype=T.BF16)
  w.add_tensor("t.I32", rs.randint(-9, 9, size=(5,)).astype(np.int32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


@dataclass(frozen=True)
class Field:
  """One numeric field of a GGUF header: ``offset`` and ``size`` in bytes, ``what``."""
  offset: int
  size: int
  what: str


def field_map(path) -> tuple[list[Field], int]:
  """Every numeric header field of the GGUF file ``path`` (counts, lengths, value types,
  values, tensor dimensions, types and offsets) and the data section's start, found with
  the ``gguf`` package's reader (each part is a view into the file's memory map)."""
  import gguf
  r = gguf.GGUFReader(os.fspath(path))
  base = r.data.__array_interface__["data"][0]
  out = []
  def parts(what, ps, skip=()):
    for i, p in enumerate(ps):
      if i in skip or p.dtype == np.uint8 and p.size != 1:
        continue  # string bytes: not a numeric field
      at = p.__array_interface__["data"][0] - base
      for j in range(p.size):
        out.append(Field(at + j * p.itemsize, p.itemsize, f"{what} part {i}[{j}]"))
  for name, f in r.fields.items():
    parts(f"key {name}", f.parts)
  for t in r.tensors:
    parts(f"tensor {t.name}", t.field.parts)
  return out, int(r.data_offset)


def tensor_field(path, name: str, part: int) -> int:
  """The file offset of a tensor-table entry's part (``0`` name length, ``2`` dimension count,
  ``3`` dimensions, ``4`` type id, ``5`` data offset)."""
  import gguf
  r = gguf.GGUFReader(os.fspath(path))
  base = r.data.__array_interface__["data"][0]
  t = next(t for t in r.tensors if t.name == name)
  return t.field.parts[part].__array_interface__["data"][0] - base


def key_value_offset(path, key: str) -> tuple[int, int]:
  """``(offset, length)`` of a string metadata value's bytes (or a string array's first item)."""
  import gguf
  r = gguf.GGUFReader(os.fspath(path))
  base = r.data.__array_interface__["data"][0]
  p = r.fields[key].parts[r.fields[key].data[0]]
  return p.__array_interface__["data"][0] - base, p.size
