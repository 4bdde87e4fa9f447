"""Hi values <-> the arrays of an ``.npz`` file, under documented keys.

``hxmlir run`` reads an artifact's arguments from an ``.npz`` and writes its
results to one; ``hxmlir export --inputs-out`` and the demo write them. An
``.npz`` holds plain arrays only, so each value is stored as its lo components
(exactly the shapes and dtypes of the type's ``lo_ty()``), under a key made of

- the value's place in the argument (or result) tree: ``a<i>`` for positional
  argument ``i`` (for results: element ``i`` of a returned tuple or list, or
  ``a0`` for a single result), ``kw['name']`` for keyword argument ``name``,
  then ``['key']`` for a dict entry and ``[j]`` for a tuple or list element,
  as ``jax.tree_util.keystr`` writes paths; and
- the component, for hi values: ``.qvalue`` (``i8``) and ``.scale`` (``f32``)
  of a ``q8`` (and ``.offset`` for a format with an offset, ``u4o``, ``q8o``), ``.col`` and ``.row`` of an ``r1``, and ``.<j>`` for element
  ``j`` of a ``Tup`` (recursively: ``a0.1.scale``).

So ``f(x, {"w": q8[4,3], "b": f32[3]})`` reads ``a0``, ``a1['b']``,
``a1['w'].qvalue`` and ``a1['w'].scale``; a result ``Tup{f32[3],q8[2,4]}`` is
written as ``a0.0``, ``a0.1.qvalue``, ``a0.1.scale``.

Trees are the JSON encoding :class:`hxmlir.export.Exported` records
(``in_tree``/``out_tree``): ``"*"`` a leaf, ``null`` None, ``{"tuple": [...]}``,
``{"list": [...]}``, ``{"dict": [[key, tree], ...]}``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.hijax import HiType

from hxmlir.export._tree import node, unflatten
from hxmlir.types.qarray import QArray, QArrayTy
from hxmlir.types.rank1 import Rank1Ty
from hxmlir.types.tuples import TupTy

COMPONENTS: dict[type, tuple[str, ...]] = {QArrayTy: ("qvalue", "scale"),
                                           Rank1Ty: ("col", "row")}
"""Names of a hi array type's lo components, in ``lo_ty()`` order (``Tup`` elements are
numbered); a quantized format with an offset adds ``offset`` (:func:`component_names`)."""


def component_names(ty) -> tuple[str, ...] | None:
  """The names of hi type ``ty``'s lo components in ``lo_ty()`` order: ``COMPONENTS``,
  plus ``offset`` for a quantized format that has one (``u4o``); ``None`` if undefined."""
  names = COMPONENTS.get(type(ty))
  if names is not None and isinstance(ty, QArrayTy) and ty.format.offset:
    names = (*names, "offset")
  return names


def component_keys(ty) -> list[str]:
  """The key suffixes of ``ty``'s lo components: ``[""]`` for an array,
  ``[".qvalue", ".scale"]`` for ``q8``, ``[".qvalue", ".scale", ".offset"]`` for ``u4o``,
  ``[".0", ".1.qvalue", ...]`` for a ``Tup``.

  Raises ``TypeError`` for a hi type with no documented components.
  """
  if isinstance(ty, TupTy):
    return [f".{i}{s}" for i, t in enumerate(ty.tys) for s in component_keys(t)]
  if isinstance(ty, HiType):
    names = component_names(ty)
    if names is None:
      raise TypeError(f"no .npz keys are defined for values of type {ty}")
    return [f".{n}" for n in names]
  return [""]


def leaf_paths(tree, results: bool = False) -> list[str]:
  """The key prefix of each leaf of an ``Exported`` tree (``a0``, ``a1['w']``, ...).

  ``tree`` is an ``in_tree`` (``((args...), {kwargs})``) or, with
  ``results=True``, an ``out_tree``. Raises ``ValueError`` on a malformed tree.
  """
  if results:
    kind, v = node(tree) if isinstance(tree, dict) else (None, None)
    roots = [(e, f"a{i}") for i, e in enumerate(v)] if kind in ("tuple", "list") \
        else [(tree, "a0")]
  else:
    kind, v = node(tree)
    if kind != "tuple" or len(v) != 2:
      raise ValueError(f"bad argument tree {tree!r}: expected ((args...), {{kwargs}})")
    (_, args), (_, kwargs) = node(v[0]), node(v[1])
    roots = [(e, f"a{i}") for i, e in enumerate(args)] + \
        [(e, f"kw[{k!r}]") for k, e in kwargs]
  return [p for t, prefix in roots for p, _ in _walk(t, prefix)]


def build_tree(tree, leaves: Sequence) -> Any:
  """The Python containers of ``tree`` with ``leaves`` in its leaf slots, in order
  (:func:`hxmlir.export._tree.unflatten`). Raises ``ValueError`` on a malformed tree."""
  return unflatten(tree, leaves)


def tree_leaves(tree, value) -> list:
  """The leaves of ``value``, a Python container structured as ``tree`` (hi values are
  leaves), in the order :func:`leaf_paths` names them. Raises ``ValueError`` when
  ``value`` does not have that structure."""
  return [x for _, x in _walk(tree, "", value)]


_PATHS_ONLY = object()


def _walk(t, path: str, value: Any = _PATHS_ONLY):
  """``(path, leaf)`` for each leaf of tree ``t`` under ``path``; leaves are taken from
  ``value`` (structured as ``t``, checked) when given."""
  if t is None:
    return
  if t == "*":
    yield path, value
    return
  kind, elts = node(t)
  items = elts if kind == "dict" else list(enumerate(elts))
  if value is not _PATHS_ONLY:
    if kind == "dict" and (not isinstance(value, dict) or sorted(value) != [k for k, _ in elts]):
      raise ValueError(f"expected a dict with keys {[k for k, _ in elts]}, got {value!r}")
    if kind != "dict" and (not isinstance(value, (tuple, list)) or len(value) != len(elts)):
      raise ValueError(f"expected a {kind} of {len(elts)} elements, got {value!r}")
  for k, e in items:
    yield from _walk(e, f"{path}[{k!r}]", _PATHS_ONLY if value is _PATHS_ONLY else value[k])


def to_arrays(paths: Sequence[str], types: Sequence, values: Sequence) -> dict[str, np.ndarray]:
  """``{key: array}`` for values of ``types`` at ``paths`` (their lo components for hi values)."""
  out = {}
  for path, ty, v in zip(paths, types, values):
    parts = ty.lower_val(v) if isinstance(ty, HiType) else [v]
    for suffix, a in zip(component_keys(ty), parts, strict=True):
      out[path + suffix] = np.asarray(a)
  return out


def arguments_to_arrays(exp, args: Sequence, kwargs: dict | None = None
                        ) -> dict[str, np.ndarray]:
  """``{key: array}`` of the arguments ``args``/``kwargs`` of an exported function ``exp``
  (an :class:`hxmlir.export.Exported`), keyed as ``hxmlir run`` reads them: pytrees of
  arrays and hi values, ``a0['layers'][0]['q'].qvalue``. Raises ``ValueError`` when the
  arguments do not have ``exp.in_tree``'s structure."""
  leaves = tree_leaves(exp.in_tree, (tuple(args), dict(kwargs or {})))
  return to_arrays(leaf_paths(exp.in_tree), exp.in_types, leaves)


