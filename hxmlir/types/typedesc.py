"""Stable text descriptors of JAX types, hi types included.

A descriptor is a one-line JSON object naming the type, the version of its
descriptor schema, and its data::

  {"type":"q8","v":1,"shape":[3,4],"sharding":{"mesh":[],"spec":[null,null]}}
  {"type":"q4","v":1,"group":32,"shape":[4,64],"sharding":{...}}
  {"type":"array","v":1,"dtype":"float32","shape":[2,3],"sharding":{...}}
  {"type":"tup","v":1,"elts":[<descriptor>, ...]}

Quantized types (:mod:`hxmlir.formats`) are named by their printed prefix: ``q8``
(int8), ``q4`` (int4), ``f8`` (float8 e4m3fn), with an optional ``group`` (elements
per scale; absent: one scale per row). ``q8`` per row is still written as schema
version 1; a grouped ``q8`` is version 2 (a reader of version 1 refuses it). The formats
with offsets, ``u4o`` (uint4 with an offset) and ``q8o`` (int8 with an offset), and
``"scale": "f16"`` for f16 scales (and offsets), which makes ``q8`` version 3 and ``q4``
version 2 (``{"type":"q4","v":2,"group":32,"scale":"f16",...}``: GGUF's Q4_0). The block
formats (GGUF's blocks at the file's bytes: ``q5_0`` ... ``iq4_xs``) are version 1 of their
names, always with their block as ``group`` and ``"scale": "f16"``
(``{"type":"q4_k","v":1,"group":256,"scale":"f16",...}``).

``sharding`` holds the mesh axes as ``[[name, size], ...]``, their
``axis_types`` (``"Explicit"``, ``"Auto"``, ``"Manual"``), the partition spec
entry per dimension (``null``, ``"i"`` or ``["i", "j"]``) exactly as the
``PartitionSpec`` holds them, and the memory kind when one is set.
Descriptors are what ``hxmlir.export`` embeds in artifacts, so the format is a
compatibility promise: a reader accepts every schema version up to
:data:`SCHEMA_VERSIONS` and refuses newer ones and unknown type names with
:class:`DescriptorError`.

Descriptors are portable: the abstract device of a mesh (``device_kind``,
``platform``) is not recorded, so :func:`parse` gives the type on a
device-free ``AbstractMesh``. :func:`canonical` drops the same information from
a type, and ``parse(describe(t)) == canonical(t)`` for every supported type.
"""

from __future__ import annotations

import json
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.experimental.hijax import HiType, ShapedArray
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

from hxmlir.formats import BLOCK_FORMATS, FORMATS
from hxmlir.types.qarray import QArrayTy
from hxmlir.types.rank1 import Rank1Ty
from hxmlir.types.tuples import TupTy

SCHEMA_VERSIONS: dict[str, int] = {"array": 1, "q8": 3, "q4": 2, "f8": 1, "u4o": 1, "q8o": 1,
                                   **{f.prefix: 1 for f in BLOCK_FORMATS}, "r1": 1, "tup": 1}
"""The newest descriptor schema version this hxmlir reads, per type name."""

# (descriptor name, scale dtype) -> format
_QUANTIZED = {(f.prefix, f.scale_mlir): f.name for f in FORMATS.values()}
# the scale dtype a descriptor without "scale" means: f32, or a block format's only scale (f16)
_DEFAULT_SCALE = {n: "f32" if (n, "f32") in _QUANTIZED else s for n, s in _QUANTIZED}
_F16_VERSIONS = {"q8": 3, "q4": 2}  # the first schema version with "scale": "f16"


class DescriptorError(ValueError):
  """A type descriptor that cannot be read: malformed, unknown type, or too new."""


# --- shardings ---------------------------------------------------------------

def _spec_entry(e) -> Any:
  if e is None or isinstance(e, str):
    return e
  if isinstance(e, tuple) and all(isinstance(a, str) for a in e):
    return list(e)
  raise DescriptorError(f"cannot describe partition spec entry {e!r}")


