"""A Pallas kernel for ``hx.matmul_q`` that reads quantized weight tiles and scales directly.

``y = x @ dequantize(q, s)`` for ``x: f32[*b, m, k]`` and a weight of dense shape
``[*b, k, n]`` in any format of :mod:`hxmlir.formats`, quantized along ``n``:
``q: i8[*b, k, n]`` (int8), ``ui8[*b, k, n / 2]`` (int4, layout ``int4_pairs_v1``) or
``f8E4M3FN[*b, k, n]`` (fp8 e4m3fn), with scales ``s: f32[*b, k]`` (one per row of
the weight) or ``f32[*b, k, n / g]`` (one per group of ``g`` consecutive elements of
``n``, the free axis) -> ``f32[*b, m, n]``. One kernel body, written once, lowered by
Pallas for

- TPU: Mosaic, custom call ``tpu_custom_call`` (``kernel_name`` attribute),
- GPU: Triton, custom call ``__gpu$xla.gpu.triton`` (``name`` in its backend
  config), with the Triton compiler parameters given explicitly,
- any platform: Pallas interpret mode (``interpret=True``) runs either flavour
  (with the Triton flavour's masked loads) as plain XLA, which is how the
  kernel is tested on CPU. The
  kernel has run in interpret mode only, and the Triton and Mosaic flavours are
  checked by lowering for ``cuda`` and ``tpu`` from CPU (Mosaic's own compiler,
  which runs on a TPU host, has not seen them).

Kernel names and calling conventions (:data:`KERNEL_VERSION`, registered in
:mod:`hxmlir.targets` for ``cuda``, ``rocm`` (Triton) and ``tpu`` (Mosaic), so
``jax.export`` accepts them once ``hx.install()`` has run), operands ``(x, s, q)``:

- ``hx_matmul_q_v1``: ``x: f32[B, mp, kp]``, ``s: f32[B, 1, kp]``, ``q: i8[B, k, n]``
  -> ``f32[B, mp, np]`` (int8 values, per-row scales; ``B`` the batch dims
  collapsed, ``mp``/``kp``/``np`` ``m``/``k``/``n`` rounded up to whole blocks,
  ``x`` and ``s`` zero-padded).
- ``hx_matmul_q_v2``: the same, with ``q`` of any format (``ui8[B, k, n / 2]``,
  ``f8E4M3FN[B, k, n]``) and, per group of ``g``, ``s: f32[B, k, n / g]``, not padded
  (the format and the group follow from the operand types). The kernel emits
  ``v1`` for int8 per-row weights (exactly v1's call, so those artifacts keep
  loading in code that knows v1 only) and ``v2`` for every other format.

- ``hx_matmul_q_nk_v1`` (:func:`matmul_q_nk_pallas`): the checkpoint layout
  ``W[out, in]`` (GGUF, torch ``Linear``; ``hx.einsum("...k,nk->...n", x, w)``) with
  groups along the contraction ``k``, every format of :mod:`hxmlir.formats` (f16 scales
  widened in the kernel, offsets: each tile dequantized as ``q * s + o``); operands
  ``(x, q, s[, o])``, see that function.
- ``hx_matmul_q_nk_blocks_v1`` (:func:`matmul_q_nk_blocks_pallas`): the same layout for
  GGUF's block formats at the file's bytes (Q5_0 ... IQ4_XS), two kernels of one name with
  operands of their own: Mosaic decodes bit planes of whole words (:mod:`.nk_blocks`),
  Triton gathers each element's bits (:mod:`.nk_blocks_triton`), both from
  :mod:`hxmlir.block_layout`; :func:`matmul_q_nk_pallas` sends those weights to it.

The lowering rules of ``hx_matmul_q_p`` for ``cuda``, ``rocm`` and ``tpu`` use a
kernel as the ``hx.matmul_q`` composite's decomposition while hxmlir is
installed with its kernels (:func:`hxmlir.install_state.use_kernels`, part of JAX's cache
keys), for each layout a weight's format takes (``Format.pallas``, the layouts of
:data:`hxmlir.formats.WEIGHT_LAYOUTS`); otherwise they emit the default composite with
the reference decomposition.

By concept: :mod:`.common` (backends, block checks, the ``pallas_call`` skeleton both
kernels share), :mod:`.kn` (the ``Q[k, n]`` kernel), :mod:`.nk` (the ``W[n, k]`` kernel),
:mod:`.nk_blocks` (the ``W[n, k]`` kernel of the block formats on Mosaic, and the entry for
both backends), :mod:`.nk_blocks_triton` (its Triton kernel), :mod:`.rules` (the lowering
rules).
"""

