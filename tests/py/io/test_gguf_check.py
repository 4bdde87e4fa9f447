"""hxmlir.gguf_check: a GGUF file is checked as a whole before it is believed; each problem is
one GGUFError line naming the file, the key or tensor, and what was expected.

Files are written with ``gguf.GGUFWriter`` (tests/py/io/gguf_files.py) and one field is
then patched in place, at the offset the ``gguf`` package's own reader finds it.
"""

import os
import struct

import numpy as np
import pytest
from gguf_files import key_value_offset, tensor_field, write_small

from hxmlir import gguf as hg
from hxmlir import gguf_check

gguf = pytest.importorskip("gguf", reason="pip install 'hxmlir[gguf]'")
T = gguf.GGMLQuantizationType


@pytest.fixture
def small(tmp_path):
  """``(path, bytes)`` of a sound small file, and a function writing a patched copy."""
  path = write_small(tmp_path / "small.gguf")
  data = path.read_bytes()

  def patched(at: int, new: bytes, name: str = "bad.gguf"):
    out = tmp_path / name
    out.write_bytes(data[:at] + new + data[at + len(new):])
    return out
  return path, data, patched


def test_a_sound_file_passes_and_loads(small):
  path, _, _ = small
  gguf_check.check_file(path)
  ck = hg.load(path)
  assert ck.metadata["tokenizer.ggml.tokens"] == ["<s>", "</s>", "a", "b\u00e9"]
  assert ck.gguf_types["t.Q4_1"] == "Q4_1"


def test_a_type_id_whose_bytes_run_into_the_next_tensor(small):
  # Q4_1 -> Q8_0 (20 -> 34 bytes per block): the data runs into the next tensor's
  path, _, patched = small
  bad = patched(tensor_field(path, "t.Q4_1", 4), struct.pack("<I", T.Q8_0))
  for f in (hg.load, hg.inspect, hg.read_header):
    with pytest.raises(hg.GGUFError, match=rf"^{bad}: tensor 't.Q4_1' \(Q8_0\[2, 64\], 136 "
                       r"bytes from data offset \d+\) runs into tensor 't.Q5_0' at data "
                       r"offset \d+: expected each tensor's bytes \(its type's block bytes "
                       r"times its shape\) to end before the next tensor's start$"):
      f(bad)


def test_bf16_type_on_a_quantized_tensor_is_caught(small):
  path, _, patched = small
  bad = patched(tensor_field(path, "t.Q5_1", 4), struct.pack("<I", T.BF16))
  with pytest.raises(hg.GGUFError, match=r"tensor 't.Q5_1' \(BF16\[2, 64\], 256 bytes .* "
                     r"runs into tensor 't.Q4_K'"):
    hg.load(bad)


def test_an_unknown_type_id_names_the_tensor(small):
  path, _, patched = small
  bad = patched(tensor_field(path, "t.Q4_0", 4), struct.pack("<I", 99))
  with pytest.raises(hg.GGUFError, match=rf"^{bad}: tensor 't.Q4_0' has type id 99, which is "
                     r"no GGUF tensor type: expected one of F32, F16, Q4_0, .*Q8_0, .*$"):
    hg.load(bad)


@pytest.mark.parametrize("key, index", [("general.name", None),
                                        ("tokenizer.ggml.tokens", 0),
                                        ("tokenizer.chat_template", None)])
def test_invalid_utf8_in_a_string_names_the_key(small, key, index):
  path, _, patched = small
  at, _ = key_value_offset(path, key)
  bad = patched(at, b"\xff")
  what = f"metadata key '{key}'" + (f"\\[{index}\\]" if index is not None else "")
  with pytest.raises(hg.GGUFError, match=rf"^{bad}: not a readable GGUF file: {what} "
                     r"\(string\) is not valid UTF-8 \(byte 0xff at 0\): expected a UTF-8 "
                     r"string$"):
    hg.read_header(bad)


