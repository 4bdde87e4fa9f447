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


# --- shard_map ---------------------------------------------------------------------------
# JAX 0.10.2 runs an un-jitted shard_map eagerly (``_shard_map_impl``), and that
# path reads ``.partitions`` off every spec: hi specs need shard_map under jit.


def test_unjitted_shard_map_with_hi_specs_says_use_jit(on_mesh):
  rows = jax.device_put(ROWS, P("i"))
  q = hx.quantize(rows)
  r = hx.outer(jax.device_put(ROWS[:, 0], P("i")), jnp.ones(3, jnp.float32))
  use_jit = r"must run under jax\.jit: JAX 0\.10\.2 runs an un-jitted shard_map eagerly"
  for spec, arg in [(hx.QArrayP(P("i")), q), (hx.Rank1P(P("i")), r),
                    (hx.TupP((P("i"), hx.QArrayP(P("i")))), hx.make_tup(rows, q))]:
    with pytest.raises(TypeError, match=r"shard_map with " + type(spec).__name__ + r".*" + use_jit):
      jax.shard_map(lambda v: 0 * jnp.sum(jnp.ones(1)), in_specs=spec, out_specs=P())(arg)
  # a hi output of an un-jitted shard_map: JAX hands the type a plain P(); the message says why
  with pytest.raises(TypeError, match=r"crosses shard_map with hx\.QArrayP\(P\(\.\.\.\)\), got "
                     r"P\(\); P\(\) came from JAX, not from you: this shard_map ran "
                     r"un-jitted.*wrap it in jax\.jit"):
    jax.shard_map(hx.quantize, in_specs=P("i"), out_specs=hx.QArrayP(P("i")))(rows)


def test_pmap_of_hi_arguments_says_close_over_them():
  # jax.pmap is built on shard_map with plain specs; a closed-over QArray works
  q = hx.quantize(jnp.asarray(W))
  x = jnp.ones((1, 5, 3), jnp.float32)
  with pytest.raises(TypeError, match=r"jax\.pmap \(built on shard_map, with plain specs\) "
                     r"cannot take hx values as arguments: close over them"):
    jax.pmap(lambda x, q: x @ hx.dequantize(q), in_axes=(0, None))(x, q)
  y = jax.pmap(lambda x: x @ hx.dequantize(q))(x)
  assert_matmul_close(y, x, hx.dequantize(q))


def test_shard_map_out_and_in_quantize_by_shard_equals_global(on_mesh):
  @jax.jit
  @jax.shard_map(in_specs=P("i"), out_specs=hx.QArrayP(P("i")))
  def quantize_shards(x):
    assert jax.typeof(x).shape == (2, 3)
    q = hx.quantize(x)
    assert str(jax.typeof(q)) == "q8[2,3]{V:i}"  # a per-device shard, varying over i
    return q

  @jax.jit
  @jax.shard_map(in_specs=hx.QArrayP(P("i")), out_specs=P("i"))
  def dequantize_shards(q):
    assert jax.typeof(q).shape == (2, 3)
    return hx.dequantize(q)

  rows = jax.device_put(ROWS, P("i"))
  qrows = quantize_shards(rows)
  assert str(jax.typeof(qrows)) == "q8[8@i,3]"
  assert spec(qrows.qvalue) == ("i", None) and spec(qrows.scale) == ("i",)
  qglobal = hx.quantize(rows)
  assert_same_q(qrows, qglobal)  # exactly: scales are per row
  assert_same_q(qrows, hx.quantize(jnp.asarray(ROWS)))
  np.testing.assert_array_equal(np.asarray(dequantize_shards(qrows)),
                                np.asarray(hx.dequantize(qglobal)))


def test_shard_map_matmul_q_replicated_weight(on_mesh):
  qw = hx.quantize(jnp.asarray(W))

  @jax.jit
  @jax.shard_map(in_specs=(P("i"), hx.QArrayP(P())), out_specs=P("i"))
  def f(x, qw):
    return hx.matmul_q(x, qw)

  rows = jax.device_put(ROWS, P("i"))
  assert_matmul_close(f(rows, qw), ROWS, hx.dequantize(qw), extra=1)


