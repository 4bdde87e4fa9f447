"""The models the demo runs, by name: each a :class:`DemoModel` (f32 parameters, inputs, the
model function, its quantizer, and how the quantized output is judged against the f32 one),
and the weight format it quantizes to (:class:`QuantFormat`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hxmlir import formats
from hxmlir.models import builtin, minilm


@dataclass(frozen=True)
class QuantFormat:
  """The format the demo quantizes dense weights to: :func:`hxmlir.quantize`'s ``dtype``
  (a name in :data:`hxmlir.formats.FORMATS`), ``group_size`` (``None``: one scale per
  row) and ``method`` (``"absmax"`` or ``"mse"``)."""
  dtype: str = "int8"
  group_size: int | None = None
  method: str = "absmax"

  @classmethod
  def of(cls, dtype="int8", group_size: int | None = None, method: str = "absmax") -> QuantFormat:
    """The format for ``hx.quantize``'s arguments. Raises ``TypeError`` for an unknown
    ``dtype`` or a group size that is not a positive int (even, for int4), and
    ``ValueError`` for an unknown ``method``, each naming the valid choices."""
    f = formats.lookup(dtype)
    if method not in formats.METHODS:
      raise ValueError(f"unknown quantization method {method!r}: choose one of "
                       f"{', '.join(formats.METHODS)}")
    if group_size is not None:
      why = formats.check(f, (group_size,), group_size)
      if why is not None:
        raise TypeError(f"group size {group_size!r} for {f.name}: {why}")
      group_size = int(group_size)
    return cls(f.name, group_size, method)

  @property
  def label(self) -> str:
    """Short name: ``int8``, ``int4 g32``, ``int4 g32 mse``."""
    return " ".join([self.dtype] + ([f"g{self.group_size}"] if self.group_size else [])
                    + ([self.method] if self.method != "absmax" else []))

  def describe(self) -> str:
    """``q4 (int4 values + one f32 scale per 32 values of a row, mse scales)``."""
    f = formats.lookup(self.dtype)
    per = "row" if self.group_size is None else f"{self.group_size} values of a row"
    return (f"{f.prefix} ({f.name} values + one f32 scale per {per}"
            f"{', mse scales' if self.method != 'absmax' else ''})")

  def flags(self) -> str:
    """The ``hxmlir demo`` flags that select this format (empty for the default)."""
    return " ".join(([f"--dtype {self.dtype}"] if self.dtype != "int8" else [])
                    + ([f"--group-size {self.group_size}"] if self.group_size else [])
                    + ([f"--method {self.method}"] if self.method != "absmax" else []))

  def to_json(self) -> dict[str, Any]:
    """``{"dtype", "group_size", "method", "label"}``: the report's ``format``."""
    return {"dtype": self.dtype, "group_size": self.group_size, "method": self.method,
            "label": self.label}


@dataclass
class DemoModel:
  """What the demo needs from a model.

  ``apply(params, *inputs, naive=False)`` is the model; ``params`` holds f32
  arrays, ``qparams`` the same tree with quantized dense weights (set by the quantize
  step, ``quantize(params, dtype, group_size=, method=)``); ``compare(y, ref, fmt)``
  returns ``(data, line, ok)`` for the output ``y`` of the model quantized to
  :class:`QuantFormat` ``fmt`` against the f32 output ``ref``, ``ok`` when it is within
  the format's bound.
  """
  name: str
  description: str
  params: Any
  inputs: tuple
  apply: Callable[..., Any]
  quantize: Callable[[Any], Any]
  compare: Callable[[np.ndarray, np.ndarray, QuantFormat], tuple[dict, str, bool]]
  qparams: Any = None


def rel_err(y: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
  """``(max |y - ref|, ||y - ref||_2 / ||ref||_2)`` of two arrays of one shape (any float
  dtype; computed in float64, Frobenius norm over all elements). ``inf``/``nan`` when
  ``ref`` is all zeros."""
  d = np.asarray(y, np.float64) - np.asarray(ref, np.float64)
  return float(np.abs(d).max()), float(np.linalg.norm(d) / np.linalg.norm(ref))


BUILTIN_MAX_REL_ERR = {"int8": 0.05, "float8_e4m3fn": 0.1, "int4": 0.3}
"""The built-in model's largest relative error to f32, per value format. Its weights are
Gaussian, the worst case for few levels: measured int8 0.014, float8 0.049, int4 g32
0.18 (mse 0.17), g128 0.22, per row 0.25."""
MINILM_MIN_COSINE = {"int8": 0.99, "float8_e4m3fn": 0.99, "int4": 0.95}
"""MiniLM's smallest cosine to the f32 embeddings, per value format (int4 g32 with mse scales
must reach 0.95). Measured over MINILM_SENTENCES: int8 0.9989, float8 0.9981,
int4 g32 0.958 (mse 0.962); int4 g128 (0.932, mse 0.947) misses it."""


def _builtin_model() -> DemoModel:
  cfg = builtin.Config()
  params = builtin.as_jax(builtin.init_params(cfg))
  x = jnp.asarray(builtin.example_input(cfg))
  n_dense = cfg.layers * len(builtin.DENSE_WEIGHTS)

  def compare(y, ref, fmt=QuantFormat()):
    mx, rel = rel_err(y, ref)
    bound = BUILTIN_MAX_REL_ERR[fmt.dtype]
    ok = rel <= bound
    line = (f"{fmt.label} vs f32: max abs error {mx:.3g}, relative error {rel:.3g} "
            f"({'<=' if ok else '>'} {bound})")
    return {"max_abs_error": mx, "relative_error": rel, "max_relative_error": bound}, line, ok

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

  def compare(y, ref, fmt=QuantFormat()):
    mx, rel = rel_err(y, ref)
    cos = np.sum(y * ref, -1) / (np.linalg.norm(y, axis=-1) * np.linalg.norm(ref, axis=-1))
    rank = lambda e: [int(i) for i in np.argsort([-(e[a] @ e[b]) for a, b in MINILM_PAIRS])]
    same_rank = rank(y) == rank(ref)
    bound = MINILM_MIN_COSINE[fmt.dtype]
    ok = bool(cos.min() >= bound) and same_rank
    line = (f"{fmt.label} vs f32 embeddings: cosine min {cos.min():.5f} "
            f"({'>=' if cos.min() >= bound else '<'} {bound}), "
            f"ranking of {len(MINILM_PAIRS)} sentence pairs "
            f"{'unchanged' if same_rank else 'CHANGED'}, max abs error {mx:.3g}, "
            f"relative error {rel:.3g}")
    return {"max_abs_error": mx, "relative_error": rel, "cosine_min": float(cos.min()),
            "cosines": [float(c) for c in cos], "min_cosine_required": bound,
            "pair_ranking_f32": rank(ref), "pair_ranking_quantized": rank(y)}, line, ok

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
