"""The kernel-side form of a hi type: inside ``pl.pallas_call`` each hi operand, result and
ref travels with every component at the dense rank (see :mod:`hxmlir.pallas`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jax.experimental.hijax import register_hitype
from jax.sharding import PartitionSpec

from hxmlir import _jax
from hxmlir.pallas.blocks import _layout, is_tup, note_block_of


@dataclass(frozen=True)
class KernelFormValue:
  """A value of a kernel-form type ``ty``: its lo components ``parts`` (arrays or refs)."""
  parts: tuple
  ty: object


register_hitype(KernelFormValue, lambda v: v.ty)

_FORM_CLASSES: dict = {}


def is_kernel_form(ty) -> bool:
  """Whether ``ty`` is a kernel-form type (:func:`kernel_form`)."""
  return type(ty) in _FORM_CLASSES.values()


def _form_class(cls: type) -> type:
  """The kernel-form subclass of hi type class ``cls`` (one per class)."""
  if cls not in _FORM_CLASSES:
    def lo_ty(self):
      return _form_lo_ty(self)

    def lower_val(self, v):
      return list(v.parts)

    def raise_val(self, *lo):
      return KernelFormValue(tuple(lo), self)

    def _pallas_block_ty(self, shape):
      return value_type(self)._pallas_block_ty(shape)

    # dataclass equality compares classes: a form never equals its value type
    _FORM_CLASSES[cls] = type(f"{cls.__name__}KernelForm", (cls,), dict(
        lo_ty=lo_ty, lower_val=lower_val, raise_val=raise_val,
        _pallas_block_ty=_pallas_block_ty,
        __doc__=f"The kernel-side form of a {cls.__name__} (hxmlir.pallas.kernel_form)."))
    _jax.register_indexer_transform_type(_FORM_CLASSES[cls])
  return _FORM_CLASSES[cls]


def has_kernel_form(ty) -> bool:
  """Whether ``ty`` is, or (a Tup) holds, a kernel-form type."""
  return any(has_kernel_form(t) for t in ty.tys) if is_tup(ty) else is_kernel_form(ty)


def _retyped(ty, cls):
  return cls(**{f.name: getattr(ty, f.name) for f in dataclasses.fields(ty)})


def value_type(ty):
  """The ordinary type of kernel form ``ty`` (``ty`` itself for other types; Tups per element)."""
  if is_tup(ty):
    return type(ty)(tuple(value_type(t) for t in ty.tys))
  if is_kernel_form(ty):
    return _retyped(ty, type(ty).__mro__[1])
  return ty


def kernel_form(ty):
  """The type hi type ``ty`` has as an operand, result or ref of ``pl.pallas_call``.

  For a type with a Pallas layout (``q8``/``q4``/``f8``, ``r1``): the same type but
  for its lo types, each component with the dense rank (unit dims on the axes it
  lacks: ``q8[m, n]``'s scale ``f32[m, 1]``); a Tup's form is its elements'; other
  types (arrays) are their own. Idempotent.
  """
  if not getattr(ty, "is_high", False):
    return ty
  if is_tup(ty):
    tys = tuple(kernel_form(t) for t in ty.tys)
    return ty if all(a is b for a, b in zip(tys, ty.tys)) else type(ty)(tys)
  if is_kernel_form(ty) or not hasattr(ty, "_pallas_layout"):
    return ty
  form = _retyped(ty, _form_class(type(ty)))
  if hasattr(ty, "_pallas_array_shape"):
    note_block_of(form, ty._pallas_array_shape)
  return form


def _form_lo_ty(form) -> list:
  base = value_type(form)
  layout = _layout(base)
  rank = len(base.shape)
  out = []
  for lo, axes in zip(base.lo_ty(), layout["components"]):
    if len(axes) == rank:
      out.append(lo)
      continue
    shape, spec, it = [], [], iter(zip(lo.shape, tuple(lo.sharding.spec) + (None,) * lo.ndim))
    for a in range(rank):
      d, s = next(it) if a in axes else (1, None)
      shape.append(d)
      spec.append(s)
    out.append(lo.update(shape=tuple(shape),
                         sharding=lo.sharding.update(spec=PartitionSpec(*spec))))
  return out


def _unit_reshape(x, shape):
  """``x`` with unit dims inserted or removed to have ``shape`` (same elements)."""
  shape = tuple(shape)
  if tuple(x.shape) == shape:
    return x
  from jax import lax
  if len(shape) > x.ndim:
    i, pos = 0, []
    for j, d in enumerate(shape):
      if i < x.ndim and x.shape[i] == d:
        i += 1
      else:
        pos.append(j)
    return lax.expand_dims(x, pos)
  i, pos = 0, []
  for j, d in enumerate(x.shape):
    if i < len(shape) and shape[i] == d:
      i += 1
    else:
      pos.append(j)
  return lax.squeeze(x, pos)


def to_kernel_form(ty, x):
  """Value ``x`` of type ``ty`` as a value of ``kernel_form(ty)`` (components reshaped)."""
  form = kernel_form(ty)
  if form is ty:
    return x
  parts = ty.lower_val(x)
  return form.raise_val(*[_unit_reshape(p, lo.shape) for p, lo in zip(parts, form.lo_ty())])


def from_kernel_form(ty, x):
  """Value ``x`` of ``kernel_form(ty)`` as a value of ``ty``'s ordinary type."""
  vt = value_type(ty)
  form = kernel_form(vt)
  if form is vt:
    return x
  parts = form.lower_val(x)
  return vt.raise_val(*[_unit_reshape(p, lo.shape) for p, lo in zip(parts, vt.lo_ty())])


def use_in_kernels() -> None:
  """Lets ``hx.*`` ops lower inside Pallas TPU (Mosaic) and GPU (Triton) kernels.

  Each of hxmlir's lo primitives then lowers in a kernel as its reference
  code (``hxmlir.lowering.reference``), as if written inline. Done
  automatically when a ``q8``/``r1``/``Tup`` is an operand or result of
  ``pl.pallas_call``; a kernel that uses ``hx.*`` ops on dense operands only
  needs this call once before it is lowered for TPU or GPU (interpret mode
  needs nothing). Idempotent; imports Pallas' TPU and Triton lowerings.
  """
  _jax.activate_pallas_kernel_rules()
  _jax.install_pallas_operand_forms(kernel_form, to_kernel_form, from_kernel_form,
                                    has_kernel_form, value_type)