def test_shard_map_tuples(on_mesh):
  @jax.jit
  @jax.shard_map(in_specs=hx.TupP((P("i"), hx.QArrayP(P("i")))),
                 out_specs=hx.TupP((hx.QArrayP(P("i")), P("i"))))
  def swap_shards(t):
    assert jax.typeof(t).str_short() == "Tup{f32[2,3]{V:i},q8[2,3]{V:i}}"
    return hx.make_tup(get(t, 1), 2 * get(t, 0))

  rows = jax.device_put(ROWS, P("i"))
  t = hx.make_tup(rows, hx.quantize(rows))
  out = swap_shards(t)
  assert short(out) == "Tup{q8[8@i,3],f32[8@i,3]}"
  assert_same_q(get(out, 0), hx.quantize(jnp.asarray(ROWS)))
  np.testing.assert_array_equal(np.asarray(get(out, 1)), 2 * ROWS)
  with pytest.raises(TypeError, match=r"crosses shard_map with hx\.TupP of 2 specs"):
    jax.jit(jax.shard_map(lambda t: t, in_specs=hx.TupP((P("i"),)), out_specs=P()))(t)


def test_shard_map_bad_specs(on_mesh):
  rows = jax.device_put(ROWS, P("i"))
  qrows = hx.quantize(rows)
  # a plain P the user wrote, in a jitted shard_map: no word of un-jitted shard_map or pmap
  with pytest.raises(TypeError, match=r"q8\[8@i,3\] crosses shard_map with hx\.QArrayP\(P\(\.\.\.\)\), "
                     r"got P\('i',\)(\n|$)"):
    jax.jit(jax.shard_map(hx.dequantize, in_specs=P("i"), out_specs=P("i")))(qrows)
  with pytest.raises(TypeError, match=r"q8\[2,3\] crosses shard_map with hx\.QArrayP\(P\(\.\.\.\)\), "
                     r"got P\('i',\)(\n|$)"):
    jax.jit(jax.shard_map(hx.quantize, in_specs=P("i"), out_specs=P("i")))(rows)
  with pytest.raises(TypeError, match=r"crosses shard_map with hx\.TupP of 2 specs, got P\(\)(\n|$)"):
    jax.jit(jax.shard_map(lambda x: hx.make_tup(x, x), in_specs=P(), out_specs=P()))(jnp.asarray(ROWS))
  with pytest.raises(TypeError, match=r"partitions the quantized \(last\) axis of q8\[8@i,3\]"):
    jax.jit(jax.shard_map(hx.dequantize, in_specs=hx.QArrayP(P("i", "j")),
                          out_specs=P("i")))(qrows)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("hi_spec", [hx.QArrayP(P("i")), hx.Rank1P(P("i")),
                                     hx.TupP((P("i"), hx.QArrayP(P("i"))))])
def test_hi_spec_given_for_an_array_is_a_type_error(on_mesh, hi_spec, check_vma):
  # JAX read .unreduced / .partitions off the hi spec of an array argument or result:
  # AttributeError "'QArrayP' object has no attribute 'unreduced'", or (check_vma=False,
  # out_specs) the eager-shard_map message under jit
  rows = jax.device_put(ROWS, P("i"))
  msg = (r"shard_map spec " + type(hi_spec).__name__ + r"\(.*\) was given for an array "
         r"argument or result; " + type(hi_spec).__name__ + r" is the spec of a hxmlir value "
         r"\(q8, r1, Tup\), an array takes a plain PartitionSpec: P\(\.\.\.\)")
  for in_spec, out_spec in [(hi_spec, P("i")), (P("i"), hi_spec)]:
    with pytest.raises(TypeError, match=msg):
      jax.jit(jax.shard_map(jnp.sin, in_specs=in_spec, out_specs=out_spec,
                            check_vma=check_vma))(rows)


def test_shard_map_rank1(on_mesh):
  col = jax.device_put(np.arange(8., dtype=np.float32), P("i"))
  row = jnp.arange(6., dtype=jnp.float32)

  @jax.jit
  @jax.shard_map(in_specs=(P("i"), P()), out_specs=hx.Rank1P(P("i")))
  def build(c, w):
    return hx.outer(c, w)

  r = build(col, row)
  assert str(jax.typeof(r)) == "r1[8@i,6]"
  c, w = hx.factors(r)
  np.testing.assert_array_equal(np.asarray(c), np.arange(8.))
  np.testing.assert_array_equal(np.asarray(w), np.arange(6.))


