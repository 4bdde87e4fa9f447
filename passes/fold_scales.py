"""``hx-fold-scales``: fold dequantization scales out of ``stablehlo.dot_general``.

Pattern: one operand ``D`` of a ``dot_general`` is a dequantized value,
``D = Q * S`` elementwise, where ``Q = convert(q: i8)`` and ``S`` is a
broadcast of a scale tensor ``t`` — either an ``hx.dequantize`` composite
(``S[..., j] = s[...]``: the scale varies along every axis but the last) or its
open-coded form, ``multiply(convert(q), broadcast_in_dim(...))`` through any
chain of ``broadcast_in_dim``, unit-dim ``reshape`` and
``sdy.sharding_constraint`` ops (what JAX emits for ``q * s[..., None]``).
Either operand may be ``D``, also through one ``stablehlo.transpose``
(``dequantize(q, s).T @ x``: the transpose moves to the ``i8`` values);
``sdy.sharding_constraint`` ops between ``D`` and the dot are kept (re-created
on the new operand).

Let ``A`` be the axes of ``D`` along which ``S`` varies. With ``X`` the other
operand and ``R = dot_general(D, X)``:

- ``A`` has a contracting axis and no free axis: ``sum_c Q[c] S[c] X[c] =
  sum_c Q[c] (S[c] X[c])``, so ``S`` is broadcast onto ``X`` (contracting axes
  pair with ``X``'s contracting axes, batch axes with ``X``'s batch axes) and
  ``R = dot_general(Q, X * S)``;
- ``A`` has a free axis and no contracting axis: ``S`` is constant along the
  sum, so ``R = dot_general(Q, X) * S`` with ``S`` broadcast onto the result
  (batch axes first, then the lhs free axes, then the rhs free axes);
- ``A`` has batch axes only (or is empty): either works; the smaller of ``X``
  and ``R`` gets the multiply;
- ``A`` mixes contracting and free axes: ``S`` does not factor; the dot is left
  alone, as is every pattern not matching the above exactly (other element
  types, dynamic shapes, non-unit reshapes).

New ops carry ``sdy.sharding`` of the value they are shaped like (``X``'s, the
dot result's, ``q``'s). Where the rewrite is exactly ``hx.matmul_q``'s
contract (``f32[*b, m, k] x dequantize(i8[*b, k, n], f32[*b, k])`` with
leading batch dims, or ``f32[..., k] x dequantize(i8[k, n], f32[k])`` with several
free dims on the dense side; default precision, types and known shardings accepted by
``lowering/schema.py``), the dot becomes that composite instead, built with
``hxmlir.lowering.composite``. Ops of the dequantization left without uses
are erased. Decomposition functions are never rewritten.

Other quantization formats (:mod:`hxmlir.formats`: int4 pairs ``ui8[..., n/2]``,
layout ``int4_pairs_v1``; ``f8E4M3FN`` values; group scales ``f32[*l, n/g]``) reach
the dot only as an ``hx.dequantize`` composite (version 2, whose ``dtype``,
``group_size`` and ``layout`` attributes must agree with its types). The pass reads
those attributes, so it checks them: an ``hx.dequantize`` feeding a dot whose
attributes (or version) disagree with its types -- ``group_size = 16`` on ``g32``
types, an unknown layout, a scale shape no format has -- is an error at its
location (once per op; the pipeline fails, ``hxmlir-opt`` exits 1), and it and its
dots are left as they are, with or without ``hx-verify``. Their scales do not factor
as above: group scales vary along the quantized axis itself, so they can be moved
onto neither the other operand nor the result as one broadcast, and the values
need unpacking. Such a dot is never folded open-coded (nor as if it were int8 per
row); it becomes an ``hx.matmul_q`` v3 when it is exactly one, else it is left
alone. Exactly one: the dequantized operand on either side, through sharding
constraints and one transpose (``x @ dequantize(q, s).T``: the ``[out, in]``
layout, groups along the contraction), the composite's dimension numbers the dot's
read through the transpose; default precision; types and dimension numbers that
``hx.matmul_q``'s schema accepts (group scales that cannot be folded through the
dims are refused); known shardings it accepts (a sharded contraction axis
included: partial sums the partitioner adds, as for the dot; the values and scales
are constrained like the dequantized value, a group scale's group axis like the last
axis). Where the dot's result orders its free
dims unlike the composite (batch, ``x``'s free dims, ``q``'s free dims: the
dequantized operand on the left, or a transpose reordering free dims), a
``stablehlo.transpose`` of the composite's result replaces the dot. The composite
copies the dequantize's format attributes; its decomposition is the reference of
that format (:func:`hxmlir.lowering.reference.matmul_q`, built op for op as MLIR:
values unpacked and converted, the weight's last axis split into groups, scales
into ``x``, the result or each group's partial sum, never into the weight),
whatever ``impl`` says (the streaming decompositions know int8 per row only).
Numerics as below: the scale is applied before or after a (partial) sum instead
of to the weight.

The rewrite reassociates one multiplication per term (``(q s) x`` becomes
``q (x s)`` or ``(q x) s``). Where every intermediate product stays in f32's
normal range, results differ from the original by float rounding only (a few
ulps of each product). Range is not preserved: the rewrite forms ``x s`` (or
``sum_c q x``) before the other factor, so where that intermediate overflows
(``|x s| > 3.4e38``) the rewrite gives inf or NaN where the original may be finite
(``q = 0``, ``s = 1e30``, ``x = 1e10``: the original gives ``0 * 1e10 = 0``, the
rewrite ``0 * inf = NaN``), and where it underflows (below ``1.2e-38``) it loses
precision the original kept. Quantization scales are ``absmax / 127`` of finite
f32 weights, so this needs activations within a factor ``~1e38 / absmax`` of
overflow; the pass does not guard against it (a guard would cost a compare
and select per element), and ``hx-fold-scales`` should not be run on programs
that rely on such products.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import ClassVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy
from jaxlib.mlir.dialects import stablehlo as hlo

from hxmlir import formats
from hxmlir.lowering import composite, schema
from hxmlir.lowering.matmul_q import streaming
from hxmlir.passes import ops, shardings, symbols
from hxmlir.passes.base import HxPass, PassContext, PassResult, PipelineError
from hxmlir.types import dotdims

_INT8_PER_ROW = schema.format_attributes("int8", None)

_ERASABLE = ("stablehlo.multiply", "stablehlo.convert", "stablehlo.broadcast_in_dim",
             "stablehlo.reshape", "stablehlo.transpose", "sdy.sharding_constraint")


@dataclass
class _Dequant:
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
  ``amap`` empty: only :func:`_fold_format` rewrites such a match), else ``None``.
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


@dataclass
class _State:
  """Per-run state: the decomposition to build for ``hx.matmul_q`` (``impl``),
  decompositions built (by signature), decompositions of erased ops."""
  impl: str = "reference"
  decompositions: dict = field(default_factory=dict)
  dropped: set = field(default_factory=set)


class _Inconsistent(Exception):
  """An ``hx.dequantize`` feeding a dot whose attributes (or version's format) disagree
  with its types: ``problems`` as the schema words them, reported at ``op``."""

  def __init__(self, op: ir.Operation, problems: list[str]):
    super().__init__(op, problems)
    self.op, self.problems = op, problems


def _owner(v: ir.Value) -> ir.Operation | None:
  return v.owner.operation if isinstance(v, ir.OpResult) else None


def _skip_constraints(v: ir.Value) -> tuple[ir.Value, list[ir.Operation]]:
  chain = []
  while (op := _owner(v)) is not None and op.name == "sdy.sharding_constraint":
    chain.append(op)
    v = op.operands[0]
  return v, chain


def _static(t: ir.Type) -> ir.RankedTensorType | None:
  return t if isinstance(t, ir.RankedTensorType) and t.has_static_shape else None


def _trace_convert(v: ir.Value, want: ir.Type) -> ir.Value | None:
  """The ``i8`` value that ``v`` converts (through sharding constraints), else ``None``."""
  v, _ = _skip_constraints(v)
  op = _owner(v)
  if op is None or op.name != "stablehlo.convert" or v.type != want:
    return None
  src = op.operands[0]
  st = _static(src.type)
  if st is None or str(st.element_type) != "i8":
    return None
  return src


def _trace_scale(v: ir.Value) -> tuple[ir.Value, list[int | None]]:
  """Follows broadcasts, unit reshapes and constraints back from ``v`` (see :class:`_Dequant`)."""
  rank = ir.RankedTensorType(v.type).rank
  amap: list[int | None] = list(range(rank))
  while True:
    op = _owner(v)
    if op is None:
      return v, amap
    if op.name == "sdy.sharding_constraint":
      v = op.operands[0]
      continue
    src = op.operands[0] if len(op.operands) == 1 else None
    st = _static(src.type) if src is not None else None
    rt = _static(v.type)
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


def _match(operand: ir.Value) -> _Dequant | None:
  """The dequantization feeding a dot operand, through constraints and one transpose."""
  d, outer = _skip_constraints(operand)
  op = _owner(d)
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


def _match_dequant(d: ir.Value) -> _Dequant | None:
  """``D = Q * S`` defined by ``d`` (an ``hx.dequantize`` or its open-coded form)."""
  dt = _static(d.type)
  op = _owner(d)
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
      raise _Inconsistent(op, problems)
    fmt = schema.format_attributes_of(qt, st)
    if "scale_dtype" in fmt:
      return None  # f16 scales (GGUF's blocks, the block formats): not folded here (the jaxpr stage folds them)
    if fmt == _INT8_PER_ROW:
      return _Dequant(q, None, s, list(range(dt.rank - 1)), s)
    # int4 pairs, fp8 values, group scales: only ever into hx.matmul_q (_fold_format),
    # never folded as if they were int8 per row
    return _Dequant(q, None, s, [], s, fmt=fmt)
  if op.name != "stablehlo.multiply":
    return None
  for a, b in ((op.operands[0], op.operands[1]), (op.operands[1], op.operands[0])):
    q = _trace_convert(a, dt)
    if q is None:
      continue
    t, amap = _trace_scale(b)
    if _static(t.type) is None or str(ir.RankedTensorType(t.type).element_type) != "f32":
      continue
    if all(x is None for x in amap) and t == b:
      continue  # b is not a broadcast of anything: a product of two dense tensors
    s = None
    tt = ir.RankedTensorType(t.type)
    if amap == list(range(dt.rank - 1)) and list(tt.shape) == list(dt.shape)[:-1]:
      s = t
    return _Dequant(q, a, t, amap, s)
  return None


def _per_value(attr: ir.Attribute | None) -> ir.Attribute | None:
  return None if attr is None else sdy.TensorShardingPerValueAttr.get([attr])


def _create(name: str, result: ir.Type, operands, attrs=None, sharding=None) -> ir.Value:
  attrs = dict(attrs or {})
  if sharding is not None:
    attrs["sdy.sharding"] = _per_value(sharding)
  op = ir.Operation.create(name, results=[result], operands=list(operands), attributes=attrs)
  return op.result


def _broadcast(t: ir.Value, amap: list[int | None], axis_map: dict[int, int],
               target: ir.RankedTensorType, sharding) -> ir.Value:
  """``t`` broadcast onto ``target``'s shape: dim ``j`` of ``t`` -> ``axis_map[amap[j]]``."""
  tt = ir.RankedTensorType(t.type)
  keep = [j for j, a in enumerate(amap) if a is not None and a in axis_map]
  if len(keep) != tt.rank:
    shape = [tt.shape[j] for j in keep]
    t = _create("stablehlo.reshape", ir.RankedTensorType.get(shape, tt.element_type), [t])
  dims = [axis_map[amap[j]] for j in keep]
  order = sorted(range(len(dims)), key=lambda i: dims[i])
  if order != list(range(len(dims))):
    cur = ir.RankedTensorType(t.type)
    shape = [cur.shape[i] for i in order]
    t = _create("stablehlo.transpose", ir.RankedTensorType.get(shape, cur.element_type), [t],
                {"permutation": ir.DenseI64ArrayAttr.get(order)})
    dims = [dims[i] for i in order]
  return _create("stablehlo.broadcast_in_dim",
                 ir.RankedTensorType.get(list(target.shape), target.element_type), [t],
                 {"broadcast_dimensions": ir.DenseI64ArrayAttr.get(dims)}, sharding)


def _result_sharding(dot: ir.Operation) -> ir.Attribute | None:
  got = shardings.result_sharding_attr(dot, 0)
  if got is not None:
    return got
  for use in dot.result.uses:
    if use.owner.operation.name == "sdy.sharding_constraint":
      return use.owner.operation.attributes["sharding"]
  return None


def _erase_dead(op: ir.Operation | None, dropped: set[str]) -> None:
  """Erases ``op`` and, recursively, its operands' definers, while they are unused and pure.

  Adds the decomposition symbols of erased composites to ``dropped``.
  """
  if op is None:
    return
  pure = op.name in _ERASABLE or (ops.is_hx_composite(op) and
                                  ops.composite_name(op) == "hx.dequantize")
  if not pure or any(True for r in op.results for _ in r.uses):
    return
  defs = [_owner(v) for v in op.operands]
  if "decomposition" in op.attributes:
    dropped.add(symbols.symbol_ref(op.attributes["decomposition"]))
  op.erase()
  for d in defs:
    _erase_dead(d, dropped)


_IMPLS = ("auto", "reference", "streaming")


@dataclass(frozen=True)
class FoldScalesPass(HxPass):
  """Folds dequantization scales out of ``dot_general`` (see the module docstring).

  Options:
    form_matmul_q (``form-matmul-q``, bool, default true): rewrite matches of
      ``hx.matmul_q``'s contract into that composite (otherwise only fold).
    impl (``impl``, ``auto`` | ``reference`` | ``streaming``, default ``auto``):
      the decomposition of each ``hx.matmul_q`` formed. ``reference`` is the
      reference semantics (convert the weight, one dot); ``streaming`` is the
      CPU implementation hxmlir's CPU lowering rule attaches
      (``lowering/matmul_q/streaming.py``: int8 blocks converted one at a time, never
      the whole dequantized weight); ``auto`` picks ``streaming`` when the
      pipeline runs in a lowering for CPU alone, else ``reference``. Weights of
      other formats than int8 per row always get the reference.
  """
  name: ClassVar[str] = "hx-fold-scales"
  summary: ClassVar[str] = ("fold dequantize scales out of dot_general into the smaller side; "
                            "form hx.matmul_q where it fits")
  form_matmul_q: bool = True
  impl: str = "auto"

  def __post_init__(self):
    if self.impl not in _IMPLS:
      raise PipelineError(f"hx-fold-scales: option impl={self.impl!r} is not one of "
                          f"{', '.join(_IMPLS)}")

  def apply_jaxpr(self, jaxpr):
    """The jaxpr stage (``passes/fold_scales_jaxpr.py``): ``x @ hx.dequantize(qw)`` dots
    that are exactly ``hx.matmul_q``'s contract become ``hx_matmul_q`` equations.

    Only with the default options: ``form-matmul-q=false`` forms no composite,
    and a fixed ``impl`` chooses a decomposition that JAX's lowering rules would
    not; both then leave everything to :meth:`apply`.
    """
    if not self.form_matmul_q or self.impl != "auto":
      return None
    from hxmlir.passes import fold_scales_jaxpr  # late: imports JAX's jaxpr API

    jaxpr, n = fold_scales_jaxpr.fold_closed_jaxpr(jaxpr)
    return jaxpr, ({"scales folded": n, "matmul_q formed": n} if n else {})

  def _decomposition_impl(self, platforms: tuple[str, ...] | None) -> str:
    if self.impl != "auto":
      return self.impl
    return "streaming" if platforms == ("cpu",) else "reference"

  def apply(self, module: ir.Operation, ctx: PassContext) -> PassResult:
    decomps = None  # the decomposition functions' names, read at the first match
    stats = {"scales folded": 0, "into operand": 0, "into result": 0, "matmul_q formed": 0}
    state = _State(impl=self._decomposition_impl(ctx.platforms))
    reported: set = set()
    for dot in ops.ops_named(module, "stablehlo.dot_general"):
      for side in (1, 0):
        try:
          m = _match(dot.operands[side])
        except _Inconsistent as e:
          # reported once per dequantize, which stays as it is (the pass then fails)
          if e.op not in reported:
            reported.add(e.op)
            for problem in e.problems:
              ctx.error(e.op, f"'hx.dequantize' {problem}; hx-fold-scales reads the format "
                        "from these attributes and leaves the op alone (hx-verify checks "
                        "every composite)")
          continue
        if m is None:
          continue
        if decomps is None:
          decomps = {symbols.symbol_ref(op.attributes["decomposition"])
                     for op in ops.ops_named(module, "stablehlo.composite")
                     if "decomposition" in op.attributes}
        if symbols.func_name(symbols.enclosing_func(dot)) in decomps:
          break  # decompositions are never rewritten
        if m.fmt is not None:
          how = self._fold_format(module, dot, side, m, state) if self.form_matmul_q else None
        else:
          how = self._fold(module, dot, side, m, state)
        if how is not None:
          stats["scales folded"] += 1
          stats[how] += 1
          break
    changed = stats["scales folded"] > 0
    if changed:
      symbols.erase_unused_functions(module, state.dropped)
    return PassResult(changed=changed, stats=stats if changed else {})

  def _fold(self, module, dot: ir.Operation, side: int, m: _Dequant, state: _State
            ) -> str | None:
    """Rewrites ``dot`` (its operand ``side`` matched as ``m``); the stats key, or ``None``."""
    plan = _plan(dot, side, m)
    if plan is None:
      return None
    old = dot.operands[side]
    with ir.InsertionPoint(dot), dot.location:
      if self.form_matmul_q and plan.into == "operand" and \
         _try_matmul_q(module, dot, side, m, plan.dd, state):
        _erase_dead(_owner(old), state.dropped)
        return "matmul_q formed"
      qf = _unscaled_operand(m, plan.dt)
      if plan.into == "operand":
        x = dot.operands[plan.other]
        sh = shardings.value_sharding_attr(x)
        b = _broadcast(m.t, m.amap, plan.to_x, plan.xt, sh)
        dot.operands[plan.other] = _create("stablehlo.multiply", plan.xt, [x, b], sharding=sh)
      dot.operands[side] = qf
    if plan.into == "result":
      _scale_result(dot, m, plan)
    _erase_dead(_owner(old), state.dropped)
    return f"into {plan.into}"


  def _fold_format(self, module, dot: ir.Operation, side: int, m: _Dequant, state: _State
                   ) -> str | None:
    """Replaces ``dot`` (its operand ``side`` a dequantization of format ``m.fmt``) by
    ``hx.matmul_q`` (and a transpose of its result where the dot's result layout
    differs) when that is exactly the dot; ``"matmul_q formed"``, or ``None``."""
    plan = _format_plan(dot, side, m)
    if plan is None:
      return None
    old = dot.operands[side]
    with ir.InsertionPoint(dot), dot.location:
      _emit_format_matmul_q(module, dot, m, plan, state)
    _erase_dead(_owner(old), state.dropped)
    return "matmul_q formed"


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


def _plan(dot: ir.Operation, side: int, m: _Dequant) -> _Plan | None:
  """Where the scale of ``m`` (operand ``side`` of ``dot``) can go, or ``None`` when it
  does not factor (scaled along contracting and free axes) or the types do not fit."""
  dd = hlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
  batch = [list(dd.lhs_batching_dimensions), list(dd.rhs_batching_dimensions)]
  contract = [list(dd.lhs_contracting_dimensions), list(dd.rhs_contracting_dimensions)]
  other = 1 - side
  xt, rt = _static(dot.operands[other].type), _static(dot.result.type)
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


def _unscaled_operand(m: _Dequant, dt: ir.RankedTensorType) -> ir.Value:
  """``Q`` in place of ``D``: ``convert(q)`` (reused when the match has one) through the
  match's transpose and sharding constraints, typed ``dt``."""
  qf = m.qf
  if qf is None:
    qt = ir.RankedTensorType(m.q.type)
    qf = _create("stablehlo.convert", ir.RankedTensorType.get(list(qt.shape), dt.element_type),
                 [m.q], sharding=shardings.value_sharding_attr(m.q))
  for c in reversed(m.inner):
    qf = sdy.ShardingConstraintOp(qf, c.attributes["sharding"]).result
  if m.perm is not None:
    qf = _create("stablehlo.transpose", dt, [qf],
                 {"permutation": ir.DenseI64ArrayAttr.get(m.perm)})
  for c in reversed(m.constraints):
    qf = sdy.ShardingConstraintOp(qf, c.attributes["sharding"]).result
  return qf


def _scale_result(dot: ir.Operation, m: _Dequant, plan: _Plan) -> None:
  """Multiplies ``dot``'s result by the broadcast scale; every use takes the product."""
  sh = _result_sharding(dot)
  with ir.InsertionPoint(dot), dot.location:
    b = _broadcast(m.t, m.amap, plan.to_r, plan.rt, sh)
    mul = _create("stablehlo.multiply", plan.rt, [dot.result, b], sharding=sh)
  dot.move_before(mul.owner)
  dot.result.replace_all_uses_except(mul, mul.owner.operation)


def _try_matmul_q(module, dot, side, m: _Dequant, dd, state: _State) -> bool:
  """Replaces ``dot`` by ``hx.matmul_q(x, q, s)`` if it is exactly that op's contract."""
  attrs = _matmul_q_contract(dot, side, m, dd)
  if attrs is None:
    return False
  shardings = _matmul_q_shardings(dot, m, attrs)
  if shardings is None:
    return False
  _emit_matmul_q(module, dot, m, shardings, attrs, state)
  return True


def _matmul_q_contract(dot, side, m: _Dequant, dd) -> dict | None:
  """``hx.matmul_q``'s composite attributes when ``dot`` is
  ``f32[*b, m, k] @ dequantize(i8[*b, k, n], f32[*b, k])`` or
  ``f32[..., k] @ dequantize(i8[k, n], f32[k])`` at default precision with the types
  ``hx.matmul_q``'s schema accepts; else ``None``."""
  if side != 1 or m.s is None or m.perm is not None or not _default_precision(dot):
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


def _default_precision(dot: ir.Operation) -> bool:
  """Whether ``dot`` has no algorithm and default precision (``hx.matmul_q``'s)."""
  if "algorithm" in dot.attributes:
    return False
  return "precision_config" not in dot.attributes or all(
      "DEFAULT" in str(p) for p in ir.ArrayAttr(dot.attributes["precision_config"]))


def _matmul_q_shardings(dot, m: _Dequant, attrs: dict) -> tuple | None:
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
  y_sh = _result_sharding(dot)
  known = [shardings.value_sharding(x),
           shardings.dim_sharding(q_sh, qr) if q_sh is not None else shardings.value_sharding(m.q),
           shardings.dim_sharding(s_sh, qr - 1) if s_sh is not None else
           shardings.value_sharding(m.s)]
  if schema.lookup("hx.matmul_q").check_shardings(
      known, [shardings.dim_sharding(y_sh, yr)], attrs):
    return None
  return q_sh, s_sh, y_sh


def _emit_matmul_q(module, dot, m: _Dequant, shardings: tuple, attrs: dict,
                   state: _State) -> None:
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


# --- other formats: int4 pairs, fp8 values, group scales -------------------------

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


def _format_plan(dot: ir.Operation, side: int, m: _Dequant) -> _FormatPlan | None:
  """The ``hx.matmul_q`` that is exactly ``dot`` (operand ``side`` the dequantization
  ``m`` of format ``m.fmt``, through ``m.perm``), or ``None``.

  ``dot_general(x, T(dequantize(q, s)))`` with ``T`` a transpose ``perm`` pairs ``x``'s
  axes with ``q``'s dense axes ``perm[k]``; ``dot_general(T(D), x)`` swaps the
  operands. Either way the dot's result is the composite's (batch, ``x``'s free dims,
  ``q``'s free dims) with its free dims reordered. ``None`` when the dot has another
  precision or algorithm, or when types, dimension numbers (group scales that cannot
  be folded through them) or known shardings break ``hx.matmul_q``'s schema.
  """
  if not _default_precision(dot):
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


def _format_shardings(dot, m: _Dequant, x: ir.Value, perm: list[int], attrs: dict
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
  dot_sh = _result_sharding(dot)
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


def _emit_format_matmul_q(module, dot, m: _Dequant, plan: _FormatPlan, state: _State) -> None:
  """Replaces ``dot`` by the composite of ``plan``, its decomposition the reference
  (:func:`_reference_matmul_q`), built once per signature and dims."""
  x = plan.x
  key = ("format", str(x.type), str(m.q.type), str(m.s.type), str(plan.y_type), plan.dims)
  fn = state.decompositions.get(key)
  if fn is None:
    dims = plan.dims
    fn = composite.build_decomposition(
        "hx.matmul_q", [x.type, m.q.type, m.s.type], [plan.y_type],
        lambda args: [_reference_matmul_q(*args, dims)], module=module)
    state.decompositions[key] = fn
  (y,) = composite.emit_composite(
      "hx.matmul_q", [x, m.q, m.s], [plan.y_type], fn, attributes=plan.attrs,
      operand_shardings=[None, plan.q_sh, plan.s_sh],
      result_shardings=[plan.y_sh] if plan.y_sh is not None else None)
  if plan.perm is not None:
    y = _create("stablehlo.transpose", dot.result.type, [y],
                {"permutation": ir.DenseI64ArrayAttr.get(plan.perm)}, plan.dot_sh)
  dot.result.replace_all_uses_with(y)
  dot.erase()


# The reference decomposition of hx.matmul_q for every format, as MLIR builders (the
# passes never trace JAX code): lowering/reference.py's matmul_q, op for op.

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


def _reference_matmul_q(x: ir.Value, q: ir.Value, s: ir.Value, dims) -> ir.Value:
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
  """:func:`_reference_matmul_q` for ``f32`` values ``qf`` with per-row scales ``s``
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
