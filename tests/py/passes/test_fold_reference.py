"""``hx.matmul_q``'s reference semantics exist twice: in JAX (``lowering/reference.py``,
the composite's decomposition when JAX lowers) and built with MLIR's builders by
``hx-fold-scales`` (``passes/fold_scales/reference.py``: passes read IR and never trace JAX code,
so the decomposition of a composite the pass creates is built op by op). This test
holds the two to one meaning: for every format the MLIR stage folds (f32 scales, no
offset), per row and per group, and every layout the schema accepts (``[in, out]``,
the checkpoint layout ``[out, in]`` with groups along the contraction, batched, and a
weight batched along its grouped axis), both are within the f32 dot bound of the
float64 product of ``x`` and the dequantized weight, hence within twice that of each
other.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hx_testing import compile_and_run, dense64
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func
from numerics import assert_within, dot_bound

import hxmlir as hx
from hxmlir import _jax, formats
from hxmlir.lowering import reference
from hxmlir.passes.fold_scales import reference as fold_reference

# (x shape, dense weight shape, dimension numbers, einsum spec of the same product)
LAYOUTS = {
    "in_out": ((3, 8), (8, 16), (((1,), (0,)), ((), ())), "mk,kn->mn"),
    "out_in": ((3, 16), (8, 16), (((1,), (1,)), ((), ())), "mk,nk->mn"),
    "batched": ((2, 3, 8), (2, 8, 16), (((2,), (1,)), ((0,), (0,))), "bmk,bkn->bmn"),
    "batch_on_groups": ((16, 3, 8), (8, 16), (((2,), (0,)), ((0,), (1,))), "nmk,kn->nm"),
}
FOLDED = [f for f in formats.FORMATS.values()
          if f.scale_dtype == formats.F32 and not f.offset and formats.of_storage(f.mlir) is f]


def _mlir_type(a: np.ndarray) -> ir.RankedTensorType:
  etype = {"int8": ir.IntegerType.get_signless(8), "uint8": ir.IntegerType.get_unsigned(8),
           "float32": ir.F32Type.get(), "float8_e4m3fn": ir.Float8E4M3FNType.get()}[a.dtype.name]
  return ir.RankedTensorType.get(list(a.shape), etype)


def _mlir_reference(x, q, s, dims, y_shape) -> str:
  """The module ``@main(x, q, s) = hx-fold-scales' reference matmul_q``, as text."""
  with _jax.make_ir_context(), ir.Location.unknown():
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
      fn = func.FuncOp("main", ([_mlir_type(a) for a in (x, q, s)],
                                [ir.RankedTensorType.get(list(y_shape), ir.F32Type.get())]))
      block = fn.add_entry_block()
      with ir.InsertionPoint(block):
        func.ReturnOp([fold_reference.matmul_q(*block.arguments, dims)])
    return str(module)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("group", [None, 4])
@pytest.mark.parametrize("fmt", [f.name for f in FOLDED])
def test_mlir_built_reference_is_the_jax_reference(fmt, group, layout):
  x_shape, w_shape, dims, spec = LAYOUTS[layout]
  rng = np.random.default_rng(0)
  x = rng.standard_normal(x_shape).astype(np.float32)
  qa = hx.quantize(rng.standard_normal(w_shape).astype(np.float32), fmt, group_size=group)
  q, s = (np.asarray(c) for c in hx.qarray_parts(qa))
  w64 = dense64(qa)
  want = np.einsum(spec, x.astype(np.float64), w64)
  # x scaled (or each group's partial sum scaled) before the sum: one rounding more
  bound = dot_bound(spec, x, w64.astype(np.float32), extra=2)

  (got_mlir,) = compile_and_run(_mlir_reference(x, q, s, dims, want.shape), [x, q, s])
  got_jax = np.asarray(jax.jit(lambda x, q, s: reference.matmul_q(x, q, s, dims))(x, q, s))
  assert got_mlir.shape == got_jax.shape == want.shape
  assert_within(got_mlir, want, bound, "hx-fold-scales' MLIR-built reference")
  assert_within(got_jax, want, bound, "lowering/reference.py")
  assert_within(got_mlir, got_jax, 2 * bound, "the two references")
