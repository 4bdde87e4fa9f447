"""Quantized arrays ``q8[..., n]``: the type, the primitives' values, and bad input.

Numbers are checked against numpy computations written here, independently of
``hxmlir.lowering.reference``; special rows (all zero, NaN, inf, exact halves)
are pinned to exact values.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import assert_matmul_close, assert_within, dot_bound, elementwise_bound

import hxmlir as hx
from hxmlir import formats


def np_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-row absmax int8 quantization in numpy (rows with finite, nonzero max only)."""
  scale = np.abs(x).max(axis=-1) / np.float32(127)
  q = np.clip(np.rint(x / scale[..., None]), -127, 127).astype(np.int8)
  return q, scale.astype(np.float32)


@pytest.fixture
def w():
  return jnp.arange(12., dtype=jnp.float32).reshape(3, 4) / 12.


# --- the type ------------------------------------------------------------------

def test_typeof_value(x):
  qx = hx.quantize(x)
  ty = jax.typeof(qx)
  assert isinstance(qx, hx.QArray)
  assert isinstance(ty, hx.QArrayTy)
  assert ty.shape == (2, 3)
  assert str(ty) == repr(ty) == "q8[2,3]"
  assert qx.qvalue.dtype == jnp.int8 and qx.qvalue.shape == (2, 3)
  assert qx.scale.dtype == jnp.float32 and qx.scale.shape == (2,)


def test_typeof_rebuilt_from_components(x):
  qx = hx.quantize(x)
  again = hx.QArray(qx.qvalue, qx.scale)
  assert jax.typeof(again) == jax.typeof(qx)
  np.testing.assert_array_equal(hx.dequantize(again), hx.dequantize(qx))


@pytest.mark.parametrize("qvalue, scale, got", [
    (np.zeros((2, 3), np.float32), np.ones(2, np.float32), "qvalue: f32[2,3], scale: f32[2]"),
    (np.zeros((2, 3), np.int8), np.ones(3, np.float32), "qvalue: i8[2,3], scale: f32[3]"),
    (np.zeros((2, 3), np.int8), np.ones(2, np.int32), "qvalue: i8[2,3], scale: i32[2]"),
])
@pytest.mark.parametrize("as_array", [np.asarray, jnp.asarray], ids=["numpy", "jax"])
def test_inconsistent_components_are_a_type_error(qvalue, scale, got, as_array):
  # concrete components are checked by the constructor, before jit (or anything) sees
  # the value: under jit JAX would only say "Error interpreting argument"
  with pytest.raises(TypeError, match=r"hx\.QArray needs qvalue: i8\[\*lead, n\] and scale: "
                     r"f32\[\*lead\], got " + got.replace("[", r"\[").replace("]", r"\]")):
    hx.QArray(as_array(qvalue), as_array(scale))


def test_lo_types(x):
  lo = jax.typeof(hx.quantize(x)).lo_ty()
  assert [(a.shape, a.dtype) for a in lo] == [((2, 3), jnp.int8), ((2,), jnp.float32)]


def test_tangent_type_is_dense_f32(x):
  ty = jax.typeof(hx.quantize(x))
  t = ty.to_tangent_aval()
  assert (t.shape, t.dtype) == ((2, 3), jnp.float32)
  assert ty.to_ct_aval() == t


def test_jaxpr_has_single_typed_values(x, w):
  jaxpr = jax.jit(lambda x: hx.dequantize(hx.quantize(x))).trace(x).jaxpr
  text = str(jaxpr)
  assert re.search(r":q8\[2,3\] = call_hi_primitive\[\s*_prim=Quantize", text)
  assert ":f32[2,3] = call_hi_primitive[_prim=Dequantize" in text
  assert "i8[" not in text  # the components never appear
  assert len(jaxpr.eqns) == 2

  jaxpr = jax.jit(hx.matmul_q).trace(x, hx.quantize(w)).jaxpr
  assert [v.aval.str_short(short_dtypes=True) for v in jaxpr.jaxpr.invars] == [
      "f32[2,3]", "q8[3,4]"]
  assert jaxpr.jaxpr.outvars[0].aval.str_short(short_dtypes=True) == "f32[2,4]"
  assert ("b:q8[3,4]. let\n    c:f32[2,4] = call_hi_primitive[\n      _prim=MatmulQ[{'dimension_numbers': "
          "(((1,), (0,)), ((), ()))}]") in str(jaxpr)
  assert len(jaxpr.eqns) == 1


