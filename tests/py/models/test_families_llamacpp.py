"""Every decoder family against llama.cpp: hxmlir's logits on small random-weight GGUF files
equal llama.cpp's on the same files.

The files come from gguf_families.py (seeded: the test writes them again and first checks
that their exact f32 values hash as they did when the fixtures were made); the fixtures are
llama.cpp's logits on them (scripts/make_llamacpp_fixtures.py: llama-cpp-python, every
position, f32 KV cache, flash attention off). For ``Q4_K_M`` the reference is llama.cpp on
the F32 file of the quantized file's exact values, so hxmlir's quantized matmuls are held
to the numbers the file stores.

Bounds (the decoder's acceptance bounds): top-1 agreement >= 0.99 over the positions and
``max|err| / max|ref| <= 1e-3``. Both sides compute in f32 through a few layers of width
256 (sums of 256-512 products, softmax over <= 32 positions): a float64 NumPy reading of
the same graphs (families_reference.py) is within 8e-7 of llama.cpp on every family but
the Gemmas, within 1.1e-4 on those (llama.cpp's CPU GELU rounds its input to f16 and reads
a table: ``GGML_GELU_FP16`` in ggml-cpu/vec.h); the top-1 logit leads the second by at
least 1.4e-3 of max|ref| at every position. A family read wrongly moves logits by O(1):
hxmlir's llama decoder, which ignores ``rope_freqs``, is at top-1 0.44 and 0.67 relative
error on the ``llama_rope_freqs`` file."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
sys.path.insert(0, os.path.dirname(__file__))

import gguf_families  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
TOP1, REL = 0.99, 1e-3


def _fixtures():
  with open(os.path.join(DATA, "llamacpp_families.json")) as f:
    meta = json.load(f)
  with np.load(os.path.join(DATA, "llamacpp_logits.npz")) as z:
    arrays = {k: z[k] for k in z.files}
  return meta, arrays


META, ARRAYS = _fixtures()
CASES = [(f, v) for f in gguf_families.FAMILIES for v in ("F32", "Q4_K_M")]


def _weights_sha256(weights):
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
  from make_llamacpp_fixtures import weights_sha256
  return weights_sha256(weights)


def _write(tmp_path, family, variant):
  path = tmp_path / f"{family}.{variant}.gguf"
  exact = gguf_families.write(path, family, seed=META["weight_seed"], qtype=variant)
  assert _weights_sha256(exact) == META["families"][family][variant]["weights_sha256"], (
      f"gguf_families.write({family!r}, qtype={variant!r}) no longer gives the values the "
      "fixtures were made from: run scripts/make_llamacpp_fixtures.py again")
  return str(path)


def _check(logits, ref, what):
  assert logits.shape == ref.shape, what
  top1 = float(np.mean(logits.argmax(-1) == ref.argmax(-1)))
  rel = float(np.abs(logits - ref).max() / np.abs(ref).max())
  assert top1 >= TOP1 and rel <= REL, f"{what}: top-1 {top1:.3f}, max|err|/max|ref| {rel:.2e}"


def test_fixtures_cover_every_family():
  assert set(META["families"]) == set(gguf_families.FAMILIES)
  prompt = ARRAYS["prompt"]
  assert prompt.tolist() == META["prompt"]
  for f, v in CASES:
    ref = ARRAYS[f"{f}/{v}"]
    assert ref.shape == (prompt.size, gguf_families.vocab_size()) and np.isfinite(ref).all()
  # llama.cpp read each Q4_K_M file as gguf-py dequantizes it (its own quantized matmuls
  # round activations to 8 bits: close, not equal)
  for f in gguf_families.FAMILIES:
    assert META["families"][f]["Q4_K_M"]["llamacpp_quantized_vs_exact"]["top1"] >= 0.9, f
    # the Q4_K_M files' type mix is the one llama_model_quantize chose on the F32 files
    assert META["families"][f]["F32"]["llamacpp_q4_k_m_types_differ"] == {}, f


@pytest.mark.parametrize("family,variant", CASES, ids=[f"{f}-{v}" for f, v in CASES])
def test_float64_reference_matches_llamacpp(tmp_path, family, variant):
  """families_reference.py (a float64 NumPy reading of llama.cpp's graphs) against the
  fixtures: the files, the fixtures and that reading agree."""
  import families_reference
  exact = gguf_families.write(tmp_path / "f.gguf", family, seed=META["weight_seed"],
                              qtype=variant)
  ref = families_reference.logits(gguf_families.spec(family), exact, ARRAYS["prompt"])
  _check(ref, ARRAYS[f"{family}/{variant}"], f"{family} {variant} (float64 reference)")


@pytest.mark.parametrize("family,variant", CASES, ids=[f"{f}-{v}" for f, v in CASES])
def test_family_matches_llamacpp(tmp_path, family, variant):
  from hxmlir import models
  if not hasattr(models, "from_gguf"):
    pytest.skip("hxmlir.models.from_gguf (the generic GGUF decoder) is not on this branch")
  path = _write(tmp_path, family, variant)
  m = models.from_gguf(path, max_context=64)
  _check(np.asarray(m.logits(ARRAYS["prompt"])), ARRAYS[f"{family}/{variant}"],
         f"{family} {variant}")


@pytest.mark.parametrize("variant", ["F32", "Q4_K_M"])
def test_llama_family_with_the_llama_decoder(tmp_path, variant):
  """The plain ``llama`` file (no rope_freqs) through hxmlir.models.llama.Llama: checks the
  file writer and the fixtures against a decoder that predates them."""
  from hxmlir.models import llama
  m = llama.Llama.from_gguf(_write(tmp_path, "llama", variant), max_context=64)
  _check(m.logits(ARRAYS["prompt"]), ARRAYS[f"llama/{variant}"], f"llama {variant}")
