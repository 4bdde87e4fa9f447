"""Tensor-parallel placement of a LLaMA decoder on a one-axis device mesh (Megatron-style).

:func:`shard_params` places the weights pytree of :func:`hxmlir.models.llama.params_of`
on a ``jax.sharding.Mesh`` with one axis of ``n`` devices (:func:`auto_mesh`), each
weight in its stored hx format, by the rule of :func:`weight_spec`:

==================================  ===========  ========================================
weights (``[out, in]`` as stored)   split along  why
==================================  ===========  ========================================
``q``, ``k``, ``v``, ``gate``,      ``out``      column-parallel: each device computes
``up``                                           ``out / n`` of the projection's outputs
``o``, ``down``                     ``in``       row-parallel: each device contracts its
                                                 ``in / n`` slice, the partial sums are
                                                 all-reduced; *replicated* when
                                                 ``in / n`` would split a quantization
                                                 group (or a packed byte)
``embed`` (and ``output``)          ``vocab``    rows: the gather and the tied head each
                                                 touch ``vocab / n`` rows per device
``attn_norm``, ``ffn_norm``,        (none)       replicated: ``f32[d]``, read by every
``norm``                                         device
==================================  ===========  ========================================

An axis that ``n`` does not divide evenly stays unsplit (JAX places only even shards).
Groups run along ``in`` (the stored rows' contiguous axis), so an ``out`` split never cuts
one; an ``in`` split of ``u4o[576, 576:g32,f16]`` over 2 devices gives each 9 whole
groups, over 4 or 8 it would cut a group (18 groups of 32 do not split 4 ways): that
weight is replicated here, and placing it so by hand stays the type's ``TypeError``
(:func:`hxmlir.formats.split_problem`, the one rule of the types and ``hx-verify``).

KV cache (:func:`cache_spec`; per layer, keys ``f32[kv_heads, C, head_dim]``): split along its
heads when ``n`` divides ``kv_heads`` (then attention is local to each device); else along
its positions ``C`` when ``n`` divides ``C``; else replicated. SmolLM2 has 3 KV heads, which
2, 4 or 8 devices do not divide, so there the cache splits along positions: each device
keeps ``C / n`` positions of every head (the cache's memory splits ``n`` ways, as it
would by heads), a token's K and V land on the device that owns its position (a masked
update: no cache traffic), and the attention scores are sharded along positions; the partitioner all-reduces softmax's
max and sum and the partial products with V (sequence-parallel decoding). Splitting
``head_dim`` instead would cut the rotary pairs and every score into partial sums;
replicating would keep ``n`` full copies of the largest buffer of a long context.

Projections (:func:`projection`). Each device multiplies by its own shard: the
projection is a ``shard_map`` over the weight's components (values, scales, offsets),
``hx.einsum("...k,nk->...n")`` on the local shard inside, its result sharded along
``out`` (column-parallel) or summed over the mesh with ``psum`` (row-parallel). Left to
the partitioner (mesh axes of type Auto), the ``hx.matmul_q`` composite's decomposition
(a loop over blocks of the weight, ``lax.fori_loop`` with dynamic slices) cannot be
partitioned along a sharded weight axis: XLA would all-gather every weight on every
device at every step. Everything else (norms, rotary embeddings, attention, the embedding
gather) is the partitioner's, by sharding propagation (Shardy) from the placed weights
and cache; the logits come back replicated (:func:`replicated`). Per decode step and
block that leaves activation-sized collectives only (2 devices: the ``psum`` of O and
down, the gathers of Q, K and V's outputs, attention's three all-reduces). The program is
the same SPMD program on one process or on several (``jax.distributed``): :func:`place`
builds each device's shard from the host copy, which every process holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from hxmlir import formats
from hxmlir.types.einsum import einsum
from hxmlir.types.qarray import QArray, QArrayTy, make_qarray, qarray_parts

COLUMN_PARALLEL = ("q", "k", "v", "gate", "up", "qkv", "gate_up")
"""Per-layer weights split along ``out`` (their first axis); ``qkv`` and ``gate_up`` are
:func:`hxmlir.models.llama.params_of`'s fused ones."""

ROW_PARALLEL = ("o", "down")
"""Per-layer weights split along ``in`` (their last axis, the contraction) where the
quantization groups allow it, else replicated."""


