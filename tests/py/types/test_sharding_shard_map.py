"""Hi types across ``shard_map`` on 8 CPU devices (``conftest.py`` sets the device count):
hi values as its operands and results with their blocks' types, collectives and manual axes,
numbers checked against the same computation without a mesh. Explicit-mode typing rules are
in ``test_sharding.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hx_testing import assert_same_q_values as assert_same_q
from jax.sharding import PartitionSpec as P
from numerics import (
  assert_matmul_close,
  assert_within,
  elementwise_bound,
  matmul_grad_bounds,
  polynomial_bound,
)
from test_sharding import ROWS, W, get, short, spec

import hxmlir as hx

# --- shard_map ---------------------------------------------------------------------------
# JAX 0.10.2 runs an un-jitted shard_map eagerly (``_shard_map_impl``), and that
# path reads ``.partitions`` off every spec: hi specs need shard_map under jit.


def test_unjitted_shard_map_with_hi_specs_says_use_jit(on_mesh):
  rows = jax.device_put(ROWS, P("i"))
  q = hx.quantize(rows)
  r = hx.outer(jax.device_put(ROWS[:, 0], P("i")), jnp.ones(3, jnp.float32))
  use_jit = r"must run under jax\.jit: JAX 0\.10\.2 runs an un-jitted shard_map eagerly"
  for hi_spec, arg in [(hx.QArrayP(P("i")), q), (hx.Rank1P(P("i")), r),
                       (hx.TupP((P("i"), hx.QArrayP(P("i")))), hx.make_tup(rows, q))]:
    with pytest.raises(TypeError,
                       match=r"shard_map with " + type(hi_spec).__name__ + r".*" + use_jit):
      jax.shard_map(lambda v: 0 * jnp.sum(jnp.ones(1)), in_specs=hi_spec, out_specs=P())(arg)
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