def test_grad_through_shard_map(on_mesh):
  @jax.shard_map(in_specs=P("i"), out_specs=hx.QArrayP(P("i")))
  def quantize_shards(x):
    return hx.quantize(x)

  @jax.shard_map(in_specs=hx.QArrayP(P("i")), out_specs=P("i"))
  def dequantize_shards(q):
    return hx.dequantize(q)

  rows = jax.device_put(ROWS, P("i"))
  g = jax.jit(jax.grad(lambda x: jnp.sum(dequantize_shards(quantize_shards(x)) ** 2)))(rows)
  assert short(g) == "f32[8@i,3]"
  ref = 2 * np.asarray(hx.dequantize(hx.quantize(jnp.asarray(ROWS))))
  # the scale (1/127 and the product) and the dequantize product round on each side
  assert_within(g, ref, elementwise_bound(ref, 6))
  # a cotangent for a quantized shard_map argument, and a replicated weight's
  # gradient summed over the shards (the transpose of its implicit pvary)
  qw = hx.quantize(jnp.asarray(W))

  @jax.shard_map(in_specs=(P("i"), hx.QArrayP(P())), out_specs=P("i"))
  def mm(x, qw):
    return hx.matmul_q(x, qw)

  gx, gw = jax.jit(jax.grad(lambda x, qw: jnp.sum(mm(x, qw) ** 2), argnums=(0, 1)))(rows, qw)
  assert (short(gx), short(gw)) == ("f32[8@i,3]", "f32[3,4]")
  wd = np.asarray(hx.dequantize(qw))
  # gradients of sum(phi(x @ w)), phi = y^2 (phi' = 2y, 2-Lipschitz, exact); the scale is
  # applied to x (one more rounding per term than the reference's dequantized w)
  bx, bw = matmul_grad_bounds(ROWS, wd, lambda y: 2 * y, 2.0, extra=2)
  assert_within(gx, 2 * (ROWS @ wd) @ wd.T, bx, "gx: ")
  assert_within(gw, 2 * ROWS.T @ (ROWS @ wd), bw, "gw: ")
  gq = jax.jit(jax.grad(lambda q: jnp.sum(dequantize_shards(q) ** 2)))(hx.quantize(rows))
  assert short(gq) == "f32[8@i,3]"
  assert_within(gq, ref, elementwise_bound(ref, 6))  # as g above


# JAX checks that an output's out_specs names every manual axis it varies over only
# for plain PartitionSpecs; each hi type's unshard applies the same rule, so a hi
# output varying over an axis its spec omits is refused, never one device's block.
VARYING = r"shard_map out_specs .* for {} implies that the output is replicated across mesh " \
          r"axes \{{{}\}}, but it was inferred to be possibly varying over \{{{}\}}; name .* " \
          r"in the out_specs, or reduce over them first \(jax\.lax\.psum / jax\.lax\.pmax"


def test_shard_map_hi_output_varying_over_an_unnamed_axis(on_mesh):
  rows = jax.device_put(ROWS, P("i"))
  q8i = r"q8\[2,3\]\{V:i\}"
  # QArray: from quantize, from make_qarray, and varying over j with a spec naming i only
  with pytest.raises(TypeError, match=VARYING.format(q8i, "i", "i")):
    jax.jit(jax.shard_map(hx.quantize, in_specs=P("i"), out_specs=hx.QArrayP(P())))(rows)
  qv = jax.device_put(ROWS.astype(np.int8), P("i"))
  with pytest.raises(TypeError, match=VARYING.format(q8i, "i", "i")):
    jax.jit(jax.shard_map(hx.make_qarray, in_specs=(P("i"), P()),
                          out_specs=hx.QArrayP(P())))(qv, jnp.ones(2))
  with pytest.raises(TypeError, match=VARYING.format(r"q8\[2,3\]\{V:\(i,j\)\}", "j", "i,j")):
    jax.jit(jax.shard_map(hx.make_qarray, in_specs=(P("i"), P("j")),
                          out_specs=hx.QArrayP(P("i"))))(qv, jax.device_put(ROWS[:4, 0], P("j")))
  # Rank1: each factor against its own entries (more in the test after this one)
  col = jax.device_put(ROWS[:, 0], P("i"))
  with pytest.raises(TypeError, match=VARYING.format(r"the col factor f32\[2\]\{V:i\} "
                                                     r"\(its entries: P\(None,\)\) of "
                                                     r"r1\[2,6\]\{V:i\}", "i", "i")):
    jax.jit(jax.shard_map(hx.outer, in_specs=(P("i"), P()),
                          out_specs=hx.Rank1P(P())))(col, jnp.ones(6))
  # HiTup: array elements (which JAX does not check under a TupP) and nested hi elements
  with pytest.raises(TypeError, match=VARYING.format(r"element 0 \(f32\[2,3\]\{V:i\}\) of "
                                                     r"Tup\{.*\}", "i", "i")):
    jax.jit(jax.shard_map(lambda x: hx.make_tup(x, 1.0), in_specs=P("i"),
                          out_specs=hx.TupP((P(), P()))))(rows)
  with pytest.raises(TypeError, match=VARYING.format(q8i, "i", "i")):
    jax.jit(jax.shard_map(lambda x: hx.make_tup(x, hx.make_tup(hx.quantize(x))), in_specs=P("i"),
                          out_specs=hx.TupP((P("i"), hx.TupP((hx.QArrayP(P()),))))))(rows)


