"""hxmlir: structured array types that keep their meaning through JAX's compiler.

``import hxmlir as hx``. Hi types: quantized arrays (``hx.QArray``,
``q8[m,n]``), rank-1 matrices (``hx.Rank1``, ``r1[m,n]``) and tuples
(``hx.HiTup``, ``Tup{...}``), usable under ``jit``, ``grad``, ``vmap``, ``scan``,
explicit sharding and ``shard_map``. They lower to ``stablehlo.composite`` ops
named ``hx.*``.
"""

from hxmlir._version import __version__ as __version__
from hxmlir.integration.dispatch import jit as jit
from hxmlir.types.einsum import einsum as einsum
from hxmlir.types.gather import take_rows as take_rows
from hxmlir.types.qarray import (
    QArray as QArray,
)
from hxmlir.types.qarray import (
    QArrayP as QArrayP,
)
from hxmlir.types.qarray import (
    QArraySpec as QArraySpec,
)
from hxmlir.types.qarray import (
    QArrayTy as QArrayTy,
)
from hxmlir.types.qarray import (
    dequantize as dequantize,
)
from hxmlir.types.qarray import (
    make_qarray as make_qarray,
)
from hxmlir.types.qarray import (
    matmul_q as matmul_q,
)
from hxmlir.types.qarray import (
    qarray_parts as qarray_parts,
)
from hxmlir.types.qarray import (
    quantize as quantize,
)
from hxmlir.types.rank1 import (
    Rank1 as Rank1,
)
from hxmlir.types.rank1 import (
    Rank1P as Rank1P,
)
from hxmlir.types.rank1 import (
    Rank1Spec as Rank1Spec,
)
from hxmlir.types.rank1 import (
    Rank1Ty as Rank1Ty,
)
from hxmlir.types.rank1 import (
    factors as factors,
)
from hxmlir.types.rank1 import (
    matmul_r1 as matmul_r1,
)
from hxmlir.types.rank1 import (
    outer as outer,
)
from hxmlir.types.tuples import (
    HiTup as HiTup,
)
from hxmlir.types.tuples import (
    TupP as TupP,
)
from hxmlir.types.tuples import (
    TupSpec as TupSpec,
)
from hxmlir.types.tuples import (
    TupTy as TupTy,
)
from hxmlir.types.tuples import (
    get_tuple_element as get_tuple_element,
)
from hxmlir.types.tuples import (
    make_tup as make_tup,
)

# isort: split
# The lo primitives and every rule that lowers the types above: to_lojax rules
# (lowering/to_lojax.py) and StableHLO lowering rules (lowering/rules.py; hx.matmul_q's,
# every platform's, in lowering/matmul_q/). Imported here so ``import hxmlir`` is all a user needs.
from hxmlir import lowering as lowering  # noqa: E402
from hxmlir.lowering.attention import attention as attention  # noqa: E402
from hxmlir.lowering.matmul_q.cpu import CpuKernelInfo as CpuKernelInfo  # noqa: E402
from hxmlir.lowering.matmul_q.cpu import cpu_kernel_info as cpu_kernel_info  # noqa: E402
from hxmlir.lowering.matmul_q.cpu import (  # noqa: E402
    keep_native_cpu_calls as keep_native_cpu_calls,
)
from hxmlir.types import control_flow as _control_flow  # noqa: E402,F401  (vmap of lax control flow)

# isort: split
from hxmlir.integration.installation import VerificationError as VerificationError  # noqa: E402
from hxmlir.integration.installation import install as install  # noqa: E402
from hxmlir.integration.installation import installed as installed  # noqa: E402
from hxmlir.integration.installation import is_installed as is_installed  # noqa: E402
from hxmlir.integration.installation import stats as stats  # noqa: E402
from hxmlir.integration.installation import uninstall as uninstall  # noqa: E402
