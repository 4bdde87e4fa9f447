"""``hx-fold-scales``' int8 fold: an int8-per-row dequantization's scale moved onto the dot's
other operand or onto its result (see :mod:`hxmlir.passes.fold_scales`), or the dot formed
into ``hx.matmul_q`` where it is exactly its contract."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy
from jaxlib.mlir.dialects import stablehlo as hlo

from hxmlir.passes import shardings
from hxmlir.passes.fold_scales.int8_matmul_q import try_matmul_q
from hxmlir.passes.fold_scales.match import Dequant, owner, static
from hxmlir.passes.fold_scales.rewrite import State, create, erase_dead, result_sharding


def fold(module, dot: ir.Operation, side: int, m: Dequant, state: State,
       form_matmul_q: bool) -> str | None:
  """Rewrites ``dot`` (its operand ``side`` matched as ``m``, int8 per row); the stats key, or
  ``None``. With ``form_matmul_q``, an exact match of ``hx.matmul_q``'s contract becomes that
  composite (:func:`try_matmul_q`)."""
  plan = _plan(dot, side, m)
  if plan is None:
    return None
  old = dot.operands[side]
  with ir.InsertionPoint(dot), dot.location:
    if form_matmul_q and plan.into == "operand" and \
       try_matmul_q(module, dot, side, m, plan.dd, state):
      erase_dead(owner(old), state.dropped)
      return "matmul_q formed"
    qf = _unscaled_operand(m, plan.dt)
    if plan.into == "operand":
      x = dot.operands[plan.other]
      sh = shardings.value_sharding_attr(x)
      b = _broadcast(m.t, m.amap, plan.to_x, plan.xt, sh)
      dot.operands[plan.other] = create("stablehlo.multiply", plan.xt, [x, b], sharding=sh)
    dot.operands[side] = qf
  if plan.into == "result":
    _scale_result(dot, m, plan)
  erase_dead(owner(old), state.dropped)
  return f"into {plan.into}"


@dataclass
class _Plan:
  """Where a matched scale goes: ``into`` ``"operand"`` (onto ``X``, operand
  ``other`` of type ``xt``, axes mapped by ``to_x``) or ``"result"`` (onto the
  dot's result of type ``rt``, axes mapped by ``to_r``); ``dt``: the dequantized
  operand's type; ``dd``: the dot's dimension numbers."""
  into: str
  other: int
  xt: ir.RankedTensorType
  rt: ir.RankedTensorType
  dt: ir.RankedTensorType
  to_x: dict[int, int]
  to_r: dict[int, int]
  dd: object


def _plan(dot: ir.Operation, side: int, m: Dequant) -> _Plan | None:
  """Where the scale of ``m`` (operand ``side`` of ``dot``) can go, or ``None`` when it
  does not factor (scaled along contracting and free axes) or the types do not fit."""
  dd = hlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
  batch = [list(dd.lhs_batching_dimensions), list(dd.rhs_batching_dimensions)]
  contract = [list(dd.lhs_contracting_dimensions), list(dd.rhs_contracting_dimensions)]
  other = 1 - side
  xt, rt = static(dot.operands[other].type), static(dot.result.type)
  dt = ir.RankedTensorType(dot.operands[side].type)
  if xt is None or rt is None or xt.element_type != dt.element_type or \
     str(rt.element_type) != "f32":
    return None
  tt = ir.RankedTensorType(m.t.type)
  scaled = {a for j, a in enumerate(m.amap) if a is not None and tt.shape[j] != 1}
  free = [a for a in range(dt.rank) if a not in batch[side] and a not in contract[side]]
  if scaled & set(contract[side]) and scaled & set(free):
    return None
  to_x = dict(zip(batch[side], batch[other])) | dict(zip(contract[side], contract[other]))
  lhs_free = [a for a in range(ir.RankedTensorType(dot.operands[0].type).rank)
              if a not in batch[0] and a not in contract[0]]
  offset = len(batch[side]) + (0 if side == 0 else len(lhs_free))
  to_r = {a: i for i, a in enumerate(batch[side])} | \
         {a: offset + i for i, a in enumerate(free)}
  if scaled & set(contract[side]):
    into = "operand"
  elif scaled & set(free):
    into = "result"
  else:
    into = "operand" if prod(xt.shape) <= prod(rt.shape) else "result"
  return _Plan(into, other, xt, rt, dt, to_x, to_r, dd)


def _unscaled_operand(m: Dequant, dt: ir.RankedTensorType) -> ir.Value:
  """``Q`` in place of ``D``: ``convert(q)`` (reused when the match has one) through the
  match's transpose and sharding constraints, typed ``dt``."""
  qf = m.qf
  if qf is None:
    qt = ir.RankedTensorType(m.q.type)
    qf = create("stablehlo.convert", ir.RankedTensorType.get(list(qt.shape), dt.element_type),
                 [m.q], sharding=shardings.value_sharding_attr(m.q))
  for c in reversed(m.inner):
    qf = sdy.ShardingConstraintOp(qf, c.attributes["sharding"]).result
  if m.perm is not None:
    qf = create("stablehlo.transpose", dt, [qf],
                 {"permutation": ir.DenseI64ArrayAttr.get(m.perm)})
  for c in reversed(m.constraints):
    qf = sdy.ShardingConstraintOp(qf, c.attributes["sharding"]).result
  return qf


def _scale_result(dot: ir.Operation, m: Dequant, plan: _Plan) -> None:
  """Multiplies ``dot``'s result by the broadcast scale; every use takes the product."""
  sh = result_sharding(dot)
  with ir.InsertionPoint(dot), dot.location:
    b = _broadcast(m.t, m.amap, plan.to_r, plan.rt, sh)
    mul = create("stablehlo.multiply", plan.rt, [dot.result, b], sharding=sh)
  dot.move_before(mul.owner)
  dot.result.replace_all_uses_except(mul, mul.owner.operation)


def _broadcast(t: ir.Value, amap: list[int | None], axis_map: dict[int, int],
               target: ir.RankedTensorType, sharding) -> ir.Value:
  """``t`` broadcast onto ``target``'s shape: dim ``j`` of ``t`` -> ``axis_map[amap[j]]``."""
  tt = ir.RankedTensorType(t.type)
  keep = [j for j, a in enumerate(amap) if a is not None and a in axis_map]
  if len(keep) != tt.rank:
    shape = [tt.shape[j] for j in keep]
    t = create("stablehlo.reshape", ir.RankedTensorType.get(shape, tt.element_type), [t])
  dims = [axis_map[amap[j]] for j in keep]
  order = sorted(range(len(dims)), key=lambda i: dims[i])
  if order != list(range(len(dims))):
    cur = ir.RankedTensorType(t.type)
    shape = [cur.shape[i] for i in order]
    t = create("stablehlo.transpose", ir.RankedTensorType.get(shape, cur.element_type), [t],
                {"permutation": ir.DenseI64ArrayAttr.get(order)})
    dims = [dims[i] for i in order]
  return create("stablehlo.broadcast_in_dim",
                 ir.RankedTensorType.get(list(target.shape), target.element_type), [t],
                 {"broadcast_dimensions": ir.DenseI64ArrayAttr.get(dims)}, sharding)