# --- values --------------------------------------------------------------------

def test_quantize_matches_numpy():
  rng = np.random.default_rng(0)
  xn = rng.standard_normal((5, 7)).astype(np.float32)
  qx = hx.quantize(jnp.asarray(xn))
  q_ref, s_ref = np_quantize(xn)
  np.testing.assert_array_equal(np.asarray(qx.qvalue), q_ref)
  # amax * f32(1/127) against numpy's amax / 127: two roundings apart
  assert_within(qx.scale, s_ref, elementwise_bound(s_ref, 2))
  # every row uses the full range: its absmax lands on +-127
  assert (np.abs(np.asarray(qx.qvalue)).max(axis=-1) == 127).all()
  # dequantization error is at most half a step per element
  err = np.abs(np.asarray(hx.dequantize(qx)) - xn)
  assert (err <= s_ref[:, None] / 2 * (1 + 1e-5)).all()


def test_dequantize_values(x):
  qx = hx.quantize(x)
  expected = np.asarray(qx.qvalue).astype(np.float32) * np.asarray(qx.scale)[:, None]
  np.testing.assert_array_equal(np.asarray(hx.dequantize(qx)), expected)


def test_quantize_higher_rank_rows():
  xs = jnp.arange(24., dtype=jnp.float32).reshape(2, 3, 4) - 11.
  qx = hx.quantize(xs)
  assert str(jax.typeof(qx)) == "q8[2,3,4]"
  assert qx.scale.shape == (2, 3)
  q_ref, s_ref = np_quantize(np.asarray(xs))
  np.testing.assert_array_equal(np.asarray(qx.qvalue), q_ref)
  # amax * f32(1/127) against numpy's amax / 127: two roundings apart
  assert_within(qx.scale, s_ref, elementwise_bound(s_ref, 2))


def test_matmul_q_equals_dense_reference(x, w):
  qw = hx.quantize(w)
  assert_matmul_close(hx.matmul_q(x, qw), x, hx.dequantize(qw), extra=1)


def test_matmul_q_batched_operands():
  rng = np.random.default_rng(1)
  xb = jnp.asarray(rng.standard_normal((3, 2, 5)), jnp.float32)
  wb = jnp.asarray(rng.standard_normal((3, 5, 4)), jnp.float32)
  qw = hx.quantize(wb)
  out = hx.matmul_q(xb, qw)
  assert out.shape == (3, 2, 4)
  assert_matmul_close(out, xb, hx.dequantize(qw), "bmk,bkn->bmn", extra=1)


# --- jit -----------------------------------------------------------------------

def test_jit_hi_intermediate(x):
  out = jax.jit(lambda x: hx.dequantize(hx.quantize(x)))(x)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(hx.dequantize(hx.quantize(x))))


def test_jit_hi_result_and_argument(x, w):
  qx = jax.jit(hx.quantize)(x)
  assert str(jax.typeof(qx)) == "q8[2,3]"
  eager = hx.quantize(x)
  np.testing.assert_array_equal(np.asarray(qx.qvalue), np.asarray(eager.qvalue))
  np.testing.assert_array_equal(np.asarray(qx.scale), np.asarray(eager.scale))
  np.testing.assert_array_equal(np.asarray(jax.jit(hx.dequantize)(qx)),
                                np.asarray(hx.dequantize(eager)))
  qw = hx.quantize(w)
  assert_within(jax.jit(hx.matmul_q)(x, qw), hx.matmul_q(x, qw),
                2 * dot_bound("mk,kn->mn", x, hx.dequantize(qw), extra=1))


def test_jit_hi_result_passthrough(x):
  qx = hx.quantize(x)
  same = jax.jit(lambda q: q)(qx)
  assert jax.typeof(same) == jax.typeof(qx)
  np.testing.assert_array_equal(np.asarray(same.qvalue), np.asarray(qx.qvalue))


