"""The :class:`Exported` object: an artifact with its hi signature, called on hi values."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import export as jax_export

from hxmlir.export._artifact import (
  ARTIFACT_FORMAT,
  SIGNATURE_ATTR,
  VJP_ATTR,
  need_flatbuffers,
  seal,
)
from hxmlir.export._hilo import CallExported, match_key, typeof
from hxmlir.export._tree import flatten, unflatten
from hxmlir.types import shardings as shd
from hxmlir.types import typedesc
from hxmlir.types.hiprim import is_hi


class Exported:
  """A function exported with its hi signature.

  Attributes: ``fun_name``; ``in_types`` / ``out_types``, the flat argument and
  result types (``f32[2,3]``, ``q8[3,4]``, ``r1[6,5]``, ``Tup{...}``, with
  shardings); ``in_tree`` / ``out_tree``, their containers (JSON encoding);
  ``lo``, the underlying ``jax.export.Exported`` over lo components;
  ``hxmlir_version``, the version that exported it.
  """

  def __init__(self, lo: jax_export.Exported, *, in_tree, in_types, out_tree, out_types,
               hxmlir_version: str, vjp: Callable[[], Exported] | None = None):
    self.lo = lo
    self.fun_name = lo.fun_name
    self.in_tree = in_tree
    self.in_types = tuple(in_types)
    self.out_tree = out_tree
    self.out_types = tuple(out_types)
    self.hxmlir_version = hxmlir_version
    self._vjp_thunk = vjp
    self._vjp: Exported | None = None

  @property
  def platforms(self) -> tuple[str, ...]:
    """The platforms the artifact was lowered for (``("cpu", "cuda", "tpu")``)."""
    return tuple(self.lo.platforms)

  def signature(self) -> str:
    """``(f32[2,3], q8[3,4]) -> (f32[2,4])``: the flat hi argument and result types."""
    return (f"({', '.join(map(shd.short, self.in_types))}) -> "
            f"({', '.join(map(shd.short, self.out_types))})")

  def __repr__(self) -> str:
    return f"hxmlir.export.Exported({self.fun_name}: {self.signature()}, " \
           f"platforms={self.platforms})"

  def mlir_module(self) -> str:
    """The StableHLO module as text."""
    return self.lo.mlir_module()

  # --- calling ---------------------------------------------------------------
  def call(self, *args, **kwargs):
    """Calls the exported function on hi values; returns hi values in the exported structure.

    Works eagerly, under ``jit`` and under ``grad`` (with respect to arguments
    of inexact dtype and ``q8``/``r1``/``Tup`` values, whose cotangents are
    their dense tangent types; the VJP comes from the exporting process, or from
    an artifact serialized with ``vjp_order >= 1``). ``vmap`` is not supported (a
    ``NotImplementedError`` naming the signature and the mapped arguments): export for the
    batched shapes instead. Raises ``TypeError`` naming the
    expected and actual types when the arguments do not match the signature.
    """
    leaves, tree = flatten((args, kwargs), "arguments")
    if tree != self.in_tree:
      raise TypeError(f"{self.fun_name} was exported for arguments structured as "
                      f"{unflatten(self.in_tree, [shd.short(t) for t in self.in_types])}, "
                      f"called with {unflatten(tree, [shd.short(typeof(x)) for x in leaves])}")
    vals = [x if is_hi(jax.typeof(x)) else jnp.asarray(x) for x in leaves]
    tys = [jax.typeof(v) for v in vals]
    for i, (want, got) in enumerate(zip(self.in_types, tys)):
      if match_key(want) != match_key(got):
        raise TypeError(f"{self.fun_name} was exported for {self.signature()}; argument {i} "
                        f"has type {shd.short(got)}, expected {shd.short(want)}")
    outs = CallExported(self, tuple(tys))(*vals)
    return unflatten(self.out_tree, list(outs))

  # --- VJP ---------------------------------------------------------------------
  def has_vjp(self) -> bool:
    """Whether ``grad`` through :meth:`call` is available."""
    return self._vjp is not None or self._vjp_thunk is not None

  def vjp(self) -> Exported:
    """The exported VJP: ``(*in_values, *out_cotangents) -> in_cotangents``.

    Cotangents are taken for the inexact (differentiable) arguments and results
    only, in order; those of ``q8``/``r1`` values are dense ``f32`` arrays.
    Raises ``ValueError`` when not available.
    """
    if self._vjp is None:
      if self._vjp_thunk is None:
        raise ValueError(f"{self.fun_name}: no VJP is available; serialize with "
                         "vjp_order=1 to keep it in the artifact")
      self._vjp = self._vjp_thunk()
    return self._vjp

  # --- serialization -----------------------------------------------------------
  def signature_json(self) -> dict:
    """The ``hx.signature`` record embedded in the artifact."""
    return {"format": ARTIFACT_FORMAT, "hxmlir": self.hxmlir_version,
            "fun_name": self.fun_name,
            "in_tree": self.in_tree, "in": [typedesc.to_json(t) for t in self.in_types],
            "out_tree": self.out_tree, "out": [typedesc.to_json(t) for t in self.out_types]}

  def serialize(self, vjp_order: int = 0) -> bytearray:
    """The artifact: a standard ``jax.export`` serialization with the hi signature embedded.

    ``vjp_order`` VJP levels are embedded (``1`` keeps ``grad`` through
    :meth:`call` working after :func:`deserialize`). Needs ``flatbuffers``.
    """
    need_flatbuffers()
    attrs = {SIGNATURE_ATTR: json.dumps(self.signature_json(), sort_keys=True)}
    if vjp_order > 0:
      attrs[VJP_ATTR] = base64.b64encode(bytes(self.vjp().serialize(vjp_order - 1))).decode()
    return seal(self.lo, attrs)
