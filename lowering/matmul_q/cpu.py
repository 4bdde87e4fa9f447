"""``hx.matmul_q`` on CPU: the native kernels (loading, ISA dispatch, FFI registration,
policy) and the CPU lowering rule of ``hx_matmul_q_p`` (:func:`lower_matmul_q_cpu`).

The kernels (``csrc/``, built by ``pip install`` into the extension module
``hxmlir._matmul_q_cpu``) are registered with XLA's FFI as custom-call
targets (the version is part of the name: a change of semantics or calling
convention gets a new target), both with f32 accumulation on XLA's intra-op
thread pool:

- ``hx_matmul_q_cpu_v1`` (:data:`TARGET`): ``y = (x * s[..., None, :]) @ f32(q)``
  for ``x: f32[*b, m, k]``, ``q: i8[*b, k, n]``, ``s: f32[*b, k]`` ->
  ``f32[*b, m, n]`` (int8, one scale per row; three regimes by ``m``, see
  ``csrc/matmul_q_ffi.cc``).
- ``hx_matmul_q_cpu_v2`` (:data:`TARGET_V2`): ``y = x @ dequantize(q, s)`` for every
  format of :mod:`hxmlir.formats` in the same layout: ``q: T[*b, k, n / pack]``
  (``i8`` int8, ``ui8`` int4 in layout ``int4_pairs_v1``, ``f8E4M3FN``),
  ``s: f32[*b, k]`` (per row) or ``f32[*b, k, n / g]`` (per group of ``g`` along
  ``n``), with the attributes ``dtype``, ``layout`` and ``group_size`` (``0``: per
  row) naming the format; the kernel refuses operands that disagree with them
  (``csrc/matmul_q_formats_ffi.cc``, ``csrc/matmul_q_formats.h``).
- ``hx_matmul_q_cpu_v3`` (:data:`TARGET_V3`): the checkpoint layout ``[out, in]``
  (``hx.einsum("...k,nk->...n", x, w)``): ``x: f32[*b, k]``, ``q: T[n, k / pack]`` quantized
  along ``k`` (the contraction axis), ``s: S[n]`` or ``S[n, k / g]`` with ``S`` f32 or f16,
  and for the offset formats ``o`` like ``s`` -> ``f32[*b, n]``, for every format of
  :mod:`hxmlir.formats` (``"nk"`` in ``Format.native_cpu``), with the attributes ``dtype`` (the
  values' dtype: ``int8``, ``int4``, ``uint4``, ``float8_e4m3fn``), ``layout``,
  ``group_size``, ``scale_dtype`` (``f32``/``f16``) and ``offset`` (``csrc/matmul_q_nk_ffi.cc``,
  ``csrc/matmul_q_nk.h``): row dot products at small ``m`` (a GEMV streaming the weight at
  ``m = 1``), a block of rows decoded once to f32 under a register-tiled loop above.
- ``hx_matmul_q_cpu_v4`` (:data:`TARGET_V4`): GGUF's block formats (``Format.block``: Q5_0,
  Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS) at the file's bytes in the ``[out, in]`` layout: ``q:
  ui16[n, k / B, words]``, ``s`` (``d``) and for the formats with one ``o`` (``dmin``)
  ``f16[n, k / B]``, the attributes of ``_v3`` with ``dtype`` the format's name
  (:func:`matmul_q_native_v4`; ``docs/kernels.md``).
- ``hx_matmul_q_cpu_i8x_v2`` (:data:`TARGET_I8X_V2`): ``_v4``'s operands with integer
  activations (opt-in, ``hx.install(activations="int8")``): ``x`` quantized to int8 per block
  of 32 at run time, exact int32 dot products per sub-block (:func:`matmul_q_native_i8x_v2`;
  ``csrc/matmul_q_i8x_blocks.h``).
- ``hx_matmul_q_cpu_nkt_v1`` (:data:`TARGET_NKT`): the transposed product of the checkpoint
  layout, ``x @ W`` for ``W[n, k]`` quantized along ``k`` (``hx.einsum("...n,nk->...k")``:
  the backward of ``hx.einsum("...k,nk->...n", x, W)`` in ``x``), ``x: f32[*b, n]`` and
  ``W``'s components and attributes as ``_v3`` (a value format) or ``_v4`` (a block format)
  take them -> ``f32[*b, k]`` (:func:`matmul_q_native_nkt`; ``csrc/matmul_q_nkt.h``).

At import this module picks the kernel's ISA (the best of ``avx512``, ``avx2``
this CPU runs; ``$HXMLIR_CPU_ISA`` forces one, ``generic`` included) and
registers the target, or records why not: the extension is absent (the build
failed or was skipped), ``$HXMLIR_DISABLE_NATIVE`` is set, or the CPU has
neither AVX2 nor AVX-512 (the portable C++ copy is not faster than XLA's
StableHLO lowering, so it is used only when asked for). :func:`cpu_kernel_info`
says which path ``hx.matmul_q`` takes on CPU and why.

Policy (:func:`use_native`), applied by the CPU lowering rule of
``hx_matmul_q_p`` (:func:`lower_matmul_q_cpu`, below): the ``hx.matmul_q``
composite's decomposition calls the kernel only while hxmlir is installed,
the kernel is active, the module is for one device, and either the lowering is
not for ``jax.export`` or the export opted in with :func:`keep_native_cpu_calls`.
Everything else gets the portable StableHLO decomposition, so artifacts run
anywhere by default. An artifact that keeps the call names ``hx_matmul_q_cpu_v1``,
``_v2`` or ``_v3``; :func:`native_call_problem` tells a loading process what it lacks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir

from hxmlir import _jax, formats, targets
from hxmlir.install_state import int8_activations, use_kernels
from hxmlir.lowering import reference
from hxmlir.lowering.composite import lower_composite
from hxmlir.lowering.matmul_q import blocked, default, streaming
from hxmlir.types import dotdims

KERNEL_NAME = "hx_matmul_q_cpu"
KERNEL_VERSION = 1
TARGET = f"{KERNEL_NAME}_v{KERNEL_VERSION}"
"""The FFI custom-call target of int8 per-row weights (its name carries the version)."""
TARGET_V2 = f"{KERNEL_NAME}_v2"
"""The FFI custom-call target of every format (:mod:`hxmlir.formats`)."""
TARGET_V3 = f"{KERNEL_NAME}_v3"
"""The FFI custom-call target of the ``[out, in]`` layout, every format."""
TARGET_V4 = f"{KERNEL_NAME}_v4"
"""The FFI custom-call target of GGUF's block formats (``Format.block``) in the ``[out, in]``
layout (``csrc/matmul_q_nk.h``, ``BlockProblem``)."""
TARGET_NKT = f"{KERNEL_NAME}_nkt_v1"
"""The FFI custom-call target of the transposed product of the ``[out, in]`` layout, every
format that layout takes (``csrc/matmul_q_nkt.h``): ``x @ W`` for ``W[n, k]``."""
TARGET_I8X = f"{KERNEL_NAME}_i8x_v1"
"""The FFI custom-call target of the ``[out, in]`` layout with integer activations (opt-in:
``hx.install(activations="int8")``; ``csrc/matmul_q_i8x.h``)."""
TARGET_I8X_V2 = f"{KERNEL_NAME}_i8x_v2"
"""The FFI custom-call target of GGUF's block formats (``Format.block``) in the ``[out, in]``
layout with integer activations (opt-in: ``hx.install(activations="int8")``;
``csrc/matmul_q_i8x_blocks.h``): ``_v4``'s operands, ``x`` quantized to int8 per block of 32."""
TARGETS = (TARGET, TARGET_V2, TARGET_V3, TARGET_V4, TARGET_I8X, TARGET_NKT, TARGET_I8X_V2)
"""Every version of the kernel this hxmlir has, oldest first (then the integer-activation
variant, the transposed product of the ``[out, in]`` layout, and the integer-activation
variant of the block formats)."""
DISABLE_ENV = "HXMLIR_DISABLE_NATIVE"
"""A true value keeps the StableHLO lowering on CPU. Read as JAX reads its boolean
flags (``jax._src.config.bool_env``): :data:`TRUE_VALUES` / :data:`FALSE_VALUES`, any
case; empty is false. Anything else warns and counts as true (the portable path)."""
TRUE_VALUES = ("1", "true", "t", "yes", "y", "on")
FALSE_VALUES = ("0", "false", "f", "no", "n", "off")
ISA_ENV = "HXMLIR_CPU_ISA"
"""Force the kernel's ISA: one of :data:`ISAS` (any case). A value that is not one, or
an ISA this CPU and build do not run, warns and keeps the StableHLO lowering."""
ISAS = ("avx512", "avx2", "generic")
"""The kernel builds, best first; ``generic`` is portable C++."""
DEFAULT_ISAS = ("avx512", "avx2")
"""ISAs used without ``$HXMLIR_CPU_ISA``, best first."""
LINGER_ENV = "HXMLIR_CPU_LINGER_US"
"""How long a helper thread of the native kernels spins for the next call's blocks after
its part of a call (``csrc/matmul_q_parallel.h``): an integer number of microseconds in
``[0, LINGER_MAX_US]``, 0 never; :data:`LINGER_DEFAULT_US` when unset or empty. Anything
else warns: a value that is not an integer keeps the default, one out of range is clamped
(spinning longer than a step's gaps costs the other threads their core: on a loaded 2-core
machine SmolLM2's decode went from 46 to 12 tok/s at 1000 us and 0.6 at 100000)."""
LINGER_DEFAULT_US = 50
LINGER_MAX_US = 500

