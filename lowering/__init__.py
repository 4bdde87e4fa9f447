"""hxmlir.lowering: lo primitives, to_lojax rules and StableHLO lowering rules.

Importing this package registers every rule; ``import hxmlir`` does it.
"""

from hxmlir.lowering import (
    attention as attention,  # hx_attention_p: typing, batching, JVP, every platform's rule
)
from hxmlir.lowering import (
    matmul_q as matmul_q,  # hx_matmul_q_p: typing, batching, every platform's rule
)
from hxmlir.lowering import rules as rules
from hxmlir.lowering import to_lojax as to_lojax
from hxmlir.lowering.primitives import (
    hx_dequantize_p as hx_dequantize_p,
)
from hxmlir.lowering.primitives import (
    hx_matmul_q_p as hx_matmul_q_p,
)
from hxmlir.lowering.primitives import (
    hx_matmul_r1_p as hx_matmul_r1_p,
)
from hxmlir.lowering.primitives import (
    hx_outer_p as hx_outer_p,
)
from hxmlir.lowering.primitives import (
    hx_quantize_p as hx_quantize_p,
)
