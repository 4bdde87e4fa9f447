"""The one emitter of ``hx.*`` composites, at two levels.

Level 1, plain MLIR (no JAX tracing; the passes use it):

- :func:`build_decomposition` creates the private ``func.func`` that is a
  composite's ``decomposition``, with a unique symbol in the enclosing module,
  and fills its body with a *decomposition builder*
  ``builder(block_args) -> list[ir.Value]``.
- :func:`emit_composite` creates the ``stablehlo.composite`` op calling a given
  decomposition, with ``version`` and ``composite_attributes`` checked against
  :mod:`hxmlir.lowering.schema`, and Shardy annotations: each operand with a
  known sharding goes through an ``sdy.sharding_constraint`` placed right
  before the composite, and the results' shardings become the composite's
  ``sdy.sharding = #sdy.sharding_per_value<[...]>``.
- :func:`build_composite` does both.

Level 2, inside a JAX lowering rule (``mlir.register_lowering``):

- :func:`lower_composite` takes the rule's ``LoweringRuleContext`` and builds
  the decomposition either by lowering a JAX *reference function* over lo
  arrays (``reference=``), or with an MLIR decomposition builder
  (``builder=``), for per-platform implementations registered with
  ``mlir.register_lowering(prim, rule, platform="cpu")``. Shardings come from
  ``ctx.avals_in`` / ``ctx.avals_out`` (explicit sharding mode).

Multi-platform export (``jax.export.export(f, platforms=["cpu", "tpu"])``)
lowers every function with a leading platform-index argument; JAX's own
``jax.lax.composite`` then builds a decomposition with one more argument than
the composite has operands, which is invalid. Here the reference function is
lowered in a module context that has no platform-index or dimension-variable
arguments, for one of the lowering platforms: the reference functions are
platform-neutral StableHLO, which ``tests/py/lowering/test_lowering.py`` checks by
comparing the decomposition lowered for each platform. Lowering rules that use
:func:`lower_composite` must stay cacheable (see ``lowering/rules.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.interpreters import mlir
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as func_dialect
from jaxlib.mlir.dialects import sdy
from jaxlib.mlir.dialects import stablehlo as hlo

from hxmlir import _jax
from hxmlir.lowering import schema

DecompositionBuilder = Callable[[Sequence[ir.Value]], Sequence[ir.Value]]
"""``builder(block_args) -> results``: emits a decomposition body.

