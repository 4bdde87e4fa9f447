"""``dot_general`` dimension numbers with a quantized right operand: the rules, written once.

``hx.matmul_q`` (version 2) is ``lax.dot_general(x, dequantize(q), dimension_numbers)``
for a dense ``x: f32[...]`` and a quantized ``q: q8[..., n]`` whose last axis ``n``
is the quantized one (the scale spans ``q``'s other axes). The typing rule
(``hxmlir.types.qarray``), the lo primitive's abstract eval, the reference decomposition
and the composite schema (``hx-verify``) all read this module; it depends on
nothing but Python. Dimension numbers are ``lax.dot_general``'s:
``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))``; the result has
``dot_general``'s layout: batch dims, ``x``'s free dims, ``q``'s free dims.
"""

from __future__ import annotations

from collections.abc import Sequence

DotDims = tuple[tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]


def v1_dims(rank: int) -> DotDims:
  """``f32[*b, m, k] x q8[*b, k, n]`` of equal ``rank``: contract ``k``, batch ``*b``
  (``hx.matmul_q`` version 1, which has no attributes, means these)."""
  batch = tuple(range(rank - 2))
  return ((rank - 1,), (rank - 2,)), (batch, batch)


def matmul_dims(x_rank: int, q_rank: int) -> DotDims | None:
  """``hx.matmul_q(x, q)``'s dims: equal ranks >= 2 -> :func:`v1_dims`; ``q8[k, n]`` with
  ``f32[..., k]`` of any rank >= 1 -> contract ``x``'s last axis with ``q``'s first
  (``f32[..., k] @ q8[k, n] -> f32[..., n]``); anything else ``None``."""
  if x_rank == q_rank >= 2:
    return v1_dims(x_rank)
  if q_rank == 2 and x_rank >= 1:
    return ((x_rank - 1,), (0,)), ((), ())
  return None


def normalize(dims) -> DotDims:
  """``dims`` as tuples of ints (hashable: a primitive parameter)."""
  (lc, rc), (lb, rb) = dims
  return ((tuple(map(int, lc)), tuple(map(int, rc))), (tuple(map(int, lb)), tuple(map(int, rb))))


def free_dims(rank: int, contracting: Sequence[int], batch: Sequence[int]) -> list[int]:
  """The free (neither contracting nor batch) dims of an operand of ``rank``, in order."""
  return [d for d in range(rank) if d not in contracting and d not in batch]


def problems(x_shape: Sequence[int], q_shape: Sequence[int], dims: DotDims,
             grouped: bool = False) -> list[str]:
  """What is wrong with ``dims`` for these operand shapes (empty: nothing); ``grouped``:
  ``q`` has group scales (:func:`split_groups`)."""
  (lc, rc), (lb, rb) = dims
  xr, qr = len(x_shape), len(q_shape)
  if len(lc) != len(rc) or len(lb) != len(rb):
    return [f"dimension numbers pair {len(lc)}/{len(rc)} contracting and "
            f"{len(lb)}/{len(rb)} batch dims"]
  used_x, used_q = [*lc, *lb], [*rc, *rb]
  if any(not 0 <= d < xr for d in used_x) or any(not 0 <= d < qr for d in used_q) or \
     len(set(used_x)) != len(used_x) or len(set(used_q)) != len(used_q):
    return [f"dimension numbers {dims} are out of range or repeat a dim for ranks {xr} and {qr}"]
  if any(x_shape[a] != q_shape[b] for a, b in (*zip(lc, rc), *zip(lb, rb))):
    return [f"contracting or batch dims differ in size for dimension numbers {dims}"]
  if grouped:
    if split_groups(xr, qr, dims) is None:
      return [f"the group scales cannot be folded through dimension numbers {dims}: the "
              "scale has both a contracted and a free axis besides the groups"]
  elif scale_side(qr, dims) is None:
    return [f"the scales cannot be folded through dimension numbers {dims}: the quantized "
            "axis is contracted and the scale has both a contracted and a free axis"]
  return []


