"""What ``hx.install()`` installed, as a JAX config state that every layer may read.

The setting lives here, below the lowering, because lowering rules ask whether
hxmlir is installed (``lowering/matmul_q/pallas/`` picks a kernel by it) and
:mod:`hxmlir.integration.installation`, which sets it, sits above the lowering. Like
``jax_enable_x64``, it is part of JAX's trace context and jit cache key, so every
JAX cache keys on it: a lowering rule may read it, and what it returned is
cached under the setting it read.
"""

from __future__ import annotations

import dataclasses

from hxmlir import _jax


@dataclasses.dataclass(frozen=True)
class Setting:
  """What is installed: the pipelines for execution and for export (hashable).

  ``pipeline``: run on every module with an ``hx.*`` op; ``export_pipeline``: the
  same for lowerings for ``jax.export`` (``pipeline`` plus ``hx-check-export``);
  ``check_pipeline``: what export lowerings of modules without ``hx.*`` ops run
  when they call a custom-call target that hxmlir added to ``jax.export``'s
  allow-list (``"hx-check-export"``); ``kernels``: whether lowering rules choose
  hxmlir's native CPU and Pallas kernels (:func:`use_kernels`); ``activations``: the
  activations' dtype the kernels may compute with (:data:`ACTIVATIONS`; ``"int8"``: the
  opt-in integer-activation CPU kernel, :func:`int8_activations`).
  """
  pipeline: str
  export_pipeline: str
  check_pipeline: str
  kernels: bool = True
  activations: str = "f32"


ACTIVATIONS = ("f32", "int8")
"""The values of ``hx.install(activations=...)``: ``"f32"`` (the default: activations stay
f32) or ``"int8"`` (opt-in: on CPU, ``hx.matmul_q`` in the ``[out, in]`` layout with int8,
int4 or uint4 weights (``x`` of any number of rows; with groups not a multiple of 32, of
at least 16 rows) quantizes ``x`` to int8
per block at run time and calls ``hx_matmul_q_cpu_i8x_v1``, and with GGUF's block formats
``hx_matmul_q_cpu_i8x_v2``; it changes the numerics)."""


STATE = _jax.ConfigState(
    "hxmlir_install", None,
    "The hxmlir pass pipeline run on every lowered module (set by hxmlir.install).",
    include_in_jit_key=True, include_in_trace_context=True)
"""JAX config state holding the current :class:`Setting` (``None``: not installed);
``include_in_trace_context`` / ``include_in_jit_key`` put it into the keys of JAX's
tracing, lowering and C++ dispatch caches."""


def current() -> Setting | None:
  """The setting lowerings in this thread use now (``None``: not installed)."""
  return STATE.value


def is_installed() -> bool:
  """Whether a pipeline runs on modules lowered now, in this thread (the passes' meaning
  of "installed"; the kernels' is :func:`use_kernels`)."""
  return STATE.value is not None


def use_kernels() -> bool:
  """Whether lowering rules lowered now, in this thread, emit hxmlir's kernels (the native
  CPU kernel, the Pallas kernels) where they apply: hxmlir is installed with
  ``kernels=True`` (the default). Otherwise they emit the reference decomposition."""
  setting = STATE.value
  return setting is not None and setting.kernels


def int8_activations() -> bool:
  """Whether lowering rules lowered now, in this thread, may quantize activations to int8
  (:func:`use_kernels` and ``activations="int8"``)."""
  setting = STATE.value
  return setting is not None and setting.kernels and setting.activations == "int8"


def current_pipeline(*, for_export: bool = False) -> str | None:
  """The pipeline string lowerings in this thread run now (``None``: not installed)."""
  setting = STATE.value
  if setting is None:
    return None
  return setting.export_pipeline if for_export else setting.pipeline
