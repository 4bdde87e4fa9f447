"""Sampling the next token from a decoder's logits: greedy, temperature, top-k, top-p."""

from __future__ import annotations

import numpy as np


def sampling_problems(max_tokens: int, *, temperature: float = 0.0, top_k: int | None = None,
                      top_p: float | None = None,
                      seed: int = 0) -> list[tuple[str, object, str]]:
  """What :func:`check_sampling` refuses, one ``(argument name, value, requirement)`` per
  bad argument, in the signature's order (``[]``: all good), e.g. ``("max_tokens", -1,
  "must be an integer >= 0")``; callers that name the arguments otherwise (the command
  line's ``--max-tokens``) word the message from these."""
  def integer(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)
  def number(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
        and np.isfinite(v)
  bad = []
  if not (integer(max_tokens) and max_tokens >= 0):
    bad.append(("max_tokens", max_tokens, "must be an integer >= 0"))
  if not (number(temperature) and temperature >= 0):
    bad.append(("temperature", temperature, "must be a finite number >= 0"))
  if top_k is not None and not (integer(top_k) and top_k >= 1):
    bad.append(("top_k", top_k, "must be an integer >= 1"))
  if top_p is not None and not (number(top_p) and 0 < top_p <= 1):
    bad.append(("top_p", top_p, "must be in (0, 1]"))
  if not (integer(seed) and seed >= 0):
    bad.append(("seed", seed, "must be an integer >= 0"))
  return bad


def check_sampling(max_tokens: int, *, temperature: float = 0.0, top_k: int | None = None,
                   top_p: float | None = None, seed: int = 0) -> None:
  """Checks :meth:`Llama.generate`'s arguments: ``max_tokens`` an integer >= 0,
  ``temperature`` a finite number >= 0, ``top_k`` ``None`` or an integer >= 1, ``top_p``
  ``None`` or a number in (0, 1], ``seed`` an integer >= 0. Raises ``ValueError`` naming
  each argument that is not (and only those): ``max_tokens=-1 must be an integer >= 0``."""
  bad = sampling_problems(max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                          seed=seed)
  if bad:
    raise ValueError("; ".join(f"{name}={value!r} {why}" for name, value, why in bad))


def sample(logits: np.ndarray, temperature: float, top_k: int | None,
           top_p: float | None, rng: np.random.Generator) -> int:
  """One token id from ``logits: f32[vocab]``: the argmax for ``temperature == 0``, else
  a draw from the tempered softmax over the ``top_k`` / ``top_p`` candidates."""
  if temperature == 0:
    return int(np.argmax(logits))
  z = logits.astype(np.float64)
  with np.errstate(over="ignore"):  # <= 0: a tiny temperature gives -inf (probability 0)
    z = (z - z.max()) / temperature
  order = np.argsort(-z, kind="stable")[:top_k]
  p = np.exp(z[order] - z[order[0]])
  p /= p.sum()
  if top_p is not None:
    p = p[:int(np.searchsorted(np.cumsum(p), top_p)) + 1]
    p /= p.sum()
  return int(order[rng.choice(p.size, p=p)])


