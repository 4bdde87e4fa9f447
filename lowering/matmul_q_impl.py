"""Streaming StableHLO implementations of ``hx.matmul_q`` (no JAX tracing).

``y = (x * s[..., None, :]) @ q`` for ``x: f32[*b, m, k]``, ``q: i8[*b, k, n]``,
``s: f32[*b, k]``. XLA compiles the reference (``lowering/reference.py``) by
converting the whole weight to ``f32[*b, k, n]`` first: four times the int8
bytes in temporary memory, written and read back once more than a plain f32
matmul. The builders here convert a few rows or one block of the weight at
a time inside a ``stablehlo.while`` loop, so at most one block of dequantized
values is ever live, and the block is still in cache when the dot reads it.

Three schemes, chosen by :func:`choose_blocking` from measurements on a 2-core
x86 CPU (``benchmarks/matmul_q_cpu.py``):

- *Rows* (few rows of ``x``, ``m <= 4``): each step of the loop takes
  ``ROWS_PER_STEP`` (4) rows of ``q`` and adds their rank-1 updates into an
  ``f32[*b, m, n]`` accumulator carried by the loop,
  ``acc += broadcast(xs[..., :, i:i+1]) * broadcast(f32(q[..., i:i+1, :]))``
  per row, written elementwise so that XLA fuses the slices, the conversions,
  the multiplies and the adds of a step into one loop fusion that reads the
  int8 rows directly: the weight is read once, as int8, and nothing converted
  is ever stored. Each row is sliced from ``q`` on its own: slicing four rows
  at once and splitting the converted block makes XLA materialise it (2-4x
  slower). ``k % 4`` rows are added after the loop, with static slices.
- *K-streaming* (``4 < m <= 32``): the loop walks the contraction axis in
  blocks of ``block_k`` rows of ``q``; each step slices ``q[..., i:i+B, :]``
  (contiguous rows), converts it to f32, multiplies it with the matching
  columns of the scaled ``x`` and adds into an ``f32[*b, m, n]`` accumulator
  carried by the loop. A static remainder step handles ``k % block_k`` rows;
  nothing is padded.
- *N-blocking* (``m > 32``): the loop walks the output columns in blocks of
  ``block_n``; each step converts ``q[..., :, j:j+B]``, computes the full
  contraction for those columns and writes them into the result with
  ``dynamic_update_slice`` (no accumulator, so no extra ``f32[m, n]`` buffer
  besides the result); a static remainder step handles ``n % block_n`` columns.

The scale is folded into ``x`` once, before the loop (``k * m`` multiplies
instead of ``k * n``), exactly as the reference does. The result differs from the
reference only by the order of the f32 sums over ``k`` (K-streaming adds
``ceil(k / block_k)`` partial dots; rows adds the ``k`` products one after
the other); each element's error is bounded by about
``k * eps_f32 * sum_k |x s q|`` (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., section 3.1) for any order of the sum, which is what the
tests check.

The composite's default decomposition (every other platform) is the
reference; the CPU lowering rule (:func:`lower_matmul_q_cpu`, registered for
``platform="cpu"``) attaches this equivalent one instead, or, while hxmlir is
installed, a call of the native CPU kernel (:mod:`hxmlir.lowering.matmul_q_cpu`;
the streaming schemes stay what exported artifacts and the fallback run). Each
scheme has its own builder (``_build_rows``, ``_build_k_streaming``,
``_build_n_blocking``); :func:`build_matmul_q_streaming` checks, scales ``x``
once and dispatches. The builders need
only an MLIR context, a location and an insertion point, so passes that create
``hx.matmul_q`` composites (``hx-fold-scales``) can use them too
(:func:`streaming_decomposition`).

Measured (2-core AMD EPYC, AVX2, 32 MiB L3, shared with other jobs; caches
evicted before each call; run to run +-20%; ``k = n = 4096`` and ``k = 2048,
n = 8192``, side by side in one run): rows took 0.46-0.48x the f32 matmul's
time at ``m = 1``, 0.3x at ``m = 2``, 0.3-0.5x at ``m = 4`` (one row per step:
0.6-0.7x, 0.4-0.5x, 0.5-0.7x; two: 0.55x at ``m = 1``; eight: 0.6-0.85x at
``m = 1``), where K-streaming took 0.85-1.0x, 0.6x and 0.5-0.7x. At
``m = 8`` the two were even (0.4-0.8x), at ``m = 12..32`` K-streaming was
ahead (0.55-0.7x against 0.6-1.0x), hence ``ROWS_MAX_M = 4``; N-blocking
0.9-1.1x at ``m = 64..256``. Temporary memory: the ``f32[m, n]``
accumulator for rows (0.02 MiB), 4-6 MiB for the blocked schemes, instead of
64 MiB. XLA cannot fuse the int8 -> f32 conversion into its dot, so each
block of the blocked schemes is converted to memory and read back; rows has
no dot and reads the int8 weight once, a quarter of the f32 matmul's bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jax.interpreters import mlir
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as hlo

from hxmlir import formats
from hxmlir.install_state import int8_activations, use_kernels
from hxmlir.lowering import matmul_q_blocked, matmul_q_cpu, reference, rules, schema
from hxmlir.lowering.composite import lower_composite
from hxmlir.lowering.primitives import hx_matmul_q_p
from hxmlir.types import dotdims

# Block sizes (see the module docstring and benchmarks/matmul_q_cpu.py): a
# block of dequantized values takes about K_BLOCK_BYTES (K-streaming: 256 rows
# of a 4096-wide weight) or N_BLOCK_BYTES (N-blocking: 256 columns of a
# 4096-deep weight; N_BLOCK_BYTES_LARGE_M above LARGE_M rows, where the
# f32[m, n] result buffer that the loop carries takes its share of temporary
# memory) of f32, and at most 1/MAX_FRACTION of the whole dequantized weight,
# so temporary memory stays a small fraction of what the reference needs. Block
# lengths are multiples of BLOCK_ALIGN and at least MIN_BLOCK (shorter dots run
# far below peak).
K_BLOCK_BYTES = 4 * 1024 * 1024
N_BLOCK_BYTES = 4 * 1024 * 1024
N_BLOCK_BYTES_LARGE_M = 2 * 1024 * 1024
LARGE_M = 128
# Up to ROWS_MAX_M rows of x, the loop takes ROWS_PER_STEP rows of q per step
# (scheme "rows", see the module docstring); K-streaming above.
ROWS_MAX_M = 4
ROWS_PER_STEP = 4
MAX_FRACTION = 16
BLOCK_ALIGN = 8
MIN_BLOCK = 32
# K-streaming up to this many rows of x (per batch element), N-blocking above.
K_STREAMING_MAX_M = 32
# Weights of at most this many elements (per batch element) are converted
# whole (one dot, no loop): the dequantized copy is small and a loop would
# only add overhead.
SMALL_WEIGHT = 64 * 1024
# N-blocking (m > K_STREAMING_MAX_M) only for weights above this many elements
# (4 MiB as f32): below, the whole converted weight stays in cache and one dot
# beats a loop of narrow ones. Measured on all-MiniLM-L6-v2's layers (m = 128
# tokens; k, n in {384, 1536}): N-blocking took 2.1-3.3x the f32 matmul,
# converting whole 1.2-2.2x. K-streaming at small m keeps paying off at these
# sizes (the built-in demo model, m = 16: 0.74x f32 streamed, 2.4x whole).
N_BLOCKING_MIN_WEIGHT = 1024 * 1024
# The schemes build_matmul_q_streaming knows (see the module docstring).
SCHEMES = ("rows", "k", "n", "whole")


def _shape(v: ir.Value) -> tuple[int, ...]:
  return tuple(ir.RankedTensorType(v.type).shape)


def _tensor(shape: Sequence[int], etype: ir.Type) -> ir.RankedTensorType:
  return ir.RankedTensorType.get(list(shape), etype)


def _i32_scalar(value: int) -> ir.Value:
  t = _tensor((), ir.IntegerType.get_signless(32))
  return hlo.ConstantOp(ir.DenseElementsAttr.get(np.array(value, np.int32), type=t)).result


def _f32_zeros(shape: Sequence[int]) -> ir.Value:
  f32 = ir.F32Type.get()
  zero = hlo.ConstantOp(ir.DenseElementsAttr.get(np.array(0, np.float32),
                                                 type=_tensor((), f32))).result
  return hlo.BroadcastInDimOp(_tensor(shape, f32), zero, []).result


def _convert_f32(v: ir.Value) -> ir.Value:
  return hlo.ConvertOp(_tensor(_shape(v), ir.F32Type.get()), v).result


def _expand(v: ir.Value, t: ir.RankedTensorType) -> ir.Value:
  """``v`` broadcast along its axes of size 1 to ``t``'s shape (same rank; ``v`` if it has it)."""
  if v.type == t:
    return v
  return hlo.BroadcastInDimOp(t, v, list(range(len(_shape(v))))).result