CPU_KERNEL = targets.register_kernel(TARGET, KERNEL_NAME, KERNEL_VERSION, ("cpu",),
                                     owner="hxmlir")
CPU_KERNEL_V2 = targets.register_kernel(TARGET_V2, KERNEL_NAME, 2, ("cpu",), owner="hxmlir")
CPU_KERNEL_V3 = targets.register_kernel(TARGET_V3, KERNEL_NAME, 3, ("cpu",), owner="hxmlir")
CPU_KERNEL_V4 = targets.register_kernel(TARGET_V4, KERNEL_NAME, 4, ("cpu",), owner="hxmlir")
CPU_KERNEL_I8X = targets.register_kernel(TARGET_I8X, f"{KERNEL_NAME}_i8x", 1, ("cpu",),
                                         owner="hxmlir")
CPU_KERNEL_NKT = targets.register_kernel(TARGET_NKT, f"{KERNEL_NAME}_nkt", 1, ("cpu",),
                                         owner="hxmlir")
CPU_KERNEL_I8X_V2 = targets.register_kernel(TARGET_I8X_V2, f"{KERNEL_NAME}_i8x", 2, ("cpu",),
                                            owner="hxmlir")
assert (CPU_KERNEL.ir_name, CPU_KERNEL_V2.ir_name, CPU_KERNEL_V3.ir_name, CPU_KERNEL_V4.ir_name,
        CPU_KERNEL_I8X.ir_name, CPU_KERNEL_NKT.ir_name, CPU_KERNEL_I8X_V2.ir_name) == TARGETS


