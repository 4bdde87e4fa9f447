"""Functions and symbols: a module's functions by name, the function or module an op
sits in, symbol references and their uses, erasing functions nothing uses."""

from __future__ import annotations

import re

from jaxlib.mlir import ir

from hxmlir.lowering import composite as _composite
from hxmlir.passes.ops import attr_or_none, ops_named, walk


def func_name(fn: ir.Operation | None) -> str | None:
  """The symbol name of a ``func.func`` op (``None`` for ``None``)."""
  return None if fn is None else ir.StringAttr(fn.attributes["sym_name"]).value


def enclosing_func(op: ir.Operation) -> ir.Operation | None:
  """The ``func.func`` holding ``op``, or ``None``."""
  parent = op.parent
  while parent is not None and parent.name != "func.func":
    parent = parent.parent
  return parent


def enclosing_module(op: ir.Operation) -> ir.Operation | None:
  """The nearest ``builtin.module`` holding ``op`` (the symbol table its symbols resolve
  in), or ``None``; the lowering's :func:`hxmlir.lowering.composite.enclosing_module`
  asked at ``op``."""
  try:
    return _composite.enclosing_module(ir.InsertionPoint(op))
  except ValueError:
    return None


def scope_funcs(op: ir.Operation, top: ir.Operation, cache: dict) -> dict[str, ir.Operation]:
  """:func:`func_ops` of the module ``op``'s symbols resolve in: ``top`` itself unless
  ``op`` sits in a module nested in it. ``cache`` (a dict the caller keeps) holds
  one entry per module."""
  scope = enclosing_module(op) if len(ops_named(top, "builtin.module")) > 1 else None
  if scope is None:
    scope = top.operation if hasattr(top, "operation") else top
  funcs = cache.get(scope)
  if funcs is None:
    funcs = cache[scope] = func_ops(scope)
  return funcs


def func_ops(module: ir.Operation) -> dict[str, ir.Operation]:
  """The module's top-level ``func.func`` ops keyed by symbol name."""
  out = {}
  for op in module.regions[0].blocks[0].operations:
    op = op.operation
    if op.name == "func.func":
      out[ir.StringAttr(op.attributes["sym_name"]).value] = op
  return out


def symbol_ref(attr: ir.Attribute) -> str | None:
  """The name of a flat symbol reference attribute, else ``None``."""
  if isinstance(attr, ir.FlatSymbolRefAttr):
    return attr.value
  return None


_SYMBOL = re.compile(r'@("(?:[^"\\]|\\.)*"|[\w.$-]+)')


def symbol_uses(module: ir.Operation) -> set[str]:
  """Names of every symbol referenced by an attribute of an op in ``module``."""
  used = set()
  for op in walk(module):
    for key in op.attributes:
      if key in ("sym_name", "function_type", "arg_attrs", "res_attrs"):
        continue
      attr = attr_or_none(op, key)
      if attr is None:
        continue
      for m in _SYMBOL.finditer(str(attr)):
        used.add(m.group(1).strip('"'))
  return used


def erase_unused_functions(module: ir.Operation, candidates: set[str]) -> int:
  """Erases the private functions among ``candidates`` that nothing references any more."""
  used = symbol_uses(module)
  funcs = func_ops(module)
  removed = 0
  for sym in sorted(candidates):
    fn = funcs.get(sym)
    vis = attr_or_none(fn, "sym_visibility") if fn is not None else None
    if fn is not None and sym not in used and vis is not None and \
       ir.StringAttr(vis).value == "private":
      fn.erase()
      removed += 1
  return removed
