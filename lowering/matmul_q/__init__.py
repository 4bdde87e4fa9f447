"""``hx.matmul_q`` in one place: the lo primitive ``hx_matmul_q_p``'s typing, batching and
lowering rules for every platform.

``y = dot_general(x, dequantize(q, s[, o]), dimension_numbers)`` for a dense ``x: f32[...]``
and a quantized weight of any format (:mod:`hxmlir.formats`): the hi primitive
``hxmlir.types.qarray.MatmulQ`` binds ``hx_matmul_q_p`` (``lowering/to_lojax.py``), which
lowers to one ``stablehlo.composite "hx.matmul_q"`` (schema: ``lowering/schema.py``) whose
decomposition depends on the platform, as JAX registers a primitive's default rule and
its ``platform=`` rules side by side (``jax/_src/lax/linalg.py``):

==============================  ==========================================================
module                          what
==============================  ==========================================================
:mod:`.primitive`               abstract eval (result type and sharding) and batching
:mod:`.default`                 the default rule: the reference decomposition; the dims,
                                attributes and weight format every rule shares
:mod:`.cpu`                     ``platform="cpu"``: the native kernels (FFI targets
                                ``hx_matmul_q_cpu_v1/_v2/_v3``, loaded at import) while
                                installed, else the streaming or blocked StableHLO
:mod:`.streaming`               StableHLO builders that stream an int8 weight (the CPU rule,
                                ``hx-fold-scales``)
:mod:`.blocked`                 any dims and format, one block of the weight at a time
:mod:`.pallas`                  ``cuda``/``rocm``/``tpu``: the Pallas kernels (Triton,
                                Mosaic; ``hx_matmul_q_v1/_v2``, ``hx_matmul_q_nk_v1``)
==============================  ==========================================================

Importing this package registers every rule (``import hxmlir`` does).
"""

import functools

from jax.interpreters import mlir

from hxmlir.lowering.matmul_q import blocked as blocked
from hxmlir.lowering.matmul_q import cpu as cpu
from hxmlir.lowering.matmul_q import default as default
from hxmlir.lowering.matmul_q import pallas as pallas
from hxmlir.lowering.matmul_q import primitive as primitive
from hxmlir.lowering.matmul_q import streaming as streaming
from hxmlir.lowering.primitives import hx_matmul_q_p

mlir.register_lowering(hx_matmul_q_p, default.lower_matmul_q)
mlir.register_lowering(hx_matmul_q_p, cpu.lower_matmul_q_cpu, platform="cpu")
for _platform in ("cuda", "rocm", "tpu"):
  mlir.register_lowering(hx_matmul_q_p,
                         functools.partial(pallas.lower_matmul_q_accelerator, platform=_platform),
                         platform=_platform)
