"""N-d ``hx.matmul_q`` (``f32[..., k] @ q8[k, n]``) and ``hx.einsum``: one ``hx.matmul_q``
(version 2, ``dot_general`` dimension numbers) for every layout.

Values are compared with a float64 ``einsum`` of the dequantized weight
(``q * s`` is exact in float64) within the bound of an f32 computation of it:
each result element is a sum of ``K`` products (``K``: the product of the summed
indices' sizes, pre-summed ones included) of f32 values rounded once more for the
scale (folded into the dense operand or the result), so by the standard
dot-product bound (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
ed., eq. 3.5) ``|y - y64| <= gamma_{K+2} * einsum(|x|, |q s|)`` with
``gamma_j = j eps / (1 - j eps)``. Gradients are compared with ``jnp.einsum`` on the
dequantized weight within twice that bound for their own sums.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from numerics import assert_within, dot_bound

import hxmlir as hx
from hxmlir import export as hxe
from hxmlir.lowering.matmul_q import blocked

EPS = np.finfo(np.float32).eps

# (subscripts, x shape, q shape): the three, matmul_q's layouts, and more
CASES = [
    ("bsk,kn->bsn", (2, 5, 64), (64, 32)),
    ("...ij,hjk->...ik", (2, 3, 4, 16), (6, 16, 8)),
    ("mk,nk->mn", (5, 64), (32, 64)),              # [out, in]: the scale on the result
    ("...k,kn->...n", (2, 3, 5, 64), (64, 32)),
    ("bmk,bkn->bmn", (3, 5, 16), (3, 16, 8)),      # batched weights
    ("bsk,hkn->bshn", (2, 5, 16), (4, 16, 8)),     # a head axis kept
    ("mk,kn->nm", (5, 16), (16, 8)),               # output transposed
    ("bsk,kn", (2, 5, 16), (16, 8)),               # implicit output
    ("mjk,jk->m", (5, 3, 16), (3, 16)),            # n contracted, scale on the dense side
    ("mkz,kn->mn", (5, 16, 2), (16, 8)),           # an index of x alone, summed first
    ("bsk,nk->bsn", (2, 3, 300), (400, 300)),      # large: the CPU rule walks q in blocks
    ("...ij,hjk->...ik", (2, 3, 64), (4, 64, 300)),  # large, stacked
]


def _data(xshape, qshape, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal(xshape), jnp.float32)
  w = rng.standard_normal(qshape) * rng.uniform(0.1, 3, (*qshape[:-1], 1))
  return x, hx.quantize(jnp.asarray(w, jnp.float32))


def _summed(sub, xshape, qshape) -> int:
  ins, out = sub.split("->") if "->" in sub else (sub, None)
  xs, qs = ins.replace("...", "").split(",")
  sizes = dict(zip(xs, xshape[len(xshape) - len(xs):])) | dict(zip(qs, qshape))
  out = set(out or "") if out is not None else {c for c in xs + qs if (xs + qs).count(c) == 1}
  return int(np.prod([d for c, d in sizes.items() if c not in out], dtype=np.int64))


def _assert_within_bound(y, sub, x, q):
  w64 = np.asarray(q.qvalue, np.float64) * np.asarray(q.scale, np.float64)[..., None]
  x64 = np.asarray(x, np.float64)
  want = np.einsum(sub, x64, w64)
  k = _summed(sub, x.shape, q.shape) + 2
  bound = k * EPS / (1 - k * EPS) * np.einsum(sub, np.abs(x64), np.abs(w64))
  y = np.asarray(y)
  assert y.shape == want.shape and y.dtype == np.float32
  err = np.abs(y - want)
  assert np.all(err <= bound), f"error {err.max():.3g} > bound at {np.argmax(err - bound)}"


@pytest.mark.parametrize("sub, xshape, qshape", CASES, ids=lambda v: str(v))
def test_einsum_values(sub, xshape, qshape):
  x, q = _data(xshape, qshape)
  _assert_within_bound(hx.einsum(sub, x, q), sub, x, q)
  _assert_within_bound(jax.jit(hx.einsum, static_argnums=0)(sub, x, q), sub, x, q)


def test_the_bound_catches_a_wrong_scale():
  x, q = _data((5, 64), (32, 64))
  y = hx.einsum("mk,nk->mn", x, q) * 1.001
  with pytest.raises(AssertionError, match="error .* > bound"):
    _assert_within_bound(y, "mk,nk->mn", x, q)


def test_quantized_operand_on_the_left():
  x, q = _data((5, 64), (32, 64))
  y = hx.einsum("nk,mk->mn", q, x)
  _assert_within_bound(y, "mk,nk->mn", x, q)


@pytest.mark.parametrize("xshape", [(64,), (5, 64), (2, 5, 64), (2, 3, 5, 64)], ids=str)
def test_matmul_q_takes_any_leading_dims(xshape):
  x, q = _data(xshape, (64, 32))
  for f in (hx.matmul_q, jax.jit(hx.matmul_q)):
    y = f(x, q)
    assert y.shape == (*xshape[:-1], 32)
    _assert_within_bound(y, "...k,kn->...n", x, q)


@pytest.mark.parametrize("sub, xshape, qshape", CASES[:10], ids=lambda v: str(v))
def test_einsum_grads(sub, xshape, qshape):
  x, q = _data(xshape, qshape)
  w = hx.dequantize(q)
  c = jnp.asarray(np.random.default_rng(1).standard_normal(jnp.einsum(sub, x, w).shape),
                  jnp.float32)

  def loss(x, w):
    return jnp.sum(c * hx.einsum(sub, x, hx.quantize(w)))

  def ref(x, w):
    return jnp.sum(c * jnp.einsum(sub, x, w, precision="highest"))

  # |terms| of each gradient element: the same gradients of the absolute values
  def mag(x, w):
    return jnp.sum(jnp.abs(c) * jnp.einsum(sub, x, w, precision="highest"))

  k = max(x.size, w.size, c.size)
  gamma = 2 * k * EPS / (1 - k * EPS)
  for how in (jax.grad, lambda f, **kw: jax.jit(jax.grad(f, **kw))):
    gx, gw = how(loss, argnums=(0, 1))(x, w)
    rx, rw = jax.grad(ref, argnums=(0, 1))(x, w)
    bx = jax.grad(mag, argnums=0)(jnp.abs(x), jnp.abs(w))
    bw = jax.grad(mag, argnums=1)(jnp.abs(x), jnp.abs(w))
    assert np.all(np.abs(np.asarray(gx - rx)) <= gamma * np.asarray(bx))
    assert np.all(np.abs(np.asarray(gw - rw)) <= gamma * np.asarray(bw))


def _count(text: str, what: str) -> int:
  return len(re.findall(what, text))


@pytest.mark.parametrize("sub, xshape, qshape", CASES[:10], ids=lambda v: str(v))
@pytest.mark.parametrize("mapped", ["x", "q", "both"])
def test_vmap_stays_one_composite(sub, xshape, qshape, mapped):
  xs = [_data(xshape, qshape, seed) for seed in range(3)]
  x = jnp.stack([a for a, _ in xs])
  q = hx.quantize(jnp.stack([hx.dequantize(b) for _, b in xs]))
  in_axes = {"x": (0, None), "q": (None, hx.QArraySpec()), "both": (0, hx.QArraySpec())}[mapped]
  x_arg = x if mapped != "q" else xs[0][0]
  q_arg = q if mapped != "x" else xs[0][1]
  f = jax.jit(jax.vmap(lambda x, q: hx.einsum(sub, x, q), in_axes=in_axes, axis_size=3))
  text = f.lower(x_arg, q_arg).as_text()
  assert _count(text, r'stablehlo.composite "hx.matmul_q"') == 1
  assert "stablehlo.while" not in text  # no loop over the batch
  got = np.asarray(f(x_arg, q_arg))
  for i in range(3):
    qi = hx.QArray(q.qvalue[i], q.scale[i]) if mapped != "x" else xs[0][1]
    xi = x[i] if mapped != "q" else xs[0][0]
    _assert_within_bound(got[i], sub, xi, qi)  # each slice: a loop over the batch


def test_composite_carries_the_dimension_numbers_and_format():
  x, q = _data((2, 5, 64), (32, 64))
  text = jax.jit(lambda x, q: hx.einsum("bsk,nk->bsn", x, q)).lower(x, q).as_text()
  assert ('stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2 {composite_attributes = '
          '{dtype = "int8", group_size = 0 : i64, layout = "plain", '
          'lhs_batching_dimensions = array<i64>, lhs_contracting_dimensions = array<i64: 2>, '
          'rhs_batching_dimensions = array<i64>, rhs_contracting_dimensions = array<i64: 1>}'
          in text)
  assert "version = 3 : i32" in text


def test_hi_jaxpr_has_one_matmul_q():
  x, q = _data((2, 3, 4, 16), (6, 16, 8))
  jaxpr = jax.make_jaxpr(lambda x, q: hx.einsum("...ij,hjk->...ik", x, q))(x, q)
  prims = [e.primitive.name for e in jaxpr.eqns]
  assert prims.count("call_hi_primitive") == 1 and "MatmulQ" in str(jaxpr)


# --- errors ----------------------------------------------------------------------

@pytest.mark.parametrize("sub, xshape, qshape, msg", [
    ("mk,njk->mn", (5, 16), (4, 3, 16),
     r"hx\.einsum\('mk,njk->mn'\): f32\[5,16\], q8\[4,3,16\]: the scales cannot be folded"),
    ("ij,jk->i", (3, 4), (4, 5),
     r"hx\.einsum\('ij,jk->i'\): f32\[3,4\], q8\[4,5\]: sums the quantized axis 'k'"),
    ("ii,ik->k", (4, 4), (4, 5), r"f32\[4,4\], q8\[4,5\]: index repeated within the dense"),
    ("ij,jk->ik", (3, 4), (5, 6), r"f32\[3,4\], q8\[5,6\]: index 'j' has sizes 4 and 5"),
    # sizes of axes under '...' name no letter opt_einsum made up; size 1 never broadcasts
    ("ab...,...->ab...", (2, 3, 4), (4, 5),
     r"f32\[2,3,4\], q8\[4,5\]: an axis under '\.\.\.' has sizes 4 and 5($|\n)"),
    ("...k,...kn->...n", (2, 1, 4), (3, 4, 5),
     r"an axis under '\.\.\.' has sizes 1 and 3; hx\.einsum does not broadcast size-1 axes"),
    ("ij,jk->ik", (3, 1), (5, 6), r"index 'j' has sizes 1 and 5; hx\.einsum does not broadcast"),
    ("ij,jk,kl->il", (3, 4), (4, 5), r"hx\.einsum\('ij,jk,kl->il'\): f32\[3,4\], q8\[4,5\]"),
])
def test_einsum_type_errors_name_subscripts_and_operands(sub, xshape, qshape, msg):
  x, q = _data(xshape, qshape)
  with pytest.raises(TypeError, match=msg):
    hx.einsum(sub, x, q)
  with pytest.raises(TypeError, match=msg):
    jax.jit(hx.einsum, static_argnums=0).trace(sub, x, q)


@pytest.mark.parametrize("subscripts", [3, None, ["bsk", "kn"], (0, 1)])
def test_einsum_subscripts_that_are_not_a_string_are_a_type_error(subscripts):
  # they reached opt_einsum's parser ("lists must contain either Ellipsis or hashable ...")
  x, q = _data((2, 3), (3, 4))
  with pytest.raises(TypeError, match=r"hx\.einsum takes its subscripts as a string first "
                                      r"\('bsk,kn->bsn'\), got "):
    hx.einsum(subscripts, x, q)


def test_einsum_needs_one_quantized_operand():
  x = jnp.ones((3, 4), jnp.float32)
  with pytest.raises(TypeError, match=r"f32\[3,4\], f32\[3,4\]: expects one dense \(f32, bf16 or f16\) operand "
                                      r"and one quantized"):
    hx.einsum("ij,jk->ik", x, x)


# --- sharding, shard_map, export -----------------------------------------------------

def test_leading_dims_sharded_like_x(on_mesh):
  x, q = _data((8, 6, 16), (16, 4))
  xs = jax.device_put(x, P("i", "j"))
  for f in (hx.matmul_q, jax.jit(hx.matmul_q)):
    y = f(xs, q)
    assert jax.typeof(y).str_short(short_dtypes=True) == "f32[8@i,6@j,4]"
    _assert_within_bound(y, "...k,kn->...n", x, q)
  g = jax.jit(jax.grad(lambda x: jnp.sum(hx.matmul_q(x, q) ** 2)))(xs)
  assert jax.typeof(g).str_short(short_dtypes=True) == "f32[8@i,6@j,16]"
  qo = hx.quantize(jax.device_put(hx.dequantize(_data((4, 16), (4, 16))[1]), P("j")))
  y = hx.einsum("bsk,nk->bsn", jax.device_put(x, P("i")), qo)
  assert jax.typeof(y).str_short(short_dtypes=True) == "f32[8@i,6,4@j]"
  # a mesh axis on a free dim of each operand would shard the result twice
  with pytest.raises(TypeError, match=r"f32\[8@i,6@j,16\], q8\[4@j,16\]: the result would "
                                      r"be sharded over mesh axis 'j' twice"):
    hx.einsum("bsk,nk->bsn", xs, qo)


def test_shard_map_over_leading_dims(on_mesh):
  x, q = _data((8, 6, 16), (16, 4))

  @jax.jit
  @jax.shard_map(in_specs=(P("i"), hx.QArrayP(P())), out_specs=P("i"))
  def f(x, q):
    return hx.einsum("bsk,kn->bsn", x, q)

  _assert_within_bound(f(jax.device_put(x, P("i")), q), "bsk,kn->bsn", x, q)


def test_export_round_trip():
  x, q = _data((2, 5, 64), (64, 32))
  _, qo = _data((2, 5, 64), (48, 64), seed=1)

  def f(x, q, qo):
    return hx.matmul_q(x, q), hx.einsum("bsk,nk->bsn", x, qo)
  exp = hxe.deserialize(hxe.export(f)(x, q, qo).serialize())
  y1, y2 = exp.call(x, q, qo)
  w1, w2 = jax.jit(f)(x, q, qo)
  np.testing.assert_array_equal(np.asarray(y1), np.asarray(w1))
  np.testing.assert_array_equal(np.asarray(y2), np.asarray(w2))


# --- memory: the compiled program never holds the f32 weight ---------------------------

K = N = 2048
W_BYTES = K * N * 4


def _temp(f, *args) -> int:
  return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.fixture
def big_weight():
  return hx.QArray(jnp.zeros((K, N), jnp.int8), jnp.zeros((K,), jnp.float32))


@pytest.mark.parametrize("name", ["matmul_q", "bsk,kn->bsn", "bsk,nk->bsn", "mk,nk->mn",
                                  "...ij,hjk->...ik", "install: x @ dequantize(q)"])
def test_temporary_memory_is_at_most_a_quarter_of_the_f32_weight(name, big_weight):
  x = jax.ShapeDtypeStruct((4, 16, K), jnp.float32)
  q = big_weight
  if name == "matmul_q":
    temp = _temp(hx.matmul_q, x, q)
  elif name == "mk,nk->mn":
    temp = _temp(lambda x, q: hx.einsum(name, x, q), jax.ShapeDtypeStruct((64, K), jnp.float32), q)
  elif name == "...ij,hjk->...ik":  # a stack of four 512 x 2048 weights: the same bytes
    q = hx.QArray(jnp.zeros((4, 512, N), jnp.int8), jnp.zeros((4, 512), jnp.float32))
    temp = _temp(lambda x, q: hx.einsum(name, x, q), jax.ShapeDtypeStruct((4, 16, 512),
                                                                          jnp.float32), q)
  elif name.startswith("install"):
    with hx.installed():
      temp = _temp(lambda x, q: x @ hx.dequantize(q), x, q)
    # without the fold, XLA converts the whole weight
    assert _temp(lambda x, q: x @ hx.dequantize(q), x, q) >= W_BYTES
  else:
    temp = _temp(lambda x, q: hx.einsum(name, x, q), x, q)
  assert temp <= W_BYTES // 4, f"{name}: {temp / 2**20:.1f} MiB temporary"


def test_blocked_layouts_match_the_reference_decomposition(monkeypatch):
  # the CPU rule's blocked decomposition against the plain reference, several blocks
  monkeypatch.setattr(blocked, "SMALL_WEIGHT", 0)
  monkeypatch.setattr(blocked, "BLOCK_BYTES", 4 * 64 * 7)  # 7 rows: a remainder
  jax.clear_caches()
  try:
    for sub, xshape, qshape in [("mk,nk->mn", (5, 64), (32, 64)),
                                ("...ij,hjk->...ik", (2, 3, 4, 16), (6, 16, 40))]:
      x, q = _data(xshape, qshape)
      text = jax.jit(lambda x, q, sub=sub: hx.einsum(sub, x, q)).lower(x, q).as_text()
      assert "stablehlo.while" in text
      _assert_within_bound(jax.jit(hx.einsum, static_argnums=0)(sub, x, q), sub, x, q)
  finally:
    jax.clear_caches()


# --- bf16/f16 activations -----------------------------------------

@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("subscripts, xs, qs, fmt, group", [
    ("mk,kn->mn", (5, 64), (64, 32), jnp.int8, None),
    ("mk,nk->mn", (5, 64), (32, 64), jnp.int4, 32),        # [out, in]: groups along k
    ("bmk,nk->mn", (3, 5, 64), (32, 64), jnp.float8_e4m3fn, 16),  # b summed on x alone
    ("nk,mk->mn", (5, 64), (32, 64), jnp.int8, 32),        # quantized operand first
])
def test_einsum_takes_half_precision_x(dtype, subscripts, xs, qs, fmt, group):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal(xs), dtype)
  q = hx.quantize(jnp.asarray(rng.standard_normal(qs), jnp.float32), fmt, group_size=group)
  swapped = subscripts.startswith("nk")
  args = (q, x) if swapped else (x, q)
  w = np.asarray(hx.dequantize(q), np.float64)
  xf = np.asarray(x, np.float64)  # exact
  ops = (w, xf) if swapped else (xf, w)
  f = jax.jit(lambda *a: hx.einsum(subscripts, *a))
  y = f(*args)
  assert y.dtype == jnp.result_type(x.dtype, jnp.float32) == jnp.float32
  # f32 throughout (x-only sums too: as jnp.einsum promotes x against the f32 weight)
  assert_within(y, np.einsum(subscripts, *ops), dot_bound(subscripts, *ops, extra=2))
  i = 1 if swapped else 0
  g = jax.grad(lambda *a: jnp.sum(f(*a)), i)(*args)
  assert g.dtype == dtype and g.shape == x.shape
  want = jax.grad(lambda *a: jnp.sum(jnp.einsum(subscripts, *a)), i)(
      *[hx.dequantize(q) if a is q else a for a in args])
  assert want.dtype == dtype
  u = {jnp.bfloat16: 2.0 ** -8, jnp.float16: 2.0 ** -11}[dtype]
  np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(want, np.float64),
                             rtol=2 * u, atol=0)