def test_shard_map_rank1_each_factor_checked_against_its_own_spec_entries(on_mesh):
  # Rank1P(P(*b, m, n)) gives the col factor the (*b, m) entries and the row factor
  # (*b, n): each factor must vary only over axes its own entries name, else the
  # output would silently be one device's block of it (the dense spec names them all)
  col = jax.device_put(ROWS[:, 0], P("i"))
  with pytest.raises(TypeError, match=VARYING.format(
      r"the col factor f32\[2\]\{V:i\} \(its entries: P\(None,\)\) of r1\[2,6\]\{V:i\}",
      "i", "i")):
    jax.jit(jax.shard_map(hx.outer, in_specs=(P("i"), P()),
                          out_specs=hx.Rank1P(P(None, "i"))))(col, jnp.ones(6))
  row = jax.device_put(np.arange(6., dtype=np.float32), P("j"))
  with pytest.raises(TypeError, match=VARYING.format(
      r"the row factor f32\[3\]\{V:j\} \(its entries: P\(None,\)\) of r1\[8,3\]\{V:j\}",
      "j", "j")):
    jax.jit(jax.shard_map(hx.outer, in_specs=(P(), P("j")),
                          out_specs=hx.Rank1P(P("j", None))))(jnp.asarray(ROWS[:, 0]), row)
  # batched: the batch entry is both factors'; the col factor varies over j, named by n only
  cols = jax.device_put(ROWS[:, :2].T.copy(), P(None, "j"))
  with pytest.raises(TypeError, match=VARYING.format(
      r"the col factor f32\[2,4\]\{V:j\} \(its entries: P\(None, None\)\) of "
      r"r1\[2,4,6\]\{V:j\}", "j", "j")):
    jax.jit(jax.shard_map(hx.outer, in_specs=(P(None, "j"), P()),
                          out_specs=hx.Rank1P(P(None, None, "j"))))(cols, jnp.ones((2, 6)))


def test_shard_map_rank1_factors_varying_over_different_axes(on_mesh):
  c, w = ROWS[:, 0], np.arange(6., dtype=np.float32)
  col, row = jax.device_put(c, P("i")), jax.device_put(w, P("j"))
  # the row factor does not vary over i: Rank1P(P("i")) fits (its n entry is None)
  r = jax.jit(jax.shard_map(hx.outer, in_specs=(P("i"), P()),
                            out_specs=hx.Rank1P(P("i"))))(col, jnp.asarray(w))
  assert short(r) == "r1[8@i,6]"
  assert [spec(f) for f in hx.factors(r)] == [("i",), (None,)]
  np.testing.assert_array_equal(np.asarray(hx.factors(r)[0]), c)
  np.testing.assert_array_equal(np.asarray(hx.factors(r)[1]), w)

  # each factor varies over its own axis, each named where that factor's entries are
  @jax.jit
  @jax.shard_map(in_specs=(P("i"), P("j")), out_specs=hx.Rank1P(P("i", "j")))
  def build(c, w):
    r = hx.outer(c, w)
    assert str(jax.typeof(r)) == "r1[2,3]{V:(i,j)}"  # printed: the join of both factors'
    assert [str(jax.typeof(f)) for f in hx.factors(r)] == ["float32[2]{V:i}", "float32[3]{V:j}"]
    return r

  r = build(col, row)
  assert short(r) == "r1[8@i,6@j]"
  assert [spec(f) for f in hx.factors(r)] == [("i",), ("j",)]
  np.testing.assert_array_equal(np.asarray(hx.factors(r)[0]), c)
  np.testing.assert_array_equal(np.asarray(hx.factors(r)[1]), w)
  # an invariant col factor with a row factor varying over j, named by the n entry
  r = jax.jit(jax.shard_map(hx.outer, in_specs=(P(), P("j")),
                            out_specs=hx.Rank1P(P(None, "j"))))(jnp.asarray(c), row)
  assert short(r) == "r1[8,6@j]"
  np.testing.assert_array_equal(np.asarray(hx.factors(r)[0]), c)
  np.testing.assert_array_equal(np.asarray(hx.factors(r)[1]), w)
  # r1 in_specs: each factor varies over its own entries' axes inside
  @jax.jit
  @jax.shard_map(in_specs=hx.Rank1P(P("i", "j")), out_specs=hx.TupP((P("i"), P("j"))))
  def parts(r):
    assert [str(jax.typeof(f)) for f in hx.factors(r)] == ["float32[2]{V:i}", "float32[3]{V:j}"]
    return hx.make_tup(*hx.factors(r))

  t = parts(build(col, row))
  np.testing.assert_array_equal(np.asarray(get(t, 0)), c)
  np.testing.assert_array_equal(np.asarray(get(t, 1)), w)