Called with the insertion point at the start of the decomposition's entry block;
``block_args`` are its arguments (one per composite operand, same types); it
returns one ``ir.Value`` per composite result, of the result types. It must not
emit the terminator.
"""


# --- level 1: plain MLIR -----------------------------------------------------

def enclosing_module(ip: ir.InsertionPoint | None = None) -> ir.Operation:
  """The ``builtin.module`` that contains insertion point ``ip`` (default: current).

  Raises ``ValueError`` if the insertion point is not inside a module (for
  example inside a function that has not been inserted into one yet).
  """
  ip = ip or ir.InsertionPoint.current
  op = ip.block.owner
  op = op.operation if op is not None else None
  while op is not None and op.name != "builtin.module":
    try:
      op = op.parent
    except ValueError:  # a detached operation
      op = None
  if op is None:
    raise ValueError("hx composite: the insertion point is not inside a builtin.module; "
                     "decompositions are private functions of the enclosing module")
  return op


def _schema_of(name: str) -> schema.OpSchema:
  s = schema.lookup(name)
  if s is None:
    raise ValueError(f"unknown composite {name!r}: known hx composites are "
                     f"{', '.join(sorted(schema.SCHEMAS))} (lowering/schema.py)")
  return s


def _attribute(key: str, value: Any) -> ir.Attribute:
  if isinstance(value, ir.Attribute):
    return value
  if isinstance(value, bool):
    return ir.BoolAttr.get(value)
  if isinstance(value, (int, np.integer)):
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(value))
  if isinstance(value, (float, np.floating)):
    return ir.FloatAttr.get(ir.F32Type.get(), float(value))
  if isinstance(value, str):
    return ir.StringAttr.get(value)
  if isinstance(value, tuple) and all(isinstance(v, (int, np.integer)) for v in value):
    return ir.DenseI64ArrayAttr.get([int(v) for v in value])
  raise TypeError(f"composite attribute {key!r}: cannot convert {type(value).__name__} "
                  "to an MLIR attribute (use bool, int, float, str, a tuple of ints or "
                  "ir.Attribute)")


def attribute_value(attr: ir.Attribute):
  """The Python value of a ``composite_attributes`` entry: ``array<i64: ...>`` -> tuple of
  ints (also ``dense<...> : tensor<Nxi64>``, its form after a round trip through a
  portable artifact: StableHLO's serialization rewrites the one into the other),
  ``i64`` -> int, bool, float, string; other attributes as they are."""
  if isinstance(attr, ir.DenseI64ArrayAttr):
    return tuple(attr)
  if isinstance(attr, ir.DenseIntElementsAttr):
    return tuple(int(v) for v in attr)
  if isinstance(attr, ir.BoolAttr):
    return attr.value
  if isinstance(attr, (ir.IntegerAttr, ir.FloatAttr, ir.StringAttr)):
    return attr.value
  return attr


def read_attributes(attrs: ir.Attribute | None) -> dict:
  """A composite's ``composite_attributes`` (a ``DictAttr`` or ``None``) as key -> Python
  value (:func:`attribute_value`), what the schema's checks take."""
  if attrs is None:
    return {}
  return {a.name: attribute_value(a.attr) for a in ir.DictAttr(attrs)}


def composite_attributes(name: str, attributes: Mapping[str, Any] | None,
                         version: int | None = None) -> ir.DictAttr:
  """``composite_attributes`` of ``name`` as a ``DictAttr``, checked against the schema
  of ``version`` (default: the current one).

  Python ``int`` becomes ``i64``, ``float`` ``f32``, ``bool`` and ``str`` their
  attributes, a tuple of ints ``array<i64: ...>``; ``ir.Attribute`` values pass
  through. Raises ``ValueError`` when the keys differ from the schema's and
  ``TypeError`` when a value has the wrong Python type.
  """
  spec = _schema_of(name)
  keys = spec.attributes_of(spec.version_for(attributes) if version is None else version)
  attributes = dict(attributes or {})
  if set(attributes) != set(keys):
    raise ValueError(f"{name}: composite_attributes must have keys {sorted(keys)}, got "
                     f"{sorted(attributes)} (version "
                     f"{spec.version if version is None else version})")
  for key, value in attributes.items():
    want = keys[key]
    if not isinstance(value, ir.Attribute) and not isinstance(value, want):
      raise TypeError(f"{name}: attribute {key!r} must be {want.__name__}, "
                      f"got {type(value).__name__} {value!r}")
  return ir.DictAttr.get({k: _attribute(k, v) for k, v in sorted(attributes.items())})


def check_composite(name: str, *, attributes: Mapping[str, Any] | None = None,
                    version: int | None = None) -> int:
  """Checks ``name``, ``attributes`` and ``version`` against the schema; returns the version.

  ``version`` defaults to the schema's current one. Raises ``ValueError`` for an
  unknown name or version or wrong attribute keys, ``TypeError`` for attribute
  values of the wrong type (needs an MLIR context).
  """
  spec = _schema_of(name)
  if version is None:  # the oldest version that holds these attributes' format
    version = spec.version_for(attributes)
  if version not in spec.versions:
    raise ValueError(f"{name}: unknown version {version}; this code accepts "
                     f"{', '.join(map(str, spec.versions))}")
  composite_attributes(name, attributes, version)
  return version


def build_decomposition(name: str, operand_types: Sequence[ir.Type],
                        result_types: Sequence[ir.Type],
                        decomposition_builder: DecompositionBuilder, *,
                        symbol_table: ir.SymbolTable | None = None,
                        module: ir.Operation | None = None) -> func_dialect.FuncOp:
  """Creates the private function ``@<name>.impl`` holding a composite's decomposition.

  The function has signature ``(operand_types) -> (result_types)`` and is
  inserted at the end of ``module`` (default: the module enclosing the current
  insertion point) through ``symbol_table`` (default: a new ``SymbolTable`` of
  that module), which renames it (``@hx.quantize.impl_0``) if the name is
  taken. Needs an MLIR context and location. Raises ``ValueError`` if the
  builder returns the wrong number or types of values.
  """
  if module is None:
    module = enclosing_module()
  if symbol_table is None:
    symbol_table = ir.SymbolTable(module)
  ftype = ir.FunctionType.get(list(operand_types), list(result_types))
  fn = func_dialect.FuncOp(f"{name}.impl", ftype,
                           ip=ir.InsertionPoint(module.regions[0].blocks[0]))
  fn.attributes["sym_visibility"] = ir.StringAttr.get("private")
  symbol_table.insert(fn)
  block = fn.add_entry_block()
  try:
    with ir.InsertionPoint(block):
      outs = list(decomposition_builder(list(block.arguments)))
      got = [v.type for v in outs]
      if got != list(result_types):
        raise ValueError(f"{name}: the decomposition builder returned values of types "
                         f"({', '.join(map(str, got))}), expected "
                         f"({', '.join(map(str, result_types))})")
      func_dialect.ReturnOp(outs)
  except BaseException:
    fn.operation.erase()  # leave no half-built function behind
    raise
  return fn


def _check_arity(name: str, num_operands: int, num_results: int,
                 operand_shardings: Sequence | None, result_shardings: Sequence | None,
                 attributes: Mapping[str, Any] | None = None) -> None:
  spec = _schema_of(name)
  want_ops, want_res = spec.counts({k: attribute_value(v) if isinstance(v, ir.Attribute) else v
                                    for k, v in (attributes or {}).items()})
  if num_operands != want_ops or num_results != want_res:
    raise ValueError(f"{name} {spec.signature}: takes {want_ops} operand(s) and "
                     f"{want_res} result(s), got {num_operands} and {num_results}")
  if operand_shardings is not None and len(operand_shardings) != num_operands:
    raise ValueError(f"{name}: {len(operand_shardings)} operand shardings for "
                     f"{num_operands} operands")
  if result_shardings is not None and any(s is not None for s in result_shardings) and (
      len(result_shardings) != num_results or any(s is None for s in result_shardings)):
    raise ValueError(f"{name}: result shardings must be given for all {num_results} "
                     f"results or none, got {list(result_shardings)}")


def _constrain(value: ir.Value, sharding: ir.Attribute | None) -> ir.Value:
  if sharding is None:
    return value
  return sdy.ShardingConstraintOp(value, sharding).result


def emit_composite(name: str, operands: Sequence[ir.Value], result_types: Sequence[ir.Type],
                   decomposition: str | func_dialect.FuncOp, *,
                   attributes: Mapping[str, Any] | None = None, version: int | None = None,
                   operand_shardings: Sequence[ir.Attribute | None] | None = None,
                   result_shardings: Sequence[ir.Attribute | None] | None = None,
                   ) -> list[ir.Value]:
  """Emits ``stablehlo.composite "<name>"`` at the current insertion point.

  ``decomposition`` is the decomposition's symbol name or its ``FuncOp``.
  ``version`` defaults to the schema's current version (an older accepted one
  may be given). ``operand_shardings`` (``sdy.TensorShardingAttr`` or ``None``
  per operand): each operand with a sharding is first passed through an
  ``sdy.sharding_constraint``. ``result_shardings``: either all ``None`` or one
  ``TensorShardingAttr`` per result, set as the composite's ``sdy.sharding``.
  Returns the composite's results. Raises ``ValueError`` for an unknown name or
  version, wrong attribute keys, operand/sharding count mismatches, or a
  partial set of result shardings.
  """
  version = check_composite(name, attributes=attributes, version=version)
  _check_arity(name, len(operands), len(result_types), operand_shardings, result_shardings,
               attributes)
  if isinstance(decomposition, func_dialect.FuncOp):
    decomposition = ir.StringAttr(decomposition.attributes["sym_name"]).value
  operands = list(operands)
  if operand_shardings is not None:
    operands = [_constrain(v, s) for v, s in zip(operands, operand_shardings)]
  op = hlo.CompositeOp(
      list(result_types), operands,
      name=ir.StringAttr.get(name),
      decomposition=ir.FlatSymbolRefAttr.get(decomposition),
      composite_attributes=composite_attributes(name, attributes, version),
      version=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), version))
  if result_shardings is not None and any(s is not None for s in result_shardings):
    op.operation.attributes["sdy.sharding"] = sdy.TensorShardingPerValueAttr.get(
        list(result_shardings))
  return list(op.results)


