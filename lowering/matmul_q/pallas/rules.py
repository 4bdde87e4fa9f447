"""The lowering rules of ``hx_matmul_q_p`` for ``cuda``, ``rocm`` and ``tpu``: a Pallas
kernel (:mod:`.kn`, :mod:`.nk`) as the ``hx.matmul_q`` composite's decomposition while
hxmlir's kernels are installed, per shard in a program over several devices; the reference
decomposition otherwise.
"""

from __future__ import annotations

import functools

import jax

from hxmlir import _jax, formats
from hxmlir.install_state import use_kernels
from hxmlir.lowering.composite import lower_composite
from hxmlir.lowering.matmul_q import default
from hxmlir.lowering.matmul_q.pallas.common import BACKENDS, PLATFORM_BACKEND, mosaic_compiles
from hxmlir.lowering.matmul_q.pallas.kn import default_blocks, matmul_q_pallas
from hxmlir.lowering.matmul_q.pallas.nk import default_blocks_nk, matmul_q_nk_pallas
from hxmlir.types import dotdims


def _pallas_reference(backend: str):
  # One function object per backend, so lower_composite shares decompositions.
  return _PALLAS_REFERENCES[backend]


_PALLAS_REFERENCES = {b: functools.partial(matmul_q_pallas, backend=b)
                      for b in ("triton", "mosaic_tpu")}


def _kernel_fits(f: formats.Format, q_aval, s_aval, backend: str, layout: str = "kn") -> bool:
  """Whether the kernel of ``layout`` takes this weight of format ``f`` on ``backend`` (a group
  size without a tile, :func:`default_blocks` / :func:`default_blocks_nk`, keeps the
  reference; on Mosaic only the formats :func:`mosaic_compiles` names). The block formats keep
  the reference: their Mosaic kernel (:mod:`.nk_blocks`, called directly) was correct on a TPU
  v5e but took 0.5-5x the time of XLA's own decode and dot, per format (docs/pallas.md); their
  Triton kernel (:mod:`.nk_blocks_triton`) has not run on a GPU."""
  if f.block:
    return False
  dense = f.dense_shape(q_aval.shape)
  group = formats.group_of_scale(dense, s_aval)
  if backend == "mosaic_tpu" and not mosaic_compiles(f, group):
    return False
  if layout == "nk":  # W[n, k]: groups along k, the last axis
    return default_blocks_nk(1, dense[-1], dense[-2], backend, f, group) is not None
  return default_blocks(1, dense[-2], dense[-1], backend, f, group) is not None


def nk_dims(x_rank: int, q_rank: int) -> dotdims.DotDims | None:
  """The dims of the ``[out, in]`` layouts the kernel takes: ``f32[..., k] x W[n, k]``
  (``hx.einsum("...k,nk->...n")``, any rank of ``x``) and ``f32[*b, m, k] x W[*b, n, k]``
  (equal ranks >= 3), or ``None`` for other ranks."""
  if q_rank == 2 and x_rank >= 1:
    return ((x_rank - 1,), (1,)), ((), ())
  if x_rank == q_rank >= 3:
    batch = tuple(range(x_rank - 2))
    return ((x_rank - 1,), (q_rank - 1,)), (batch, batch)
  return None


def _pallas_kernel(ctx, dims, backend: str):
  """The kernel (a function of the operands ``x, q, s[, o]``) that computes this equation on
  ``backend``, run per shard in a program over several devices, or ``None`` (the reference):
  the layout (``"kn"``, ``"nk"``, :data:`hxmlir.formats.WEIGHT_LAYOUTS`) must be one the
  weight's format takes (``Format.pallas``) with a tile for its group size."""
  x_aval, q_aval, s_aval, *_ = ctx.avals_in
  f = default.weight_format(ctx)
  xr, qr = x_aval.ndim, q_aval.ndim
  if xr == qr and dims == dotdims.v1_dims(xr):
    layout, kernel = "kn", _pallas_reference(backend)
  elif qr == 2 and dims == dotdims.matmul_dims(xr, 2):
    layout, kernel = "kn", _PALLAS_COLLAPSED[backend]  # f32[..., k] x Q[k, n]: rows into m
  elif dims == nk_dims(xr, qr):
    layout, kernel = "nk", _PALLAS_NK[(backend, qr == 2)]
  else:
    return None
  if layout not in f.pallas or not _kernel_fits(f, q_aval, s_aval, backend, layout):
    return None
  if _jax.kernel_is_partitioned(ctx.module_context):
    return _kernel_per_shard(kernel, layout, *ctx.avals_in)
  return kernel


def lower_matmul_q_accelerator(ctx, x, q, s, *o, platform: str, dimension_numbers=None):
  """``hx_matmul_q_p`` on ``cuda``/``rocm``/``tpu``: the Pallas kernels as decomposition.

  While hxmlir is installed with its kernels the ``hx.matmul_q`` composite's decomposition calls a
  registered kernel where the weight's format takes its layout (``Format.pallas``):
  :func:`matmul_q_pallas` for version 1's layout ``f32[*b, m, k] x Q[*b, k, n]`` and
  ``f32[..., k] x Q[k, n]`` (``x``'s leading dims collapsed into ``m``), every format
  with f32 scales and no offset; :func:`matmul_q_nk_pallas` for the checkpoint layout
  ``f32[..., k] x W[n, k]`` (``hx.einsum("...k,nk->...n")``, groups along the
  contraction) and ``f32[*b, m, k] x W[*b, n, k]``, every format (f16 scales, offsets).
  Other dimension numbers, formats and group sizes no tile fits (:func:`default_blocks`,
  :func:`default_blocks_nk`), and every equation while hxmlir's kernels are not installed
  (:func:`hxmlir.install_state.use_kernels`), keep the
  reference decomposition (what the default rule emits).
  """
  dims = dimension_numbers or dotdims.v1_dims(ctx.avals_in[0].ndim)
  kernel = _pallas_kernel(ctx, dims, PLATFORM_BACKEND[platform]) if use_kernels() else None
  if kernel is None:
    return default.lower_matmul_q(ctx, x, q, s, *o, dimension_numbers=dimension_numbers)
  return lower_composite(ctx, "hx.matmul_q", x, q, s, *o, reference=kernel,
                         attributes=default.matmul_q_attributes(ctx, dims))