# --- special rows ----------------------------------------------------------------

def test_all_zero_row_gives_zeros_and_finite_scale():
  x = jnp.array([[0., 0., 0.], [1., -2., 4.]], jnp.float32)
  qx = hx.quantize(x)
  np.testing.assert_array_equal(np.asarray(qx.qvalue[0]), [0, 0, 0])
  assert np.isfinite(np.asarray(qx.scale)).all()
  assert float(qx.scale[0]) == 0.0
  out = np.asarray(hx.dequantize(qx))
  np.testing.assert_array_equal(out[0], [0., 0., 0.])
  np.testing.assert_array_equal(np.asarray(qx.qvalue[1]), [32, -64, 127])
  # also under jit (the same lowering as everywhere else)
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: hx.dequantize(hx.quantize(x)))(x)),
                                out)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_row_dequantizes_to_nan(bad):
  x = jnp.array([[1., bad, 2.], [1., -2., 4.]], jnp.float32)
  qx = hx.quantize(x)
  out = np.asarray(hx.dequantize(qx))
  assert np.isnan(out[0]).all()  # the whole row, never finite garbage
  np.testing.assert_array_equal(out[1], np.asarray([32, -64, 127], np.float32) * (4. / 127.))
  np.testing.assert_array_equal(np.asarray(qx.qvalue[1]), [32, -64, 127])
  # matmul_q with such a weight is NaN wherever the dense product is (0 * NaN included)
  lhs = jnp.array([[1., 0.], [0., 1.]], jnp.float32)
  y = np.asarray(hx.matmul_q(lhs, qx))
  assert np.isnan(y).all()
  # while the finite rows alone give finite results
  y = np.asarray(hx.matmul_q(lhs[:, 1:], hx.QArray(qx.qvalue[1:], qx.scale[1:])))
  # one nonzero term per element, 1 * s * q: exactly dequantize's s * q
  np.testing.assert_array_equal(y, [[0., 0., 0.], out[1]])


# --- empty arrays: an empty row is an all-zero row --------------------------------

@pytest.mark.parametrize("shape", [(2, 0), (0, 0), (0, 3), (4, 2, 0), (0, 2, 0), (2, 0, 3)])
@pytest.mark.parametrize("jit", [False, True])
def test_empty_rows_quantize_like_all_zero_rows(shape, jit):
  quantize = jax.jit(hx.quantize) if jit else hx.quantize
  dequantize = jax.jit(hx.dequantize) if jit else hx.dequantize
  qx = quantize(jnp.ones(shape, jnp.float32))
  assert jax.typeof(qx).shape == shape
  assert qx.qvalue.shape == shape and qx.qvalue.dtype == jnp.int8
  assert qx.scale.shape == shape[:-1] and qx.scale.dtype == jnp.float32
  # the max over an empty row starts from 0: scale 0, as for an all-zero row
  np.testing.assert_array_equal(np.asarray(qx.scale), np.zeros(shape[:-1], np.float32))
  out = dequantize(qx)
  assert out.shape == shape and out.dtype == jnp.float32


def test_nan_still_wins_over_the_zero_start():
  # the empty-row fix starts the row maximum from 0; NaN and inf must still propagate
  x = jnp.array([[np.nan, 1.], [1., np.nan], [-np.inf, 0.], [0., 0.]], jnp.float32)
  for quantize in (hx.quantize, jax.jit(hx.quantize)):
    s = np.asarray(quantize(x).scale)
    assert np.isnan(s[:3]).all() and s[3] == 0.0


