"""``hx-decompose``: inlines every ``hx.*`` composite's decomposition.

Each ``stablehlo.composite "hx.*"`` op is replaced by a copy of its
decomposition's body (operands substituted for the arguments, uses of its
results redirected to the returned values), the way
``stablehlo-legalize-composite-to-call`` followed by ``inline`` would, but
touching ``hx.*`` composites only. When the composite carries
``sdy.sharding``, each replacement value goes through an
``sdy.sharding_constraint`` with that sharding, so the placement survives.
Composites nested in decompositions are inlined too. Decomposition functions
that no longer have any use are erased. Other composites, functions and calls
are left as they are. The result is plain StableHLO any consumer accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from hxmlir.passes import locations, ops, shardings, symbols
from hxmlir.passes.base import HxPass, PassContext, PassResult

_MAX_ROUNDS = 64  # nesting depth bound: a decomposition that uses itself is an error


@dataclass(frozen=True)
class DecomposePass(HxPass):
  """Replaces every ``hx.*`` composite by its inlined decomposition. No options."""
  name: ClassVar[str] = "hx-decompose"
  summary: ClassVar[str] = "inline every hx.* composite's decomposition (plain StableHLO)"

  def apply(self, module: ir.Operation, diags: PassContext) -> PassResult:
    inlined, used_decomps = 0, set()
    for _ in range(_MAX_ROUNDS):
      found = ops.hx_composites(module)
      if not found:
        break
      scopes: dict = {}  # module -> its functions (a module may nest others)
      progress = False
      for op in found:
        sym = symbols.symbol_ref(ops.attr_or_none(op, "decomposition") or ir.UnitAttr.get())
        fn = symbols.scope_funcs(op, module, scopes).get(sym) if sym else None
        if fn is None or not fn.regions[0].blocks:
          diags.error(op, f"'{ops.composite_name(op)}' cannot be inlined: decomposition "
                      f"@{sym} is not a func.func with a body in this module")
          continue
        _inline(op, fn)
        used_decomps.add(sym)
        inlined += 1
        progress = True
      if not progress:
        break
    else:
      seen = set()
      for op in ops.hx_composites(module):
        where = locations.location_str(op.location)  # inlined copies share their origin's
        if where in seen:
          continue
        seen.add(where)
        diags.error(op, f"'{ops.composite_name(op)}' is still present after inlining "
                    f"{_MAX_ROUNDS} levels: its decomposition uses itself")
    removed = symbols.erase_unused_functions(module, used_decomps)
    stats = {"composites inlined": inlined, "functions removed": removed}
    return PassResult(changed=inlined > 0, stats=stats)


def _inline(op: ir.Operation, fn: ir.Operation) -> None:
  block = fn.regions[0].blocks[0]
  mapping: dict[ir.Value, ir.Value] = dict(zip(block.arguments, op.operands))
  ip = ir.InsertionPoint(op)
  returned: list[ir.Value] = []
  for inner in block.operations:
    inner = inner.operation
    if inner.name == "func.return":
      returned = [mapping.get(v, v) for v in inner.operands]
      break
    clone = inner.clone(ip=ip)
    _remap(clone, mapping)
    for old, new in zip(inner.results, clone.results):
      mapping[old] = new
  sharding = shardings.as_per_value(ops.attr_or_none(op, "sdy.sharding"))
  if sharding is not None:
    with ip, op.location:
      returned = [sdy.ShardingConstraintOp(v, s).result
                  for v, s in zip(returned, sharding.shardings)]
  for old, new in zip(op.results, returned):
    old.replace_all_uses_with(new)
  op.erase()


def _remap(op: ir.Operation, mapping: dict) -> None:
  """Replaces operands of ``op`` and of ops nested in it that ``mapping`` renames."""
  for i, v in enumerate(op.operands):
    if v in mapping:
      op.operands[i] = mapping[v]
  for nested in ops.walk(op):
    for i, v in enumerate(nested.operands):
      if v in mapping:
        nested.operands[i] = mapping[v]
