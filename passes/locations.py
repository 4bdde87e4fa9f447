"""MLIR locations as ``file:line:col`` strings, for diagnostics.

IR lowered by JAX carries the user's Python file and line inside name and
call-site locations; IR parsed from a file carries the file's line and column.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

from jaxlib.mlir import ir

from hxmlir import _jax
from hxmlir.lowering import schema as _schema_module


def _cast(loc: ir.Location, cls):
  if isinstance(loc, cls):
    return loc
  try:
    return cls(loc)
  except (ValueError, TypeError):
    return None


def _file_locs(loc: ir.Location) -> Iterator[ir.FileLineColLoc]:
  """Every ``FileLineColLoc`` in ``loc``: callee before caller, fused in order."""
  if (f := _cast(loc, ir.FileLineColLoc)) is not None:
    yield f
  elif (n := _cast(loc, ir.NameLoc)) is not None:
    yield from _file_locs(n.child_loc)
  elif (c := _cast(loc, ir.CallSiteLoc)) is not None:
    yield from _file_locs(c.callee)
    yield from _file_locs(c.caller)
  elif (fused := _cast(loc, ir.FusedLoc)) is not None:
    for sub in fused.locations:
      yield from _file_locs(sub)


# Frames inside hxmlir itself (hi primitives, lowering rules) are skipped, the way
# JAX drops its own frames from tracebacks: the user's line is the one that matters.
_OWN_DIRS = tuple(os.path.dirname(path) + os.sep for path in (
    os.path.dirname(_jax.__file__),  # hxmlir/ (the seam is a package inside it)
    _schema_module.__file__, sys.modules[__name__].__file__))


def location_str(loc: ir.Location) -> str:
  """``"file:line:col"`` for ``loc``: its first file position outside hxmlir, else ``<unknown>``.

  IR lowered by JAX carries the user's Python file and line inside name and
  call-site locations (frames in hxmlir's own packages are skipped when a user
  frame exists); IR parsed from a file carries the file's line and column.
  """
  found = list(_file_locs(loc))
  if not found:
    return "<unknown>"
  user = [f for f in found if not f.filename.startswith(_OWN_DIRS)]
  f = (user or found)[0]
  return f"{f.filename}:{f.start_line}:{f.start_col}"
