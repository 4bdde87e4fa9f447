"""Shardy shardings as the passes read them: ``#sdy.sharding`` attributes as the schema's
:data:`~hxmlir.lowering.schema.DimSharding`, the sharding fixed for a value (by
its defining op, a sharding constraint, or its function argument), whether a
module has any (answered from the shared op index), and the sizes of the mesh axes a
sharding names."""

from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from hxmlir.lowering.schema import DimSharding
from hxmlir.passes.ops import _ANY_SHARDING, _SHARDED, index, index_cache
from hxmlir.passes.symbols import enclosing_module as _enclosing_module
from hxmlir.passes.symbols import func_ops, symbol_ref


def may_have_shardings(module: ir.Operation) -> bool:
  """Whether any value in ``module`` can have a sharding :func:`value_sharding_attr` reads.

  ``False`` when no op carries an ``sdy.sharding`` attribute, no op is an
  ``sdy.sharding_constraint`` and no function argument has an ``sdy.sharding``
  attribute: :func:`value_sharding_attr` is then ``None`` for every value, and
  callers may skip asking. Exact (not a guess from mesh declarations); inside
  :func:`op_index_scope` it costs nothing beyond the shared walk.
  """
  index_ = index(module)
  got = index_.get(_ANY_SHARDING)
  if got is None:
    got = index_[_ANY_SHARDING] = (
        _SHARDED in index_ or "sdy.sharding_constraint" in index_ or
        any(_arg_shardings(fn.regions[0].blocks[0]) is not None
            for fn in func_ops(module).values() if fn.regions[0].blocks))  # declarations
  return got


def as_tensor_sharding(attr: ir.Attribute | None) -> sdy.TensorShardingAttr | None:
  """``attr`` as ``#sdy.sharding<...>`` (``TensorShardingAttr``), or ``None`` if it is not one."""
  if attr is None or not sdy.TensorShardingAttr.isinstance(attr):
    return None
  return sdy.TensorShardingAttr(attr)


def as_per_value(attr: ir.Attribute | None) -> sdy.TensorShardingPerValueAttr | None:
  """``attr`` as ``#sdy.sharding_per_value<[...]>``, or ``None`` if it is not one."""
  if attr is None or not sdy.TensorShardingPerValueAttr.isinstance(attr):
    return None
  return sdy.TensorShardingPerValueAttr(attr)


def dim_sharding(attr: ir.Attribute | None, rank: int | None = None) -> DimSharding | None:
  """A ``#sdy.sharding`` as the schema's ``DimSharding``, or ``None`` when unknown.

  Each dimension becomes the tuple of its axis names (sub-axes spelled
  ``"x:(1)2"``). Open dimensions (``{?}``, ``{"x", ?}``) may be sharded further
  by propagation, so a sharding with any open dimension counts as unknown, as
  does a rank that differs from ``rank``.
  """
  attr = as_tensor_sharding(attr)
  if attr is None:
    return None
  dims = []
  for d in attr.dimension_shardings:
    d = sdy.DimensionShardingAttr(d)
    if not d.is_closed:
      return None
    names = []
    for a in d.axes:
      a = sdy.AxisRefAttr(a)
      sub = a.sub_axis_info
      if sub is not None:
        sub = sdy.SubAxisInfoAttr(sub)
        names.append(f"{a.name}:({sub.pre_size}){sub.size}")
      else:
        names.append(a.name)
    dims.append(tuple(names))
  if rank is not None and len(dims) != rank:
    return None
  return tuple(dims)


def result_sharding_attr(op: ir.Operation, index: int) -> ir.Attribute | None:
  """Result ``index``'s ``TensorShardingAttr`` from ``op``'s ``sdy.sharding`` (or ``None``)."""
  attrs = op.attributes
  if "sdy.sharding" in attrs:
    attr = as_per_value(attrs["sdy.sharding"])
    if attr is None:
      return None
    shardings = attr.shardings
    return shardings[index] if index < len(shardings) else None
  if "sharding" in attrs and op.name == "sdy.sharding_constraint":
    return attrs["sharding"]
  return None


