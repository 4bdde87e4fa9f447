"""``jax.export``: portable bytecode, recorded shardings, and the custom-call allow-list
widened per exporting thread.

Part of the JAX seam (:mod:`hxmlir._jax`).
"""

from __future__ import annotations

# --- export: portable artifacts and the custom-call allow-list (export/, installation.py)
import copy as _copy

from jax._src.export import _export as _export_internal

module_to_portable_bytecode = _export_internal._module_to_bytecode
"""Serializes an ``ir.Module`` as ``jax.export`` does (VHLO portable artifact, 4-week target)."""


def in_named_shardings(exported) -> tuple:
  """The ``NamedSharding`` s (or ``None`` s) of a ``jax.export.Exported``'s arguments,
  as ``jax.export`` recorded them (empty when it recorded none)."""
  return tuple(getattr(exported, "_in_named_shardings", ()))


def out_named_shardings(exported) -> tuple:
  """Like :func:`in_named_shardings`, for the results."""
  return tuple(getattr(exported, "_out_named_shardings", ()))


_JAX_STABLE = _export_internal._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE  # JAX's set


def jax_stable_custom_call_targets() -> frozenset[str]:
  """The custom-call targets JAX itself guarantees stable (what ``jax.export`` accepts
  by default), never with what :func:`scope_export_allow_list` adds."""
  return frozenset(_JAX_STABLE)


def export_allowed_custom_call_targets() -> frozenset[str]:
  """What ``jax.export`` accepts in this thread now: JAX's targets plus those a
  scoped allow-list adds for this thread."""
  return frozenset(_copy.copy(_export_internal._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE))


class _ThreadScopedTargets(set):
  """JAX's allow-list with targets added per thread (stands in for JAX's set).

  ``jax.export``'s ``_check_module`` reads ``copy.copy(<the set>)`` in the
  exporting thread, after lowering; ``__copy__`` answers there with JAX's targets
  plus ``extra()`` (evaluated in that thread). JAX's own set stays the storage:
  additions and removals go to it, so nothing is lost when it is put back.
  """

  def __init__(self, base: set, extra):
    super().__init__()
    self._base, self._extra = base, extra

  def __copy__(self) -> set:
    return set(self._base) | set(self._extra())

  def __contains__(self, target) -> bool:
    return target in self._base or target in self._extra()

  def __iter__(self):
    return iter(self.__copy__())

  def __len__(self) -> int:
    return len(self.__copy__())

  def __repr__(self) -> str:
    return f"{type(self).__name__}({sorted(self.__copy__())!r})"

  def add(self, target) -> None:
    self._base.add(target)

  def discard(self, target) -> None:
    self._base.discard(target)

  def remove(self, target) -> None:
    self._base.remove(target)


def scope_export_allow_list(extra) -> None:
  """Widens ``jax.export``'s custom-call allow-list by ``extra()``, per exporting thread.

  ``extra``: a function of no arguments returning the targets to accept in the
  thread that calls it (``hx.install`` answers with hxmlir's registered kernel
  targets in threads where it is installed, nothing elsewhere). Replaces JAX's
  set by a stand-in that delegates to it (:class:`_ThreadScopedTargets`); a
  second call replaces ``extra``. Undone by :func:`unscope_export_allow_list`.
  """
  _export_internal._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE = _ThreadScopedTargets(_JAX_STABLE, extra)


def unscope_export_allow_list() -> None:
  """Puts JAX's own allow-list back (idempotent)."""
  _export_internal._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE = _JAX_STABLE

