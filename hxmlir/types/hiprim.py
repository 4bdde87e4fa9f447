"""Base class of hxmlir's hi primitives, and the hook their lowering plugs into.

A hi primitive (``jax.experimental.hijax.VJPHiPrimitive``) declares its input
and output types and its autodiff and batching rules in ``hxmlir``; its
``to_lojax`` rule -- the ``expand`` method that JAX calls when it lowers a hi
jaxpr to ordinary (lo) arrays -- lives in ``hxmlir.lowering`` and binds lo
primitives there (``lowering/to_lojax.py``, every rule of the types' primitives). The
dependency runs types -> lowering: ``hxmlir.lowering`` registers each rule with
:func:`register_to_lojax` when it is imported (``import hxmlir`` does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental.hijax import (
  HiType,
  ShapedArray,
  VJPHiPrimitive,
  Zero,
  aval_method,
  aval_property,
)
from jax.sharding import PartitionSpec

from hxmlir import _jax
from hxmlir._jax import (
  GradAccum,
  MappingSpec,
  SpecMatchError,
  jax_matchaxis,
  plain_spec_origin,
  stage_value,
  vmap_infer,
  vmap_sum_axis,
  zeros_like_aval,
)
from hxmlir.types import jax_apis
from hxmlir.types import shardings as shd


class HxPrimitive(VJPHiPrimitive):
  """A hi primitive whose ``to_lojax`` rule is registered by ``hxmlir.lowering``.

  Subclasses set ``in_avals``, ``out_aval`` and ``params`` in ``__init__`` (and
  raise ``TypeError`` there, naming the operand types, on bad operands) and
  implement the autodiff and batching rules they support. Primitives that a
  jvp rule applies to tangents (``matmul_q(dx, qw)``, ``make_tup(*dts)``, ...)
  also implement ``transpose``, which ``jax.checkpoint`` and ``jax.linearize``
  followed by transposition need; ``lin``/``linearized`` come from ``jvp``.
  """

  _to_lojax: Callable | None = None

  def expand(self, *args):
    rule = type(self)._to_lojax
    if rule is None:
      raise NotImplementedError(
          f"{type(self).__name__} has no to_lojax rule: hxmlir.lowering was not imported")
    return _stage_lo_outputs(self.out_aval, rule(self, *args))

  # ``jax.linearize``: the jvp rule, split into its primal and tangent halves.
  # The residuals are the primals themselves; the tangent half re-derives the
  # linear map from them (its primal output is dead code and DCE'd).
  def lin(self, nzs_in, *primals):
    return self(*primals), primals

  def linearized(self, primals, *tangents):
    return self.jvp(primals, tangents)[1]


def _stage_lo_outputs(aval, out):
  """``out`` with each lo (array-typed) result that is a concrete array made a tracer.

  Rules that pass a component through (``get_tuple_element``, ``factors``) return
  a concrete array when their operand is a closed-over hi constant (``jit`` of
  ``lambda y: get_tuple_element(t, 0) + y``); JAX's ``lower_jaxpr`` needs a tracer
  of the trace it builds there, so the array is staged as a constant of it. Hi
  results are left alone: only hi rules (which bind lo primitives) consume them.
  """
  if isinstance(aval, tuple):
    return tuple(_stage_lo_outputs(a, o) for a, o in zip(aval, out))
  if isinstance(aval, HiType) or isinstance(out, jax.core.Tracer):
    return out
  return stage_value(out)


class DenseValuedType:
  """Mixin of hi types that stand for a dense ``f32[*shape]`` array (``q8``, ``r1``).

  Needs ``shape``, ``sharding`` (a ``NamedSharding`` of the dense array) and ``mat``
  (the manual-axis type). Gives the rank and dtype JAX reads off every operand, the
  partition entries padded to the rank, and the tangent and cotangent type: the dense
  ``f32`` array of the same shape, sharding and ``mat`` (straight-through gradients).
  """

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def dtype(self):
    return _F32

  def _parts(self) -> tuple:
    return shd.partitions(self.sharding, len(self.shape))

  def to_tangent_aval(self) -> ShapedArray:
    return ShapedArray(self.shape, _F32, sharding=self.sharding, manual_axis_type=self.mat)

  def to_ct_aval(self) -> ShapedArray:
    return self.to_tangent_aval().to_ct_aval()


_F32 = jax.numpy.dtype("float32")


class NeedsJitShardMap:
  """Mixin of hxmlir's ``shard_map`` specs (``hx.QArrayP``, ``hx.Rank1P``, ``hx.TupP``).

  JAX 0.10.2 runs an un-jitted ``shard_map`` eagerly, and that path reads
  ``spec.partitions`` as of a ``PartitionSpec``; under ``jit`` hi specs work. The
  property turns the eager path's ``AttributeError`` into a message with the way out.

  Under ``jit``, JAX reads ``partitions``, ``unreduced`` and ``reduced`` off a spec
  only when it was given for an array argument or result
  (``_shard_shaped_array``/``_unshard_shaped_array``); those raise a ``TypeError``
  that says so instead of JAX's ``AttributeError``.
  """

  @property
  def partitions(self):
    if plain_spec_origin() == "eager":
      raise TypeError(f"shard_map with {self!r} must run under jax.jit: JAX 0.10.2 runs an "
                      "un-jitted shard_map eagerly, on PartitionSpecs of arrays only; wrap the "
                      "shard_map (or its caller) in jax.jit")
    raise self._given_for_an_array()

  @property
  def unreduced(self):
    raise self._given_for_an_array()

  @property
  def reduced(self):
    raise self._given_for_an_array()

  def _given_for_an_array(self) -> TypeError:
    return TypeError(f"shard_map spec {self!r} was given for an array argument or result; "
                     f"{type(self).__name__} is the spec of a hxmlir value (q8, r1, Tup), an "
                     "array takes a plain PartitionSpec: P(...)")


def shard_map_spec_hint(spec) -> str:
  """The tail of a wrong-``shard_map``-spec message when the plain ``P`` is not the user's.

  JAX's un-jitted ``shard_map`` and ``jax.pmap`` hand every type plain
  ``PartitionSpec`` s, whatever the user wrote; a plain spec the user wrote needs
  no tail (the message already says which hx spec the type takes).
  """
  if not isinstance(spec, PartitionSpec):
    return ""
  origin = plain_spec_origin()
  if origin == "eager":
    return (f"; {spec} came from JAX, not from you: this shard_map ran un-jitted, and JAX "
            "0.10.2 runs an un-jitted shard_map on PartitionSpecs of arrays only, so wrap "
            "it in jax.jit")
  if origin == "pmap":
    return ("; jax.pmap (built on shard_map, with plain specs) cannot take hx values as "
            "arguments: close over them, or use jax.shard_map with the hx partition spec")
  return ""


def is_linear_operand(x) -> bool:
  """In a ``transpose`` rule: whether operand ``x`` is linear (a gradient accumulator)."""
  return isinstance(x, GradAccum)


def accumulate(acc, ct) -> None:
  """Add cotangent ``ct`` into accumulator ``acc`` unless it is a symbolic zero."""
  if not isinstance(ct, Zero):
    acc.accum(ct)


def zeros(aval):
  """Zeros of type ``aval``, for rules that must make a symbolic zero concrete.

  A hi type gives its ``vspace_zero()``; an array type gives zeros exactly of
  ``aval``'s type, as JAX's AD makes them: its sharding (on a mesh, or on none:
  an array made outside ``jax.set_mesh`` stays off the current mesh) and its
  manual axes (``shard_map``).
  """
  return zeros_like_aval(aval)


def instantiate(t, aval):
  """A tangent ``t`` of type ``aval``, a symbolic ``Zero`` made concrete by :func:`zeros`."""
  return zeros(aval) if isinstance(t, Zero) else t


def is_hi(ty) -> bool:
  """Whether type ``ty`` is a hi type (``q8[...]``, ``r1[...]``, ``Tup{...}``), not an array type."""
  return isinstance(ty, HiType)


def lo_types(ty) -> list:
  """The lo (array) types a value of type ``ty`` is made of: ``ty.lo_ty()`` for a hi
  type (``q8[m,n]`` -> ``[i8[m,n], f32[m]]``), ``[ty]`` for an array type."""
  return list(ty.lo_ty()) if is_hi(ty) else [ty]


def register_to_lojax(prim_cls: type[HxPrimitive]) -> Callable[[Callable], Callable]:
  """Decorator registering ``fn(prim, *args)`` as ``prim_cls``'s to_lojax rule.

  ``args`` are the primitive's operands with hi values as their value classes
  (``QArray``, ``Rank1``, ``HiTup``) holding lo arrays; ``fn`` returns the
  result in the same form. Raises ``ValueError`` if a rule is already set.
  """
  def deco(fn: Callable) -> Callable:
    if prim_cls.__dict__.get("_to_lojax") is not None:
      raise ValueError(f"to_lojax rule for {prim_cls.__name__} registered twice")
    prim_cls._to_lojax = fn
    return fn
  return deco


# --- vmap: an output that does not depend on the mapped input -----------------
#
# JAX broadcasts an unmapped array output to its ``out_axes`` (``batching.matchaxis``)
# but has no such rule for hi types. A hi type opts in with a method
# ``hx_matchaxis(x, size, src, dst, match)`` returning ``x`` brought from spec ``src``
# (``None``: unmapped) to ``dst``, or ``NotImplemented``; ``match(src, dst, y)`` does
# the same for a component ``y`` (arrays included), so tuples recurse.


class BroadcastHi(HxPrimitive):
  """``q8[*l, n] -> q8[*l[:axis], size, *l[axis:], n]`` (likewise ``r1``): ``size`` copies.

  Every lo component gets the new axis at position ``axis`` (a leading axis of
  the type: ``axis <= ndim - 2`` for ``r1``, ``<= ndim - 1`` for ``q8``),
  unsharded. The tangent is the dense tangent broadcast the same way; the
  cotangent sums over the new axis.
  """

  def __init__(self, aval, size: int, axis: int):
    parts = shd.partitions(aval.sharding, aval.ndim)
    self.in_avals = (aval,)
    # the type's manual-axis fields (one per component for r1) stay as they are
    self.out_aval = dataclasses.replace(
        aval, shape=(*aval.shape[:axis], size, *aval.shape[axis:]),
        sharding=shd.with_partitions(aval.sharding, (*parts[:axis], None, *parts[axis:])))
    self.params = dict(size=size, axis=axis)
    super().__init__()

  def broadcast_lo(self, x, out_aval):
    """Lo component ``x`` broadcast to ``out_aval`` (the new axis at ``self.axis``)."""
    dims = tuple(i for i in range(out_aval.ndim) if i != self.axis)
    sharding = out_aval.sharding if not out_aval.sharding.mesh.empty else None
    return jax.lax.broadcast_in_dim(x, out_aval.shape, dims, out_sharding=sharding)

  def vjp_fwd(self, nzs_in, x):
    return self(x), None

  def vjp_bwd_retval(self, _res, g):
    return (g.sum(self.axis),)

  def transpose(self, ct, x):
    if is_linear_operand(x):
      accumulate(x, ct if isinstance(ct, Zero) else ct.sum(self.axis))

  def jvp(self, primals, tangents):
    (x,), (dx,) = primals, tangents
    t_aval = self.out_aval.to_tangent_aval()
    if isinstance(dx, Zero):
      return self(x), jax.numpy.zeros(t_aval.shape, t_aval.dtype)
    return self(x), self.broadcast_lo(dx, t_aval)

  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    if d is None:
      return self(x), None
    # mapped along its leading axis (the only way hi types map): insert behind it
    return BroadcastHi(jax.typeof(x), self.size, self.axis + 1)(x), d


def broadcast_unmapped(x, size: int):
  """``size`` copies of hi value ``x`` stacked on a new leading axis (a ``vmap`` output)."""
  return BroadcastHi(jax.typeof(x), size, 0)(x)


def _is_hi_match(src, dst, x) -> bool:
  if isinstance(src, MappingSpec) or isinstance(dst, MappingSpec):
    return True
  try:
    return isinstance(jax.typeof(x), HiType)
  except TypeError:  # not a JAX value: JAX's matchaxis says so
    return False


def _matchaxis(axis_data, src, dst, x, sum_match=False):
  """JAX's ``matchaxis``, first offering hi values with a hi spec to their type's rule."""
  dst = _jax.internal_batch_dst(dst, x)
  if (src == dst or dst is None or dst is vmap_infer or dst is vmap_sum_axis
      or not _is_hi_match(src, dst, x)):
    return jax_matchaxis(axis_data, src, dst, x, sum_match)
  ty = jax.typeof(x)
  rule = getattr(ty, "hx_matchaxis", None)
  if rule is not None:
    if axis_data.explicit_mesh_axis is not None:
      raise NotImplementedError(
          f"vmap over explicit mesh axis {axis_data.explicit_mesh_axis} cannot broadcast the "
          f"unmapped output {ty} to out_axes {dst!r}; make it depend on a mapped input")
    out = rule(x, axis_data.size, src, dst,
               lambda s, d, y: _matchaxis(axis_data, s, d, y, sum_match))
    if out is not NotImplemented:
      return out
  if not isinstance(ty, HiType):  # an array with a hi spec on one side
    try:
      return jax_matchaxis(axis_data, src, dst, x, sum_match)
    except SpecMatchError:
      pass
  mapped = "not mapped" if src is None else f"mapped as {src!r}"
  hint = ""
  if isinstance(ty, HiType) and src is None:
    hint = f"; its type maps with out_axes {ty.leading_axis_spec()!r}"
  elif isinstance(src, MappingSpec):
    hint = f"; pass out_axes={_spec_expr(src)}"
  raise TypeError(f"vmap output of (batched) type {shd.short(ty)} is {mapped}, which out_axes "
                  f"{dst!r} does not fit{hint}")


def _spec_expr(spec) -> str:
  """A mapping spec as the user writes it: ``hx.TupSpec((0, hx.QArraySpec()))``."""
  if isinstance(spec, tuple):
    return "(" + ", ".join(map(_spec_expr, spec)) + ("," if len(spec) == 1 else "") + ")"
  if isinstance(spec, MappingSpec) and dataclasses.is_dataclass(spec):
    args = ", ".join(_spec_expr(getattr(spec, f.name)) for f in dataclasses.fields(spec))
    return f"hx.{type(spec).__name__}({args})"
  return repr(spec)


# Importing hxmlir makes this JAX's vmap output rule for good (see _jax.patch_matchaxis):
# calls without a hi value or spec reach JAX's own rule unchanged.
_jax.patch_matchaxis(_matchaxis)


# --- hi values are not arrays: numpy conversion, ==, hash ------------
#
# The value classes (``QArray``, ``Rank1``, ``HiTup``) are frozen dataclasses holding
# arrays. Without these, ``np.asarray(q)`` silently makes a 0-d object array,
# ``q1 == q2`` fails with "truth value of an array is ambiguous" and ``hash(q)`` with
# "unhashable type: ArrayImpl". Each class binds the refusals in its body (a
# dataclass keeps a ``__eq__``/``__hash__`` its class body defines).


def _value_type_name(v) -> str:
  try:
    return shd.short(jax.typeof(v))
  except Exception:  # a value of traced parts built by hand: its class is all we know
    return type(v).__name__


class DenseValue:
  """What a hi value class of an f32 dense array shares, from its ``shape`` (the dense
  shape it represents): ``dtype`` (``float32``), ``ndim`` (the dense rank) and ``size``
  (the dense element count, which ``jax.jacfwd`` builds its basis of dense tangents
  from)."""
  __slots__ = ()

  @property
  def dtype(self):
    """The dtype of the dense array represented: ``float32``."""
    return _F32

  @property
  def ndim(self) -> int:
    """The dense rank."""
    return len(self.shape)

  @property
  def size(self) -> int:
    """The dense element count."""
    return int(np.prod(self.shape, dtype=np.int64))


def value_refusals(how: str):
  """``(__array__, __eq__, __ne__, __hash__, __bool__)`` for a hi value class.

  Each raises ``TypeError`` naming the value's type; ``__array__`` (``np.asarray``,
  ``np.array``, ``jnp.asarray``) says what to call instead: ``how``.
  """
  def __array__(self, dtype=None, copy=None):
    raise TypeError(f"a {_value_type_name(self)} value has no single numpy form "
                    f"(np.asarray / np.array / jnp.asarray); use {how}")

  def __eq__(self, other):
    raise TypeError(f"== / != on {_value_type_name(self)} values is not defined (equal dense "
                    f"values can have different components); compare the arrays of {how}")

  def __hash__(self):
    raise TypeError(f"a {_value_type_name(self)} value is not hashable (it holds arrays); use "
                    "id(v) as a key, or hash its type: hash(jax.typeof(v))")

  def __bool__(self):
    raise TypeError(f"the truth value of a {_value_type_name(self)} value is not defined")

  return __array__, __eq__, __eq__, __hash__, __bool__



# --- hi values are not arrays: JAX's operators, jax.numpy and array methods ---------
#
# A tracer forwards ``x + y``, ``x.sum()`` and ``x.T`` to its type (``_add``, ``sum``,
# ``T``: see _jax.array_api_names) and jax.numpy converts every operand that is not an
# array with ``__jax_array__`` (``jnp.sum(q)``, ``jnp.dot(x, q)``, ``x @ q``,
# ``jnp.asarray(q)``). Without these, JAX reports "'QArrayTy' object has no attribute
# '_rmatmul'" or "sum requires ndarray or scalar arguments, got DynamicJaxprTracer".

_SYMBOLS = {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
    "pow": "**", "matmul": "@", "and": "&", "or": "|", "xor": "^", "lshift": "<<",
    "rshift": ">>", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
}
_UNARY = {"neg": "-{}", "pos": "+{}", "abs": "abs({})", "invert": "~{}", "round": "round({})",
          "iter": "iter({})", "len": "len({})"}
# kept as they are: copying a value copies its arrays; the value classes define their
# own ==, != (value_refusals) and a Tup its len()
_KEPT = frozenset({"copy", "deepcopy"})


def _operand_text(x) -> str:
  """An operand as the message shows it: ``1`` for a Python scalar, else its type (``f32[2,3]``)."""
  if isinstance(x, (bool, int, float, complex)):
    return repr(x)
  return _value_type_name(x)


def _operator_text(name: str, v, args) -> str:
  """``q8[3,4] + 1``, ``f32[2,3] @ q8[3,4]`` (a reflected operator), ``-q8[3,4]``, ``q8[3,4][...]``."""
  me = _value_type_name(v)
  if name in _UNARY:
    return _UNARY[name].format(me)
  if name in ("getitem", "setitem"):
    return f"{me}[...]" + (" = ..." if name == "setitem" else "")
  if name == "contains":
    return f"... in {me}"
  other = _operand_text(args[0]) if args else "..."
  reflected = name.startswith("r") and name[1:] in (*_SYMBOLS, "divmod")  # 1 + q: q.__radd__(1)
  base = name[1:] if reflected else name
  a, b = (other, me) if reflected else (me, other)
  if base == "divmod":
    return f"divmod({a}, {b})"
  return f"{a} {_SYMBOLS.get(base, f'<{base}>')} {b}"

def refuse_array_api(value_cls: type, type_cls: type, kind: str, uses: str) -> None:
  """Make JAX's array API on values of a hi type a ``TypeError`` that says what to call.

  Sets, on the value class (``QArray``) and for its tracers on the type
  (``QArrayTy``): every operator of ``jax.Array`` (``+``, ``@``, reflected ones,
  ``[]``, unary ``-``; not copying), its public methods (``.sum()``,
  ``.reshape()``, ``.astype()``), and ``__jax_array__`` (``jnp.sum(q)``,
  ``jnp.dot(x, q)``, ``x @ q``, ``jnp.asarray(q)``; traced values through
  :func:`hxmlir._jax.install_jnp_array_check`), ``iter`` and ``len``: each raises ``TypeError``
  naming the operand types (``f32[2,3] @ q8[3,4]``), that the value is a ``kind``
  and not an array, and ``uses``. Its properties (``.T``, ``.at``) raise
  ``AttributeError`` with the same text, so ``hasattr`` keeps working. Names the class
  already defines are left alone.
  """
  operators, methods, properties = _jax.array_api_names()
  tail = f"a {kind} is not a jax.Array (JAX's operators, jax.numpy and array methods take arrays); {uses}"

  def has(cls, attr):
    return any(attr in vars(k) for k in cls.__mro__[:-1])

  def operator(name):
    def refuse(v, *args):
      raise TypeError(f"{_operator_text(name, v, args)}: {tail}")
    return refuse

  def method(name):
    def refuse(v, *args, **kwargs):
      raise TypeError(f"{_value_type_name(v)}.{name}(): {tail}")
    return refuse

  def prop(name):
    def refuse(v):
      raise AttributeError(f"{_value_type_name(v)}.{name}: {tail}")
    return refuse

  def jax_array(v):
    raise TypeError(f"a {_value_type_name(v)} operand where JAX expects an array "
                    f"(a jax.numpy function, or an operator with an array on its left): {tail}")

  for name in (*operators, "iter", "len"):  # iter / len: Python's, forwarded by tracers too
    if name in _KEPT:
      continue
    if not has(value_cls, f"__{name}__"):
      setattr(value_cls, f"__{name}__", operator(name))
    if not has(type_cls, f"_{name}"):
      setattr(type_cls, f"_{name}", staticmethod(operator(name)))
  for name in methods:
    for cls, wrap in ((value_cls, lambda f: f), (type_cls, aval_method)):
      if not has(cls, name):
        setattr(cls, name, wrap(method(name)))
  for name in properties:
    for cls, wrap in ((value_cls, property), (type_cls, aval_property)):
      if not has(cls, name):
        setattr(cls, name, wrap(prop(name)))
  value_cls.__jax_array__ = jax_array
  type_cls.__jax_array__ = aval_method(jax_array)

# --- JAX's placement, sharding and debugging APIs take hi values -------
jax_apis.install()
_jax.install_jnp_array_check()
