"""Lowering to ``hx.*`` composites: numerics, decompositions, shardings, the emitter's API.

The IR text itself is pinned by the lit suite (tests/lit/lowering); these tests
read the lowered modules with ``jaxlib.mlir`` and check what the text cannot
show: that the composites compute exactly what their decompositions compute
alone, that the decompositions are the same for every platform, that
shardings satisfy the schema whatever the order of operations, and the errors
of :mod:`hxmlir.lowering.composite`.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from jax.interpreters import mlir
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as func_dialect
from jaxlib.mlir.dialects import sdy
from jaxlib.mlir.dialects import stablehlo as hlo
from numerics import assert_within, dot_bound
from test_attention_native import XLA_EXP_ULPS, attention64

import hxmlir as hx
from hxmlir.lowering import composite, reference, schema
from hxmlir.lowering.primitives import hx_dequantize_p

# --- helpers -----------------------------------------------------------------


def _parse(text: str) -> ir.Module:
  return ir.Module.parse(text)


def _sym(op) -> str:
  return ir.StringAttr(op.attributes["sym_name"]).value


def _funcs(module: ir.Module) -> dict:
  return {_sym(op): op for op in module.body.operations if op.operation.name == "func.func"}


def _sharding(attr) -> tuple:
  """A ``TensorShardingAttr`` as schema.DimSharding: per dim, the axis names."""
  t = sdy.TensorShardingAttr(attr)
  return tuple(tuple(sdy.AxisRefAttr(a).name for a in sdy.DimensionShardingAttr(d).axes)
               for d in t.dimension_shardings)


def _composites(module: ir.Module) -> list[dict]:
  """Every ``stablehlo.composite`` in ``module``, with types and shardings read off the IR."""
  found = []

  def visit(op):
    if op.name == "stablehlo.composite":
      operand_sh = []
      for v in op.operands:
        owner = v.owner
        if isinstance(owner, ir.OpView):
          owner = owner.operation
        if isinstance(owner, ir.Operation) and owner.name == "sdy.sharding_constraint":
          operand_sh.append(_sharding(owner.attributes["sharding"]))
        else:
          operand_sh.append(None)
      result_sh = [None] * len(op.results)
      if "sdy.sharding" in op.attributes:
        per_value = sdy.TensorShardingPerValueAttr(op.attributes["sdy.sharding"])
        result_sh = [_sharding(s) for s in per_value.shardings]
      found.append(dict(
          name=ir.StringAttr(op.attributes["name"]).value,
          version=ir.IntegerAttr(op.attributes["version"]).value,
          attributes={a.name: a.attr for a in ir.DictAttr(op.attributes["composite_attributes"])}
          if "composite_attributes" in op.attributes else {},
          decomposition=ir.FlatSymbolRefAttr(op.attributes["decomposition"]).value,
          operand_types=[str(v.type) for v in op.operands],
          result_types=[str(r.type) for r in op.results],
          operand_shardings=operand_sh, result_shardings=result_sh))
    return ir.WalkResult.ADVANCE

  module.operation.walk(visit)
  return found


def _tensor_type(t: str) -> schema.TensorType:
  ty = ir.RankedTensorType(ir.Type.parse(t))
  return schema.TensorType(tuple(ty.shape), str(ty.element_type))


def _lower(fn, *args, platforms=None) -> str:
  traced = jax.jit(fn).trace(*args)
  lowered = traced.lower(lowering_platforms=platforms) if platforms else traced.lower()
  return lowered.as_text(debug_info=False)


def _decomposition_alone(module_text: str, symbol: str, ref, lo_args):
  """Runs function ``@symbol`` of ``module_text`` as a module of its own, on CPU.

  It is compiled the way JAX compiles any program: as the module of a
  ``jax.export.Exported`` of ``ref`` (same signature), in place of ``ref``'s own.
  """
  with mlir.make_ir_context():
    module = _parse(module_text)
    fn = _funcs(module)[symbol]
    alone = ir.Module.create(loc=ir.Location.unknown())
    with ir.InsertionPoint(alone.body):
      main = fn.operation.clone()
    main.attributes["sym_name"] = ir.StringAttr.get("main")
    main.attributes["sym_visibility"] = ir.StringAttr.get("public")
    target = hlo.get_version_from_compatibility_requirement(
        hlo.StablehloCompatibilityRequirement.WEEK_4)
    artifact = hlo.serialize_portable_artifact(alone, target)
  exported = jax.export.export(jax.jit(ref))(*lo_args)
  exported = dataclasses.replace(exported, mlir_module_serialized=artifact)
  return _flat(exported.call(*lo_args))


def _flat(out) -> list[np.ndarray]:
  """Lo arrays of a (possibly hi, possibly tuple) result."""
  if isinstance(out, hx.QArray):
    return [np.asarray(out.qvalue), np.asarray(out.scale)]
  if isinstance(out, hx.Rank1):
    return [np.asarray(out.col), np.asarray(out.row)]
  if isinstance(out, (tuple, list)):
    return [a for o in out for a in _flat(o)]
  return [np.asarray(out)]


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
  return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# Rows with every edge case of quantize: ordinary, all zero, NaN, +inf, large.
_X = np.random.default_rng(0).normal(size=(6, 7)).astype(np.float32)
_X[1] = 0.0
_X[2, 3] = np.nan
_X[3, 0] = np.inf
_X[4] *= 1e30
_W = np.random.default_rng(1).normal(size=(7, 5)).astype(np.float32)
_COL = np.random.default_rng(2).normal(size=(7,)).astype(np.float32)
_ROW = np.random.default_rng(3).normal(size=(5,)).astype(np.float32)
_QW = hx.quantize(_W)
_R1 = hx.outer(_COL, _ROW)

# op -> (hi function, hi arguments, lo arguments of the composite)
CASES = {
    "hx.quantize": (hx.quantize, (_X,), (_X,)),
    "hx.dequantize": (hx.dequantize, (_QW,), (_QW.qvalue, _QW.scale)),
    "hx.matmul_q": (hx.matmul_q, (_X[[0, 5]], _QW), (_X[[0, 5]], _QW.qvalue, _QW.scale)),
    "hx.outer": (hx.outer, (_COL, _ROW), (_COL, _ROW)),
    "hx.matmul_r1": (hx.matmul_r1, (_X, _R1), (_X, _R1.col, _R1.row)),
}
REFERENCES = {"hx.quantize": reference.quantize, "hx.dequantize": reference.dequantize,
              "hx.matmul_q": reference.matmul_q, "hx.outer": reference.outer,
              "hx.matmul_r1": reference.matmul_r1}


# --- numerics ----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_composite_is_bit_identical_to_its_decomposition_alone(name):
  fn, args, lo_args = CASES[name]
  text = _lower(fn, *args)
  with mlir.make_ir_context():
    (comp,) = _composites(_parse(text))
  assert comp["name"] == name
  got = _flat(jax.jit(fn)(*args))
  want = _decomposition_alone(text, comp["decomposition"], REFERENCES[name], lo_args)
  assert len(got) == len(want) == schema.SCHEMAS[name].num_results
  for g, w in zip(got, want):
    assert _bits_equal(g, w), (name, g, w)


@pytest.mark.parametrize("name", sorted(CASES))
def test_composite_matches_jitted_reference(name):
  fn, args, lo_args = CASES[name]
  got = _flat(jax.jit(fn)(*args))
  want = _flat(jax.jit(REFERENCES[name])(*lo_args))
  for g, w in zip(got, want):
    assert _bits_equal(g, w), (name, g, w)


def test_quantize_values_against_numpy():
  q, s = _flat(jax.jit(hx.quantize)(_X))
  with np.errstate(invalid="ignore", over="ignore"):
    amax = np.abs(_X).max(axis=-1)
  finite = np.isfinite(amax)
  want_s = np.where(finite, amax / np.float32(127), np.nan).astype(np.float32)
  np.testing.assert_array_equal(s, want_s)
  ok = finite & (amax > 0)
  want_q = np.zeros_like(_X, dtype=np.int8)
  want_q[ok] = np.clip(np.rint(_X[ok] / want_s[ok, None]), -127, 127).astype(np.int8)
  np.testing.assert_array_equal(q, want_q)
  assert s[1] == 0 and not q[1].any()          # all-zero row: zeros, finite scale
  assert np.isnan(s[2]) and np.isnan(s[3])     # NaN / inf rows: NaN scale
  deq = np.asarray(jax.jit(hx.dequantize)(jax.jit(hx.quantize)(_X)))
  assert np.isnan(deq[2]).all() and np.isnan(deq[3]).all()


# --- the IR ------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_composite_follows_the_schema(name):
  fn, args, _ = CASES[name]
  with mlir.make_ir_context():
    module = _parse(_lower(fn, *args))
    (comp,) = _composites(module)
    spec = schema.lookup(name)
    # the formats with f32 scales and no offset keep the version that holds them (legacy_version)
    assert comp["version"] == spec.version_for(comp["attributes"])
    assert set(comp["attributes"]) == set(spec.attributes_of(comp["version"]))
    problems = spec.check_types([_tensor_type(t) for t in comp["operand_types"]],
                                [_tensor_type(t) for t in comp["result_types"]])
    assert problems == []
    fn_op = _funcs(module)[comp["decomposition"]]
    ftype = ir.FunctionType(ir.TypeAttr(fn_op.attributes["function_type"]).value)
    assert [str(t) for t in ftype.inputs] == comp["operand_types"]
    assert [str(t) for t in ftype.results] == comp["result_types"]
    assert ir.StringAttr(fn_op.attributes["sym_visibility"]).value == "private"
  if name == "hx.quantize":
    assert str(comp["attributes"]["qmax"]) == f"{schema.QMAX} : i64"


@pytest.mark.parametrize("name", sorted(CASES))
def test_decomposition_is_the_same_for_every_platform(name):
  fn, args, _ = CASES[name]
  bodies = {}
  for platform in ("cpu", "cuda", "tpu"):
    text = _lower(fn, *args, platforms=(platform,))
    with mlir.make_ir_context():
      module = _parse(text)
      (comp,) = _composites(module)
      bodies[platform] = str(_funcs(module)[comp["decomposition"]])
  assert bodies["cpu"] == bodies["cuda"] == bodies["tpu"]


def test_identical_decompositions_are_shared_within_a_module():
  def f(a, b, c):
    return hx.quantize(a), hx.quantize(b), hx.quantize(c)
  text = _lower(f, _X, _X + 1, _W)
  with mlir.make_ir_context():
    module = _parse(text)
    comps = _composites(module)
    funcs = [s for s in _funcs(module) if s.startswith("hx.quantize")]
  assert [c["decomposition"] for c in comps] == \
      ["hx.quantize.impl", "hx.quantize.impl", "hx.quantize.impl_0"]
  assert sorted(funcs) == ["hx.quantize.impl", "hx.quantize.impl_0"]


def test_composite_location_is_the_users_line():
  def user_fn(x):
    return hx.quantize(x)  # the line below must appear in the composite's location
  line = user_fn.__code__.co_firstlineno + 1
  text = jax.jit(user_fn).lower(_X).as_text(debug_info=True)
  with mlir.make_ir_context():
    module = _parse(text)
    ops = []
    module.operation.walk(lambda op: (ops.append(op) if op.name == "stablehlo.composite"
                                      else None) or ir.WalkResult.ADVANCE)
    (op,) = ops
    loc = str(op.location)
  assert "test_lowering.py" in loc and f":{line}:" in loc, loc


# --- shardings ---------------------------------------------------------------

def _sharded_program(order: str):
  """Every op on sharded values; ``order`` permutes the independent operations."""
  def f(x, xb, w, wb, col, row, q, k, v, start):
    steps = {
        "q": lambda: hx.quantize(w),
        "qb": lambda: hx.quantize(wb),
        "r": lambda: hx.outer(col, row),
    }
    env = {k: steps[k]() for k in (order.split(",") if order else steps)}
    ys = {
        "mq": lambda: hx.matmul_q(x, env["q"]),
        "mqb": lambda: hx.matmul_q(xb, env["qb"]),
        "dq": lambda: hx.dequantize(env["qb"]),
        "mr": lambda: hx.matmul_r1(x, env["r"]),
        "at": lambda: hx.attention(q, k, v, start, scale=0.5),
    }
    keys = ["mq", "mqb", "dq", "mr", "at"]
    if order:
      keys = keys[::-1]
    out = {k: ys[k]() for k in keys}
    return out["mq"], out["mqb"], out["dq"], out["mr"], out["at"]
  return f


def _sharded_args():
  rng = np.random.default_rng(4)
  arr = lambda *s: rng.normal(size=s).astype(np.float32)
  return [
      jax.device_put(arr(8, 6), P("i", None)),             # x: rows over i
      jax.device_put(arr(4, 8, 6), P("i", "j", None)),     # xb: batch over i, rows over j
      jax.device_put(arr(6, 5), P(None, None)),            # w: replicated
      jax.device_put(arr(4, 6, 5), P("i", None, None)),    # wb: batch over i
      jax.device_put(arr(6), P(None)),                     # col
      jax.device_put(arr(4), P("j")),                      # row: over j
      jax.device_put(arr(4, 2, 3, 6), P("i", "j", None, None)),  # q: queries over i, heads j
      jax.device_put(arr(2, 8, 6), P("j", None, None)),    # k: heads over j
      jax.device_put(arr(2, 6, 8), P("j", None, None)),    # v: heads over j
      jax.device_put(np.int32(3), P()),                    # start
  ]


def _sharding_table(text: str) -> dict:
  with mlir.make_ir_context():
    comps = _composites(_parse(text))
  table = {}
  for c in comps:
    key = (c["name"], tuple(c["operand_types"]))
    entry = (tuple(c["operand_shardings"]), tuple(c["result_shardings"]))
    assert table.setdefault(key, entry) == entry, key
  return table


def test_sharded_composites_satisfy_the_schema_and_the_hi_types(mesh):
  with jax.set_mesh(mesh):
    args = _sharded_args()
    table = _sharding_table(_lower(_sharded_program(""), *args))
  assert {name for name, _ in table} == set(schema.SCHEMAS)
  for (name, _), (ops, res) in table.items():
    assert all(s is not None for s in ops + res), name
    assert schema.lookup(name).check_shardings(ops, res) == [], name
  by_types = {(n, t): v for (n, t), v in table.items()}
  # matmul_q on the batched operands: rows like x (j), batch like both (i), columns like w.
  ops, res = by_types[("hx.matmul_q", ("tensor<4x8x6xf32>", "tensor<4x6x5xi8>",
                                       "tensor<4x6xf32>"))]
  assert ops == ((("i",), ("j",), ()), (("i",), (), ()), (("i",), ()))
  assert res == ((("i",), ("j",), ()),)
  # quantize of the batched weight: the scale is the values' sharding without the last axis.
  ops, res = by_types[("hx.quantize", ("tensor<4x6x5xf32>",))]
  assert res == ((("i",), (), ()), (("i",), ()))
  # matmul_r1: rows like x (i), columns like row (j).
  ops, res = by_types[("hx.matmul_r1", ("tensor<8x6xf32>", "tensor<6xf32>", "tensor<4xf32>"))]
  assert res == ((("i",), ("j",)),)


def test_sharding_annotations_do_not_depend_on_the_order_of_operations(mesh):
  with jax.set_mesh(mesh):
    args = _sharded_args()
    a = _sharding_table(_lower(_sharded_program(""), *args))
    b = _sharding_table(_lower(_sharded_program("r,qb,q"), *args))
  assert a == b and len(a) == 8


def _reference_program(x, xb, w, wb, col, row, aq, ak, av, start):
  q, s = reference.quantize(w)
  qb, sb = reference.quantize(wb)
  c, r = reference.outer(col, row)
  return (reference.matmul_q(x, q, s), reference.matmul_q(xb, qb, sb),
          reference.dequantize(qb, sb), reference.matmul_r1(x, c, r),
          reference.attention(aq, ak, av, start, scale=0.5))


def test_sharded_run_is_bit_identical_to_the_sharded_reference(mesh):
  with jax.set_mesh(mesh):
    args = _sharded_args()
    got = jax.jit(_sharded_program(""))(*args)
    want = jax.jit(_reference_program)(*args)
  assert got[1].sharding.spec == P("i", "j", None)
  assert got[3].sharding.spec == P("i", "j")
  for g, w in zip(got, want):
    assert g.sharding == w.sharding
    assert _bits_equal(np.asarray(g), np.asarray(w))
  # and close to the unsharded program (XLA may tile the sharded dots differently): two
  # f32 evaluations of each dot (the scale or the row factor one more rounding per term),
  # and the same dequantized values (quantize takes a max: its result is exact)
  x, xb, w, wb, col, row, aq, ak, av, start = (np.asarray(a) for a in args)
  wd, wbd = (np.asarray(hx.dequantize(hx.quantize(v))) for v in (w, wb))
  bounds = [2 * dot_bound("mk,kn->mn", x, wd, extra=2),
            2 * dot_bound("bmk,bkn->bmn", xb, wbd, extra=2), 0.0,
            2 * dot_bound("mk,k,n->mn", x, col, row, extra=2),
            2 * attention64(aq, ak, av, 3, 0.5, XLA_EXP_ULPS)[1]]
  plain = jax.jit(_sharded_program(""))(x, xb, w, wb, col, row, aq, ak, av, start)
  for i, (g, p, bound) in enumerate(zip(got, plain, bounds)):
    assert_within(g, p, bound, f"result {i}: ")


# --- the emitter on plain MLIR (level 1) -------------------------------------

_MODULE = """
func.func @f(%q: tensor<4x6xi8>, %s: tensor<4xf32>) -> tensor<4x6xf32> {
  %0 = stablehlo.convert %q : (tensor<4x6xi8>) -> tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}
