"""``hx.make_qarray`` and ``hx.qarray_parts``: quantized arrays from and to their components.

Values are checked against numpy bit for bit; gradients against dense
expressions written here and against finite differences
(``jax.test_util.check_grads``) where the function is differentiable. The
explicit-sharding and ``shard_map`` cases run on the 8 CPU devices of
``conftest.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads
from numerics import assert_einsum_close, assert_sum_close, assert_within, elementwise_bound

import hxmlir as hx

QV = np.array([[-127, 5, 64], [3, -128, 127], [0, 0, 0], [7, -7, 2]], np.int8)
SC = np.array([0.5, 2.0 ** -7, 3.0, np.nan], np.float32)


def bits(a) -> np.ndarray:
  """The raw bits of an array (NaN payloads and -0.0 included)."""
  a = np.asarray(a)
  return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def assert_parts(q, qvalue, scale):
  np.testing.assert_array_equal(bits(q.qvalue), bits(qvalue))
  np.testing.assert_array_equal(bits(q.scale), bits(scale))


def short(v) -> str:
  return jax.typeof(v).str_short(short_dtypes=True)


def weights(qvalue: np.ndarray) -> np.ndarray:
  """numpy: d(scale) = sum(w * dX, -1), read at the row's largest |qvalue| (ties averaged)."""
  a = np.abs(qvalue.astype(np.float32))
  top = a.max(-1, keepdims=True)
  at_top = (a == top) & (top > 0)
  count = at_top.sum(-1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(at_top, 1 / (qvalue.astype(np.float32) * count), 0).astype(np.float32)


# --- values ----------------------------------------------------------------------

def test_make_qarray_values_and_type():
  q = hx.make_qarray(QV, SC)
  assert isinstance(q, hx.QArray) and short(q) == "q8[4,3]"
  assert_parts(q, QV, SC)
  expected = QV.astype(np.float32) * SC[:, None]
  np.testing.assert_array_equal(np.asarray(hx.dequantize(q)), expected)
  qj = jax.jit(hx.make_qarray)(QV, SC)
  assert short(qj) == "q8[4,3]"
  assert_parts(qj, QV, SC)
  # a Python float scale for a single row: a (non-weak) f32[] scale
  one = hx.make_qarray(np.arange(3, dtype=np.int8), 0.25)
  assert short(one) == "q8[3]" and not jax.typeof(one.scale).weak_type
  np.testing.assert_array_equal(np.asarray(hx.dequantize(one)), [0., .25, .5])


def test_qarray_parts_values():
  q = hx.QArray(jnp.asarray(QV), jnp.asarray(SC))
  for qv, s in (hx.qarray_parts(q), jax.jit(hx.qarray_parts)(q)):
    assert (short(qv), short(s)) == ("i8[4,3]", "f32[4]")
    np.testing.assert_array_equal(bits(qv), bits(QV))
    np.testing.assert_array_equal(bits(s), bits(SC))


def test_round_trips_are_bit_exact():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 5, 7)), jnp.float32)
  q = hx.quantize(x)
  for f in (lambda q: hx.make_qarray(*hx.qarray_parts(q)),
            jax.jit(lambda q: hx.make_qarray(*hx.qarray_parts(q)))):
    again = f(q)
    assert jax.typeof(again) == jax.typeof(q)
    assert_parts(again, q.qvalue, q.scale)
  for f in (lambda a, b: hx.qarray_parts(hx.make_qarray(a, b)),
            jax.jit(lambda a, b: hx.qarray_parts(hx.make_qarray(a, b)))):
    qv, s = f(QV, SC)
    np.testing.assert_array_equal(bits(qv), bits(QV))
    np.testing.assert_array_equal(bits(s), bits(SC))


