"""``hxmlir lower`` and ``hxmlir export``: a function (``MODULE:FUNCTION`` with its
argument types, :mod:`hxmlir.tools.cli`) or a built-in model, lowered through the pass
pipeline and printed, or exported as an artifact."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from hxmlir.tools.cli_common import (
  UsageError,
  arguments_text,
  check_pipeline,
  npz_path,
  platforms_arg,
)


def add_parsers(sub) -> None:
  """Adds the ``lower`` and ``export`` subcommands to ``sub`` (argparse's subparsers)."""
  from hxmlir.tools.demo import EXPORT_PLATFORMS, MODELS
  lo = sub.add_parser("lower", help="print the StableHLO of a function (or a built-in model) "
                      "after the pass pipeline")
  _add_target(lo, MODELS)
  lo.add_argument("--platforms", type=platforms_arg,
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
  ex.add_argument("--platforms", type=platforms_arg, default=EXPORT_PLATFORMS,
                  help="platforms to export for (default cpu,cuda,tpu)")
  ex.add_argument("-o", "--output", metavar="FILE", required=True, help="artifact file")
  ex.add_argument("--inputs-out", metavar="NPZ",
                  help="with --model: also write the model's example arguments, for "
                  "`hxmlir run` (.npz is appended if missing)")


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


def _quantized_model(name: str):
  from hxmlir.tools.demo import build_model
  m = build_model(name)
  m.qparams = m.quantize(m.params)
  return m


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


def run_lower(args) -> int:
  """Runs ``hxmlir lower``; returns the exit status."""
  from functools import partial

  from hxmlir.testing import lowered_text
  check_pipeline(args.pipeline)
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


def run_export(args) -> int:
  """Runs ``hxmlir export``; returns the exit status."""
  from contextlib import nullcontext

  import jax
  import numpy as np

  from hxmlir.export import export
  from hxmlir.integration.installation import installed
  from hxmlir.tools.npzio import flatten_values
  inputs_out = npz_path(args.inputs_out, "--inputs-out") if args.inputs_out else None
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
        f"{arguments_text(exp)}" + (f"; inputs {inputs_out}" if inputs_out else ""),
        file=sys.stderr)  # a status line: the artifact is the output (docs/cli.md)
  return 0


def _write_text(path: str | None, text: str) -> None:
  if path is None:
    sys.stdout.write(text)
  else:
    with open(path, "w") as f:
      f.write(text)
