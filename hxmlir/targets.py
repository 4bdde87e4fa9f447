"""The registry of export-stable kernels: custom-call target, kernel name, version, platforms.

``jax.export`` refuses custom calls whose target is not on JAX's private list of
stable targets; Pallas Triton kernels (``__gpu$xla.gpu.triton``) are refused
because Triton IR has no compatibility guarantee. hxmlir earns stability for its
own kernels instead (each has back-compat artifacts under
``tests/py/integration/backcompat``), and records them here. A kernel is identified in IR
by its target *and* its kernel name, which carries the version::

  kernel name in IR = f"{name}_v{version}"   (pallas_call(..., name=k.ir_name))

How the name appears depends on the backend (see :func:`kernel_name_of`): the
``kernel_name`` attribute for Mosaic (``tpu_custom_call``, ``mosaic_gpu_v2``),
the ``name`` entry of the ``mhlo.backend_config`` dictionary for Triton.

This module only keeps the records. ``hx.install()`` makes plain
``jax.export.export`` accept the registered kernels' targets (:func:`registered_targets`)
in the threads where hxmlir is installed (:mod:`hxmlir.integration.installation`). JAX checks
targets only, so there the ``hx-check-export`` pass (run on every export lowering)
refuses the custom calls of a shared target whose kernel name is not registered --
for example a user's own Triton kernel. Users register their kernels with :func:`register_kernel`,
under the same checks.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from jaxlib.mlir import ir

from hxmlir import _jax

TRITON = "__gpu$xla.gpu.triton"
"""Custom-call target of Pallas Triton kernels (not stable in JAX)."""
MOSAIC_TPU = "tpu_custom_call"
"""Custom-call target of Pallas Mosaic TPU kernels (stable in JAX)."""
MOSAIC_GPU = "mosaic_gpu_v2"
"""Custom-call target of Pallas Mosaic GPU kernels (stable in JAX)."""

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
"""The platform names JAX lowers for (``jax.export``'s ``platforms``) that hxmlir knows."""
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IR_NAME_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*?)_v(?P<version>[0-9]+)$")


@dataclass(frozen=True)
class Kernel:
  """One registered kernel.

  ``target``: the custom-call target (``"__gpu$xla.gpu.triton"``); ``name``: the
  kernel's base name, an identifier (``"hx_matmul_q"``); ``version``: an int >= 1,
  bumped whenever the kernel's semantics or calling convention change;
  ``platforms``: where it runs (subset of ``cpu``, ``cuda``, ``rocm``, ``tpu``);
  ``owner``: ``"hxmlir"`` for hxmlir's own kernels, otherwise the registering
  package (the back-compat tests cover hxmlir's own).
  """
  target: str
  name: str
  version: int
  platforms: tuple[str, ...]
  owner: str = "user"

  @property
  def ir_name(self) -> str:
    """The kernel name the custom call carries: ``f"{name}_v{version}"``."""
    return f"{self.name}_v{self.version}"

  def __str__(self) -> str:
    return f"{self.ir_name} ({self.target}; {', '.join(self.platforms)})"


_lock = threading.RLock()
_kernels: dict[tuple[str, str, int], Kernel] = {}


def _check(target, name, version, platforms) -> tuple[str, ...]:
  if not isinstance(target, str) or not target:
    raise ValueError(f"kernel target must be a non-empty string, got {target!r}")
  if not isinstance(name, str) or not _NAME_RE.match(name):
    raise ValueError(f"kernel name must be an identifier ([A-Za-z_][A-Za-z0-9_]*), got {name!r}")
  if isinstance(version, bool) or not isinstance(version, int) or version < 1:
    raise ValueError(f"kernel version must be an int >= 1, got {version!r}")
  return check_platforms(platforms, "kernel platforms")


