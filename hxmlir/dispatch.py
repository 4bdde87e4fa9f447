"""``hx.jit``: ``jax.jit`` whose concrete hi arguments and results cross the call as lo arrays.

JAX 0.10.2 calls a jitted function whose arguments or results include a hi
value (``q8``, ``r1``, ``Tup``) through its Python dispatch path: every argument
leaf, arrays included, is checked in Python on every call, where a call with
plain arrays takes JAX's C++ path. A model step taking its quantized weights as
arguments pays for it on every call: all-MiniLM-L6-v2's 36 ``q8`` weights and
~100 other parameters cost about 1.8 ms per call on the development machine (a
step is ~20 ms), the 24 of the built-in model about 0.9 ms (a step is ~5 ms).

:func:`jit` passes each concrete hi value as its lo components instead (a
``q8`` as its values and scales, an ``r1`` as its factors, a ``Tup`` as its
elements), rebuilds it inside the traced function (``hx.make_qarray``,
``hx.outer``, ``hx.make_tup``), and does the reverse for hi results, so the call
takes the C++ path. The program is the one ``jax.jit`` compiles (the rebuild
and the take-apart are free there). Under an outer transformation (hi
arguments that are tracers) nothing is rewritten: the call is ``jax.jit``'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from hxmlir import _jax
from hxmlir.qarray import QArray, QArrayTy, make_qarray, qarray_parts
from hxmlir.rank1 import Rank1, Rank1Ty, factors, outer
from hxmlir.tuples import HiTup, TupTy, get_tuple_element, make_tup


@jax.tree_util.register_pytree_node_class
class _Lo:
  """A hi value as its lo components: a pytree node whose children are the components
  (arrays, or ``_Lo`` for hi elements of a tuple) and whose aux data is the kind."""

  __slots__ = ("kind", "parts")

  def __init__(self, kind: type, parts: tuple):
    self.kind, self.parts = kind, parts

  def tree_flatten(self):
    return self.parts, self.kind

  @classmethod
  def tree_unflatten(cls, kind, parts):
    return cls(kind, tuple(parts))


def _lower(v, parts_of: dict, key) -> Any:
  """A hi value as ``_Lo`` of its components (tuple elements lowered too), by
  ``parts_of[key(v)] = (kind, components)``; anything else unchanged."""
  entry = parts_of.get(key(v))
  if entry is None:
    return v
  kind, components = entry
  parts = tuple(components(v))
  if kind is HiTup:
    parts = tuple(_lower(e, parts_of, key) for e in parts)
  return _Lo(kind, parts)


_CONCRETE_PARTS = {QArray: (QArray, lambda v: (v.qvalue, v.scale)),
                   Rank1: (Rank1, lambda v: (v.col, v.row)),
                   HiTup: (HiTup, lambda v: v.elts)}
"""Before the call: a concrete value's stored components, by the value's class."""
_TRACED_PARTS = {QArrayTy: (QArray, qarray_parts), Rank1Ty: (Rank1, factors),
                 TupTy: (HiTup, lambda v: [get_tuple_element(v, i)
                                           for i in range(len(jax.typeof(v).tys))])}
"""Inside the jitted function: a traced result's components, by its type's class."""


def _lower_concrete(v) -> Any:
  return _lower(v, _CONCRETE_PARTS, type)


def _lower_traced(v) -> Any:
  return _lower(v, _TRACED_PARTS,
                lambda v: type(jax.typeof(v)) if isinstance(v, jax.core.Tracer) else None)


def _raise(v, build: dict) -> Any:
  """``_Lo`` back to the hi value by ``build[kind](*components)`` (tuple elements first)."""
  if not isinstance(v, _Lo):
    return v
  parts = tuple(_raise(e, build) for e in v.parts) if v.kind is HiTup else v.parts
  return build[v.kind](*parts)


_BY_PRIMITIVES = {QArray: make_qarray, Rank1: outer, HiTup: make_tup}
"""Inside the jitted function: the hi value from traced components, by the types' primitives."""
_BY_CONSTRUCTORS = {QArray: QArray, Rank1: Rank1, HiTup: lambda *elts: HiTup(elts)}
"""After the call: the hi value from concrete arrays."""


