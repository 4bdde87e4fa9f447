"""The reference decomposition of ``hx.matmul_q`` for every format, as MLIR builders (the
passes never trace JAX code): :func:`hxmlir.lowering.reference.matmul_q`, op for op."""

from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as hlo

from hxmlir import formats
from hxmlir.types import dotdims


def _tensor_of(shape, etype: ir.Type) -> ir.RankedTensorType:
  return ir.RankedTensorType.get([int(d) for d in shape], etype)


def _shape_of(v: ir.Value) -> list[int]:
  return list(ir.RankedTensorType(v.type).shape)


def _reshape(v: ir.Value, shape) -> ir.Value:
  return hlo.ReshapeOp(_tensor_of(shape, ir.RankedTensorType(v.type).element_type), v).result


def _values_f32(q: ir.Value) -> ir.Value:
  """Stored values of any format as ``f32`` of the dense shape
  (:func:`hxmlir.formats.values_f32`; int4 pairs unpacked as
  :func:`hxmlir.formats.unpack_int4`: low nibble first, each sign-extended)."""
  shape = _shape_of(q)
  f = formats.of_storage(str(ir.RankedTensorType(q.type).element_type))
  if f.pack == 2:
    i8 = ir.IntegerType.get_signless(8)
    bt = _tensor_of(shape, i8)
    b = hlo.ConvertOp(bt, q).result
    four = hlo.ConstantOp(ir.DenseElementsAttr.get_splat(bt, ir.IntegerAttr.get(i8, 4))).result
    lo = hlo.ShiftRightArithmeticOp(hlo.ShiftLeftOp(b, four).result, four).result
    hi = hlo.ShiftRightArithmeticOp(b, four).result
    pairs = hlo.ConcatenateOp([_reshape(lo, [*shape, 1]), _reshape(hi, [*shape, 1])],
                              len(shape)).result
    shape = f.dense_shape(shape)
    q = _reshape(pairs, shape)
  return hlo.ConvertOp(_tensor_of(shape, ir.F32Type.get()), q).result


def _dot_general(a: ir.Value, b: ir.Value, dims) -> ir.Value:
  (lc, rc), (lb, rb) = dims
  out = dotdims.result_shape(_shape_of(a), _shape_of(b), dims)
  dn = hlo.DotDimensionNumbers.get(
      lhs_batching_dimensions=list(lb), rhs_batching_dimensions=list(rb),
      lhs_contracting_dimensions=list(lc), rhs_contracting_dimensions=list(rc))
  return hlo.DotGeneralOp(_tensor_of(out, ir.F32Type.get()), a, b, dn).result


def _broadcast_to(s: ir.Value, shape, pos) -> ir.Value:
  """``s`` broadcast to ``shape``, its axis ``i`` at ``pos[i]`` (``reference._broadcast``)."""
  order = sorted(range(len(pos)), key=lambda i: pos[i])
  if order != list(range(len(pos))):
    ss = _shape_of(s)
    s = hlo.TransposeOp(s, order, results=[_tensor_of([ss[i] for i in order],
                                                      ir.F32Type.get())]).result
  return hlo.BroadcastInDimOp(_tensor_of(shape, ir.F32Type.get()), s,
                              [pos[i] for i in order]).result


def _sum_axis(y: ir.Value, axis: int) -> ir.Value:
  """``y`` summed over ``axis`` (``jnp.sum``'s ``stablehlo.reduce``)."""
  f32 = ir.F32Type.get()
  shape = _shape_of(y)
  scalar = _tensor_of((), f32)
  zero = hlo.ConstantOp(ir.DenseElementsAttr.get_splat(scalar, ir.FloatAttr.get(f32, 0.0))).result
  op = hlo.ReduceOp([_tensor_of(shape[:axis] + shape[axis + 1:], f32)], [y], [zero], [axis])
  body = op.regions[0].blocks.append(scalar, scalar)
  with ir.InsertionPoint(body):
    hlo.ReturnOp([hlo.AddOp(*body.arguments).result])
  return op.results[0]


def matmul_q(x: ir.Value, q: ir.Value, s: ir.Value, dims) -> ir.Value:
  """``hx.matmul_q``'s reference (:func:`hxmlir.lowering.reference.matmul_q`) for stored
  values ``q`` of any format and per-row or group scales ``s``: the weight's last axis
  split into groups (:func:`hxmlir.types.dotdims.split_groups`), the scales folded into ``x``
  or the result (or each group's partial sum), never into the weight."""
  qf = _values_f32(q)
  qs, xs = _shape_of(qf), _shape_of(x)
  if len(_shape_of(s)) == len(qs) - 1:
    return _rows(x, qf, s, dims)
  g = qs[-1] // _shape_of(s)[-1]
  dims2, xa, kind = dotdims.split_groups(len(xs), len(qs), dims)
  if xa is not None:
    x = _reshape(x, [*xs[:xa], xs[xa] // g, g, *xs[xa + 1:]])
  y = _rows(x, _reshape(qf, [*qs[:-1], qs[-1] // g, g]), s, dims2)
  ys = _shape_of(y)
  if kind == "partial":
    return _sum_axis(y, len(dims[1][0]))
  if kind == "free":
    return _reshape(y, [*ys[:-2], ys[-2] * g])
  if kind == "batch":
    i = dims[1][1].index(len(qs) - 1)
    return _reshape(y, [*ys[:i], ys[i] * g, *ys[i + 2:]])
  return y


def _rows(x: ir.Value, qf: ir.Value, s: ir.Value, dims) -> ir.Value:
  """:func:`matmul_q` for ``f32`` values ``qf`` with per-row scales ``s``
  (``reference._matmul_rows``; the schema has ruled out scales that do not fold)."""
  (lc, rc), (lb, rb) = dims
  qs, xs = _shape_of(qf), _shape_of(x)
  scale_axes = range(len(qs) - 1)
  if dotdims.scale_side(len(qs), dims) == "result":
    y = _dot_general(x, qf, dims)
    ys = _shape_of(y)
    q_free = dotdims.free_dims(len(qs), rc, rb)
    first = len(ys) - len(q_free)
    pos = [rb.index(a) if a in rb else first + q_free.index(a) for a in scale_axes]
    return hlo.MulOp(y, _broadcast_to(s, ys, pos)).result
  new = [a for a in scale_axes if a not in rb and a not in rc]
  x_of = {**dict(zip(rb, lb)), **dict(zip(rc, lc))}
  pos = [x_of[a] if a in x_of else len(xs) + new.index(a) for a in scale_axes]
  shape = [*xs, *(qs[a] for a in new)]
  if new:
    x = hlo.BroadcastInDimOp(_tensor_of(shape, ir.F32Type.get()), x, list(range(len(xs)))).result
  x = hlo.MulOp(x, _broadcast_to(s, shape, pos)).result
  new_x = tuple(range(len(xs), len(xs) + len(new)))
  y = _dot_general(x, qf, ((lc, rc), ((*lb, *new_x), (*rb, *new))))
  if not new:
    return y
  nb, nn = len(lb), len(new)
  nx = len(dotdims.free_dims(len(xs), lc, lb))
  q_free = dotdims.free_dims(len(qs), rc, rb)
  rest = [a for a in q_free if a not in new]
  perm = [*range(nb), *range(nb + nn, nb + nn + nx),
          *(nb + new.index(a) if a in new else nb + nn + nx + rest.index(a) for a in q_free)]
  ys = _shape_of(y)
  return hlo.TransposeOp(y, perm, results=[_tensor_of([ys[i] for i in perm],
                                                      ir.F32Type.get())]).result