def test_checkpoint_components_in_jit():
  # the motivating case: params stored as int8 and f32 arrays, combined in the forward pass
  rng = np.random.default_rng(1)
  w = jnp.asarray(rng.standard_normal((3, 4)), jnp.float32)
  qw = hx.quantize(w)
  params = {"w_q": np.asarray(qw.qvalue), "w_s": np.asarray(qw.scale)}
  x = jnp.asarray(rng.standard_normal((2, 3)), jnp.float32)

  @jax.jit
  def forward(params, x):
    return hx.matmul_q(x, hx.make_qarray(params["w_q"], params["w_s"]))

  np.testing.assert_array_equal(np.asarray(forward(params, x)), np.asarray(hx.matmul_q(x, qw)))


def test_components_are_attributes_of_traced_values():
  q = hx.quantize(jnp.arange(12., dtype=jnp.float32).reshape(3, 4))
  qv, s = jax.jit(lambda q: (q.qvalue, q.scale))(q)
  assert_parts(q, qv, s)
  g = jax.grad(lambda q: jnp.sum(q.scale))(q)
  np.testing.assert_array_equal(np.asarray(g), weights(np.asarray(q.qvalue)))


# --- bad input ---------------------------------------------------------------------

@pytest.mark.parametrize("qvalue, scale, got", [
    (np.zeros((4, 3), np.int8), np.ones(3, np.float32), "i8[4,3], f32[3]"),
    (np.zeros((4, 3), np.float32), np.ones(4, np.float32), "f32[4,3], f32[4]"),
    # (f16 scales are the formats int8_f16 and int4_f16: tests/py/types/test_offset_formats.py)
    (np.zeros((4, 3), np.int8), np.ones(4, jnp.bfloat16), "i8[4,3], bf16[4]"),
    (np.zeros((), np.int8), np.ones((), np.float32), "i8[], f32[]"),
])
def test_make_qarray_type_errors_name_both_operands(qvalue, scale, got):
  msg = (r"hx\.make_qarray expects qvalue: i8\[\*l, n\] and scale: f32\[\*l\], got "
         + got.replace("[", r"\[").replace("]", r"\]"))
  with pytest.raises(TypeError, match=msg):
    hx.make_qarray(qvalue, scale)
  with pytest.raises(TypeError, match=msg):
    jax.jit(hx.make_qarray)(qvalue, scale)


@pytest.mark.parametrize("x64", [False, True])
def test_weakly_typed_scales_become_f32(x64):
  # a Python float or int scale converts as in arithmetic with an f32 array: also
  # under jax_enable_x64 (weak f64, weak i64), eagerly and traced
  qv = jnp.asarray(QV[0])
  with jax.enable_x64(x64):
    for scale in (0.5, 2):
      for q in (hx.make_qarray(qv, scale), jax.jit(lambda qv, s=scale: hx.make_qarray(qv, s))(qv),
                jax.jit(hx.make_qarray)(qv, scale)):
        assert short(q) == "q8[3]"
        assert_parts(q, QV[0], np.float32(scale))
    q = jax.jit(lambda qv, s: hx.make_qarray(qv, s * 2.0))(qv, jnp.float32(0.25))
    assert_parts(q, QV[0], np.float32(0.5))
    # strongly typed scales are not converted (f16 is a format's: int8_f16, kept as it is)
    assert short(hx.make_qarray(qv, jnp.ones((), "float16"))) == "q8[3:f16]"
    for dtype in ("bfloat16",) + (("float64",) if x64 else ()):
      with pytest.raises(TypeError, match=r"hx\.make_qarray expects qvalue: i8\[\*l, n\] and "
                         r"scale: f32\[\*l\], got i8\[3\], \w+\[\]; convert the scale "
                         r"with \.astype\(jnp\.float32\)"):
        hx.make_qarray(qv, jnp.ones((), dtype))


@pytest.mark.parametrize("qvalue", [[[1, 2, 3], [4, 5, 6]], np.ones((2, 3), np.int32),
                                    jnp.ones((2, 3), jnp.int16)])
def test_integer_qvalue_not_int8_says_astype(qvalue):
  with pytest.raises(TypeError, match=r"got i(32|16)\[2,3\], f32\[2\]; convert the values with "
                     r"\.astype\(jnp\.int8\)"):
    hx.make_qarray(qvalue, jnp.ones(2, jnp.float32))