"""


def _dequantize_builder(args):
  q, s = args
  f32 = ir.F32Type.get()
  qf = hlo.ConvertOp(ir.RankedTensorType.get([4, 6], f32), q).result
  sb = hlo.BroadcastInDimOp(ir.RankedTensorType.get([4, 6], f32), s,
                            mlir.dense_int_array([0])).result
  return [hlo.MulOp(qf, sb).result]


def _with_module(body):
  with mlir.make_ir_context(), ir.Location.unknown():
    module = _parse(_MODULE)
    fn = _funcs(module)["f"]
    block = fn.regions[0].blocks[0]
    ret = list(block.operations)[-1]
    with ir.InsertionPoint(ret):
      result = body(block, ret)
    return module, result


Q8 = schema.format_attributes("int8", None)  # hx.dequantize v2's attributes for i8 per row


def test_build_composite_on_plain_mlir_creates_a_verified_composite():
  def body(block, ret):
    q, s = block.arguments
    f32 = ir.F32Type.get()
    out_t = ir.RankedTensorType.get([4, 6], f32)
    a = composite.build_composite("hx.dequantize", [q, s], [out_t], _dequantize_builder,
                                  attributes=Q8)
    b = composite.build_composite("hx.dequantize", [q, s], [out_t], _dequantize_builder,
                                  attributes=Q8)
    ret.operands[0] = b[0]
    return a, b
  module, _ = _with_module(body)
  with module.context:
    assert module.operation.verify()
    comps = _composites(module)
    funcs = _funcs(module)
  assert [c["decomposition"] for c in comps] == ["hx.dequantize.impl", "hx.dequantize.impl_0"]
  assert comps[0]["version"] == schema.SCHEMAS["hx.dequantize"].legacy_version
  assert comps[0]["operand_types"] == ["tensor<4x6xi8>", "tensor<4xf32>"]
  text = str(funcs["hx.dequantize.impl"])
  assert "private" in text and "stablehlo.multiply" in text and "stablehlo.convert" in text


def test_build_composite_shardings():
  text = """
  sdy.mesh @mesh = <["i"=4]>
  func.func @f(%q: tensor<4x6xi8>, %s: tensor<4xf32>) -> tensor<4x6xf32> {
    %0 = stablehlo.convert %q : (tensor<4x6xi8>) -> tensor<4x6xf32>
    return %0 : tensor<4x6xf32>
  }
  """
  with mlir.make_ir_context(), ir.Location.unknown():
    module = _parse(text)
    fn = _funcs(module)["f"]
    block = fn.regions[0].blocks[0]
    ret = list(block.operations)[-1]
    rows = sdy.TensorShardingAttr.parse('#sdy.sharding<@mesh, [{"i"}, {}]>')
    scale = sdy.TensorShardingAttr.parse('#sdy.sharding<@mesh, [{"i"}]>')
    with ir.InsertionPoint(ret):
      (y,) = composite.build_composite(
          "hx.dequantize", list(block.arguments),
          [ir.RankedTensorType.get([4, 6], ir.F32Type.get())], _dequantize_builder,
          attributes=Q8, operand_shardings=[rows, scale], result_shardings=[rows])
    ret.operands[0] = y
    assert module.operation.verify()
    (c,) = _composites(module)
  assert c["operand_shardings"] == [(("i",), ()), (("i",),)]
  assert c["result_shardings"] == [(("i",), ())]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(name="hx.nope"), ValueError, "unknown composite 'hx.nope'"),
    (dict(version=7), ValueError, "hx.dequantize: unknown version 7"),
    (dict(attributes=None), ValueError, "composite_attributes must have keys"),
    (dict(attributes={"qmax": 127}), ValueError, "composite_attributes must have keys"),
    (dict(result_types="wrong"), ValueError, "decomposition builder returned values of types"),
    (dict(result_shardings="partial"), ValueError, "for all 1 results or none"),
])
def test_build_composite_errors(kwargs, error, message):
  def body(block, ret):
    f32 = ir.F32Type.get()
    result_types = [ir.RankedTensorType.get([4, 6], f32)]
    if kwargs.get("result_types") == "wrong":
      result_types = [ir.RankedTensorType.get([4, 7], f32)]
    kw = {"attributes": Q8} | {k: v for k, v in kwargs.items()
                               if k not in ("name", "result_types")}
    if kw.get("result_shardings") == "partial":
      kw["result_shardings"] = [sdy.TensorShardingAttr.parse("#sdy.sharding<@mesh, [{}, {}]>"),
                                None]
    with pytest.raises(error, match=message):
      composite.build_composite(kwargs.get("name", "hx.dequantize"), list(block.arguments),
                                result_types, _dequantize_builder, **kw)
  module, _ = _with_module(body)
  with module.context:
    assert module.operation.verify()  # a failed build leaves no half-built function
    assert list(_funcs(module)) == ["f"]


def test_attribute_type_is_checked():
  with mlir.make_ir_context(), pytest.raises(TypeError, match="'qmax' must be int, got float"):
    composite.composite_attributes("hx.quantize", {"qmax": 127.0, "method": "absmax", **Q8})


def test_insertion_point_outside_a_module_is_an_error():
  with mlir.make_ir_context(), ir.Location.unknown():
    ftype = ir.FunctionType.get([], [])
    detached = func_dialect.FuncOp("g", ftype, ip=None)
    block = detached.add_entry_block()
    with ir.InsertionPoint(block), \
         pytest.raises(ValueError, match="not inside a builtin.module"):
      composite.enclosing_module()


# --- per-platform builders (level 2, builder=) --------------------------------

def _tpu_dequantize_rule(ctx, q, s):
  """A stand-in per-platform kernel: the decomposition is (q * 2) * s built in MLIR."""
  def builder(args):
    q, s = args
    y = _dequantize_builder(args)[0]
    return [hlo.AddOp(y, y).result]
  return composite.lower_composite(ctx, "hx.dequantize", q, s, builder=builder, attributes=Q8)


def test_platform_specific_builder_exports_next_to_the_reference():
  mlir.register_lowering(hx_dequantize_p, _tpu_dequantize_rule, platform="tpu")
  try:
    qx = hx.quantize(np.ones((4, 6), np.float32))
    exp = jax.export.export(jax.jit(hx.dequantize), platforms=["cpu", "tpu"])(qx)
    text = exp.mlir_module()
  finally:
    del mlir._platform_specific_lowerings["tpu"][hx_dequantize_p]
  with mlir.make_ir_context():
    module = _parse(text)
    comps = _composites(module)
    funcs = _funcs(module)
  # one composite per platform branch of the stablehlo.case, each with its decomposition
  assert [c["name"] for c in comps] == ["hx.dequantize", "hx.dequantize"]
  bodies = sorted(str(funcs[c["decomposition"]]) for c in comps)
  assert sum("stablehlo.add" in b for b in bodies) == 1
  assert "stablehlo.case" in str(funcs["main"])
  for c in comps:
    assert c["operand_types"] == ["tensor<4x6xi8>", "tensor<4xf32>"]


def test_lower_composite_needs_one_implementation():
  with pytest.raises(TypeError, match="exactly one of reference= and builder="):
    composite.lower_composite(None, "hx.dequantize")


def test_composites_inside_shard_map_carry_no_shardings(mesh):
  f = jax.shard_map(lambda x: hx.dequantize(hx.quantize(x)),
                    in_specs=P("i", None), out_specs=P("i", None))
  with jax.set_mesh(mesh):
    x = jax.device_put(_X[:4].repeat(2, axis=0), P("i", None))
    text = _lower(f, x)
    got = jax.jit(f)(x)
  with mlir.make_ir_context():
    comps = _composites(_parse(text))
  assert [c["name"] for c in comps] == ["hx.quantize", "hx.dequantize"]
  assert comps[0]["operand_types"] == ["tensor<2x7xf32>"]  # the per-device block
  for c in comps:
    assert all(s is None for s in c["operand_shardings"] + c["result_shardings"])
  want = jax.jit(lambda x: reference.dequantize(*reference.quantize(x)))(np.asarray(x))
  assert _bits_equal(np.asarray(got), np.asarray(want))
