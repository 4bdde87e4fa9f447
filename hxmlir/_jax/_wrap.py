"""What the seam's wrappers share: telling hi values from arrays, and replacing one of
JAX's functions by a wrapper once (``_hx_wraps`` marks hxmlir's wrappers)."""

from __future__ import annotations

from jax._src import core
from jax._src.hijax import HiType as _HiType


def _is_hi(aval) -> bool:
  return isinstance(aval, _HiType)


def _any_high(*avals, **params) -> bool:
  return any(a.is_high for a in avals)


def _short(ty) -> str:
  return ty.str_short(short_dtypes=True)


def _make_high(prim, to_lojax) -> None:
  """Make JAX primitive ``prim`` take hi operands: lowered by ``to_lojax`` on values."""
  prim.is_high = _any_high
  prim.to_lojax = to_lojax


def _replace(obj, name, wrap) -> None:
  """``obj.name = wrap(obj.name)`` (``obj[name]`` for a dict) unless hxmlir wrapped it already."""
  if isinstance(obj, dict):
    if getattr(obj[name], "_hx_wraps", None) is None:
      obj[name] = wrap(obj[name])
  elif getattr(getattr(obj, name), "_hx_wraps", None) is None:
    setattr(obj, name, wrap(getattr(obj, name)))


def _hi_typeof(x):
  """``core.typeof(x)`` if it is a hi type, else ``None``."""
  try:
    ty = core.typeof(x)
  except TypeError:
    return None
  return ty if _is_hi(ty) else None


def _is_int_dim(d) -> bool:
  return isinstance(d, int) and not isinstance(d, bool)