@pytest.mark.parametrize("words,heads,want", [
    # Q4_K's 70 words with dmin forgotten; d of another shape; 10 words: Q5_0 or Q5_1
    ((8, 2, 70), [(8, 2)], r"u16\[8,2,70\], f16\[8,2\] are not a block format's components: "
                           r"q4_k takes d and dmin f16\[8,2\]$"),
    ((8, 2, 70), [(4, 3), (4, 3)], r"q4_k takes d and dmin f16\[8,2\]$"),
    ((8, 3, 10), [(2, 3)], r"q5_0 takes d f16\[8,3\]; q5_1 takes d and dmin f16\[8,3\]$"),
])
def test_block_words_with_wrong_heads_say_what_the_format_takes(words, heads, want):
  q = jnp.zeros(words, jnp.uint16)
  with pytest.raises(TypeError, match="hx.make_qarray.*" + want):
    hx.make_qarray(q, *(jnp.ones(h, jnp.float16) for h in heads))


def test_make_qarray_of_a_qarray_and_parts_of_an_array_are_type_errors():
  q = hx.make_qarray(QV, SC)
  with pytest.raises(TypeError, match=r"got q8\[4,3\], f32\[4\]"):
    hx.make_qarray(q, SC)
  with pytest.raises(TypeError, match=r"hx\.qarray_parts expects a quantized array \(q8, q4, f8, u4o, q8o, q5_0, q5_1, iq4_nl, q4_k, q5_k, q6_k, q2_k, q3_k or iq4_xs\[\.\.\., n\]\), "
                     r"got f32\[4,3\]"):
    jax.jit(hx.qarray_parts)(jnp.zeros((4, 3)))


@pytest.mark.parametrize("transform", ["jit", "grad", "vmap", "scan"])
def test_constructor_on_traced_arrays_says_use_make_qarray(transform):
  qv, s = jnp.asarray(QV), jnp.asarray(SC[:2])
  use = (r"hx\.QArray\(qvalue: i8\[.*\], scale: f32\[.*\]\) built from traced arrays .* use "
         r"hx\.make_qarray\(qvalue, scale\) there")

  def loss(qv, s):
    return jnp.sum(hx.dequantize(hx.QArray(qv, s)))

  with pytest.raises(TypeError, match=use):
    if transform == "jit":
      jax.jit(loss)(qv[:2], s)
    elif transform == "grad":
      jax.grad(lambda s: loss(qv[:2], s))(s)
    elif transform == "vmap":
      jax.vmap(loss)(qv[:2], s)
    else:
      jax.lax.scan(lambda c, xs: (c + loss(*xs), None), 0., (qv[:2], s))
  # returned from traced code: JAX's own check of the results replaces the message
  with pytest.raises(TypeError, match=r"returned a value of type <class 'hxmlir\.types\.qarray\.QArray'>"):
    jax.jit(lambda qv, s: hx.QArray(qv, s))(qv[:2], s)
  # the same code with make_qarray
  assert jax.jit(lambda qv, s: jnp.sum(hx.dequantize(hx.make_qarray(qv, s))))(qv[:2], s) == \
      np.sum(QV[:2].astype(np.float32) * SC[:2, None])


# --- autodiff ----------------------------------------------------------------------

def test_grad_make_qarray_wrt_scale_equals_dense_expression():
  rng = np.random.default_rng(2)
  c = rng.standard_normal((4, 3)).astype(np.float32)
  s = jnp.asarray([0.5, 2.0 ** -7, 3.0, 1.5], jnp.float32)

  def f(s):
    return jnp.sum(hx.dequantize(hx.make_qarray(QV, s)) * c)

  for g in (jax.grad(f)(s), jax.jit(jax.grad(f))(s), jax.grad(jax.checkpoint(f))(s)):
    # d/ds sum(q * s * c) = sum(q * c, -1)
    assert_sum_close(g, QV.astype(np.float32) * c, axis=-1, extra=1)
  check_grads(lambda s: hx.dequantize(hx.make_qarray(QV, s)), (s,), order=2,
              modes=("fwd", "rev"))
  _, t = jax.jvp(lambda s: hx.dequantize(hx.make_qarray(QV, s)), (s,), (jnp.ones(4),))
  assert short(t) == "f32[4,3]"
  np.testing.assert_array_equal(np.asarray(t), QV.astype(np.float32))