def auto_mesh(mesh) -> Mesh:
  """``mesh`` (a ``jax.sharding.Mesh`` of one axis, of any axis type) as the mesh the
  decoder runs on: the same devices and axis name, the axis ``AxisType.Auto``. On an
  Explicit axis a row-parallel projection (``in`` sharded) is a ``TypeError``, as for
  JAX's dot; on an Auto axis each device's partial sum is all-reduced by the
  partitioner, which also places the activations. Raises ``TypeError`` for anything but
  a ``Mesh``, ``ValueError`` for a mesh of several axes."""
  if not isinstance(mesh, Mesh):
    raise TypeError(f"mesh= takes a jax.sharding.Mesh (jax.make_mesh((n,), ('i',))), got "
                    f"{type(mesh).__name__}")
  if len(mesh.axis_names) != 1:
    raise ValueError(f"mesh= takes a mesh of one axis, got axes {mesh.axis_names} of sizes "
                     f"{tuple(mesh.devices.shape)}")
  if mesh.axis_types[0] == AxisType.Auto:
    return mesh
  return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,))


def _splits(value, axis: int, ways: int) -> bool:
  """Whether ``value``'s dense ``axis`` splits into ``ways`` even shards, and, for the last
  axis of a quantized value, into whole groups and stored elements."""
  ty = jax.typeof(value)
  shape = tuple(ty.shape)
  if shape[axis] % ways:
    return False
  if isinstance(ty, QArrayTy) and axis in (-1, len(shape) - 1):
    return formats.split_problem(ty.format, shape[-1], ty.group, ways, "") is None
  return True


def weight_spec(name: str, value, ways: int, axis: str) -> PartitionSpec:
  """The partition spec of weight ``name`` (a key of a layer of
  :func:`hxmlir.models.llama.params_of`, or ``"embed"``, ``"output"``, ``"norm"``) holding
  ``value`` (an array or a quantized value of dense shape ``[out, in]``, or a norm's
  ``[d]``) on a mesh axis ``axis`` of ``ways`` devices: the table of this module's
  docstring. ``P()`` (replicated) wherever the split is uneven or would cut a group."""
  if name in COLUMN_PARALLEL or name in ("embed", "output"):
    return PartitionSpec(axis, None) if _splits(value, 0, ways) else PartitionSpec()
  if name in ROW_PARALLEL:
    return PartitionSpec(None, axis) if _splits(value, -1, ways) else PartitionSpec()
  return PartitionSpec()


