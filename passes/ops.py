"""Finding ops: walks, the shared op index of a pipeline run, tensor types, attributes,
and the ``hx.*`` composites.

The op index is one walk per pipeline run, shared by every pass that only looks
ops up by name (:func:`ops_named`); ``Pipeline.run`` opens it and drops it after
each pass that changed the IR. :mod:`hxmlir.passes.shardings` keeps its caches
in it too (:func:`index`, :func:`index_cache`).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

from jaxlib.mlir import ir

from hxmlir.lowering import schema as _schema_module
from hxmlir.lowering.schema import TensorType


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


def index(module: ir.Operation) -> dict:
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
  found = index(module)
  return [o for n in names for o in found.get(n, ())]


def index_cache() -> dict | None:
  """The open op index's cache (a dict callers may add keys to), or ``None`` outside
  :func:`op_index_scope`."""
  return _op_index.get()


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


def hx_composites(module: ir.Operation) -> list[ir.Operation]:
  """Every ``stablehlo.composite "hx.*"`` op nested in ``module``, in walk order (a fresh
  walk, never the op index: callers rewrite the module between calls)."""
  return [op for op in walk(module, frozenset({"stablehlo.composite"})) if is_hx_composite(op)]