def test_qvalue_gets_a_float0_cotangent():
  gq, gs = jax.grad(lambda q, s: jnp.sum(hx.dequantize(hx.make_qarray(q, s))), argnums=(0, 1),
                    allow_int=True)(jnp.asarray(QV), jnp.ones(4, jnp.float32))
  assert gq.dtype == jax.dtypes.float0 and gq.shape == (4, 3)
  np.testing.assert_array_equal(np.asarray(gs), QV.astype(np.float32).sum(-1))
  with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
    jax.grad(lambda q: jnp.sum(hx.dequantize(hx.make_qarray(q, jnp.ones(4)))))(jnp.asarray(QV))


def test_grad_through_qarray_parts_reads_the_largest_values():
  # row 0: one largest |q| (-127); row 1: -128 largest; row 2: zeros; row 3: a tie 7, -7
  q = hx.make_qarray(QV, np.abs(np.nan_to_num(SC, nan=1.0)))
  c = jnp.asarray([1., 2., 3., 4.], jnp.float32)
  g = jax.grad(lambda q: jnp.sum(hx.qarray_parts(q)[1] * c))(q)
  assert short(g) == "f32[4,3]"
  expected = np.array([[-1 / 127, 0, 0], [0, -2 / 128, 0], [0, 0, 0], [4 / 14, -4 / 14, 0]],
                      np.float32)
  # exact: each entry is c (1, 2, 3 or 4; 3 only against a 0) times one correctly
  # rounded 1 / (q * ties), and scaling by a power of two rounds nothing
  np.testing.assert_array_equal(np.asarray(g), expected)
  np.testing.assert_array_equal(np.asarray(g), weights(QV) * np.asarray(c)[:, None])
  gj = jax.jit(jax.grad(lambda q: jnp.sum(hx.qarray_parts(q)[1] * c)))(q)
  np.testing.assert_array_equal(np.asarray(gj), np.asarray(g))
  dx = jnp.asarray(np.arange(12, dtype=np.float32).reshape(4, 3))
  (qv, s), (dqv, ds) = jax.jvp(hx.qarray_parts, (q,), (dx,))
  assert dqv.dtype == jax.dtypes.float0
  # terms w * dx: a reciprocal and a product each side, summed over a row
  assert_sum_close(ds, weights(QV) * np.asarray(dx), -1, extra=4)


def test_parts_of_make_differentiates_as_identity_in_the_scale():
  s = jnp.asarray([0.5, 0.25, 3.0, 1.5], jnp.float32)
  qv = jnp.asarray(QV).at[2].set(1)  # no row of zeros: every scale is read back

  def f(s):
    return hx.qarray_parts(hx.make_qarray(qv, s))[1]

  for jac in (jax.jacfwd, jax.jacrev):
    # 1 = sum over a row's tied largest values of q / (q * ties): 3 roundings
    assert_within(jac(f)(s), np.eye(4), elementwise_bound(np.eye(4), 3))


def test_scale_of_quantize_has_the_absmax_derivative():
  # quantize differentiates straight through; the scale read back through qarray_parts
  # then has the derivative of max(|x|) / 127 (rows with a clearly largest element)
  rng = np.random.default_rng(4)
  x = rng.uniform(-0.5, 0.5, (3, 6)).astype(np.float32)
  x[np.arange(3), [1, 4, 0]] = [2., -3., 1.5]
  x = jnp.asarray(x)

  def scale(x):
    return hx.qarray_parts(hx.quantize(x))[1]

  # max(|x|) * f32(1/127) against f32 max(|x|) / 127: three roundings
  want = np.abs(np.asarray(x)).max(-1) / 127
  assert_within(scale(x), want, elementwise_bound(want, 3))
  check_grads(scale, (x,), order=1, modes=("fwd", "rev"), eps=1e-2, atol=1e-4, rtol=1e-3)
  g = jax.jacrev(scale)(x)
  expected = np.zeros((3, 3, 6), np.float32)
  expected[np.arange(3), np.arange(3), [1, 4, 0]] = np.array([1., -1., 1.]) / 127
  assert_within(g, expected, elementwise_bound(expected, 3))


