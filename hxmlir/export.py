"""``hxmlir.export``: portable ``jax.export`` artifacts for functions whose signatures hold hi types.

``jax.export`` sees only lo arrays: exporting ``jax.jit(hx.matmul_q)`` with a
``QArray`` argument gives an artifact that must be called with the int8 values
and scales as separate arrays, and ``hx.quantize`` comes back as a list of two
arrays. This module keeps the hi signature::

  exp = hxmlir.export.export(hx.matmul_q)(x, qw)     # f32[2,3], q8[3,4]
  exp.in_types, exp.out_types                        # (f32[2,3], q8[3,4]), (f32[2,4],)
  y = exp.call(x, qw)                                # QArray in; works under jit and grad
  blob = exp.serialize()                             # bytes
  exp2 = hxmlir.export.deserialize(blob)             # in another process

How it works. :func:`export` exports, with ``jax.export``, a *lo function* that
takes the flat list of lo components (``f32[2,3], i8[3,4], f32[3]``), rebuilds
the hi values with a hi primitive (``_RaiseHi``, whose ``to_lojax`` rule is the
type's ``raise_val``), calls the user's function, and takes hi results apart
with ``_LowerHi`` (``lower_val``). :meth:`Exported.call` binds one hi primitive
whose ``to_lojax`` rule lowers the hi arguments, calls the ``jax.export``
artifact and raises its results, and whose VJP calls an exported VJP function
of the hi signature (so gradients of ``q8``/``r1`` arguments are their dense
tangents, as with the live functions).

Serialization: the bytes are exactly a ``jax.export`` serialization (a
flatbuffer holding a StableHLO portable artifact); ``jax.export.deserialize``
reads them and the result is called with the lo components. hxmlir's
additions ride in two standard places that JAX carries through untouched:

- attributes of the StableHLO module: ``hx.signature`` (JSON: artifact format,
  hxmlir version, function name, hi argument/result trees and type descriptors
  from :mod:`hxmlir.typedesc`) and, with ``serialize(vjp_order=1)``, ``hx.vjp``
  (the serialized VJP artifact, base64);
- one entry of the artifact's ``disabled_safety_checks`` list,
  ``DisabledSafetyCheck.custom_call("hxmlir.bytes.sha256:<hex>")``: a SHA-256
  over every byte of the artifact, the 64 hex digits of the digest itself
  written as ``0`` (the artifact is serialized with that placeholder, hashed,
  and the hex written in its place: same length, same layout). It names a
  custom-call target that never exists, so it disables nothing; it must live
  outside the module because it is checked on the raw bytes *before* anything
  parses them (JAX's flatbuffer reader, MLIR's bytecode reader, which can
  crash on corrupted input), so every corrupted byte is refused up front.
  Artifact format 1 (hxmlir 0.1) sealed with ``hxmlir.digest.sha256:<hex>``
  instead, a digest of canonical forms of the ``Exported`` fields; such
  artifacts are still read.

Serialization needs the
``flatbuffers`` package, which JAX does not install but hxmlir depends on.

:func:`deserialize` raises :class:`ArtifactError` naming what is wrong for
bytes that are truncated or corrupted, lack an hxmlir signature, come from a
newer hxmlir (artifact format, type schema or ``hx.*`` composite version), or
whose signature does not match the module.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export
from jax.experimental.hijax import HiType, ShapedArray, Zero
from jaxlib.mlir import ir

from hxmlir import _jax, typedesc
from hxmlir.hiprim import HxPrimitive, register_to_lojax, zeros
from hxmlir.lowering import matmul_q_cpu

ARTIFACT_FORMAT = 2
"""Version of the artifact layout (the ``hx.*`` module attributes and the digest); readers
accept <= this. 1: digest of the ``Exported`` fields (``DIGEST_PREFIX_V1``); 2: digest of
every byte (``DIGEST_PREFIX``)."""
SIGNATURE_ATTR = "hx.signature"
DIGEST_PREFIX = "hxmlir.bytes.sha256:"
DIGEST_PREFIX_V1 = "hxmlir.digest.sha256:"
_DIGEST_HEX = 64
_MIN_SIZE = 16  # a flatbuffer's root offset and the smallest tables; artifacts are KBs
VJP_ATTR = "hx.vjp"


class ArtifactError(ValueError):
  """Serialized bytes that ``hxmlir.export.deserialize`` cannot trust or read.

  The message names the problem: truncated or corrupted bytes, no hxmlir
  signature, an artifact or type schema or ``hx.*`` composite version newer
  than this hxmlir, or a signature that does not match the module.
  """


def _hxmlir_version() -> str:
  import hxmlir
  return hxmlir.__version__


# --- argument trees ----------------------------------------------------------
# Trees are encoded as JSON: "*" a leaf, null None, {"tuple": [...]},
# {"list": [...]}, {"dict": [[key, tree], ...]} (string keys, sorted).

def _flatten(tree, what: str) -> tuple[list, Any]:
  leaves: list = []

  def enc(t):
    if t is None:
      return None
    if type(t) is tuple:
      return {"tuple": [enc(e) for e in t]}
    if type(t) is list:
      return {"list": [enc(e) for e in t]}
    if type(t) is dict:
      if not all(isinstance(k, str) for k in t):
        raise TypeError(f"hxmlir.export: {what} dicts must have string keys, got {list(t)}")
      return {"dict": [[k, enc(t[k])] for k in sorted(t)]}
    if isinstance(t, (tuple, list, dict)) or jax.tree.structure(t).num_nodes > 1:
      raise TypeError(f"hxmlir.export: {what} may hold tuples, lists, dicts and None "
                      f"around JAX values, not {type(t).__name__}")
    leaves.append(t)
    return "*"
  return leaves, enc(tree)


def _unflatten(tree, leaves: Sequence) -> Any:
  it = iter(leaves)

  def dec(t):
    if t is None:
      return None
    if t == "*":
      return next(it)
    if isinstance(t, dict) and len(t) == 1:
      (kind, v), = t.items()
      if kind == "tuple" and isinstance(v, list):
        return tuple(dec(e) for e in v)
      if kind == "list" and isinstance(v, list):
        return [dec(e) for e in v]
      if kind == "dict" and isinstance(v, list):
        return {k: dec(e) for k, e in v}
    raise ValueError(f"bad tree encoding {t!r}")
  return dec(tree)


def _count_leaves(tree) -> int:
  if tree == "*":
    return 1
  if tree is None:
    return 0
  (kind, v), = tree.items()
  return sum(_count_leaves(e[1] if kind == "dict" else e) for e in v)


# --- types -------------------------------------------------------------------

def _is_hi(ty) -> bool:
  return isinstance(ty, HiType)


def _lo_tys(ty) -> list:
  return list(ty.lo_ty()) if _is_hi(ty) else [ty]


def _typeof(x):
  if isinstance(x, (HiType, ShapedArray)):
    return x
  if isinstance(x, jax.ShapeDtypeStruct):
    s = x.sharding if isinstance(x.sharding, jax.sharding.NamedSharding) else None
    if s is None:
      return ShapedArray(x.shape, x.dtype, weak_type=x.weak_type)
    return ShapedArray(x.shape, x.dtype, weak_type=x.weak_type, sharding=s)
  return jax.typeof(x)


def _short(ty) -> str:
  return ty.str_short(short_dtypes=True) if hasattr(ty, "str_short") else repr(ty)


def _key(ty):
  """What a call's argument must match: the descriptor without shardings and weak types."""
  def strip(d):
    d = {k: v for k, v in d.items() if k not in ("sharding", "weak_type")}
    if "elts" in d:
      d["elts"] = [strip(e) for e in d["elts"]]
    return d
  return json.dumps(strip(typedesc.to_json(ty)), sort_keys=True)


