"""``hx-fold-scales``' jaxpr stage: ``dot_general(x, hx_dequantize(q, s))`` -> ``hx_matmul_q``.

When the pipeline runs inside a JAX lowering (``hx.install``), the jaxpr is
still at hand before JAX turns it into StableHLO. The commonest pattern the
pass folds -- a hand-written ``x @ hx.dequantize(qw)`` whose dot is exactly
``hx.matmul_q``'s contract -- is rewritten there, one equation for two, at a
few microseconds per equation: JAX then lowers ``hx_matmul_q`` through its
own rules (on CPU the streaming decomposition, elsewhere the reference or a
registered kernel), exactly as if the user had written ``hx.matmul_q(x, qw)``.
Rewriting the same pattern in MLIR through the Python bindings costs about
0.25 ms per dot; this stage is what keeps ``hx.install()``'s lowering overhead
small on such models (``benchmarks/install_overhead.py``). Every other
pattern of the pass (open-coded dequantization, transposes, scales folded into
the result, batch dims on one side only) is left to the MLIR stage, which runs
afterwards as usual and gives the same result for anything this stage skips.

The rewrite: an equation ``y = dot_general(x, d)`` where ``d = hx_dequantize(q,
s)`` is defined in the same jaxpr, ``x: f32[*b, m, k]``, ``q: i8[*b, k, n]``,
dimension numbers ``(([r-1], [r-2]), ([0..r-3], [0..r-3]))`` -- or ``x: f32[..., k]``,
``q: i8[k, n]``, ``(([r-1], [0]), ([], []))`` (leading dims of x) --, default precision,
an ``f32`` (or default) preferred element type and no explicit output sharding,
becomes ``y = hx_matmul_q(x, q, s)`` (a ``bf16``/``f16`` ``x``, which the dot promotes,
first converted to f32 by its own equation, as ``hx.matmul_q`` converts it) when the
operand and result types meet ``hx.matmul_q``'s contract in ``lowering/schema.py``
(``f32 x i8, f32``, static shapes, result sharded like the dot's) and ``hx_matmul_q``'s
abstract evaluation gives exactly ``y``'s type (shape, dtype, sharding, manual axes). The equation keeps its source location and context.
``hx_dequantize`` equations left without uses are dropped. Sub-jaxprs of
``jit``, ``closed_call``, ``cond``, ``while``, ``scan``, ``checkpoint``,
``custom_jvp_call``, ``custom_vjp_call`` and ``shard_map`` are rewritten too
(each distinct sub-jaxpr once, so calls that shared one still do); other
primitives' sub-jaxprs (a Pallas kernel body, say) are lowered by their own
rules and left alone.

Numerics: ``hx_matmul_q`` computes ``(x * s) @ q``: the same products
reassociated, as the MLIR stage's rewrite (see ``fold_scales/__init__.py``).
"""

from __future__ import annotations

import numpy as np
from jax.extend import core
from jax.extend.core import primitives as P

from hxmlir import formats
from hxmlir.lowering import schema
from hxmlir.lowering.primitives import hx_dequantize_p, hx_matmul_q_p
from hxmlir.types import dotdims
from hxmlir.types import shardings as shd
from hxmlir.types.matmul_q_typing import dense_dtype

_F32 = np.dtype("float32")

# Primitives whose sub-jaxprs JAX lowers with the ordinary lowering rules.
_CALLERS = frozenset({P.jit_p, P.closed_call_p, P.call_p, P.cond_p, P.while_p, P.scan_p,
                      P.custom_jvp_call_p, P.custom_vjp_call_p})
_CALLER_NAMES = frozenset({"checkpoint", "remat", "shard_map"})


def fold_closed_jaxpr(closed: core.ClosedJaxpr) -> tuple[core.ClosedJaxpr, int]:
  """Rewrites ``closed`` (see the module docstring); returns it and the dots rewritten.

  Returns ``closed`` itself when nothing matched. Never raises for a pattern
  it does not handle: it leaves that equation as it is.
  """
  memo: dict[int, tuple] = {}  # id(sub-jaxpr) -> (it, rewritten)
  jaxpr, n = _fold(closed.jaxpr, memo)
  return (closed if jaxpr is closed.jaxpr else closed.replace(jaxpr=jaxpr)), n