@dataclass(frozen=True)
class CpuKernelInfo:
  """Which implementation ``hx.matmul_q`` uses on CPU, and why.

  ``active``: the native kernel is registered and used while hxmlir is
  installed; ``isa``: its instruction set (``"avx512"``, ``"avx2"``,
  ``"generic"``) or ``None``; ``target``: the FFI custom-call target of int8 per-row
  weights (every format's, ``hx_matmul_q_cpu_v2``, is registered with it);
  ``reason``: why this path (always set); ``supported_isas``: the kernel
  builds this CPU can run, best first (empty without the extension); ``threads``: the
  most threads one kernel call runs on (the calling thread and XLA's intra-op pool's),
  the cores this process may use (its affinity mask), whatever the pool's size (which
  is max(cores, host devices)); 0 when inactive.
  """
  active: bool
  isa: str | None
  target: str
  reason: str
  supported_isas: tuple[str, ...] = ()
  threads: int = 0

  def __str__(self) -> str:
    return self.describe()

  def describe(self, dtype: str = "int8", group_size: int | None = None,
               layout: str = "kn") -> str:
    """This as a line for weights of format ``dtype`` (``"int8"``, ``"int4"``,
    ``"float8_e4m3fn"``, ...) with ``group_size`` (``None``: per row) in the weight layout
    ``layout`` (:data:`hxmlir.formats.WEIGHT_LAYOUTS`): the target that format's calls name
    (``"kn"``, ``f32[..., k] @ Q[k, n]``: ``hx_matmul_q_cpu_v1`` for int8 per row,
    ``hx_matmul_q_cpu_v2`` otherwise; ``"nk"``, ``W[n, k]``: ``hx_matmul_q_cpu_v3``), or
    the StableHLO lowering where the kernel is off or does not take the format there."""
    if not self.active:
      return f"StableHLO lowering ({self.reason})"
    if layout not in formats.FORMATS[dtype].native_cpu:
      return f"StableHLO lowering (the native kernel takes {dtype} in layouts " \
             f"{', '.join(formats.FORMATS[dtype].native_cpu)} only)"
    if layout == "nk":
      target = TARGET_V4 if formats.FORMATS[dtype].block else TARGET_V3
    else:
      target = self.target if dtype == "int8" and group_size is None else TARGET_V2
    return f"native CPU kernel {target} ({self.isa}; {self.reason})"


def _load() -> CpuKernelInfo:
  import warnings  # here, not at the top: this function is the environment's one reader

  def off(reason: str, supported: tuple[str, ...] = ()) -> CpuKernelInfo:
    return CpuKernelInfo(False, None, TARGET, reason, supported)

  def warn(msg: str) -> None:
    warnings.warn(f"hxmlir: {msg}", UserWarning, stacklevel=3)

  disable = os.environ.get(DISABLE_ENV, "")
  if disable.strip().lower() not in ("", *FALSE_VALUES):
    how = ""
    if disable.strip().lower() not in TRUE_VALUES:
      how = " (not a truth value: read as true)"
      warn(f"${DISABLE_ENV}={disable!r} is not a truth value ({'/'.join(TRUE_VALUES)} to "
           f"disable, {'/'.join(FALSE_VALUES)} or empty to enable, as JAX's boolean flags); "
           "read as true: hx.matmul_q uses the StableHLO lowering on CPU")
    return off(f"disabled by ${DISABLE_ENV}={disable}{how}")
  want = os.environ.get(ISA_ENV, "")
  unknown = want.strip().lower() not in ("", *ISAS)
  if unknown:
    warn(f"${ISA_ENV}={want!r} is not one of {', '.join(ISAS)}; hx.matmul_q uses the "
         f"StableHLO lowering on CPU (unset ${ISA_ENV} for the best ISA this CPU runs)")
  try:
    from hxmlir import _matmul_q_cpu as ext
  except ImportError as e:
    return off(f"the extension hxmlir._matmul_q_cpu is not built ({e}); reinstall hxmlir "
               "with g++ or clang++ available")
  stale = [f for f in EXTENSION_API if not hasattr(ext, f)]
  if stale:  # an extension built from older sources (an editable install not rebuilt)
    warn(f"the extension hxmlir._matmul_q_cpu ({ext.__file__}) is older than this hxmlir "
         f"(it lacks {', '.join(stale)}); hx.matmul_q uses the StableHLO lowering on CPU "
         "until it is rebuilt: pip install -e . (or reinstall hxmlir)")
    return off(f"the extension hxmlir._matmul_q_cpu is older than this hxmlir (lacks "
               f"{', '.join(stale)}); rebuild it: pip install -e . (or reinstall hxmlir)")
  supported = tuple(ext.supported_isas())
  if want:
    if unknown or want.strip().lower() not in supported:
      if not unknown:
        warn(f"${ISA_ENV}={want!r}, but this CPU and build run only {', '.join(supported)}; "
             "hx.matmul_q uses the StableHLO lowering on CPU (set one of those, or unset "
             f"${ISA_ENV} for the best of them)")
      return off(f"${ISA_ENV}={want}, but this CPU and build run only "
                 f"{', '.join(supported)}", supported)
    isa, why = want.strip().lower(), f"forced by ${ISA_ENV}"
  else:
    best = [i for i in DEFAULT_ISAS if i in supported]
    if not best:
      return off("this CPU has neither AVX-512 nor AVX2 (the portable kernel runs only "
                 f"with ${ISA_ENV}=generic)", supported)
    isa, why = best[0], "the best ISA this CPU runs"
  ext.select_isa(isa)
  ext.set_linger_us(_linger_us(warn))
  jax.ffi.register_ffi_target(TARGET, ext.handler(), platform="cpu", api_version=1)
  jax.ffi.register_ffi_target(TARGET_V2, ext.handler_v2(), platform="cpu", api_version=1)
  jax.ffi.register_ffi_target(TARGET_V3, ext.handler_v3(), platform="cpu", api_version=1)
  jax.ffi.register_ffi_target(TARGET_V4, ext.handler_v4(), platform="cpu", api_version=1)
  jax.ffi.register_ffi_target(TARGET_I8X, ext.handler_i8x_v1(), platform="cpu", api_version=1)
  jax.ffi.register_ffi_target(TARGET_NKT, ext.handler_nkt_v1(), platform="cpu", api_version=1)
  jax.ffi.register_ffi_target(TARGET_I8X_V2, ext.handler_i8x_v2(), platform="cpu",
                              api_version=1)
  return CpuKernelInfo(True, isa, TARGET, why, supported, ext.max_threads())


