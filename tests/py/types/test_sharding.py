"""Hi types in JAX's explicit sharding mode and across ``shard_map``, on 8 CPU devices.

``conftest.py`` sets ``XLA_FLAGS=--xla_force_host_platform_device_count=8``
before JAX is imported. The mesh is ``i: 4`` by ``j: 2`` with explicit axis
types. Every typing rule's result sharding is checked against the type
printed (``q8[8@i,3]``) and against the runtime sharding of the value;
numbers are checked against the same computation without a mesh.
"""

from __future__ import annotations

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hx_testing import assert_same_q_values as assert_same_q
from jax.sharding import PartitionSpec as P
from numerics import (
  assert_einsum_close,
  assert_matmul_close,
  assert_sum_close,
  assert_within,
  dot_bound,
  elementwise_bound,
  matmul_grad_bounds,
  polynomial_bound,
)

import hxmlir as hx

get = hx.get_tuple_element


ROWS = np.arange(24., dtype=np.float32).reshape(8, 3) - 7.
W = (np.arange(12., dtype=np.float32).reshape(3, 4) - 5.) / 12.


def short(v) -> str:
  return jax.typeof(v).str_short(short_dtypes=True)


def spec(a, ndim=None) -> tuple:
  """The runtime partition spec of array ``a``, padded with ``None`` to its rank."""
  parts = tuple(a.sharding.spec)
  return parts + (None,) * ((ndim or a.ndim) - len(parts))


# --- explicit mode: typing rules propagate shardings ------------------------------------

def test_quantize_dequantize_row_sharded(on_mesh):
  ref = hx.quantize(jnp.asarray(ROWS))
  rows = jax.device_put(ROWS, P("i"))
  qrows = hx.quantize(rows)
  assert str(jax.typeof(qrows)) == "q8[8@i,3]"
  assert spec(qrows.qvalue) == ("i", None) and spec(qrows.scale) == ("i",)
  assert [a.str_short(short_dtypes=True) for a in jax.typeof(qrows).lo_ty()] == [
      "i8[8@i,3]", "f32[8@i]"]
  out = hx.dequantize(qrows)
  assert short(out) == "f32[8@i,3]" and spec(out) == ("i", None)
  assert_same_q(qrows, ref)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(hx.dequantize(ref)))
  assert jax.typeof(qrows).to_tangent_aval().str_short(short_dtypes=True) == "f32[8@i,3]"


def test_jaxpr_shows_sharded_hi_types(on_mesh):
  rows = jax.device_put(ROWS, P("i"))
  text = str(jax.jit(lambda x: hx.dequantize(hx.quantize(x))).trace(rows).jaxpr)
  assert re.search(r":q8\[8@i,3\] = call_hi_primitive\[\s*_prim=Quantize", text)
  assert ":f32[8@i,3] = call_hi_primitive[_prim=Dequantize" in text


def test_quantized_axis_sharded(on_mesh):
  ref = hx.quantize(jnp.asarray(W))
  qw = hx.quantize(jax.device_put(W, P(None, "j")))
  assert str(jax.typeof(qw)) == "q8[3,4@j]"
  assert spec(qw.scale) == (None,)  # one scale per row: reduced over the sharded axis
  assert_same_q(qw, ref)
  assert short(hx.dequantize(qw)) == "f32[3,4@j]"
  qjit = jax.jit(hx.quantize)(jax.device_put(W, P(None, "j")))
  assert str(jax.typeof(qjit)) == "q8[3,4@j]"
  assert_same_q(qjit, ref)


def test_quantize_2d_sharded_stack(on_mesh):
  xs = np.arange(2 * 8 * 4, dtype=np.float32).reshape(2, 8, 4) - 20.
  ref = hx.quantize(jnp.asarray(xs))
  q = hx.quantize(jax.device_put(xs, P("j", "i")))
  assert str(jax.typeof(q)) == "q8[2@j,8@i,4]"
  assert spec(q.scale) == ("j", "i")
  assert_same_q(q, ref)