@pytest.mark.parametrize("xshape, wshape", [
    ((2, 0), (0, 4)),        # k = 0: the empty sum, zeros
    ((2, 3), (3, 0)),        # n = 0: no columns
    ((0, 3), (3, 4)),        # m = 0: no rows
    ((0, 0), (0, 0)),
    ((5, 2, 0), (5, 0, 4)),  # batched, k = 0
    ((5, 2, 3), (5, 3, 0)),  # batched, n = 0
    ((0, 2, 3), (0, 3, 4)),  # empty batch
])
@pytest.mark.parametrize("jit", [False, True])
def test_matmul_q_with_empty_axes_matches_numpy(xshape, wshape, jit):
  rng = np.random.default_rng(0)
  xn = rng.standard_normal(xshape).astype(np.float32)
  wn = rng.standard_normal(wshape).astype(np.float32)
  f = (lambda x, w: hx.matmul_q(x, hx.quantize(w)))
  y = np.asarray((jax.jit(f) if jit else f)(jnp.asarray(xn), jnp.asarray(wn)))
  want = np.matmul(xn, wn)  # zeros (k = 0) or empty: exact
  assert y.shape == want.shape and y.dtype == np.float32
  np.testing.assert_array_equal(y, want)
  assert not want.size or not want.any()  # the cases above are all zeros or empty


# (dense shape, words' shape without W): no rows, no block per row (k = 0), an empty batch
_EMPTY_BLOCKS = [((0, None), (0, 1)), ((3, 0), (3, 0)), ((0, 2, None), (0, 2, 1)),
                 ((2, 0, 0), (2, 0, 0))]


@pytest.mark.parametrize("name", [f.name for f in formats.BLOCK_FORMATS])
@pytest.mark.parametrize("dense, lead", _EMPTY_BLOCKS)
def test_block_formats_with_empty_axes(name, dense, lead):
  # a block format's group is its block, also where no block is stored: every path gives
  # the empty or all-zero result (the 256-element formats raised ZeroDivisionError reading
  # the group off the empty shapes, the 32-element ones did not)
  f = formats.FORMATS[name]
  w = hx.make_qarray(jnp.zeros((*lead, f.block_words), jnp.uint16),
                     *[jnp.zeros(lead, jnp.float16)] * (2 if f.offset else 1))
  dense = tuple(lead[-1] * f.block if d is None else d for d in dense)
  assert jax.typeof(w).shape == dense and jax.typeof(w).group == f.block
  assert hx.dequantize(w).shape == dense
  x = jnp.ones((2, dense[-1]), jnp.float32)
  want = np.zeros((*dense[:-2], 2, dense[-2]), np.float32)
  ys = [hx.einsum("mk,...nk->...mn", x, w)]
  for kw in ({}, {"activations": "int8"}):
    with hx.installed(**kw):
      ys.append(jax.jit(lambda x, w: hx.einsum("mk,...nk->...mn", x, w))(x, w))
  for y in ys:
    np.testing.assert_array_equal(np.asarray(y), want)
  if len(lead) == 2 and lead[-1]:
    w3 = hx.make_qarray(jnp.zeros((3, *lead[1:], f.block_words), jnp.uint16),
                        *[jnp.zeros((3, *lead[1:]), jnp.float16)] * (2 if f.offset else 1))
    rows = hx.take_rows(w3, jnp.zeros((0,), jnp.int32))  # the dense rows of no ids
    assert (rows.shape, rows.dtype) == ((0, dense[-1]), jnp.float32)


def test_no_group_in_an_empty_axis():
  # group scales need a group to exist: the type could not be read back from its parts
  for dtype, method in ((jnp.int4, "absmax"), (jnp.uint4, "minmax"), (jnp.int8, "absmax")):
    with pytest.raises(TypeError, match=re.escape(
        "the last axis is empty: it holds no group of 32; quantize it per row (group_size=None)")):
      hx.quantize(jnp.zeros((4, 0)), dtype, group_size=32, method=method)
  assert str(jax.typeof(hx.quantize(jnp.zeros((4, 0)), jnp.int4))) == "q4[4,0]"
  with pytest.raises(TypeError, match=re.escape(
      "u16[2,0,70], f16[2,1], f16[2,1] are not a block format's components: "
      "q4_k takes d and dmin f16[2,0]")):
    hx.make_qarray(jnp.zeros((2, 0, 70), jnp.uint16), jnp.zeros((2, 1), jnp.float16),
                   jnp.zeros((2, 1), jnp.float16))


