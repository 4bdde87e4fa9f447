"""Formats with f16 scales and formats with an offset (hxmlir/formats.py):
``u4o`` (uint4 values, ``x = q·s + o`` per group), ``q8``/``q4``/``u4o`` with f16 scales.

Numbers are checked against float64 NumPy computed from the stored components (nibbles
decoded here, independently of hxmlir's decode), within bounds derived from the
computation (tests/py/numerics.py).
"""

import re

import hx_testing
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from numerics import EPS, assert_within, dot_bound, elementwise_bound

import hxmlir as hx
from hxmlir import formats
from hxmlir.passes import parse_pipeline

RS = np.random.RandomState(26)


def _dense64(q) -> np.ndarray:
  """The float64 value of ``q`` from its components (per group of g, or per row)."""
  parts = [np.asarray(c) for c in hx.qarray_parts(q)]
  v, s = parts[0], parts[1].astype(np.float64)
  f = jax.typeof(q).format
  vals = hx_testing.nibbles(v, f.signed) if f.pack == 2 else v.astype(np.int64)
  s = s if s.ndim == vals.ndim else s[..., None]
  g = vals.shape[-1] // s.shape[-1]
  rep = lambda a: np.repeat(a, g, axis=-1)  # noqa: E731
  out = vals * rep(s)
  if len(parts) == 3:
    o = parts[2].astype(np.float64)
    out = out + rep(o if o.ndim == vals.ndim else o[..., None])
  return out


def _mags64(q) -> np.ndarray:
  """``|q·s| + |o|`` elementwise: what each product term of a matmul can carry."""
  parts = [np.asarray(c) for c in hx.qarray_parts(q)]
  f = jax.typeof(q).format
  vals = hx_testing.nibbles(parts[0], f.signed) if f.pack == 2 else parts[0].astype(np.int64)
  s, *o = (p.astype(np.float64) if p.ndim == vals.ndim else p[..., None].astype(np.float64)
            for p in parts[1:])
  g = vals.shape[-1] // s.shape[-1]
  out = np.abs(vals * np.repeat(s, g, -1))
  if o:
    out = out + np.abs(np.repeat(o[0], g, -1))
  return out


def _u4o(shape, group, f16=False):
  w = RS.randn(*shape).astype(np.float32) + 0.5
  q = hx.quantize(w, jnp.uint4, group_size=group, method="minmax")
  if f16:
    v, s, o = hx.qarray_parts(q)
    q = hx.make_qarray(v, s.astype(jnp.float16), o.astype(jnp.float16))
  return w, q


# --- the table -------------------------------------------------------------

def test_components_name_one_format_each():
  seen = {}
  for f in formats.FORMATS.values():
    key = (f.storage_dtype, f.scale_dtype, f.offset, f.block_words)
    assert key not in seen, (f.name, seen.get(key))
    seen[key] = f.name
    # a block format's values (ui16) say their words per block in their last axis
    shape = f.storage_shape((4, f.block or 64))
    assert formats.of_components(f.storage_dtype, f.scale_dtype, f.offset, shape) is f
    assert formats.of_components(f.mlir, f.scale_mlir, f.offset, shape) is f  # MLIR spellings
    assert (formats.of_components(f.storage_dtype, f.scale_dtype, f.offset) is f) != \
        bool(f.block)  # without the shape: the elementwise formats only
  assert formats.of_components("i8", "f64", False) is None
  # the formats with f16 scales or offsets (the block formats among them) have no native CPU
  # kernel in the [in, out] layout: the rules ask the table
  assert [f.name for f in formats.FORMATS.values() if "kn" not in f.native_cpu] == \
      ["int8_f16", "int4_f16", "uint4", "uint4_f16", "int8_offset", "int8_offset_f16",
       *(f.name for f in formats.BLOCK_FORMATS)]
  # block formats: in [out, in] the native CPU kernel (hx_matmul_q_cpu_v4) and a Pallas TPU
  # kernel (hx_matmul_q_nk_blocks_v1)
  assert all(f.native_cpu == ("nk",) and f.pallas == ("nk",) for f in formats.BLOCK_FORMATS)


