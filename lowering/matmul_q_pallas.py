"""A Pallas kernel for ``hx.matmul_q`` that reads int8 weight tiles and scales directly.

``y = (x * s[..., None, :]) @ q`` for ``x: f32[*b, m, k]``, ``q: i8[*b, k, n]``,
``s: f32[*b, k]`` -> ``f32[*b, m, n]``. One kernel body, written once, lowered
by Pallas for

- TPU: Mosaic, custom call ``tpu_custom_call`` (``kernel_name`` attribute),
- GPU: Triton, custom call ``__gpu$xla.gpu.triton`` (``name`` in its backend
  config), with the Triton compiler parameters given explicitly,
- any platform: Pallas interpret mode (``interpret=True``) runs either flavour
  (with the Triton flavour's masked loads) as plain XLA, which is how the
  kernel is tested on CPU.

Its kernel name is ``hx_matmul_q_v1`` (:data:`KERNEL_VERSION`), registered in
:mod:`hxmlir.targets` for ``cuda``, ``rocm`` (Triton) and ``tpu`` (Mosaic), so
``jax.export`` accepts it once ``hx.install()`` has run. The platform-specific
lowering rules of ``hx_matmul_q_p`` for ``cuda``, ``rocm`` and ``tpu`` use the
kernel as the ``hx.matmul_q`` composite's decomposition while hxmlir is
installed (:func:`hxmlir.install_state.is_installed`, part of JAX's cache keys);
otherwise they emit the default composite with the reference decomposition.

The kernel. Grid ``(batch, cdiv(m, block_m), cdiv(n, block_n))``, all
parallel. Each program holds one ``block_m x block_n`` output tile in
registers (GPU) or vector memory (TPU) and walks the contraction axis in
chunks of ``block_k``: it loads a ``block_k x block_n`` int8 tile of ``q``,
converts it to f32, multiplies it with the scaled ``x`` chunk
(``x * s``, ``block_m x block_k``) and accumulates (f32 dot at
``Precision.HIGHEST``). The dequantized weight exists only one tile at a time.
Weight bytes are read once per row block of ``x``: at decode shapes
(``m <= block_m``) exactly once, so the kernel is meant to be bound by int8
bandwidth. Not yet measured on a GPU or TPU (``benchmarks/matmul_q_gpu.py``
does that): the exact-f32 dot runs on CUDA cores rather than tensor cores,
Triton's ``tl.dot`` pads decode rows to 16, and ``n / block_n`` programs may
leave SMs idle at ``m = 1`` (a split over ``k`` would need a new kernel
version, since it changes the custom call's result).

Ragged shapes. ``x`` and ``s`` (small: ``m * k`` and ``k`` elements) are
zero-padded to whole blocks (``m`` to ``block_m``, ``k`` to ``block_k``) and the
result is padded to whole ``block_n`` columns and sliced back; the weight is
never copied. Weight tiles past the array's end are masked on GPU (Triton
loads with ``mask``/``other=0``); on TPU the Mosaic pipeline copies the valid
part of an edge block and the rest of the tile is stale int8 data -- finite, and
multiplied by the zero padding of ``x * s``, so it adds exact zeros (Pallas'
documented edge-block behaviour; checked here in interpret mode only).

Why over int8 and scale refs, not a ``q8`` ref (which ``pl.pallas_call``
accepts, see :mod:`hxmlir.pallas`): the kernel pads the scales (never the
weight) so stale rows of an edge weight tile meet zeros, masks its Triton
loads on the int8 component, and its operands ``(x, s[b, 1, kp], q)`` are the
calling convention of the registered ``hx_matmul_q_v1`` and of its back-compat
artifacts. A ``q8`` of padded scales and unpadded values is not a type, and a
``q8`` operand would change the custom call (a new kernel version).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.interpreters import mlir

from hxmlir import _jax, dotdims, formats, targets
from hxmlir.install_state import is_installed
from hxmlir.lowering import reference, rules, schema
from hxmlir.lowering.composite import lower_composite
from hxmlir.lowering.primitives import hx_matmul_q_p, hx_quantize_p

KERNEL_NAME = "hx_matmul_q"
KERNEL_VERSION = 1
"""Bump when the kernel's semantics or calling convention change (and add back-compat cases)."""