def _linger_us(warn) -> int:
  """``$HXMLIR_CPU_LINGER_US`` as :data:`LINGER_ENV` says (``warn``: the UserWarning)."""
  raw = os.environ.get(LINGER_ENV, "").strip()
  if not raw:
    return LINGER_DEFAULT_US
  try:
    us = int(raw)
  except ValueError:
    warn(f"${LINGER_ENV}={raw!r} is not an integer number of microseconds; the native "
         f"kernels' helper threads linger {LINGER_DEFAULT_US} us")
    return LINGER_DEFAULT_US
  if not 0 <= us <= LINGER_MAX_US:
    clamped = min(max(us, 0), LINGER_MAX_US)
    warn(f"${LINGER_ENV}={raw!r} is outside [0, {LINGER_MAX_US}] microseconds; the native "
         f"kernels' helper threads linger {clamped} us")
    return clamped
  return us


EXTENSION_API = ("supported_isas", "select_isa", "handler", "handler_v2", "handler_v3",
                 "handler_v4", "handler_i8x_v1", "handler_nkt_v1", "handler_i8x_v2", "i8x_isa", "max_threads",
                 "set_linger_us", "linger_us")
"""What this module needs of the extension ``hxmlir._matmul_q_cpu``; one built from older
sources lacks some, and the kernel is then off (with a warning naming the rebuild), never
an import error."""

_INFO = _load()


def cpu_kernel_info() -> CpuKernelInfo:
  """Which path ``hx.matmul_q`` takes on CPU while hxmlir is installed, and why.

  Decided once, when hxmlir is imported (from ``$HXMLIR_DISABLE_NATIVE``,
  ``$HXMLIR_CPU_ISA``, the extension and the CPU's features). Without
  ``hx.install()`` the StableHLO lowering is used whatever this says.
  """
  return _INFO


_keep_native = _jax.ConfigState(
    "hxmlir_keep_native_cpu_calls", False,
    "Let jax.export lowerings keep hx.matmul_q's native CPU kernel (hx_matmul_q_cpu_v1/_v2).",
    include_in_jit_key=True, include_in_trace_context=True)


def keep_native_cpu_calls(keep: bool = True):
  """Context manager (or decorator): exports in this thread keep the native CPU kernel.

  ``with hx.installed(), hx.keep_native_cpu_calls(): exp = hxmlir.export.export(f)(...)``
  gives an artifact whose ``hx.matmul_q`` decompositions call the custom-call
  target ``hx_matmul_q_cpu_v1`` (int8 per row), ``hx_matmul_q_cpu_v2`` (other
  formats) or ``hx_matmul_q_cpu_v3`` (the ``[out, in]`` layout) instead of the portable StableHLO: it runs
  only in a process where hxmlir (with its kernel built and active) is
  imported, and ``hxmlir.export.deserialize`` says so otherwise. Effective
  only while hxmlir is installed, where the kernel is active
  (:func:`cpu_kernel_info`), and for the CPU lowering. Part of JAX's cache
  keys, like ``hx.installed``.
  """
  return _keep_native(bool(keep))


def _single_device(ctx) -> bool:
  # SPMD-partitioned modules (several devices, shard_map bodies) keep StableHLO:
  # XLA's partitioner knows nothing of the custom call's semantics.
  return getattr(ctx.module_context.axis_context, "num_devices", None) == 1


def use_native(ctx, installed: bool) -> bool:
  """Whether the CPU lowering rule of ``hx_matmul_q_p`` should call the kernel.

  ``ctx``: the rule's ``LoweringRuleContext``; ``installed``: whether hxmlir
  is installed for this lowering. See the module docstring for the policy.
  """
  if not (installed and _INFO.active and _single_device(ctx)):
    return False
  for_export = bool(getattr(ctx.module_context.lowering_parameters, "for_export", False))
  return not for_export or bool(_keep_native.value)


def matmul_q_native(x, q, s):
  """``(x * s[..., None, :]) @ f32(q)`` through the native kernel's custom call.

  ``x: f32[*b, m, k]``, ``q: i8[*b, k, n]``, ``s: f32[*b, k]`` -> ``f32[*b, m, n]``
  (JAX arrays or tracers; the shapes must already agree, as the lo primitive
  guarantees). Runs only where the target is registered (:func:`cpu_kernel_info`).
  """
  out = jax.ShapeDtypeStruct((*x.shape[:-1], q.shape[-1]), jnp.float32)
  return jax.ffi.ffi_call(TARGET, out)(x, q, s)


def matmul_q_native_v2(x, q, s):
  """``x @ dequantize(q, s)`` through the custom call ``hx_matmul_q_cpu_v2``, any format.

  ``x: f32[*b, m, k]``, ``q``: stored values of a format of :mod:`hxmlir.formats`
  (``i8[*b, k, n]``, ``ui8[*b, k, n // 2]`` for int4, ``f8E4M3FN[*b, k, n]``),
  ``s: f32[*b, k]`` (one scale per row) or ``f32[*b, k, n // g]`` (per group of ``g``)
  -> ``f32[*b, m, n]``. The format and group size are read from ``q``'s dtype and
  ``s``'s shape and passed as the call's ``dtype``/``layout``/``group_size``
  attributes. Raises ``TypeError`` naming the operand types when ``q``'s dtype is no
  format's or ``s``'s shape fits no group size; runs only where the target is
  registered (:func:`cpu_kernel_info`).
  """
  fmt = formats.of_storage(q.dtype)
  dense = None if fmt is None else fmt.dense_shape(q.shape)
  group = None if fmt is None else formats.group_of(dense, s.shape)
  if fmt is None or isinstance(group, str):
    raise TypeError(f"hx_matmul_q_cpu_v2: no quantization format for values {q.dtype}"
                    f"{list(q.shape)} with scales {s.dtype}{list(s.shape)}"
                    + ("" if fmt is None else f": {group}") + "; it takes "
                    + formats.components_text("*b, k", where=lambda f: "kn" in f.native_cpu))
  out = jax.ShapeDtypeStruct((*x.shape[:-1], dense[-1]), jnp.float32)
  return jax.ffi.ffi_call(TARGET_V2, out)(x, q, s, dtype=fmt.name, layout=fmt.layout,
                                          group_size=np.int64(formats.group_attribute(group)))


