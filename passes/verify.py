"""``hx-verify``: checks every ``hx.*`` composite against the IR contract.

The contract (the composite schema; README, "They reach StableHLO") is read from
:mod:`hxmlir.lowering.schema`; for each ``stablehlo.composite "hx.*"`` op:

- the name is a known op and its ``version`` one this code accepts;
- ``composite_attributes`` has exactly the schema's keys, with values of the
  schema's types (``int`` is an ``i64`` integer attribute);
- operand and result counts, and every type invariant of the schema
  (``i8[..., n]`` values with ``f32[...]`` scales, matmul shapes, ...);
- ``decomposition`` names a private ``func.func`` of the module whose
  signature equals the composite's exactly, and whose body is plain StableHLO
  (``stablehlo.*``, ``func.return``, ``func.call`` of plain functions, and
  ``sdy.sharding_constraint``);
- ``sdy.sharding``, when present, has one sharding per result of the
  result's rank, and the operand and result shardings satisfy the schema's
  sharding invariants. Operand shardings are read from the defining
  ``sdy.sharding_constraint`` (or ``sdy.sharding`` of the defining op, or the
  function argument's ``sdy.sharding``); unknown shardings are not checked.

Every problem is reported at the composite's location; the pass then fails
once. The module is never modified.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir

from hxmlir import formats
from hxmlir.lowering import composite, schema
from hxmlir.passes import ops, shardings, symbols
from hxmlir.passes.base import HxPass, PassContext, PassResult
from hxmlir.types import shardings as type_shardings

# Ops a decomposition may hold besides StableHLO: calls, and the Shardy ops that keep
# sharding (JAX emits sharding constraints; Shardy's propagation pipeline turns
# constants into ``sdy.constant`` so they are not deduplicated across shardings, and
# its export pipeline turns them back), and the per-shard computation of a kernel in a
# program over several devices (``sdy.manual_computation``, ``lowering/matmul_q/pallas.py``).
_PLAIN_OTHER = ("func.return", "func.call", "sdy.sharding_constraint", "sdy.constant",
                "sdy.manual_computation", "sdy.return")


def _attr_matches(attr: ir.Attribute, want: type) -> str | None:
  """``None`` when ``attr`` fits the Python type ``want``, else what it should be."""
  if want is bool:
    return None if isinstance(attr, ir.BoolAttr) else "a bool attribute"
  if want is int:
    ok = isinstance(attr, ir.IntegerAttr) and not isinstance(attr, ir.BoolAttr) and \
        str(attr.type) == "i64"
    return None if ok else "an i64 integer attribute"
  if want is float:
    return None if isinstance(attr, ir.FloatAttr) else "a float attribute"
  if want is str:
    return None if isinstance(attr, ir.StringAttr) else "a string attribute"
  if want is tuple:
    # a portable artifact's round trip turns array<i64: ...> into dense<...> : tensor<Nxi64>
    ok = isinstance(attr, ir.DenseI64ArrayAttr) or (
        isinstance(attr, ir.DenseIntElementsAttr) and str(attr.type.element_type) == "i64")
    return None if ok else "an array<i64: ...> attribute"
  return None


# Every attribute a composite's verdict depends on (others make the count differ).
_KEY_ATTRS = ("name", "version", "composite_attributes", "decomposition", "sdy.sharding")


@dataclass(frozen=True)
class VerifyPass(HxPass):
  """Checks every ``hx.*`` composite against lowering/schema.py; reports all problems.

  No options. Never modifies the module.
  """
  name: ClassVar[str] = "hx-verify"
  summary: ClassVar[str] = "check every hx.* composite against the IR contract (lowering/schema.py)"
  analysis: ClassVar[bool] = True

  def apply(self, module: ir.Operation, diags: PassContext) -> PassResult:
    # Per symbol table (module; one unless modules nest): its functions and which
    # of them are plain StableHLO.
    scopes: dict = {}
    plain_caches: dict = {}
    nested = len(ops.ops_named(module, "builtin.module")) > 1
    # Composites equal in everything the check reads get the same verdict: a
    # model's repeated layers are checked once. The key holds the attributes the
    # contract is about and the operand shardings; operand and result types need
    # no place in it, since MLIR's verifier (run on every parsed or JAX-lowered
    # module) already requires them to equal the decomposition's signature, which
    # the decomposition symbol names. Attributes are uniqued, so the key hashes
    # cheaply; reading named attributes beats iterating the attribute dict ~15x.
    # The verdict of a composite outside the hx namespace is None (not ours).
    verdicts: dict[tuple, list[str] | None] = {}
    checked = 0
    sharding = shardings.value_sharding_attr
    # In a module without any sharding (most of them), every operand's is unknown.
    sharded = shardings.may_have_shardings(module)
    for op in ops.ops_named(module, "stablehlo.composite"):
      attrs = op.attributes
      key = (len(attrs), *[attrs[k] if k in attrs else None for k in _KEY_ATTRS],
             *([sharding(v) for v in op.operands] if sharded else [len(op.operands)]))
      scope = symbols.enclosing_module(op) if nested else None
      if nested:
        key = (scope, *key)
      problems = verdicts.get(key, verdicts)  # (the dict itself: not seen yet)
      if problems is verdicts:
        problems = verdicts[key] = (
            _check_composite(op, symbols.scope_funcs(op, module, scopes),
                             plain_caches.setdefault(scope, {}))
            if ops.is_hx_composite(op) else None)
      if problems is not None:
        checked += 1
        for problem in problems:
          diags.error(op, f"'{ops.composite_name(op)}' {problem}")
    return PassResult(changed=False, stats={"composites checked": checked})


def _check_composite(op: ir.Operation, funcs, plain_cache) -> list[str]:
  name = ops.composite_name(op)
  spec = schema.lookup(name)
  if spec is None:
    return [f"is not a known hx composite; known: {', '.join(sorted(schema.SCHEMAS))}"]
  errs = []
  version_attr = ops.attr_or_none(op, "version")
  version = ir.IntegerAttr(version_attr).value if version_attr is not None else 0
  if version not in spec.versions:
    errs.append(f"version {version} is not accepted; this code accepts "
                f"{', '.join(map(str, spec.versions))}")
  # an unknown version's attributes are unknown too
  attr_errs = _check_attributes(op, spec, version) if version in spec.versions else []
  errs += attr_errs
  attrs = composite.read_attributes(ops.attr_or_none(op, "composite_attributes"))
  if not attr_errs and version in spec.versions:
    problem = spec.format_problem(version, attrs)
    if problem:
      attr_errs.append(problem)
      errs.append(problem)
  operands, results = list(op.operands), list(op.results)
  n_ops, n_res = spec.counts(attrs)  # a format's offset is one more operand or result
  if len(operands) != n_ops or len(results) != n_res:
    errs.append(f"{spec.signature} takes {n_ops} operand(s) and "
                f"{n_res} result(s), got {len(operands)} and {len(results)}")
    return errs
  in_t = [ops.tensor_type(v.type) for v in operands]
  out_t = [ops.tensor_type(v.type) for v in results]
  bad = [f"{what} #{i} has type {v.type}" for what, vals, ts in
         (("operand", operands, in_t), ("result", results, out_t))
         for i, (v, t) in enumerate(zip(vals, ts)) if t is None]
  if bad:
    errs.append(f"needs statically shaped ranked tensors: {'; '.join(bad)}")
  elif not attr_errs:  # the type rules read the attributes: only well-formed ones
    errs += spec.check_types(in_t, out_t, attrs)
  errs += _check_decomposition(op, funcs, plain_cache)
  if not bad and not attr_errs:
    errs += _check_shardings(op, spec, attrs)
    errs += _check_whole_groups(op, spec, attrs)
  return errs


def _check_attributes(op: ir.Operation, spec: schema.OpSchema, version: int) -> list[str]:
  attrs = ops.attr_or_none(op, "composite_attributes")
  have = {} if attrs is None else {a.name: a.attr for a in ir.DictAttr(attrs)}
  keys = spec.attributes_of(version)
  errs = []
  missing = sorted(set(keys) - set(have))
  extra = sorted(set(have) - set(keys))
  if missing or extra:
    errs.append(f"composite_attributes must have keys {sorted(keys)}, got "
                f"{sorted(have)}")
  for key, want in keys.items():
    if key in have:
      should = _attr_matches(have[key], want)
      if should is not None:
        errs.append(f"attribute '{key}' must be {should}, got {have[key]}")
  return errs


def _check_decomposition(op: ir.Operation, funcs, plain_cache) -> list[str]:
  attr = ops.attr_or_none(op, "decomposition")
  sym = symbols.symbol_ref(attr) if attr is not None else None
  if sym is None:
    return ["has no decomposition function"]
  fn = funcs.get(sym)
  if fn is None:
    return [f"decomposition @{sym} is not a func.func of this module"]
  errs = []
  vis = ops.attr_or_none(fn, "sym_visibility")
  if vis is None or ir.StringAttr(vis).value != "private":
    errs.append(f"decomposition @{sym} must be private")
  ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
  got_in, got_out = list(ftype.inputs), list(ftype.results)
  want_in = [v.type for v in op.operands]
  want_out = [v.type for v in op.results]
  if got_in != want_in or got_out != want_out:
    errs.append(
        f"decomposition @{sym} has signature ({', '.join(map(str, got_in))}) -> "
        f"({', '.join(map(str, got_out))}), but the composite has "
        f"({', '.join(map(str, want_in))}) -> ({', '.join(map(str, want_out))})")
  foreign = _non_plain_op(sym, funcs, plain_cache, set())
  if foreign is not None:
    errs.append(f"decomposition @{sym} is not plain StableHLO: it contains '{foreign}'")
  return errs


def _non_plain_op(sym: str, funcs, cache, visiting: set) -> str | None:
  """The first op in function ``sym`` (or its callees) that is not plain StableHLO."""
  if sym in cache:
    return cache[sym]
  if sym in visiting or sym not in funcs:
    return None
  visiting.add(sym)
  found = None
  for op in ops.walk(funcs[sym]):
    if op.name.startswith("stablehlo.") or op.name in _PLAIN_OTHER:
      if op.name == "func.call":
        found = _non_plain_op(symbols.symbol_ref(op.attributes["callee"]), funcs, cache,
                              visiting)
        if found is not None:
          break
      continue
    found = op.name
    break
  cache[sym] = found
  return found


def _check_shardings(op: ir.Operation, spec: schema.OpSchema, attrs: dict) -> list[str]:
  results = list(op.results)
  raw = ops.attr_or_none(op, "sdy.sharding")
  attr = shardings.as_per_value(raw)
  res_sh: list = [None] * len(results)
  errs = []
  if raw is not None:
    if attr is None:
      return [f"sdy.sharding must be #sdy.sharding_per_value<[...]>, got {raw}"]
    per_result = attr.shardings
    if len(per_result) != len(results):
      return [f"sdy.sharding has {len(per_result)} sharding(s) for {len(results)} result(s)"]
    for i, (s, v) in enumerate(zip(per_result, results)):
      rank = ir.RankedTensorType(v.type).rank
      n = len(shardings.as_tensor_sharding(s).dimension_shardings)
      if n != rank:
        errs.append(f"result #{i} sharding {s} has {n} dimension(s) for a rank-{rank} result")
      else:
        res_sh[i] = shardings.dim_sharding(s, rank)
  if errs:
    return errs
  op_sh = [shardings.value_sharding(v) for v in op.operands]
  return spec.check_shardings(op_sh, res_sh, attrs)


def _check_whole_groups(op: ir.Operation, spec: schema.OpSchema, attrs=None) -> list[str]:
  """A sharded quantized (last) axis must split into whole groups and stored values.

  The rule of :func:`hxmlir.formats.split_problem`, the types' own (README, "Sharding
  is checked by the type"), on the values' and the group scale's last-axis shardings of
  the schema's ``quantized_pair``, with the sizes of the mesh they name; nothing is
  checked for unknown shardings or an undeclared mesh.
  """
  pair = spec.quantized_pair
  if pair is None:
    return []
  what, iq, i_s = pair
  vals = list(op.results if what == "result" else op.operands)
  q_t, s_t = (ops.tensor_type(vals[i].type) for i in (iq, i_s))
  o_t = ops.tensor_type(vals[i_s + 1].type) if (attrs or {}).get("offset") else None
  fmt = schema.quantized_format(q_t, s_t, o_t)
  if isinstance(fmt, str):  # reported by the type check
    return []
  f, group, dense = fmt
  # the components whose last axis is the quantized one: the values, and a group scale
  # (formats.scale_parts: a row scale lacks that axis)
  carriers = [(i, t) for i, t in ((iq, q_t), (i_s, s_t)) if len(t.shape) == len(q_t.shape)]
  seen = set()
  for i, t in carriers:
    attr = (shardings.result_sharding_attr(op, i) if what == "result"
            else shardings.value_sharding_attr(vals[i]))
    sh = shardings.dim_sharding(attr, len(t.shape))
    if sh is None or not sh[-1] or sh[-1] in seen:
      continue
    seen.add(sh[-1])
    sizes = shardings.mesh_axis_sizes(attr, op)
    ways = shardings.axes_size(sh[-1], sizes) if sizes is not None else None
    if ways is None or ways == 1:
      continue
    # the type as the user wrote it: q4[4,128@i:g32] (a group scale's dims stand for the
    # values' leading dims and the quantized axis)
    parts = [None if not d else d[0] if len(d) == 1 else d for d in sh]
    ty = formats.type_name(f, type_shardings.dims_str(dense, parts), group)
    over = ", ".join(f"'{a}'={shardings.axes_size((a,), sizes)}" for a in sh[-1])
    problem = formats.split_problem(f, dense[-1], group, ways, str(q_t.dtype))
    if problem:
      return [f"{what}: {ty} sharded over mesh axis {over}: {problem}"]
  return []