TRITON_KERNEL = targets.register_kernel(targets.TRITON, KERNEL_NAME, KERNEL_VERSION,
                                        ("cuda", "rocm"), owner="hxmlir")
MOSAIC_TPU_KERNEL = targets.register_kernel(targets.MOSAIC_TPU, KERNEL_NAME, KERNEL_VERSION,
                                            ("tpu",), owner="hxmlir")
assert TRITON_KERNEL.ir_name == MOSAIC_TPU_KERNEL.ir_name == f"{KERNEL_NAME}_v{KERNEL_VERSION}"

BACKENDS = ("triton", "mosaic_tpu")
_PLATFORM_BACKEND = {"cuda": "triton", "rocm": "triton", "tpu": "mosaic_tpu"}

TRITON_NUM_WARPS = 4
TRITON_NUM_STAGES = 3
"""Triton compiler parameters, passed explicitly (Pallas' defaults could change)."""


def _compiler_params(backend: str):
  """The Pallas compiler parameters of ``backend`` (they also select Pallas' lowering)."""
  if backend == "triton":
    from jax.experimental.pallas import triton as pltriton
    return pltriton.CompilerParams(num_warps=TRITON_NUM_WARPS, num_stages=TRITON_NUM_STAGES)
  from jax.experimental.pallas import tpu as pltpu
  return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"))


