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

Layout: ``_tree`` (argument trees as JSON), ``_hilo`` (the hi primitives that take
hi values apart, build them and call an artifact), ``_exported`` (:class:`Exported`),
``_artifact`` (the bytes: hxmlir's attributes, the two digest formats, sealing),
``_export`` (:func:`export`) and ``_deserialize`` (:func:`deserialize`).

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
  from :mod:`hxmlir.types.typedesc`) and, with ``serialize(vjp_order=1)``, ``hx.vjp``
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

from hxmlir.export import _hilo as _hilo  # noqa: F401  (registers the primitives' rules)
from hxmlir.export._artifact import (
    ARTIFACT_FORMAT as ARTIFACT_FORMAT,
)
from hxmlir.export._artifact import (
    DIGEST_PREFIX as DIGEST_PREFIX,
)
from hxmlir.export._artifact import (
    DIGEST_PREFIX_V1 as DIGEST_PREFIX_V1,
)
from hxmlir.export._artifact import (
    SIGNATURE_ATTR as SIGNATURE_ATTR,
)
from hxmlir.export._artifact import (
    VJP_ATTR as VJP_ATTR,
)
from hxmlir.export._artifact import (
    ArtifactError as ArtifactError,
)
from hxmlir.export._deserialize import deserialize as deserialize
from hxmlir.export._export import export as export
from hxmlir.export._exported import Exported as Exported
