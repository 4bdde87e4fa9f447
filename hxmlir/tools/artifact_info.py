"""What is inside an artifact (``hxmlir inspect``): signature, platforms, ops, kernels, versions.

:func:`artifact_info` reads serialized bytes with
:func:`hxmlir.export.deserialize` (so a corrupt file is the same
``ArtifactError``) and reports, as a JSON-compatible dict:

- ``fun_name``, ``signature`` (``(f32[2,3], q8[3,4]) -> (f32[2,4])``) and
  ``inputs``/``outputs``: each flat argument and result with its type and the
  ``.npz`` keys ``hxmlir run`` reads and writes for it (:mod:`hxmlir.tools.npzio`);
- ``platforms``;
- ``devices``: how many devices the artifact runs on (``jax.export``'s
  ``nr_devices``), and ``mesh``: the mesh its values' shardings live on
  (:func:`artifact_mesh`: ``{"axes": [[name, size], ...], "axis_types": [...]}``,
  ``None`` when no value is on a mesh); ``hxmlir run`` makes a mesh of that shape;
- ``hx_ops``: each ``hx.*`` composite name with its versions and count;
- ``custom_calls``: each custom-call target with its count and, for Pallas
  kernels, the kernel names (``matmul_q_v1``) and whether this hxmlir has the
  kernel registered (``registered``);
- ``versions``: the artifact format and the hxmlir version that wrote it
  (from the module's ``hx.signature`` attribute), the type descriptor schema
  versions used, and ``jax.export``'s calling convention version;
- ``size``: the artifact's bytes, and the serialized module's; ``has_vjp``.

Read through public surfaces only: ``Exported.lo`` (the ``jax.export.Exported``:
``calling_convention_version``, ``mlir_module_serialized``),
``Exported.mlir_module()``, ``in_tree``/``out_tree`` and
``hxmlir.export.SIGNATURE_ATTR``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hxmlir.tools import npzio
from hxmlir.types import typestr


def read_artifact_file(path, expected: str = "an artifact written by `hxmlir export` (or "
                       "hxmlir.export's serialize())") -> bytes:
  """The bytes of the file ``path`` (``hxmlir run``'s and ``inspect``'s artifact). Raises
  :class:`hxmlir.export.ArtifactError` naming the file, why it cannot be read (missing, a
  directory, no permission) and what to give instead (``expected``), as
  :func:`hxmlir.gguf.load` does for a GGUF path."""
  import os

  from hxmlir.export import ArtifactError
  try:
    with open(path, "rb") as f:
      return f.read()
  except OSError as e:
    why = "it is a directory" if isinstance(e, IsADirectoryError) else (e.strerror or str(e))
    raise ArtifactError(f"{os.fspath(path)}: not a readable file ({why}); give "
                        f"{expected}") from None


def artifact_info(blob: bytes) -> dict[str, Any]:
  """The report described in the module docstring, for serialized artifact bytes.

  Raises :class:`hxmlir.export.ArtifactError` for bytes ``deserialize`` refuses.
  """
  from hxmlir.export import SIGNATURE_ATTR, deserialize
  exp = deserialize(blob)
  ops, calls, sig = _module_contents(exp.mlir_module(), SIGNATURE_ATTR)

  def entries(paths, types):
    return [{"path": p, "type": typestr.type_str(t),
             "npz_keys": [p + s for s in npzio.component_keys(t)]}
            for p, t in zip(paths, types)]

  schemas = sorted({(d["type"], d["v"]) for d in _descriptors(sig.get("in", []) +
                                                               sig.get("out", []))})
  return {
      "fun_name": exp.fun_name,
      "signature": exp.signature(),
      "inputs": entries(npzio.leaf_paths(exp.in_tree), exp.in_types),
      "outputs": entries(npzio.leaf_paths(exp.out_tree, results=True), exp.out_types),
      "platforms": list(exp.platforms),
      "devices": exp.lo.nr_devices,
      "mesh": _mesh_json(artifact_mesh(exp)),
      "hx_ops": ops,
      "custom_calls": calls,
      "versions": {"artifact_format": sig.get("format"), "hxmlir": exp.hxmlir_version,
                   "type_schemas": {n: v for n, v in schemas},
                   "calling_convention": exp.lo.calling_convention_version},
      "size": {"artifact_bytes": len(blob),
               "module_bytes": len(exp.lo.mlir_module_serialized)},
      "has_vjp": exp.has_vjp(),
  }


def artifact_mesh(exp):
  """The device-free mesh (``jax.sharding.AbstractMesh``) the shardings of an artifact's
  arguments and results live on (``exp``: an :class:`hxmlir.export.Exported`); ``None``
  when none is on a mesh (a one-device artifact). Raises ``ValueError`` naming both when
  values live on meshes of different shapes (``hxmlir run`` makes one mesh)."""
  from hxmlir.types.hiprim import lo_types
  mesh = None
  for ty in (*exp.in_types, *exp.out_types):
    for lo in lo_types(ty):
      m = getattr(lo.sharding, "mesh", None)
      if m is None or m.empty:
        continue
      if mesh is None:
        mesh = m
      elif (m.axis_names, m.axis_sizes) != (mesh.axis_names, mesh.axis_sizes):
        raise ValueError(f"{exp.fun_name}: its values live on two meshes, "
                         f"{mesh_str(mesh)} and {mesh_str(m)}; `hxmlir run` makes one mesh")
  return mesh


def mesh_str(mesh) -> str:
  """``i=4,j=2``: a mesh's axes as ``hxmlir lower/export --mesh`` takes them (``i=4:auto``
  for an Auto axis, ``:manual`` for a Manual one)."""
  return _axes_str(mesh.axis_names, mesh.axis_sizes, [t.name for t in mesh.axis_types])


def _axes_str(names, sizes, types) -> str:
  return ",".join(f"{n}={z}" + ("" if t == "Explicit" else f":{t.lower()}")
                  for n, z, t in zip(names, sizes, types))


def _mesh_json(mesh) -> dict | None:
  if mesh is None:
    return None
  return {"axes": [[n, int(z)] for n, z in zip(mesh.axis_names, mesh.axis_sizes)],
          "axis_types": [t.name for t in mesh.axis_types]}


def _descriptors(ds: list) -> list[dict]:
  out = []
  for d in ds:
    out.append(d)
    out.extend(_descriptors(d.get("elts", [])))
  return out


def _module_contents(text: str, signature_attr: str) -> tuple[list, list, dict]:
  """``hx.*`` composites, custom calls and the ``hx.signature`` record of a module's text."""
  from jaxlib.mlir import ir

  from hxmlir import targets
  from hxmlir.passes.ops import composite_name, is_hx_composite, walk
  from hxmlir.passes.parsing import make_context
  with make_context():
    module = ir.Module.parse(text)
    attrs = module.operation.attributes
    sig = json.loads(ir.StringAttr(attrs[signature_attr]).value) \
        if signature_attr in attrs else {}
    ops: Counter = Counter()
    calls: dict[str, dict] = {}
    for op in walk(module.operation, frozenset({"stablehlo.composite",
                                                        "stablehlo.custom_call"})):
      if op.name == "stablehlo.composite":
        if is_hx_composite(op):
          version = ir.IntegerAttr(op.attributes["version"]).value \
              if "version" in op.attributes else 0
          ops[(composite_name(op), version)] += 1
        continue
      target = ir.StringAttr(op.attributes["call_target_name"]).value
      c = calls.setdefault(target, {"target": target, "count": 0, "kernels": {}})
      c["count"] += 1
      kernel = targets.kernel_name_of(op)
      if kernel is not None:
        c["kernels"][kernel] = {"name": kernel,
                                "registered": targets.lookup(target, kernel) is not None}
  hx_ops = [{"name": n, "version": v, "count": k} for (n, v), k in sorted(ops.items())]
  custom = [{**c, "kernels": sorted(c["kernels"].values(), key=lambda k: k["name"])}
            for _, c in sorted(calls.items())]
  return hx_ops, custom, sig


