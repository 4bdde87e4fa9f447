"""Session fixtures of the decoder tests on the real SmolLM2 file: the model is loaded and
compiled once per session, whichever test modules use it."""

from __future__ import annotations

import pytest
from smollm2_reference import PATH, Reference

from hxmlir.models import llama


@pytest.fixture(scope="session")
def model():
  return llama.Llama.from_gguf(PATH, max_context=256)


@pytest.fixture(scope="session")
def ref():
  return Reference(PATH)


@pytest.fixture(scope="session")
def model_int8(model):
  """The same weights (not loaded again) with ``kv_cache="int8"``."""
  m = llama.Llama(model.config, model.params, max_context=model.max_context,
                  kv_cache="int8", metadata=model.metadata, path=model.path)
  m.tokenizer = model.tokenizer
  return m