@pytest.mark.parametrize("xspec, wspec, out_type", [
    (P("i"), P(), "f32[8@i,4]"),
    (P(), P(None, "j"), "f32[8,4@j]"),
    (P("i"), P(None, "j"), "f32[8@i,4@j]"),
])
def test_matmul_q_result_sharding(on_mesh, xspec, wspec, out_type):
  x = jax.device_put(ROWS, xspec)
  qw = hx.quantize(jax.device_put(W, wspec))
  y = hx.matmul_q(x, qw)
  assert short(y) == out_type
  yj = jax.jit(hx.matmul_q)(x, qw)
  assert short(yj) == out_type
  assert spec(yj) == tuple(jax.typeof(yj).sharding.spec) + (None,) * (2 - len(jax.typeof(
      yj).sharding.spec))
  wd = hx.dequantize(hx.quantize(jnp.asarray(W)))
  assert_matmul_close(y, ROWS, wd, extra=1)
  assert_matmul_close(yj, ROWS, wd, extra=1)


def test_matmul_q_batch_axis_sharding(on_mesh):
  xb = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)
  wb = np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2) - 10.
  y = hx.matmul_q(jax.device_put(xb, P("i")), hx.quantize(jax.device_put(wb, P(None, None, "j"))))
  assert short(y) == "f32[4@i,2,2@j]"
  qref = hx.quantize(jnp.asarray(wb))
  assert_matmul_close(y, xb, hx.dequantize(qref), extra=1)


def test_matmul_q_sharded_contraction_is_a_type_error(on_mesh):
  xk = jax.device_put(np.ones((2, 8), np.float32), P(None, "i"))
  qk = hx.quantize(jax.device_put(np.ones((8, 3), np.float32), P("i")))
  with pytest.raises(TypeError, match=r"hx\.matmul_q requires unsharded contraction axes, "
                     r"got f32\[2,8@i\] @ q8\[8@i,3\]"):
    jax.jit(hx.matmul_q).trace(xk, qk)
  # either side alone is enough
  q_rep = hx.quantize(jnp.ones((8, 3), jnp.float32))
  with pytest.raises(TypeError, match=r"got f32\[2,8@i\] @ q8\[8,3\]"):
    hx.matmul_q(xk, q_rep)
  with pytest.raises(TypeError, match=r"got f32\[2,8\] @ q8\[8@i,3\]"):
    hx.matmul_q(jnp.ones((2, 8), jnp.float32), qk)


def test_grads_land_where_primals_live(on_mesh):
  wd = np.asarray(hx.dequantize(hx.quantize(jnp.asarray(W))))

  def loss(x, qw):
    return jnp.sum(hx.matmul_q(x, qw) ** 2)

  rx = 2 * (ROWS @ wd) @ wd.T
  rw = 2 * ROWS.T @ (ROWS @ wd)
  for xspec, wspec, gx_type, gw_type in [
      (P("i"), P(), "f32[8@i,3]", "f32[3,4]"),
      (P("i"), P(None, "j"), "f32[8@i,3]", "f32[3,4@j]"),
      (P(), P(None, "j"), "f32[8,3]", "f32[3,4@j]"),
  ]:
    x = jax.device_put(ROWS, xspec)
    qw = hx.quantize(jax.device_put(W, wspec))
    gx, gw = jax.grad(loss, argnums=(0, 1))(x, qw)
    assert (short(gx), short(gw)) == (gx_type, gw_type)
    bx, bw = matmul_grad_bounds(ROWS, wd, lambda y: 2 * y, lipschitz=2)
    assert_within(gx, rx, bx)
    assert_within(gw, rw, bw)
    gxj, gwj = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, qw)
    assert (short(gxj), short(gwj)) == (gx_type, gw_type)
    assert spec(gxj) == spec(x) and spec(gwj) == spec(qw.qvalue)


def test_straight_through_grad_keeps_sharding(on_mesh):
  rows = jax.device_put(ROWS, P("i"))
  g = jax.grad(lambda x: jnp.sum(hx.dequantize(hx.quantize(x)) ** 2))(rows)
  assert short(g) == "f32[8@i,3]"
  ref = 2 * np.asarray(hx.dequantize(hx.quantize(jnp.asarray(ROWS))))
  # the scale (1/127 and the product) and the dequantize product round on each side
  assert_within(g, ref, elementwise_bound(ref, 6))


