"""Decoder.generate_batch: B prompts decoded together give each prompt's own greedy tokens.

The models are gguf_families.py's tiny random-weight files (llama, and gemma3 with its
sliding-window layers), K-quant weights, both KV cache formats; the reference is
Decoder.generate of each prompt alone (itself checked against float64 in test_decoders.py).
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest

from hxmlir.models import from_gguf

pytest.importorskip("gguf")
sys.path.insert(0, os.path.dirname(__file__))
import gguf_families  # noqa: E402

CTX = 40
PROMPTS = [[5, 17, 99], [200, 3, 3, 41, 7, 300, 12, 9, 88], [1] * 6 + [77, 160] * 4]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("batch")
  out = {}
  for fam in ("llama", "gemma3"):
    out[fam] = d / f"{fam}.gguf"
    gguf_families.write(out[fam], fam, qtype="Q4_K_M", tied=False)  # (tied: a tiny random
    # model repeats its last token; an untied head makes varied greedy tokens)
  return out


def _alone(m, prompts, n):
  return [list(m.generate(p, n)) for p in prompts]


@pytest.mark.parametrize("kv_cache", ["f32", "int8"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_batch_gives_each_prompts_greedy_tokens(files, family, kv_cache):
  m = from_gguf(files[family], max_context=CTX, kv_cache=kv_cache)
  got = m.generate_batch(PROMPTS, 12)
  assert got == _alone(m, PROMPTS, 12)
  assert m.traces["batch_step"] == 1
  m.generate_batch(PROMPTS[::-1], 5)  # another order, other lengths: the same executable
  assert m.traces["batch_step"] == 1


def test_batch_stops_each_sequence_at_its_stop_token(files):
  m = from_gguf(files["llama"], max_context=CTX)
  alone = _alone(m, PROMPTS, 12)
  # a token the second prompt produces after others (the other prompts may produce it too)
  j = next(j for j, t in enumerate(alone[1]) if j and t not in alone[1][:j])
  m.tokenizer = types.SimpleNamespace(eot=alone[1][j])  # generate's end of turn
  want = _alone(m, PROMPTS, 12)
  assert want[1] == alone[1][:j]
  assert m.generate_batch(PROMPTS, 12) == want


def test_batch_ends_with_the_longest_prompts_cache(files):
  """The steps are shared: every sequence ends when the longest prompt's cache is full."""
  m = from_gguf(files["llama"], max_context=CTX)
  alone = _alone(m, PROMPTS, 64)
  longest = max(map(len, PROMPTS))
  assert len(alone[PROMPTS.index(max(PROMPTS, key=len))]) == CTX - longest + 1
  got = m.generate_batch(PROMPTS, 64)
  assert got == [a[:CTX - longest + 1] for a in alone]
  assert m.generate_batch(PROMPTS, 0) == [[], [], []]
  assert m.generate_batch(PROMPTS, 1) == [a[:1] for a in alone]


def test_batch_errors_name_the_argument(files):
  m = from_gguf(files["llama"], max_context=CTX)
  with pytest.raises(ValueError, match="at least one prompt"):
    m.generate_batch([], 4)
  with pytest.raises(ValueError, match="a prompt has 40 tokens; max_context is 40"):
    m.generate_batch([[1, 2], [3] * CTX], 4)
  with pytest.raises(ValueError, match="max_tokens"):
    m.generate_batch(PROMPTS, -1)
  with pytest.raises(ValueError, match="empty"):
    m.generate_batch([[1], []], 4)


def test_batch_refuses_one_prompt_for_a_list(files):
  # a str was taken as a list of one-character prompts, silently
  m = from_gguf(files["llama"], max_context=CTX)
  with pytest.raises(TypeError) as e:
    m.generate_batch("hi", 3)
  assert str(e.value) == ("generate_batch: prompts is one str (2 characters), not a list of "
                          "prompts: pass a list of prompts (texts, or lists of token ids), "
                          "[prompt] for one")
  for ids in ([5, 17, 99], np.asarray([5, 17, 99])):
    with pytest.raises(TypeError) as e:
      m.generate_batch(ids, 3)
    assert str(e.value) == ("generate_batch: prompts is one prompt's token ids, not a list of "
                            "prompts: pass a list of prompts (texts, or lists of token ids), "
                            "[ids] for one")
  assert m.generate_batch([[5, 17, 99]], 3) == _alone(m, [[5, 17, 99]], 3)  # [ids]: one prompt