def test_invalid_utf8_in_a_tensor_name(small):
  path, _, patched = small
  bad = patched(tensor_field(path, "t.F32", 0) + 8, b"\xc3\x28")
  with pytest.raises(hg.GGUFError, match=rf"^{bad}: not a readable GGUF file: tensor 8's name "
                     r"is not valid UTF-8 \(byte 0xc3 at 0\): expected a UTF-8 string$"):
    hg.load(bad)


def test_a_misaligned_offset_and_a_range_past_the_end(small):
  path, data, patched = small
  at = tensor_field(path, "t.F32", 5)
  (off,) = struct.unpack_from("<Q", data, at)
  bad = patched(at, struct.pack("<Q", off + 4))
  # both problems at once: the F32 tensor is misaligned and runs into the next one
  with pytest.raises(hg.GGUFError) as e:
    hg.load(bad)
  lines = str(e.value).splitlines()
  assert lines[0] == (f"{bad}: tensor 't.F32' (F32[3, 8]) starts at data offset {off + 4:,}: "
                      "expected a multiple of the alignment 32"), lines
  assert lines[1].startswith(f"{bad}: tensor 't.F32' (F32[3, 8], 96 bytes from data offset "), lines
  bad = patched(at, struct.pack("<Q", 1 << 40))
  with pytest.raises(hg.GGUFError, match=r"truncated data section: tensor 't.F32' \(F32\) "
                     r"needs 96 bytes at offset \d+, 0 available$"):
    hg.load(bad)


def test_duplicate_tensor_names(small):
  path, data, patched = small
  # rename t.F16 to t.F32 (same length)
  at = tensor_field(path, "t.F16", 0) + 8
  bad = patched(at, b"t.F32")
  with pytest.raises(hg.GGUFError, match=r"tensor 't.F32' appears twice in the tensor table: "
                     "expected unique names"):
    hg.load(bad)


def test_a_first_dimension_not_a_whole_number_of_blocks(small):
  path, _, patched = small
  bad = patched(tensor_field(path, "t.Q8_0", 3), struct.pack("<Q", 48))
  with pytest.raises(hg.GGUFError, match=r"tensor 't.Q8_0' \(Q8_0\[2, 48\]\): its first GGUF "
                     r"dimension 48 is not a multiple of Q8_0's block of 32 elements"):
    hg.load(bad)


def test_a_zero_dimension(small):
  path, _, patched = small
  bad = patched(tensor_field(path, "t.Q5_K", 3) + 8, struct.pack("<Q", 0))
  with pytest.raises(hg.GGUFError, match=rf"^{bad}: tensor 't.Q5_K' \(Q5_K\[0, 256\]\) has no "
                     "elements: expected every dimension to be at least 1$"):
    hg.load(bad)


def test_too_many_dimensions(small):
  path, _, patched = small
  bad = patched(tensor_field(path, "t.F32", 2), struct.pack("<I", 9))
  with pytest.raises(hg.GGUFError, match=r"not a readable GGUF file: tensor 't.F32' has 9 "
                     r"dimensions: expected at most 4$"):
    hg.load(bad)


def test_counts_beyond_the_file(small):
  _, _, patched = small
  bad = patched(8, struct.pack("<Q", 1 << 62))  # the tensor count
  with pytest.raises(hg.GGUFError, match=r"truncated or malformed header: the header says "
                     r"4,611,686,018,427,387,904 tensors; the file's [\d,]+ bytes after it "
                     r"hold at most [\d,]+$"):
    hg.load(bad)


def test_a_huge_string_array_length_is_an_error_not_a_hang(small):
  path, _, patched = small
  at, _ = key_value_offset(path, "tokenizer.ggml.tokens")
  # the array's length sits 8 (this item's length) + 8 before its first item's bytes
  bad = patched(at - 16, struct.pack("<Q", (1 << 64) - 1))
  with pytest.raises(hg.GGUFError, match=r"metadata key 'tokenizer.ggml.tokens' is an array "
                     r"of 18,446,744,073,709,551,615 strings: the file's [\d,]+ bytes from "
                     "there hold fewer"):
    hg.load(bad)