def test_vmap_and_scan_keep_sharding(on_mesh):
  xs = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4, 8, 3) - 30.
  xs_sh = jax.device_put(xs, P(None, "i"))
  qxs = jax.vmap(hx.quantize, out_axes=hx.QArraySpec())(xs_sh)
  assert str(jax.typeof(qxs)) == "q8[4,8@i,3]"
  assert_same_q(qxs, hx.quantize(jnp.asarray(xs)))
  out = jax.vmap(hx.dequantize, in_axes=hx.QArraySpec(), axis_size=4)(qxs)
  assert short(out) == "f32[4,8@i,3]"
  total, ys = jax.lax.scan(lambda c, q: (c + hx.dequantize(q), hx.quantize(2 * hx.dequantize(q))),
                           jnp.zeros((8, 3), jnp.float32, out_sharding=P("i")), qxs, length=4)
  assert short(total) == "f32[8@i,3]" and str(jax.typeof(ys)) == "q8[4,8@i,3]"
  assert_sum_close(total, hx.dequantize(qxs), axis=0)


def test_vmap_broadcast_of_unmapped_output_keeps_sharding(on_mesh):
  x = jax.device_put(np.arange(24, dtype=np.float32).reshape(8, 3) - 5., P("i"))
  qx = hx.quantize(x)
  for f in (jax.vmap(lambda a: qx, out_axes=hx.QArraySpec()),
            jax.jit(jax.vmap(lambda a: hx.quantize(x), out_axes=hx.QArraySpec()))):
    qs = f(jnp.ones(4))
    assert str(jax.typeof(qs)) == "q8[4,8@i,3]"
    assert spec(qs.qvalue) == (None, "i", None) and spec(qs.scale) == (None, "i")
    np.testing.assert_array_equal(np.asarray(qs.qvalue), np.broadcast_to(qx.qvalue, (4, 8, 3)))


def test_rank1_shardings(on_mesh):
  col = np.arange(8., dtype=np.float32) / 8.
  row = np.arange(6., dtype=np.float32) / 6. - 0.5
  acts = np.arange(4 * 8, dtype=np.float32).reshape(4, 8) / 10.
  r = hx.outer(jax.device_put(col, P("i")), jax.device_put(row, P("j")))
  assert str(jax.typeof(r)) == "r1[8@i,6@j]"
  c, w = hx.factors(r)
  assert (short(c), short(w)) == ("f32[8@i]", "f32[6@j]")
  r2 = hx.outer(jnp.asarray(col[:4]), jax.device_put(row, P("j")))
  y = hx.matmul_r1(jax.device_put(acts[:, :4], P("i")), r2)
  assert short(y) == "f32[4@i,6@j]"
  # three factors a term (extra 1), the row applied before or after the sum (1 more)
  assert_einsum_close(y, "pm,m,n->pn", acts[:, :4], col[:4], row, extra=2)
  with pytest.raises(TypeError, match=r"unsharded contraction axes, got f32\[4,8\] @ r1\[8@i,6@j\]"):
    hx.matmul_r1(jnp.asarray(acts), r)

  # gradients through outer land on the factors, sharded like them
  def loss(c, w):
    return jnp.sum(hx.matmul_r1(jnp.asarray(acts), hx.outer(c, w)) ** 2)

  gc, gw = jax.grad(loss, argnums=(0, 1))(jnp.asarray(col), jax.device_put(row, P("j")))
  assert (short(gc), short(gw)) == ("f32[8]", "f32[6@j]")
  rc, rw = jax.grad(lambda c, w: jnp.sum((acts @ jnp.outer(c, w)) ** 2), argnums=(0, 1))(col, row)
  # gc, gw: sums over 4 x 6 outputs of 8-term dot products, 3 factors each (depth 40)
  for i, (g, r) in enumerate(((gc, rc), (gw, rw))):
    assert_within(g, r, 2 * polynomial_bound(lambda c, w, i=i: jax.grad(
        lambda c, w: jnp.sum((acts @ jnp.outer(c, w)) ** 2), argnums=i)(c, w), col, row, depth=40))


