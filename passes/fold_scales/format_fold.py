"""``hx-fold-scales``' fold of the other formats (int4 pairs, fp8 values, group scales):
such a dot becomes an ``hx.matmul_q`` (v3) when it is exactly one, its decomposition the
format's reference (:mod:`hxmlir.passes.fold_scales.reference`), else it is left alone (see
:mod:`hxmlir.passes.fold_scales`)."""

from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy
from jaxlib.mlir.dialects import stablehlo as hlo

from hxmlir.lowering import composite, schema
from hxmlir.passes import ops, shardings
from hxmlir.passes.fold_scales import reference
from hxmlir.passes.fold_scales.match import Dequant, owner
from hxmlir.passes.fold_scales.rewrite import (
  State,
  create,
  default_precision,
  erase_dead,
  result_sharding,
)
from hxmlir.types import dotdims


def fold(module, dot: ir.Operation, side: int, m: Dequant, state: State) -> str | None:
  """Replaces ``dot`` (its operand ``side`` a dequantization of format ``m.fmt``) by
  ``hx.matmul_q`` (and a transpose of its result where the dot's result layout
  differs) when that is exactly the dot; ``"matmul_q formed"``, or ``None``."""
  plan = _format_plan(dot, side, m)
  if plan is None:
    return None
  old = dot.operands[side]
  with ir.InsertionPoint(dot), dot.location:
    _emit_format_matmul_q(module, dot, m, plan, state)
  erase_dead(owner(old), state.dropped)
  return "matmul_q formed"


@dataclass
class _FormatPlan:
  """An ``hx.matmul_q(x, q, s)`` that equals a dot: ``x`` the dense operand, ``dims`` the
  composite's dimension numbers, ``attrs`` its ``composite_attributes``, ``y_type`` its
  result type; ``perm``: the dot's result is ``transpose(y, perm)`` (``None``: ``y``
  itself); ``q_sh``, ``s_sh``, ``y_sh`` the composite's shardings and ``dot_sh`` the
  dot result's (any may be ``None``)."""
  x: ir.Value
  dims: dotdims.DotDims
  attrs: dict
  y_type: ir.RankedTensorType
  perm: list[int] | None
  q_sh: ir.Attribute | None
  s_sh: ir.Attribute | None
  y_sh: ir.Attribute | None
  dot_sh: ir.Attribute | None


def _format_plan(dot: ir.Operation, side: int, m: Dequant) -> _FormatPlan | None:
  """The ``hx.matmul_q`` that is exactly ``dot`` (operand ``side`` the dequantization
  ``m`` of format ``m.fmt``, through ``m.perm``), or ``None``.

  ``dot_general(x, T(dequantize(q, s)))`` with ``T`` a transpose ``perm`` pairs ``x``'s
  axes with ``q``'s dense axes ``perm[k]``; ``dot_general(T(D), x)`` swaps the
  operands. Either way the dot's result is the composite's (batch, ``x``'s free dims,
  ``q``'s free dims) with its free dims reordered. ``None`` when the dot has another
  precision or algorithm, or when types, dimension numbers (group scales that cannot
  be folded through them) or known shardings break ``hx.matmul_q``'s schema.
  """
  if not default_precision(dot):
    return None
  dd = hlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
  lhs = (list(dd.lhs_contracting_dimensions), list(dd.lhs_batching_dimensions))
  rhs = (list(dd.rhs_contracting_dimensions), list(dd.rhs_batching_dimensions))
  (xc, xb), (dc, db) = (lhs, rhs) if side == 1 else (rhs, lhs)
  x = dot.operands[1 - side]
  xt, qt, st = (ops.tensor_type(v.type) for v in (x, m.q, m.s))
  rt = ops.tensor_type(dot.result.type)
  if None in (xt, qt, st, rt) or rt.dtype != "f32":
    return None
  qrank = len(qt.shape)
  fwd = m.perm or list(range(qrank))  # axis k of the dot operand is q's dense axis fwd[k]
  dims = dotdims.normalize(((xc, [fwd[k] for k in dc]), (xb, [fwd[k] for k in db])))
  attrs = schema.matmul_q_attributes(dims, m.fmt)
  spec = schema.lookup("hx.matmul_q")
  dense = schema.dense_shape(qt)
  if spec.check_operands([xt, qt, st], attrs):
    return None
  y_shape = dotdims.result_shape(xt.shape, dense, dims)
  nb = len(xb)
  x_free = list(range(nb, nb + len(dotdims.free_dims(len(xt.shape), xc, xb))))
  q_free = dotdims.free_dims(qrank, dims[0][1], dims[1][1])
  d_free = [nb + len(x_free) + q_free.index(fwd[k])
            for k in dotdims.free_dims(qrank, dc, db)]
  perm = [*range(nb), *(x_free + d_free if side == 1 else d_free + x_free)]
  if tuple(y_shape[i] for i in perm) != rt.shape:
    return None
  y_tt = schema.TensorType(tuple(y_shape), "f32")
  if spec.check_types([xt, qt, st], [y_tt], attrs):
    return None
  got = _format_shardings(dot, m, x, perm, attrs)
  if got is None:
    return None
  y_type = ir.RankedTensorType.get(list(y_shape), ir.F32Type.get())
  return _FormatPlan(x, dims, attrs, y_type, None if perm == sorted(perm) else perm, *got)