def _is_lo(v) -> bool:
  return isinstance(v, _Lo)


def _leaf_key(a) -> tuple:
  """What a compiled executable depends on in an argument leaf: its type (for Python
  scalars, weakly typed in JAX), and for arrays shape, dtype, weak type and sharding."""
  shape = getattr(a, "shape", None)
  if shape is None:
    return (type(a),)
  return (type(a), shape, a.dtype, getattr(a, "weak_type", False), getattr(a, "sharding", None))


_REFUSED = {
    "in_shardings": "shardings would name the lo components: place the arguments with "
                    "jax.device_put (hi values take the NamedSharding of their dense shape)",
    "out_shardings": "shardings would name the lo components: constrain the results with "
                     "jax.lax.with_sharding_constraint inside the function",
    "static_argnums": "bind static arguments with functools.partial",
    "static_argnames": "bind static arguments with functools.partial",
}


def jit(fun: Callable | None = None, **jit_kwargs) -> Callable:
  """``jax.jit(fun, **jit_kwargs)``, called with concrete hi values as their lo components.

  Same results, same compiled program and the same errors as ``jax.jit(fun)``;
  only the call differs: each concrete ``hx.QArray`` (``q8``/``q4``/``f8``,
  per-row or grouped), ``hx.Rank1`` and ``hx.HiTup`` among the arguments
  (anywhere in their pytrees) travels as its arrays, and hi results come back
  rebuilt. The function is lowered and compiled once per signature (the pytree
  structure, each array's shape, dtype, weak type and sharding, and JAX's trace
  context, which holds ``hx.installed()``'s pipeline), and each call goes to the
  compiled executable through JAX's C++ dispatch (see the module docstring for
  what that saves). ``jit_kwargs`` are ``jax.jit``'s (``donate_argnums``,
  ``keep_unused``, ...; argument positions are unchanged). The returned function
  has ``lower(*args, **kwargs)``: the ``jax.jit`` lowering of the same call over the
  components. Inside another transformation (an argument that is a tracer) it is
  ``jax.jit(fun)``.

  Like ``jax.jit``, ``hx.jit(**jit_kwargs)`` without ``fun`` is a decorator. Raises
  ``TypeError`` for ``in_shardings``/``out_shardings`` (they would name the
  components: place the arguments with ``jax.device_put`` instead) and for
  ``static_argnums``/``static_argnames`` (use ``functools.partial``), each saying so.
  """
  for key in jit_kwargs:
    if key in _REFUSED:
      raise TypeError(f"hx.jit does not take {key}: {_REFUSED[key]}; or use jax.jit")
  if fun is None:  # @hx.jit(donate_argnums=...), as jax.jit
    return functools.partial(jit, **jit_kwargs)

  def inner(*args, **kwargs):
    args, kwargs = jax.tree.map(functools.partial(_raise, build=_BY_PRIMITIVES),
                                (args, kwargs), is_leaf=_is_lo)
    return jax.tree.map(_lower_traced, fun(*args, **kwargs))

  functools.update_wrapper(inner, fun)
  jitted = jax.jit(inner, **jit_kwargs)
  plain = jax.jit(fun, **jit_kwargs)
  compiled: dict = {}

  def lower(*args, **kwargs):
    args, kwargs = jax.tree.map(_lower_concrete, (args, kwargs))
    return jitted.lower(*args, **kwargs)

  @functools.wraps(fun)
  def call(*args, **kwargs):
    lo = jax.tree.map(_lower_concrete, (args, kwargs))
    leaves, tree = jax.tree.flatten(lo)
    if any(isinstance(v, jax.core.Tracer) for v in leaves):
      return plain(*args, **kwargs)
    key = (tree, tuple(map(_leaf_key, leaves)), _jax.trace_context())
    exe = compiled.get(key)
    if exe is None:
      exe = compiled[key] = lower(*args, **kwargs).compile()
    return jax.tree.map(functools.partial(_raise, build=_BY_CONSTRUCTORS),
                        exe(*lo[0], **lo[1]), is_leaf=_is_lo)

  call.lower = lower
  call._cache_size = lambda: len(compiled)  # as jax.jit's: executables compiled so far
  return call