def _block_arg_shardings(block: ir.Block) -> tuple | None:
  """The ``sdy.sharding`` argument attribute of each argument of ``block`` if it is a
  function's entry block (``None`` entries for arguments without one), else ``None``."""
  owner = block.owner
  if owner is None or owner.operation.name != "func.func":
    return None
  attrs = owner.operation.attributes
  if "arg_attrs" not in attrs:
    return None
  arg_attrs = attrs["arg_attrs"]
  if "sdy.sharding" not in str(arg_attrs):  # one print beats a DictAttr per argument
    return None
  out = []
  for a in ir.ArrayAttr(arg_attrs):
    d = ir.DictAttr(a)
    out.append(d["sdy.sharding"] if "sdy.sharding" in d else None)
  return tuple(out) if any(x is not None for x in out) else None


_BLOCK_ARGS = object()  # key of the block-argument sharding cache in the op index


def value_sharding_attr(value: ir.Value) -> ir.Attribute | None:
  """The sharding fixed for ``value``: by its defining op or its function argument attribute.

  An ``sdy.sharding_constraint`` result has the constraint's sharding; another
  op result the entry of its op's ``sdy.sharding``; a function argument its
  ``sdy.sharding`` argument attribute. ``None`` when nothing fixes it. Inside
  :func:`op_index_scope`, function argument shardings are read once per
  function (passes never change function signatures).
  """
  if isinstance(value, ir.OpResult):
    return result_sharding_attr(value.owner, value.result_number)
  if isinstance(value, ir.BlockArgument):
    shardings = _arg_shardings(value.owner)
    if shardings is None or value.arg_number >= len(shardings):
      return None
    return shardings[value.arg_number]
  return None


def _arg_shardings(block: ir.Block) -> tuple | None:
  """:func:`_block_arg_shardings`, read once per block inside :func:`op_index_scope`."""
  cache = index_cache()
  if cache is None:
    return _block_arg_shardings(block)
  blocks = cache.get(_BLOCK_ARGS)
  if blocks is None:
    blocks = cache[_BLOCK_ARGS] = {}
  shardings = blocks.get(block, _BLOCK_ARGS)
  if shardings is _BLOCK_ARGS:
    shardings = blocks[block] = _block_arg_shardings(block)
  return shardings


def value_sharding(value: ir.Value) -> DimSharding | None:
  """:func:`value_sharding_attr` as the schema's ``DimSharding`` (``None`` when unknown)."""
  t = value.type
  rank = t.rank if isinstance(t, ir.RankedTensorType) else None
  return dim_sharding(value_sharding_attr(value), rank)


def mesh_axis_sizes(attr: ir.Attribute | None, at: ir.Operation) -> dict[str, int] | None:
  """``{axis name: size}`` of the mesh a ``#sdy.sharding`` ``attr`` is over, or ``None``.

  The mesh is inline (``<mesh<["i"=4]>, [...]>``) or a symbol (``<@mesh, [...]>``) naming
  an ``sdy.mesh`` op of the module enclosing ``at``; ``None`` when ``attr`` is not a
  sharding or the module declares no such mesh.
  """
  attr = as_tensor_sharding(attr)
  if attr is None:
    return None
  mesh = attr.mesh_or_ref
  if not sdy.MeshAttr.isinstance(mesh):
    name = symbol_ref(mesh)
    if name is None:
      return None
    module = _enclosing_module(at)
    if module is None:
      return None
    decl = next((o for o in module.regions[0].blocks[0].operations
                 if o.operation.name == "sdy.mesh"
                 and ir.StringAttr(o.operation.attributes["sym_name"]).value == name), None)
    if decl is None:
      return None
    mesh = decl.operation.attributes["mesh"]
  return {sdy.MeshAxisAttr(a).name: sdy.MeshAxisAttr(a).size for a in sdy.MeshAttr(mesh).axes}


def axes_size(axes: tuple[str, ...], sizes: dict[str, int]) -> int | None:
  """How many ways a dimension sharded over ``axes`` (a :data:`DimSharding` entry, sub-axes
  spelled ``"x:(1)2"``) is split on a mesh of axis ``sizes``; ``None`` for an unknown axis."""
  ways = 1
  for a in axes:
    if ":(" in a:  # a sub-axis "x:(pre)size" has its own size
      ways *= int(a.rsplit(")", 1)[1])
    elif a in sizes:
      ways *= sizes[a]
    else:
      return None
  return ways