def _describe_sharding(s) -> dict:
  if not isinstance(s, NamedSharding):
    raise DescriptorError(f"only NamedSharding can be described, got {s!r}")
  spec = s.spec
  if getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
    raise DescriptorError(f"unreduced/reduced axes are not supported in descriptors: {spec}")
  mesh = s.mesh.abstract_mesh if hasattr(s.mesh, "abstract_mesh") else s.mesh
  out = {"mesh": [[n, int(z)] for n, z in zip(mesh.axis_names, mesh.axis_sizes)],
         "axis_types": [t.name for t in mesh.axis_types],
         "spec": [_spec_entry(e) for e in spec]}
  if s.memory_kind is not None:
    out["memory_kind"] = s.memory_kind
  return out


def _parse_sharding(d, where: str) -> NamedSharding:
  if not isinstance(d, dict) or not isinstance(d.get("mesh"), list) or \
     not isinstance(d.get("spec"), list):
    raise DescriptorError(f"{where}: sharding must have 'mesh' and 'spec' lists, got {d!r}")
  try:
    names = tuple(str(n) for n, _ in d["mesh"])
    sizes = tuple(int(z) for _, z in d["mesh"])
    types = tuple(AxisType[t] for t in d.get("axis_types", ["Explicit"] * len(names)))
  except (TypeError, ValueError, KeyError) as e:
    raise DescriptorError(f"{where}: bad mesh {d['mesh']!r} / axis_types "
                          f"{d.get('axis_types')!r}: {e}") from None
  if len(types) != len(names):
    raise DescriptorError(f"{where}: {len(names)} mesh axes but {len(types)} axis types")
  entries: list[str | tuple[str, ...] | None] = []
  for entry in d["spec"]:
    if entry is None or isinstance(entry, str):
      entries.append(entry)
    elif isinstance(entry, list) and all(isinstance(a, str) for a in entry):
      entries.append(tuple(entry))
    else:
      raise DescriptorError(f"{where}: bad partition spec entry {entry!r}")
  for entry in entries:
    for a in (entry,) if isinstance(entry, str) else (entry or ()):
      if a not in names:
        raise DescriptorError(f"{where}: spec axis {a!r} is not a mesh axis {list(names)}")
  mesh = AbstractMesh(sizes, names, axis_types=types)
  return NamedSharding(mesh, PartitionSpec(*entries), memory_kind=d.get("memory_kind"))


def _canonical_sharding(s: NamedSharding) -> NamedSharding:
  return _parse_sharding(_describe_sharding(s), "sharding")


# --- types -------------------------------------------------------------------

def _shape(d, where: str) -> tuple[int, ...]:
  shape = d.get("shape")
  if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
    raise DescriptorError(f"{where}: 'shape' must be a list of non-negative ints, got {shape!r}")
  return tuple(shape)


def to_json(ty) -> dict:
  """The descriptor of ``ty`` as a JSON-compatible dict (see the module docstring).

  Supports ``ShapedArray`` (static shapes), ``q8``, ``r1`` and ``Tup`` types.
  Raises :class:`DescriptorError` for any other type (or a symbolic shape).
  """
  if isinstance(ty, QArrayTy):
    f = ty.format
    out = {"type": f.prefix, "v": 1, "shape": list(ty.shape),
           "sharding": _describe_sharding(ty.sharding)}
    if ty.group is not None:
      out["group"] = int(ty.group)
      out["v"] = 2 if f.prefix == "q8" else 1  # q8: version 2 has groups
    if f.scale_mlir != "f32":
      out["scale"] = f.scale_mlir
      out["v"] = _F16_VERSIONS.get(f.prefix, 1)
    return out
  if isinstance(ty, Rank1Ty):
    return {"type": "r1", "v": SCHEMA_VERSIONS["r1"], "shape": list(ty.shape),
            "sharding": _describe_sharding(ty.sharding)}
  if isinstance(ty, TupTy):
    return {"type": "tup", "v": SCHEMA_VERSIONS["tup"], "elts": [to_json(t) for t in ty.tys]}
  if isinstance(ty, HiType):
    raise DescriptorError(f"no descriptor for hi type {ty} ({type(ty).__name__})")
  if isinstance(ty, ShapedArray):
    if not all(isinstance(n, (int, np.integer)) for n in ty.shape):
      raise DescriptorError(f"cannot describe a symbolic shape: {ty.str_short()}")
    out = {"type": "array", "v": SCHEMA_VERSIONS["array"], "dtype": np.dtype(ty.dtype).name,
           "shape": [int(n) for n in ty.shape], "sharding": _describe_sharding(ty.sharding)}
    if ty.weak_type:
      out["weak_type"] = True
    return out
  raise DescriptorError(f"no descriptor for {ty!r} ({type(ty).__name__})")


