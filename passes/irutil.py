"""Small helpers over ``jaxlib.mlir.ir`` shared by the passes and ``hxmlir-opt``.

Locations as ``file:line:col`` strings, the MLIR context JAX uses, parsing with
a source name, tensor types as the schema's :class:`TensorType`, Shardy
shardings as the schema's :data:`DimSharding`, and op walking.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from contextvars import ContextVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from hxmlir import _jax
from hxmlir.lowering import schema as _schema_module
from hxmlir.lowering.schema import DimSharding, TensorType
from hxmlir.passes.parsing import is_bytecode as is_bytecode
from hxmlir.passes.parsing import make_context as make_context
from hxmlir.passes.parsing import parse_module as parse_module

# --- locations ---------------------------------------------------------------

def _cast(loc: ir.Location, cls):
  if isinstance(loc, cls):
    return loc
  try:
    return cls(loc)
  except (ValueError, TypeError):
    return None


def _file_locs(loc: ir.Location) -> Iterator[ir.FileLineColLoc]:
  """Every ``FileLineColLoc`` in ``loc``: callee before caller, fused in order."""
  if (f := _cast(loc, ir.FileLineColLoc)) is not None:
    yield f
  elif (n := _cast(loc, ir.NameLoc)) is not None:
    yield from _file_locs(n.child_loc)
  elif (c := _cast(loc, ir.CallSiteLoc)) is not None:
    yield from _file_locs(c.callee)
    yield from _file_locs(c.caller)
  elif (fused := _cast(loc, ir.FusedLoc)) is not None:
    for sub in fused.locations:
      yield from _file_locs(sub)


# Frames inside hxmlir itself (hi primitives, lowering rules) are skipped, the way
# JAX drops its own frames from tracebacks: the user's line is the one that matters.
_OWN_DIRS = tuple(os.path.dirname(m.__file__) + os.sep
                  for m in (_jax, _schema_module, sys.modules[__name__]))


def location_str(loc: ir.Location) -> str:
  """``"file:line:col"`` for ``loc``: its first file position outside hxmlir, else ``<unknown>``.

  IR lowered by JAX carries the user's Python file and line inside name and
  call-site locations (frames in hxmlir's own packages are skipped when a user
  frame exists); IR parsed from a file carries the file's line and column.
  """
  found = list(_file_locs(loc))
  if not found:
    return "<unknown>"
  user = [f for f in found if not f.filename.startswith(_OWN_DIRS)]
  f = (user or found)[0]
  return f"{f.filename}:{f.start_line}:{f.start_col}"


# --- types and walking -------------------------------------------------------

def tensor_type(t: ir.Type) -> TensorType | None:
  """The schema's ``TensorType`` of a statically shaped ranked tensor, else ``None``."""
  if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
    return None
  return TensorType(tuple(t.shape), str(t.element_type))


def walk(op: ir.Operation, names: frozenset[str] | None = None) -> list[ir.Operation]:
  """Every op nested in ``op`` (pre-order, ``op`` excluded), as ``ir.Operation``.

  With ``names``, only ops of those names. Uses MLIR's own walker (one Python
  callback per op, no generator frames): the passes run inside every lowering
  while installed, so this is their hot loop. The list is a snapshot, safe to
  mutate the IR while iterating over it.
  """
  top = op.operation if hasattr(op, "operation") else op
  out: list[ir.Operation] = []
  append = out.append
  if names is None:
    def visit(o):
      append(o)
      return ir.WalkResult.ADVANCE
  else:
    def visit(o):
      if o.name in names:
        append(o)
      return ir.WalkResult.ADVANCE
  top.walk(visit, ir.WalkOrder.PRE_ORDER)
  if out and out[0] == top:
    out.pop(0)
  return out


# One walk per pipeline run serves every pass that only looks ops up by name:
# Pipeline.run opens a cache, and drops it after each pass that changed the IR.
_op_index: ContextVar[dict | None] = ContextVar("hxmlir_op_index", default=None)


@contextlib.contextmanager
def op_index_scope():
  """While open, :func:`ops_named` answers from one shared walk of the module."""
  token = _op_index.set({})
  try:
    yield
  finally:
    _op_index.reset(token)


def invalidate_op_index() -> None:
  """Forget the shared walk (call after the IR changed)."""
  cache = _op_index.get()
  if cache is not None:
    cache.clear()


# Index entries that are not op names (an op name always contains a ".").
_SHARDED = "sdy.sharding attribute"  # ops carrying an ``sdy.sharding`` attribute
_ANY_SHARDING = "any sharding"  # cached answer of may_have_shardings


