"""``hxmlir.export.deserialize``: read an artifact back, refusing what cannot be trusted."""

from __future__ import annotations

import base64
import dataclasses
import json

import jax
import numpy as np
from jax import export as jax_export
from jaxlib.mlir import ir

from hxmlir import __version__ as HXMLIR_VERSION
from hxmlir import _jax
from hxmlir.export._artifact import (
  ARTIFACT_FORMAT,
  DIGEST_PREFIX,
  DIGEST_PREFIX_V1,
  MIN_SIZE,
  SIGNATURE_ATTR,
  VJP_ATTR,
  ArtifactError,
  check_sealed,
  digest_v1,
  need_flatbuffers,
  plain_checks,
)
from hxmlir.export._artifact import (
  digests as digest_entries,
)
from hxmlir.export._exported import Exported
from hxmlir.export._tree import count_leaves
from hxmlir.lowering import schema
from hxmlir.lowering.attention import cpu as attention_cpu
from hxmlir.lowering.matmul_q import cpu as matmul_q_cpu
from hxmlir.types import shardings as shd
from hxmlir.types import typedesc
from hxmlir.types.hiprim import lo_types


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
  lo, sealed_as = _read_sealed(blob)
  sig_text, vjp_b64, composites, custom_calls = _read_module(lo)
  native = matmul_q_cpu.native_call_problem(custom_calls) or \
      attention_cpu.native_call_problem(custom_calls)
  if native is not None:
    raise ArtifactError(f"artifact of {lo.fun_name!r} cannot run here: {native}")
  return _from_parts(lo, sig_text, vjp_b64, composites, sealed_as)


def _read_sealed(blob) -> tuple[jax_export.Exported, int]:
  """The ``jax.export.Exported`` in ``blob`` (hxmlir's digest entry removed) and the artifact
  format whose digest sealed it (2: every byte; 1: the fields), checked before use."""
  if not isinstance(blob, (bytes, bytearray, memoryview)):
    raise ArtifactError(f"expected the bytes of a serialized artifact, got {type(blob).__name__}")
  need_flatbuffers()
  blob = bytes(blob)
  if len(blob) < MIN_SIZE:
    raise ArtifactError(f"not an hxmlir artifact: {len(blob)} bytes is too short for a "
                        "jax.export flatbuffer (a truncated artifact, or some other file)")
  # checked before anything parses the bytes: neither JAX's flatbuffer reader nor MLIR's
  # bytecode reader is safe on corrupted input
  sealed_v2 = check_sealed(blob)
  root = int.from_bytes(blob[:4], "little")
  if not sealed_v2 and (not 4 <= root <= len(blob) - 4 or root % 4):
    raise ArtifactError(f"not an hxmlir artifact: its first bytes {blob[:8]!r} are not a "
                        "jax.export flatbuffer header (a truncated artifact, or some other file)")
  try:
    lo = jax_export.deserialize(bytearray(blob))
    digests = digest_entries(lo)
  except Exception as e:  # the flatbuffer reader: any failure is a bad artifact
    raise ArtifactError(f"not a readable jax.export artifact (truncated or corrupted): "
                        f"{type(e).__name__}: {_first_line(e)}") from None
  if not digests:
    raise ArtifactError(f"artifact of {lo.fun_name!r} was not written by hxmlir.export (it "
                        "carries no hxmlir digest; or it is corrupted); read it with "
                        "jax.export.deserialize")
  lo = dataclasses.replace(lo, disabled_safety_checks=tuple(plain_checks(lo)))
  if sealed_v2:
    if len(digests) != 1 or not digests[0].startswith(DIGEST_PREFIX):
      raise ArtifactError(f"artifact of {lo.fun_name!r} is corrupted: it carries "
                          f"{len(digests)} hxmlir digests")
  elif (len(digests) != 1 or not digests[0].startswith(DIGEST_PREFIX_V1)
        or digest_v1(lo, len(blob)) != digests[0][len(DIGEST_PREFIX_V1):]):
    raise ArtifactError(f"artifact of {lo.fun_name!r} is truncated or corrupted: its size, "
                        "module or calling convention does not match the digest it was "
                        "sealed with")
  return lo, 2 if sealed_v2 else 1


def _read_module(lo) -> tuple[str, str | None, list[tuple[str, int, str]], set[str]]:
  """``(hx.signature text, hx.vjp text or None, composites (name, version, location),
  custom-call targets)`` read from ``lo``'s StableHLO module."""
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
      composites, custom_calls = _composites_and_custom_calls(module)
  except ArtifactError:
    raise
  except Exception as e:
    raise ArtifactError(f"artifact of {lo.fun_name!r}: its StableHLO module cannot be read: "
                        f"{type(e).__name__}: {_first_line(e)}") from None
  return sig_text, vjp_b64, composites, custom_calls


