"""``hx.matmul_q``'s one typing rule (``hxmlir.types.matmul_q_typing``) and its three askers.

The hi primitive (through ``hx.einsum`` and ``hx.matmul_q``), the lo primitive's abstract
eval and the composite schema (``hx-verify``) must give the same result type for the same
operand types, and refuse the same ones; each case here is checked against a float64
``np.einsum`` of the shapes (the result shape of ``dot_general``, computed another way).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hxmlir as hx
from hxmlir.lowering import hx_matmul_q_p, schema
from hxmlir.types import matmul_q_typing as mqt

# (subscripts, x shape, weight dense shape, group size or None)
CASES = [
    ("bsk,kn->bsn", (2, 5, 64), (64, 32), None),
    ("mk,nk->mn", (5, 64), (32, 64), 32),             # [out, in], groups along k
    ("...ij,hjk->...ik", (2, 3, 4, 16), (6, 16, 8), None),
    ("bmk,bkn->bmn", (3, 5, 16), (3, 16, 8), 8),
]


def _weight(shape, group):
  return hx.quantize(jnp.ones(shape, jnp.float32), group_size=group)


def _lo_result(x_aval, qw, dims):
  """The lo primitive's abstract eval on ``x`` (f32) and ``qw``'s components."""
  comps = [jax.typeof(c) for c in hx.qarray_parts(qw)]
  out, _ = hx_matmul_q_p.abstract_eval(x_aval, *comps, dimension_numbers=dims)
  return out


@pytest.mark.parametrize("subscripts, xs, ws, group", CASES)
def test_hi_lo_and_schema_agree(subscripts, xs, ws, group):
  qw = _weight(ws, group)
  want = np.einsum(subscripts, np.zeros(xs), np.zeros(ws)).shape
  hi = jax.eval_shape(lambda x, w: hx.einsum(subscripts, x, w),
                      jax.ShapeDtypeStruct(xs, jnp.float32), qw)
  assert (hi.shape, hi.dtype) == (want, jnp.float32)
  # the hi primitive hx.einsum binds (after it pre-sums or broadcasts x): its operand
  # types, dims and result, which the rule, the lo primitive and the schema must repeat
  jaxpr = jax.make_jaxpr(lambda x, w: hx.einsum(subscripts, x, w))(jnp.zeros(xs), qw)
  prim = next(e.params["_prim"] for e in jaxpr.eqns if "_prim" in e.params)
  x_aval, dims = prim.in_avals[0], prim.params["dimension_numbers"]
  got = mqt.result_type(x_aval.shape, x_aval.dtype, ws, group is not None, dims,
                        operands="x, w")
  assert got == (dims, prim.out_aval.shape, jnp.float32)
  lo = _lo_result(x_aval, qw, dims)
  assert (lo.shape, lo.dtype) == (prim.out_aval.shape, jnp.float32)
  types = [schema.TensorType.of(a) for a in (x_aval, *hx.qarray_parts(qw))]
  attrs = schema.matmul_q_attributes(dims, schema.format_attributes_of(*types[1:]))
  spec = schema.SCHEMAS["hx.matmul_q"]
  assert spec.check_types(types, [schema.TensorType.of(lo)], attrs) == []
  wrong = schema.TensorType((*lo.shape, 1), "f32")
  assert spec.check_types(types, [wrong], attrs) == [
      f"result must be f32[{','.join(map(str, lo.shape))}], got {wrong}"]


def test_refusals_name_both_operand_types_in_each_callers_form():
  qw = _weight((3, 4), None)
  # the hi primitive: the caller first
  with pytest.raises(TypeError, match=r"^hx\.matmul_q contracting dimensions differ \(5 vs 3\): "
                                      r"f32\[2,5\] @ q8\[3,4\]\n"):
    jax.eval_shape(hx.matmul_q, jax.ShapeDtypeStruct((2, 5), jnp.float32), qw)
  with pytest.raises(TypeError, match=r"^hx\.matmul_q expects f32\[\.\.\., k\] @ q8\[k, n\] or "
                                      r".* of equal rank >= 2: f32\[3\] @ q8\[5,3,4\] "
                                      r"\(hx\.einsum takes other layouts\)\n"):
    jax.eval_shape(hx.matmul_q, jax.ShapeDtypeStruct((3,), jnp.float32), _weight((5, 3, 4), None))
  # the lo primitive: x must be f32 there (the hi-to-lo rule converts bf16 and f16)
  dims = (((1,), (0,)), ((), ()))
  with pytest.raises(TypeError, match=r"^hx_matmul_q expects a dense f32 operand: "
                                      r"bf16\[2,3\], i8\[3,4\], f32\[3\]$"):
    _lo_result(jax.core.ShapedArray((2, 3), jnp.bfloat16), qw, dims)
  # the schema: the problem first, the composite's operand types after it
  types = [schema.TensorType((2, 3), "bf16"), schema.TensorType((3, 4), "i8"),
           schema.TensorType((3,), "f32")]
  attrs = schema.matmul_q_attributes(dims, schema.format_attributes_of(*types[1:]))
  assert schema.SCHEMAS["hx.matmul_q"].check_operands(types, attrs) == [
      "expects a dense f32 operand, got bf16[2,3], i8[3,4], f32[3]"]


def test_the_rule_alone():
  ok = mqt.result_type((2, 5, 64), jnp.bfloat16, (64, 32), False, operands="x @ w")
  assert ok == ((((2,), (0,)), ((), ())), (2, 5, 32), jnp.float32)
  with pytest.raises(mqt.MatmulQTypeError) as e:
    mqt.result_type((2, 5, 64), jnp.bfloat16, (64, 32), False, operands="x @ w",
                    dtypes=mqt.LO_DENSE_DTYPES)
  assert (e.value.kind, str(e.value)) == ("dtype", "expects a dense f32 operand, got x @ w")
  with pytest.raises(mqt.MatmulQTypeError) as e:  # group scales along a contracted axis
    mqt.result_type((5, 3, 16), jnp.float32, (4, 3, 16), True,
                    (((1, 2), (1, 2)), ((), ())), operands=lambda: "named late")
  assert e.value.kind == "dims" and str(e.value).endswith(": named late")
  assert e.value.for_caller("hx.einsum('mjk,njk->mn')").startswith(
      "hx.einsum('mjk,njk->mn'): named late: the group scales cannot be folded")
