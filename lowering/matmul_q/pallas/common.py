"""What hxmlir's two Pallas ``hx.matmul_q`` kernels share: backends and their compiler
parameters, block arithmetic and checks, and the ``pl.pallas_call`` skeleton.

Both kernels (:mod:`.kn`, ``Q[k, n]``; :mod:`.nk`, ``W[n, k]``) take ``x: f32[*b, m, k]``,
collapse the batch dims into one grid axis, zero-pad ``x`` to whole ``block_m x block_k``
blocks, run the grid ``(batch, mp / block_m, np / block_n)`` (all parallel) with ``x``'s
row block and one output tile per program, and slice the result ``f32[B, mp, np]`` back to
``f32[*b, m, n]``; they differ in the weight's operands and their block specs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from hxmlir import formats

BACKENDS = ("triton", "mosaic_tpu")
PLATFORM_BACKEND = {"cuda": "triton", "rocm": "triton", "tpu": "mosaic_tpu"}

TRITON_NUM_WARPS = 4
TRITON_NUM_STAGES = 3
"""Triton compiler parameters, passed explicitly (Pallas' defaults could change)."""


def compiler_params(backend: str):
  """The Pallas compiler parameters of ``backend`` (they also select Pallas' lowering)."""
  if backend == "triton":
    from jax.experimental.pallas import triton as pltriton
    return pltriton.CompilerParams(num_warps=TRITON_NUM_WARPS, num_stages=TRITON_NUM_STAGES)
  from jax.experimental.pallas import tpu as pltpu
  return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"))


def round_up(v: int, mult: int) -> int:
  """``v`` rounded up to a multiple of ``mult`` (both positive ints): a padded extent."""
  return -(-v // mult) * mult


def pow2_at_least(v: int) -> int:
  """The smallest power of two ``>= v`` (1 for ``v <= 1``): a block size."""
  p = 1
  while p < v:
    p *= 2
  return p


MOSAIC_MAX_BLOCK_N = 2048
"""The widest tile :func:`default_blocks` takes on Mosaic to hold whole groups."""


def fits_group(block_n: int, group: int | None) -> bool:
  """Whether a ``block_n``-column tile holds whole groups of ``group`` or lies in one."""
  return group is None or block_n % group == 0 or group % block_n == 0


def mosaic_compiles(f: formats.Format, group: int | None) -> bool:
  """Whether Mosaic compiles the ``Q[k, n]`` and ``W[n, k]`` kernels (:mod:`.kn`, :mod:`.nk`)
  for weights of format ``f`` with ``group``, as seen on a TPU v5e with jax 0.10.2 (0.8.5):
  one value per byte (int8, fp8) with one f32 scale per row compiled and matched float64;
  int4 pairs did not (their in-register interleave, a reshape to ``[.., 1]``: "unsupported
  shape cast"), nor group scales (their lane slice at a traced offset: E2003, unproven
  alignment). Offsets and f16 scales per row were not tried. The lowering rules keep the
  reference decomposition on TPU for the rest; the block formats have their own kernel
  (:mod:`.nk_blocks`), which compiled for all of them."""
  return bool(f.block) or (f.pack == 1 and group is None and not f.offset
                           and f.scale_dtype == np.float32)


def check_backend(fn: str, backend: str) -> None:
  """``ValueError`` naming ``fn`` for a backend not in :data:`BACKENDS`."""
  if backend not in BACKENDS:
    raise ValueError(f"{fn}: unknown backend {backend!r}; expected one of {BACKENDS}")


def check_blocks(fn: str, backend: str, chosen: Sequence[int], axis: str, f: formats.Format,
                 group: int | None) -> None:
  """Checks ``chosen = (block_m, block_n, block_k)`` against ``backend`` and the weight's
  format ``f`` and ``group``: Triton's blocks are powers of two >= 16, and the tile's axis
  along the groups (``axis``: ``"n"`` or ``"k"``) holds whole groups or lies inside one, and
  whole stored bytes. Raises ``ValueError`` naming ``fn`` and the block otherwise."""
  if backend == "triton" and any(b < 16 or b & (b - 1) for b in chosen):
    raise ValueError(f"{fn}: Triton blocks must be powers of two >= 16, got "
                     f"(block_m, block_n, block_k) = {tuple(chosen)}")
  size = chosen[1] if axis == "n" else chosen[2]
  if not fits_group(size, group) or size % f.pack:
    raise ValueError(f"{fn}: block_{axis} = {size} must be a multiple or a divisor of the "
                     f"group size {group} (and a multiple of {f.pack} for {f.name})")


@dataclass(frozen=True)
class Grid:
  """The blocked problem: ``x: f32[*batch, m, k]``, ``n`` outputs, the blocks, and the padded
  sizes ``mp``, ``kp``, ``np_`` (whole blocks); ``nb``: the batch dims' product."""
  batch: tuple[int, ...]
  m: int
  k: int
  n: int
  block_m: int
  block_n: int
  block_k: int

  @property
  def nb(self) -> int:
    return math.prod(self.batch)

  @property
  def mp(self) -> int:
    return round_up(self.m, self.block_m)

  @property
  def kp(self) -> int:
    return round_up(self.k, self.block_k)

  @property
  def np_(self) -> int:
    return round_up(self.n, self.block_n)


def grid_of(x, n: int, blocks: Sequence[int]) -> Grid:
  """The :class:`Grid` of ``x: f32[*b, m, k]`` with ``n`` outputs in ``blocks``."""
  *batch, m, k = x.shape
  return Grid(tuple(batch), m, k, n, *blocks)


def linear_in_x(name: str, layout: str):
  """Decorator of a Pallas entry point ``fn(x, *weight, **options) -> f32[*b, m, n]`` that
  computes ``x @ W`` (``layout="kn"``, ``W = dequantize(*weight): [*b, k, n]``) or ``x @ Wᵀ``
  (``"nk"``, ``W: [*b, n, k]``; ``None`` components are dropped): under ``jax.jvp``,
  ``jax.grad`` and ``jax.vjp`` the result is differentiable in ``x``, its tangent ``dx @ W``
  formed by XLA from the dense weight (a ``pallas_call`` has no transpose); a derivative
  with respect to the weight's components raises ``TypeError`` naming ``name`` (those go
  through ``hx.matmul_q`` / ``hx.einsum`` on the quantized array). ``fn.__wrapped__`` is the
  undecorated entry (for another entry that dispatches to it)."""

  def deco(fn):
    @functools.wraps(fn)
    def wrapper(x, *weight, **options):
      parts = tuple(w for w in weight if w is not None)

      @jax.custom_jvp
      def call(x, *parts):
        return fn(x, *parts, **options)

      def jvp(primals, tangents):
        x, *parts = primals
        dx, *dparts = tangents
        if any(not isinstance(t, SymbolicZero) for t in dparts):
          raise TypeError(f"{name} is differentiable in x only; for derivatives with respect "
                          "to the weight use hx.matmul_q / hx.einsum on the quantized array")
        y = call(x, *parts)
        if isinstance(dx, SymbolicZero):
          return y, jnp.zeros(y.shape, y.dtype)
        from hxmlir.lowering import reference
        w = reference.dequantize(*parts)
        w = w if layout == "kn" else jnp.swapaxes(w, -1, -2)
        return y, jnp.matmul(dx, w, precision=jax.lax.Precision.HIGHEST)

      call.defjvp(jvp, symbolic_zeros=True)
      try:
        return call(x, *parts)
      except (TypeError, ValueError) as e:  # fn's own checks: without JAX's note on its frames
        notes = getattr(e, "__notes__", None)
        if notes:
          e.__notes__ = [n for n in notes if "JAX has removed its internal frames" not in n]
        raise
    return wrapper
  return deco


def empty_product(x, n: int):
  """``f32[*b, m, n]`` zeros when the product of ``x: f32[*b, m, k]`` with ``n`` outputs is
  empty or sums nothing (a zero among ``*b``, ``m``, ``n``, ``k``), else ``None``: the kernels'
  grids need at least one block of each."""
  if x.size == 0 or n == 0:
    return jnp.zeros((*x.shape[:-1], n), jnp.float32)
  return None


def table_lookup(v, table):
  """``f32``: ``table[v]`` for small ints ``v`` (a chain of selects: Mosaic has no gather, and
  a 16-entry table is cheaper so on Triton too); the non-linear 4-bit formats' values."""
  out = jnp.zeros(v.shape, jnp.float32)
  for i, t in enumerate(table):
    out = jnp.where(v == i, jnp.float32(t), out)
  return out


def block_weight_operands(g: Grid, q, d, dmin):
  """A block-format weight (``q: ui16[*b, n, k / B, W]``, ``d`` and ``dmin`` or ``None``:
  ``f16[*b, n, k / B]``) as kernel operands and their block specs over :func:`call_blocked`'s
  grid: the words ``ui16[nb, n, k / B * W]`` and ``d`` (``dmin``) widened to ``f32[nb, n, k /
  B]``, ``g.block_n`` whole rows of each per program."""
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  n, nblk, w = q.shape[-3:]
  row = lambda bi, i, j: (bi, j, 0)  # noqa: E731
  heads = [h.reshape(g.nb, n, nblk).astype(jnp.float32) for h in (d, dmin) if h is not None]
  specs = [pl.BlockSpec((pl.squeezed, g.block_n, nblk * w), row)] + \
      [pl.BlockSpec((pl.squeezed, g.block_n, nblk), row)] * len(heads)
  return [q.reshape(g.nb, n, nblk * w), *heads], specs


def padded_x(x, g: Grid):
  """``x: f32[*b, m, k]`` as ``f32[nb, mp, kp]``, zero-padded to whole blocks."""
  return jnp.pad(x.reshape(g.nb, g.m, g.k), ((0, 0), (0, g.mp - g.m), (0, g.kp - g.k)))


def call_blocked(kernel, g: Grid, x3, operands: Sequence, specs: Sequence, *, backend: str,
                 interpret: bool, name: str, x_spec=None):
  """``pl.pallas_call`` of ``kernel`` over ``(x3, *operands)``: ``x3 = padded_x(x, g)`` in
  row blocks of ``block_m`` (all of ``kp``; ``x_spec``: another block spec of ``x3``, a
  form of ``x`` of the kernel's own), ``operands`` in ``specs`` over the grid
  ``(nb, mp / block_m, np / block_n)``, one ``block_m x block_n`` output tile per program
  -> ``f32[*b, m, n]`` (the padding sliced away). ``name``: the custom call's kernel name."""
  from jax.experimental import pallas as pl  # imported late: it is slow to import
  sq = pl.squeezed
  x_spec = x_spec or pl.BlockSpec((sq, g.block_m, g.kp), lambda b, i, j: (b, i, 0))
  call = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((g.nb, g.mp, g.np_), jnp.float32),
      grid=(g.nb, g.mp // g.block_m, g.np_ // g.block_n),
      in_specs=[x_spec, *specs],
      out_specs=pl.BlockSpec((sq, g.block_m, g.block_n), lambda b, i, j: (b, i, j)),
      compiler_params=None if interpret else compiler_params(backend),
      interpret=interpret,
      name=name,
  )
  # lower_composite traces references under jax.disable_jit(), which would run
  # the kernel's fori_loop as a Python loop (unrolled, with constant offsets).
  with jax.disable_jit(False):
    y = call(x3, *operands)
  return y[:, :g.m, :g.n].reshape(*g.batch, g.m, g.n)