def _index(module: ir.Operation) -> dict:
  """``{op name: [ops]}`` of ``module`` (plus :data:`_SHARDED`), shared in an op index scope."""
  top = module.operation if hasattr(module, "operation") else module
  cache = _op_index.get()
  index = None if cache is None else cache.get(top)
  if index is None:
    index = {}
    advance = ir.WalkResult.ADVANCE

    def visit(o):
      index.setdefault(o.name, []).append(o)
      if "sdy.sharding" in o.attributes:
        index.setdefault(_SHARDED, []).append(o)
      return advance
    top.walk(visit, ir.WalkOrder.PRE_ORDER)
    if cache is not None:
      cache[top] = index
  return index


def ops_named(module: ir.Operation, *names: str) -> list[ir.Operation]:
  """Ops named ``names`` nested in ``module``, in walk order per name (a snapshot list)."""
  if _op_index.get() is None:
    return walk(module, frozenset(names))
  index = _index(module)
  return [o for n in names for o in index.get(n, ())]


def may_have_shardings(module: ir.Operation) -> bool:
  """Whether any value in ``module`` can have a sharding :func:`value_sharding_attr` reads.

  ``False`` when no op carries an ``sdy.sharding`` attribute, no op is an
  ``sdy.sharding_constraint`` and no function argument has an ``sdy.sharding``
  attribute: :func:`value_sharding_attr` is then ``None`` for every value, and
  callers may skip asking. Exact (not a guess from mesh declarations); inside
  :func:`op_index_scope` it costs nothing beyond the shared walk.
  """
  index = _index(module)
  got = index.get(_ANY_SHARDING)
  if got is None:
    got = index[_ANY_SHARDING] = (
        _SHARDED in index or "sdy.sharding_constraint" in index or
        any(_arg_shardings(fn.regions[0].blocks[0]) is not None
            for fn in func_ops(module).values() if fn.regions[0].blocks))  # declarations
  return got


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
  """The nearest ``builtin.module`` holding ``op`` (the symbol table its symbols resolve in)."""
  parent = op.parent
  while parent is not None and parent.name != "builtin.module":
    parent = parent.parent
  return None if parent is None else parent.operation


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




def is_hx_composite(op: ir.Operation) -> bool:
  """Whether ``op`` is ``stablehlo.composite`` with a name in the ``hx.`` namespace."""
  if op.name != "stablehlo.composite" or "name" not in op.attributes:
    return False
  return ir.StringAttr(op.attributes["name"]).value.startswith(_schema_module.PREFIX)


def composite_name(op: ir.Operation) -> str:
  """The ``name`` of a ``stablehlo.composite`` op (``"hx.matmul_q"``)."""
  return ir.StringAttr(op.attributes["name"]).value


def has_hx_ops(module: ir.Operation) -> bool:
  """Whether any ``stablehlo.composite "hx.*"`` op is nested in ``module`` (stops at the first)."""
  found = False

  def visit(op):
    nonlocal found
    if is_hx_composite(op):
      found = True
      return ir.WalkResult.INTERRUPT
    return ir.WalkResult.ADVANCE
  (module.operation if hasattr(module, "operation") else module).walk(visit)
  return found


# --- shardings ---------------------------------------------------------------

def as_tensor_sharding(attr: ir.Attribute | None) -> sdy.TensorShardingAttr | None:
  """``attr`` as ``#sdy.sharding<...>`` (``TensorShardingAttr``), or ``None`` if it is not one."""
  if attr is None or not sdy.TensorShardingAttr.isinstance(attr):
    return None
  return sdy.TensorShardingAttr(attr)


def as_per_value(attr: ir.Attribute | None) -> sdy.TensorShardingPerValueAttr | None:
  """``attr`` as ``#sdy.sharding_per_value<[...]>``, or ``None`` if it is not one."""
  if attr is None or not sdy.TensorShardingPerValueAttr.isinstance(attr):
    return None
  return sdy.TensorShardingPerValueAttr(attr)