def test_parts_of_make_zero_row_scale_has_a_zero_derivative():
  # a row of zeros: its scale has no effect on the value, so its tangent is 0
  # (the one exception to "identity in s")
  s = jnp.asarray([0.5, 0.25, 3.0, 1.5], jnp.float32)

  def f(s):
    return hx.qarray_parts(hx.make_qarray(QV, s))[1]

  assert not QV[2].any()
  want = np.diag([1., 1., 0., 1.])
  for jac in (jax.jacfwd, jax.jacrev):
    assert_within(jac(f)(s), want, elementwise_bound(want, 3))  # as in the test above


def test_scale_of_quantize_with_tied_largest_values_shares_the_derivative():
  # 1.0 and 0.998 both quantize to 127: d(scale) is averaged over them, so it is
  # not the derivative of max(|x|) / 127 (which is [1/127, 0, 0])
  x = jnp.asarray([[1.0, 0.998, 0.1], [1.0, 0.5, 0.1]], jnp.float32)
  np.testing.assert_array_equal(np.asarray(hx.quantize(x).qvalue), [[127, 127, 13], [127, 64, 13]])

  def scale(x):
    return hx.qarray_parts(hx.quantize(x))[1]

  expected = np.array([[1 / 254, 1 / 254, 0], [1 / 127, 0, 0]], np.float32)
  # a reciprocal of (ties * 127) and a product each side
  assert_within(jax.grad(lambda x: scale(x).sum())(x), expected, elementwise_bound(expected, 3))
  _, ds = jax.jvp(scale, (x,), (jnp.ones_like(x),))
  assert_sum_close(ds, expected, -1, extra=3)


def test_parts_derivatives_with_an_empty_quantized_axis():
  # n = 0: no largest element in any row; every scale tangent is 0 (was a ValueError
  # from a max over the empty axis)
  z = jnp.zeros((2, 0), jnp.int8)
  s = jnp.ones(2, jnp.float32)

  def f(s):
    return hx.qarray_parts(hx.make_qarray(z, s))[1]

  _, t = jax.jvp(f, (s,), (s,))
  np.testing.assert_array_equal(np.asarray(t), [0., 0.])
  np.testing.assert_array_equal(np.asarray(jax.grad(lambda s: f(s).sum())(s)), [0., 0.])
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.jacrev(f))(s)), np.zeros((2, 2)))
  gq = jax.grad(lambda q: hx.qarray_parts(q)[1].sum())(hx.make_qarray(z, s))
  assert short(gq) == "f32[2,0]"
  gx = jax.grad(lambda x: hx.qarray_parts(hx.quantize(x))[1].sum())(jnp.zeros((2, 0)))
  assert gx.shape == (2, 0)


def test_linearize_and_transpose():
  s = jnp.ones(4, jnp.float32)
  y, f_lin = jax.linearize(lambda s: hx.dequantize(hx.make_qarray(QV, s)), s)
  np.testing.assert_array_equal(np.asarray(f_lin(2 * s)), 2 * QV.astype(np.float32))
  (gs,) = jax.linear_transpose(f_lin, s)(jnp.ones((4, 3), jnp.float32))
  np.testing.assert_array_equal(np.asarray(gs), QV.astype(np.float32).sum(-1))


# --- vmap and scan -------------------------------------------------------------------