def test_tuple_shardings(on_mesh):
  rows = jax.device_put(ROWS, P("i"))
  t = hx.make_tup(rows, jnp.float32(1.), hx.quantize(rows))
  assert short(t) == "Tup{f32[8@i,3],f32[],q8[8@i,3]}"
  assert short(get(t, 0)) == "f32[8@i,3]"
  assert str(jax.typeof(get(t, 2))) == "q8[8@i,3]"
  tj = jax.jit(lambda t: hx.make_tup(get(t, 2), get(t, 0)))(t)
  assert short(tj) == "Tup{q8[8@i,3],f32[8@i,3]}"
  g = jax.grad(lambda t: jnp.sum(get(t, 0) * hx.dequantize(get(t, 2))) * get(t, 1))(t)
  assert short(g) == "Tup{f32[8@i,3],f32[],f32[8@i,3]}"
  deq = np.asarray(hx.dequantize(hx.quantize(jnp.asarray(ROWS))))
  # d/dt0 = deq(t2) * t1 with t1 = 1 (scale and dequantize product, each side); the
  # q8 element's cotangent is exact: t0 * t1 = ROWS * 1
  assert_within(get(g, 0), deq, elementwise_bound(deq, 6))
  np.testing.assert_array_equal(np.asarray(get(g, 2)), ROWS)


# --- values made outside the mesh meet values on it ----------------------------------------
# An array made outside jax.set_mesh has a sharding on no mesh; JAX lets it meet arrays
# on the mesh. Every hi op, its lowering and its derivatives must accept the mix.

def _mixed_cases():
  rng = np.random.default_rng(11)
  x = jnp.asarray(rng.standard_normal((4, 6)), jnp.float32)  # made outside any mesh
  c = jnp.asarray(rng.standard_normal(6), jnp.float32)
  w = rng.standard_normal((6, 8)).astype(np.float32)  # sharded below, or not
  row = rng.standard_normal(8).astype(np.float32)

  def q8(x, w):
    return jnp.sum(hx.matmul_q(x, hx.quantize(w)) ** 2)

  def q8_dense(x, w):
    return jnp.sum((x @ hx.dequantize(hx.quantize(w))) ** 2)

  def r1(x, c, row):
    return jnp.sum(hx.matmul_r1(x, hx.outer(c, row)) ** 2)

  def r1_dense(x, c, row):
    return jnp.sum((x @ jnp.outer(c, row)) ** 2)
  # (contraction axes stay unsharded: sharding one is a TypeError by design)
  return [("matmul_q", q8, q8_dense, (x, w), {1: P(None, "j")}),
          ("matmul_q", q8, q8_dense, (x, w), {0: P("i")}),
          ("matmul_r1", r1, r1_dense, (x, c, row), {2: P("j")}),
          ("matmul_r1", r1, r1_dense, (x, c, row), {0: P("i"), 2: P("j")})]


_MIXED = _mixed_cases()  # made at import: outside any mesh


@pytest.mark.parametrize("case", range(len(_MIXED)))
def test_values_from_outside_the_mesh_mix_with_sharded_ones(on_mesh, case):
  name, f, dense, args, specs = _MIXED[case]
  assert all(jax.typeof(a).sharding.mesh.empty for a in args if isinstance(a, jax.Array))
  args = [jax.device_put(a, specs[i]) if i in specs else a for i, a in enumerate(args)]
  argnums = tuple(range(len(args)))
  want_v = dense(*[np.asarray(a) for a in args])
  want_g = jax.grad(dense, argnums)(*[jnp.asarray(np.asarray(a)) for a in args])
  # the gradients (straight through the quantization) are polynomials in the arguments
  # too, sign-free as dense's: 2y (y as below, 11 roundings) summed over <= 4 x 8 terms of
  # <= 3 factors: depth 48; twice the bound for two f32 evaluations
  bounds = [2 * polynomial_bound(lambda *a, i=i: jax.grad(dense, i)(*a), *args, depth=48)
            for i in argnums]
  for how, fn in (("eager", f), ("jit", jax.jit(f))):
    # a sum of 4 x 8 squares of 6-term dot products, <= 4 factors per term: depth 42
    assert_within(fn(*args), want_v, 2 * polynomial_bound(dense, *args, depth=42),
                  f"{name} {how}: ")
    grad = jax.grad(fn, argnums) if how == "eager" else jax.jit(jax.grad(f, argnums))
    for i, (g, want, bound) in enumerate(zip(grad(*args), want_g, bounds)):
      assert_within(g, want, bound, f"{name} {how} grad {i}: ")