def test_values_clip_to_127_never_minus_128():
  x = jnp.array([[-254., 127., 1.], [-1., 0.5, 0.25]], jnp.float32)
  qx = hx.quantize(x)
  # scale 2: -254/2 = -127 exactly; 127/2 = 63.5 -> 64 (half to even); 1/2 = 0.5 -> 0
  np.testing.assert_array_equal(np.asarray(qx.qvalue), [[-127, 64, 0], [-127, 64, 32]])
  np.testing.assert_array_equal(np.asarray(qx.scale), np.float32([254. / 127., 1. / 127.]))
  assert int(jnp.min(qx.qvalue)) == -127


def test_clip_range_on_random_data():
  rng = np.random.default_rng(2)
  xn = (rng.standard_normal((64, 33)) * 1e3).astype(np.float32)
  q = np.asarray(hx.quantize(jnp.asarray(xn)).qvalue)
  assert q.min() >= -127 and q.max() <= 127
  assert (np.abs(q).max(axis=-1) == 127).all()


def test_round_half_to_even():
  # max |row| = 127 makes the scale exactly 1, so x / scale hits k + 0.5 exactly
  row = [127., 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]
  qx = hx.quantize(jnp.array([row], jnp.float32))
  assert float(qx.scale[0]) == 1.0
  np.testing.assert_array_equal(np.asarray(qx.qvalue[0]), [127, 0, 2, 2, 0, -2, -2, 126])
  # with scale 2 (max 254): 3 / 2 = 1.5 -> 2, 5 / 2 = 2.5 -> 2, 7 / 2 = 3.5 -> 4
  qx = hx.quantize(jnp.array([[254., 3., 5., 7., -3.]], jnp.float32))
  np.testing.assert_array_equal(np.asarray(qx.qvalue[0]), [127, 2, 2, 4, -2])


# --- bad input: TypeError at trace time, naming the operand types ----------------

@pytest.mark.parametrize("arg, msg", [
    (jnp.ones((2, 3), jnp.int32), "got i32[2,3]"),
    (jnp.ones((2, 3), jnp.int8), "got i8[2,3]"),
    (jnp.float32(1.), "got f32[]"),
])
def test_quantize_rejects_bad_operand(arg, msg):
  # the message says what it takes: f32, and bf16/f16 converted
  with pytest.raises(TypeError, match=r"hx\.quantize expects a dense float array of rank >= 1 "
                     r"\(f32\[\.\.\., n\]; bf16 and f16 are converted to f32 first, exactly\), "
                     + msg.replace("[", r"\[").replace("]", r"\]")):
    jax.jit(hx.quantize).trace(arg)
  with pytest.raises(TypeError) as e:
    jax.jit(hx.quantize).trace(arg)
  assert "astype" not in str(e.value)  # no conversion helps an integer or a scalar


def test_quantize_names_the_conversion_for_f64():
  with jax.enable_x64(True):
    with pytest.raises(TypeError, match=r"got f64\[2,3\]; convert it with "
                       r"\.astype\(jnp\.float32\)"):
      jax.eval_shape(hx.quantize, jax.ShapeDtypeStruct((2, 3), jnp.float64))


def test_dequantize_rejects_dense(x):
  with pytest.raises(TypeError, match=r"hx\.dequantize expects a quantized array \(q8, q4, f8, u4o, q8o, q5_0, q5_1, iq4_nl, q4_k, q5_k, q6_k, q2_k, q3_k or iq4_xs\[\.\.\., n\]\), "
                     r"got f32\[2,3\]"):
    jax.jit(hx.dequantize).trace(x)


@pytest.mark.parametrize("xshape, wshape, sig, what", [
    ((2, 5), (3, 4), "f32[2,5] @ q8[3,4]", "contracting dimensions differ"),
    ((5,), (5,), "f32[5] @ q8[5]", "equal rank >= 2"),
    ((2, 3), (2, 3, 4), "f32[2,3] @ q8[2,3,4]", "equal rank >= 2"),
    ((5, 2, 2, 3), (2, 3, 4), "f32[5,2,2,3] @ q8[2,3,4]", "hx.einsum takes other layouts"),
    ((2, 2, 3), (4, 4), "f32[2,2,3] @ q8[4,4]", "contracting dimensions differ (3 vs 4)"),
    ((2, 2, 3), (3, 3, 4), "f32[2,2,3] @ q8[3,3,4]", "batch dimensions differ"),
])
def test_matmul_q_rejects_bad_shapes(xshape, wshape, sig, what):
  x = jnp.ones(xshape, jnp.float32)
  qw = hx.quantize(jnp.ones(wshape, jnp.float32))
  with pytest.raises(TypeError) as e:
    jax.jit(hx.matmul_q).trace(x, qw)
  assert sig in str(e.value) and what in str(e.value)


