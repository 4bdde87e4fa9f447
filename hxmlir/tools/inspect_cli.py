"""``hxmlir inspect``: what an artifact holds (:mod:`hxmlir.tools.artifact_info`), or a GGUF
checkpoint's tensors and what hxmlir's decoder reads from it."""

from __future__ import annotations

import os
import sys


def add_parser(sub) -> None:
  """Adds the ``inspect`` subcommand to ``sub`` (argparse's subparsers)."""
  ins = sub.add_parser("inspect", help="show what an artifact holds: signature, platforms, "
                       "hx ops, custom calls, versions, size")
  ins.add_argument("artifact", help="file written by `hxmlir export` or hxmlir.export's "
                   "serialize(), or a GGUF checkpoint (its tensors, GGUF and hx types, bytes)")
  ins.add_argument("--json", action="store_true", help="print the report as JSON")


def _decoder_description(h) -> dict:
  """What hxmlir's GGUF decoder reads from the file of header ``h`` (``gguf.Header``;
  :meth:`hxmlir.models.arch.Config.describe`, key -> value text), or ``{"unsupported":
  why}`` when it cannot run it."""
  from hxmlir import gguf
  from hxmlir.models import arch
  try:
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in h.reader.tensors}
    text = arch.describe(h.metadata, shapes, h.path).describe()
  except gguf.GGUFError as e:
    return {"unsupported": str(e)}
  return dict(line.split(": ", 1) for line in text.splitlines())


def run(args) -> int:
  """Runs ``hxmlir inspect``; returns the exit status."""
  import json

  from hxmlir import gguf
  if gguf.is_gguf(args.artifact) or os.fspath(args.artifact).endswith(".gguf"):
    # a GGUF checkpoint (by its magic or its name: a bad one is a GGUF error): its tensors
    header = gguf.read_header(args.artifact)  # once (a large vocabulary takes seconds)
    info = gguf.inspect(header)
    info["decoder"] = _decoder_description(header)
    sys.stdout.write(json.dumps(info, indent=2) + "\n" if args.json else
                     gguf.format_inspect(info) + "decoder:\n" + "".join(
                         f"  {k}: {v}\n" for k, v in info["decoder"].items()))
    return 0
  from hxmlir.export import ArtifactError
  from hxmlir.tools.artifact_info import artifact_info, format_info, read_artifact_file
  blob = read_artifact_file(args.artifact, "an artifact written by `hxmlir export` or a GGUF "
                            "checkpoint")
  try:
    info = artifact_info(blob)
  except ArtifactError as e:
    raise ArtifactError(f"{args.artifact}: {e}") from None
  sys.stdout.write(json.dumps(info, indent=2) + "\n" if args.json
                   else format_info(info, args.artifact))
  return 0