def dim_sharding(attr: ir.Attribute | None, rank: int | None = None) -> DimSharding | None:
  """A ``#sdy.sharding`` as the schema's ``DimSharding``, or ``None`` when unknown.

  Each dimension becomes the tuple of its axis names (sub-axes spelled
  ``"x:(1)2"``). Open dimensions (``{?}``, ``{"x", ?}``) may be sharded further
  by propagation, so a sharding with any open dimension counts as unknown, as
  does a rank that differs from ``rank``.
  """
  attr = as_tensor_sharding(attr)
  if attr is None:
    return None
  dims = []
  for d in attr.dimension_shardings:
    d = sdy.DimensionShardingAttr(d)
    if not d.is_closed:
      return None
    names = []
    for a in d.axes:
      a = sdy.AxisRefAttr(a)
      sub = a.sub_axis_info
      if sub is not None:
        sub = sdy.SubAxisInfoAttr(sub)
        names.append(f"{a.name}:({sub.pre_size}){sub.size}")
      else:
        names.append(a.name)
    dims.append(tuple(names))
  if rank is not None and len(dims) != rank:
    return None
  return tuple(dims)


def result_sharding_attr(op: ir.Operation, index: int) -> ir.Attribute | None:
  """Result ``index``'s ``TensorShardingAttr`` from ``op``'s ``sdy.sharding`` (or ``None``)."""
  attrs = op.attributes
  if "sdy.sharding" in attrs:
    attr = as_per_value(attrs["sdy.sharding"])
    if attr is None:
      return None
    shardings = attr.shardings
    return shardings[index] if index < len(shardings) else None
  if "sharding" in attrs and op.name == "sdy.sharding_constraint":
    return attrs["sharding"]
  return None


def _block_arg_shardings(block: ir.Block) -> tuple | None:
  """The ``sdy.sharding`` argument attribute of each argument of ``block`` if it is a
  function's entry block (``None`` entries for arguments without one), else ``None``."""
  owner = block.owner
  if owner is None or owner.operation.name != "func.func":
    return None
  attrs = owner.operation.attributes
  if "arg_attrs" not in attrs:
    return None
  arg_attrs = attrs["arg_attrs"]
  if "sdy.sharding" not in str(arg_attrs):  # one print beats a DictAttr per argument
    return None
  out = []
  for a in ir.ArrayAttr(arg_attrs):
    d = ir.DictAttr(a)
    out.append(d["sdy.sharding"] if "sdy.sharding" in d else None)
  return tuple(out) if any(x is not None for x in out) else None


_BLOCK_ARGS = object()  # key of the block-argument sharding cache in the op index


def value_sharding_attr(value: ir.Value) -> ir.Attribute | None:
  """The sharding fixed for ``value``: by its defining op or its function argument attribute.

  An ``sdy.sharding_constraint`` result has the constraint's sharding; another
  op result the entry of its op's ``sdy.sharding``; a function argument its
  ``sdy.sharding`` argument attribute. ``None`` when nothing fixes it. Inside
  :func:`op_index_scope`, function argument shardings are read once per
  function (passes never change function signatures).
  """
  if isinstance(value, ir.OpResult):
    return result_sharding_attr(value.owner, value.result_number)
  if isinstance(value, ir.BlockArgument):
    shardings = _arg_shardings(value.owner)
    if shardings is None or value.arg_number >= len(shardings):
      return None
    return shardings[value.arg_number]
  return None


def _arg_shardings(block: ir.Block) -> tuple | None:
  """:func:`_block_arg_shardings`, read once per block inside :func:`op_index_scope`."""
  cache = _op_index.get()
  if cache is None:
    return _block_arg_shardings(block)
  blocks = cache.get(_BLOCK_ARGS)
  if blocks is None:
    blocks = cache[_BLOCK_ARGS] = {}
  shardings = blocks.get(block, _BLOCK_ARGS)
  if shardings is _BLOCK_ARGS:
    shardings = blocks[block] = _block_arg_shardings(block)
  return shardings


def value_sharding(value: ir.Value) -> DimSharding | None:
  """:func:`value_sharding_attr` as the schema's ``DimSharding`` (``None`` when unknown)."""
  t = value.type
  rank = t.rank if isinstance(t, ir.RankedTensorType) else None
  return dim_sharding(value_sharding_attr(value), rank)


# --- symbols -------------------------------------------------------------------

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


def attr_or_none(op: ir.Operation, key: str) -> ir.Attribute | None:
  """``op``'s attribute ``key``, or ``None`` when it has none or the Python bindings cannot
  represent it.

  jaxlib's bindings raise ``TypeError`` for a dense elements attribute of an element
  type they have no class for (``dense<(1.0,2.0)> : tensor<complex<f32>>``), and abort
  the process if such an attribute is printed through a ``NamedAttribute``; such an
  attribute holds numbers only (no symbol, no sharding), so callers that scan
  attributes may skip it.
  """
  if key not in op.attributes:
    return None
  try:
    return op.attributes[key]
  except TypeError:
    return None


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
