"""``hx.attention`` on CPU: the native kernel's custom calls ``hx_attention_cpu_v1`` (``_v2``
with a window or a soft cap, ``_v3`` for a batch, the op's version 3) and the CPU lowering
rule of ``hx_attention_p`` (:func:`lower_attention_cpu`).

The kernel (``csrc/attention.h``, ``csrc/attention.inc``, ``csrc/attention_ffi.cc``) is part of
the extension ``hxmlir._matmul_q_cpu`` and follows its ISA: :mod:`hxmlir.lowering.matmul_q.cpu`
loads the extension and picks the ISA (``select_isa``, which also picks this kernel's copy);
this module registers the target when that kernel is active and the extension has the
handler (an extension built from older sources lacks it: then ``hx.attention`` keeps its
StableHLO decomposition, :data:`ACTIVE` is false and :data:`REASON` says why).

Policy: the one of ``hx.matmul_q``'s kernels, :func:`hxmlir.lowering.matmul_q.cpu.use_native`
(installed, one device, not for ``jax.export`` unless ``hx.keep_native_cpu_calls()``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir

from hxmlir import targets
from hxmlir.install_state import use_kernels
from hxmlir.lowering import reference
from hxmlir.lowering.attention.primitive import composite_attributes
from hxmlir.lowering.composite import lower_composite
from hxmlir.lowering.matmul_q import cpu as matmul_q_cpu

KERNEL_NAME = "hx_attention_cpu"
KERNEL_VERSION = 1
TARGET = f"{KERNEL_NAME}_v{KERNEL_VERSION}"
"""The FFI custom-call target of ``hx.attention`` on CPU (its name carries the version)."""

CPU_KERNEL = targets.register_kernel(TARGET, KERNEL_NAME, KERNEL_VERSION, ("cpu",),
                                     owner="hxmlir")
assert CPU_KERNEL.ir_name == TARGET
TARGET_V2 = f"{KERNEL_NAME}_v2"
"""The target of ``hx.attention`` version 2 (a sliding window, a soft cap): the same kernel
with two more attributes, ``window`` (i64) and ``softcap`` (f32)."""
CPU_KERNEL_V2 = targets.register_kernel(TARGET_V2, KERNEL_NAME, 2, ("cpu",), owner="hxmlir")
TARGET_V3 = f"{KERNEL_NAME}_v3"
"""The target of ``hx.attention`` version 3 (a batch, each element its own ``start``): v2's
attributes, operands with a leading batch axis (``k`` and ``v`` may lack it: one cache for
every element), one call for the whole batch (``csrc/attention.h``)."""
CPU_KERNEL_V3 = targets.register_kernel(TARGET_V3, KERNEL_NAME, 3, ("cpu",), owner="hxmlir")
TARGETS = (TARGET, TARGET_V2, TARGET_V3)


def _register() -> tuple[bool, str]:
  info = matmul_q_cpu.cpu_kernel_info()
  if not info.active:
    return False, info.reason
  from hxmlir import _matmul_q_cpu as ext  # loaded: the matmul_q kernel is active
  if not hasattr(ext, "handler_attention_v3"):
    return False, (f"the extension hxmlir._matmul_q_cpu ({ext.__file__}) is older than this "
                   "hxmlir (it lacks handler_attention_v3); rebuild it: pip install -e . (or "
                   "reinstall hxmlir)")
  jax.ffi.register_ffi_target(TARGET, ext.handler_attention_v1(), platform="cpu",
                              api_version=1)
  jax.ffi.register_ffi_target(TARGET_V2, ext.handler_attention_v2(), platform="cpu",
                              api_version=1)
  jax.ffi.register_ffi_target(TARGET_V3, ext.handler_attention_v3(), platform="cpu",
                              api_version=1)
  return True, info.reason


ACTIVE, REASON = _register()
"""Whether ``hx_attention_cpu_v1`` is registered (decided at import), and why (not)."""


def attention_native(q, k, v, start, *, scale: float, window: int = 0, softcap: float = 0.0):
  """:func:`hxmlir.lowering.reference.attention` through the custom call
  ``hx_attention_cpu_v1``: same operands (``q: f32[T, kv, g, d]``, ``k: f32[kv, C, d]``,
  ``v: f32[kv, d, C]``, ``start: i32[]``; types already checked by the lo primitive) and
  result, ``scale`` an f32 attribute. Reads only positions ``c <= start + t`` (clamped to
  ``C``), and with ``window > 0`` only ``c > start + t - window``; ``softcap > 0`` caps the
  scores. Without either it calls ``hx_attention_cpu_v1``, else ``hx_attention_cpu_v2``
  (``window`` an i64 attribute, ``softcap`` an f32). A batch (``q: f32[B, T, kv, g, d]``,
  ``start: i32[B]``, :func:`hxmlir.lowering.reference.attention_batched`) calls
  ``hx_attention_cpu_v3`` (v2's attributes) once for all ``B``. Runs only where
  :data:`ACTIVE`."""
  out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  if q.ndim == 5:
    return jax.ffi.ffi_call(TARGET_V3, out)(q, k, v, start, scale=np.float32(scale),
                                            window=np.int64(window), softcap=np.float32(softcap))
  if not window and not softcap:
    return jax.ffi.ffi_call(TARGET, out)(q, k, v, start, scale=np.float32(scale))
  return jax.ffi.ffi_call(TARGET_V2, out)(q, k, v, start, scale=np.float32(scale),
                                          window=np.int64(window), softcap=np.float32(softcap))


def native_call_problem(call_targets) -> str | None:
  """Why this process cannot run a module calling ``call_targets`` (``hx_attention_cpu_v<N>``
  among them), or ``None``; as :func:`hxmlir.lowering.matmul_q.cpu.native_call_problem`."""
  needed = sorted({t for t in call_targets if t.startswith(f"{KERNEL_NAME}_v")})
  if not needed:
    return None
  other = [t for t in needed if t not in TARGETS]
  if other:
    return (f"it calls the native CPU kernel {', '.join(other)}, which this hxmlir does not "
            f"have (it has {', '.join(TARGETS)}): upgrade hxmlir, or re-export without "
            "hx.keep_native_cpu_calls()")
  if not ACTIVE:
    return (f"it calls the native CPU kernel {TARGET} (exported with "
            f"hx.keep_native_cpu_calls()), which is not available in this process: {REASON}; "
            "re-export without hx.keep_native_cpu_calls() for a portable artifact")
  return None


@functools.cache
def _native_for(scale: float, window: int = 0, softcap: float = 0.0):
  """:func:`attention_native` with its parameters bound, one function per setting (a stable
  key for sharing decompositions within a module)."""
  return functools.partial(attention_native, scale=scale, window=window, softcap=softcap)


def lower_attention_cpu(ctx, q: ir.Value, k: ir.Value, v: ir.Value, start: ir.Value, *,
                        scale: float, window: int = 0, softcap: float = 0.0) -> list[ir.Value]:
  """CPU lowering rule of ``hx_attention_p``: the composite the default rule emits, whose
  decomposition calls ``hx_attention_cpu_v1`` (``_v2``, or ``_v3`` for a batch) where
  :data:`ACTIVE` and :func:`~hxmlir.lowering.matmul_q.cpu.use_native` (the reference StableHLO
  otherwise)."""
  native = ACTIVE and matmul_q_cpu.use_native(ctx, use_kernels())
  batched = len(ctx.avals_in[0].shape) == 5
  ref = (_native_for(scale, window, softcap) if native
         else reference.attention_for(scale, window, softcap, batched))
  attrs, version = composite_attributes(scale, window, softcap, batched)
  return lower_composite(ctx, "hx.attention", q, k, v, start, reference=ref,
                         attributes=attrs, version=version)