def _static_slice(v: ir.Value, axis: int, start: int, stop: int) -> ir.Value:
  shape = _shape(v)
  starts = [0] * len(shape)
  limits = list(shape)
  starts[axis], limits[axis] = start, stop
  return hlo.SliceOp(v, starts, limits, [1] * len(shape)).result


def _dynamic_slice(v: ir.Value, axis: int, start: ir.Value, size: int) -> ir.Value:
  shape = list(_shape(v))
  zero = _i32_scalar(0)
  starts = [start if d == axis else zero for d in range(len(shape))]
  shape[axis] = size
  return hlo.DynamicSliceOp(v, starts, shape).result


def _dot(xs: ir.Value, w: ir.Value, nb: int) -> ir.Value:
  """``f32[*b, m, c] x f32[*b, c, n] -> f32[*b, m, n]`` (batch dims leading)."""
  batch = list(range(nb))
  dims = hlo.DotDimensionNumbers.get(
      lhs_batching_dimensions=batch, rhs_batching_dimensions=batch,
      lhs_contracting_dimensions=[nb + 1], rhs_contracting_dimensions=[nb])
  out = (*_shape(xs)[:-1], _shape(w)[-1])
  return hlo.DotGeneralOp(_tensor(out, ir.F32Type.get()), xs, w, dims).result