def test_vmap_make_qarray_and_parts():
  qvs = np.stack([QV, -QV.clip(-127)])            # i8[2,4,3]
  scs = np.stack([np.ones(4, np.float32), np.arange(4, dtype=np.float32)])
  out = jax.vmap(hx.make_qarray, out_axes=hx.QArraySpec())(qvs, scs)
  assert short(out) == "q8[2,4,3]"
  assert_parts(out, qvs, scs)
  # mapped along another axis, and one operand unmapped (broadcast)
  out = jax.vmap(hx.make_qarray, in_axes=(2, None), out_axes=hx.QArraySpec())(
      np.stack([QV, QV], axis=2), scs[0])
  assert short(out) == "q8[2,4,3]"
  assert_parts(out, np.stack([QV, QV]), np.stack([scs[0], scs[0]]))
  qv, s = jax.vmap(hx.qarray_parts, in_axes=hx.QArraySpec(), axis_size=2)(
      hx.make_qarray(qvs, scs))
  np.testing.assert_array_equal(np.asarray(qv), qvs)
  np.testing.assert_array_equal(np.asarray(s), scs)
  # per-example dequantized values, and a gradient under vmap
  y = jax.vmap(lambda q, s: hx.dequantize(hx.make_qarray(q, s)))(qvs, scs)
  np.testing.assert_array_equal(np.asarray(y), qvs.astype(np.float32) * scs[:, :, None])
  g = jax.vmap(jax.grad(lambda s, q: jnp.sum(hx.dequantize(hx.make_qarray(q, s)))))(scs, qvs)
  np.testing.assert_array_equal(np.asarray(g), qvs.astype(np.float32).sum(-1))


def test_scan_over_layers_stored_as_components():
  rng = np.random.default_rng(5)
  ws = jnp.asarray(rng.standard_normal((3, 4, 4)), jnp.float32)
  qws = hx.quantize(ws)                              # q8[3,4,4]: one weight per layer
  layers = (np.asarray(qws.qvalue), np.asarray(qws.scale))
  x = jnp.asarray(rng.standard_normal((2, 4)), jnp.float32)

  def forward(scales, x):
    def layer(h, qs):
      return jnp.tanh(hx.matmul_q(h, hx.make_qarray(*qs))), None
    return jax.lax.scan(layer, x, (layers[0], scales))[0]

  def reference(scales, x):
    h = x
    for i in range(3):
      h = jnp.tanh(h @ (layers[0][i].astype(np.float32) * scales[i][:, None]))
    return h

  scales = jnp.asarray(layers[1])
  np.testing.assert_allclose(np.asarray(jax.jit(forward)(scales, x)),
                             np.asarray(reference(scales, x)), rtol=1e-5, atol=1e-6)
  g = jax.jit(jax.grad(lambda s: jnp.sum(forward(s, x) ** 2)))(scales)
  r = jax.grad(lambda s: jnp.sum(reference(s, x) ** 2))(scales)
  np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
  # a quantized carry built from components and taken apart in the loop
  def step(q, _):
    qv, s = hx.qarray_parts(q)
    return hx.make_qarray(qv, 2 * s), s
  last, seen = jax.lax.scan(step, hx.make_qarray(QV[:2], SC[:2]), None, length=3)
  assert_parts(last, QV[:2], 8 * SC[:2])
  np.testing.assert_array_equal(np.asarray(seen), SC[:2] * np.array([[1.], [2.], [4.]]))


# --- sharding --------------------------------------------------------------------------

ROWS = np.arange(24., dtype=np.float32).reshape(8, 3) - 7.


