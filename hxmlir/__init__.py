"""hxmlir: structured array types that keep their meaning through JAX's compiler.

``import hxmlir as hx``. Hi types: quantized arrays (``hx.QArray``,
``q8[m,n]``), rank-1 matrices (``hx.Rank1``, ``r1[m,n]``) and tuples
(``hx.HiTup``, ``Tup{...}``), usable under ``jit``, ``grad``, ``vmap``, ``scan``,
explicit sharding and ``shard_map``. They lower to ``stablehlo.composite`` ops
named ``hx.*``.
"""

from hxmlir.dispatch import jit as jit
from hxmlir.einsum import einsum as einsum
from hxmlir.gather import take_rows as take_rows
from hxmlir.qarray import (
    QArray as QArray,
)
from hxmlir.qarray import (
    QArrayP as QArrayP,
)
from hxmlir.qarray import (
    QArraySpec as QArraySpec,
)
from hxmlir.qarray import (
    QArrayTy as QArrayTy,
)
from hxmlir.qarray import (
    dequantize as dequantize,
)
from hxmlir.qarray import (
    make_qarray as make_qarray,
)
from hxmlir.qarray import (
    matmul_q as matmul_q,
)
from hxmlir.qarray import (
    qarray_parts as qarray_parts,
)
from hxmlir.qarray import (
    quantize as quantize,
)
from hxmlir.rank1 import (
    Rank1 as Rank1,
)
from hxmlir.rank1 import (
    Rank1P as Rank1P,
)
from hxmlir.rank1 import (
    Rank1Spec as Rank1Spec,
)
from hxmlir.rank1 import (
    Rank1Ty as Rank1Ty,
)
from hxmlir.rank1 import (
    factors as factors,
)
from hxmlir.rank1 import (
    matmul_r1 as matmul_r1,
)
from hxmlir.rank1 import (
    outer as outer,
)
from hxmlir.tuples import (
    HiTup as HiTup,
)
from hxmlir.tuples import (
    TupP as TupP,
)
from hxmlir.tuples import (
    TupSpec as TupSpec,
)
from hxmlir.tuples import (
    TupTy as TupTy,
)
from hxmlir.tuples import (
    get_tuple_element as get_tuple_element,
)
from hxmlir.tuples import (
    make_tup as make_tup,
)

# isort: split
# The lo primitives and every rule that lowers the types above: to_lojax rules
# (lowering/to_lojax.py) and StableHLO lowering rules (lowering/rules.py and the
# per-platform kernels). Imported here so ``import hxmlir`` is all a user needs.
from hxmlir import control_flow as _control_flow  # noqa: E402,F401  (vmap of lax control flow)
from hxmlir import lowering as lowering  # noqa: E402
from hxmlir.lowering.matmul_q_cpu import CpuKernelInfo as CpuKernelInfo  # noqa: E402
from hxmlir.lowering.matmul_q_cpu import cpu_kernel_info as cpu_kernel_info  # noqa: E402
from hxmlir.lowering.matmul_q_cpu import (  # noqa: E402
    keep_native_cpu_calls as keep_native_cpu_calls,
)

__version__ = "0.1.0"

# isort: split
from hxmlir.installation import VerificationError as VerificationError  # noqa: E402
from hxmlir.installation import install as install  # noqa: E402
from hxmlir.installation import installed as installed  # noqa: E402
from hxmlir.installation import is_installed as is_installed  # noqa: E402
from hxmlir.installation import stats as stats  # noqa: E402
from hxmlir.installation import uninstall as uninstall  # noqa: E402