def _differentiable(ty) -> bool:
  if _is_hi(ty):
    return all(_differentiable(t) for t in _lo_tys(ty.to_tangent_aval())) \
        if _is_hi(ty.to_tangent_aval()) else _differentiable(ty.to_tangent_aval())
  return jnp.issubdtype(ty.dtype, jnp.inexact)


# --- hi primitives that take hi values apart and build them (export side) ---

class _RaiseHi(HxPrimitive):
  """``raise: lo components of ty -> ty`` (the type's ``raise_val``), for traced code."""

  def __init__(self, ty):
    self.in_avals = tuple(ty.lo_ty())
    self.out_aval = ty
    self.params = {"ty": ty}
    super().__init__()


class _LowerHi(HxPrimitive):
  """``lower: ty -> its lo components`` (the type's ``lower_val``), for traced code."""

  def __init__(self, ty):
    self.in_avals = (ty,)
    self.out_aval = tuple(ty.lo_ty())
    self.params = {"ty": ty}
    super().__init__()


@register_to_lojax(_RaiseHi)
def _raise_rule(prim, *los):
  return prim.ty.raise_val(*los)


@register_to_lojax(_LowerHi)
def _lower_rule(prim, v):
  return tuple(prim.ty.lower_val(v))


def _lower_flat(tys, vals, traced: bool) -> list:
  out = []
  for ty, v in zip(tys, vals):
    if not _is_hi(ty):
      out.append(v)
    elif traced:
      out.extend(_LowerHi(ty)(v))
    else:
      out.extend(ty.lower_val(v))
  return out


