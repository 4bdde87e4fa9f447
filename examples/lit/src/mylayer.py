"""Your model: one dense layer with an int8 weight (replace with your own code)."""

import jax
import jax.numpy as jnp

import hxmlir as hx


def dense(x, params):
  """``relu(x @ dequantize(w) + b)``: ``x: f32[batch, k]``, ``params = {"w": q8[k, n], "b": f32[n]}``.

  Written the plain way (dequantize, then matmul); hxmlir's pipeline folds the
  scales so the int8 weight is never expanded to f32.
  """
  return jax.nn.relu(x @ hx.dequantize(params["w"]) + params["b"])


def init(key, k: int, n: int):
  """Parameters for :func:`dense`: a quantized random ``w: q8[k, n]`` and zero ``b: f32[n]``."""
  return {"w": hx.quantize(jax.random.normal(key, (k, n), jnp.float32)),
          "b": jnp.zeros((n,), jnp.float32)}