def _round_up(v: int, mult: int) -> int:
  return -(-v // mult) * mult


def _pow2_at_least(v: int) -> int:
  p = 1
  while p < v:
    p *= 2
  return p


def default_blocks(m: int, k: int, n: int, backend: str) -> tuple[int, int, int]:
  """``(block_m, block_n, block_k)`` for ``x: f32[m, k]``, ``q: i8[k, n]`` on ``backend``.

  Decode shapes (small ``m``) take one row block so the weight is read once;
  ``block_n = 128`` columns (TPU lane width; on GPU 128 int8 columns are one
  128-byte line per row) and ``block_k = 128`` (TPU: int8 sublane tiles of 32
  rows divide it). Triton needs powers of two and at least 16 rows for
  ``tl.dot``; Mosaic needs ``block_m`` a multiple of 8.
  """
  if backend == "triton":
    return min(64, max(16, _pow2_at_least(m))), 128, 128
  return min(128, _round_up(max(m, 1), 8)), 128, 128


def _kernel(x_ref, s_ref, q_ref, o_ref, *, k: int, n: int, block_k: int, masked: bool):
  """One ``block_m x block_n`` output tile: ``o = (x * s) @ f32(q)`` over chunks of ``block_k``.

  ``x_ref: f32[block_m, kp]``, ``s_ref: f32[1, kp]`` (``kp`` = ``k`` rounded up
  to ``block_k``, zero-padded), ``q_ref: i8[kp, block_n]`` (rows ``>= k`` and
  columns ``>= n`` lie past the array: masked when ``masked``),
  ``o_ref: f32[block_m, block_n]``.
  """
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as pltriton
  block_m, kp = x_ref.shape
  block_n = o_ref.shape[-1]
  col0 = pl.program_id(2) * block_n

  def step(t, acc):
    k0 = pl.multiple_of(t * block_k, block_k)
    ks = pl.ds(k0, block_k)
    xs = x_ref[:, ks] * s_ref[:, ks]
    if masked:
      rows = k0 + lax.broadcasted_iota(jnp.int32, (block_k, block_n), 0)
      cols = col0 + lax.broadcasted_iota(jnp.int32, (block_k, block_n), 1)
      qt = pltriton.load(q_ref.at[ks, :], mask=(rows < k) & (cols < n), other=0)
    else:
      qt = q_ref[ks, :]
    return acc + jnp.dot(xs, qt.astype(jnp.float32), precision=lax.Precision.HIGHEST,
                         preferred_element_type=jnp.float32)

  acc = lax.fori_loop(0, kp // block_k, step, jnp.zeros((block_m, block_n), jnp.float32))
  o_ref[...] = acc


def matmul_q_pallas(x, q, s, *, backend: str, interpret: bool = False,
                    blocks: Sequence[int] | None = None):
  """``(x * s[..., None, :]) @ q`` with the Pallas kernel.

  ``x: f32[*b, m, k]``, ``q: i8[*b, k, n]``, ``s: f32[*b, k]`` -> ``f32[*b, m, n]``
  (JAX arrays or tracers). ``backend``: ``"triton"`` (GPU: masked weight
  loads, Triton compiler parameters) or ``"mosaic_tpu"`` (TPU). ``interpret``:
  run that flavour in Pallas interpret mode (any platform). ``blocks``:
  ``(block_m, block_n, block_k)``, default :func:`default_blocks`. The kernel
  is named ``hx_matmul_q_v1`` in the emitted custom call. Raises ``TypeError``
  naming the operand types when they are not those of ``hx.matmul_q``, and
  ``ValueError`` for an unknown backend or blocks Triton cannot take (not
  powers of two, or under 16).
  """
  if backend not in BACKENDS:
    raise ValueError(f"matmul_q_pallas: unknown backend {backend!r}; expected one of {BACKENDS}")
  x, q, s = (jnp.asarray(v) if not isinstance(v, jax.core.Tracer) else v for v in (x, q, s))
  types = ", ".join(jax.typeof(v).str_short(short_dtypes=True) for v in (x, q, s))
  if schema.SCHEMAS["hx.matmul_q"].check_operands([schema.TensorType.of(v) for v in (x, q, s)]):
    raise TypeError(f"matmul_q_pallas expects f32[*b, m, k], i8[*b, k, n], f32[*b, k], "
                    f"got {types}")
  *batch, m, k = x.shape
  n = q.shape[-1]
  block_m, block_n, block_k = blocks or default_blocks(m, k, n, backend)
  if backend == "triton" and any(b < 16 or b & (b - 1) for b in (block_m, block_n, block_k)):
    raise ValueError(f"matmul_q_pallas: Triton blocks must be powers of two >= 16, got "
                     f"(block_m, block_n, block_k) = {(block_m, block_n, block_k)}")
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  nb = 1
  for d in batch:
    nb *= d
  x3 = x.reshape(nb, m, k)
  q3 = q.reshape(nb, k, n)
  s3 = s.reshape(nb, 1, k)
  mp, kp, np_ = _round_up(m, block_m), _round_up(k, block_k), _round_up(n, block_n)
  x3 = jnp.pad(x3, ((0, 0), (0, mp - m), (0, kp - k)))
  s3 = jnp.pad(s3, ((0, 0), (0, 0), (0, kp - k)))
  sq = pl.squeezed
  kernel = functools.partial(_kernel, k=k, n=n, block_k=block_k, masked=backend == "triton")
  call = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((nb, mp, np_), jnp.float32),
      grid=(nb, mp // block_m, np_ // block_n),
      in_specs=[pl.BlockSpec((sq, block_m, kp), lambda b, i, j: (b, i, 0)),
                pl.BlockSpec((sq, 1, kp), lambda b, i, j: (b, 0, 0)),
                pl.BlockSpec((sq, kp, block_n), lambda b, i, j: (b, 0, j))],
      out_specs=pl.BlockSpec((sq, block_m, block_n), lambda b, i, j: (b, i, j)),
      compiler_params=None if interpret else _compiler_params(backend),
      interpret=interpret,
      name=TRITON_KERNEL.ir_name,
  )
  # lower_composite traces references under jax.disable_jit(), which would run
  # the kernel's fori_loop as a Python loop (unrolled, with constant offsets).
  with jax.disable_jit(False):
    y = call(x3, s3, q3)
  return y[:, :m, :n].reshape(*batch, m, n)


# --- lowering rules of hx_matmul_q_p for cuda, rocm and tpu ---------------------

def _pallas_reference(backend: str):
  # One function object per backend, so lower_composite shares decompositions.
  return _PALLAS_REFERENCES[backend]


_PALLAS_REFERENCES = {b: functools.partial(matmul_q_pallas, backend=b)
                      for b in ("triton", "mosaic_tpu")}


def lower_matmul_q_accelerator(ctx, x, q, s, *, platform: str, dimension_numbers=None):
  """``hx_matmul_q_p`` on ``cuda``/``rocm``/``tpu``: the Pallas kernel as decomposition.

  While hxmlir is installed the ``hx.matmul_q`` composite's decomposition calls
  the registered kernel (for version 1's layout ``f32[*b, m, k] x i8[*b, k, n]``;
  other dimension numbers keep the reference); otherwise it is the reference
  (what the default rule emits). The kernel takes int8 weights with per-row scales;
  int4, fp8 and group-scaled weights keep the reference on every accelerator (it
  unpacks int4 and applies group scales per group, :mod:`hxmlir.formats`).
  """
  x_aval, q_aval, s_aval = ctx.avals_in
  xr, qr = x_aval.ndim, q_aval.ndim
  dims = dimension_numbers or dotdims.v1_dims(xr)
  attrs = rules.matmul_q_attributes(ctx, dims)
  backend = _PLATFORM_BACKEND[platform]
  per_row_int8 = q_aval.dtype == jnp.int8 and s_aval.ndim == qr - 1
  if not per_row_int8:
    ref = reference.matmul_q_for(dims)  # int4, fp8, group scales: the reference
  elif is_installed() and xr == qr and dims == dotdims.v1_dims(xr):
    ref = _pallas_reference(backend)
  elif is_installed() and qr == 2 and dims == dotdims.matmul_dims(xr, 2):
    ref = _PALLAS_COLLAPSED[backend]  # f32[..., k] x i8[k, n]: leading dims into m
  else:
    ref = reference.matmul_q_for(dims)
  return lower_composite(ctx, "hx.matmul_q", x, q, s, reference=ref, attributes=attrs)


def _collapsed(x, q, s, *, backend: str):
  y = matmul_q_pallas(x.reshape(-1, x.shape[-1]), q, s, backend=backend)
  return y.reshape(*x.shape[:-1], q.shape[-1])


_PALLAS_COLLAPSED = {b: functools.partial(_collapsed, backend=b) for b in ("triton", "mosaic_tpu")}


for _platform in ("cuda", "rocm", "tpu"):
  mlir.register_lowering(hx_matmul_q_p,
                         functools.partial(lower_matmul_q_accelerator, platform=_platform),
                         platform=_platform)


# --- hxmlir's lo primitives inside Pallas kernels ------------------------------
# A kernel over hi refs (hxmlir.pallas) calls hx.dequantize, hx.matmul_q, ...:
# inside a Mosaic or Triton kernel each lo primitive lowers as its reference
# semantics, the composite's decomposition, written inline (Pallas has no
# composites). Registered with Pallas when a hi type first meets pallas_call.
def _quantize_in_kernel(x, fmt="int8", group_size=None, method="absmax",
                        round_half_even=jnp.round):
  """``reference.quantize`` in a kernel: no generic reduce there, and Triton's max drops NaN.

  ``amax`` is a max reduction of the (never empty) block, made NaN for rows (or groups)
  holding a NaN or an infinity (counted with a sum), which the reference turns into a
  NaN scale and zero values just as for its own ``amax``.
  """
  f = formats.lookup(fmt)
  xg = formats.split_groups(x, group_size)
  bad = jnp.sum(jnp.where(jnp.isfinite(xg), 0.0, 1.0), axis=-1) > 0
  amax = jnp.where(bad, jnp.nan, jnp.max(jnp.abs(xg), axis=-1))
  if method == "mse":
    amax = reference.mse_amax(xg, amax, f, round_half_even)
  q, s = reference.quantize_with_amax(xg, amax, round_half_even, f)
  return formats.store(q.reshape(x.shape), f), s


def _round_half_even_by_floor(v):
  """``round_half_even(v)`` for finite f32 ``|v| < 2**23`` with ``floor`` (Triton kernels have no ``round``).

  ``v - floor(v)`` is exact there; a fraction above 1/2 rounds up, exactly 1/2
  rounds to the even neighbour.
  """
  f = jnp.floor(v)
  frac = v - f
  odd = (f - 2 * jnp.floor(f * 0.5)) == 1
  return f + jnp.where((frac > 0.5) | ((frac == 0.5) & odd), 1.0, 0.0).astype(v.dtype)


for _prim, _ref in rules.REFERENCES.items():
  if _prim is hx_quantize_p:
    _jax.add_pallas_kernel_rule(
        _prim, _quantize_in_kernel,
        triton_fn=functools.partial(_quantize_in_kernel,
                                    round_half_even=_round_half_even_by_floor))
  else:
    _jax.add_pallas_kernel_rule(_prim, _ref)
