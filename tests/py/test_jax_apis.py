"""JAX's everyday placement, sharding and debugging APIs on hi values (issue 14, item 2).

Every hi type (q8, r1, Tup), eagerly and under ``jit``: ``jax.device_put``,
``jax.lax.with_sharding_constraint``, ``jit(in_shardings=, out_shardings=)``,
``jax.debug.print`` / ``jax.debug.callback``, and the value classes' refusals of
numpy conversion, ``==`` and ``hash``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import hxmlir as hx


def _w(shape=(4, 8), offset=0.0):
  return (jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape) - 7 + offset) / 3


def _q(shape=(4, 8)):
  return hx.quantize(_w(shape))


def _r1():
  return hx.outer(jnp.arange(4, dtype=jnp.float32) + 1, jnp.arange(8, dtype=jnp.float32) - 2)


def _tup():
  return hx.make_tup(jnp.arange(3.0), _q())


# --- value classes: numpy conversion, ==, hash -------------------------------

@pytest.mark.parametrize("make, name, how", [
    (_q, "q8[4,8]", "hx.dequantize(q)"),
    (_r1, "r1[4,8]", "hx.factors(r)"),
    (_tup, "Tup{f32[3],q8[4,8]}", "hx.get_tuple_element(t, i)"),
])
def test_value_refuses_numpy_eq_hash(make, name, how):
  v, w = make(), make()
  for convert in (np.asarray, np.array, jnp.asarray):
    with pytest.raises(TypeError, match=rf"a {name.replace('[', '.').replace('{', '.')} value "
                       rf"has no single numpy form.*{how.replace('(', '.').replace(')', '.')}"):
      convert(v)
  with pytest.raises(TypeError, match="== / != on .* values is not defined"):
    _ = v == w
  with pytest.raises(TypeError, match="== / != on .* values is not defined"):
    _ = v != w
  with pytest.raises(TypeError, match=r"not hashable.*hash\(jax.typeof\(v\)\)"):
    hash(v)
  with pytest.raises(TypeError, match="truth value of a .* value is not defined"):
    bool(v)
  # the type stays hashable and comparable: JAX keys its caches on it
  assert hash(jax.typeof(v)) == hash(jax.typeof(w)) and jax.typeof(v) == jax.typeof(w)


def test_value_refusals_leave_transforms_working():
  q = _q()
  x = _w((3, 4))
  want = x @ hx.dequantize(q)
  got_jit = jax.jit(hx.matmul_q)(x, q)
  got_const = jax.jit(lambda x: hx.matmul_q(x, q))(x)
  np.testing.assert_array_equal(got_jit, got_const)
  np.testing.assert_allclose(got_jit, want, rtol=0, atol=_dot_bound(x, hx.dequantize(q)))
  g = jax.grad(lambda w: hx.dequantize(hx.quantize(w)).sum())(_w())
  np.testing.assert_array_equal(g, jnp.ones((4, 8)))


def _dot_bound(x, w):
  """|x @ w - ref| bound for f32 dot products of length k: k ulp of the largest term sum."""
  k = x.shape[-1]
  return float(k * np.finfo(np.float32).eps * (jnp.abs(x) @ jnp.abs(w)).max())
