"""The matcher of ``hx-fold-scales``: the dequantization ``D = Q * S`` feeding a dot operand.

An ``hx.dequantize`` composite (its format attributes checked against its types:
:class:`Inconsistent`) or its open-coded form, ``multiply(convert(q), broadcast(...))``,
through sharding constraints and one transpose (see :mod:`hxmlir.passes.fold_scales`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxlib.mlir import ir

from hxmlir.lowering import composite, schema
from hxmlir.passes import ops

_INT8_PER_ROW = schema.format_attributes("int8", None)


@dataclass
class Dequant:
  """A matched ``D = Q * S``.

  ``q``: the ``i8`` values; ``qf``: an existing ``f32`` value equal to
  ``convert(q)`` (open-coded form) or ``None``; ``t``/``amap``: ``S[i] =
  t[i[amap[0]], i[amap[1]], ...]`` (``None`` entries are unit dims of ``t``);
  ``s``: the ``f32[*l]`` scale when the match is exactly ``dequantize(q, s)``;
  ``constraints``: ``sdy.sharding_constraint`` ops from the dot operand back
  to ``D`` (or to the transpose); ``perm``: the permutation of a
  ``stablehlo.transpose`` between ``D`` and the dot (``amap`` is then in the
  transposed axes), with ``inner`` the constraints between it and ``D``;
  ``fmt``: the format attributes (:func:`schema.format_attributes`) of an
  ``hx.dequantize`` of any format but int8 per row (``q`` its stored values,
  ``amap`` empty: only :func:`format_fold.fold` rewrites such a match), else ``None``.
  """
  q: ir.Value
  qf: ir.Value | None
  t: ir.Value
  amap: list[int | None]
  s: ir.Value | None
  constraints: list[ir.Operation] = field(default_factory=list)
  perm: list[int] | None = None
  inner: list[ir.Operation] = field(default_factory=list)
  fmt: dict | None = None


class Inconsistent(Exception):
  """An ``hx.dequantize`` feeding a dot whose attributes (or version's format) disagree
  with its types: ``problems`` as the schema words them, reported at ``op``."""

  def __init__(self, op: ir.Operation, problems: list[str]):
    super().__init__(op, problems)
    self.op, self.problems = op, problems


def owner(v: ir.Value) -> ir.Operation | None:
  """The op defining ``v``, or ``None`` for a block argument."""
  return v.owner.operation if isinstance(v, ir.OpResult) else None


def _skip_constraints(v: ir.Value) -> tuple[ir.Value, list[ir.Operation]]:
  chain = []
  while (op := owner(v)) is not None and op.name == "sdy.sharding_constraint":
    chain.append(op)
    v = op.operands[0]
  return v, chain


def static(t: ir.Type) -> ir.RankedTensorType | None:
  """``t`` when it is a ranked tensor type of static shape, else ``None``."""
  return t if isinstance(t, ir.RankedTensorType) and t.has_static_shape else None


def _trace_convert(v: ir.Value, want: ir.Type) -> ir.Value | None:
  """The ``i8`` value that ``v`` converts (through sharding constraints), else ``None``."""
  v, _ = _skip_constraints(v)
  op = owner(v)
  if op is None or op.name != "stablehlo.convert" or v.type != want:
    return None
  src = op.operands[0]
  st = static(src.type)
  if st is None or str(st.element_type) != "i8":
    return None
  return src


def _trace_scale(v: ir.Value) -> tuple[ir.Value, list[int | None]]:
  """Follows broadcasts, unit reshapes and constraints back from ``v`` (see :class:`Dequant`)."""
  rank = ir.RankedTensorType(v.type).rank
  amap: list[int | None] = list(range(rank))
  while True:
    op = owner(v)
    if op is None:
      return v, amap
    if op.name == "sdy.sharding_constraint":
      v = op.operands[0]
      continue
    src = op.operands[0] if len(op.operands) == 1 else None
    st = static(src.type) if src is not None else None
    rt = static(v.type)
    if st is None or rt is None:
      return v, amap
    if op.name == "stablehlo.broadcast_in_dim":
      dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
      amap = [None if st.shape[j] == 1 and rt.shape[d] != 1 else amap[d]
              for j, d in enumerate(dims)]
    elif op.name == "stablehlo.reshape":
      src_nu = [j for j, n in enumerate(st.shape) if n != 1]
      res_nu = [j for j, n in enumerate(rt.shape) if n != 1]
      if [st.shape[j] for j in src_nu] != [rt.shape[j] for j in res_nu]:
        return v, amap
      new: list[int | None] = [None] * st.rank
      for j, r in zip(src_nu, res_nu):
        new[j] = amap[r]
      amap = new
    else:
      return v, amap
    v = src


def match_operand(operand: ir.Value) -> Dequant | None:
  """The dequantization feeding a dot operand, through constraints and one transpose."""
  d, outer = _skip_constraints(operand)
  op = owner(d)
  if op is None or op.name != "stablehlo.transpose":
    m = _match_dequant(d)
    if m is not None:
      m.constraints = outer
    return m
  perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
  d, inner = _skip_constraints(op.operands[0])
  m = _match_dequant(d)
  if m is None:
    return None
  m.constraints, m.inner, m.perm = outer, inner, perm
  m.amap = [None if a is None else perm.index(a) for a in m.amap]
  if perm != sorted(perm) and m.fmt is None:
    m.s = None  # not the plain dequantize layout any more
  return m


def _match_dequant(d: ir.Value) -> Dequant | None:
  """``D = Q * S`` defined by ``d`` (an ``hx.dequantize`` or its open-coded form)."""
  dt = static(d.type)
  op = owner(d)
  if op is None or dt is None or str(dt.element_type) != "f32":
    return None
  if ops.is_hx_composite(op) and ops.composite_name(op) == "hx.dequantize":
    spec = schema.lookup("hx.dequantize")
    version = ops.attr_or_none(op, "version")
    if version is None or ir.IntegerAttr(version).value not in spec.versions:
      return None
    if len(op.operands) != 2:
      return None  # a format with an offset: the MLIR stage does not fold it
    q, s = op.operands
    qt, st = ops.tensor_type(q.type), ops.tensor_type(s.type)
    attrs = composite.read_attributes(ops.attr_or_none(op, "composite_attributes"))
    # the types and the format attributes must agree (an unknown layout, a scale of
    # the wrong shape, group_size = 16 on g32 types): the pass reads them, so a
    # disagreement is an error at the dequantize, never copied into an hx.matmul_q;
    # without attributes only int8 per row is accepted
    if qt is None or st is None:
      return None
    problems = spec.check_types([qt, st], [ops.tensor_type(dt)], attrs or None)
    if problems:
      raise Inconsistent(op, problems)
    fmt = schema.format_attributes_of(qt, st)
    if "scale_dtype" in fmt:
      return None  # f16 scales (GGUF's blocks, the block formats): not folded here (the jaxpr stage folds them)
    if fmt == _INT8_PER_ROW:
      return Dequant(q, None, s, list(range(dt.rank - 1)), s)
    # int4 pairs, fp8 values, group scales: only ever into hx.matmul_q (format_fold.fold),
    # never folded as if they were int8 per row
    return Dequant(q, None, s, [], s, fmt=fmt)
  if op.name != "stablehlo.multiply":
    return None
  for a, b in ((op.operands[0], op.operands[1]), (op.operands[1], op.operands[0])):
    q = _trace_convert(a, dt)
    if q is None:
      continue
    t, amap = _trace_scale(b)
    if static(t.type) is None or str(ir.RankedTensorType(t.type).element_type) != "f32":
      continue
    if all(x is None for x in amap) and t == b:
      continue  # b is not a broadcast of anything: a product of two dense tensors
    s = None
    tt = ir.RankedTensorType(t.type)
    if amap == list(range(dt.rank - 1)) and list(tt.shape) == list(dt.shape)[:-1]:
      s = t
    return Dequant(q, a, t, amap, s)
  return None
