"""JAX's array API on hi values: a TypeError naming the type and what to call.

A ``q8``/``q4``/``f8`` (per row and grouped), an ``r1`` and a ``Tup`` are not arrays:
``jnp.sum(q)``, ``jnp.dot(x, q)``, ``x @ q``, ``q + 1``, ``jnp.asarray(q)``, ``q.sum()``
and the rest refuse them, eagerly and under ``jit``, with one message per type
(``hxmlir.types.hiprim.refuse_array_api``) instead of JAX's "'QArrayTy' object has no attribute
'_rmatmul'" or "sum requires ndarray or scalar arguments, got DynamicJaxprTracer".
"""

import re

import jax
import jax.numpy as jnp
import pytest

import hxmlir as hx

X = jnp.ones((2, 3), jnp.float32)
_W = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4) / 12

# (name, make, its type as printed, what the message says to call)
HI_VALUES = [
    ("q8", lambda: hx.quantize(_W), "q8[3,4]", r"hx\.matmul_q\(x, q\).*hx\.dequantize\(q\)"),
    ("q4_g4", lambda: hx.quantize(jnp.ones((3, 8)), jnp.int4, group_size=4), "q4[3,8:g4]",
     r"hx\.matmul_q\(x, q\).*hx\.dequantize\(q\)"),
    ("f8", lambda: hx.quantize(_W, jnp.float8_e4m3fn), "f8[3,4]",
     r"hx\.matmul_q\(x, q\).*hx\.dequantize\(q\)"),
    ("r1", lambda: hx.outer(jnp.ones(3), jnp.ones(4)), "r1[3,4]",
     r"hx\.matmul_r1\(x, r\).*hx\.factors\(r\)"),
    ("tup", lambda: hx.make_tup(jnp.arange(3.0), hx.quantize(_W)), "Tup{f32[3],q8[3,4]}",
     r"hx\.get_tuple_element\(t, i\)"),
]

# (name, op, how the message shows the operation ({} is the hi type), exception)
OPS = [
    ("jnp.sum", lambda v: jnp.sum(v), "a {} operand where JAX expects an array"),
    ("jnp.dot", lambda v: jnp.dot(X, v), "a {} operand where JAX expects an array"),
    ("jnp.matmul", lambda v: jnp.matmul(X, v), "a {} operand where JAX expects an array"),
    ("jnp.einsum", lambda v: jnp.einsum("ij,jk->ik", X, v), "a {} operand where JAX expects an array"),
    ("jnp.asarray", lambda v: jnp.asarray(v), "a {} operand where JAX expects an array"),
    ("jnp.array", lambda v: jnp.array(v), "a {} operand where JAX expects an array"),
    ("x @ v", lambda v: X @ v, "a {} operand where JAX expects an array"),
    ("x + v", lambda v: X + v, "a {} operand where JAX expects an array"),
    ("v @ x", lambda v: v @ X.T, "{} @ f32[3,2]"),
    ("v + 1", lambda v: v + 1, "{} + 1"),
    ("1 + v", lambda v: 1 + v, "1 + {}"),
    ("v * 2.0", lambda v: v * 2.0, "{} * 2.0"),
    ("-v", lambda v: -v, "-{}"),
    ("v[0]", lambda v: v[0], "{}[...]"),
    ("iter", lambda v: list(v), "{}"),
    ("v.sum()", lambda v: v.sum(), "{}.sum()"),
    ("v.reshape", lambda v: v.reshape(-1), "{}.reshape()"),
    ("v.astype", lambda v: v.astype(jnp.float16), "{}.astype()"),
]


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("hi_name, make, ty, uses", HI_VALUES, ids=[h[0] for h in HI_VALUES])
@pytest.mark.parametrize("op_name, op, shown", OPS, ids=[o[0] for o in OPS])
def test_array_api_on_hi_value_is_a_type_error(op_name, op, shown, hi_name, make, ty, uses, mode):
  fn = op if mode == "eager" else jax.jit(op)
  with pytest.raises(TypeError) as e:
    fn(make())
  msg = str(e.value)
  assert shown.format(ty) in msg, msg
  assert "is not a jax.Array" in msg, msg
  assert re.search(uses, msg), msg


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("hi_name, make, ty, uses", HI_VALUES, ids=[h[0] for h in HI_VALUES])
def test_array_properties_and_len(hi_name, make, ty, uses, mode):
  def props(v):
    # a property is an AttributeError with the same text (hasattr keeps working)
    with pytest.raises(AttributeError, match=re.escape(f"{ty}.T: ") + ".*" + uses):
      _ = v.T
    assert not hasattr(v, "mT")
    if hi_name == "tup":
      return len(v)  # a Tup has a length, traced too
    with pytest.raises(TypeError, match=re.escape(f"len({ty}): ") + ".*" + uses):
      len(v)
    return 0
  n = props(make()) if mode == "eager" else jax.jit(props)(make())
  assert n == (2 if hi_name == "tup" else 0)


def test_arrays_still_convert():
  # the jnp.array check passes arrays, traced or not, through unchanged
  assert jnp.array_equal(jax.jit(lambda a: jnp.asarray(a) + jnp.array(a))(X), 2 * X)
  assert jnp.asarray([1.0, 2.0]).dtype == jnp.float32