def _value_weight_nk(target: str, q, s, o):
  """The value format (not a block one), dense shape ``[n, k]`` and group of a weight
  ``W[n, k]`` quantized along ``k`` from its components ``q``, ``s``, ``o``; ``TypeError``
  prefixed with ``target`` and naming the operand types when no format has them or ``s``'s
  shape fits no group size."""
  fmt = formats.of_components(q.dtype, s.dtype, o is not None)
  dense = None if fmt is None or fmt.block or q.ndim != 2 else fmt.dense_shape(q.shape)
  group = None if dense is None else formats.group_of(dense, s.shape)
  if dense is None or isinstance(group, str):
    offs = "" if o is None else f" and offsets {o.dtype}{list(o.shape)}"
    raise TypeError(f"{target}: no quantization format of a weight [n, k] for values "
                    f"{q.dtype}{list(q.shape)} with scales {s.dtype}{list(s.shape)}{offs}"
                    + ("" if not isinstance(group, str) else f": {group}") + "; it takes "
                    + formats.components_text("n", where=lambda f: "nk" in f.native_cpu, axis="k"))
  return fmt, dense, group


def matmul_q_native_v3(x, q, s, o=None, *, target: str = TARGET_V3):
  """``x @ dequantize(q, s, o).T`` through the custom call ``hx_matmul_q_cpu_v3``: the
  checkpoint layout ``[out, in]``, any format.

  ``x: f32[*b, k]``; ``q``: stored values of a weight ``W[n, k]`` quantized along ``k``
  (``i8[n, k]``, ``ui8[n, k // 2]`` for int4 and uint4 pairs, ``f8E4M3FN[n, k]``);
  ``s: f32/f16[n]`` (one scale per row of ``W``) or ``[n, k // g]`` (per group of ``g``);
  ``o``: the offsets, like ``s``, for the offset formats, else ``None`` ->
  ``f32[*b, n]``, ``y[..., j] = sum_i x[..., i] * (q[j, i] * s[j, i // g] + o[j, i // g])``.
  The format (:func:`hxmlir.formats.of_components`) and group size are read from the
  operands and passed as the call's ``dtype``/``layout``/``group_size``/``scale_dtype``/
  ``offset`` attributes. Raises ``TypeError`` naming the operand types when no format has
  these components or ``s``'s shape fits no group size; runs only where the target is
  registered (:func:`cpu_kernel_info`). ``target``: the custom call (:data:`TARGET_V3`, or
  :data:`TARGET_I8X`: :func:`matmul_q_native_i8x`).
  """
  fmt, dense, group = _value_weight_nk(target, q, s, o)
  out = jax.ShapeDtypeStruct((*x.shape[:-1], dense[0]), jnp.float32)
  operands = (x, q, s) if o is None else (x, q, s, o)
  return jax.ffi.ffi_call(target, out)(
      *operands, dtype=fmt.value_dtype.name, layout=fmt.layout,
      group_size=np.int64(formats.group_attribute(group)), scale_dtype=fmt.scale_mlir,
      offset=bool(fmt.offset))


def matmul_q_native_v4(x, q, s, o=None, *, target: str = TARGET_V4):
  """``x @ dequantize(q, s, o).T`` through the custom call ``hx_matmul_q_cpu_v4``: a GGUF
  block format (``Format.block``: Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS) in the checkpoint
  layout ``[out, in]``.

  ``x: f32[*b, k]``; ``q: ui16[n, k // B, words]`` (the blocks' bytes), ``s: f16[n, k // B]``
  (each block's ``d``), ``o``: ``f16[n, k // B]`` (``dmin``, or Q5_1's ``m``) for the formats
  with an offset, else ``None`` -> ``f32[*b, n]``, the dot of ``x`` with each row of the
  weight decoded as llama.cpp's ``dequantize_row_*`` decodes it (``csrc/formats/gguf_blocks.inc``).
  The format is read from the operands and passed as the attributes ``dtype`` (its name),
  ``layout``, ``group_size`` (``B``), ``scale_dtype`` (``f16``) and ``offset``. Raises
  ``TypeError`` naming the operand types when they are no block format's [n, k] weight;
  runs only where the target is registered (:func:`cpu_kernel_info`). ``target``: the
  custom call (:data:`TARGET_I8X_V2` takes the same operands: :func:`matmul_q_native_i8x_v2`).
  """
  fmt = formats.of_components(q.dtype, s.dtype, o is not None, q.shape)
  if fmt is None or not fmt.block or q.ndim != 3 or s.shape != q.shape[:2]:
    offs = "" if o is None else f" and offsets {o.dtype}{list(o.shape)}"
    raise TypeError(f"{target}: no block format of a weight [n, k] for values "
                    f"{q.dtype}{list(q.shape)} with scales {s.dtype}{list(s.shape)}{offs}; it "
                    "takes ui16[n, k / B, words] with f16[n, k / B] scales (and offsets) of "
                    + ", ".join(f.name for f in formats.FORMATS.values() if f.block))
  n, k = fmt.dense_shape(q.shape)
  out = jax.ShapeDtypeStruct((*x.shape[:-1], n), jnp.float32)
  operands = (x, q, s) if o is None else (x, q, s, o)
  return jax.ffi.ffi_call(target, out)(
      *operands, dtype=fmt.name, layout=fmt.layout, group_size=np.int64(fmt.block),
      scale_dtype="f16", offset=bool(fmt.offset))


