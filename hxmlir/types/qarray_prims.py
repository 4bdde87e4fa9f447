"""The primitives of the quantized array type (:mod:`hxmlir.types.qarray_type`):
``quantize``, ``dequantize``, ``matmul_q`` (with its typing rule,
:func:`matmul_q_result_type`), ``make_qarray`` and ``qarray_parts``: their typing,
differentiation and batching rules. Users call them through :mod:`hxmlir.types.qarray`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.hijax import ShapedArray, Zero

from hxmlir import formats
from hxmlir.types import dotdims, matmul_q_typing
from hxmlir.types import shardings as shd
from hxmlir.types.hiprim import (
  HxPrimitive,
  accumulate,
  instantiate,
  is_linear_operand,
  zeros,
)
from hxmlir.types.matmul_q_typing import dense_dtype_hint
from hxmlir.types.qarray_type import (
  F32,
  QArraySpec,
  QArrayTy,
  _check_dense_f32,
  _check_quantized,
  make_qarray_type,
)

# --- primitives --------------------------------------------------------------

class Quantize(HxPrimitive):
  """``quantize: f32[*lead, n] -> q8[*lead, n]``; see :func:`quantize`."""

  def __init__(self, x_aval, fmt: str = "int8", group_size: int | None = None,
               method: str = "absmax"):
    _check_dense_f32("quantize", x_aval, 1)
    if method not in formats.METHODS:
      raise ValueError(f"hx.quantize: method must be one of {formats.METHODS}, got {method!r}")
    why = formats.check_method(formats.lookup(fmt), method)
    if why:
      raise TypeError(f"hx.quantize({shd.short(x_aval)}, dtype={fmt!r}): {why}")
    self.in_avals = (x_aval,)
    try:
      self.out_aval = QArrayTy(x_aval.shape, x_aval.sharding, x_aval.mat, fmt, group_size)
    except TypeError as e:
      raise TypeError(f"hx.quantize({shd.short(x_aval)}): {e}") from None
    # the type's group: a NumPy integer becomes a Python int (JAX's caches key on params)
    self.params = {"fmt": fmt, "group_size": self.out_aval.group, "method": method}
    super().__init__()

  # straight-through estimator: the derivative of quantize is the identity
  def vjp_fwd(self, nzs_in, x):
    return self(x), None

  def vjp_bwd_retval(self, _res, g):
    return (g,)

  def jvp(self, primals, tangents):
    (x,), (dx,) = primals, tangents
    return self(x), instantiate(dx, self.in_avals[0])

  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    if d is None:
      return self(x), None
    x = jnp.moveaxis(x, d, 0)
    return Quantize(jax.typeof(x), **self.params)(x), QArraySpec()


class Dequantize(HxPrimitive):
  """``dequantize: q8[*lead, n] -> f32[*lead, n]``; see :func:`dequantize`."""

  def __init__(self, q_aval):
    _check_quantized("dequantize", q_aval)
    self.in_avals = (q_aval,)
    self.out_aval = ShapedArray(q_aval.shape, F32, sharding=q_aval.sharding,
                                manual_axis_type=q_aval.mat)
    self.params = {}
    super().__init__()

  def vjp_fwd(self, nzs_in, q):
    return self(q), None

  def vjp_bwd_retval(self, _res, g):
    return (g,)

  def jvp(self, primals, tangents):
    (q,), (dq,) = primals, tangents
    return self(q), instantiate(dq, self.in_avals[0].to_tangent_aval())

  def batch(self, axis_data, args, dims):
    (q,), (d,) = args, dims
    if d is None:
      return _dequantize(q), None
    if not isinstance(d, QArraySpec):
      raise TypeError(f"a quantized array is mapped with hx.QArraySpec(), got {d!r}")
    return _dequantize(q), 0


def matmul_q_result_type(x_aval, q_aval, dimension_numbers=None, *, who: str | None = None,
                         sig: str | None = None) -> ShapedArray:
  """Typing rule of ``matmul_q``: ``lax.dot_general(x, dequantize(q), dimension_numbers)``.

  The shapes and dtypes are :func:`hxmlir.types.matmul_q_typing.result_type`'s (the rule the
  lo primitive and the composite schema ask too); the shardings are checked here.

  ``dimension_numbers`` default (:func:`hxmlir.types.dotdims.matmul_dims`):
  ``f32[..., k] @ q8[k, n] -> f32[..., n]`` (any number of leading dims) and
  ``f32[*b, m, k] @ q8[*b, k, n] -> f32[*b, m, n]`` (equal ranks). The result has
  ``dot_general``'s layout and sharding: batch dims like ``x``'s (else ``q``'s), ``x``'s
  free dims like ``x``, ``q``'s free dims like ``q``. ``who``/``sig`` name the caller
  and the operands in messages (``hx.einsum`` passes its subscripts). Raises
  ``TypeError`` naming both operand types (``f32[2,5] @ q8[3,4]``) on a wrong dtype,
  rank, shape or batch, dims the scales cannot be folded through, or a sharded
  contraction axis.
  """
  who = who or "hx.matmul_q"
  sig = sig or f"{shd.short(x_aval)} @ {shd.short(q_aval)}"
  if not isinstance(q_aval, QArrayTy):
    raise TypeError(f"{who} expects a quantized right operand q8[k, n]: {sig}")
  try:  # the rule of the types (:mod:`hxmlir.types.matmul_q_typing`), then the shardings
    dims, shape, dtype = matmul_q_typing.result_type(
        getattr(x_aval, "shape", ()), matmul_q_typing.dense_dtype(x_aval), q_aval.shape,
        q_aval.group is not None, dimension_numbers, operands=sig,
        dtype_hint=dense_dtype_hint(x_aval))
  except matmul_q_typing.MatmulQTypeError as e:
    raise TypeError(e.for_caller(who)) from None
  xp = shd.partitions(x_aval.sharding, x_aval.ndim)
  qp = shd.partitions(q_aval.sharding, q_aval.ndim)
  if dotdims.sharded_contraction(xp, qp, dims):
    raise TypeError(f"{who} requires unsharded contraction axes, got {sig}: on Explicit "
                    "mesh axes the result's sharding would be ambiguous (as for JAX's dot); "
                    "reshard an operand (jax.sharding.reshard), or use Auto axes, where "
                    "each shard's partial sum is all-reduced")
  parts = dotdims.result_parts(xp, qp, dims)
  axes = [a for p in parts if p for a in ((p,) if isinstance(p, str) else p)]
  twice = sorted({a for a in axes if axes.count(a) > 1})
  if twice:
    raise TypeError(f"{who}: {sig}: the result would be sharded over mesh axis "
                    f"{', '.join(map(repr, twice))} twice; reshard one operand "
                    "(jax.sharding.reshard)")
  out_sharding = shd.with_partitions(shd.pick_mesh_sharding(x_aval.sharding, q_aval.sharding),
                                     parts)
  return ShapedArray(shape, dtype, sharding=out_sharding,
                     manual_axis_type=shd.join_mat(x_aval, q_aval))


def _dot(x, w, dims, sharding):
  """``lax.dot_general(x, w, dims)`` in f32, placed ``sharding`` (explicit mode)."""
  return jax.lax.dot_general(x, w, dims, preferred_element_type=F32,
                             out_sharding=shd.out_sharding(sharding))


def _dot_transpose(g, y, dims, x_aval, swap_ans: bool):
  """``dot_general(x, y, dims)``'s transpose in ``x`` at ``g`` (``dotdims.transpose_lhs``),
  computed and placed like ``x_aval`` (``swap_ans``: ``x`` was the right operand)."""
  dims2, order = dotdims.transpose_lhs(dims, x_aval.ndim, y.ndim, swap_ans)
  parts = shd.partitions(x_aval.sharding, x_aval.ndim)
  t = _dot(g, y, dims2, shd.with_partitions(x_aval.sharding, [parts[d] for d in order]))
  perm = tuple(sorted(range(len(order)), key=order.__getitem__))
  return t if perm == tuple(range(len(perm))) else jnp.transpose(t, perm)


class MatmulQ(HxPrimitive):
  """``matmul_q: dot_general(f32[...], q8[..., n], dimension_numbers)``; see :func:`matmul_q`
  and :func:`hxmlir.types.einsum.einsum`. ``params``: ``dimension_numbers`` (``lax.dot_general``'s,
  tuples), the lo primitive's."""

  def __init__(self, x_aval, q_aval, dimension_numbers=None, *, who=None, sig=None):
    if dimension_numbers is not None:
      dimension_numbers = dotdims.normalize(dimension_numbers)
    out = matmul_q_result_type(x_aval, q_aval, dimension_numbers, who=who, sig=sig)
    self.in_avals = (x_aval, q_aval)
    self.out_aval = out
    self.params = {"dimension_numbers": dimension_numbers
                   or dotdims.matmul_dims(x_aval.ndim, q_aval.ndim)}
    super().__init__()

  @property
  def dims(self):
    return self.params["dimension_numbers"]

  def _apply(self, x, qw):
    return MatmulQ(jax.typeof(x), jax.typeof(qw), self.dims)(x, qw)

  def vjp_fwd(self, nzs_in, x, qw):
    return self(x, qw), (x, qw)

  def vjp_bwd_retval(self, res, g):
    x, qw = res
    q_aval = self.in_avals[1]
    # the weight's cotangent is dense (straight-through); both are placed where
    # their primals live
    gw = _dot_transpose(g, x.astype(F32), dotdims.swapped(self.dims), q_aval.to_tangent_aval(),
                        True)
    return self._x_cotangent(g, qw), shd.match_vma(gw, q_aval)

  def _x_cotangent(self, g, qw):
    """The transpose of ``x -> dot_general(x, dequantize(qw))`` at ``g``, placed and varying
    like ``x`` (rules are traced code: primitives, not attributes)."""
    x_aval = self.in_avals[0]
    gx = self._x_cotangent_quantized(g, qw)
    if gx is None:
      gx = _dot_transpose(g, _dequantize(qw), self.dims, x_aval, False)
    return shd.match_vma(gx.astype(x_aval.dtype), x_aval)  # a bf16 x: a bf16 cotangent

  def _x_cotangent_quantized(self, g, qw):
    """The transpose in ``x`` as ``matmul_q(g, qw)`` with the transposed dims (the weight
    stays quantized: for the checkpoint layout ``"...k,nk->...n"`` it is
    ``"...n,nk->...k"``, which the CPU lowering gives a native kernel), or ``None`` where
    the types do not allow it: shardings in the types (explicit mode, where the result
    must be placed like ``x``), or dims whose transpose ``matmul_q``'s typing rule refuses.
    """
    x_aval, q_aval = self.in_avals
    g = g if jax.typeof(g).dtype == F32 else g.astype(F32)
    g_aval = jax.typeof(g)
    if any(any(p is not None for p in shd.partitions(a.sharding, a.ndim))
           for a in (x_aval, q_aval, g_aval)):
      return None
    dims2, order = dotdims.transpose_lhs(self.dims, x_aval.ndim, q_aval.ndim, False)
    try:
      prim = MatmulQ(g_aval, q_aval, dims2)
    except TypeError:
      return None
    t = prim(g, qw)
    perm = tuple(sorted(range(len(order)), key=order.__getitem__))
    return t if perm == tuple(range(len(perm))) else jnp.transpose(t, perm)

  def transpose(self, ct, x, qw):
    # the jvp rule applies matmul_q to tangents of x only (a q8's tangent is dense)
    if is_linear_operand(qw):
      raise NotImplementedError("hx.matmul_q is linear in its dense operand only")
    if is_linear_operand(x) and not isinstance(ct, jax.experimental.hijax.Zero):
      accumulate(x, self._x_cotangent(ct, qw))

  def jvp(self, primals, tangents):
    (x, qw), (dx, dqw) = primals, tangents
    out = self(x, qw)
    zero = jax.experimental.hijax.Zero
    terms = []
    if not isinstance(dx, zero):
      terms.append(self._apply(dx, qw))
    if not isinstance(dqw, zero):
      terms.append(_dot(x.astype(F32), dqw, self.dims, self.out_aval.sharding))
    if not terms:
      return out, instantiate(dx, self.out_aval)
    return out, sum(terms[1:], terms[0])

  def batch(self, axis_data, args, dims):
    # one op, never a loop: the mapped axis becomes a batch or free dim of the
    # dot_general (dotdims.batched's rule, as for the lo primitive)
    (x, qw), (dx, dq) = args, dims
    if dx is None and dq is None:
      return self._apply(x, qw), None
    if dq is not None and not isinstance(dq, QArraySpec):
      raise TypeError(f"a quantized array is mapped with hx.QArraySpec(), got {dq!r}")
    x_aval, q_aval = self.in_avals
    new = dotdims.batched(self.dims, x_aval.ndim, q_aval.ndim, dx is not None, dq is not None)
    if new is None:  # only q mapped, and the scales need x mapped too
      x, dx = jnp.broadcast_to(x, (axis_data.size, *x.shape)), 0
      new = dotdims.batched(self.dims, x_aval.ndim, q_aval.ndim, True, True)
    elif dx is not None:
      x = jnp.moveaxis(x, dx, 0)
    dims2, out = new
    return MatmulQ(jax.typeof(x), jax.typeof(qw), dims2)(x, qw), out


class MakeQArray(HxPrimitive):
  """``make_qarray: i8[*l, n], f32[*l] -> q8[*l, n]``; see :func:`make_qarray`. A format
  with an offset takes a third operand, the offsets (``x = q * s + o``)."""

  def __init__(self, q_aval, s_aval, o_aval=None):
    self.out_aval = make_qarray_type(q_aval, s_aval, o_aval=o_aval)
    self.in_avals = (q_aval, s_aval) if o_aval is None else (q_aval, s_aval, o_aval)
    self.params = {}
    super().__init__()

  def _values(self, qvalue):
    return formats.values_f32(qvalue, self.out_aval.format)

  # the result is qvalue * scale[..., None] (+ offset[..., None]): linear in the scale
  # and the offset, and the integer values carry no tangent (float0, as for every
  # integer array in JAX)
  def jvp(self, primals, tangents):
    (qvalue, *rest), (_, dscale, *doff) = primals, tangents
    t_aval = self.out_aval.to_tangent_aval()
    out = self(qvalue, *rest)
    terms = []
    if not isinstance(dscale, Zero):
      terms.append(formats.apply_scale(self._values(qvalue), dscale.astype(F32)))
    if doff and not isinstance(doff[0], Zero):
      base = terms.pop() if terms else jnp.zeros(t_aval.shape, F32)
      units = formats.offset_units(qvalue, self.out_aval.format)  # block formats: -m
      terms.append(formats.add_offset(base, doff[0].astype(F32), units))
    return out, (terms[0] if terms else zeros(t_aval))

  def vjp_fwd(self, nzs_in, qvalue, *rest):
    return self(qvalue, *rest), qvalue

  def vjp_bwd_retval(self, qvalue, g):
    q_aval, *sc_avals = self.in_avals
    if isinstance(g, Zero):
      return (Zero(q_aval.to_ct_aval()), *(Zero(a.to_ct_aval()) for a in sc_avals))
    group = self.out_aval.group
    cts = [formats.sum_per_scale(g * self._values(qvalue), group)]
    if len(sc_avals) == 2:  # the offset's cotangent: the sum over its row or group
      units = formats.offset_units(qvalue, self.out_aval.format)  # block formats: -m
      cts.append(formats.sum_per_scale(g if units is None else g * units, group))
    return (Zero(q_aval.to_ct_aval()),
            *(shd.match_vma(ct.astype(a.dtype), a) for ct, a in zip(cts, sc_avals)))

  def batch(self, axis_data, args, dims):
    if all(d is None for d in dims):
      return _make_qarray(*args), None
    size = axis_data.size
    def lead(x, d):
      return jnp.moveaxis(x, d, 0) if d is not None else jnp.broadcast_to(x, (size, *x.shape))
    return _make_qarray(*(lead(a, d) for a, d in zip(args, dims))), QArraySpec()


def scale_tangent_weights(qvalue, group: int | None = None, fmt=None) -> jax.Array:
  """``w: f32[*l, n]`` with ``d(scale) = sum(w * dX, -1)`` for ``qarray_parts`` (per group of
  ``group`` elements when given: the sum runs over each group, as everything below).

  The scale's tangent is read where the dequantized value is most precise, at
  the elements of largest ``|qvalue|`` in each row: ``dX_j / qvalue_j``
  averaged over those ``j`` (one for a row from :func:`quantize` unless
  several values round to +-127). A row of zeros, and every row of an empty
  quantized axis (``n = 0``), gets ``w = 0``.
  """
  qf = formats.split_groups(formats.values_f32(qvalue, fmt), group)
  a = jnp.abs(qf)
  top = jnp.max(a, axis=-1, keepdims=True, initial=0)  # initial: n = 0 has no maximum
  at_top = (a == top) & (top > 0)
  count = jnp.sum(at_top, axis=-1, keepdims=True).astype(F32)
  w = jnp.where(at_top, 1 / jnp.where(at_top, qf * count, 1), 0)
  return formats.merge_groups(w, group)


class QArrayParts(HxPrimitive):
  """``qarray_parts: q8[*l, n] -> (i8[*l, n], f32[*l])``; see :func:`qarray_parts`."""

  def __init__(self, q_aval):
    _check_quantized("qarray_parts", q_aval)
    self.in_avals = (q_aval,)
    self.out_aval = tuple(q_aval.lo_ty())
    self.params = {}
    super().__init__()

  def _tangents(self, qvalue, dq):
    # a format with an offset: the offset's tangent is zero (the scale's is read as
    # below, from the signed or unsigned values)
    q_ty, s_ty, *o_ty = self.out_aval
    if isinstance(dq, Zero):
      return (Zero(q_ty.to_tangent_aval()), *(Zero(t.to_tangent_aval()) for t in (s_ty, *o_ty)))
    group = self.in_avals[0].group
    weights = scale_tangent_weights(qvalue, group, self.in_avals[0].format)
    ds = formats.sum_per_scale(weights * dq, group).astype(s_ty.dtype)
    return (Zero(q_ty.to_tangent_aval()), ds, *(Zero(t.to_tangent_aval()) for t in o_ty))

  def jvp(self, primals, tangents):
    (q,), (dq,) = primals, tangents
    parts = self(q)
    return parts, self._tangents(parts[0], dq)

  def vjp_fwd(self, nzs_in, q):
    parts = self(q)
    return parts, parts[0]

  def vjp_bwd_retval(self, qvalue, g):
    q_aval = self.in_avals[0]
    _, gs, *_ = g
    if isinstance(gs, Zero):
      return (Zero(q_aval.to_ct_aval()),)
    group = q_aval.group
    gq = formats.apply_scale(scale_tangent_weights(qvalue, group, q_aval.format),
                             gs.astype(F32))
    return (shd.match_vma(gq, q_aval),)

  def batch(self, axis_data, args, dims):
    (q,), (d,) = args, dims
    n = len(self.out_aval)
    if d is None:
      return _qarray_parts(q), (None,) * n
    if not isinstance(d, QArraySpec):
      raise TypeError(f"a quantized array is mapped with hx.QArraySpec(), got {d!r}")
    return _qarray_parts(q), (0,) * n



# the rules apply the primitives to values JAX already typed (hxmlir.types.qarray's user
# functions add the conversions users need)
def _dequantize(q):
  return Dequantize(jax.typeof(q))(q)


def _make_qarray(*components):
  return MakeQArray(*(jax.typeof(c) for c in components))(*components)


def _qarray_parts(q):
  return QArrayParts(jax.typeof(q))(q)