def test_matmul_q_rejects_bad_dtypes(w):
  qw = hx.quantize(w)
  with pytest.raises(TypeError, match=r"dense f32, bf16 or f16 operand: i32\[2,3\] @ q8\[3,4\]"):
    jax.jit(hx.matmul_q).trace(jnp.ones((2, 3), jnp.int32), qw)
  with pytest.raises(TypeError, match=r"quantized right operand q8\[k, n\]: f32\[2,3\] @ f32\[3,4\]"):
    jax.jit(hx.matmul_q).trace(jnp.ones((2, 3), jnp.float32), w)


def test_errors_fire_at_trace_time_not_in_xla(w):
  traced = []

  def f(x, qw):
    traced.append(True)
    return hx.matmul_q(x, qw)

  with pytest.raises(TypeError):
    jax.jit(f).trace(jnp.ones((2, 5), jnp.float32), hx.quantize(w))
  assert traced == [True]  # raised while tracing, before any lowering or compilation


# --- bf16/f16 activations -----------------------------------------

_HALF = [jnp.bfloat16, jnp.float16]
_FORMATS = [(jnp.int8, None), (jnp.int8, 32), (jnp.int4, None), (jnp.int4, 32),
            (jnp.float8_e4m3fn, None), (jnp.float8_e4m3fn, 32)]
_UNIT_ROUNDOFF = {jnp.bfloat16: 2.0 ** -8, jnp.float16: 2.0 ** -11}


def _half_operands(dtype, fmt, group, m=5, k=64, n=64, seed=0):
  rng = np.random.default_rng(seed)
  x32 = rng.standard_normal((m, k)).astype(np.float32)
  q = hx.quantize(jnp.asarray(rng.standard_normal((k, n)), jnp.float32), fmt, group_size=group)
  return x32, jnp.asarray(x32, dtype), q


