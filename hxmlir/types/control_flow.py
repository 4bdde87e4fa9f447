"""``vmap`` of ``lax.scan`` / ``while_loop`` / ``fori_loop`` / ``cond`` / ``switch`` with hi values.

JAX's control-flow batching rules speak int batch dims (``0`` for operands, carries
and branch values, ``1`` for scan ``xs``/``ys``) and merge the branches of a ``cond``
with a batched predicate by ``lax.select_n``; hxmlir's hi values map along their
leading axis with a mapping spec (``hx.QArraySpec()``). The bridge (installed in
``hxmlir._jax`` by :func:`hxmlir._jax.install_vmap_control_flow` when this module is
imported) reads an int dim ``0`` of a hi value as its ``leading_axis_spec()`` and
uses the two generic hi primitives here for what arrays do with ``moveaxis`` and
``select_n``. Both are written against JAX's ``HiType`` protocol only (``dec_rank``,
``inc_rank``, ``leading_axis_spec``, ``lower_val``, ``raise_val``), so ``q8``, ``r1``
and ``Tup`` all work.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.hijax import HiType, Zero

from hxmlir._jax import install_vmap_control_flow
from hxmlir.types import jax_apis
from hxmlir.types.hiprim import (
    HxPrimitive,
    accumulate,
    broadcast_unmapped,
    instantiate,
    is_linear_operand,
    zeros,
)


def _peel(ty, sizes):
  """``T[*sizes, ...] -> T[...]``: the leading axes (mapped by the leading spec) removed."""
  for s in sizes:
    ty = ty.dec_rank(s, ty.leading_axis_spec())
  return ty


def _wrap(ty, sizes):
  """``T[...] -> T[*sizes, ...]``: leading axes added."""
  for s in reversed(sizes):
    ty = ty.inc_rank(s, ty.leading_axis_spec())
  return ty


def leading_size(ty) -> int:
  """The size of the leading axis of hi type ``ty`` (a tuple: that of its first element,
  which its leading spec maps like every other)."""
  if hasattr(ty, "shape"):
    return ty.shape[0]
  first = ty.tys[0]
  return leading_size(first) if isinstance(first, HiType) else first.shape[0]


def _swap_dense(t, sizes):
  """Tangents and cotangents (dense arrays, or hi for tuples) swapped like the primal."""
  if isinstance(jax.typeof(t), HiType):
    return SwapLeadingHi(jax.typeof(t), sizes)(t)
  k = len(sizes) - 2
  return jnp.swapaxes(t, k, k + 1)


class SwapLeadingHi(HxPrimitive):
  """``T[*pre, a, b, ...] -> T[*pre, b, a, ...]``: swap leading axes ``k``, ``k + 1``
  (``k = len(pre)``, ``sizes = (*pre, a, b)``) of a hi value, e.g. ``q8[B,T,4,8] ->
  q8[T,B,4,8]``.

  Every component of a leading-mapped hi type carries all its leading axes
  (``q8``: values ``i8[B,T,4,8]``, scales ``f32[B,T,4]``), so each is
  ``jnp.swapaxes``-ed the same way; the tangent, a dense array (or a tuple of
  them), is swapped likewise and the cotangent swapped back.
  """

  def __init__(self, aval, sizes):
    sizes = tuple(sizes)
    *pre, a, b = sizes
    self.in_avals = (aval,)
    self.out_aval = _wrap(_peel(aval, sizes), (*pre, b, a))
    self.params = dict(sizes=sizes)
    super().__init__()

  def _back(self) -> tuple:
    *pre, a, b = self.sizes
    return (*pre, b, a)

  def expand(self, x):  # lo components only: nothing for hxmlir.lowering to add
    k = len(self.sizes) - 2
    ty, out = self.in_avals[0], self.out_aval
    return out.raise_val(*(jnp.swapaxes(lo, k, k + 1) for lo in ty.lower_val(x)))

  def jvp(self, primals, tangents):
    (x,), (dx,) = primals, tangents
    if isinstance(dx, Zero):
      return self(x), Zero(self.out_aval.to_tangent_aval())
    return self(x), _swap_dense(dx, self.sizes)

  def vjp_fwd(self, nzs_in, x):
    return self(x), None

  def vjp_bwd_retval(self, _res, g):
    return (_swap_dense(g, self._back()),)

  def transpose(self, ct, x):
    if is_linear_operand(x) and not isinstance(ct, Zero):
      accumulate(x, _swap_dense(ct, self._back()))

  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    if d is None:
      return self(x), None
    return SwapLeadingHi(jax.typeof(x), (axis_data.size, *self.sizes))(x), d


def swap_leading_axes(x):
  """Hi value ``x: T[a, b, ...]`` as ``T[b, a, ...]`` (scan ``xs``/``ys`` vs. the batch axis)."""
  ty = jax.typeof(x)
  a = leading_size(ty)
  b = leading_size(ty.dec_rank(a, ty.leading_axis_spec()))
  return SwapLeadingHi(ty, (a, b))(x)


def _select_n(which, cases):
  """``lax.select_n(which, *cases)`` per leading index: hi cases by :class:`SelectNHi`,
  array cases with ``which: [*w]`` broadcast over their trailing axes."""
  c0 = cases[0]
  if isinstance(jax.typeof(c0), HiType):
    return SelectNHi(jax.typeof(which), jax.typeof(c0), len(cases))(which, *cases)
  if np.ndim(which) != np.ndim(c0):
    which = jax.lax.broadcast_in_dim(which, np.shape(c0), tuple(range(np.ndim(which))))
  return jax.lax.select_n(which, *cases)


class SelectNHi(HxPrimitive):
  """``select_n(which: bool/i32[*w], *cases: T[*w, ...]) -> T[*w, ...]``.

  Picks case ``which[i]`` at each leading index ``i`` (as ``lax.select_n``), for
  every component of the hi value at once: a ``q8``'s values and scales pick the
  same case in each row, so the result is a consistent ``q8``. Tangents are
  selected the same way; the cotangent goes to the chosen case, zeros elsewhere.
  """

  def __init__(self, which_aval, case_aval, n: int):
    self.in_avals = (which_aval,) + (case_aval,) * n
    self.out_aval = case_aval
    self.params = dict(n=n)
    super().__init__()

  def expand(self, which, *cases):
    ty = self.out_aval
    return ty.raise_val(*(_select_n(which, list(los))
                          for los in zip(*(ty.lower_val(c) for c in cases))))

  def _route(self, which, ct):
    """The cotangent ``ct`` as each case's: itself where chosen, zeros elsewhere."""
    z = zeros(self.out_aval.to_ct_aval())
    return [_select_n(which, [z] * i + [ct] + [z] * (self.n - i - 1)) for i in range(self.n)]

  def jvp(self, primals, tangents):
    which, *cases = primals
    _, *dcases = tangents
    t_aval = self.out_aval.to_tangent_aval()
    if all(isinstance(t, Zero) for t in dcases):
      return self(which, *cases), Zero(t_aval)
    return self(which, *cases), _select_n(which, [instantiate(t, t_aval) for t in dcases])

  def vjp_fwd(self, nzs_in, which, *cases):
    return self(which, *cases), which

  def vjp_bwd_retval(self, which, g):
    return (None, *self._route(which, g))

  def transpose(self, ct, which, *cases):
    if isinstance(ct, Zero):
      return
    for c, ct_c in zip(cases, self._route(which, ct)):
      if is_linear_operand(c):
        accumulate(c, ct_c)

  def batch(self, axis_data, args, dims):
    which, *cases = args
    wd, *cds = dims
    size = axis_data.size
    which = (jnp.moveaxis(which, wd, 0) if wd is not None
             else jnp.broadcast_to(which, (size, *np.shape(which))))
    cases = [c if d is not None else broadcast_unmapped(c, size) for c, d in zip(cases, cds)]
    ty = jax.typeof(cases[0])
    return SelectNHi(jax.typeof(which), ty, self.n)(which, *cases), ty.leading_axis_spec()


def select_n(which, *cases):
  """``lax.select_n`` for hi ``cases: T[*w, ...]`` and ``which: bool/i32[*w]``."""
  return _select_n(which, list(cases))


install_vmap_control_flow(swap_leading_axes=swap_leading_axes, select_n=select_n,
                          broadcast_unmapped=broadcast_unmapped,
                          stop_gradient_to_lojax=jax_apis.stop_gradient_to_lojax)