def _raise_flat(tys, los, traced: bool) -> list:
  it = iter(los)
  out = []
  for ty in tys:
    if not _is_hi(ty):
      out.append(next(it))
      continue
    parts = [next(it) for _ in ty.lo_ty()]
    out.append(_RaiseHi(ty)(*parts) if traced else ty.raise_val(*parts))
  return out


# --- the exported object -----------------------------------------------------

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
    return (f"({', '.join(map(_short, self.in_types))}) -> "
            f"({', '.join(map(_short, self.out_types))})")

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
    an artifact serialized with ``vjp_order >= 1``). ``vmap`` is not supported:
    export for the batched shapes instead. Raises ``TypeError`` naming the
    expected and actual types when the arguments do not match the signature.
    """
    leaves, tree = _flatten((args, kwargs), "arguments")
    if tree != self.in_tree:
      raise TypeError(f"{self.fun_name} was exported for arguments structured as "
                      f"{_unflatten(self.in_tree, [_short(t) for t in self.in_types])}, "
                      f"called with {_unflatten(tree, [_short(_typeof(x)) for x in leaves])}")
    vals = [x if _is_hi(jax.typeof(x)) else jnp.asarray(x) for x in leaves]
    tys = [jax.typeof(v) for v in vals]
    for i, (want, got) in enumerate(zip(self.in_types, tys)):
      if _key(want) != _key(got):
        raise TypeError(f"{self.fun_name} was exported for {self.signature()}; argument {i} "
                        f"has type {_short(got)}, expected {_short(want)}")
    outs = _CallExported(self, tuple(tys))(*vals)
    return _unflatten(self.out_tree, list(outs))

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
    _need_flatbuffers()
    attrs = {SIGNATURE_ATTR: json.dumps(self.signature_json(), sort_keys=True)}
    if vjp_order > 0:
      attrs[VJP_ATTR] = base64.b64encode(bytes(self.vjp().serialize(vjp_order - 1))).decode()
    return _seal(self.lo, attrs)


def _need_flatbuffers() -> None:
  """``jax.export`` serializes with the ``flatbuffers`` package, which JAX does not install."""
  try:
    import flatbuffers  # noqa: F401
  except ImportError:
    raise ImportError("hxmlir.export (de)serialization needs the 'flatbuffers' package, an "
                      "hxmlir dependency that JAX does not install: pip install flatbuffers"
                      ) from None


def _digest_v1(lo: jax_export.Exported, size: int) -> str:
  """Artifact format 1's digest (read only): SHA-256 over the artifact's ``size``, the module
  bytes and every ``Exported`` field (hxmlir's digest entry aside), each in a canonical form."""
  def aval(a):
    return [[int(n) for n in a.shape], np.dtype(a.dtype).name]

  def sharding(sh):
    if sh is None:
      return None
    if isinstance(sh, jax.sharding.NamedSharding):
      return [[str(n) for n in sh.mesh.axis_names], [int(z) for z in sh.mesh.axis_sizes],
              [e if e is None or isinstance(e, str) else list(e) for e in sh.spec]]
    return str(sh)

  fields = json.dumps([
      size, lo.fun_name, [aval(a) for a in lo.in_avals], [aval(a) for a in lo.out_avals],
      str(lo.in_tree), str(lo.out_tree), list(lo.platforms), lo.nr_devices,
      lo.calling_convention_version, list(lo.module_kept_var_idx),
      bool(lo.uses_global_constants), len(lo.ordered_effects), len(lo.unordered_effects),
      [sharding(s) for s in lo.in_shardings_hlo], [sharding(s) for s in lo.out_shardings_hlo],
      [sharding(s) for s in getattr(lo, "_in_named_shardings", ())],
      [sharding(s) for s in getattr(lo, "_out_named_shardings", ())],
      [str(c) for c in _plain_checks(lo)]])
  return hashlib.sha256(bytes(lo.mlir_module_serialized) + b"\0" + fields.encode()).hexdigest()


def _is_digest(c) -> bool:
  t = c.is_custom_call() or ""
  return t.startswith(DIGEST_PREFIX) or t.startswith(DIGEST_PREFIX_V1)


def _plain_checks(lo) -> list:
  return [c for c in lo.disabled_safety_checks if not _is_digest(c)]


def _digests(lo) -> list[str]:
  return [c.is_custom_call() for c in lo.disabled_safety_checks if _is_digest(c)]


def _bytes_digest(blob: bytes, at: int) -> bytes:
  """SHA-256 hex of ``blob`` with the ``_DIGEST_HEX`` bytes at ``at`` read as ``0``."""
  h = hashlib.sha256(blob[:at])
  h.update(b"0" * _DIGEST_HEX)
  h.update(blob[at + _DIGEST_HEX:])
  return h.hexdigest().encode()


def _seal(lo: jax_export.Exported, attrs: dict[str, str]) -> bytearray:
  """Serializes ``lo`` with string ``attrs`` on its module and hxmlir's digest entry."""
  with _jax.make_ir_context():
    module = lo.mlir_module(serialized=False)
    for k in (SIGNATURE_ATTR, VJP_ATTR):
      if k in module.operation.attributes:
        del module.operation.attributes[k]
    for k, v in attrs.items():
      module.operation.attributes[k] = ir.StringAttr.get(v)
    lo = dataclasses.replace(lo, mlir_module_serialized=_jax.module_to_portable_bytecode(module),
                             disabled_safety_checks=tuple(_plain_checks(lo)))
  seal = jax_export.DisabledSafetyCheck.custom_call(DIGEST_PREFIX + "0" * _DIGEST_HEX)
  out = dataclasses.replace(
      lo, disabled_safety_checks=(*lo.disabled_safety_checks, seal)).serialize()
  # the placeholder is written as-is (a flatbuffer string); its hex goes in its place
  marker = DIGEST_PREFIX.encode()
  assert bytes(out).count(marker) == 1, "hxmlir digest prefix occurs more than once"
  at = bytes(out).index(marker) + len(marker)
  out[at:at + _DIGEST_HEX] = _bytes_digest(bytes(out), at)
  return out


def _check_sealed(blob: bytes) -> bool:
  """Checks the format-2 digest over the raw bytes, before anything parses them.

  Returns ``False`` when ``blob`` has no format-2 digest entry (a format-1 artifact, or
  not hxmlir's); raises :class:`ArtifactError` when its digest does not match.
  """
  marker = DIGEST_PREFIX.encode()
  n = blob.count(marker)
  if n == 0:
    return False
  at = blob.index(marker) + len(marker)
  if n > 1 or _bytes_digest(blob, at) != blob[at:at + _DIGEST_HEX]:
    raise ArtifactError(f"artifact is truncated or corrupted: its {len(blob)} bytes do not "
                        "match the SHA-256 digest it was sealed with")
  return True


# --- the call primitive ----------------------------------------------------------

class _CallExported(HxPrimitive):
  """Calls an :class:`Exported` on hi values: ``in_types -> tuple(out_types)``."""

  def __init__(self, exported: Exported, in_tys: tuple):
    self.in_avals = in_tys
    self.out_aval = tuple(exported.out_types)
    self.params = {"exported": exported}
    super().__init__()

  def vjp_fwd(self, nzs_in, *args):
    return self(*args), args

  def vjp_bwd(self, res, outgrad, *arg_accums):
    exp = self.exported
    vjp = exp.vjp()
    cts = [zeros(ty.to_tangent_aval() if _is_hi(ty) else ty) if isinstance(g, Zero) else g
           for ty, g in zip(exp.out_types, outgrad) if _differentiable(ty)]
    grads = iter(vjp.call(*res, *cts))
    for ty, acc in zip(exp.in_types, arg_accums):
      if _differentiable(ty):
        g = next(grads)
        if hasattr(acc, "accum"):
          acc.accum(g)


@register_to_lojax(_CallExported)
def _call_exported_rule(prim, *args):
  exp = prim.exported
  los = _lower_flat(exp.in_types, args, traced=False)
  outs = exp.lo.call(*los)
  return tuple(_raise_flat(exp.out_types, outs, traced=False))


# --- export ------------------------------------------------------------------------

def export(fn: Callable, platforms: Sequence[str] | None = None, *,
           disabled_checks: Sequence[jax_export.DisabledSafetyCheck] = ()
           ) -> Callable[..., Exported]:
  """``export(fn, platforms)(*args, **kwargs)``: exports ``fn`` for these argument types.

  ``args``/``kwargs`` are example values or types (arrays, ``jax.ShapeDtypeStruct``,
  hi values such as ``QArray``, or hi types such as ``hx.QArrayTy``) in tuples,
  lists, dicts and ``None``; results may hold the same. ``platforms`` defaults to
  the default backend's; ``("cpu", "cuda", "tpu")`` exports for all three from any
  machine. ``disabled_checks`` is passed to ``jax.export.export``.

  Returns an :class:`Exported`. Raises ``TypeError`` for containers other than
  tuple/list/dict or types without a descriptor, and whatever
  ``jax.export.export`` raises (for example on custom calls that are not
  export-stable).
  """
  def do_export(*args, **kwargs) -> Exported:
    leaves, in_tree = _flatten((args, kwargs), "arguments")
    in_tys = [_typeof(x) for x in leaves]
    in_tys = [_checked_type(t, f"argument {i}") for i, t in enumerate(in_tys)]
    lo_avals = [lo for t in in_tys for lo in _lo_tys(t)]
    out_info: dict[str, Any] = {}

    def lo_fun(*los):
      his = _raise_flat(in_tys, los, traced=True)
      a, kw = _unflatten(in_tree, his)
      out = fn(*a, **kw)
      out_leaves, out_tree = _flatten(out, "results")
      out_tys = [_checked_type(jax.typeof(o), f"result {i}") for i, o in enumerate(out_leaves)]
      out_info.update(tree=out_tree, tys=out_tys)
      return _lower_flat(out_tys, out_leaves, traced=True)

    lo_fun.__name__ = getattr(fn, "__name__", "fn")
    lo = jax_export.export(jax.jit(lo_fun), platforms=platforms,
                           disabled_checks=disabled_checks)(*map(_sds, lo_avals))
    out_tree, out_tys = out_info["tree"], out_info["tys"]

    def make_vjp() -> Exported:
      return _export_vjp(fn, lo, in_tree, in_tys, out_tree, out_tys, platforms,
                         disabled_checks)

    return Exported(lo, in_tree=in_tree, in_types=in_tys, out_tree=out_tree,
                    out_types=out_tys, hxmlir_version=_hxmlir_version(), vjp=make_vjp)
  return do_export


def _checked_type(ty, what: str):
  try:
    typedesc.to_json(ty)
  except typedesc.DescriptorError as e:
    raise TypeError(f"hxmlir.export: {what} has type {_short(ty)}, which cannot be "
                    f"exported: {e}") from None
  return ty


def _sds(aval) -> jax.ShapeDtypeStruct:
  s = aval.sharding
  if s is None or s.mesh.empty:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=s)


