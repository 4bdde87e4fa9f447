"""The models the demo runs, by name: each a :class:`DemoModel` (f32 parameters, inputs, the
model function, its quantizer, and how the int8 output is judged against the f32 one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hxmlir.models import builtin, minilm


@dataclass
class DemoModel:
  """What the demo needs from a model.

  ``apply(params, *inputs, naive=False)`` is the model; ``params`` holds f32
  arrays, ``qparams`` the same tree with ``q8`` dense weights (set by the
  quantize step); ``compare(y, ref)`` returns ``(data, line, ok)`` for the int8
  output ``y`` against the f32 output ``ref``.
  """
  name: str
  description: str
  params: Any
  inputs: tuple
  apply: Callable[..., Any]
  quantize: Callable[[Any], Any]
  compare: Callable[[np.ndarray, np.ndarray], tuple[dict, str, bool]]
  qparams: Any = None


def rel_err(y: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
  """``(max |y - ref|, ||y - ref||_2 / ||ref||_2)`` of two arrays of one shape (any float
  dtype; computed in float64, Frobenius norm over all elements). ``inf``/``nan`` when
  ``ref`` is all zeros."""
  d = np.asarray(y, np.float64) - np.asarray(ref, np.float64)
  return float(np.abs(d).max()), float(np.linalg.norm(d) / np.linalg.norm(ref))


BUILTIN_MAX_REL_ERR = 0.05
MINILM_MIN_COSINE = 0.99


def _builtin_model() -> DemoModel:
  cfg = builtin.Config()
  params = builtin.as_jax(builtin.init_params(cfg))
  x = jnp.asarray(builtin.example_input(cfg))
  n_dense = cfg.layers * len(builtin.DENSE_WEIGHTS)

  def compare(y, ref):
    mx, rel = rel_err(y, ref)
    ok = rel <= BUILTIN_MAX_REL_ERR
    line = (f"int8 vs f32: max abs error {mx:.3g}, relative error {rel:.3g} "
            f"({'<=' if ok else '>'} {BUILTIN_MAX_REL_ERR})")
    return {"max_abs_error": mx, "relative_error": rel, "max_relative_error": BUILTIN_MAX_REL_ERR}, line, ok

  return DemoModel(
      name="builtin",
      description=(f"built-in transformer: {cfg.layers} pre-LN blocks, d_model {cfg.d_model}, "
                   f"{cfg.heads} heads, d_ff {cfg.d_ff}, {n_dense} dense weights; "
                   f"input f32[{cfg.batch},{cfg.seq},{cfg.d_model}]"),
      params=params, inputs=(x,),
      apply=partial(_apply_builtin, cfg.heads),
      quantize=builtin.quantize_params, compare=compare)


def _apply_builtin(heads, params, x, *, naive=False):
  return builtin.forward(params, x, heads=heads, naive=naive)


MINILM_SENTENCES = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A woman is holding an infant in her arms.",
    "A man is riding a horse.",
    "A cowboy rides his horse across the plain.",
    "The stock market fell sharply on Tuesday.",
    "Quantum computers use qubits instead of classical bits.",
)


# pairs of MINILM_SENTENCES with well-separated similarities (0.76 ... 0.07)
MINILM_PAIRS = ((0, 1), (4, 5), (2, 3), (0, 4), (6, 7))


def build_model(name: str, progress: Callable[[str], None] | None = None) -> DemoModel:
  """The :class:`DemoModel` called ``name`` (``"builtin"`` or ``"minilm"``), not yet quantized.

  Raises ``ValueError`` for an unknown name and
  :class:`hxmlir.models.minilm.ModelNotInstalledError` when MiniLM's files are missing.
  """
  if name == "builtin":
    return _builtin_model()
  if name == "minilm":
    return _minilm_model(progress or (lambda m: None))
  raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")


def _minilm_model(progress: Callable[[str], None]) -> DemoModel:
  progress("reading model.safetensors")
  cfg, params = minilm.load_params()
  tok = minilm.Tokenizer()
  ids, mask = tok(list(MINILM_SENTENCES))
  params = jax.tree.map(jnp.asarray, params)

  def compare(y, ref):
    mx, rel = rel_err(y, ref)
    cos = np.sum(y * ref, -1) / (np.linalg.norm(y, axis=-1) * np.linalg.norm(ref, axis=-1))
    rank = lambda e: [int(i) for i in np.argsort([-(e[a] @ e[b]) for a, b in MINILM_PAIRS])]
    same_rank = rank(y) == rank(ref)
    ok = bool(cos.min() >= MINILM_MIN_COSINE) and same_rank
    line = (f"int8 vs f32 embeddings: cosine min {cos.min():.5f} "
            f"({'>=' if cos.min() >= MINILM_MIN_COSINE else '<'} {MINILM_MIN_COSINE}), "
            f"ranking of {len(MINILM_PAIRS)} sentence pairs "
            f"{'unchanged' if same_rank else 'CHANGED'}, max abs error {mx:.3g}, "
            f"relative error {rel:.3g}")
    return {"max_abs_error": mx, "relative_error": rel, "cosine_min": float(cos.min()),
            "cosines": [float(c) for c in cos], "min_cosine_required": MINILM_MIN_COSINE,
            "pair_ranking_f32": rank(ref), "pair_ranking_int8": rank(y)}, line, ok

  n_tok = int(mask.sum())
  return DemoModel(
      name="minilm",
      description=(f"all-MiniLM-L6-v2: BERT {cfg.layers} layers, hidden {cfg.hidden}, "
                   f"{cfg.heads} heads, {6 * cfg.layers} dense weights; "
                   f"{len(MINILM_SENTENCES)} sentences, {n_tok} tokens, "
                   f"ids i32[{ids.shape[0]},{ids.shape[1]}]"),
      params=params, inputs=(jnp.asarray(ids), jnp.asarray(mask)),
      apply=partial(_apply_minilm, cfg),
      quantize=minilm.quantize_params, compare=compare)


def _apply_minilm(cfg, params, ids, mask, *, naive=False):
  return minilm.encode(params, ids, mask, cfg=cfg, naive=naive)


MODELS = ("builtin", "minilm")