def _fold(jaxpr: core.Jaxpr, memo: dict) -> tuple[core.Jaxpr, int]:
  dequantized: dict[core.Var, core.JaxprEqn] = {}
  eqns: list[core.JaxprEqn] = []
  count, changed = 0, False
  for eqn in jaxpr.eqns:
    prim = eqn.primitive
    if prim is hx_dequantize_p:
      dequantized[eqn.outvars[0]] = eqn
    elif prim is P.dot_general_p:
      d = eqn.invars[1]
      deq = dequantized.get(d) if isinstance(d, core.Var) else None
      if deq is not None:
        new = _as_matmul_q(eqn, deq)
        if new is not None:
          eqns += new
          count += 1
          changed = True
          continue
    elif eqn.params and (prim in _CALLERS or prim.name in _CALLER_NAMES):
      params, n = _fold_params(eqn.params, memo)
      count += n
      if params is not eqn.params:
        eqn = eqn.replace(params=params)
        changed = True
    eqns.append(eqn)
  if not changed:
    return jaxpr, count
  return jaxpr.replace(eqns=_drop_unused_dequantize(eqns, jaxpr.outvars)), count


def _as_matmul_q(dot: core.JaxprEqn, deq: core.JaxprEqn) -> list[core.JaxprEqn] | None:
  """``hx_matmul_q(x, q, s)`` in place of ``dot`` (after a ``convert_element_type`` of a
  bf16/f16 ``x`` to f32, as ``hx.matmul_q`` does: :data:`hxmlir.types.matmul_q_typing.DENSE_DTYPES`), or
  ``None`` if it is not that contract."""
  params = dot.params
  if params.get("precision") is not None or params.get("out_sharding") is not None:
    return None
  pet = params.get("preferred_element_type")
  if pet is not None and np.dtype(pet) != _F32:
    return None
  x = dot.invars[0]
  q, s, *o = deq.invars  # o: the offsets of a format with one (u4o, q8o)
  # the dense weight's rank (a block format's values have one more axis: its blocks' words)
  q_rank = len(formats.dense_shape_of(q.aval.dtype, q.aval.shape))
  dims = _matmul_q_dims(params["dimension_numbers"], x.aval.ndim, q_rank)
  if dims is None:
    return None
  convert = []
  if isinstance(x, core.Var) and dense_dtype(x.aval) not in (None, _F32):
    xf = core.Var(x.aval.update(dtype=_F32, weak_type=False))
    convert = [core.new_jaxpr_eqn([x], [xf], P.convert_element_type_p,
                                  {"new_dtype": _F32, "weak_type": False, "sharding": None},
                                  core.no_effects, dot.source_info, dot.ctx)]
    x = xf
  if _result_type(x.aval, q.aval, s.aval, *(v.aval for v in o), dims) != dot.outvars[0].aval:
    return None
  return [*convert, dot.replace(invars=[x, q, s, *o], primitive=hx_matmul_q_p,
                                params={"dimension_numbers": dims})]


def _matmul_q_dims(dims, x_rank: int, q_rank: int):
  """The dot's dimension numbers as ``hx_matmul_q``'s parameter, when they are one of
  ``hx.matmul_q``'s layouts: ``f32[*b, m, k] x q[*b, k, n]`` (equal ranks) or
  ``f32[..., k] x q[k, n]`` (leading dims of x; the CPU rule streams both); else
  ``None`` (other dims are left to the MLIR stage, which folds the scale into the
  dense operand or the result)."""
  dims = dotdims.normalize(dims)
  return dims if dims == dotdims.matmul_dims(x_rank, q_rank) else None