def _export_vjp(fn, lo, in_tree, in_tys, out_tree, out_tys, platforms, disabled_checks
                ) -> Exported:
  """Exports ``(*in_values, *out_cts) -> in_cts`` over the differentiable positions."""
  diff_in = [i for i, t in enumerate(in_tys) if _differentiable(t)]
  diff_out = [i for i, t in enumerate(out_tys) if _differentiable(t)]
  n = len(in_tys)

  def vjp_fun(*flat):
    primals, cts = list(flat[:n]), flat[n:]

    def f(*xs):
      full = list(primals)
      for i, x in zip(diff_in, xs):
        full[i] = x
      a, kw = _unflatten(in_tree, full)
      outs, _ = _flatten(fn(*a, **kw), "results")
      return tuple(outs[i] for i in diff_out)

    _, pullback = jax.vjp(f, *[primals[i] for i in diff_in])
    return list(pullback(tuple(cts)))

  vjp_fun.__name__ = f"{lo.fun_name}_vjp"
  ct_tys = [out_tys[i].to_tangent_aval() if _is_hi(out_tys[i]) else out_tys[i]
            for i in diff_out]
  return export(vjp_fun, platforms=platforms or lo.platforms,
                disabled_checks=disabled_checks)(*in_tys, *ct_tys)