def build_composite(name: str, operands: Sequence[ir.Value], result_types: Sequence[ir.Type],
                    decomposition_builder: DecompositionBuilder, *,
                    attributes: Mapping[str, Any] | None = None, version: int | None = None,
                    operand_shardings: Sequence[ir.Attribute | None] | None = None,
                    result_shardings: Sequence[ir.Attribute | None] | None = None,
                    symbol_table: ir.SymbolTable | None = None) -> list[ir.Value]:
  """Builds a decomposition with ``decomposition_builder`` and the composite calling it.

  Works on plain ``jaxlib.mlir`` IR with an insertion point set (inside a
  function of a module) and needs no JAX tracing: it is what passes use to
  create ``hx.*`` ops. The decomposition's signature is the operands' types to
  ``result_types``. See :func:`build_decomposition` and :func:`emit_composite`
  for the other arguments and errors. Returns the composite's results.

  Example (inside a pass, ``x: f32[4, 8]``)::

    q, s = build_composite("hx.quantize", [x], [i8_4x8, f32_4],
                           my_builder, attributes={"qmax": 127})
  """
  ip = ir.InsertionPoint.current
  check_composite(name, attributes=attributes, version=version)
  _check_arity(name, len(operands), len(result_types), operand_shardings, result_shardings,
               attributes)
  fn = build_decomposition(name, [v.type for v in operands], result_types,
                           decomposition_builder, symbol_table=symbol_table,
                           module=enclosing_module(ip))
  with ip:
    return emit_composite(name, operands, result_types, fn, attributes=attributes,
                          version=version, operand_shardings=operand_shardings,
                          result_shardings=result_shardings)