def split_groups(x_rank: int, q_rank: int, dims: DotDims):
  """``dims`` for a weight with group scales, once its last axis ``n`` is split into
  ``(G, g)`` (``G = n // g`` groups; the scale then spans every axis but ``g``, a per-row
  scale of a weight of rank ``q_rank + 1``) and ``x``'s axis paired with ``n`` (contracting
  or batch) is split likewise.

  Returns ``(dims2, x_axis, kind)`` or ``None`` when the group scales cannot be folded.
  ``x_axis``: ``x``'s axis to split (``None`` when ``n`` is free). ``kind``: ``"free"``
  (``n`` free: ``G, g`` are the result's last two axes, to merge), ``"batch"`` (``n``
  batch: ``G, g`` adjacent batch axes of the result, to merge), ``"contracting"`` (both
  contracted, nothing to undo), ``"partial"`` (the groups run along the contraction and
  the scale spans a free axis too, as in ``"...k,nk->...n"``: ``G`` becomes a batch axis,
  the last of them, so each group's partial sum is scaled; the result's axis
  ``len(batch)`` is then summed).
  """
  (lc, rc), (lb, rb) = dims
  n = q_rank - 1
  a = lc[rc.index(n)] if n in rc else lb[rb.index(n)] if n in rb else None
  def xm(ds):
    return [d if a is None or d <= a else d + 1 for d in ds]
  lc2, rc2, lb2, rb2 = xm(lc), list(rc), xm(lb), list(rb)
  if n in rc:
    i = rc.index(n)
    lc2.insert(i + 1, a + 1)
    rc2.insert(i + 1, n + 1)
    kind = "contracting"
  elif n in rb:
    i = rb.index(n)
    lb2.insert(i + 1, a + 1)
    rb2.insert(i + 1, n + 1)
    kind = "batch"
  else:
    kind = "free"
  new = normalize(((lc2, rc2), (lb2, rb2)))
  if scale_side(q_rank + 1, new) is not None:
    return new, a, kind
  if kind != "contracting":
    return None
  i = rc.index(n)
  del lc2[i], rc2[i]
  new = normalize(((lc2, rc2), ([*lb2, a], [*rb2, n])))
  if scale_side(q_rank + 1, new) is None:
    return None
  return new, a, "partial"


def result_shape(x_shape: Sequence[int], q_shape: Sequence[int], dims: DotDims) -> tuple:
  """``dot_general``'s result shape: batch dims, then ``x``'s free dims, then ``q``'s."""
  (lc, rc), (lb, rb) = dims
  return (*(x_shape[d] for d in lb),
          *(x_shape[d] for d in free_dims(len(x_shape), lc, lb)),
          *(q_shape[d] for d in free_dims(len(q_shape), rc, rb)))


def result_parts(x_parts: Sequence, q_parts: Sequence, dims: DotDims) -> tuple:
  """The result's per-dim sharding entries (``PartitionSpec`` entries or Shardy axis
  tuples; empty/``None`` = replicated): batch dims like ``x``'s (``q``'s where
  ``x``'s is replicated), ``x``'s free dims like ``x``, ``q``'s free dims like ``q``.
  A sharded contracting dim leaves no trace in the result: each shard's partial sum is
  added by the partitioner (the typing rule refuses one on Explicit mesh axes,
  :func:`sharded_contraction`)."""
  (lc, rc), (lb, rb) = dims
  batch = tuple(x_parts[a] if x_parts[a] else q_parts[b] for a, b in zip(lb, rb))
  return (*batch, *(x_parts[d] for d in free_dims(len(x_parts), lc, lb)),
          *(q_parts[d] for d in free_dims(len(q_parts), rc, rb)))


def sharded_contraction(x_parts: Sequence, q_parts: Sequence, dims: DotDims) -> bool:
  """Whether a contracting dim of either operand is sharded."""
  (lc, rc), _ = dims
  return any(x_parts[d] for d in lc) or any(q_parts[d] for d in rc)


