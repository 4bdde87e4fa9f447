"""Helpers for the pass tests: compile an MLIR module with JAX's CPU backend and run it.

Not a test module itself (it defines no tests); ``test_passes*.py`` import it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import jax.extend.backend
import numpy as np
from jaxlib import xla_client


def compile_and_run(text: str, args: Sequence[np.ndarray]) -> list[np.ndarray]:
  """Compiles StableHLO ``text`` (a module with a public ``@main``) for one CPU device
  and runs it on ``args``; returns the results as numpy arrays."""
  client = jax.extend.backend.get_backend("cpu")
  device = client.devices()[0]
  exe = client.compile_and_load(text, xla_client.DeviceList((device,)),
                                xla_client.CompileOptions())
  outs = exe.execute([jax.device_put(np.asarray(a), device) for a in args])
  return [np.asarray(o) for o in outs]


def without_locations(text: str) -> str:
  """MLIR text with its location aliases (``#loc...`` lines) and ``loc(...)`` suffixes removed."""
  lines = [line for line in text.splitlines() if not line.startswith("#loc")]
  return "\n".join(re.sub(r" loc\((?:[^()]|\([^()]*\))*\)", "", line) for line in lines)