@pytest.mark.parametrize("fmt, shape, want", [
    ("uint4", (4, 64), "u4o[4,64:g32]"),
    ("uint4_f16", (4, 64), "u4o[4,64:g32,f16]"),
    ("int8_f16", (4, 64), "q8[4,64:g32,f16]"),
    ("int4_f16", (4, 64), "q4[4,64:g32,f16]"),
])
def test_type_prints_prefix_group_and_scale_dtype(fmt, shape, want):
  f = formats.FORMATS[fmt]
  v = np.zeros(f.storage_shape(shape), f.storage_dtype)
  s = np.ones((4, 2), f.scale_dtype)
  q = hx.QArray(v, s, s if f.offset else None)
  assert str(jax.typeof(q)) == want
  assert formats.type_name(f, "4,64", 32) == want


# --- quantize / dequantize ------------------------------------------------------

@pytest.mark.parametrize("group", [None, 16, 32])
def test_minmax_quantize_is_min_and_range_over_15(group):
  w = RS.randn(6, 64).astype(np.float32) * 3 + 1
  q = hx.quantize(w, jnp.uint4, group_size=group, method="minmax")
  assert str(jax.typeof(q)).startswith("u4o[6,64")
  v, s, o = (np.asarray(c) for c in hx.qarray_parts(q))
  wg = w.reshape(6, -1, group or 64)
  lo, hi = wg.min(-1), wg.max(-1)
  s, o = s.reshape(lo.shape), o.reshape(lo.shape)
  np.testing.assert_array_equal(o, lo)  # the offset is the group's minimum, exactly
  np.testing.assert_array_equal(s, (hi - lo) * np.float32(1 / 15))  # one f32 product
  vals = hx_testing.nibbles(v, signed=False)
  assert vals.min() >= 0 and vals.max() <= 15
  assert (vals.reshape(wg.shape).max(-1) == 15).all()  # the maximum takes the top level
  # round to nearest: every element within half a step (+ the f32 roundings of x - o,
  # of the division, and of the dequantized value's product and sum)
  got = _dense64(q).reshape(wg.shape)
  step = s[..., None].astype(np.float64)
  assert_within(got, wg, 0.5 * step * (1 + 4 * EPS) + 4 * EPS * np.abs(wg))


def test_minmax_constant_zero_and_nonfinite_groups():
  w = np.zeros((3, 32), np.float32)
  w[0] = 2.5
  w[2, 5] = np.nan
  d = np.asarray(hx.dequantize(hx.quantize(w, jnp.uint4, method="minmax")))
  np.testing.assert_array_equal(d[0], 2.5)  # a constant row is exact
  np.testing.assert_array_equal(d[1], 0.0)
  assert np.isnan(d[2]).all()  # a non-finite row is NaN, never finite garbage


F32_OFFSET_FORMATS = [f for f in formats.FORMATS.values()
                      if f.offset and f.scale_dtype == np.float32]  # f16 scales cannot overflow
M32 = float(np.finfo(np.float32).max)


