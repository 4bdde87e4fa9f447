"""The artifact's bytes: hxmlir's additions to a ``jax.export`` serialization and its seal.

Format 2 seals the artifact with a SHA-256 over every byte (``DIGEST_PREFIX``),
checked on the raw bytes before anything parses them; format 1 (read only) with a
digest of canonical forms of the ``Exported`` fields (``DIGEST_PREFIX_V1``). See
:mod:`hxmlir.export` for the layout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import jax
import numpy as np
from jax import export as jax_export
from jaxlib.mlir import ir

from hxmlir import _jax

ARTIFACT_FORMAT = 2
"""Version of the artifact layout (the ``hx.*`` module attributes and the digest); readers
accept <= this. 1: digest of the ``Exported`` fields (``DIGEST_PREFIX_V1``); 2: digest of
every byte (``DIGEST_PREFIX``)."""
SIGNATURE_ATTR = "hx.signature"
DIGEST_PREFIX = "hxmlir.bytes.sha256:"
DIGEST_PREFIX_V1 = "hxmlir.digest.sha256:"
_DIGEST_HEX = 64
MIN_SIZE = 16  # a flatbuffer's root offset and the smallest tables; artifacts are KBs
VJP_ATTR = "hx.vjp"


class ArtifactError(ValueError):
  """Serialized bytes that ``hxmlir.export.deserialize`` cannot trust or read.

  The message names the problem: truncated or corrupted bytes, no hxmlir
  signature, an artifact or type schema or ``hx.*`` composite version newer
  than this hxmlir, or a signature that does not match the module.
  """


def need_flatbuffers() -> None:
  """``jax.export`` serializes with the ``flatbuffers`` package, which JAX does not install."""
  try:
    import flatbuffers  # noqa: F401
  except ImportError:
    raise ImportError("hxmlir.export (de)serialization needs the 'flatbuffers' package, an "
                      "hxmlir dependency that JAX does not install: pip install flatbuffers"
                      ) from None


def digest_v1(lo: jax_export.Exported, size: int) -> str:
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
      [sharding(s) for s in _jax.in_named_shardings(lo)],
      [sharding(s) for s in _jax.out_named_shardings(lo)],
      [str(c) for c in plain_checks(lo)]])
  return hashlib.sha256(bytes(lo.mlir_module_serialized) + b"\0" + fields.encode()).hexdigest()


def _is_digest(c) -> bool:
  t = c.is_custom_call() or ""
  return t.startswith(DIGEST_PREFIX) or t.startswith(DIGEST_PREFIX_V1)


def plain_checks(lo) -> list:
  """The ``disabled_safety_checks`` of the ``jax.export.Exported`` ``lo`` that are JAX's
  own (the user's), without the digest entries hxmlir seals artifacts with."""
  return [c for c in lo.disabled_safety_checks if not _is_digest(c)]


def digests(lo) -> list[str]:
  """The digest entries of ``lo.disabled_safety_checks``: strings ``DIGEST_PREFIX`` (format
  2) or ``DIGEST_PREFIX_V1`` (format 1) followed by 64 hex digits of SHA-256; empty
  for an artifact hxmlir did not seal."""
  return [c.is_custom_call() for c in lo.disabled_safety_checks if _is_digest(c)]


def _bytes_digest(blob: bytes, at: int) -> bytes:
  """SHA-256 hex of ``blob`` with the ``_DIGEST_HEX`` bytes at ``at`` read as ``0``."""
  h = hashlib.sha256(blob[:at])
  h.update(b"0" * _DIGEST_HEX)
  h.update(blob[at + _DIGEST_HEX:])
  return h.hexdigest().encode()


def seal(lo: jax_export.Exported, attrs: dict[str, str]) -> bytearray:
  """Serializes ``lo`` with string ``attrs`` on its module and hxmlir's digest entry."""
  with _jax.make_ir_context():
    module = lo.mlir_module(serialized=False)
    for k in (SIGNATURE_ATTR, VJP_ATTR):
      if k in module.operation.attributes:
        del module.operation.attributes[k]
    for k, v in attrs.items():
      module.operation.attributes[k] = ir.StringAttr.get(v)
    lo = dataclasses.replace(lo, mlir_module_serialized=_jax.module_to_portable_bytecode(module),
                             disabled_safety_checks=tuple(plain_checks(lo)))
  seal = jax_export.DisabledSafetyCheck.custom_call(DIGEST_PREFIX + "0" * _DIGEST_HEX)
  out = dataclasses.replace(
      lo, disabled_safety_checks=(*lo.disabled_safety_checks, seal)).serialize()
  # the placeholder is written as-is (a flatbuffer string); its hex goes in its place
  marker = DIGEST_PREFIX.encode()
  assert bytes(out).count(marker) == 1, "hxmlir digest prefix occurs more than once"
  at = bytes(out).index(marker) + len(marker)
  out[at:at + _DIGEST_HEX] = _bytes_digest(bytes(out), at)
  return out


def check_sealed(blob: bytes) -> bool:
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