def test_explicit_sharding(on_mesh):
  q = hx.quantize(jax.device_put(ROWS, P("i")))
  qv, s = jax.jit(hx.qarray_parts)(q)
  assert (short(qv), short(s)) == ("i8[8@i,3]", "f32[8@i]")
  again = jax.jit(hx.make_qarray)(qv, s)
  assert short(again) == "q8[8@i,3]"
  assert again.qvalue.sharding.spec == P("i", None) and again.scale.sharding.spec == P("i")
  assert_parts(again, q.qvalue, q.scale)
  g = jax.jit(jax.grad(lambda s: jnp.sum(hx.dequantize(hx.make_qarray(qv, s)) ** 2)))(s)
  assert short(g) == "f32[8@i]"
  qf, sf = np.asarray(qv).astype(np.float32), np.asarray(s)
  # d/ds sum((q s)^2) = sum(2 q q s) over a row (2 q q exact in f32)
  assert_einsum_close(g, "ij,ij,i->i", 2 * qf, qf, sf, extra=2)
  gq = jax.jit(jax.grad(lambda q: jnp.sum(hx.qarray_parts(q)[1])))(q)
  assert short(gq) == "f32[8@i,3]"
  np.testing.assert_array_equal(np.asarray(gq), weights(np.asarray(qv)))
  # a sharded quantized axis: the scale is unsharded, and its cotangent reduces across shards
  q2 = hx.quantize(jax.device_put(np.arange(1., 13., dtype=np.float32).reshape(3, 4),
                                  P(None, "j")))
  assert [short(a) for a in jax.jit(hx.qarray_parts)(q2)] == ["i8[3,4@j]", "f32[3]"]
  assert short(jax.jit(hx.make_qarray)(q2.qvalue, q2.scale)) == "q8[3,4@j]"
  g2 = jax.jit(jax.grad(lambda s: jnp.sum(hx.dequantize(hx.make_qarray(q2.qvalue, s)))))(q2.scale)
  assert short(g2) == "f32[3]"
  np.testing.assert_array_equal(np.asarray(g2), np.asarray(q2.qvalue).astype(np.float32).sum(-1))


def test_explicit_sharding_mismatch_is_a_type_error(on_mesh):
  q = hx.quantize(jax.device_put(ROWS, P("i")))
  for spec, got in ((P(), "f32[8]"), (P("j"), "f32[8@j]")):
    s = jax.device_put(np.asarray(q.scale), spec)
    with pytest.raises(TypeError, match=r"hx\.make_qarray expects the scale sharded like "
                       r"qvalue's leading axes \(f32\[8@i\] for i8\[8@i,3\]\), got i8\[8@i,3\], "
                       + got.replace("[", r"\[").replace("]", r"\]")):
      jax.jit(hx.make_qarray)(q.qvalue, s)
    # the constructor's type follows the same rule: it would disagree with where the
    # scale lives (q8[8@i,3] says f32[8@i])
    with pytest.raises(TypeError, match=r"hx\.QArray expects the scale sharded like "
                       r"qvalue's leading axes \(f32\[8@i\] for i8\[8@i,3\]\), got i8\[8@i,3\], "
                       + got.replace("[", r"\[").replace("]", r"\]")):
      jax.typeof(hx.QArray(q.qvalue, s))
  again = hx.QArray(q.qvalue, jax.device_put(np.asarray(q.scale), P("i")))
  assert short(again) == "q8[8@i,3]"
  assert_parts(jax.jit(lambda q: hx.make_qarray(*hx.qarray_parts(q)))(again), q.qvalue, q.scale)


def test_shard_map_joins_manual_axes(on_mesh):
  qv = jax.device_put(np.tile(QV[:2], (4, 1)), P("i"))  # i8[8@i,3]; each shard i8[2,3]

  @jax.jit
  @jax.shard_map(in_specs=(P("i"), P()), out_specs=hx.QArrayP(P("i")))
  def build(qv, s):  # a per-shard qvalue with one replicated scale (invariant over i)
    q = hx.make_qarray(qv, s)
    assert "{V:i}" in short(q)
    return q

  s = jnp.asarray([0.5, 2.], jnp.float32)
  q = build(qv, s)
  assert short(q) == "q8[8@i,3]"
  assert_parts(q, np.tile(QV[:2], (4, 1)), np.tile([0.5, 2.], 4).astype(np.float32))
  # the replicated scale's gradient is summed over the shards
  g = jax.jit(jax.grad(lambda s: jnp.sum(hx.dequantize(build(qv, s)))))(s)
  np.testing.assert_array_equal(np.asarray(g), 4 * QV[:2].astype(np.float32).sum(-1))

  @jax.jit
  @jax.shard_map(in_specs=hx.QArrayP(P("i")), out_specs=(P("i"), P("i")))
  def parts(q):
    return hx.qarray_parts(q)

  qv2, s2 = parts(q)
  assert (short(qv2), short(s2)) == ("i8[8@i,3]", "f32[8@i]")
  assert_parts(q, qv2, s2)