@pytest.mark.parametrize("dtype", _HALF, ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt, group", _FORMATS)
def test_matmul_q_takes_half_precision_x(dtype, fmt, group):
  x32, x, q = _half_operands(dtype, fmt, group)
  w = hx.dequantize(q)
  for name, f in (("eager", hx.matmul_q), ("jit", jax.jit(hx.matmul_q))):
    y = f(x, q)
    # JAX's dot of x with the dequantized f32 weight: an f32 result
    assert y.dtype == jnp.result_type(x.dtype, w.dtype) == jnp.float32, name
    # x's values are exact in f32: the error is the f32 product's own
    assert_matmul_close(y, np.asarray(x, np.float32), w, extra=1)
    # against the unrounded activations: x's rounding to dtype (u |x|) on top
    u = _UNIT_ROUNDOFF[dtype]
    assert_within(y, x32.astype(np.float64) @ np.asarray(w, np.float64),
                  u * np.abs(x32) @ np.abs(np.asarray(w, np.float64))
                  + dot_bound("mk,kn->mn", x32, w, extra=2), name)


@pytest.mark.parametrize("dtype", _HALF, ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt, group", [(jnp.int8, None), (jnp.int4, 32)])
def test_matmul_q_half_precision_x_grad_and_vmap(dtype, fmt, group):
  _, x, q = _half_operands(dtype, fmt, group)
  w = np.asarray(hx.dequantize(q), np.float64)
  ct = np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32)
  gx, gq = jax.jit(jax.grad(lambda x, q: jnp.sum(hx.matmul_q(x, q) * ct), (0, 1)))(x, q)
  # the cotangent of a bf16 x is bf16 (as for JAX's dot), the weight's dense f32
  assert gx.dtype == dtype and gq.dtype == jnp.float32
  u = _UNIT_ROUNDOFF[dtype]
  exact = ct.astype(np.float64) @ w.T
  assert_within(gx, exact, u * np.abs(exact) + dot_bound("mn,kn->mk", ct, w, extra=1))
  assert_within(gq, np.asarray(x, np.float64).T @ ct,
                dot_bound("mk,mn->kn", np.asarray(x, np.float32), ct))
  # jvp in x: a bf16 tangent gives an f32 tangent of the result
  _, t = jax.jvp(lambda x: hx.matmul_q(x, q), (x,), (x,))
  assert t.dtype == jnp.float32
  assert_matmul_close(t, np.asarray(x, np.float32), w.astype(np.float32), extra=1)
  # vmap over x (one op) and over both
  xs = jnp.stack([x, x[::-1]])
  ys = jax.vmap(hx.matmul_q, in_axes=(0, None))(xs, q)
  assert ys.dtype == jnp.float32 and ys.shape == (2, 5, 64)
  for i in range(2):
    assert_matmul_close(ys[i], np.asarray(xs[i], np.float32), w.astype(np.float32), extra=1)


@pytest.mark.parametrize("dtype, mlir", [(jnp.bfloat16, "bf16"), (jnp.float16, "f16")])
def test_matmul_q_half_precision_x_lowers_to_a_convert_and_the_f32_composite(dtype, mlir):
  # hx.matmul_q's contract is f32 x (every kernel takes it): the op converts x first,
  # and x @ hx.dequantize(q) folds (installed) into the same two ops
  _, x, q = _half_operands(dtype, jnp.int4, 32)
  want = re.compile(
      rf"%(\w+) = stablehlo\.convert %arg0 : \(tensor<5x64x{mlir}>\) -> tensor<5x64xf32>\n"
      r'\s*%\w+ = stablehlo\.composite "hx\.matmul_q" %\1, %arg1, %arg2 .*'
      r": \(tensor<5x64xf32>, tensor<64x32xui8>, tensor<64x2xf32>\) -> tensor<5x64xf32>")
  for f, installed in ((hx.matmul_q, False), (hx.matmul_q, True),
                       (lambda x, q: x @ hx.dequantize(q), True)):
    with hx.installed() if installed else hx.installed("hx-verify"):
      text = jax.jit(f).lower(x, q).as_text()
    assert want.search(text), text
    assert text.count("hx.matmul_q\"") == 1


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.int32, jnp.int8])
def test_matmul_q_refused_x_dtypes_name_the_conversion(dtype):
  q = hx.quantize(jnp.ones((8, 3), jnp.float32))
  with jax.enable_x64(True):  # an f64 x exists only there
    x = jax.ShapeDtypeStruct((2, 8), dtype)
    with pytest.raises(TypeError, match=r"hx\.matmul_q expects a dense f32, bf16 or f16 "
                       rf"operand: {jax.typeof(jnp.zeros((), dtype)).str_short(True)[:-2]}"
                       r"\[2,8\] @ q8\[8,3\]") as e:
      jax.eval_shape(hx.matmul_q, x, q)
  # floats of another width: the way out named; integers: no such hint
  assert ("; convert it with .astype(jnp.float32)" in str(e.value)) == (dtype == jnp.float64)


@pytest.mark.skipif(not hx.cpu_kernel_info().active, reason="native CPU kernel inactive")
@pytest.mark.parametrize("dtype", _HALF, ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt, group, target", [(jnp.int8, None, "hx_matmul_q_cpu_v1"),
                                                (jnp.int4, 32, "hx_matmul_q_cpu_v2")])
def test_native_cpu_kernel_takes_half_precision_x_converted(dtype, fmt, group, target):
  # installed on CPU, a weight above SMALL_WEIGHT goes to the native kernel: x reaches it
  # converted to f32 (the composite's contract)
  _, x, q = _half_operands(dtype, fmt, group, m=3, k=512, n=256)
  with hx.installed():
    text = jax.jit(hx.matmul_q).lower(x, q).as_text()
    y = jax.jit(hx.matmul_q)(x, q)
  assert f"stablehlo.custom_call @{target}(" in text
  assert y.dtype == jnp.float32
  assert_matmul_close(y, np.asarray(x, np.float32), hx.dequantize(q), extra=1)
