"""``hx.jit``: ``jax.jit`` whose concrete hi arguments and results cross the call as lo arrays.

Where hxmlir is installed (``hx.install()``, or an ``hx.installed()`` block in this
thread), ``jax.jit`` itself calls hi code through JAX's C++ dispatch
(:mod:`hxmlir._jax.fastpath`: the hi jaxpr is lowered before JAX caches its executable,
and the C++ path flattens ``q8``/``r1``/``Tup`` values to their components), and
:func:`jit` is ``jax.jit``. Without hxmlir installed, JAX 0.10.2 calls a jitted function
whose jaxpr holds a hi equation, argument or result (``q8``, ``r1``, ``Tup``) through its
Python dispatch path on every call: every argument leaf, arrays included, is checked in
Python, where a call with plain arrays takes JAX's C++ path (all-MiniLM-L6-v2's 36
``q8`` weights and ~100 other parameters cost about 1.8 ms per call on the development
machine, a step being ~20 ms).

There :func:`jit` passes each concrete hi value as its lo components instead (a
``q8`` as its values and scales, and offsets for a format with one, an ``r1`` as its factors, a ``Tup`` as its
elements) to a ``jax.jit`` of a function that rebuilds it (``hx.make_qarray``,
``hx.outer``, ``hx.make_tup``), calls the user's function, takes hi results
apart, and is traced with its hi equations lowered to lo ones at once
(:func:`hxmlir._jax.trace_lowered`). JAX then sees a function of arrays made of
lo equations, keeps it in its C++ cache (keyed by the pytree structure, each
array's shape, dtype, weak type and sharding, and the trace context, which holds
``hx.installed()``'s pipeline) and calls it through its C++ dispatch; hi results
come back rebuilt. The program is the one ``jax.jit``
compiles (``jax.jit`` lowers a hi jaxpr by the same ``to_lojax`` rules before
compiling it). Called while a transformation traces (``jit``, ``grad``, ``vmap``,
...) nothing is rewritten: the call is ``jax.jit``'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from hxmlir import _jax
from hxmlir.install_state import STATE as _state
from hxmlir.types.qarray import QArray, QArrayTy, make_qarray, qarray_parts
from hxmlir.types.rank1 import Rank1, Rank1Ty, factors, outer
from hxmlir.types.tuples import HiTup, TupTy, get_tuple_element, make_tup


class _Lo:
  """A hi value as its lo components: a pytree node whose child is the tuple of
  components (arrays, or ``_Lo`` for hi elements of a tuple) and whose aux data is the
  kind. Registered as a dataclass node: JAX's C++ pytree code flattens it without
  calling Python, where a ``register_pytree_node_class`` node costs a Python call per
  node; plain slots, as a frozen dataclass's ``__init__`` costs ~1 us more per value."""

  __slots__ = ("kind", "parts")

  def __init__(self, kind: type, parts: tuple):
    self.kind, self.parts = kind, parts


jax.tree_util.register_dataclass(_Lo, data_fields=["parts"], meta_fields=["kind"])


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


_CONCRETE_PARTS = {QArray: (QArray, lambda v: v.components),  # all of them (an offset too)
                   Rank1: (Rank1, lambda v: (v.col, v.row)),
                   HiTup: (HiTup, lambda v: v.elts)}
"""Before the call: a concrete value's stored components, by the value's class."""
_TRACED_PARTS = {QArrayTy: (QArray, qarray_parts), Rank1Ty: (Rank1, factors),
                 TupTy: (HiTup, lambda v: [get_tuple_element(v, i)
                                           for i in range(len(jax.typeof(v).tys))])}
"""Inside the jitted function: a traced result's components, by its type's class."""


def _lower_concrete(v) -> Any:
  return _lower(v, _CONCRETE_PARTS, type)


def _lower_arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
  """``(args, kwargs)`` with every concrete hi value among their leaves as ``_Lo``. The
  per-leaf work is in C (flatten, the set of leaf types) unless a hi value is there: a
  model's step has hundreds of leaves, and this runs on every call."""
  leaves, tree = jax.tree.flatten((args, kwargs))
  if set(map(type, leaves)).isdisjoint(_CONCRETE_PARTS):
    return args, kwargs
  return tree.unflatten([_lower_concrete(v) if type(v) in _CONCRETE_PARTS else v
                         for v in leaves])


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
  rebuilt (where hxmlir is installed in the calling thread, ``jax.jit``'s own call does
  this, and ``hx.jit`` calls it). The function is traced and compiled once per signature (the pytree
  structure, each array's shape, dtype, weak type and sharding, and JAX's trace
  context, which holds ``hx.installed()``'s pipeline: ``jax.jit``'s own C++ cache),
  and each call goes to the compiled executable through JAX's C++ dispatch (see
  the module docstring for what that saves). ``jit_kwargs`` are ``jax.jit``'s
  (``donate_argnums``, ``keep_unused``, ...; argument positions are unchanged). The
  returned function has ``lower(*args, **kwargs)``: the ``jax.jit`` lowering of the same call over the
  components. Inside another transformation (called while ``jit``, ``grad``, ``vmap``
  ... trace, with tracers or concrete values) it is ``jax.jit(fun)``.

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

  def lo_fun(*args, **kwargs):  # lo in, lo out, and lo equations only: JAX's C++ path
    return _jax.trace_lowered(inner, *args, **kwargs)

  functools.update_wrapper(lo_fun, fun)
  jitted = jax.jit(lo_fun, **jit_kwargs)
  plain = jax.jit(fun, **jit_kwargs)

  def lower(*args, **kwargs):
    args, kwargs = _lower_arguments(args, kwargs)
    return jitted.lower(*args, **kwargs)

  @functools.wraps(fun)
  def call(*args, **kwargs):
    # installed in this thread, jax.jit's call of hi code takes JAX's C++ path itself
    # (hx.install puts it there); staged into a transformation, the call is jax.jit's
    if _state.value is not None or not _jax.at_top_level():
      return plain(*args, **kwargs)
    args, kwargs = _lower_arguments(args, kwargs)
    return jax.tree.map(functools.partial(_raise, build=_BY_CONSTRUCTORS),
                        jitted(*args, **kwargs), is_leaf=_is_lo)

  call.lower = lower
  # as jax.jit's: executables compiled so far (installed or not)
  call._cache_size = lambda: jitted._cache_size() + plain._cache_size()
  return call