def _check(x: ir.Value, q: ir.Value, s: ir.Value) -> tuple[int, int, int, int]:
  """Checks the operand types against the schema; returns ``(nb, m, k, n)``."""
  def tt(v):
    t = ir.RankedTensorType(v.type)
    return schema.TensorType(tuple(t.shape), str(t.element_type))
  ops = [tt(x), tt(q), tt(s)]
  want = (*ops[0].shape[:-1], ops[1].shape[-1]) if ops[1].shape else ()
  errs = schema.SCHEMAS["hx.matmul_q"].check_types(ops, [schema.TensorType(want, "f32")])
  if errs:
    raise TypeError(f"hx.matmul_q streaming implementation: {'; '.join(errs)} "
                    f"(operands {', '.join(map(str, ops))})")
  *_, m, k = ops[0].shape
  return len(ops[0].shape) - 2, m, k, ops[1].shape[-1]


def _block(length: int, other: int, budget: int) -> int:
  """Block length along a weight axis of ``length`` when the other one is ``other``."""
  by_bytes = budget // (4 * other)
  by_fraction = length // MAX_FRACTION
  return max(MIN_BLOCK, min(by_bytes, by_fraction) // BLOCK_ALIGN * BLOCK_ALIGN)


def _k_block(k: int, n: int) -> int:
  return _block(k, n, K_BLOCK_BYTES)


def _n_block(m: int, k: int, n: int) -> int:
  return _block(n, k, N_BLOCK_BYTES if m <= LARGE_M else N_BLOCK_BYTES_LARGE_M)


def choose_blocking(m: int, k: int, n: int) -> tuple[str, int]:
  """The scheme and block size :func:`build_matmul_q_streaming` uses by default.

  For ``x: f32[m, k]`` and ``q: i8[k, n]`` (per batch element). Returns
  ``("whole", 0)`` (convert once, one dot) for weights of at most
  ``SMALL_WEIGHT`` elements (at most ``N_BLOCKING_MIN_WEIGHT`` when
  ``m > K_STREAMING_MAX_M``); else ``("rows", ROWS_PER_STEP)`` (rank-1
  updates, that many rows of ``q`` per step) for ``m <= ROWS_MAX_M``,
  ``("k", block_k)`` (K-streaming) for
  ``m <= K_STREAMING_MAX_M`` and ``("n", block_n)`` (N-blocking) above, the
  block holding about ``K_BLOCK_BYTES`` / ``N_BLOCK_BYTES`` of f32
  (``N_BLOCK_BYTES_LARGE_M`` for ``m > LARGE_M``) and at most
  ``1/MAX_FRACTION`` of the weight; ``("whole", 0)`` again when a single such
  block would cover the weight.
  """
  if k * n <= SMALL_WEIGHT or (m > K_STREAMING_MAX_M and k * n <= N_BLOCKING_MIN_WEIGHT):
    return "whole", 0
  if m <= ROWS_MAX_M:
    return "rows", ROWS_PER_STEP
  if m <= K_STREAMING_MAX_M:
    b = _k_block(k, n)
    return ("k", b) if b < k else ("whole", 0)
  b = _n_block(m, k, n)
  return ("n", b) if b < n else ("whole", 0)


def _scaled_x(x: ir.Value, s: ir.Value, nb: int) -> ir.Value:
  """``x * s[..., None, :]``: ``f32[*b, m, k]``."""
  sb = hlo.BroadcastInDimOp(x.type, s, [*range(nb), nb + 1]).result
  return hlo.MulOp(x, sb).result


def _loop(count: int, carried: Sequence[ir.Value], body) -> list[ir.Value]:
  """``stablehlo.while`` running ``body(i, *carried) -> new carried`` for ``i < count``.

  ``i`` is an ``i32`` scalar tensor; the counter is carried first and dropped
  from the results.
  """
  i0 = _i32_scalar(0)
  values = [i0, *carried]
  types = [v.type for v in values]
  op = hlo.WhileOp(types, values)
  cond = op.regions[0].blocks.append(*types)
  with ir.InsertionPoint(cond):
    lt = hlo.CompareOp(cond.arguments[0], _i32_scalar(count),
                       hlo.ComparisonDirectionAttr.get("LT"),
                       compare_type=hlo.ComparisonTypeAttr.get("SIGNED")).result
    hlo.ReturnOp([lt])
  blk = op.regions[1].blocks.append(*types)
  with ir.InsertionPoint(blk):
    i = blk.arguments[0]
    new = list(body(i, *blk.arguments[1:]))
    hlo.ReturnOp([hlo.AddOp(i, _i32_scalar(1)).result, *new])
  return list(op.results)[1:]


def build_matmul_q_streaming(x: ir.Value, q: ir.Value, s: ir.Value, *,
                             block_k: int | None = None, block_n: int | None = None,
                             rows_per_step: int | None = None,
                             scheme: str | None = None) -> ir.Value:
  """Emits ``(x * s[..., None, :]) @ q`` without materialising the dequantized weight.

  ``x: f32[*b, m, k]``, ``q: i8[*b, k, n]``, ``s: f32[*b, k]`` (``ir.Value`` s
  with static shapes) -> ``f32[*b, m, n]``, built as StableHLO at the current
  insertion point (needs an MLIR context and location; no JAX tracing).

  ``scheme``: ``"rows"`` (``rows_per_step`` rows of ``q`` per step, each a
  rank-1 update of the accumulator), ``"k"`` (K-streaming, blocks of
  ``block_k`` rows of ``q``), ``"n"`` (N-blocking, blocks of ``block_n``
  columns) or ``"whole"`` (convert the whole weight, one dot: the reference's
  form); default :func:`choose_blocking`'s choice. ``block_k``, ``block_n``
  and ``rows_per_step`` default to the ones :func:`choose_blocking` computes
  and ``ROWS_PER_STEP`` (each scheme reads its own); a block at least as
  large as its axis means one step.
  ``k`` or ``n`` not a multiple of the block is handled by one static
  remainder step (for rows: one static update per row left). Raises ``TypeError`` when the operand types are not those of
  ``hx.matmul_q`` (the message names them) and ``ValueError`` for an unknown
  scheme or a block size < 1.
  """
  nb, m, k, n = _check(x, q, s)
  if scheme is None:
    scheme, _ = choose_blocking(m, k, n)
  block_k = _k_block(k, n) if block_k is None else block_k
  block_n = _n_block(m, k, n) if block_n is None else block_n
  if scheme not in SCHEMES:
    raise ValueError(f"hx.matmul_q streaming: unknown scheme {scheme!r} "
                     f"(expected one of {', '.join(map(repr, SCHEMES))})")
  if block_k < 1 or block_n < 1 or (rows_per_step is not None and rows_per_step < 1):
    raise ValueError(f"hx.matmul_q streaming: block sizes must be >= 1, got "
                     f"block_k={block_k}, block_n={block_n}, rows_per_step={rows_per_step}")
  xs = _scaled_x(x, s, nb)
  if scheme == "whole" or (scheme == "k" and block_k >= k) or (scheme == "n" and block_n >= n):
    return _dot(xs, _convert_f32(q), nb)
  if scheme == "rows":
    return _build_rows(xs, q, nb, ROWS_PER_STEP if rows_per_step is None else rows_per_step)
  if scheme == "k":
    return _build_k_streaming(xs, q, nb, block_k)
  return _build_n_blocking(xs, q, nb, block_n)


def _build_rows(xs: ir.Value, q: ir.Value, nb: int, r: int) -> ir.Value:
  """Scheme ``"rows"``: ``r`` rank-1 updates of an ``f32[*b, m, n]`` accumulator per step."""
  *_, k, n = _shape(q)
  kax_x, kax_q = nb + 1, nb
  out_t = _tensor((*_shape(xs)[:-1], n), ir.F32Type.get())
  steps = k // r

  def update(acc, xs_, q_, row):
    # acc[*b, m, n] += xs[*b, m, row] * f32(q[*b, row, n]), all elementwise:
    # XLA fuses each step's slices, conversions, multiplies and adds into one
    # loop that reads the int8 rows directly (no dot, no converted copy). Each
    # row is sliced from q on its own: slicing r rows at once and then
    # splitting the converted block makes XLA materialise it (2-4x slower).
    if isinstance(row, int):
      xc = _static_slice(xs_, kax_x, row, row + 1)
      qr = _static_slice(q_, kax_q, row, row + 1)
    else:
      xc = _dynamic_slice(xs_, kax_x, row, 1)
      qr = _dynamic_slice(q_, kax_q, row, 1)
    prod = hlo.MulOp(_expand(xc, out_t), _expand(_convert_f32(qr), out_t)).result
    return hlo.AddOp(acc, prod).result

  def rstep(i, acc, xs_, q_):
    base = i if r == 1 else hlo.MulOp(i, _i32_scalar(r)).result
    for j in range(r):
      acc = update(acc, xs_, q_, base if j == 0 else hlo.AddOp(base, _i32_scalar(j)).result)
    return acc, xs_, q_

  acc = _f32_zeros(out_t.shape)
  if steps:
    acc, _, _ = _loop(steps, [acc, xs, q], rstep)
  for row in range(steps * r, k):  # the k % r rows left: static slices
    acc = update(acc, xs, q, row)
  return acc


def _build_k_streaming(xs: ir.Value, q: ir.Value, nb: int, block_k: int) -> ir.Value:
  """Scheme ``"k"``: blocks of ``block_k`` rows of ``q``, one dot each, summed in a loop."""
  *_, k, n = _shape(q)
  steps, rem = divmod(k, block_k)
  kax_x, kax_q = nb + 1, nb

  def kstep(i, acc, xs_, q_):
    start = hlo.MulOp(i, _i32_scalar(block_k)).result
    qb = _convert_f32(_dynamic_slice(q_, kax_q, start, block_k))
    xb = _dynamic_slice(xs_, kax_x, start, block_k)
    return hlo.AddOp(acc, _dot(xb, qb, nb)).result, xs_, q_

  if steps == 1:
    acc = _dot(_static_slice(xs, kax_x, 0, block_k),
               _convert_f32(_static_slice(q, kax_q, 0, block_k)), nb)
  else:
    acc, _, _ = _loop(steps, [_f32_zeros((*_shape(xs)[:-1], n)), xs, q], kstep)
  if rem:
    lo = steps * block_k
    tail = _dot(_static_slice(xs, kax_x, lo, k),
                _convert_f32(_static_slice(q, kax_q, lo, k)), nb)
    acc = hlo.AddOp(acc, tail).result
  return acc


def _build_n_blocking(xs: ir.Value, q: ir.Value, nb: int, block_n: int) -> ir.Value:
  """Scheme ``"n"``: blocks of ``block_n`` columns of ``q``, each written into the result."""
  n = _shape(q)[-1]
  steps, rem = divmod(n, block_n)
  nax = nb + 1  # the column axis of q and of the result

  def nstep(i, out, xs_, q_):
    start = hlo.MulOp(i, _i32_scalar(block_n)).result
    qb = _convert_f32(_dynamic_slice(q_, nax, start, block_n))
    zero = _i32_scalar(0)
    idx = [start if d == nax else zero for d in range(nb + 2)]
    return hlo.DynamicUpdateSliceOp(out, _dot(xs_, qb, nb), idx).result, xs_, q_

  out, _, _ = _loop(steps, [_f32_zeros((*_shape(xs)[:-1], n)), xs, q], nstep)
  if rem:
    lo = steps * block_n
    tail = _dot(xs, _convert_f32(_static_slice(q, nax, lo, n)), nb)
    zero = _i32_scalar(0)
    idx = [_i32_scalar(lo) if d == nax else zero for d in range(nb + 2)]
    out = hlo.DynamicUpdateSliceOp(out, tail, idx).result
  return out


# --- the CPU lowering rule ----------------------------------------------------

def streaming_decomposition(args: Sequence[ir.Value]) -> list[ir.Value]:
  """``hx.matmul_q`` decomposition builder (``lowering.composite.DecompositionBuilder``).

  ``args = (x, q, s)`` -> ``[build_matmul_q_streaming(x, q, s)]`` with the
  default blocking; for passes that create ``hx.matmul_q`` composites in
  modules meant for CPU (pass it to ``composite.build_decomposition``).
  """
  x, q, s = args
  return [build_matmul_q_streaming(x, q, s)]


def collapsed_streaming_decomposition(args: Sequence[ir.Value], *,
                                      scheme: str | None = None) -> list[ir.Value]:
  """``hx.matmul_q`` decomposition builder for ``f32[..., k] x i8[k, n] -> f32[..., n]``:
  ``x``'s leading dims collapsed into ``m`` by a ``stablehlo.reshape`` (free: row-major),
  :func:`build_matmul_q_streaming` (``scheme``: its argument), and the result reshaped
  back."""
  x, q, s = args
  xs, n = _shape(x), _shape(q)[-1]
  f32 = ir.F32Type.get()
  x2 = hlo.ReshapeOp(_tensor((int(np.prod(xs[:-1], dtype=np.int64)), xs[-1]), f32), x).result
  y = build_matmul_q_streaming(x2, q, s, scheme=scheme)
  return [hlo.ReshapeOp(_tensor((*xs[:-1], n), f32), y).result]


def _collapsed(native):
  """``native`` (a kernel call on ``f32[m, k] x Q[k, n]``) on ``f32[..., k] x Q[k, n]``:
  ``x``'s leading dims collapsed into ``m`` (free: row-major) and restored on the result."""
  def call(x, q, s):
    y = native(x.reshape(-1, x.shape[-1]), q, s)
    return y.reshape(*x.shape[:-1], y.shape[-1])
  return call


def _kernel_layout(x_aval, q_aval, dims) -> str | None:
  """``"batched"`` (version 1's dims: ``f32[*b, m, k] x Q[*b, k, n]``), ``"collapsed"``
  (``f32[..., k] x Q[k, n]``), ``"nk"`` (the checkpoint layout ``f32[..., k] x W[n, k]``,
  ``"...k,nk->...n"``: ``hx_matmul_q_cpu_v3``), or ``None``: the layouts the native kernels
  and the int8 streaming builders know."""
  if x_aval.ndim == q_aval.ndim and dims == dotdims.v1_dims(x_aval.ndim):
    return "batched"
  if q_aval.ndim == 2 and dims == dotdims.matmul_dims(x_aval.ndim, 2):
    return "collapsed"
  if q_aval.ndim == 2 and x_aval.ndim >= 1 and dims == (((x_aval.ndim - 1,), (1,)), ((), ())):
    return "nk"
  return None


def _nk_kernel(fmt: formats.Format, dense: tuple[int, int], s_aval, rows: int):
  """The native call of the checkpoint layout for weights of ``fmt`` (dense ``[n, k]``,
  scales ``s_aval``) and ``x`` of ``rows`` rows: ``hx_matmul_q_cpu_i8x_v1`` (integer
  activations) where the setting opted in (``hx.install(activations="int8")``) and
  :func:`~hxmlir.lowering.matmul_q_cpu.i8x_takes` (the format, and ``rows`` at least
  ``I8X_MIN_ROWS``: prefill), else ``hx_matmul_q_cpu_v3``."""
  group = formats.group_of_scale(dense, s_aval)
  if int8_activations() and matmul_q_cpu.i8x_takes(fmt, group, rows):
    return matmul_q_cpu.matmul_q_native_i8x
  return matmul_q_cpu.matmul_q_native_v3


def lower_matmul_q_cpu(ctx, x: ir.Value, q: ir.Value, s: ir.Value, *o: ir.Value,
                       dimension_numbers=None) -> list[ir.Value]:
  """CPU lowering rule of ``hx_matmul_q_p``: ``hx.matmul_q`` with a CPU decomposition.

  The composite (name, version, attributes, shardings) is exactly the one the
  default rule emits; only its decomposition differs:

  - native kernel: for weights of more than ``SMALL_WEIGHT`` elements (per batch
    element, dense), while hxmlir is installed and the native kernel is active
    (:func:`hxmlir.lowering.matmul_q_cpu.use_native`: not for ``jax.export`` unless
    ``hx.keep_native_cpu_calls()``, one device only), in the layouts
    ``f32[*b, m, k] x Q[*b, k, n]`` (version 1's dims) and ``f32[..., k] x Q[k, n]``
    (leading dims collapsed into ``m``): a call of ``hx_matmul_q_cpu_v1`` for int8
    with one scale per row, of ``hx_matmul_q_cpu_v2`` for every other format
    (:mod:`hxmlir.formats`);
  - otherwise, int8 per row: :func:`build_matmul_q_streaming` in those two layouts
    (:func:`collapsed_streaming_decomposition` for the second), the reference itself
    when :func:`choose_blocking` picks ``"whole"`` (small weights);
  - every other layout, and other formats than int8 per row outside the native
    kernel: one free axis of the dense weight walked in blocks of whole groups and
    packed bytes (``lowering/matmul_q_blocked.py``), or the reference when small;
  - formats the native kernel does not take in these layouts (``"kn"`` not in
    ``Format.native_cpu``: f16 scales,
    offsets ``o``): the blocked path (or the reference when small) in every layout
    but the next;
  - the checkpoint layout ``f32[..., k] x W[n, k]`` (``"...k,nk->...n"``, quantized along
    ``k``), every format with ``"nk"`` in ``Format.native_cpu``: a call of ``hx_matmul_q_cpu_v3``
    under the same policy and size bound (``hx_matmul_q_cpu_i8x_v1``, integer activations,
    for int8/int4/uint4 values and ``x`` of at least ``I8X_MIN_ROWS`` rows where
    ``hx.install(activations="int8")`` opted in), else the blocked path.
  """
  x_aval, q_aval, s_aval, *_ = ctx.avals_in
  fmt = rules.weight_format(ctx)
  dims = dimension_numbers or dotdims.v1_dims(x_aval.ndim)
  if _kernel_layout(x_aval, q_aval, dims) == "nk":
    n, k = fmt.dense_shape(q_aval.shape)
    if "nk" in fmt.native_cpu and k * n > SMALL_WEIGHT and matmul_q_cpu.use_native(ctx, use_kernels()):
      return lower_composite(ctx, "hx.matmul_q", x, q, s, *o,
                             reference=_nk_kernel(fmt, (n, k), s_aval,
                                                  int(np.prod(x_aval.shape[:-1]))),
                             attributes=rules.matmul_q_attributes(ctx, dims))
    return _lower_blocked(ctx, (x, q, s, *o), dims)
  if "kn" not in fmt.native_cpu:
    return _lower_blocked(ctx, (x, q, s, *o), dimension_numbers or dotdims.v1_dims(x_aval.ndim))
  attrs = rules.matmul_q_attributes(ctx, dims)
  ref = reference.matmul_q_for(dims)
  dense = fmt.dense_shape(q_aval.shape)
  per_row_int8 = fmt is formats.INT8 and s_aval.ndim == q_aval.ndim - 1
  layout = _kernel_layout(x_aval, q_aval, dims)
  k, n = dense[-2] if layout else 0, dense[-1]
  if layout and k * n > SMALL_WEIGHT and matmul_q_cpu.use_native(ctx, use_kernels()):
    native = matmul_q_cpu.matmul_q_native if per_row_int8 else matmul_q_cpu.matmul_q_native_v2
    native = native if layout == "batched" else _collapsed(native)
    return lower_composite(ctx, "hx.matmul_q", x, q, s, reference=native, attributes=attrs)
  if not per_row_int8 or layout is None:
    # one free axis of the dense weight walked in aligned blocks (matmul_q_blocked.py)
    axis = matmul_q_blocked.block_axis(dense, dims)
    if axis is not None:
      group = formats.group_of_scale(dense, s_aval)
      align = matmul_q_blocked.alignment(dense, axis, fmt, group)
      ref = matmul_q_blocked.blocked_for(dims, axis,
                                         matmul_q_blocked.block_size(dense, axis, align))
    return lower_composite(ctx, "hx.matmul_q", x, q, s, reference=ref, attributes=attrs)
  if layout == "batched":
    m, builder = x_aval.shape[-2], streaming_decomposition
  else:
    m = int(np.prod(x_aval.shape[:-1], dtype=np.int64))
    builder = collapsed_streaming_decomposition
  if choose_blocking(m, k, n)[0] == "whole":
    return lower_composite(ctx, "hx.matmul_q", x, q, s, reference=ref, attributes=attrs)
  return lower_composite(ctx, "hx.matmul_q", x, q, s, builder=builder, attributes=attrs)


def _lower_blocked(ctx, operands, dims) -> list[ir.Value]:
  """``hx.matmul_q`` whose decomposition walks a free axis of the dense weight in blocks of
  whole groups and packed bytes (``lowering/matmul_q_blocked.py``), or the reference
  when the weight is small: the CPU rule for the formats without a native kernel."""
  _, q_aval, s_aval, *o_aval = ctx.avals_in
  fmt = rules.weight_format(ctx)
  dense = fmt.dense_shape(q_aval.shape)
  ref = reference.matmul_q_for(dims, bool(o_aval))
  axis = matmul_q_blocked.block_axis(dense, dims)
  if axis is not None:
    align = matmul_q_blocked.alignment(dense, axis, fmt, formats.group_of_scale(dense, s_aval))
    ref = matmul_q_blocked.blocked_for(dims, axis,
                                       matmul_q_blocked.block_size(dense, axis, align))
  return lower_composite(ctx, "hx.matmul_q", *operands, reference=ref,
                         attributes=rules.matmul_q_attributes(ctx, dims))


mlir.register_lowering(hx_matmul_q_p, lower_matmul_q_cpu, platform="cpu")