_OFF = jnp.asarray(np.random.default_rng(12).standard_normal((8, 6)), jnp.float32)  # no mesh


@pytest.mark.parametrize("first, second", [("on", "off"), ("off", "on"), ("off", "off"),
                                           ("on", "q_off"), ("off", "q_on"), ("off", "r_on")])
def test_tuples_mixing_values_from_outside_the_mesh_differentiate(on_mesh, first, second):
  # the cotangent of a tuple element made outside the mesh lands on it (JAX's AD
  # lets an array's cotangent do so); the tuple's cotangent keeps the tuple's type
  on = jax.device_put(_OFF, P("i"))
  vals = {"on": on, "off": _OFF, "q_off": _OFF, "q_on": jax.device_put(_OFF, P(None, "j")),
          "r_on": jax.device_put(_OFF, P(None, "j"))}
  wrap = {"q_off": hx.quantize, "q_on": hx.quantize,
          "r_on": lambda w: hx.outer(jnp.ones(8, jnp.float32), w[0])}

  def f(a, b):
    t = hx.make_tup(a, wrap.get(second, lambda v: v)(b))
    e = hx.get_tuple_element(t, 1)
    dense = (hx.dequantize(e) if second.startswith("q") else
             hx.matmul_r1(jnp.eye(8, dtype=jnp.float32), e) if second.startswith("r") else e)
    return jnp.sum(hx.get_tuple_element(t, 0) * 2.0) + jnp.sum(dense)

  def f_dense(a, b):
    dense = (hx.dequantize(hx.quantize(b)) if second.startswith("q") else
             jnp.outer(jnp.ones(8, jnp.float32), b[0]) if second.startswith("r") else b)
    return jnp.sum(a * 2.0) + jnp.sum(dense)

  args = (vals[first], vals[second])
  want = jax.grad(f_dense, (0, 1))(*[jnp.asarray(np.asarray(a)) for a in args])
  # exact: the gradients are 2, 1 (straight through a quantization) or a count of ones
  for grad in (jax.grad(f, (0, 1)), jax.jit(jax.grad(f, (0, 1)))):
    for g, w in zip(grad(*args), want):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


# --- Auto mesh axes: a sharded contraction is partial sums, all-reduced -------

@pytest.fixture(scope="module")
def auto_mesh():
  """A 2-device mesh ``("i",)`` with an Auto axis (JAX's default axis type)."""
  if jax.device_count() < 2:
    pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
  return jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:2])


def _row_parallel(shape_x, shape_w, fmt=jnp.int8, group_size=None, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape_x).astype(np.float32)
  q = hx.quantize(jnp.asarray(rng.standard_normal(shape_w), jnp.float32), fmt,
                  group_size=group_size)
  return x, q


# (function, x's spec, q's spec, subscripts of the product with the dequantized weight)
_AUTO_CASES = {
    # Megatron's second matmul: x @ dequantize(q), k sharded on both sides
    "dequant_dot": (lambda x, q: x @ hx.dequantize(q), P(None, "i"), P("i", None), "mk,kn->mn"),
    "matmul_q": (hx.matmul_q, P(None, "i"), P("i", None), "mk,kn->mn"),
    "matmul_q_x_only": (hx.matmul_q, P(None, "i"), P(), "mk,kn->mn"),
    "einsum_in_out": (lambda x, q: hx.einsum("mk,kn->mn", x, q), P(None, "i"), P("i", None),
                      "mk,kn->mn"),
    # the [out, in] layout: the contraction is the quantized axis, the scale on the result
    "einsum_out_in": (lambda x, q: hx.einsum("mk,nk->mn", x, q), P(None, "i"), P(None, "i"),
                      "mk,nk->mn"),
}


_MODES = {"uninstalled": contextlib.nullcontext, "verify": lambda: hx.installed("hx-verify"),
          "installed": hx.installed}


