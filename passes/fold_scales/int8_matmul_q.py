"""``hx-fold-scales``' composite formation for int8 per row: a dot that is exactly
``hx.matmul_q``'s contract becomes that composite, its decomposition the reference or the
streaming one (the pass's ``impl``), built once per signature."""

from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from hxmlir.lowering import composite, schema
from hxmlir.lowering.matmul_q import streaming
from hxmlir.passes import ops, shardings
from hxmlir.passes.fold_scales.match import Dequant
from hxmlir.passes.fold_scales.rewrite import State, default_precision, result_sharding
from hxmlir.types import dotdims


def try_matmul_q(module, dot, side, m: Dequant, dd, state: State) -> bool:
  """Replaces ``dot`` by ``hx.matmul_q(x, q, s)`` if it is exactly that op's contract."""
  attrs = _matmul_q_contract(dot, side, m, dd)
  if attrs is None:
    return False
  shardings = _matmul_q_shardings(dot, m, attrs)
  if shardings is None:
    return False
  _emit_matmul_q(module, dot, m, shardings, attrs, state)
  return True


def _matmul_q_contract(dot, side, m: Dequant, dd) -> dict | None:
  """``hx.matmul_q``'s composite attributes when ``dot`` is
  ``f32[*b, m, k] @ dequantize(i8[*b, k, n], f32[*b, k])`` or
  ``f32[..., k] @ dequantize(i8[k, n], f32[k])`` at default precision with the types
  ``hx.matmul_q``'s schema accepts; else ``None``."""
  if side != 1 or m.s is None or m.perm is not None or not default_precision(dot):
    return None
  xt = ops.tensor_type(dot.operands[0].type)
  qt, st = ops.tensor_type(m.q.type), ops.tensor_type(m.s.type)
  yt = ops.tensor_type(dot.result.type)
  if None in (xt, qt, st, yt):
    return None
  dims = _matmul_q_layout(dd, len(xt.shape), len(qt.shape))
  if dims is None:
    return None
  attrs = schema.matmul_q_attributes(dims, schema.format_attributes("int8", None))
  return None if schema.lookup("hx.matmul_q").check_types([xt, qt, st], [yt], attrs) else attrs


def _matmul_q_shardings(dot, m: Dequant, attrs: dict) -> tuple | None:
  """``(q, s, result)`` shardings of the ``hx.matmul_q`` replacing ``dot`` (entries may
  be ``None``), or ``None`` when the known shardings break the schema's rules."""
  x = dot.operands[0]
  qr = ir.RankedTensorType(m.q.type).rank
  yr = ir.RankedTensorType(dot.result.type).rank
  q_sh = m.constraints[0].attributes["sharding"] if m.constraints else None
  s_sh = None
  if q_sh is not None:
    if shardings.dim_sharding(q_sh, qr) is None:
      return None
    ts = shardings.as_tensor_sharding(q_sh)
    s_sh = sdy.TensorShardingAttr.get(ts.mesh_or_ref, ts.dimension_shardings[:-1])
  y_sh = result_sharding(dot)
  known = [shardings.value_sharding(x),
           shardings.dim_sharding(q_sh, qr) if q_sh is not None else shardings.value_sharding(m.q),
           shardings.dim_sharding(s_sh, qr - 1) if s_sh is not None else
           shardings.value_sharding(m.s)]
  if schema.lookup("hx.matmul_q").check_shardings(
      known, [shardings.dim_sharding(y_sh, yr)], attrs):
    return None
  return q_sh, s_sh, y_sh


def _emit_matmul_q(module, dot, m: Dequant, shardings: tuple, attrs: dict,
                   state: State) -> None:
  """Replaces ``dot`` by the composite, its decomposition built once per signature."""
  x = dot.operands[0]
  q_sh, s_sh, y_sh = shardings
  key = (str(x.type), str(m.q.type), str(m.s.type), str(dot.result.type), state.impl)
  fn = state.decompositions.get(key)
  if fn is None:
    fn = composite.build_decomposition(
        "hx.matmul_q", [x.type, m.q.type, m.s.type], [dot.result.type],
        _matmul_q_body(state.impl, collapsed=_rank(x) != _rank(m.q)), module=module)
    state.decompositions[key] = fn
  (y,) = composite.emit_composite(
      "hx.matmul_q", [x, m.q, m.s], [dot.result.type], fn, attributes=attrs,
      operand_shardings=[None, q_sh, s_sh],
      result_shardings=[y_sh] if y_sh is not None else None)
  dot.result.replace_all_uses_with(y)
  dot.erase()


def _reference_body(args):
  """``hx.matmul_q``'s reference decomposition: convert the weight, one dot."""
  x, q, s = args
  return [streaming.build_matmul_q_streaming(x, q, s, scheme="whole")]


def _rank(v: ir.Value) -> int:
  return ir.RankedTensorType(v.type).rank


def _collapsed_reference_body(args):
  """The reference for ``f32[..., k] x i8[k, n]``: leading dims collapsed, one dot."""
  return streaming.collapsed_streaming_decomposition(args, scheme="whole")


def _matmul_q_body(impl: str, collapsed: bool):
  """The decomposition builder of an ``hx.matmul_q`` formed by the pass."""
  if collapsed:
    return (streaming.collapsed_streaming_decomposition if impl == "streaming"
            else _collapsed_reference_body)
  return streaming.streaming_decomposition if impl == "streaming" else _reference_body


def _matmul_q_layout(dd, x_rank: int, q_rank: int):
  """The dot's dims (``hlo.DotDimensionNumbers``) when they are one of ``hx.matmul_q``'s
  layouts with a decomposition builder: ``f32[*b, m, k] x [*b, k, n]`` or
  ``f32[..., k] x [k, n]`` (several free dims on the dense side); else ``None``."""
  dims = dotdims.normalize(((dd.lhs_contracting_dimensions, dd.rhs_contracting_dimensions),
                            (dd.lhs_batching_dimensions, dd.rhs_batching_dimensions)))
  return dims if dims == dotdims.matmul_dims(x_rank, q_rank) else None