# --- deserialize ----------------------------------------------------------------------

def deserialize(blob: bytes | bytearray) -> Exported:
  """Restores an :class:`Exported` from :meth:`Exported.serialize` bytes, hi signature included.

  Raises :class:`ArtifactError` naming the problem for bytes that are not a
  ``jax.export`` artifact (other files, truncated), whose bytes do not match the
  SHA-256 digest they were sealed with (any corrupted byte), that carry no hxmlir signature, that come from a newer
  hxmlir (artifact format, type descriptor schema, or an ``hx.*`` composite
  version this hxmlir does not accept), or whose signature disagrees with the
  module's argument and result types, and for artifacts exported with
  ``hx.keep_native_cpu_calls()`` that this process cannot run (the native CPU
  kernel they name is not active here, or is of another version).
  """
  if not isinstance(blob, (bytes, bytearray, memoryview)):
    raise ArtifactError(f"expected the bytes of a serialized artifact, got {type(blob).__name__}")
  _need_flatbuffers()
  blob = bytes(blob)
  if len(blob) < _MIN_SIZE:
    raise ArtifactError(f"not an hxmlir artifact: {len(blob)} bytes is too short for a "
                        "jax.export flatbuffer (a truncated artifact, or some other file)")
  # checked before anything parses the bytes: neither JAX's flatbuffer reader nor MLIR's
  # bytecode reader is safe on corrupted input
  sealed_v2 = _check_sealed(blob)
  root = int.from_bytes(blob[:4], "little")
  if not sealed_v2 and (not 4 <= root <= len(blob) - 4 or root % 4):
    raise ArtifactError(f"not an hxmlir artifact: its first bytes {blob[:8]!r} are not a "
                        "jax.export flatbuffer header (a truncated artifact, or some other file)")
  try:
    lo = jax_export.deserialize(bytearray(blob))
    digests = _digests(lo)
  except Exception as e:  # the flatbuffer reader: any failure is a bad artifact
    raise ArtifactError(f"not a readable jax.export artifact (truncated or corrupted): "
                        f"{type(e).__name__}: {_first_line(e)}") from None
  if not digests:
    raise ArtifactError(f"artifact of {lo.fun_name!r} was not written by hxmlir.export (it "
                        "carries no hxmlir digest; or it is corrupted); read it with "
                        "jax.export.deserialize")
  lo = dataclasses.replace(lo, disabled_safety_checks=tuple(_plain_checks(lo)))
  if sealed_v2:
    if len(digests) != 1 or not digests[0].startswith(DIGEST_PREFIX):
      raise ArtifactError(f"artifact of {lo.fun_name!r} is corrupted: it carries "
                          f"{len(digests)} hxmlir digests")
  elif (len(digests) != 1 or not digests[0].startswith(DIGEST_PREFIX_V1)
        or _digest_v1(lo, len(blob)) != digests[0][len(DIGEST_PREFIX_V1):]):
    raise ArtifactError(f"artifact of {lo.fun_name!r} is truncated or corrupted: its size, "
                        "module or calling convention does not match the digest it was "
                        "sealed with")
  try:
    with _jax.make_ir_context():
      module = lo.mlir_module(serialized=False)
      attrs = module.operation.attributes
      if SIGNATURE_ATTR not in attrs:
        raise ArtifactError(
            f"artifact of {lo.fun_name!r} has no hxmlir signature ({SIGNATURE_ATTR} module "
            "attribute); read it with jax.export.deserialize")
      sig_text = ir.StringAttr(attrs[SIGNATURE_ATTR]).value
      vjp_b64 = ir.StringAttr(attrs[VJP_ATTR]).value if VJP_ATTR in attrs else None
      composites = _composite_versions(module)
      native = matmul_q_cpu.native_call_problem(_custom_call_targets(module))
  except ArtifactError:
    raise
  except Exception as e:
    raise ArtifactError(f"artifact of {lo.fun_name!r}: its StableHLO module cannot be read: "
                        f"{type(e).__name__}: {_first_line(e)}") from None
  if native is not None:
    raise ArtifactError(f"artifact of {lo.fun_name!r} cannot run here: {native}")
  return _from_parts(lo, sig_text, vjp_b64, composites, 2 if sealed_v2 else 1)


