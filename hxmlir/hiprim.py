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

import jax
from jax.experimental.hijax import HiType, VJPHiPrimitive, Zero

from hxmlir._jax import GradAccum, stage_value


class HxPrimitive(VJPHiPrimitive):
  """A hi primitive whose ``to_lojax`` rule is registered by ``hxmlir.lowering``.

  Subclasses set ``in_avals``, ``out_aval`` and ``params`` in ``__init__`` (and
  raise ``TypeError`` there, naming the operand types, on bad operands) and
  implement the autodiff and batching rules they support. Primitives that a
  jvp rule applies to tangents (``matmul_q(dx, qw)``, ``make_tup(*dts)``, ...)
  also implement ``transpose``, which ``jax.checkpoint`` and ``jax.linearize``
  followed by transposition need; ``lin``/``linearized`` come from ``jvp``.
  """

  _to_lojax: Callable | None = None

  def expand(self, *args):
    rule = type(self)._to_lojax
    if rule is None:
      raise NotImplementedError(
          f"{type(self).__name__} has no to_lojax rule: hxmlir.lowering was not imported")
    return _stage_lo_outputs(self.out_aval, rule(self, *args))

  # ``jax.linearize``: the jvp rule, split into its primal and tangent halves.
  # The residuals are the primals themselves; the tangent half re-derives the
  # linear map from them (its primal output is dead code and DCE'd).
  def lin(self, nzs_in, *primals):
    return self(*primals), primals

  def linearized(self, primals, *tangents):
    return self.jvp(primals, tangents)[1]


def _stage_lo_outputs(aval, out):
  """``out`` with each lo (array-typed) result that is a concrete array made a tracer.

  Rules that pass a component through (``get_tuple_element``, ``factors``) return
  a concrete array when their operand is a closed-over hi constant (``jit`` of
  ``lambda y: get_tuple_element(t, 0) + y``); JAX's ``lower_jaxpr`` needs a tracer
  of the trace it builds there, so the array is staged as a constant of it. Hi
  results are left alone: only hi rules (which bind lo primitives) consume them.
  """
  if isinstance(aval, tuple):
    return tuple(_stage_lo_outputs(a, o) for a, o in zip(aval, out))
  if isinstance(aval, HiType) or isinstance(out, jax.core.Tracer):
    return out
  return stage_value(out)


def is_linear_operand(x) -> bool:
  """In a ``transpose`` rule: whether operand ``x`` is linear (a gradient accumulator)."""
  return isinstance(x, GradAccum)


def accumulate(acc, ct) -> None:
  """Add cotangent ``ct`` into accumulator ``acc`` unless it is a symbolic zero."""
  if not isinstance(ct, Zero):
    acc.accum(ct)


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