def scale_side(q_rank: int, dims: DotDims) -> str | None:
  """Where the per-row scales of ``q`` go in ``dot_general(x, dequantize(q), dims)``.

  ``q``'s last axis ``n`` is the quantized one; the scale spans the other axes ``S``.

  - ``"dense"``: ``n`` is free or batch, or it is contracted and every axis of ``S``
    is on ``x`` (batch or contracting): the scale multiplies ``x`` before the dot
    (axes of ``S`` free on ``q`` become new batch axes of the scaled ``x``, which
    grows by their sizes' product). ``f32[..., k] @ q8[k, n]`` is this case.
  - ``"result"``: ``n`` is contracted and every axis of ``S`` is in the result
    (batch or free on ``q``): the scale multiplies the dot's result
    (``"mk,nk->mn"``, the ``[out, in]`` checkpoint layout).
  - ``None``: ``n`` is contracted and ``S`` has both a contracted and a free axis:
    the scale varies along a summed axis while the sum also runs over ``n``, so it
    cannot be pulled out of the sum on either side.
  """
  (_, rc), (_, rb) = dims
  n, scale_axes = q_rank - 1, range(q_rank - 1)
  if n not in rc:
    return "dense"
  if all(a not in rc for a in scale_axes):
    return "result"
  if all(a in rc or a in rb for a in scale_axes):
    return "dense"
  return None


def batched(dims, x_rank: int, q_rank: int, x_mapped: bool, q_mapped: bool):
  """``dims`` once a vmapped axis is moved to the front of the mapped operands (ranks
  before that), and where that axis lands in the result, or ``None``.

  Both mapped -> a new batch dim (result axis 0); only ``x`` -> a new free dim of ``x``,
  the first of its free dims (result axis ``len(batch)``); only ``q`` -> a new free dim
  of ``q``, after the batch dims and ``x``'s free dims. ``None`` when only ``q`` is
  mapped and the scales could not be folded through the new dims (map both then).
  Used by the hi primitive and the lo one alike.
  """
  (lc, rc), (lb, rb) = dims
  sx, sq = int(x_mapped), int(q_mapped)
  lc2, lb2 = tuple(d + sx for d in lc), tuple(d + sx for d in lb)
  rc2, rb2 = tuple(d + sq for d in rc), tuple(d + sq for d in rb)
  if x_mapped and q_mapped:
    return ((lc2, rc2), ((0, *lb2), (0, *rb2))), 0
  if x_mapped:
    return ((lc2, rc2), (lb2, rb2)), len(lb)
  new = ((lc2, rc2), (lb2, rb2))
  if scale_side(q_rank + 1, new) is None:
    return None
  return new, len(lb) + len(free_dims(x_rank, lc, lb))


def transpose_lhs(dims: DotDims, x_rank: int, y_rank: int, swap_ans: bool = False):
  """How ``dot_general(x, y, dims)``'s transpose in ``x`` is computed from the cotangent
  ``g``: ``dot_general(g, y, dims2)`` has ``x``'s dims in the order ``order``, so
  transposing it by ``argsort(order)`` gives ``x``'s layout. ``swap_ans``: ``x`` was the
  right operand (for the transpose in the right operand, call with the dims swapped).
  Returns ``(dims2, order)``; JAX's own rule (``lax._dot_general_transpose_lhs``)."""
  (xc, yc), (xb, yb) = dims
  x_kept, y_kept = free_dims(x_rank, xc, xb), free_dims(y_rank, yc, yb)
  nb = len(xb)
  if swap_ans:
    ans_y = tuple(range(nb, nb + len(y_kept)))
  else:
    ans_y = tuple(range(nb + len(x_kept), nb + len(x_kept) + len(y_kept)))
  dims2 = ((ans_y, tuple(y_kept)), (tuple(range(nb)), tuple(yb)))
  by_y = [c for _, c in sorted(zip(yc, xc))]
  return dims2, [*xb, *x_kept, *by_y]


def swapped(dims: DotDims) -> DotDims:
  """The dims of ``dot_general(y, x)`` for ``dot_general(x, y, dims)``'s operands swapped."""
  (xc, yc), (xb, yb) = dims
  return (yc, xc), (yb, xb)
