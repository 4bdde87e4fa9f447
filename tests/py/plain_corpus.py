"""A corpus of plain JAX functions (no hx types) for the install isolation tests.

``cases()`` returns :class:`Case` s: a name, a function to ``jax.jit`` and
example arguments. They cover elementwise math, linear algebra, reductions,
control flow (cond, switch, while, fori, scan), autodiff (grad, jvp, vjp,
custom_vjp, custom_jvp, checkpoint), vmap, nested jit, random numbers,
convolutions and windows, gathers and scatters, FFT, LAPACK custom calls,
sharding (``NamedSharding`` inputs, explicit-axis meshes with ``reshard``,
``shard_map`` with collectives), Pallas in interpret mode, host callbacks, a
non-hx ``stablehlo.composite`` and an open-coded int8 dequantize-then-dot (the
pattern ``hx-fold-scales`` rewrites, which install must leave alone in a module
with no ``hx.*`` op). ``exportable`` is false where ``jax.export`` refuses the
function (host callbacks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  fn: Callable
  args: tuple
  exportable: bool = True


def _f32(*shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _mlp(params, x):
  for w, b in params:
    x = jnp.tanh(x @ w + b)
  return x


@jax.custom_vjp
def _clip_grad(x):
  return x


def _clip_fwd(x):
  return x, None


def _clip_bwd(_, g):
  return (jnp.clip(g, -1.0, 1.0),)


_clip_grad.defvjp(_clip_fwd, _clip_bwd)


@jax.custom_jvp
def _safe_log1p(x):
  return jnp.log1p(x)


@_safe_log1p.defjvp
def _safe_log1p_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return jnp.log1p(x), t / (1.0 + x)


def _add_kernel(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + 2.0 * y_ref[...]


def _pallas_add(x, y):
  return pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        interpret=True)(x, y)


def _pallas_blocked(x):
  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.sin(x_ref[...]) * 3.0
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        grid=(2,), in_specs=[pl.BlockSpec((4, 8), lambda i: (i, 0))],
                        out_specs=pl.BlockSpec((4, 8), lambda i: (i, 0)), interpret=True)(x)


def _open_coded_dequant_dot(x, q, s):
  return x @ (q.astype(jnp.float32) * s[:, None])


def _composite_not_hx(x):
  return lax.composite(lambda x: x * 2.0 + 1.0, name="mylib.affine", version=3)(x)


def _nested_jit(x):
  inner = jax.jit(lambda y: jnp.exp(y) - 1.0)
  return inner(x) + inner(2.0 * x)


def _scan_rnn(h0, xs, w):
  def step(h, x):
    h = jnp.tanh(h @ w + x)
    return h, h.sum()
  return lax.scan(step, h0, xs)


def _sharded_cases() -> list[Case]:
  if jax.device_count() < 8:
    return []
  mesh = jax.make_mesh((4, 2), ("i", "j"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  x = jax.device_put(_f32(8, 6), NamedSharding(mesh, P("i", None)))
  w = jax.device_put(_f32(6, 4, seed=1), NamedSharding(mesh, P(None, "j")))

  def sharded_matmul(x, w):
    return jnp.tanh(x @ w)

  def constrained(x):
    y = jnp.sin(x)
    return lax.with_sharding_constraint(y, NamedSharding(mesh, P(None, "j"))).sum(0)

  def smap_psum(x):
    f = jax.shard_map(lambda b: lax.psum(b.sum(0, keepdims=True), "i"), mesh=mesh,
                      in_specs=P("i", None), out_specs=P(None, None))
    return f(x)

  emesh = jax.make_mesh((4, 2), ("i", "j"),
                        axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  ex = jax.device_put(_f32(8, 6), NamedSharding(emesh, P("i", None)))
  ew = jax.device_put(_f32(6, 4, seed=1), NamedSharding(emesh, P(None, "j")))

  def explicit_reshard(x, w):
    y = x @ w
    return jax.sharding.reshard(y, NamedSharding(emesh, P(None, "j"))) * 2.0

  return [
      Case("sharded_matmul", sharded_matmul, (x, w)),
      Case("sharding_constraint", constrained, (x,)),
      Case("shard_map_psum", smap_psum, (x,)),
      Case("explicit_reshard", explicit_reshard, (ex, ew)),
  ]


def cases() -> list[Case]:
  """All corpus cases (the sharded ones only with >= 8 devices)."""
  x = _f32(4, 8)
  v = _f32(8, seed=2)
  m = _f32(8, 8, seed=3)
  spd = m @ m.T + 8.0 * jnp.eye(8)
  params = [(_f32(8, 8, seed=10 + i), _f32(8, seed=20 + i)) for i in range(3)]
  img = _f32(1, 3, 8, 8, seed=4)
  ker = _f32(5, 3, 3, 3, seed=5)
  key = jax.random.key(0)
  q = jnp.asarray(np.random.default_rng(6).integers(-127, 128, (8, 5)), jnp.int8)
  s = jnp.abs(_f32(8, seed=7)) + 0.1
  idx = jnp.array([3, 0, 7, 1], jnp.int32)

  def loss(params, x):
    return jnp.mean(_mlp(params, x) ** 2)

  out = [
      Case("elementwise", lambda x: jnp.sin(x) * 2.0 + jnp.cos(x) ** 2, (x,)),
      Case("matmul_bias_relu", lambda x, w, b: jax.nn.relu(x @ w + b), (x, m, v)),
      Case("reductions", lambda x: (x.sum(0), x.max(1), jnp.argmin(x, 1), x.mean()), (x,)),
      Case("where_compare", lambda x: jnp.where(x > 0, x, 0.1 * x), (x,)),
      Case("softmax_logsumexp", lambda x: (jax.nn.softmax(x, -1), jax.nn.logsumexp(x)), (x,)),
      Case("cond", lambda p, x: lax.cond(p > 0, jnp.sin, jnp.cos, x), (jnp.float32(1.0), x)),
      Case("switch", lambda i, x: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x),
           (jnp.int32(1), x)),
      Case("while_loop", lambda x: lax.while_loop(lambda c: c[0] < 10,
                                                  lambda c: (c[0] + 1, c[1] * 1.1),
                                                  (0, x))[1], (x,)),
      Case("fori_loop", lambda x: lax.fori_loop(0, 5, lambda i, a: a + i * a, x), (x,)),
      Case("scan_rnn", _scan_rnn, (_f32(8), _f32(6, 8, seed=8), m)),
      Case("scan_reverse_cumsum", lambda xs: lax.scan(lambda c, x: (c + x, c * x), 0.0, xs,
                                                      reverse=True), (v,)),
      Case("grad_mlp", jax.grad(loss), (params, x)),
      Case("value_and_grad_argnums", jax.value_and_grad(lambda a, b: jnp.sum(a * b ** 3),
                                                        argnums=(0, 1)), (v, v + 1.0)),
      Case("jvp", lambda x, t: jax.jvp(jnp.tanh, (x,), (t,)), (x, x * 0.5)),
      Case("vjp", lambda x, g: jax.vjp(jnp.sinh, x)[1](g), (x, x)),
      Case("vmap_matvec", jax.vmap(lambda a, b: a @ b, in_axes=(None, 0)), (m, x)),
      Case("custom_vjp_grad", jax.grad(lambda x: jnp.sum(_clip_grad(x) ** 2)), (x,)),
      Case("custom_jvp_grad", jax.grad(lambda x: jnp.sum(_safe_log1p(x * x))), (x,)),
      Case("checkpoint", jax.grad(lambda x: jnp.sum(jax.checkpoint(
          lambda y: jnp.sin(jnp.sin(y)))(x))), (x,)),
      Case("nested_jit", _nested_jit, (x,)),
      Case("dtype_casts", lambda x: (x.astype(jnp.bfloat16) * 2).astype(jnp.int32), (x,)),
      Case("random_normal", lambda k: jax.random.normal(k, (4, 3)), (key,)),
      Case("sort_argsort", lambda v: (jnp.sort(v), jnp.argsort(-v)), (v,)),
      Case("cumsum_cumprod", lambda x: (jnp.cumsum(x, 1), jnp.cumprod(x, 0)), (x,)),
      Case("conv2d", lambda a, k: lax.conv_general_dilated(a, k, (1, 1), "SAME"), (img, ker)),
      Case("max_pool", lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 1, 2, 2),
                                                   (1, 1, 2, 2), "VALID"), (img,)),
      Case("gather_scatter", lambda x, i: (x[:, i], x.at[:, i].add(1.0)), (x, idx)),
      Case("dynamic_slice", lambda x, i: lax.dynamic_slice(x, (i, 0), (2, 8)),
           (x, jnp.int32(1))),
      Case("fft", lambda v: jnp.fft.rfft(v), (v,)),
      Case("cholesky_solve", lambda a, b: jax.scipy.linalg.cho_solve(
          jax.scipy.linalg.cho_factor(a), b), (spd, v)),
      Case("einsum_batched", lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
           (_f32(2, 3, 4), _f32(2, 4, 5, seed=9))),
      Case("attention", lambda q, k, v: jax.nn.dot_product_attention(q, k, v),
           (_f32(1, 4, 2, 8), _f32(1, 4, 2, 8, seed=1), _f32(1, 4, 2, 8, seed=2))),
      Case("composite_not_hx", _composite_not_hx, (x,)),
      Case("open_coded_dequant_dot", _open_coded_dequant_dot, (x, q, s)),
      Case("pallas_interpret_add", _pallas_add, (x, x * 3.0)),
      Case("pallas_interpret_grid", _pallas_blocked, (_f32(8, 8),)),
      Case("pure_callback", lambda x: jax.pure_callback(
          np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1.0, (x,), exportable=False),
      Case("debug_print", partial(_debug_print), (x,), exportable=False),
  ]
  return out + _sharded_cases()


def _debug_print(x):
  jax.debug.print("x sum {}", x.sum())
  return x * 2.0