# --- level 2: inside a JAX lowering rule -------------------------------------

def _static_shape(name: str, aval) -> None:
  if not all(isinstance(d, int) for d in aval.shape):
    raise NotImplementedError(
        f"{name}: operand or result {aval.str_short()} has a symbolic shape; hx composites "
        "need static shapes (export without polymorphic_shapes)")


def _reference_builder(ctx: mlir.LoweringRuleContext, reference: Callable,
                       avals_in: Sequence) -> DecompositionBuilder:
  """A decomposition builder that lowers JAX function ``reference`` on ``avals_in``.

  The reference is traced on unsharded avals (nested ``jit``s inlined) and
  lowered in a module context with no platform-index or dimension-variable
  arguments, for a single platform, so the body is plain, platform-neutral
  StableHLO whose signature is exactly the composite's.
  """
  plain = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals_in]
  platforms = ctx.platforms or ctx.module_context.platforms

  def build(args: Sequence[ir.Value]) -> list[ir.Value]:
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())), jax.disable_jit():
      closed = jax.make_jaxpr(reference)(*plain)
    sub = _jax.single_platform_module_context(ctx.module_context, platforms[0])
    consts = [mlir.ir_constant(np.asarray(c)) for c in closed.consts]
    outs, _ = mlir.jaxpr_subcomp(sub, closed.jaxpr, ctx.name_stack, mlir.TokenSet(),
                                 consts, *args, dim_var_values=(), const_lowering={},
                                 outer_traceback=None)
    return list(mlir.ir_tree_registry.flatten(outs)[0])
  return build


