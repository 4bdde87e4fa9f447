"""What ``hx-fold-scales``' rewrites share: the per-run state, op creation with a
sharding, the dot result's sharding, the default-precision check and dead-op erasure."""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from hxmlir.passes import ops, shardings, symbols
from hxmlir.passes.fold_scales.match import owner

_ERASABLE = ("stablehlo.multiply", "stablehlo.convert", "stablehlo.broadcast_in_dim",
             "stablehlo.reshape", "stablehlo.transpose", "sdy.sharding_constraint")


@dataclass
class State:
  """Per-run state: the decomposition to build for ``hx.matmul_q`` (``impl``),
  decompositions built (by signature), decompositions of erased ops."""
  impl: str = "reference"
  decompositions: dict = field(default_factory=dict)
  dropped: set = field(default_factory=set)


def _per_value(attr: ir.Attribute | None) -> ir.Attribute | None:
  return None if attr is None else sdy.TensorShardingPerValueAttr.get([attr])


def create(name: str, result: ir.Type, operands, attrs=None, sharding=None) -> ir.Value:
  """A new op ``name`` (at the current insertion point) of one ``result`` type; ``sharding``
  (an ``#sdy.sharding``, or ``None``) becomes its ``sdy.sharding``. Its result."""
  attrs = dict(attrs or {})
  if sharding is not None:
    attrs["sdy.sharding"] = _per_value(sharding)
  op = ir.Operation.create(name, results=[result], operands=list(operands), attributes=attrs)
  return op.result


def result_sharding(dot: ir.Operation) -> ir.Attribute | None:
  """The sharding of ``dot``'s result: its own ``sdy.sharding``, else that of a sharding
  constraint on it, else ``None``."""
  got = shardings.result_sharding_attr(dot, 0)
  if got is not None:
    return got
  for use in dot.result.uses:
    if use.owner.operation.name == "sdy.sharding_constraint":
      return use.owner.operation.attributes["sharding"]
  return None


def erase_dead(op: ir.Operation | None, dropped: set[str]) -> None:
  """Erases ``op`` and, recursively, its operands' definers, while they are unused and pure.

  Adds the decomposition symbols of erased composites to ``dropped``.
  """
  if op is None:
    return
  pure = op.name in _ERASABLE or (ops.is_hx_composite(op) and
                                  ops.composite_name(op) == "hx.dequantize")
  if not pure or any(True for r in op.results for _ in r.uses):
    return
  defs = [owner(v) for v in op.operands]
  if "decomposition" in op.attributes:
    dropped.add(symbols.symbol_ref(op.attributes["decomposition"]))
  op.erase()
  for d in defs:
    erase_dead(d, dropped)


def default_precision(dot: ir.Operation) -> bool:
  """Whether ``dot`` has no algorithm and default precision (``hx.matmul_q``'s)."""
  if "algorithm" in dot.attributes:
    return False
  return "precision_config" not in dot.attributes or all(
      "DEFAULT" in str(p) for p in ir.ArrayAttr(dot.attributes["precision_config"]))