from hxmlir.lowering.matmul_q.pallas.common import BACKENDS as BACKENDS
from hxmlir.lowering.matmul_q.pallas.common import MOSAIC_MAX_BLOCK_N as MOSAIC_MAX_BLOCK_N
from hxmlir.lowering.matmul_q.pallas.common import TRITON_NUM_STAGES as TRITON_NUM_STAGES
from hxmlir.lowering.matmul_q.pallas.common import TRITON_NUM_WARPS as TRITON_NUM_WARPS
from hxmlir.lowering.matmul_q.pallas.common import mosaic_compiles as mosaic_compiles
from hxmlir.lowering.matmul_q.pallas.kn import KERNEL_NAME as KERNEL_NAME
from hxmlir.lowering.matmul_q.pallas.kn import KERNEL_VERSION as KERNEL_VERSION
from hxmlir.lowering.matmul_q.pallas.kn import MOSAIC_TPU_KERNEL as MOSAIC_TPU_KERNEL
from hxmlir.lowering.matmul_q.pallas.kn import MOSAIC_TPU_KERNELS as MOSAIC_TPU_KERNELS
from hxmlir.lowering.matmul_q.pallas.kn import TRITON_KERNEL as TRITON_KERNEL
from hxmlir.lowering.matmul_q.pallas.kn import TRITON_KERNELS as TRITON_KERNELS
from hxmlir.lowering.matmul_q.pallas.kn import V1_VERSION as V1_VERSION
from hxmlir.lowering.matmul_q.pallas.kn import default_blocks as default_blocks
from hxmlir.lowering.matmul_q.pallas.kn import kernel_version as kernel_version
from hxmlir.lowering.matmul_q.pallas.kn import matmul_q_pallas as matmul_q_pallas
from hxmlir.lowering.matmul_q.pallas.nk import NK_KERNEL_NAME as NK_KERNEL_NAME
from hxmlir.lowering.matmul_q.pallas.nk import NK_KERNEL_VERSION as NK_KERNEL_VERSION
from hxmlir.lowering.matmul_q.pallas.nk import NK_MOSAIC_TPU_KERNEL as NK_MOSAIC_TPU_KERNEL
from hxmlir.lowering.matmul_q.pallas.nk import NK_TRITON_KERNEL as NK_TRITON_KERNEL
from hxmlir.lowering.matmul_q.pallas.nk import default_blocks_nk as default_blocks_nk
from hxmlir.lowering.matmul_q.pallas.nk import matmul_q_nk_pallas as matmul_q_nk_pallas
from hxmlir.lowering.matmul_q.pallas.nk_blocks import (
    BLOCKS_MOSAIC_TPU_KERNEL as BLOCKS_MOSAIC_TPU_KERNEL,
)
from hxmlir.lowering.matmul_q.pallas.nk_blocks import (
    matmul_q_nk_blocks_pallas as matmul_q_nk_blocks_pallas,
)
from hxmlir.lowering.matmul_q.pallas.nk_blocks_triton import (
    BLOCKS_TRITON_KERNEL as BLOCKS_TRITON_KERNEL,
)
from hxmlir.lowering.matmul_q.pallas.rules import (
    lower_matmul_q_accelerator as lower_matmul_q_accelerator,
)
from hxmlir.lowering.matmul_q.pallas.rules import nk_dims as nk_dims