def matmul_q_native_nkt(x, q, s, o=None):
  """``x @ dequantize(q, s, o)`` through the custom call ``hx_matmul_q_cpu_nkt_v1``: the
  transposed product of the checkpoint layout ``[out, in]`` (the backward in ``x`` of
  :func:`matmul_q_native_v3` and :func:`matmul_q_native_v4`), any format they take.

  ``x: f32[*b, n]``; ``q``, ``s``, ``o``: a weight ``W[n, k]`` quantized along ``k``, as
  :func:`matmul_q_native_v3` (a value format) or :func:`matmul_q_native_v4` (a GGUF block
  format) take it -> ``f32[*b, k]``, ``y[..., i] = sum_j x[..., j] * w[j, i]`` with ``w`` the
  weight decoded as ``hx.dequantize`` decodes it. Raises ``TypeError`` naming the operand
  types when no format has these components; runs only where the target is registered
  (:func:`cpu_kernel_info`).
  """
  fmt = formats.of_components(q.dtype, s.dtype, o is not None, q.shape)
  if fmt is not None and fmt.block and q.ndim == 3 and s.shape == q.shape[:2]:
    attrs = dict(dtype=fmt.name, group_size=np.int64(fmt.block))
  else:
    fmt, _, group = _value_weight_nk(TARGET_NKT, q, s, o)
    attrs = dict(dtype=fmt.value_dtype.name, group_size=np.int64(formats.group_attribute(group)))
  n, k = fmt.dense_shape(q.shape)
  out = jax.ShapeDtypeStruct((*x.shape[:-1], k), jnp.float32)
  operands = (x, q, s) if o is None else (x, q, s, o)
  return jax.ffi.ffi_call(TARGET_NKT, out)(*operands, layout=fmt.layout,
                                           scale_dtype=fmt.scale_mlir, offset=bool(fmt.offset),
                                           **attrs)


I8X_DTYPES = ("int8", "int4", "uint4")
"""The weights' value dtypes :data:`TARGET_I8X` takes."""
I8X_MAX_BLOCK = 65536
"""The largest block of ``x`` (the weight's group) :data:`TARGET_I8X` takes (int32 sums)."""
I8X_MIN_ROWS = 16
"""The fewest rows of ``x`` (its leading dims' product) a call of :data:`TARGET_I8X` is
chosen for where ``x``'s block is not 32 (groups of ``g`` not a multiple of 32): the
kernel then lays the weight out into its super-blocks on every call, which at few rows
(decode, ``m = 1``: the weight's bytes dominate) costs more than the f32-activation kernel.
With blocks of 32 (one scale per row, ``g`` a multiple of 32: every GGUF legacy format)
every call takes it, decode included: for ``x`` of at most 16 rows the kernel reads the
weight in place (its row path, ``csrc/matmul_q_i8x.h``: at ``m = 1`` 1.6-1.9x the
f32-activation kernel's speed on SmolLM2-135M's projections, Zen 4 with AVX-512 VNNI)."""


def i8x_takes(fmt: formats.Format, group: int | None, rows: int = I8X_MIN_ROWS) -> bool:
  """Whether :data:`TARGET_I8X` is chosen for weights of format ``fmt`` with groups of
  ``group`` along ``k`` (``None``: one scale per row) and ``x`` of ``rows`` rows: int8,
  int4 or uint4 values, a block of at most :data:`I8X_MAX_BLOCK`, and ``x``'s block 32
  (any ``rows``) or ``rows`` at least :data:`I8X_MIN_ROWS`."""
  block = 32 if group is None or group % 32 == 0 else group
  return (fmt.value_dtype.name in I8X_DTYPES and (group or 32) <= I8X_MAX_BLOCK
          and (block == 32 or rows >= I8X_MIN_ROWS))


def matmul_q_native_i8x(x, q, s, o=None):
  """:func:`matmul_q_native_v3` with integer activations: the custom call
  ``hx_matmul_q_cpu_i8x_v1`` (``csrc/matmul_q_i8x.h``). ``x: f32[*b, k]`` is quantized at
  run time to int8 per block of ``B`` along ``k`` (``B = 32`` for weights with one scale
  per row or groups of a multiple of 32, else the group size): ``s_x = amax / 127``,
  ``qx = round(x / s_x)``; then ``y[..., j] = sum (s_x qx) (q s + o)`` with exact int32
  dot products per block. Weights int8, int4, uint4 (:func:`i8x_takes`); operands and
  errors as :func:`matmul_q_native_v3`'s.
  """
  return matmul_q_native_v3(x, q, s, o, target=TARGET_I8X)


def matmul_q_native_i8x_v2(x, q, s, o=None):
  """:func:`matmul_q_native_v4` with integer activations: the custom call
  ``hx_matmul_q_cpu_i8x_v2`` (``csrc/matmul_q_i8x_blocks.h``), a GGUF block format's weight
  ``[n, k]`` (operands and errors as :func:`matmul_q_native_v4`'s). ``x: f32[*b, k]`` is
  quantized at run time to int8 per block of 32 along ``k`` (``s_x = amax / 127``, ``qx =
  round(x / s_x)``, as ``hx_matmul_q_cpu_i8x_v1``); then ``y[..., j] = sum_s fl(sc_s s_x) D_s
  - fl(mn_s s_x) Sq_s`` over the weight's sub-blocks ``s`` (``D_s``: the exact integer dot of
  the sub-block's integers with ``qx``, ``Sq_s``: the sum of its ``qx``) in f32.
  """
  return matmul_q_native_v4(x, q, s, o, target=TARGET_I8X_V2)