def test_metadata_of_the_wrong_kind_names_the_key_and_the_kind(tmp_path):
  w = gguf.GGUFWriter(os.fspath(tmp_path / "k.gguf"), "llama")
  w.add_string("llama.block_count", "two")
  w.add_float32("llama.attention.head_count", 4.5)
  w.add_array("tokenizer.ggml.tokens", ["a", "b"])
  w.add_uint32("tokenizer.ggml.eos_token_id", 7)
  w.add_array("tokenizer.ggml.scores", [0.0])
  w.add_uint64("general.alignment", 32)
  w.add_float32("llama.rope.freq_base", float("inf"))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  p = tmp_path / "k.gguf"
  with pytest.raises(hg.GGUFError) as e:
    hg.read_header(p)
  assert str(e.value).splitlines() == [
      f"{p}: metadata key 'general.alignment' is a uint64: expected a uint32",
      f"{p}: metadata key 'llama.block_count' is a string: expected an integer",
      f"{p}: metadata key 'llama.attention.head_count' is a float32: expected an integer or an "
      "array of integers",
      f"{p}: metadata key 'llama.rope.freq_base' is inf: expected a finite number",
      f"{p}: metadata key 'tokenizer.ggml.eos_token_id' is 7: expected a token id in [0, 2) "
      "(tokenizer.ggml.tokens has 2)",
      f"{p}: metadata key 'tokenizer.ggml.scores' has 1 entries: expected one per token (2, "
      "tokenizer.ggml.tokens)"]


def test_alignment_not_a_power_of_two(tmp_path):
  w = gguf.GGUFWriter(os.fspath(tmp_path / "a.gguf"), "llama")
  w.add_uint32("general.alignment", 48)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(hg.GGUFError, match=r"metadata key 'general.alignment' is 48: expected a "
                     "power of two$"):
    hg.load(tmp_path / "a.gguf")


def test_a_bool_byte_other_than_0_or_1(small):
  path, data, patched = small
  # the bool's byte is the last of its field: key length, key, type (7), value
  key = b"tokenizer.ggml.add_bos_token"
  at = data.index(key) + len(key) + 4
  assert data[at] == 1
  bad = patched(at, b"\x05")
  with pytest.raises(hg.GGUFError, match=r"metadata key 'tokenizer.ggml.add_bos_token' is a "
                     r"bool of byte value 5: expected 0 or 1$"):
    hg.load(bad)


def test_a_value_type_out_of_range_and_nested_arrays(small):
  path, data, patched = small
  key = b"general.name"
  at = data.index(key) + len(key)
  bad = patched(at, struct.pack("<I", 13))
  with pytest.raises(hg.GGUFError, match=r"metadata key 'general.name' has value type 13: "
                     r"expected a GGUF value type \(0-12\)$"):
    hg.load(bad)
  key = b"tokenizer.ggml.scores"
  at = data.index(key) + len(key) + 4  # after the ARRAY type: the item type
  bad = patched(at, struct.pack("<I", 9))
  with pytest.raises(hg.GGUFError, match=r"'tokenizer.ggml.scores' is an array of arrays"):
    hg.load(bad)


def test_version_and_byte_order(small):
  _, _, patched = small
  with pytest.raises(hg.GGUFError, match=r"GGUF version 1: expected one of 2, 3$"):
    hg.load(patched(4, struct.pack("<I", 1)))
  with pytest.raises(hg.GGUFError, match=r"GGUF version 50331648 read little-endian, 3 "
                     "big-endian: hxmlir reads little-endian GGUF files only$"):
    hg.load(patched(4, struct.pack(">I", 3)))


def test_a_reserved_key(small):
  path, data, patched = small
  # general.name -> a name of the reader's own (same length)
  at = data.index(b"general.name")
  bad = patched(at, b"GGUF.version")
  with pytest.raises(hg.GGUFError, match=r"metadata key 'GGUF.version': the GGUF.\* names are "
                     "the header's own$"):
    hg.load(bad)