def test_grad_through_shard_map_returning_rank1(on_mesh):
  c, w = ROWS[:, 0] / 7., np.arange(6., dtype=np.float32) / 5. - .3
  x = np.arange(24., dtype=np.float32).reshape(3, 8) / 11. - 1.
  dense = lambda c, w: jnp.sum((jnp.asarray(x) @ jnp.outer(c, w)) ** 2)  # noqa: E731
  gc_want, gw_want = jax.grad(dense, argnums=(0, 1))(jnp.asarray(c), jnp.asarray(w))
  # the gradients are polynomials in (x, c, w): y sums 8 3-factor terms (10 roundings),
  # 2y one more, each gradient sums 3 x 8 3-factor terms of it (+26): depth 37; the
  # shard_map's psum only reorders the sum; twice the bound for two f32 evaluations
  bc, bw = (2 * polynomial_bound(
      lambda x, c, w, i=i: jax.grad(lambda c, w: jnp.sum((x @ jnp.outer(c, w)) ** 2),
                                    argnums=i)(c, w), x, c, w, depth=37) for i in (0, 1))

  # (matmul_r1 inside a shard_map: under jit, its backward rule outside one fails on a
  # row factor sharded over j, a separate problem of explicit sharding)
  @jax.shard_map(in_specs=(P(), hx.Rank1P(P(None, "j"))), out_specs=P(None, "j"))
  def mm_j(x, r):
    return hx.matmul_r1(x, r)

  @jax.shard_map(in_specs=(P(None, "i"), hx.Rank1P(P("i", "j"))), out_specs=P(None, "j"))
  def mm_ij(x, r):
    return jax.lax.psum(hx.matmul_r1(x, r), "i")

  cases = [  # an invariant col factor and a row factor over j; factors over i and j
      (P(), P("j"), hx.Rank1P(P(None, "j")), mm_j, P(), ("f32[8]", "f32[6@j]")),
      (P("i"), P("j"), hx.Rank1P(P("i", "j")), mm_ij, P(None, "i"), ("f32[8@i]", "f32[6@j]"))]
  for cspec, wspec, rspec, mm, xspec, want in cases:
    build = jax.shard_map(hx.outer, in_specs=(cspec, wspec), out_specs=rspec)
    xs = jax.device_put(x, xspec)
    loss = lambda c, w, mm=mm, xs=xs, build=build: jnp.sum(mm(xs, build(c, w)) ** 2)  # noqa: E731
    gc, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(jax.device_put(c, cspec),
                                                     jax.device_put(w, wspec))
    assert (short(gc), short(gw)) == want
    assert_within(gc, gc_want, bc, f"{want} gc: ")
    assert_within(gw, gw_want, bw, f"{want} gw: ")


def test_shard_map_hi_output_replicated_or_unchecked_is_accepted(on_mesh):
  rows = jax.device_put(ROWS, P("i"))
  # reduced over i first: invariant, so a spec that does not name i fits
  @jax.jit
  @jax.shard_map(in_specs=P("i"), out_specs=hx.TupP((hx.QArrayP(P()), P())))
  def total(x):
    s = jax.lax.psum(x, "i")
    return hx.make_tup(hx.quantize(s), s)

  t = total(rows)
  want = ROWS.reshape(4, 2, 3).sum(0)
  assert short(t) == "Tup{q8[2,3],f32[2,3]}"
  assert_same_q(get(t, 0), hx.quantize(jnp.asarray(want)))
  # check_vma=False: the user vouches for replication, as for plain specs
  f = jax.jit(jax.shard_map(hx.quantize, in_specs=P("i"), out_specs=hx.QArrayP(P()),
                            check_vma=False))
  assert short(f(rows)) == "q8[2,3]"


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