def check_platforms(platforms, what: str = "platforms") -> tuple[str, ...]:
  """``platforms`` (a name or a sequence of names) as a tuple, each one of :data:`PLATFORMS`.

  Raises ``ValueError`` naming ``what``, the unknown names and the known ones when
  ``platforms`` is empty or names another platform (``jax.export`` would export for
  a misspelt ``"tpuu"`` as if it existed).
  """
  if isinstance(platforms, str):
    platforms = (platforms,)
  platforms = tuple(platforms)
  bad = [p for p in platforms if p not in PLATFORMS]
  if not platforms or bad:
    raise ValueError(f"{what} must be a non-empty list of {', '.join(PLATFORMS)}, got "
                     f"{platforms!r}" + (f" (unknown: {', '.join(map(repr, bad))})" if bad else ""))
  return platforms


def register_kernel(target: str, name: str, version: int, platforms: Iterable[str] | str, *,
                    owner: str = "user") -> Kernel:
  """Registers a kernel as export-stable and returns its :class:`Kernel` record.

  Emit the kernel with ``pallas_call(..., name=kernel.ir_name)`` so
  ``hx-check-export`` can identify it. Registering the same kernel twice with
  the same platforms returns the existing record. Raises ``ValueError`` on a bad
  target, name (not an identifier), version (not an int >= 1) or platform, and
  when the same ``(target, name, version)`` is already registered with other
  platforms or another owner. Where hxmlir is installed, ``jax.export`` accepts
  the target from then on.
  """
  platforms = _check(target, name, version, platforms)
  k = Kernel(target, name, version, platforms, owner)
  with _lock:
    old = _kernels.get((target, name, version))
    if old is not None:
      if old != k:
        raise ValueError(f"kernel {old.ir_name} on {target} is already registered as {old} "
                         f"by {old.owner}; bump the version to change it")
      return old
    _kernels[(target, name, version)] = k
  return k


def unregister_kernel(kernel: Kernel) -> None:
  """Removes ``kernel`` from the registry. Raises ``KeyError`` if not registered."""
  with _lock:
    key = (kernel.target, kernel.name, kernel.version)
    if _kernels.get(key) != kernel:
      raise KeyError(f"kernel {kernel} is not registered")
    del _kernels[key]


def registered_kernels() -> tuple[Kernel, ...]:
  """Every registered kernel, sorted by target, name and version."""
  with _lock:
    return tuple(sorted(_kernels.values(), key=lambda k: (k.target, k.name, k.version)))


def lookup(target: str, ir_name: str | None) -> Kernel | None:
  """The registered kernel whose custom call has ``target`` and kernel name ``ir_name``.

  ``None`` when ``ir_name`` is ``None``, not of the form ``<name>_v<version>``,
  or not registered for ``target``.
  """
  if ir_name is None:
    return None
  m = _IR_NAME_RE.match(ir_name)
  if m is None:
    return None
  with _lock:
    return _kernels.get((target, m["name"], int(m["version"])))


def kernel_name_of(op) -> str | None:
  """The kernel name of a ``stablehlo.custom_call`` op (``jaxlib.mlir``), or ``None``.

  Mosaic TPU / Mosaic GPU custom calls carry it in a ``kernel_name`` string
  attribute; Pallas Triton calls in the ``name`` entry of their
  ``mhlo.backend_config`` dictionary (``pallas_call(..., name=...)`` in both).
  An XLA FFI kernel registered with its versioned name as its target
  (``hx_matmul_q_cpu_v1``) is named by its ``call_target_name``.
  """
  attrs = op.attributes
  if "kernel_name" in attrs:
    a = attrs["kernel_name"]
    if isinstance(a, ir.StringAttr):
      return a.value
  if "mhlo.backend_config" in attrs:
    cfg = attrs["mhlo.backend_config"]
    if isinstance(cfg, ir.DictAttr) and "name" in cfg:
      a = cfg["name"]
      if isinstance(a, ir.StringAttr):
        return a.value
  if "call_target_name" in attrs:
    target = ir.StringAttr(attrs["call_target_name"]).value
    with _lock:
      if any(k.target == target == k.ir_name for k in _kernels.values()):
        return target
  return None


def registered_targets() -> frozenset[str]:
  """The custom-call targets of the registered kernels."""
  with _lock:
    return frozenset(k.target for k in _kernels.values())


def jax_stable_targets() -> frozenset[str]:
  """The custom-call targets JAX itself guarantees stable (never what hxmlir adds)."""
  return _jax.jax_stable_custom_call_targets()