def describe(ty) -> str:
  """The descriptor of ``ty`` as one line of text (compact JSON, sorted keys).

  Raises :class:`DescriptorError` for a type without a descriptor.
  """
  return json.dumps(to_json(ty), sort_keys=True, separators=(",", ":"))


def from_json(d, where: str = "descriptor"):
  """The type described by the dict ``d`` (inverse of :func:`to_json`).

  Raises :class:`DescriptorError` naming the problem (and ``where``) for an
  unknown type name, a schema version newer than :data:`SCHEMA_VERSIONS`, or
  malformed fields.
  """
  if not isinstance(d, dict) or not isinstance(d.get("type"), str):
    raise DescriptorError(f"{where}: expected an object with a 'type' name, got {d!r}")
  name, v = d["type"], d.get("v")
  if name not in SCHEMA_VERSIONS:
    raise DescriptorError(f"{where}: unknown type name {name!r}; this hxmlir knows "
                          f"{', '.join(sorted(SCHEMA_VERSIONS))}")
  if not isinstance(v, int) or v < 1:
    raise DescriptorError(f"{where}: type {name!r} needs an integer schema version 'v' >= 1, "
                          f"got {v!r}")
  if v > SCHEMA_VERSIONS[name]:
    raise DescriptorError(f"{where}: type {name!r} has schema version {v}, newer than the "
                          f"{SCHEMA_VERSIONS[name]} this hxmlir reads; upgrade hxmlir")
  where = f"{where} ({name})"
  try:
    if name == "tup":
      elts = d.get("elts")
      if not isinstance(elts, list):
        raise DescriptorError(f"{where}: 'elts' must be a list, got {elts!r}")
      return TupTy(tuple(from_json(e, f"{where} element {i}") for i, e in enumerate(elts)))
    shape = _shape(d, where)
    sharding = _parse_sharding(d.get("sharding"), where)
    if name in _DEFAULT_SCALE:
      group = d.get("group")
      if group is not None and (not isinstance(group, int) or isinstance(group, bool)):
        raise DescriptorError(f"{where}: 'group' must be an int, got {group!r}")
      scale = d.get("scale", _DEFAULT_SCALE[name])
      if (name, scale) not in _QUANTIZED:
        raise DescriptorError(f"{where}: 'scale' must be "
                              f"{' or '.join(repr(s) for n, s in _QUANTIZED if n == name)}, "
                              f"got {scale!r}")
      fmt = _QUANTIZED[(name, scale)]
      if group is None and FORMATS[fmt].block:  # a block format's one group: its block
        group = FORMATS[fmt].block
      return QArrayTy(shape, sharding, fmt=fmt, group=group)
    if name == "r1":
      return Rank1Ty(shape, sharding)
    try:
      dtype = jnp.dtype(d.get("dtype"))
    except TypeError:
      raise DescriptorError(f"{where}: unknown dtype {d.get('dtype')!r}") from None
    return ShapedArray(shape, dtype, weak_type=bool(d.get("weak_type", False)),
                       sharding=sharding)
  except DescriptorError:
    raise
  except (TypeError, ValueError) as e:  # the types' own invariants
    raise DescriptorError(f"{where}: {e}") from None


def parse(text: str, where: str = "descriptor"):
  """The type described by ``text`` (inverse of :func:`describe`).

  Raises :class:`DescriptorError` on text that is not a descriptor, an unknown
  type name or a newer schema version.
  """
  try:
    d = json.loads(text)
  except (TypeError, ValueError) as e:
    raise DescriptorError(f"{where}: not a JSON type descriptor: {e}") from None
  return from_json(d, where)


def canonical(ty):
  """``ty`` with its meshes made device-free, as :func:`parse` returns it."""
  return from_json(to_json(ty))