def _open_where_unknown(shardings: list, avals) -> list:
  """Result shardings with ``None`` entries (avals on no mesh: values made outside
  ``jax.set_mesh`` meeting values on one) made fully open on the others' mesh.

  ``sdy.sharding_per_value`` needs one sharding per result; an open sharding
  (``[{?}, ...]``) constrains nothing, as JAX emits nothing for such a value.
  """
  known = next((s for s in shardings if s is not None), None)
  if known is None or all(s is not None for s in shardings):
    return shardings
  mesh = sdy.TensorShardingAttr(known).mesh_or_ref
  return [s if s is not None else sdy.TensorShardingAttr.get(
      mesh, [sdy.DimensionShardingAttr.get([], is_closed=False)] * len(a.shape))
      for s, a in zip(shardings, avals)]


def lower_composite(ctx: mlir.LoweringRuleContext, name: str, *operands: ir.Value,
                    reference: Callable | None = None,
                    builder: DecompositionBuilder | None = None,
                    attributes: Mapping[str, Any] | None = None,
                    version: int | None = None) -> list[ir.Value]:
  """Lowers the current equation to one ``stablehlo.composite "<name>"``.

  For use in a lowering rule ``rule(ctx, *operands, **params)``. Give exactly
  one of:

  - ``reference``: a JAX function over lo arrays with the operands' shapes and
    dtypes, returning an array or a tuple of arrays (the ones of
    ``ctx.avals_out``); it is traced and lowered into the decomposition;
  - ``builder``: a :data:`DecompositionBuilder` emitting the decomposition
    body directly (per-platform kernels: register the rule with
    ``mlir.register_lowering(prim, rule, platform="cpu")``).

  Decompositions are shared within a module: two equations with the same name,
  version, attributes, types and reference (or builder object) call one
  function. Under explicit sharding, operands whose aval has a sharding on an
  explicit mesh pass through ``sdy.sharding_constraint`` and the composite
  carries the results' ``sdy.sharding``. Raises ``NotImplementedError`` on
  symbolic shapes and the errors of :func:`emit_composite`.
  """
  if (reference is None) == (builder is None):
    raise TypeError(f"{name}: give exactly one of reference= and builder=")
  version = check_composite(name, attributes=attributes, version=version)
  for aval in (*ctx.avals_in, *ctx.avals_out):
    _static_shape(name, aval)
  mctx = ctx.module_context
  in_types = [mlir.aval_to_ir_type(mctx, a) for a in ctx.avals_in]
  out_types = [mlir.aval_to_ir_type(mctx, a) for a in ctx.avals_out]
  # Reference decompositions are platform-neutral (tests/py/lowering/test_lowering.py
  # checks it), builders are plain MLIR: neither depends on the platform.
  key = ("hxmlir.composite", name, version, tuple(sorted((attributes or {}).items())),
         tuple(map(str, in_types)), tuple(map(str, out_types)),
         reference if builder is None else builder)

  def build():
    body = builder if builder is not None else _reference_builder(ctx, reference, ctx.avals_in)
    return build_decomposition(name, in_types, out_types, body,
                               symbol_table=mctx.symbol_table, module=mctx.module.operation)
  fn = _jax.cached_lowering(mctx, key, build)
  in_sh = [_jax.sdy_sharding_attr(mctx, a) for a in ctx.avals_in]
  out_sh = _open_where_unknown([_jax.sdy_sharding_attr(mctx, a) for a in ctx.avals_out],
                               ctx.avals_out)
  return emit_composite(name, operands, out_types, fn, attributes=attributes,
                        version=version, operand_shardings=in_sh, result_shardings=out_sh)
