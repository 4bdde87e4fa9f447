"""Base class of hxmlir's hi primitives, and the hook their lowering plugs into.

A hi primitive (``jax.experimental.hijax.VJPHiPrimitive``) declares its input
and output types and its autodiff and batching rules in ``hxmlir``; its
``to_lojax`` rule -- the ``expand`` method that JAX calls when it lowers a hi
jaxpr to ordinary (lo) arrays -- lives in ``hxmlir.lowering`` and binds lo
primitives there. The dependency runs types -> lowering: ``hxmlir.lowering``
registers each rule with :func:`register_to_lojax` when it is imported.
"""

from __future__ import annotations

from collections.abc import Callable

from jax.experimental.hijax import VJPHiPrimitive


class HxPrimitive(VJPHiPrimitive):
  """A hi primitive whose ``to_lojax`` rule is registered by ``hxmlir.lowering``.

  Subclasses set ``in_avals``, ``out_aval`` and ``params`` in ``__init__`` (and
  raise ``TypeError`` there, naming the operand types, on bad operands) and
  implement the autodiff and batching rules they support.
  """

  _to_lojax: Callable | None = None

  def expand(self, *args):
    rule = type(self)._to_lojax
    if rule is None:
      raise NotImplementedError(
          f"{type(self).__name__} has no to_lojax rule: hxmlir.lowering was not imported")
    return rule(self, *args)


def register_to_lojax(prim_cls: type[HxPrimitive]) -> Callable[[Callable], Callable]:
  """Decorator registering ``fn(prim, *args)`` as ``prim_cls``'s to_lojax rule.

  ``args`` are the primitive's operands with hi values as their value classes
  (``QArray``, ``Rank1``, ``HiTup``) holding lo arrays; ``fn`` returns the
  result in the same form. Raises ``ValueError`` if a rule is already set.
  """
  def deco(fn: Callable) -> Callable:
    if prim_cls.__dict__.get("_to_lojax") is not None:
      raise ValueError(f"to_lojax rule for {prim_cls.__name__} registered twice")
    prim_cls._to_lojax = fn
    return fn
  return deco
