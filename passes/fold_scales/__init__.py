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

The package: ``match.py`` (the matcher: :class:`~hxmlir.passes.fold_scales.match.Dequant`),
``int8.py`` (the int8 fold onto the other operand or the result), ``int8_matmul_q.py``
(``hx.matmul_q`` formed from an int8-per-row match), ``format_fold.py`` (the other formats'
``hx.matmul_q``), ``reference.py`` (their reference decomposition as MLIR) and
``rewrite.py`` (what the rewrites share: op creation, shardings, dead-op erasure).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir

from hxmlir.passes import ops, symbols
from hxmlir.passes.base import HxPass, PassContext, PassResult, PipelineError
from hxmlir.passes.fold_scales import format_fold, int8
from hxmlir.passes.fold_scales.match import Inconsistent, match_operand
from hxmlir.passes.fold_scales.rewrite import State

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
    state = State(impl=self._decomposition_impl(ctx.platforms))
    reported: set = set()
    for dot in ops.ops_named(module, "stablehlo.dot_general"):
      for side in (1, 0):
        try:
          m = match_operand(dot.operands[side])
        except Inconsistent as e:
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
          how = format_fold.fold(module, dot, side, m, state) if self.form_matmul_q else None
        else:
          how = int8.fold(module, dot, side, m, state, self.form_matmul_q)
        if how is not None:
          stats["scales folded"] += 1
          stats[how] += 1
          break
    changed = stats["scales folded"] > 0
    if changed:
      symbols.erase_unused_functions(module, state.dropped)
    return PassResult(changed=changed, stats=stats if changed else {})
