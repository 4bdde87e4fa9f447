"""Argument and result trees of exported functions, as JSON.

``"*"`` a leaf, ``null`` None, ``{"tuple": [...]}``, ``{"list": [...]}``,
``{"dict": [[key, tree], ...]}`` (string keys, sorted): what ``hx.signature``
records as ``in_tree`` / ``out_tree``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax


def flatten(tree, what: str) -> tuple[list, Any]:
  """``(leaves, encoding)`` of a Python tree of JAX values (arrays, hi values, ``ShapeDtypeStruct``).

  Containers are tuples, lists, dicts with string keys (encoded sorted by key) and
  ``None``; every other object is a leaf, taken in depth-first order (dict entries by
  sorted key). ``what`` names the tree in errors (``"arguments"``, ``"results"``).
  Raises ``TypeError`` for a dict with a non-string key, and for a container of any
  other kind (a subclass of tuple/list/dict such as a namedtuple, or a registered
  pytree node), which the JSON encoding cannot record.
  """
  leaves: list = []

  def enc(t):
    if t is None:
      return None
    if type(t) is tuple:
      return {"tuple": [enc(e) for e in t]}
    if type(t) is list:
      return {"list": [enc(e) for e in t]}
    if type(t) is dict:
      if not all(isinstance(k, str) for k in t):
        raise TypeError(f"hxmlir.export: {what} dicts must have string keys, got {list(t)}")
      return {"dict": [[k, enc(t[k])] for k in sorted(t)]}
    if isinstance(t, (tuple, list, dict)) or jax.tree.structure(t).num_nodes > 1:
      raise TypeError(f"hxmlir.export: {what} may hold tuples, lists, dicts and None "
                      f"around JAX values, not {type(t).__name__}")
    leaves.append(t)
    return "*"
  return leaves, enc(tree)


def unflatten(tree, leaves: Sequence) -> Any:
  """Inverse of :func:`flatten`: the containers of the encoded ``tree`` with ``leaves``
  in its leaf slots, in order. ``leaves`` must hold at least :func:`count_leaves` of
  ``tree`` (extra ones are ignored). Raises ``ValueError`` on a malformed encoding."""
  it = iter(leaves)

  def dec(t):
    if t is None:
      return None
    if t == "*":
      return next(it)
    kind, v = node(t)
    if kind == "dict":
      return {k: dec(e) for k, e in v}
    return (tuple if kind == "tuple" else list)(dec(e) for e in v)
  return dec(tree)


def node(t) -> tuple[str, list]:
  """``(kind, elements)`` of a container node of an encoded tree: ``kind`` is ``"tuple"``,
  ``"list"`` or ``"dict"``; ``elements`` the encoded elements (``[key, tree]`` pairs for a
  dict). Raises ``ValueError`` for anything else (leaves ``"*"`` and ``None`` included)."""
  if isinstance(t, dict) and len(t) == 1:
    (kind, v), = t.items()
    if kind in ("tuple", "list", "dict") and isinstance(v, list):
      return kind, v
  raise ValueError(f"bad tree encoding {t!r}")


def count_leaves(tree) -> int:
  """The number of ``"*"`` leaves of the encoded ``tree`` (``None`` slots do not count).
  ``tree`` must be a well-formed encoding (as recorded by :func:`flatten`)."""
  if tree == "*":
    return 1
  if tree is None:
    return 0
  (kind, v), = tree.items()
  return sum(count_leaves(e[1] if kind == "dict" else e) for e in v)
