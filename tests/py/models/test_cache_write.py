"""``hxmlir.models.forward.cache_write`` under ``jax.vmap``: with each element's own start
(``Decoder.generate_batch``'s step) every element's rows land at its start, the rest of its
cache untouched, written in place (no scatter and no select over the whole cache in the
compiled module); its gradient is ``lax.dynamic_update_slice``'s."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hxmlir as hx
from hxmlir.models import forward
from hxmlir.types.qarray import dequantize

B, KV, C, D = 5, 3, 64, 8


def _operands(t, seed):
  rng = np.random.default_rng(seed)
  keys = rng.standard_normal((B, KV, C, D)).astype(np.float32)
  values = rng.standard_normal((B, KV, D, C)).astype(np.float32)
  x = rng.standard_normal((B, t, KV, D)).astype(np.float32)
  starts = np.asarray([0, 9, 30, C - t, 17][:B], np.int32)
  return keys, values, x, starts


def _written(cache, x, start, keys: bool):
  """NumPy: one element's cache with ``x: [T, kv, d]`` at positions ``start + [0, T)``."""
  out = cache.copy()
  t = x.shape[0]
  if keys:
    out[:, start:start + t] = np.swapaxes(x, 0, 1)
  else:
    out[:, :, start:start + t] = np.transpose(x, (1, 2, 0))
  return out


@pytest.mark.parametrize("t", [1, 4])
@pytest.mark.parametrize("keys", [True, False], ids=["keys", "values"])
def test_vmap_writes_each_elements_rows_at_its_own_start(t, keys):
  k, v, x, starts = _operands(t, t)
  cache = k if keys else v
  f = jax.jit(jax.vmap(lambda c, x, s: forward.cache_write(c, s, x, keys=keys)))
  got = np.asarray(f(cache, x, starts))
  for b in range(B):  # exact: a copy of values
    np.testing.assert_array_equal(got[b], _written(cache[b], x[b], int(starts[b]), keys))
  # one start for every element, or one cache for every element
  got = np.asarray(jax.vmap(lambda c, x: forward.cache_write(c, np.int32(7), x, keys=keys))(
      cache, x))
  for b in range(B):
    np.testing.assert_array_equal(got[b], _written(cache[b], x[b], 7, keys))
  got = np.asarray(jax.vmap(lambda x, s: forward.cache_write(cache[0], s, x, keys=keys))(
      x, starts))
  for b in range(B):
    np.testing.assert_array_equal(got[b], _written(cache[0], x[b], int(starts[b]), keys))


def _whole_cache_ops(hlo: str, shape: str) -> list[str]:
  """The scatter and select instructions of compiled ``hlo`` whose result has ``shape``."""
  return [line.strip() for line in hlo.splitlines()
          if re.search(rf"= {re.escape(shape)}\{{[0-9,]*\}} (scatter|select)\(", line)]


@pytest.mark.parametrize("keys", [True, False], ids=["keys", "values"])
def test_vmap_with_own_starts_compiles_to_in_place_writes(keys):
  k, v, x, starts = _operands(1, 3)
  cache = k if keys else v
  f = jax.jit(jax.vmap(lambda c, x, s: forward.cache_write(c, s, x, keys=keys)),
              donate_argnums=0)
  hlo = f.lower(cache, x, starts).compile().as_text()
  shape = f"f32[{','.join(map(str, cache.shape))}]"
  assert _whole_cache_ops(hlo, shape) == []
  assert "dynamic-update-slice" in hlo and "input_output_alias={ {}: (0, {}" in hlo
  # the check sees what XLA's own rule for a mapped start compiles to
  plain = jax.jit(jax.vmap(lambda c, x, s: jax.lax.dynamic_update_slice(
      c, jnp.swapaxes(x, 0, 1), (0, s, 0)) if keys else jax.lax.dynamic_update_slice(
      c, jnp.transpose(x, (1, 2, 0)), (0, 0, s))), donate_argnums=0)
  assert _whole_cache_ops(plain.lower(cache, x, starts).compile().as_text(), shape)


def test_vmap_of_the_int8_cache_writes_each_elements_rows():
  # q8[kv, C, d] rows: each element's values and scales at its own start
  k, _, x, starts = _operands(2, 4)
  spec = hx.QArraySpec()
  cache = jax.vmap(forward.quantize, out_axes=spec)(k)
  f = jax.jit(jax.vmap(lambda c, x, s: forward.cache_write(c, s, x, keys=True),
                       in_axes=(spec, 0, 0), out_axes=spec))
  got = np.asarray(dequantize(f(cache, x, starts)))
  rows = np.asarray(jax.vmap(lambda x: dequantize(forward.quantize(jnp.swapaxes(x, 0, 1))))(x))
  old = np.asarray(dequantize(cache))
  for b in range(B):  # exact: the written rows are quantized alone, the others kept
    s = int(starts[b])
    want = old[b].copy()
    want[:, s:s + 2] = rows[b]
    np.testing.assert_array_equal(got[b], want)


def test_gradient_is_dynamic_update_slices():
  k, _, x, starts = _operands(2, 5)

  def loss(write, x, c, s):
    return jnp.sum(jnp.sin(write(c, x, s)))
  ours = lambda c, x, s: forward.cache_write(c, s, x, keys=True)  # noqa: E731
  plain = lambda c, x, s: jax.lax.dynamic_update_slice(c, jnp.swapaxes(x, 0, 1), (0, s, 0))  # noqa: E731
  for vm in (False, True):
    g = jax.grad(lambda *a: loss(ours, *a), argnums=(0, 1))
    w = jax.grad(lambda *a: loss(plain, *a), argnums=(0, 1))
    if vm:
      g, w = jax.vmap(g), jax.vmap(w)
      args = (x, k, starts)
    else:
      args = (x[1], k[1], starts[1])
    for a, b in zip(jax.jit(g)(*args), jax.jit(w)(*args)):
      np.testing.assert_array_equal(a, b)