def _explicit_specs(*avals) -> tuple | None:
  """The mesh and each aval's partition spec (one entry per axis) when every aval has a
  sharding on one mesh whose axes are all explicit, else ``None``."""
  meshes = {getattr(getattr(a, "sharding", None), "mesh", None) for a in avals}
  if len(meshes) != 1:
    return None
  mesh = meshes.pop()
  if mesh is None or mesh.empty or not mesh.are_all_axes_explicit:
    return None
  return mesh, tuple(tuple(a.sharding.spec) + (None,) * (a.ndim - len(a.sharding.spec))
                     for a in avals)


def _mesh_axes(entry) -> tuple:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _kernel_per_shard(kernel, layout: str, x_aval, q_aval, s_aval, *o_aval):
  """``kernel(x, q, s[, o])`` run on each device's shards (``jax.shard_map``), or ``None``.

  For a program over several devices, where Mosaic refuses to be partitioned and XLA
  would replicate a Triton call's operands. The shards are the operands' own: explicit
  shardings (``ctx.avals_in``) on one mesh, the contraction axis ``k`` unsharded (as
  ``hx-verify`` requires), the batch axes of ``x`` and ``q`` sharded alike; each
  device computes its block of the result, rows like ``x`` and columns like the weight's
  free axis (``n``: ``q``'s last axis in layout ``"kn"``, its second last in ``"nk"``;
  scales and offsets sharded with it). ``None`` where the shardings are not known at
  lowering time (mesh axes of type Auto: XLA's propagation picks them later) or do not
  make independent blocks: the caller then keeps the reference decomposition, which XLA
  partitions like any dense dot.
  """
  found = _explicit_specs(x_aval, q_aval, s_aval, *o_aval)
  if found is None:
    return None
  mesh, (xs, qs, ss, *os_) = found
  per_group = s_aval.ndim == q_aval.ndim
  if layout == "kn":
    k_entries, col = (xs[-1], qs[-2], ss[-2] if per_group else ss[-1]), qs[-1]
  else:  # W[.., n, k], scales [.., n(, k / g)]
    k_entries, col = (xs[-1], qs[-1], *(ss[-1:] if per_group else ())), qs[-2]
  if any(e is not None for e in k_entries):
    return None                      # a sharded contraction: partial sums, not blocks
  if q_aval.ndim == x_aval.ndim and xs[:-2] != qs[:-2]:
    return None                      # batch axes sharded differently
  ys = (*xs[:-1], col)
  used = [a for e in ys for a in _mesh_axes(e)]
  if len(used) != len(set(used)):
    return None                      # one mesh axis on both rows and columns
  return _shard_mapped(kernel, mesh, (xs, qs, ss, *os_), ys)


@functools.lru_cache(maxsize=256)
def _shard_mapped(kernel, mesh, in_specs, ys):
  # one function object per (kernel, mesh, specs): lower_composite shares a
  # decomposition between equal keys, and the key holds this object
  from jax.sharding import PartitionSpec as P

  # the decomposition is traced on unsharded avals (lower_composite): on the mesh's
  # Auto twin shard_map takes them as they come, and lowers to the same manual axes
  auto = mesh.update_axis_types({a: jax.sharding.AxisType.Auto for a in mesh.axis_names})

  def per_shard(*operands):
    return jax.shard_map(kernel, mesh=auto, in_specs=tuple(P(*e) for e in in_specs),
                         out_specs=P(*ys), check_vma=False)(*operands)
  return per_shard


def _collapsed(x, q, s, *, backend: str):
  dense_n = formats.of_storage(q.dtype).dense_shape(q.shape)[-1]
  y = matmul_q_pallas(x.reshape(-1, x.shape[-1]), q, s, backend=backend)
  return y.reshape(*x.shape[:-1], dense_n)


_PALLAS_COLLAPSED = {b: functools.partial(_collapsed, backend=b) for b in ("triton", "mosaic_tpu")}


def _nk_collapsed(x, q, s, *o, backend: str):
  """``f32[..., k] x W[n, k] -> f32[..., n]``: ``x``'s leading dims collapsed into ``m``."""
  y = matmul_q_nk_pallas(x.reshape(-1, x.shape[-1]), q, s, *o, backend=backend)
  return y.reshape(*x.shape[:-1], q.shape[-2])


_PALLAS_NK = {**{(b, True): functools.partial(_nk_collapsed, backend=b) for b in BACKENDS},
              **{(b, False): functools.partial(matmul_q_nk_pallas, backend=b) for b in BACKENDS}}
"""The ``[out, in]`` kernel per ``(backend, weight of rank 2)``, one object each (shared
decompositions)."""

