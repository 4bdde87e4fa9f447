"""The registry of hxmlir's passes: pass name -> lazy getter of its class.

Getters import the pass's module only when the pass is used (xDSL's
``get_all_passes`` pattern). To add a pass, add one line here; a test checks
that every key equals its class's ``name``.
"""

from __future__ import annotations

from collections.abc import Callable

from hxmlir.passes.base import HxPass


def _verify() -> type[HxPass]:
  from hxmlir.passes.verify import VerifyPass
  return VerifyPass


def _fold_scales() -> type[HxPass]:
  from hxmlir.passes.fold_scales import FoldScalesPass
  return FoldScalesPass


def _decompose() -> type[HxPass]:
  from hxmlir.passes.decompose import DecomposePass
  return DecomposePass


def _check_export() -> type[HxPass]:
  from hxmlir.passes.check_export import CheckExportPass
  return CheckExportPass


PASS_REGISTRY: dict[str, Callable[[], type[HxPass]]] = {
    "hx-verify": _verify,
    "hx-fold-scales": _fold_scales,
    "hx-decompose": _decompose,
    "hx-check-export": _check_export,
}
"""Pass name -> zero-argument function returning the pass class."""