def native_call_problem(call_targets: Iterable[str]) -> str | None:
  """Why this process cannot run a module calling ``call_targets``, or ``None``.

  Looks only at this kernel's family of targets (``hx_matmul_q_cpu_v<N>``): a
  version this hxmlir does not have (it has :data:`TARGETS`), or the kernel
  inactive here (with :func:`cpu_kernel_info`'s reason). Used by
  ``hxmlir.export.deserialize``.
  """
  needed = sorted({t for t in call_targets
                   if t.startswith((f"{KERNEL_NAME}_v", f"{KERNEL_NAME}_i8x_v",
                                      f"{KERNEL_NAME}_nkt_v"))})
  if not needed:
    return None
  other = [t for t in needed if t not in TARGETS]
  if other:
    return (f"it calls the native CPU kernel {', '.join(other)}, which this hxmlir does not "
            f"have (it has {', '.join(TARGETS)}): upgrade hxmlir, or re-export without "
            "hx.keep_native_cpu_calls()")
  if not _INFO.active:
    return (f"it calls the native CPU kernel {', '.join(needed)} (exported with "
            f"hx.keep_native_cpu_calls()), which is not available in this process: "
            f"{_INFO.reason}; re-export without hx.keep_native_cpu_calls() for a portable "
            "artifact")
  return None


# --- the CPU lowering rule of hx_matmul_q_p -----------------------------------

def _collapsed(native):
  """``native`` (a kernel call on ``f32[m, k] x Q[k, n]``) on ``f32[..., k] x Q[k, n]``:
  ``x``'s leading dims collapsed into ``m`` (free: row-major) and restored on the result."""
  def call(x, q, s):
    y = native(x.reshape(-1, x.shape[-1]), q, s)
    return y.reshape(*x.shape[:-1], y.shape[-1])
  return call


def _kernel_layout(x_aval, q_aval, dims, dense_ndim: int | None = None) -> str | None:
  """``"batched"`` (version 1's dims: ``f32[*b, m, k] x Q[*b, k, n]``), ``"collapsed"``
  (``f32[..., k] x Q[k, n]``), ``"nk"`` (the checkpoint layout ``f32[..., k] x W[n, k]``,
  ``"...k,nk->...n"``: ``hx_matmul_q_cpu_v3``), or ``None``: the layouts the native kernels
  and the int8 streaming builders know. ``dense_ndim``: the dense weight's rank where it is
  not the stored values' (a block format's values have a block axis more)."""
  if dense_ndim is not None and dense_ndim != q_aval.ndim:
    if dense_ndim == 2 and x_aval.ndim >= 1 and dims == (((x_aval.ndim - 1,), (1,)), ((), ())):
      return "nk"
    return None
  if x_aval.ndim == q_aval.ndim and dims == dotdims.v1_dims(x_aval.ndim):
    return "batched"
  if q_aval.ndim == 2 and dims == dotdims.matmul_dims(x_aval.ndim, 2):
    return "collapsed"
  if q_aval.ndim == 2 and x_aval.ndim >= 1 and dims == (((x_aval.ndim - 1,), (1,)), ((), ())):
    return "nk"
  return None


def _transposed_nk(x_aval, dense: tuple[int, ...], dims) -> bool:
  """Whether ``dims`` contract ``x``'s last axis with the first of a dense weight ``[n, k]``
  (``"...n,nk->...k"``: the transpose of the checkpoint layout, ``hx_matmul_q_cpu_nkt_v1``)."""
  return len(dense) == 2 and x_aval.ndim >= 1 and dims == (((x_aval.ndim - 1,), (0,)), ((), ()))


def _nk_kernel(fmt: formats.Format, dense: tuple[int, int], s_aval, rows: int):
  """The native call of the checkpoint layout for weights of ``fmt`` (dense ``[n, k]``,
  scales ``s_aval``) and ``x`` of ``rows`` rows: ``hx_matmul_q_cpu_i8x_v1`` (integer
  activations) where the setting opted in (``hx.install(activations="int8")``) and
  :func:`i8x_takes` (the format; ``x``'s block 32, or ``rows`` at least ``I8X_MIN_ROWS``), else
  ``hx_matmul_q_cpu_v3``."""
  group = formats.group_of_scale(dense, s_aval)
  if int8_activations() and i8x_takes(fmt, group, rows):
    return matmul_q_native_i8x
  return matmul_q_native_v3


def _block_kernel():
  """The native call of the checkpoint layout for a GGUF block format's weight:
  ``hx_matmul_q_cpu_i8x_v2`` (integer activations) where the setting opted in
  (``hx.install(activations="int8")``), else ``hx_matmul_q_cpu_v4``."""
  return matmul_q_native_i8x_v2 if int8_activations() else matmul_q_native_v4