def _devices_line(info: dict[str, Any]) -> str:
  """``4 (mesh i=4; on one CPU: hxmlir run --host-devices)`` or ``1``."""
  n, m = info["devices"], info["mesh"]
  if n == 1:
    return "1"
  axes = _axes_str([a for a, _ in m["axes"]], [z for _, z in m["axes"]], m["axis_types"]) \
      if m else "no mesh recorded"
  return f"{n} (mesh {axes}; on one CPU machine: hxmlir run --host-devices)"


def format_info(info: dict[str, Any], path: str) -> str:
  """The report as the lines ``hxmlir inspect`` prints."""
  v = info["versions"]
  lines = [f"{path}: {info['fun_name']} {info['signature']}",
           f"  platforms: {', '.join(info['platforms'])}",
           "  devices: " + _devices_line(info)]
  for what in ("inputs", "outputs"):
    lines.append(f"  {what}:")
    lines += [f"    {e['path']}: {e['type']}  (npz: {', '.join(e['npz_keys'])})"
              for e in info[what]]
  lines.append("  hx ops: " + (", ".join(f"{o['name']} v{o['version']} x{o['count']}"
                                         for o in info["hx_ops"]) or "none"))
  calls = []
  for c in info["custom_calls"]:
    ks = ", ".join(f"{k['name']}{'' if k['registered'] else ' (not registered here)'}"
                   for k in c["kernels"])
    calls.append(f"{c['target']} x{c['count']}" + (f" [{ks}]" if ks else ""))
  lines.append("  custom calls: " + (", ".join(calls) or "none"))
  schemas = ", ".join(f"{n} v{s}" for n, s in v["type_schemas"].items())
  lines.append(f"  versions: artifact format {v['artifact_format']}, written by hxmlir "
               f"{v['hxmlir']}, type schemas {schemas}, jax.export calling convention "
               f"{v['calling_convention']}")
  s = info["size"]
  lines.append(f"  size: {s['artifact_bytes']} bytes (module {s['module_bytes']} bytes); "
               f"vjp: {'embedded' if info['has_vjp'] else 'none'}")
  return "\n".join(lines) + "\n"