def _extreme(n):
  """Finite rows whose range (max - min) overflows f32: ``[-3e38.., 3e38..]``, f32's
  largest magnitudes, one side of it, and a wide row holding small values."""
  w = np.zeros((4, n), np.float32)
  w[0, : n // 2], w[0, n // 2:] = -3e38, 3e38
  w[1, ::2], w[1, 1::2] = -M32, M32
  w[2] = np.linspace(-M32, 0.9 * M32, n, dtype=np.float32)
  w[3] = RS.randn(n).astype(np.float32)
  w[3, 0], w[3, -1] = -2e38, 2e38
  return w


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("group", [None, 32])
@pytest.mark.parametrize("fmt", F32_OFFSET_FORMATS, ids=lambda f: f.name)
def test_ranges_wider_than_f32_stay_finite(fmt, group, jit):
  # minmax's scale (max - min) / qmax and values (x - min) / scale overflowed to inf -> NaN;
  # values * scale can overflow where values * scale + offset does not
  w = _extreme(64)
  wrap = jax.jit if jit else (lambda f: f)
  if formats.check_method(fmt, "minmax") is None:
    q = wrap(lambda w: hx.quantize(w, fmt.name, group_size=group, method="minmax"))(w)
    _, s, o = (np.asarray(c, np.float64) for c in hx.qarray_parts(q))
    assert np.isfinite(s).all() and np.isfinite(o).all()
    d = np.asarray(wrap(hx.dequantize)(q), np.float64)
    assert np.isfinite(d).all()
    g = group or 64
    step = np.repeat(s.reshape(4, -1), g, -1)
    # half a step, plus the roundings of the scale (times up to qmax), of q * s and of the sum
    bound = step / 2 + 2 * EPS * (fmt.qmax * step + np.abs(np.repeat(o.reshape(4, -1), g, -1))
                                  + np.abs(d))
    assert_within(d, w, bound)
  # components at the edge (any offset format with f32 scales, q8o's 5-bit values included)
  hi = fmt.value_range[1] if fmt.pack == 2 else 31
  n_s = (4, 64 // group) if group else (4,)
  s = np.full(n_s, 2 * 3e38 / hi, np.float32)
  o = np.full(n_s, -3e38, np.float32)
  v = np.tile(np.arange(64) % (hi + 1), (4, 1))
  stored = formats.store(jnp.asarray(v, jnp.int8), fmt)
  q = hx.make_qarray(stored, jnp.asarray(s), jnp.asarray(o))
  want = _dense64(q)
  assert np.isfinite(want).all()
  d = wrap(hx.dequantize)(q)
  assert_within(d, want, 2 * EPS * _mags64(q))


@pytest.mark.parametrize("f16", [False, True])
def test_dequantize_is_q_times_s_plus_o(f16):
  _, q = _u4o((5, 64), 32, f16)
  want = _dense64(q)
  assert_within(hx.dequantize(q), want, elementwise_bound(want, 2))


@pytest.mark.parametrize("fmt", ["int8_f16", "int4_f16"])
def test_f16_scales_without_offset(fmt):
  f = formats.FORMATS[fmt]
  lo, hi = f.value_range
  vals = RS.randint(lo, hi + 1, size=(4, 64)).astype(np.int8)
  v = np.asarray(formats.store(jnp.asarray(vals), f))
  s = (RS.rand(4, 2) + 0.1).astype(np.float16)
  q = hx.make_qarray(v, s)
  assert jax.typeof(q).fmt == fmt
  want = vals * np.repeat(s.astype(np.float64), 32, -1)  # Q4_0's -8 kept
  np.testing.assert_array_equal(np.asarray(hx.dequantize(q)), want.astype(np.float32))


# --- matmul_q / einsum ----------------------------------------------------------

@pytest.mark.parametrize("f16", [False, True])
@pytest.mark.parametrize("m", [1, 3])
def test_einsum_out_in_groups_along_contraction(f16, m):
  _, q = _u4o((48, 128), 32, f16)  # GGUF / torch Linear: W[out, in], groups along in
  x = RS.randn(m, 128).astype(np.float32)
  y = jax.jit(lambda x, q: hx.einsum("...k,nk->...n", x, q))(x, q)
  want = x.astype(np.float64) @ _dense64(q).T
  # Σ_g s·Σ x·q + Σ_g o·Σ x: each term x·(q·s + o) carries a product, the scale's and
  # the offset's products and the final add beyond the sum's own roundings
  assert_within(y, want, dot_bound("mk,nk->mn", x, _mags64(q), extra=4))


@pytest.mark.parametrize("group", [None, 16])
def test_matmul_q_in_out_groups_along_free_axis(group):
  _, q = _u4o((64, 48), group)
  x = RS.randn(2, 5, 64).astype(np.float32)
  y = hx.matmul_q(x, q)
  want = x.astype(np.float64) @ _dense64(q)
  assert_within(y, want, dot_bound("bmk,kn->bmn", x, _mags64(q), extra=4))


def test_offset_term_is_not_dropped():
  # a weight whose values are all zero: the product is the offset term alone
  v = np.zeros((8, 16), np.uint8)
  s = np.ones((8, 1), np.float32)
  o = np.arange(8, dtype=np.float32).reshape(8, 1) + 1
  q = hx.make_qarray(v, s, o)
  x = np.ones((1, 32), np.float32)
  np.testing.assert_array_equal(np.asarray(hx.einsum("mk,nk->mn", x, q)), 32 * o.T)


def test_grad_and_vmap():
  _, q = _u4o((24, 64), 32)
  x = RS.randn(4, 64).astype(np.float32)
  f = lambda x: hx.einsum("...k,nk->...n", x, q)  # noqa: E731
  g = jax.grad(lambda x: f(x).sum())(x)
  want = np.broadcast_to(_dense64(q).sum(0), x.shape)
  assert_within(g, want, dot_bound("n,nk->k", np.ones(24), _mags64(q), extra=4))
  np.testing.assert_array_equal(np.asarray(jax.vmap(f)(x)), np.asarray(jax.jit(f)(x)))
  # a batch of weights mapped along with their scales and offsets
  qs = jax.vmap(lambda w: hx.quantize(w, jnp.uint4, group_size=32, method="minmax"),
               out_axes=hx.QArraySpec())(
      RS.randn(3, 24, 64).astype(np.float32))
  assert str(jax.typeof(qs)) == "u4o[3,24,64:g32]"
  ys = jax.vmap(lambda q: hx.einsum("k,nk->n", x[0], q), in_axes=hx.QArraySpec(),
                axis_size=3)(qs)
  for i in range(3):
    qi = hx.make_qarray(*(c[i] for c in hx.qarray_parts(qs)))
    want = x[0].astype(np.float64) @ _dense64(qi).T
    assert_within(ys[i], want, dot_bound("k,nk->n", x[0], _mags64(qi), extra=4))
  # make_qarray's derivative in the scale and the offset
  v, s, o = hx.qarray_parts(q)
  gs, go = jax.grad(lambda s, o: hx.dequantize(hx.make_qarray(v, s, o)).sum(), (0, 1))(s, o)
  np.testing.assert_array_equal(np.asarray(go), np.full(o.shape, 32.0))
  np.testing.assert_array_equal(np.asarray(gs),
                                hx_testing.nibbles(np.asarray(v), False).reshape(24, 2, 32).sum(-1))


# --- errors -------------------------------------------------------------------

def test_methods_and_formats_must_agree():
  x = np.ones((4, 64), np.float32)
  with pytest.raises(TypeError, match=r"uint4 has an offset: quantize it with method='minmax'"):
    hx.quantize(x, jnp.uint4, group_size=32)
  with pytest.raises(TypeError, match=r"method='minmax' is asymmetric and needs a format "
                     r"with an offset \(uint4\), got dtype int8"):
    hx.quantize(x, jnp.int8, method="minmax")
  with pytest.raises(TypeError, match=r"int4_f16 has f16 scales, which come from checkpoints"):
    hx.quantize(x, "int4_f16", group_size=32)


def test_make_qarray_offset_must_be_the_scale_type():
  v = np.zeros((4, 32), np.uint8)
  with pytest.raises(TypeError, match=r"expects the offset of the scale's type \(f32\[4,2\]\)"):
    hx.make_qarray(v, np.ones((4, 2), np.float32), np.ones((4, 1), np.float32))
  with pytest.raises(TypeError, match=r"no quantization format has components "
                     r"f8_e4m3fn\[4,64\], f32\[4,2\], f32\[4,2\]"):
    hx.make_qarray(jnp.zeros((4, 64), jnp.float8_e4m3fn), np.ones((4, 2), np.float32),
                   np.ones((4, 2), np.float32))
  # int8 values with offsets are a format (GGUF's Q5_1, Q5_K): q8o
  q = hx.make_qarray(np.full((4, 64), 31, np.int8), np.ones((4, 2), np.float32),
                     np.full((4, 2), -16, np.float32))
  assert str(jax.typeof(q)) == "q8o[4,64:g32]"
  np.testing.assert_array_equal(np.asarray(hx.dequantize(q)), 15.0)
  np.testing.assert_array_equal(
      np.asarray(hx.einsum("mk,nk->mn", np.ones((1, 64), np.float32), q)), 960.0)


def test_sharding_that_splits_a_group_is_a_type_error(on_mesh):
  w = jax.device_put(np.ones((8, 64), np.float32), P(None, "i"))  # 16 per shard
  q = hx.quantize(w, jnp.uint4, group_size=16, method="minmax")
  assert str(jax.typeof(q)) == "u4o[8,64@i:g16]"
  with pytest.raises(TypeError, match=r"u4o\[8,64@i:g32\] sharded over mesh axis 'i'=4: "
                     r"2 groups of 32 cannot be split 4 ways"):
    hx.quantize(w, jnp.uint4, group_size=32, method="minmax")


def test_shard_map_takes_the_offset_component(mesh):
  _, q = _u4o((8, 64), 32)
  x = RS.randn(2, 64).astype(np.float32)
  def f(spec):
    return jax.jit(jax.shard_map(lambda x, q: hx.einsum("mk,nk->mn", x, q), mesh=mesh,
                                 in_specs=(P(), spec), out_specs=P(None, "i")))
  assert_within(f(hx.QArrayP(P("i"), offset=True))(x, q), x.astype(np.float64) @ _dense64(q).T,
                dot_bound("mk,nk->mn", x, _mags64(q), extra=4))
  with pytest.raises(TypeError, match=r"a u4o\[8,64:g32\] crosses shard_map with "
                     r"hx.QArrayP\(P\(...\), offset=True\) \(its format has an offset "
                     r"component\)"):
    f(hx.QArrayP(P("i")))(x, q)


# --- lowering, hx-verify, hx-decompose ---------------------------------------------

def test_cpu_rule_calls_the_native_kernels_for_offset_formats_in_both_layouts():
  # [out, in] (quantized along the contraction): hx_matmul_q_cpu_v3 ("nk" in native_cpu); the
  # Q[k, n] layout (2-D: the transposed product of [out, in], the backward in x):
  # hx_matmul_q_cpu_nkt_v1
  _, q = _u4o((512, 512), 32)  # big enough for the native kernel
  x = np.ones((2, 512), np.float32)
  for spec, target in (("...k,nk->...n", "hx_matmul_q_cpu_v3"),
                       ("...k,kn->...n", "hx_matmul_q_cpu_nkt_v1")):
    with hx.installed():
      text = jax.jit(lambda x, q, spec=spec: hx.einsum(spec, x, q)).lower(x, q).as_text()
    calls = re.findall(r"custom_call @(hx_matmul_q_cpu\w*)", text)
    assert calls == ([target] if target else []), spec
    assert 'stablehlo.composite "hx.matmul_q"' in text and "version = 4" in text


def test_verify_and_decompose_the_new_versions():
  _, q = _u4o((48, 64), 32, f16=True)
  x = RS.randn(3, 64).astype(np.float32)
  def f(x, q):
    return hx.einsum("...k,nk->...n", x, q), hx.dequantize(q)
  lowered = jax.jit(f).lower(x, q)
  module = lowered.compiler_ir("stablehlo")
  parse_pipeline("hx-verify").run(module)  # raises on any problem
  text = str(module)
  assert 'scale_dtype = "f16"' in text and "offset = true" in text
  parse_pipeline("hx-decompose").run(module)
  assert "stablehlo.composite" not in str(module)
  y, d = jax.jit(f)(x, q)
  assert_within(d, _dense64(q), elementwise_bound(_dense64(q), 2))


# --- descriptors, the CLI's type grammar, export ------------------------------------

@pytest.mark.parametrize("text, fmt, v", [
    ("u4o[8,64:g32]", "uint4", 1), ("u4o[8,64:g32,f16]", "uint4_f16", 1),
    ("q8[8,64:g32,f16]", "int8_f16", 3), ("q4[8,64:g32,f16]", "int4_f16", 2),
    ("q8o[8,64:g32,f16]", "int8_offset_f16", 1), ("q8o[8,64:g32]", "int8_offset", 1),
    ("q8[8,64:g32]", "int8", 2), ("q4[8,64:g32]", "int4", 1),  # f32 scales, no offset
])
def test_type_text_and_descriptor_round_trip(text, fmt, v):
  from hxmlir.types import typedesc, typestr
  ty = typestr.parse_type(text)
  assert (ty.fmt, str(ty)) == (fmt, text)
  d = typedesc.to_json(ty)
  assert d["v"] == v and d.get("scale", "f32") == ty.format.scale_mlir
  assert typedesc.parse(typedesc.describe(ty)) == ty


def test_descriptor_scale_must_be_the_formats():
  from hxmlir.types import typedesc
  with pytest.raises(typedesc.DescriptorError, match=r"'scale' must be 'f32' or 'f16', got 'bf16'"):
    typedesc.from_json({"type": "u4o", "v": 1, "group": 32, "scale": "bf16", "shape": [4, 64],
                        "sharding": {"mesh": [], "spec": [None, None]}})


@pytest.mark.parametrize("f16", [False, True])
def test_export_round_trip(f16):
  from hxmlir import export as hxe
  _, q = _u4o((8, 64), 32, f16)
  x = RS.randn(2, 64).astype(np.float32)
  f = jax.jit(lambda x, q: (hx.einsum("mk,nk->mn", x, q),
                            hx.quantize(x, jnp.uint4, group_size=32, method="minmax")))
  back = hxe.deserialize(hxe.export(f)(x, q).serialize())
  (y, qo), (y0, qo0) = back.call(x, q), f(x, q)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y0))
  assert str(jax.typeof(qo)) == "u4o[2,64:g32]"
  for a, b in zip(hx.qarray_parts(qo), hx.qarray_parts(qo0)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --- hx-fold-scales ----------------------------------------------------------------

@pytest.mark.parametrize("f16", [False, True])
def test_fold_keeps_the_offset(f16):
  # x @ hx.dequantize(q) of an offset format folds (jaxpr stage) into hx.matmul_q with the
  # offsets as its fourth operand; the transposed form is left alone (the MLIR stage folds
  # only the formats of before): the numbers are the product's either way
  _, q = _u4o((64, 16), 16, f16)
  _, qt = _u4o((16, 64), 32, f16)
  x = RS.randn(4, 64).astype(np.float32)
  for f, w, folded, want in (
      (lambda x, q: x @ hx.dequantize(q), q, True, x.astype(np.float64) @ _dense64(q)),
      (lambda x, q: x @ hx.dequantize(q).T, qt, False, x.astype(np.float64) @ _dense64(qt).T)):
    with hx.installed():
      y = jax.jit(f)(x, w)
      text = jax.jit(f).lower(x, w).as_text()
    assert ('"hx.matmul_q" %arg0, %arg1, %arg2, %arg3' in text) == folded
    assert ('"hx.dequantize"' in text) != folded
    mags = _mags64(w) if folded else _mags64(w).T
    assert_within(y, want, dot_bound("mk,kn->mn", x, mags, extra=4))


# --- the CPU decomposition walks the weight in blocks ------------------------------------

@pytest.mark.parametrize("spec, shape, group", [("...k,nk->...n", (1024, 512), 32),
                                                ("...k,kn->...n", (512, 1024), 32)])
def test_cpu_blocked_path_numbers_and_memory(spec, shape, group):
  # a weight above the blocked path's threshold, with f16 scales and offsets (GGUF's
  # Q4_1): blocks of whole groups and bytes, never the f32 weight whole
  _, q = _u4o(shape, group, f16=True)
  x = RS.randn(3, 512).astype(np.float32)
  f = jax.jit(lambda x, q: hx.einsum(spec, x, q))
  w64 = _dense64(q)
  want = np.einsum(spec.replace("...", "m"), x.astype(np.float64), w64)
  assert_within(f(x, q), want, dot_bound(spec.replace("...", "m"), x, _mags64(q), extra=4))
  temp = f.lower(x, q).compile().memory_analysis().temp_size_in_bytes
  assert temp <= w64.size * 4 // 8, temp  # at most 1/8 of the f32 weight


def test_refusals_name_the_offset_component():
  q = hx.quantize(jnp.ones((4, 64)), jnp.uint4, group_size=32, method="minmax")
  with pytest.raises(TypeError, match=r"hx\.qarray_parts\(q\) for the stored values and "
                     r"scales, and the offsets of a format with an offset \(u4o, q8o, q5_1, q4_k, q5_k, q2_k\): "
                     r"\(np\.asarray\(q\.qvalue\), np\.asarray\(q\.scale\)\[, "
                     r"np\.asarray\(q\.offset\)\]\)"):
    np.asarray(q)
  assert len(hx.qarray_parts(q)) == 3  # what the message says
  with pytest.raises(TypeError, match=r"hx\.qarray_parts\(q\) for its values and scales "
                     r"\(and offsets: u4o, q8o, q5_1, q4_k, q5_k, q2_k\)"):
    q + 1


def test_weight_bytes_count_the_offsets():
  # models._nn.weight_bytes counted qvalue and scale only: a u4o's offsets were left out
  from hxmlir.models import _nn
  w = jnp.asarray(np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32))
  for q in (hx.quantize(w, jnp.uint4, group_size=32, method="minmax"), hx.quantize(w)):
    b = _nn.weight_bytes({"w": q})
    assert b["values"] == q.qvalue.nbytes
    assert b["scales"] == sum(np.asarray(c).nbytes for c in hx.qarray_parts(q)[1:])
  assert _nn.weight_bytes({"w": hx.quantize(w, jnp.uint4, group_size=32,
                                            method="minmax")})["scales"] == 2 * 8 * 2 * 4