def lower_matmul_q_cpu(ctx, x: ir.Value, q: ir.Value, s: ir.Value, *o: ir.Value,
                       dimension_numbers=None) -> list[ir.Value]:
  """CPU lowering rule of ``hx_matmul_q_p``: ``hx.matmul_q`` with a CPU decomposition.

  The composite (name, version, attributes, shardings) is exactly the one the
  default rule emits; only its decomposition differs:

  - native kernel: for weights of more than ``streaming.SMALL_WEIGHT`` elements (per batch
    element, dense), while hxmlir is installed and the native kernel is active
    (:func:`use_native`: not for ``jax.export`` unless
    ``hx.keep_native_cpu_calls()``, one device only), in the layouts
    ``f32[*b, m, k] x Q[*b, k, n]`` (version 1's dims) and ``f32[..., k] x Q[k, n]``
    (leading dims collapsed into ``m``): a call of ``hx_matmul_q_cpu_v1`` for int8
    with one scale per row, of ``hx_matmul_q_cpu_v2`` for every other format
    (:mod:`hxmlir.formats`);
  - otherwise, int8 per row: :func:`~hxmlir.lowering.matmul_q.streaming.build_matmul_q_streaming`
    in those two layouts (:func:`~hxmlir.lowering.matmul_q.streaming.collapsed_streaming_decomposition`
    for the second), the reference itself when
    :func:`~hxmlir.lowering.matmul_q.streaming.choose_blocking` picks ``"whole"`` (small weights);
  - every other layout, and other formats than int8 per row outside the native
    kernel: one free axis of the dense weight walked in blocks of whole groups and
    packed bytes (``lowering/matmul_q/blocked.py``), or the reference when small;
  - formats the native kernel does not take in these layouts (``"kn"`` not in
    ``Format.native_cpu``: f16 scales,
    offsets ``o``): the blocked path (or the reference when small) in every layout
    but the next;
  - the checkpoint layout ``f32[..., k] x W[n, k]`` (``"...k,nk->...n"``, quantized along
    ``k``), every format with ``"nk"`` in ``Format.native_cpu``: a call of ``hx_matmul_q_cpu_v3``
    (``hx_matmul_q_cpu_v4`` for GGUF's block formats, ``hx_matmul_q_cpu_i8x_v2`` for them
    where ``hx.install(activations="int8")`` opted in) under the same policy and size bound
    (``hx_matmul_q_cpu_i8x_v1``, integer activations,
    for int8/int4/uint4 values and ``x``'s block of 32 (any number of rows: decode and
    prefill) or ``x`` of at least ``I8X_MIN_ROWS`` rows where
    ``hx.install(activations="int8")`` opted in), else the blocked path;
  - its transpose ``f32[..., n] x W[n, k]`` (``"...n,nk->...k"``: the backward of the
    checkpoint layout in ``x``, :meth:`hxmlir.types.qarray_prims.MatmulQ.transpose`) for the
    formats with ``"nk"`` but not ``"kn"`` in ``Format.native_cpu`` (f16 scales, offsets,
    uint4, GGUF's block formats): a call of ``hx_matmul_q_cpu_nkt_v1`` under the same policy
    and size bound (the other formats' take ``hx_matmul_q_cpu_v1`` / ``_v2`` there, as for
    any ``f32[..., k] x Q[k, n]``), else the blocked path.
  """
  x_aval, q_aval, s_aval, *_ = ctx.avals_in
  fmt = default.weight_format(ctx)
  dims = dimension_numbers or dotdims.v1_dims(x_aval.ndim)
  if _kernel_layout(x_aval, q_aval, dims, len(fmt.dense_shape(q_aval.shape))) == "nk":
    n, k = fmt.dense_shape(q_aval.shape)
    if "nk" in fmt.native_cpu and k * n > streaming.SMALL_WEIGHT and use_native(ctx, use_kernels()):
      kernel = _block_kernel() if fmt.block else _nk_kernel(
          fmt, (n, k), s_aval, int(np.prod(x_aval.shape[:-1])))
      return lower_composite(ctx, "hx.matmul_q", x, q, s, *o, reference=kernel,
                             attributes=default.matmul_q_attributes(ctx, dims))
    return _lower_blocked(ctx, (x, q, s, *o), dims)
  if _transposed_nk(x_aval, fmt.dense_shape(q_aval.shape), dims) and "kn" not in fmt.native_cpu:
    n, k = fmt.dense_shape(q_aval.shape)
    if "nk" in fmt.native_cpu and k * n > streaming.SMALL_WEIGHT and use_native(ctx, use_kernels()):
      return lower_composite(ctx, "hx.matmul_q", x, q, s, *o, reference=matmul_q_native_nkt,
                             attributes=default.matmul_q_attributes(ctx, dims))
  if "kn" not in fmt.native_cpu:
    return _lower_blocked(ctx, (x, q, s, *o), dims)
  attrs = default.matmul_q_attributes(ctx, dims)
  ref = reference.matmul_q_for(dims)
  dense = fmt.dense_shape(q_aval.shape)
  per_row_int8 = fmt is formats.INT8 and s_aval.ndim == q_aval.ndim - 1
  layout = _kernel_layout(x_aval, q_aval, dims)
  k, n = dense[-2] if layout else 0, dense[-1]
  if layout and k * n > streaming.SMALL_WEIGHT and use_native(ctx, use_kernels()):
    native = matmul_q_native if per_row_int8 else matmul_q_native_v2
    native = native if layout == "batched" else _collapsed(native)
    return lower_composite(ctx, "hx.matmul_q", x, q, s, reference=native, attributes=attrs)
  if not per_row_int8 or layout is None:
    return _lower_blocked(ctx, (x, q, s, *o), dims)
  if layout == "batched":
    m, builder = x_aval.shape[-2], streaming.streaming_decomposition
  else:
    m = int(np.prod(x_aval.shape[:-1], dtype=np.int64))
    builder = streaming.collapsed_streaming_decomposition
  if streaming.choose_blocking(m, k, n)[0] == "whole":
    return lower_composite(ctx, "hx.matmul_q", x, q, s, reference=ref, attributes=attrs)
  return lower_composite(ctx, "hx.matmul_q", x, q, s, builder=builder, attributes=attrs)


def _lower_blocked(ctx, operands, dims) -> list[ir.Value]:
  """``hx.matmul_q`` whose decomposition walks a free axis of the dense weight in blocks of
  whole groups and packed bytes (``lowering/matmul_q/blocked.py``), or the reference
  when the weight is small: the CPU rule for the formats without a native kernel."""
  _, q_aval, s_aval, *o_aval = ctx.avals_in
  fmt = default.weight_format(ctx)
  dense = fmt.dense_shape(q_aval.shape)
  ref = reference.matmul_q_for(dims, bool(o_aval))
  axis = blocked.block_axis(dense, dims)
  if axis is not None:
    align = blocked.alignment(dense, axis, fmt, formats.group_of_scale(dense, s_aval))
    ref = blocked.blocked_for(dims, axis, blocked.block_size(dense, axis, align))
  return lower_composite(ctx, "hx.matmul_q", *operands, reference=ref,
                         attributes=default.matmul_q_attributes(ctx, dims))