def _first_line(e: Exception) -> str:
  s = str(e).strip()
  return s.splitlines()[0][:300] if s else "(no message)"


def _custom_call_targets(module: ir.Module) -> set[str]:
  found = set()

  def visit(op):
    if op.name == "stablehlo.custom_call":
      found.add(ir.StringAttr(op.attributes["call_target_name"]).value)
    return ir.WalkResult.ADVANCE
  module.operation.walk(visit)
  return found


def _composite_versions(module: ir.Module) -> list[tuple[str, int, str]]:
  found = []

  def visit(op):
    if op.name == "stablehlo.composite":
      name = ir.StringAttr(op.attributes["name"]).value
      version = ir.IntegerAttr(op.attributes["version"]).value \
          if "version" in op.attributes else 0
      found.append((name, version, str(op.location)))
    return ir.WalkResult.ADVANCE
  module.operation.walk(visit)
  return found


def _from_parts(lo, sig_text: str, vjp_b64: str | None, composites, sealed_as: int
                ) -> Exported:
  name = lo.fun_name
  try:
    sig = json.loads(sig_text)
    if not isinstance(sig, dict):
      raise ValueError("not an object")
  except ValueError as e:
    raise ArtifactError(f"artifact of {name!r}: {SIGNATURE_ATTR} is not valid JSON: {e}") from None
  fmt, made_by = sig.get("format"), sig.get("hxmlir", "?")
  if not isinstance(fmt, int):
    raise ArtifactError(f"artifact of {name!r}: {SIGNATURE_ATTR} has no integer 'format'")
  if fmt > ARTIFACT_FORMAT:
    raise ArtifactError(f"artifact of {name!r} was written by hxmlir {made_by} in artifact "
                        f"format {fmt}; this hxmlir {_hxmlir_version()} reads formats <= "
                        f"{ARTIFACT_FORMAT}: upgrade hxmlir")
  if (fmt >= 2) != (sealed_as >= 2):
    raise ArtifactError(f"artifact of {name!r}: artifact format {fmt} but sealed with the "
                        f"format-{sealed_as} digest; corrupted or tampered with")
  from hxmlir.lowering import schema
  for op, version, loc in composites:
    if not op.startswith(schema.PREFIX):
      continue
    s = schema.lookup(op)
    if s is None or version not in s.versions:
      known = "unknown op" if s is None else f"accepted versions {list(s.versions)}"
      raise ArtifactError(f"artifact of {name!r} (hxmlir {made_by}) uses composite {op} "
                          f"version {version} at {loc}, which this hxmlir "
                          f"{_hxmlir_version()} does not accept ({known}): upgrade hxmlir")
  try:
    in_tys = [typedesc.from_json(d, f"argument {i}") for i, d in enumerate(sig["in"])]
    out_tys = [typedesc.from_json(d, f"result {i}") for i, d in enumerate(sig["out"])]
    in_tree, out_tree = sig["in_tree"], sig["out_tree"]
    if _count_leaves(in_tree) != len(in_tys) or _count_leaves(out_tree) != len(out_tys):
      raise ArtifactError(f"artifact of {name!r}: {SIGNATURE_ATTR} trees do not match its "
                          "type lists")
  except typedesc.DescriptorError as e:
    raise ArtifactError(f"artifact of {name!r} (hxmlir {made_by}): {e}") from None
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise ArtifactError(f"artifact of {name!r}: malformed {SIGNATURE_ATTR}: "
                        f"{type(e).__name__}: {e}") from None
  _check_matches(lo, in_tys, out_tys)
  vjp = None
  if vjp_b64 is not None:
    try:
      vjp_blob = base64.b64decode(vjp_b64.encode(), validate=True)
    except ValueError as e:
      raise ArtifactError(f"artifact of {name!r}: {VJP_ATTR} is not base64: {e}") from None
    inner = deserialize(vjp_blob)
    vjp = lambda: inner  # noqa: E731
  return Exported(lo, in_tree=in_tree, in_types=in_tys, out_tree=out_tree, out_types=out_tys,
                  hxmlir_version=str(made_by), vjp=vjp)


def _check_matches(lo, in_tys, out_tys) -> None:
  def los(tys):
    return [(tuple(int(n) for n in a.shape), np.dtype(a.dtype).name)
            for t in tys for a in _lo_tys(t)]

  def module_side(avals):
    return [(tuple(int(n) for n in a.shape), np.dtype(a.dtype).name) for a in avals]

  for what, tys, avals in (("arguments", in_tys, lo.in_avals), ("results", out_tys, lo.out_avals)):
    want, have = los(tys), module_side(avals)
    if want != have:
      sig = ", ".join(map(_short, tys))
      mod = ", ".join(f"{d}[{','.join(map(str, s))}]" for s, d in have)
      raise ArtifactError(f"artifact of {lo.fun_name!r}: hi signature {what} ({sig}) do not "
                          f"match the module's {what} ({mod})")
  if str(lo.in_tree) != str(jax.tree.structure(((0,) * len(lo.in_avals), {}))):
    raise ArtifactError(f"artifact of {lo.fun_name!r}: module arguments are not the flat "
                        "lo components hxmlir.export writes")