def _first_line(e: Exception) -> str:
  s = str(e).strip()
  return s.splitlines()[0][:300] if s else "(no message)"


def _composites_and_custom_calls(module: ir.Module
                                 ) -> tuple[list[tuple[str, int, str]], set[str]]:
  """Every ``stablehlo.composite`` as ``(name, version, location)`` and the set of
  ``stablehlo.custom_call`` targets in ``module``, in one walk."""
  found, targets = [], set()

  def visit(op):
    if op.name == "stablehlo.custom_call":
      targets.add(ir.StringAttr(op.attributes["call_target_name"]).value)
    elif op.name == "stablehlo.composite":
      name = ir.StringAttr(op.attributes["name"]).value
      version = ir.IntegerAttr(op.attributes["version"]).value \
          if "version" in op.attributes else 0
      found.append((name, version, str(op.location)))
    return ir.WalkResult.ADVANCE
  module.operation.walk(visit)
  return found, targets


def _from_parts(lo, sig_text: str, vjp_b64: str | None, composites, sealed_as: int
                ) -> Exported:
  """The :class:`Exported` of ``lo`` and what its module carries, each part checked."""
  name = lo.fun_name
  sig, made_by = _signature(name, sig_text, sealed_as)
  _check_composites(name, made_by, composites)
  in_tree, in_tys, out_tree, out_tys = _signature_types(name, made_by, sig)
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


def _signature(name: str, sig_text: str, sealed_as: int) -> tuple[dict, str]:
  """The ``hx.signature`` record and the hxmlir version that wrote it; its artifact format
  must be one this hxmlir reads, and the one whose digest sealed the artifact."""
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
                        f"format {fmt}; this hxmlir {HXMLIR_VERSION} reads formats <= "
                        f"{ARTIFACT_FORMAT}: upgrade hxmlir")
  if (fmt >= 2) != (sealed_as >= 2):
    raise ArtifactError(f"artifact of {name!r}: artifact format {fmt} but sealed with the "
                        f"format-{sealed_as} digest; corrupted or tampered with")
  return sig, made_by


def _check_composites(name: str, made_by: str, composites) -> None:
  """Every ``hx.*`` composite in the module has a name and version the schema accepts."""
  for op, version, loc in composites:
    if not op.startswith(schema.PREFIX):
      continue
    s = schema.lookup(op)
    if s is None or version not in s.versions:
      known = "unknown op" if s is None else f"accepted versions {list(s.versions)}"
      raise ArtifactError(f"artifact of {name!r} (hxmlir {made_by}) uses composite {op} "
                          f"version {version} at {loc}, which this hxmlir "
                          f"{HXMLIR_VERSION} does not accept ({known}): upgrade hxmlir")


def _signature_types(name: str, made_by: str, sig: dict) -> tuple:
  """``(in_tree, in_types, out_tree, out_types)`` decoded from the signature record."""
  try:
    in_tys = [typedesc.from_json(d, f"argument {i}") for i, d in enumerate(sig["in"])]
    out_tys = [typedesc.from_json(d, f"result {i}") for i, d in enumerate(sig["out"])]
    in_tree, out_tree = sig["in_tree"], sig["out_tree"]
    if count_leaves(in_tree) != len(in_tys) or count_leaves(out_tree) != len(out_tys):
      raise ArtifactError(f"artifact of {name!r}: {SIGNATURE_ATTR} trees do not match its "
                          "type lists")
  except typedesc.DescriptorError as e:
    raise ArtifactError(f"artifact of {name!r} (hxmlir {made_by}): {e}") from None
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise ArtifactError(f"artifact of {name!r}: malformed {SIGNATURE_ATTR}: "
                        f"{type(e).__name__}: {e}") from None
  return in_tree, in_tys, out_tree, out_tys


def _check_matches(lo, in_tys, out_tys) -> None:
  def los(tys):
    return [(tuple(int(n) for n in a.shape), np.dtype(a.dtype).name)
            for t in tys for a in lo_types(t)]

  def module_side(avals):
    return [(tuple(int(n) for n in a.shape), np.dtype(a.dtype).name) for a in avals]

  for what, tys, avals in (("arguments", in_tys, lo.in_avals), ("results", out_tys, lo.out_avals)):
    want, have = los(tys), module_side(avals)
    if want != have:
      sig = ", ".join(map(shd.short, tys))
      mod = ", ".join(f"{d}[{','.join(map(str, s))}]" for s, d in have)
      raise ArtifactError(f"artifact of {lo.fun_name!r}: hi signature {what} ({sig}) do not "
                          f"match the module's {what} ({mod})")
  if str(lo.in_tree) != str(jax.tree.structure(((0,) * len(lo.in_avals), {}))):
    raise ArtifactError(f"artifact of {lo.fun_name!r}: module arguments are not the flat "
                        "lo components hxmlir.export writes")