@pytest.mark.parametrize("mode", sorted(_MODES))
@pytest.mark.parametrize("case", sorted(_AUTO_CASES))
def test_sharded_contraction_on_an_auto_mesh(auto_mesh, case, mode):
  fn, xspec, qspec, subscripts = _AUTO_CASES[case]
  x, q = _row_parallel((4, 64), (64, 48) if subscripts == "mk,kn->mn" else (48, 64))
  # the program: bare specs under jax.set_mesh
  f = jax.jit(fn, in_shardings=(xspec, qspec))
  with _MODES[mode](), jax.set_mesh(auto_mesh):
    y = f(x, q)
    text = f.lower(x, q).as_text()
  # x @ dequantize(q) folds into one hx.matmul_q while the fold is installed
  assert text.count('"hx.matmul_q"') == (0 if case == "dequant_dot" and mode != "installed"
                                         else 1)
  assert_einsum_close(y, subscripts, x, hx.dequantize(q), extra=1)


@pytest.mark.parametrize("mode", sorted(_MODES))
@pytest.mark.parametrize("fmt, group, subscripts", [
    (jnp.int4, 32, "mk,kn->mn"), (jnp.int4, 32, "mk,nk->mn"), (jnp.float8_e4m3fn, 16, "mk,nk->mn"),
    (jnp.int8, None, "mk,kn->mn")])
def test_sharded_contraction_on_an_auto_mesh_every_format(auto_mesh, fmt, group, subscripts,
                                                          mode):
  # group scales along the contraction ("mk,nk->mn"): each shard holds whole groups; a
  # weight above the CPU rule's small size (streamed or walked in blocks)
  k, n = 512, 256
  x, q = _row_parallel((4, k), (k, n) if subscripts == "mk,kn->mn" else (n, k), fmt, group)
  qspec = P("i", None) if subscripts == "mk,kn->mn" else P(None, "i")
  f = jax.jit(lambda x, q: hx.einsum(subscripts, x, q),
              in_shardings=(jax.NamedSharding(auto_mesh, P(None, "i")),
                            jax.NamedSharding(auto_mesh, qspec)))
  with _MODES[mode]():
    y = f(x, q)
  assert_einsum_close(y, subscripts, x, hx.dequantize(q), extra=1)


def test_sharded_contraction_on_an_explicit_mesh_stays_a_type_error():
  if jax.device_count() < 2:
    pytest.skip("needs 2 devices")
  mesh = jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,),
                       devices=jax.devices()[:2])
  with jax.set_mesh(mesh):
    x = jax.device_put(np.ones((4, 8), np.float32), P(None, "i"))
    q = hx.quantize(jax.device_put(np.ones((8, 3), np.float32), P("i")))
    qt = hx.quantize(jax.device_put(np.ones((3, 8), np.float32), P(None, "i")))
    with pytest.raises(TypeError, match=r"hx\.matmul_q requires unsharded contraction axes, "
                       r"got f32\[4,8@i\] @ q8\[8@i,3\]: on Explicit mesh axes .* use Auto axes"):
      jax.jit(hx.matmul_q).trace(x, q)
    with pytest.raises(TypeError, match=r"hx\.einsum\('mk,nk->mn'\) requires unsharded "
                       r"contraction axes, got f32\[4,8@i\], q8\[3,8@i\]"):
      hx.einsum("mk,nk->mn", x, qt)


@pytest.mark.parametrize("mode", sorted(_MODES))
def test_grad_of_a_sharded_contraction_on_an_auto_mesh(auto_mesh, mode):
  x, q = _row_parallel((4, 64), (64, 48))
  ct = np.random.default_rng(5).standard_normal((4, 48)).astype(np.float32)
  f = jax.jit(jax.grad(lambda x, q: jnp.sum(hx.matmul_q(x, q) * ct), (0, 1)),
              in_shardings=(P(None, "i"), P("i", None)))
  with _MODES[mode](), jax.set_mesh(auto_mesh):
    gx, gq = f(x, q)
  w = np.asarray(hx.dequantize(q), np.float64)
  assert_within(gx, ct.astype(np.float64) @ w.T, dot_bound("mn,kn->mk", ct, w, extra=1))
  assert_within(gq, x.astype(np.float64).T @ ct, dot_bound("mk,mn->kn", x, ct))