def from_arrays(ty, arrays: Sequence, shardings: Sequence | None = None) -> Any:
  """The value of type ``ty`` made of its lo component ``arrays`` (``lo_ty()`` order).

  ``np.savez`` writes ml_dtypes arrays (an ``f8`` value's float8 components) as raw
  bytes (``|V1``); those are read back as the component's dtype. ``shardings`` (one
  ``jax.sharding.Sharding`` per component, or ``None``): where each component is put
  (``jax.device_put``); default: the default device."""
  if isinstance(ty, HiType):
    arrays = [typed(a, t.dtype) for a, t in zip(arrays, ty.lo_ty(), strict=True)]
  if shardings is None:
    arrays = [jnp.asarray(a) for a in arrays]
  else:
    arrays = [jax.device_put(a, s) for a, s in zip(arrays, shardings, strict=True)]
  return ty.raise_val(*arrays) if isinstance(ty, HiType) else arrays[0]


def typed(a, dtype) -> np.ndarray:
  """``a`` as read from an ``.npz``: raw bytes (``|V1``, how ``np.savez`` writes ml_dtypes
  arrays such as float8) of ``dtype``'s item size viewed as ``dtype``; else unchanged."""
  a = np.asarray(a)
  if a.dtype.kind == "V" and a.dtype.itemsize == np.dtype(dtype).itemsize:
    return a.view(dtype)
  return a


# --- flat lists of values (the demo's inputs and outputs) ------------------

def flatten_values(values: Sequence[Any]) -> dict[str, np.ndarray]:
  """``{"a0": ..., "a1.qvalue": ..., "a1.scale": ...}`` for a list of values (arrays and hi
  values, keyed as in the module docstring)."""
  return to_arrays([f"a{i}" for i in range(len(values))], [jax.typeof(v) for v in values],
                   values)


def unflatten_values(arrays: dict[str, np.ndarray]) -> list[Any]:
  """Inverse of :func:`flatten_values`; raises ``ValueError`` on a missing or unknown key."""
  idx = {}
  for key in arrays:
    m = re.fullmatch(r"a(\d+)(?:\.(qvalue|scale|offset))?", key)
    if not m:
      raise ValueError(f"unexpected array name {key!r}: expected a<i>, a<i>.qvalue, a<i>.scale "
                       "(and a<i>.offset for a format with an offset)")
    idx.setdefault(int(m.group(1)), set()).add(m.group(2))
  if sorted(idx) != list(range(len(idx))):
    raise ValueError(f"argument numbers must be 0..{len(idx) - 1}, got {sorted(idx)}")
  out = []
  for i in range(len(idx)):
    if idx[i] == {None}:
      out.append(jnp.asarray(arrays[f"a{i}"]))
    elif idx[i] in ({"qvalue", "scale"}, {"qvalue", "scale", "offset"}):
      out.append(QArray(*(jnp.asarray(arrays[f"a{i}.{n}"])
                          for n in ("qvalue", "scale", "offset") if n in idx[i])))
    else:
      raise ValueError(f"argument {i} needs a{i}, or a{i}.qvalue and a{i}.scale "
                       f"(and a{i}.offset for a format with an offset)")
  return out