def _result_type(*avals_and_dims):
  """``hx_matmul_q``'s result type for operand types ``avals``, or ``None`` when they break
  its contract (``lowering/schema.py``: types, static shapes, shardings).

  Memoised: a model's layers repeat a few operand types, and the abstract
  evaluation (which builds shardings) costs ~10 us.
  """
  *avals, dims = avals_and_dims
  got = _RESULT_TYPES.get(avals_and_dims, _MISSING)
  if got is _MISSING:
    try:
      out, effects = hx_matmul_q_p.abstract_eval(*avals, dimension_numbers=dims)
      got = None if effects or _breaks_contract(avals, out, dims) else out
    except (TypeError, ValueError):
      got = None
    if len(_RESULT_TYPES) >= _RESULT_TYPES_MAX:
      _RESULT_TYPES.clear()
    _RESULT_TYPES[avals_and_dims] = got
  return got


def _breaks_contract(operands, result, dims) -> bool:
  """Whether ``hx.matmul_q`` with these operand and result avals breaks the schema's
  contract: a dtype other than ``f32 x i8, f32`` (an ``x`` no convert made f32),
  a symbolic dimension (composites need static shapes), shardings the schema refuses."""
  spec = schema.SCHEMAS["hx.matmul_q"]
  types = [_schema_type(a) for a in (*operands, result)]
  n = len(operands)  # x, q, s and, for a format with an offset, o
  if None in types or isinstance(schema.quantized_format(*types[1:n]), str):
    return True
  attrs = schema.matmul_q_attributes(dims, schema.format_attributes_of(*types[1:n]))
  if spec.check_types(types[:n], types[n:], attrs):
    return True
  shardings = [_dim_sharding(a) for a in (*operands, result)]
  return bool(spec.check_shardings(shardings[:n], shardings[n:], attrs))


def _schema_type(aval) -> schema.TensorType | None:
  if not all(type(d) is int for d in aval.shape):
    return None
  return schema.TensorType.of(aval)


def _dim_sharding(aval) -> schema.DimSharding:
  return tuple(() if p is None else (p,) if isinstance(p, str) else tuple(p)
               for p in shd.partitions(aval.sharding, aval.ndim))


_MISSING = object()
_RESULT_TYPES: dict[tuple, object] = {}
_RESULT_TYPES_MAX = 1024


def _fold_params(params: dict, memo: dict) -> tuple[dict, int]:
  """``params`` with their sub-jaxprs rewritten (the same dict if none changed) and the
  number of dots newly rewritten."""
  new, count = params, 0
  for key, val in params.items():
    if isinstance(val, tuple) and val and isinstance(val[0], (core.Jaxpr, core.ClosedJaxpr)):
      got = [_fold_sub(v, memo) for v in val]
      count += sum(n for _, n in got)
      res = tuple(v for v, _ in got)
      changed = any(a is not b for a, b in zip(res, val))
    elif isinstance(val, (core.Jaxpr, core.ClosedJaxpr)):
      res, n = _fold_sub(val, memo)
      count += n
      changed = res is not val
    else:
      continue
    if changed:
      if new is params:
        new = dict(params)
      new[key] = res
  return new, count


def _fold_sub(val, memo: dict):
  """A sub-jaxpr (open or closed) rewritten, and the dots rewritten in it; a sub-jaxpr
  met again (one ``jit`` called twice) gets the same rewritten object and counts 0."""
  got = memo.get(id(val))
  if got is not None and got[0] is val:
    return got[1], 0
  if isinstance(val, core.ClosedJaxpr):
    jaxpr, n = _fold(val.jaxpr, memo)
    res = val if jaxpr is val.jaxpr else val.replace(jaxpr=jaxpr)
  else:
    res, n = _fold(val, memo)
  memo[id(val)] = (val, res)
  return res, n


def _drop_unused_dequantize(eqns: list, outvars) -> list:
  used = {v for v in outvars if isinstance(v, core.Var)}
  for eqn in eqns:
    used.update(v for v in eqn.invars if isinstance(v, core.Var))
  return [e for e in eqns if e.primitive is not hx_dequantize_p or e.outvars[0] in used]