def _permuted(sh: ir.Attribute, order: list[int]) -> ir.Attribute:
  """``#sdy.sharding`` ``sh`` with dim ``i`` taken from ``sh``'s dim ``order[i]``."""
  ts = shardings.as_tensor_sharding(sh)
  dims = list(ts.dimension_shardings)
  return sdy.TensorShardingAttr.get(ts.mesh_or_ref, [dims[j] for j in order])


def _format_shardings(dot, m: Dequant, x: ir.Value, perm: list[int], attrs: dict
                      ) -> tuple | None:
  """``(q, s, result, dot result)`` shardings of the ``hx.matmul_q`` replacing ``dot``
  (see :class:`_FormatPlan`), or ``None`` when the known ones break the schema's rules.

  ``q``'s is the dequantized value's (a constraint on it, or on its transpose read
  back through the permutation); a group scale is sharded like the values, a row
  scale like the values without their last axis (the schema's rule).
  """
  qr = ir.RankedTensorType(m.q.type).rank
  q_sh = None
  if m.inner:
    q_sh = m.inner[0].attributes["sharding"]
  elif m.constraints:
    q_sh = m.constraints[0].attributes["sharding"]
    if m.perm is not None and shardings.as_tensor_sharding(q_sh) is not None:
      q_sh = _permuted(q_sh, [m.perm.index(a) for a in range(qr)])
  s_sh = None
  if q_sh is not None:
    if shardings.dim_sharding(q_sh, qr) is None:
      return None
    ts = shardings.as_tensor_sharding(q_sh)
    # the values' entries the scale has (formats.scale_parts): all but the last per row
    s_sh = sdy.TensorShardingAttr.get(
        ts.mesh_or_ref, list(ts.dimension_shardings)[:ir.RankedTensorType(m.s.type).rank])
  dot_sh = result_sharding(dot)
  y_sh = dot_sh
  if dot_sh is not None and perm != sorted(perm):
    if shardings.as_tensor_sharding(dot_sh) is None:
      return None
    y_sh = _permuted(dot_sh, [perm.index(j) for j in range(len(perm))])
  yr = len(perm)
  known = [shardings.value_sharding(x),
           shardings.dim_sharding(q_sh, qr) if q_sh is not None else shardings.value_sharding(m.q),
           shardings.dim_sharding(s_sh, ir.RankedTensorType(m.s.type).rank)
           if s_sh is not None else shardings.value_sharding(m.s)]
  if schema.lookup("hx.matmul_q").check_shardings(
      known, [shardings.dim_sharding(y_sh, yr)], attrs):
    return None
  return q_sh, s_sh, y_sh, dot_sh


def _emit_format_matmul_q(module, dot, m: Dequant, plan: _FormatPlan, state: State) -> None:
  """Replaces ``dot`` by the composite of ``plan``, its decomposition the reference
  (:func:`reference.matmul_q`), built once per signature and dims."""
  x = plan.x
  key = ("format", str(x.type), str(m.q.type), str(m.s.type), str(plan.y_type), plan.dims)
  fn = state.decompositions.get(key)
  if fn is None:
    dims = plan.dims
    fn = composite.build_decomposition(
        "hx.matmul_q", [x.type, m.q.type, m.s.type], [plan.y_type],
        lambda args: [reference.matmul_q(*args, dims)], module=module)
    state.decompositions[key] = fn
  (y,) = composite.emit_composite(
      "hx.matmul_q", [x, m.q, m.s], [plan.y_type], fn, attributes=plan.attrs,
      operand_shardings=[None, plan.q_sh, plan.s_sh],
      result_shardings=[plan.y_sh] if plan.y_sh is not None else None)
  if plan.perm is not None:
    y = create("stablehlo.transpose", dot.result.type, [y],
                {"permutation": ir.DenseI64ArrayAttr.get(plan.perm)}, plan.dot_sh)
  dot.result.replace_all_uses_with(y)
  dot.erase()
