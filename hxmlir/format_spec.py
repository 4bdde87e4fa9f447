"""The record of one quantization format, :class:`Format`: what :mod:`hxmlir.formats` (every
format, by name, and the helpers that read them) and :mod:`hxmlir.block_formats` (GGUF's
block formats) define their formats with; with the scale dtypes (:data:`F32`, :data:`F16`)
and the kernels' weight layouts (:data:`WEIGHT_LAYOUTS`). :mod:`hxmlir.formats` re-exports
these names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)


WEIGHT_LAYOUTS = {
    "kn": "W[in, out] = Q[*b, k, n], quantized along the free axis n: x @ w, "
          "CPU kernels hx_matmul_q_cpu_v1/v2, Pallas kernels hx_matmul_q_v1/v2",
    "nk": "W[out, in] = Q[*b, n, k], groups along the contraction k: "
          "hx.einsum('...k,nk->...n', x, w), CPU kernel hx_matmul_q_cpu_v3, Pallas kernel hx_matmul_q_nk_v1",
}
"""The weight layouts of the ``hx.matmul_q`` kernels (``Format.native_cpu`` and ``Format.pallas``
name them)."""


@dataclass(frozen=True)
class Format:
  """One value format: ``name`` (``hx.quantize``'s ``dtype``: ``"int4"``), ``prefix``
  (the type's printed name: ``q4``), ``value_dtype`` (the values' own dtype),
  ``storage_dtype`` (the lo component's dtype), ``mlir`` (that dtype as MLIR spells it),
  ``pack`` (values per stored element), ``qmax`` (largest magnitude produced),
  ``layout`` (the storage layout's name, see :mod:`hxmlir.formats`), ``scale_dtype``
  (the scales' dtype, and the offsets'), ``offset`` (whether ``x = q * s + o``),
  ``value_range`` (the values the storage holds, ``(lo, hi)``), ``native_cpu`` and
  ``pallas`` (the weight layouts of :data:`WEIGHT_LAYOUTS` the native CPU kernel and the
  Pallas kernels take it in; elsewhere the platform's rule emits the StableHLO
  decomposition). A *block format* (``block > 0``: GGUF's blocks at the file's bytes) stores
  each block of ``block`` elements as ``fields`` (``(name, bytes, meaning)`` in order, the
  table of :mod:`hxmlir.block_formats`) in ``ui16`` words, its scale (and offset) one f16 per block;
  ``gguf`` names the GGUF type it holds."""
  name: str
  prefix: str
  value_dtype: np.dtype
  storage_dtype: np.dtype
  mlir: str
  pack: int
  qmax: float
  layout: str
  scale_dtype: np.dtype = F32
  offset: bool = False
  value_range: tuple[float, float] = (-127, 127)
  native_cpu: tuple[str, ...] = ("kn", "nk")
  pallas: tuple[str, ...] = ("kn", "nk")
  block: int = 0
  fields: tuple[tuple[str, int, str], ...] = ()
  gguf: str = ""

  @property
  def block_bytes(self) -> int:
    """A block format's stored bytes per block (its :attr:`fields`' sum; 0 for the others)."""
    return sum(b for _, b, _ in self.fields)

  @property
  def block_words(self) -> int:
    """A block format's stored ``ui16`` words per block (the values' last axis)."""
    return self.block_bytes // 2

  @property
  def integer(self) -> bool:
    """Whether values are integers (rounded) rather than floats (cast)."""
    return jnp.issubdtype(self.value_dtype, jnp.integer)

  @property
  def signed(self) -> bool:
    """Whether stored values are signed (packed nibbles sign-extended when decoded)."""
    return self.value_range[0] < 0

  @property
  def scale_mlir(self) -> str:
    """The scale's (and offset's) element type as MLIR spells it: ``f32``, ``f16``."""
    return {F32: "f32", F16: "f16"}[self.scale_dtype]

  @property
  def legacy(self) -> bool:
    """Whether the composites' format attributes of their first versions (f32 scales, no
    offset: ``dtype``, ``group_size``, ``layout``) say this format."""
    return self.scale_dtype == F32 and not self.offset

  def storage_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The stored values' shape for dense ``shape`` (``n // pack`` along the last axis; a
    block format's ``[*lead, n // block, block_words]``)."""
    if self.block:
      return (*shape[:-1], shape[-1] // self.block, self.block_words)
    return (*shape[:-1], shape[-1] // self.pack)

  def dense_shape(self, storage_shape: Sequence[int]) -> tuple[int, ...]:
    """The dense shape of stored values of ``storage_shape``."""
    if self.block:
      return (*storage_shape[:-2], storage_shape[-2] * self.block)
    return (*storage_shape[:-1], storage_shape[-1] * self.pack)

  def value_parts(self, parts: Sequence) -> tuple:
    """The stored values' per-axis entries (partition entries, shardings) from the dense
    value's ``parts``: the same, and ``None`` for a block format's block axis."""
    return (*parts, None) if self.block else tuple(parts)

  def dense_parts(self, value_parts: Sequence) -> tuple:
    """:meth:`value_parts`' inverse: the dense value's entries from the stored values'."""
    return tuple(value_parts)[:-1] if self.block else tuple(value_parts)