def param_shardings(params: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
  """The pytree of ``params`` with each weight replaced by its ``NamedSharding`` on
  ``mesh`` (one axis, :func:`auto_mesh`), of spec :func:`weight_spec`: what
  :func:`shard_params` places and the decoder's jitted functions take as
  ``in_shardings``."""
  mesh = auto_mesh(mesh)
  axis, ways = mesh.axis_names[0], mesh.devices.size
  named = lambda k, v: NamedSharding(mesh, weight_spec(k, v, ways, axis))
  out = {k: named(k, v) for k, v in params.items() if k != "layers"}
  out["layers"] = [{k: named(k, v) for k, v in layer.items()} for layer in params["layers"]]
  return out


def place(value, sharding: NamedSharding):
  """``value`` (an array, or a quantized value whose components are arrays) placed by
  ``sharding`` of its dense shape. Within one process this is ``jax.device_put``; on a mesh
  that spans processes (``jax.distributed``) each component is built shard by shard from
  this process's host copy (``jax.make_array_from_callback``), as every process holds the
  same file: ``device_put`` would refuse an array committed to one local device. Raises
  the type's ``TypeError`` when ``sharding`` would split a quantization group."""
  if sharding.is_fully_addressable:
    return jax.device_put(value, sharding)
  if isinstance(value, QArray):
    specs = jax.typeof(value).hx_lo_specs(sharding.spec, sharding.mesh)
    return QArray(*(_from_host(c, NamedSharding(sharding.mesh, s))
                    for c, s in zip(value.components, specs)))
  return _from_host(value, sharding)


def _from_host(array, sharding: NamedSharding) -> jax.Array:
  host = np.asarray(array)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_params(params: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
  """``params`` (:func:`hxmlir.models.llama.params_of`: ``{"embed", "norm", "layers":
  [...], ["output"]}``) placed tensor-parallel on ``mesh`` (one Auto axis of ``n``
  devices) by :func:`param_shardings`, every weight in its stored format: Q/K/V/gate/up
  along ``out``, O/down along ``in`` where whole groups split ``n`` ways (else
  replicated), the embedding and an untied head along the vocabulary, norms replicated.
  Raises :func:`auto_mesh`'s errors for another kind of mesh."""
  shardings = param_shardings(params, mesh)
  out = {k: place(v, shardings[k]) for k, v in params.items() if k != "layers"}
  out["layers"] = [{k: place(v, s[k]) for k, v in layer.items()}
                   for layer, s in zip(params["layers"], shardings["layers"])]
  return out


def tp_einsum(x, w, spec: PartitionSpec, mesh: Mesh) -> jax.Array:
  """``hx.einsum("...k,nk->...n", x, w)`` (``x: f32[..., k]``, ``w: q8[n, k]`` of any
  format, or a dense ``f32[n, k]``) with ``w`` placed by ``spec`` on ``mesh`` (one axis),
  each device on its shard: ``P(axis, None)`` (column-parallel) gives ``f32[..., n]``
  sharded along ``n``; ``P(None, axis)`` (row-parallel) takes ``x``'s matching slice of
  ``k`` and ``psum``'s the partial products, replicated; ``P()`` is the plain product on
  every device. A ``shard_map`` over the weight's components, since a quantized value
  crosses ``shard_map`` partitioned along its leading axes only; the components' specs
  are the type's (:meth:`hxmlir.types.qarray.QArrayTy.hx_lo_specs`: group scales split with
  the groups). Call it under ``jit``."""
  if spec == PartitionSpec():
    return einsum("...k,nk->...n", x, w)
  axis = mesh.axis_names[0]
  row = tuple(spec)[-1] is not None
  ty = jax.typeof(w)
  quantized = isinstance(ty, QArrayTy)
  parts = qarray_parts(w) if quantized else (w,)
  specs = ty.hx_lo_specs(spec, mesh) if quantized else (spec,)
  lead = (None,) * (x.ndim - 1)

  def local(x, *parts):
    y = einsum("...k,nk->...n", x, make_qarray(*parts) if quantized else parts[0])
    return jax.lax.psum(y, axis) if row else y
  return jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(*lead, axis if row else None),
                                                   *specs),
                       out_specs=PartitionSpec(*lead, None if row else axis))(x, *parts)


def projection(params: dict[str, Any], mesh: Mesh) -> Callable:
  """The decoder's projection on ``mesh`` for ``params`` as :func:`shard_params` places
  them: ``proj(x, w, name) -> f32[..., n]`` for weight ``w`` of a layer's key ``name``
  (``"q"`` ... ``"down"``) or ``"output"`` (the head, tied or not), by
  :func:`tp_einsum` with that weight's :func:`weight_spec` (the same for every layer)."""
  mesh = auto_mesh(mesh)
  axis, ways = mesh.axis_names[0], mesh.devices.size
  layer = params["layers"][0]
  specs = {k: weight_spec(k, w, ways, axis) for k, w in layer.items()
           if k in COLUMN_PARALLEL or k in ROW_PARALLEL}
  specs["output"] = weight_spec("output", params.get("output", params["embed"]), ways, axis)
  return lambda x, w, name: tp_einsum(x, w, specs[name], mesh)


def cache_spec(kv_heads: int, max_context: int, mesh: Mesh,
               layout: str = "kcd") -> PartitionSpec:
  """The partition spec of one layer of a KV cache on ``mesh``: ``layout`` ``"kcd"`` for
  ``f32[kv_heads, max_context, head_dim]`` (keys, and ``q8`` values), ``"kdc"`` for
  ``f32[kv_heads, head_dim, max_context]`` (f32 values). Along heads when the mesh's
  ``n`` devices divide ``kv_heads``, else along positions when they divide
  ``max_context``, else replicated (why: the module's docstring). Raises
  ``ValueError`` for another ``layout``."""
  if layout not in ("kcd", "kdc"):
    raise ValueError(f"layout={layout!r}: expected 'kcd' or 'kdc'")
  axis, ways = mesh.axis_names[0], mesh.devices.size
  split = "k" if kv_heads % ways == 0 else "c" if max_context % ways == 0 else None
  if split is None:
    return PartitionSpec()
  return PartitionSpec(*(axis if a == split else None for a in layout))


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding of a value every device (and process) holds whole: the logits."""
  return NamedSharding(mesh, PartitionSpec())
