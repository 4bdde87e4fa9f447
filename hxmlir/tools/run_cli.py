"""``hxmlir run``: an artifact called on the arrays of an ``.npz`` file (keyed as
:mod:`hxmlir.tools.npzio` documents), on a mesh of this process's devices when it was exported
for several (see :mod:`hxmlir.tools.cli`); its results printed or written the same way."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from hxmlir.tools.cli_common import UsageError, arguments_text, npz_path, positive_arg

HOST_DEVICES_AUTO = 0
"""``--host-devices`` without N: as many CPU devices as the artifact needs."""


def add_parser(sub) -> None:
  """Adds the ``run`` subcommand to ``sub`` (argparse's subparsers)."""
  r = sub.add_parser("run", help="load an artifact and run it on arrays from an .npz file")
  r.add_argument("artifact", help="file written by `hxmlir export` or hxmlir.export's serialize()")
  r.add_argument("--inputs", metavar="NPZ", required=True,
                 help="arguments keyed a0, a1, ... (a q8 as a<i>.qvalue and a<i>.scale, and "
                 "a<i>.offset for u4o/q8o, a dict "
                 "entry as a<i>['key']; `hxmlir inspect` lists them)")
  r.add_argument("--output", metavar="NPZ",
                 help="write the results here, keyed the same way (.npz is appended if missing)")
  r.add_argument("--host-devices", nargs="?", type=positive_arg, const=HOST_DEVICES_AUTO,
                 metavar="N", help="run on N CPU devices of this machine (default N: as many "
                 "as the artifact needs), made before JAX starts (jax_num_cpu_devices, as "
                 "XLA_FLAGS=--xla_force_host_platform_device_count=N): for an artifact "
                 "exported for several devices (`hxmlir inspect` says how many)")


def _read_artifact(path: str):
  from hxmlir.export import ArtifactError, deserialize
  from hxmlir.tools.artifact_info import read_artifact_file
  blob = read_artifact_file(path)
  try:
    return blob, deserialize(blob)
  except ArtifactError as e:
    raise ArtifactError(f"{path}: {e}") from None


def run(args) -> int:
  """Runs ``hxmlir run``; returns the exit status."""
  from contextlib import nullcontext

  import jax
  import numpy as np

  from hxmlir.tools import npzio
  output = npz_path(args.output, "--output") if args.output else None
  _, exp = _read_artifact(args.artifact)
  mesh = run_mesh(exp, args.host_devices, args.artifact)
  a, kw = load_inputs(args.inputs, exp, mesh)
  with jax.set_mesh(mesh) if mesh is not None else nullcontext():
    out = exp.call(*a, **kw)
    jax.block_until_ready(out)
  types = ", ".join(map(str, exp.out_types))
  paths = npzio.leaf_paths(exp.out_tree, results=True)
  arrays = npzio.to_arrays(paths, exp.out_types, npzio.tree_leaves(exp.out_tree, out))
  if output:
    np.savez(output, **arrays)
  # a status line: stderr, so that stdout holds the printed results alone (docs/cli.md)
  print(f"ran {args.artifact} on {arguments_text(exp)}: {types}"
        + (f" -> {output}" if output else ""), file=sys.stderr)
  if not output:
    sys.stdout.write(_format_results(paths, exp.out_types, arrays))
  return 0


class DevicesError(RuntimeError):
  """An artifact exported for more devices than this process has."""


def run_mesh(exp, host_devices: int | None = None, where: str | None = None):
  """The mesh ``hxmlir run`` calls the artifact ``exp`` on: ``None`` for a one-device
  artifact; else a ``jax.sharding.Mesh`` of the artifact's mesh shape, axis names and
  types (:func:`hxmlir.tools.artifact_info.artifact_mesh`) over this process's first
  ``exp.lo.nr_devices`` devices.

  ``host_devices`` (``--host-devices``; :data:`HOST_DEVICES_AUTO` for "as many as the
  artifact needs"): first makes that many CPU devices (``jax_num_cpu_devices``, which
  must be set before JAX starts its backends) and takes the mesh's devices from them.
  Raises :class:`DevicesError` naming the counts and ``--host-devices`` when there are
  too few devices, :class:`UsageError` when ``host_devices`` is fewer than the artifact
  needs or the artifact has no ``cpu`` platform. ``where``: the artifact's name in messages (default its function's).
  """
  import jax
  import numpy as np

  from hxmlir.tools.artifact_info import artifact_mesh, mesh_str
  n = exp.lo.nr_devices
  where = where or exp.fun_name
  amesh = artifact_mesh(exp) if n > 1 else None
  shape = f" (mesh {mesh_str(amesh)})" if amesh is not None else ""
  if host_devices is not None:
    if "cpu" not in exp.platforms:
      raise UsageError(f"--host-devices runs on this machine's CPU, and {where} was exported "
                       f"for {', '.join(exp.platforms)} only (export it with --platforms cpu,...)")
    want = host_devices or n
    if want < n:
      raise UsageError(f"--host-devices {want}: {where} was exported for {n} devices{shape}; "
                       f"give --host-devices {n} (or no N)")
    _start_host_devices(want, n, where, shape)
  if n == 1:
    return None
  if amesh is None or int(np.prod(amesh.axis_sizes)) != n:
    raise DevicesError(f"{where} was exported for {n} devices but its signature records "
                       f"{'no mesh' if amesh is None else 'mesh ' + mesh_str(amesh)} of that "
                       "size; `hxmlir run` cannot lay them out (call it with "
                       "hxmlir.export.deserialize(...).call under jax.set_mesh)")
  devices = jax.devices("cpu") if host_devices is not None else jax.devices()
  if len(devices) < n:
    kind = devices[0].platform if devices else jax.default_backend()
    raise DevicesError(f"{where} was exported for {n} devices{shape} and this process has "
                       f"{len(devices)} {kind} device{'' if len(devices) == 1 else 's'}: pass "
                       f"--host-devices to run it on {n} CPU devices of this machine "
                       f"(XLA's --xla_force_host_platform_device_count={n}), or run it where "
                       f"{n} devices are")
  return jax.sharding.Mesh(np.array(devices[:n], dtype=object).reshape(amesh.axis_sizes),
                           amesh.axis_names, axis_types=amesh.axis_types)


def _start_host_devices(want: int, need: int, where: str, shape: str) -> None:
  """``jax_num_cpu_devices = want`` before JAX's backends start; once they run (an earlier
  JAX computation in this process), accepted when the CPU already has ``need`` devices."""
  import jax
  try:
    jax.config.update("jax_num_cpu_devices", want)
  except RuntimeError:  # JAX's backends already started in this process
    have = len(jax.devices("cpu"))
    if have < need:
      raise DevicesError(f"--host-devices {want}: JAX's CPU backend already started in this "
                         f"process with {have} device{'' if have == 1 else 's'} and {where} "
                         f"needs {need}{shape}; run `hxmlir run --host-devices` in a fresh "
                         "process (or set XLA_FLAGS=--xla_force_host_platform_device_count="
                         f"{need} before JAX starts)") from None


def _format_results(paths: Sequence[str], types: Sequence, arrays: dict) -> str:
  """The results of ``run`` as text: per result its key and type, then its values as
  ``print(numpy_array)`` shows them (``numpy.array2string``: large arrays summarised with
  ``...`` past ``numpy.get_printoptions()['threshold']`` elements); a hi result
  (``q8``, ``r1``, ``Tup``) per component, under the keys ``--output`` writes."""
  import numpy as np
  from jax.experimental.hijax import HiType

  from hxmlir.tools import npzio
  from hxmlir.types import typestr
  lines = []
  for path, ty in zip(paths, types):
    if isinstance(ty, HiType):
      lines.append(f"{path}: {typestr.type_str(ty)}")
    keys = [path + k for k in npzio.component_keys(ty)]
    los = ty.lo_ty() if isinstance(ty, HiType) else [ty]
    for key, lo in zip(keys, los, strict=True):
      lines.append(f"{key}: {typestr.type_str(lo)}")
      lines.append(np.array2string(arrays[key]))
  return "".join(line + "\n" for line in lines)


def _brief(items: Sequence[str], keep: int = 8) -> str:
  """``a0, a1, ..., a49`` for long lists: what a one-line message can hold."""
  items = list(items)
  if len(items) > keep:
    items = [*items[:keep - 2], f"... ({len(items) - keep + 1} more)", items[-1]]
  return ", ".join(items)


class InputsError(ValueError):
  """An ``--inputs`` file that does not hold the arguments the artifact expects."""


def load_inputs(path: str, exp, mesh=None) -> tuple[tuple, dict]:
  """The ``(args, kwargs)`` of ``exp`` from the ``.npz`` at ``path``, keyed as
  :mod:`hxmlir.tools.npzio` documents; with a ``mesh`` (:func:`run_mesh`), each lo component
  placed on it by the artifact's input shardings (``jax.export``'s ``in_shardings_jax``).

  Every array must have exactly the shape and dtype of the lo component the
  artifact expects. Raises :class:`InputsError` naming the file, the argument,
  its key and the expected type (or ``FileNotFoundError``).
  """
  from hxmlir.tools import npzio
  expected = _expected_arrays(exp)
  # one sharding per lo component, in the order of the flat arguments' components
  place = iter(exp.lo.in_shardings_jax(mesh)) if mesh is not None else None
  with _open_npz(path) as z:
    _check_keys(path, exp, expected, set(z.files))
    values = [npzio.from_arrays(ty, [_read_array(z, path, where, key, lo) for key, lo in parts],
                                None if place is None else [next(place) for _ in parts])
              for where, ty, parts in expected]
  return npzio.build_tree(exp.in_tree, values)


def _expected_arrays(exp) -> list[tuple[str, Any, list[tuple[str, Any]]]]:
  """Per flat argument: ``(what, type, [(npz key, lo type), ...])``."""
  from jax.experimental.hijax import HiType

  from hxmlir.tools import npzio
  from hxmlir.types import typestr
  out = []
  for p, ty in zip(npzio.leaf_paths(exp.in_tree), exp.in_types):
    try:
      keys = npzio.component_keys(ty)
    except TypeError as e:
      raise InputsError(f"{exp.fun_name}: argument {p} has type {typestr.type_str(ty)}: {e}; "
                        "`hxmlir run` cannot read it from an .npz") from None
    los = ty.lo_ty() if isinstance(ty, HiType) else [ty]
    # "argument 1" / "argument 1['w']" (positional: index and path), "argument kw['name']"
    out.append((f"argument {p[1:] if p.startswith('a') else p} ({typestr.type_str(ty)})", ty,
                [(p + k, lo) for k, lo in zip(keys, los, strict=True)]))
  return out


def _open_npz(path: str):
  """``numpy.load(path)`` of an ``.npz``, refusing other files with :class:`InputsError`."""
  import zipfile

  import numpy as np
  if not os.path.isfile(path):
    open(path, "rb").close()  # FileNotFoundError / IsADirectoryError with the path
  if not zipfile.is_zipfile(path):
    raise InputsError(f"--inputs {path}: not an .npz file (write one with numpy.savez, "
                      "keyed as `hxmlir inspect ARTIFACT` lists; for a built-in model, "
                      "`hxmlir export --model M --inputs-out NPZ` writes its inputs)")
  try:
    return np.load(path, allow_pickle=False)
  except Exception as e:  # a zip that numpy cannot read as .npz
    raise InputsError(f"--inputs {path}: not an .npz file: {type(e).__name__}: {e}") from None


def _check_keys(path: str, exp, expected, have: set[str]) -> None:
  """Refuses arrays the artifact does not take, and missing ones, listing the expected keys."""
  from hxmlir.types import typestr
  sig = exp.signature()
  if len(sig) > 160:
    sig = f"({_brief([typestr.type_str(t) for t in exp.in_types], 6)})"
  want = [k for _, _, parts in expected for k, _ in parts]
  takes = (f"{exp.fun_name} takes {arguments_text(exp)} {sig}, named "
           f"{_brief(want)}")
  extra = sorted(have - set(want))
  if extra:
    raise InputsError(f"--inputs {path}: unexpected arrays {extra}; {takes}")
  for where, _, parts in expected:
    for key, _ in parts:
      if key not in have:
        raise InputsError(f"--inputs {path}: {where} is missing: no array {key!r}; {takes}")


def _read_array(z, path: str, where: str, key: str, lo):
  """Array ``key`` of the open ``.npz`` ``z``, which must be exactly ``lo``'s shape and dtype."""
  import numpy as np

  from hxmlir.tools import npzio
  try:
    a = z[key]
  except Exception as e:
    raise InputsError(f"--inputs {path}: array {key!r} cannot be read: "
                      f"{type(e).__name__}: {e}") from None
  a = npzio.typed(a, lo.dtype)  # float8 components come back from np.savez as raw bytes
  want = f"{np.dtype(lo.dtype).name}[{','.join(map(str, lo.shape))}]"
  got = f"{a.dtype.name if a.dtype.kind not in 'OUSV' else a.dtype.str}" \
        f"[{','.join(map(str, a.shape))}]"
  if a.dtype != np.dtype(lo.dtype) or tuple(a.shape) != tuple(lo.shape):
    raise InputsError(f"--inputs {path}: {where}: array {key!r} is {got}, expected {want}")
  return a
