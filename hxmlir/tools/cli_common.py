"""What the ``hxmlir`` subcommands (:mod:`hxmlir.tools.cli`) share: the error of a bad
command line (:class:`UsageError`, exit status 2), argument types of their options, the
pipeline check, ``.npz`` output paths and the artifact's argument count they print."""

from __future__ import annotations

import argparse
import os

from hxmlir.targets import PLATFORMS, check_platforms


class UsageError(ValueError):
  """A command line whose options do not go together (``--model`` with ``--arg``)."""


def platforms_arg(text: str) -> tuple[str, ...]:
  """``--platforms``' argument type: a comma-separated list of :data:`hxmlir.targets.PLATFORMS`."""
  try:
    return check_platforms(tuple(p.strip() for p in text.split(",") if p.strip()))
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"invalid platforms {text!r}: a comma-separated list of {', '.join(PLATFORMS)}") from None


def positive_arg(text: str) -> int:
  """The argument type of options taking a positive integer."""
  try:
    n = int(text)
  except ValueError:
    n = 0
  if n < 1:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
  return n


def check_pipeline(text: str | None) -> None:
  """Raises ``PipelineError`` (unknown pass or option) before any model is loaded."""
  if text is not None:
    from hxmlir.passes import parse_pipeline
    parse_pipeline(text)


def npz_path(path: str, flag: str) -> str:
  """The file ``numpy.savez(path)`` writes (``.npz`` appended when missing); refuses directories."""
  if os.path.isdir(path) or path.endswith(("/", os.sep)):
    raise IsADirectoryError(f"{flag} {path}: is a directory; give an .npz file name")
  if not path.endswith(".npz"):
    path += ".npz"
  if os.path.isdir(path):
    raise IsADirectoryError(f"{flag} {path}: is a directory; give an .npz file name")
  return path


def arguments_text(exp) -> str:
  """``'3 arguments'``: the artifact's arguments as its signature lists them (each hi value
  or array of a pytree argument is one), the count every command prints."""
  n = len(exp.in_types)
  return f"{n} argument{'' if n == 1 else 's'}"