def test_many_problems_are_listed_then_counted(tmp_path):
  w = gguf.GGUFWriter(os.fspath(tmp_path / "m.gguf"), "llama")
  w.add_array("tokenizer.ggml.tokens", ["a"])
  w.add_uint32("tokenizer.ggml.bos_token_id", 5)
  w.add_uint32("tokenizer.ggml.padding_token_id", 5)  # not read by hxmlir: not checked
  for i in range(25):
    w.add_tensor(f"x{i}", np.zeros(8, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  data = bytearray((tmp_path / "m.gguf").read_bytes())
  data = data[:-800]  # the whole data section: 25 tensors past the end
  (tmp_path / "m.gguf").write_bytes(bytes(data))
  with pytest.raises(hg.GGUFError) as e:
    hg.load(tmp_path / "m.gguf")
  lines = str(e.value).splitlines()
  assert len(lines) == gguf_check.MAX_LINES + 1
  assert lines[-1] == f"{tmp_path / 'm.gguf'}: ... and 6 more problems", lines[-1]


def test_the_cli_prints_one_line_per_problem(small, capsys):
  from hxmlir.tools import cli
  path, data, patched = small
  at = tensor_field(path, "t.F32", 5)
  (off,) = struct.unpack_from("<Q", data, at)
  bad = patched(at, struct.pack("<Q", off + 4))  # misaligned, and runs into the next tensor
  assert cli.main(["inspect", str(bad)]) == 1
  out, err = capsys.readouterr()
  lines = err.splitlines()
  assert out == "" and len(lines) == 2, err
  assert lines[0] == (f"hxmlir inspect: error: GGUFError: {bad}: tensor 't.F32' (F32[3, 8]) "
                      f"starts at data offset {off + 4:,}: expected a multiple of the alignment "
                      "32"), lines[0]
  assert lines[1].startswith(f"hxmlir inspect: error: GGUFError: {bad}: tensor 't.F32' "), err


def test_a_tensor_count_that_leaves_tensors_out(small):
  # the records past the count were read as padding and every tensor's bytes from an
  # offset too early: silently wrong weights. Each count short of the table is an error.
  path, data, patched = small
  (n,) = struct.unpack_from("<Q", data, 8)
  assert n >= 4
  for short in range(1, n):
    bad = patched(8, struct.pack("<Q", n - short))
    with pytest.raises(hg.GGUFError, match=rf"does the header's count of {n - short} tensors "
                       r"leave some out\?\)$"):
      hg.load(bad)


def _table_and_data_ends(path) -> tuple[int, int]:
  """The file offsets where the tensor table and the last tensor's bytes end (the ``gguf``
  package's reader)."""
  r = gguf.GGUFReader(os.fspath(path))
  base = r.data.__array_interface__["data"][0]
  last = r.tensors[-1].field.parts[-1]
  table = last.__array_interface__["data"][0] - base + last.nbytes
  return table, max(t.data_offset + t.n_bytes for t in r.tensors)


def test_padding_before_the_data_section_must_be_zero(small):
  path, _, patched = small
  end, _ = _table_and_data_ends(path)
  start = -(-end // 32) * 32
  assert start > end, "the writer put no padding before the data section"
  bad = patched(start - 1, b"\x01")
  with pytest.raises(hg.GGUFError, match=rf"^{bad}: the {start - end} bytes between the tensor "
                     rf"table's end \(offset {end:,}\) and the data section \(offset "
                     rf"{start:,}\) are not all zero: expected GGUF's zero padding"):
    hg.load(bad)


def test_bytes_after_the_last_tensor(small, tmp_path):
  path, data, _ = small
  _, last = _table_and_data_ends(path)
  assert len(data) == -(-last // 32) * 32  # the writer pads the last tensor too
  for extra in (1, 32, 4096):
    bad = tmp_path / f"extra{extra}.gguf"
    bad.write_bytes(data + b"\0" * extra)
    with pytest.raises(hg.GGUFError, match=rf"^{bad}: the file has {extra:,} bytes? after its "
                       r"last tensor's data \(data offset [\d,]+, padded to [\d,]+\): expected "
                       r"it to end there"):
      hg.load(bad)
  # the last tensor's padding may be left off: its bytes end the file
  cut = tmp_path / "unpadded.gguf"
  cut.write_bytes(data[:last])
  gguf_check.check_file(cut)
