"""Hi types inside Pallas kernels, every format: int8, int4 pairs and fp8 per row and per group
as operands, results and slices of ``pl.pallas_call`` (interpret mode on CPU), products
against a float64 reference within the bound of ``numerics.py``, lowering for TPU from this
CPU machine, and every elementwise format of :data:`hxmlir.formats.FORMATS` (offsets, f16
scales) in users' kernels. The q8/r1/Tup cases with exact data are in ``test_pallas_hi.py``.
"""

from __future__ import annotations

import hx_testing
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from test_pallas_hi import _call, _dequantize_twice, _r1, _user_kernel

import hxmlir as hx

# --- every format and group size: operands, results, slices -----------------

FORMATS = [(jnp.int8, None), (jnp.int8, 64), (jnp.int4, None), (jnp.int4, 32),
           (jnp.float8_e4m3fn, None), (jnp.float8_e4m3fn, 128)]
FORMAT_IDS = [f"{np.dtype(d).name}-g{g}" for d, g in FORMATS]


def _quantized(rng, shape, dtype, group):
  """``hx.quantize`` of normal data in ``dtype``/``group``, with its dense float64 value
  computed from the components in numpy."""
  from hxmlir import formats
  w = hx.quantize(jnp.asarray(rng.standard_normal(shape).astype(np.float32)), dtype,
                  group_size=group)
  values, scale = (np.asarray(c) for c in hx.qarray_parts(w))
  v = np.asarray(formats.values_f32(jnp.asarray(values)), np.float64)
  s = scale.astype(np.float64)
  if group is None:
    dense = v * s[..., None]
  else:
    dense = (v.reshape(*v.shape[:-1], -1, group) * s[..., None]).reshape(v.shape)
  return w, dense


@pytest.mark.parametrize("dtype, group", FORMATS, ids=FORMAT_IDS)
def test_every_format_as_an_operand_blocked_over_rows_and_columns(dtype, group):
  # blocks of (8, 128): whole groups of 32, 64 and 128, and whole int4 bytes
  w, dense = _quantized(np.random.default_rng(80), (16, 256), dtype, group)
  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
  out = _call(_dequantize_twice, jax.ShapeDtypeStruct((16, 256), jnp.float32), [spec], spec,
              (2, 2))(w)
  # one f32 product and a doubling per element: exact in f64 of the f32 components
  np.testing.assert_array_equal(np.asarray(out, np.float64), dense.astype(np.float32) * 2.0)


def _matmul_in_kernel(x, w):
  """``hx.matmul_q(x, w)`` for ``x: f32[16, 64]``, ``w: [64, 256]`` inside a kernel over a
  2 x 2 grid of ``(8, 128)`` result blocks (the weight blocked ``(64, 128)``)."""
  def kernel(x_ref, q_ref, o_ref):
    o_ref[...] = hx.matmul_q(x_ref[...], q_ref[...])

  return _call(kernel, jax.ShapeDtypeStruct((16, 256), jnp.float32),
               [pl.BlockSpec((8, 64), lambda i, j: (i, 0)),
                pl.BlockSpec((64, 128), lambda i, j: (0, j))],
               pl.BlockSpec((8, 128), lambda i, j: (i, j)), (2, 2))(jnp.asarray(x), w)


@pytest.mark.parametrize("dtype, group", FORMATS, ids=FORMAT_IDS)
def test_every_format_in_a_matmul_kernel(dtype, group):
  from numerics import assert_matmul_close
  rng = np.random.default_rng(81)
  w, dense = _quantized(rng, (64, 256), dtype, group)
  x = rng.standard_normal((16, 64)).astype(np.float32)

  out = _matmul_in_kernel(x, w)
  assert_matmul_close(np.asarray(out), x, dense, extra=2)


@pytest.mark.parametrize("dtype, group", FORMATS, ids=FORMAT_IDS)
def test_every_format_as_a_result_of_quantize_in_the_kernel(dtype, group):
  # quantization is row- (or group-) local: blocks of whole rows give hx.quantize's value;
  # a grouped result may split the row into whole groups
  rng = np.random.default_rng(82)
  x = jnp.asarray(rng.standard_normal((16, 256)).astype(np.float32))
  want = hx.quantize(x, dtype, group_size=group)

  def kernel(x_ref, q_ref):
    q_ref[...] = hx.quantize(x_ref[...], dtype, group_size=group)

  block = (8, 256) if group is None else (8, 128)
  spec = pl.BlockSpec(block, lambda i, j: (i, j))
  got = _call(kernel, jax.typeof(want), [spec], spec, (2, 256 // block[1]))(x)
  assert jax.typeof(got) == jax.typeof(want)
  for g, w_ in zip(hx.qarray_parts(got), hx.qarray_parts(want)):
    np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w_).view(np.uint8))


@pytest.mark.parametrize("dtype, group", [(jnp.int4, None), (jnp.int4, 32), (jnp.int8, 64)],
                         ids=["int4-g", "int4-g32", "int8-g64"])
def test_slices_of_grouped_and_packed_refs_keep_whole_groups(dtype, group):
  w, dense = _quantized(np.random.default_rng(83), (8, 256), dtype, group)

  def kernel(q_ref, o_ref):
    o_ref[:, 0:128] = hx.dequantize(q_ref[:, 128:256])      # whole groups, whole bytes
    o_ref[:, 128:256] = hx.dequantize(q_ref.at[:, 0:192][:, 0:128])

  out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 256), jnp.float32),
                       interpret=True)(w)
  f32 = dense.astype(np.float32)
  np.testing.assert_array_equal(np.asarray(out), np.concatenate([f32[:, 128:], f32[:, :128]], 1))


def test_grouped_result_written_group_by_group():
  # a write of whole groups of a grouped result sets those groups' scales
  rng = np.random.default_rng(84)
  x = jnp.asarray(rng.standard_normal((8, 256)).astype(np.float32))
  want = hx.quantize(x, jnp.int4, group_size=64)

  def kernel(x_ref, q_ref):
    for c in range(0, 256, 128):
      q_ref[:, c:c + 128] = hx.quantize(x_ref[:, c:c + 128], jnp.int4, group_size=64)

  got = pl.pallas_call(kernel, out_shape=jax.typeof(want), interpret=True)(x)
  for g, w_ in zip(hx.qarray_parts(got), hx.qarray_parts(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w_))


@pytest.mark.parametrize("dtype, group, block, message", [
    (jnp.int4, 64, (8, 96), r"a q4\[16,256:g64\] block \(8, 96\) splits quantization groups "
                            r"of size 64 along the last axis; make its last block dim a "
                            r"multiple of 64"),
    (jnp.int8, 128, (8, 64), r"a q8\[16,256:g128\] block \(8, 64\) splits quantization groups "
                             r"of size 128"),
    (jnp.int4, None, (8, 3), r"a q4\[16,256\] block \(8, 3\) splits packed values \(2 per byte\)"),
])
def test_a_block_that_splits_a_group_is_a_type_error(dtype, group, block, message):
  w, _ = _quantized(np.random.default_rng(85), (16, 256), dtype, group)
  with pytest.raises(TypeError, match=message):
    _call(lambda q_ref, o_ref: None, jax.ShapeDtypeStruct((16, 256), jnp.float32),
          [pl.BlockSpec(block, lambda i: (0, 0))],
          pl.BlockSpec((16, 256), lambda i: (0, 0)), (1,))(w)


@pytest.mark.parametrize("index, message", [
    (lambda r: r[:, 16:80], r"slice 16:80 of q4\[8,256:g32\]'s last axis splits quantization "
                            r"groups of size 32"),
    (lambda r: r[:, 5], r"integer on axis 1 leaves no q4"),
])
def test_an_index_that_splits_a_group_is_a_type_error(index, message):
  w, _ = _quantized(np.random.default_rng(86), (8, 256), jnp.int4, 32)

  def kernel(q_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref) + jnp.sum(hx.dequantize(index(q_ref)))

  with pytest.raises(TypeError, match=message):
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                   interpret=True)(w)


# --- lowering for TPU from a CPU machine: no block is 1-D ---------------------------------

@pytest.mark.parametrize("dtype, group", [(jnp.int8, None), (jnp.int4, 128),
                                          (jnp.float8_e4m3fn, None)],
                         ids=["int8", "int4-g128", "f8"])
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_a_2d_quantized_operand_lowers_for_tpu_and_cuda_from_cpu(platform, dtype, group):
  # a per-row q8[m, n]'s scale is f32[m]: its 1-D blocks made Pallas ask the local TPU for
  # its tiling ("Unsupported TPU device kind: cpu"); its kernel form is f32[m, 1]
  from jax.experimental.pallas import triton as pltriton
  w, _ = _quantized(np.random.default_rng(87), (16, 256), dtype, group)
  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  params = pltriton.CompilerParams() if platform == "cuda" else None
  f = jax.jit(pl.pallas_call(_user_kernel, out_shape=jax.ShapeDtypeStruct((16, 256),
                                                                          jnp.float32),
                             in_specs=[spec], out_specs=spec, grid=(2,),
                             compiler_params=params))
  text = f.trace(w).lower(lowering_platforms=(platform,)).as_text()
  target = "__gpu$xla.gpu.triton" if platform == "cuda" else "tpu_custom_call"
  assert f"stablehlo.custom_call @{target}" in text
  values, scale = hx.qarray_parts(w)
  vt = "i8" if dtype == jnp.int8 else "ui8" if dtype == jnp.int4 else "f8E4M3FN"
  s = "16x1xf32" if group is None else f"16x{256 // group}xf32"
  assert f"(tensor<{'x'.join(map(str, values.shape))}x{vt}>, tensor<{s}>) -> " \
         "tensor<16x256xf32>" in text


def test_r1_operand_lowers_for_tpu_from_cpu():
  r1, _, _ = _r1(np.random.default_rng(88), 16, 256)

  def kernel(r_ref, o_ref):
    c, r = hx.factors(r_ref[...])
    o_ref[...] = c[:, None] * r[None, :]

  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  f = jax.jit(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 256), jnp.float32),
                             in_specs=[spec], out_specs=spec, grid=(2,)))
  text = f.trace(r1).lower(lowering_platforms=("tpu",)).as_text()
  assert "stablehlo.custom_call @tpu_custom_call" in text
  assert "(tensor<16x1xf32>, tensor<1x256xf32>) -> tensor<16x256xf32>" in text


# --- every format of hxmlir.formats (offsets, f16 scales) in users' kernels ---------

EPS = float(np.finfo(np.float32).eps)
# the elementwise formats: the block formats (GGUF's blocks) are not operands of users'
# kernels yet (no _pallas_layout for their words axis) and hx_testing.any_format does not
# build them
ALL_FORMATS = [(f.name, g) for f in __import__("hxmlir.formats").formats.FORMATS.values()
               if not f.block for g in (None, 32)]
ALL_FORMAT_IDS = [f"{n}-g{g}" for n, g in ALL_FORMATS]


@pytest.mark.parametrize("name, group", ALL_FORMATS, ids=ALL_FORMAT_IDS)
def test_all_formats_dequantize_in_a_kernel_exactly(name, group):
  # the offset is blocked like the scale: a lost or misplaced offset is off by the offsets
  from numerics import assert_within
  w, _, dense, bound, _ = hx_testing.any_format(np.random.default_rng(90), (16, 256), name, group)

  def kernel(q_ref, o_ref):
    o_ref[...] = hx.dequantize(q_ref[...])

  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
  out = _call(kernel, jax.ShapeDtypeStruct((16, 256), jnp.float32), [spec], spec, (2, 2))(w)
  assert_within(out, dense, bound)


@pytest.mark.parametrize("name, group", ALL_FORMATS, ids=ALL_FORMAT_IDS)
def test_all_formats_in_a_matmul_kernel(name, group):
  from numerics import assert_matmul_close
  rng = np.random.default_rng(91)
  w, _, dense, _, _ = hx_testing.any_format(rng, (64, 256), name, group)
  x = rng.standard_normal((16, 64)).astype(np.float32)

  out = _matmul_in_kernel(x, w)
  assert_matmul_close(np.asarray(out), x, dense, extra=3)


def _bits(a):
  a = np.asarray(a)
  return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize("name, group", ALL_FORMATS, ids=ALL_FORMAT_IDS)
def test_all_formats_as_results_copied_and_quantized_in_the_kernel(name, group):
  from hxmlir import formats
  f = formats.FORMATS[name]
  w, parts, _, _, x = hx_testing.any_format(np.random.default_rng(92), (16, 256), name, group)
  block = (8, 256) if group is None else (8, 128)
  spec = pl.BlockSpec(block, lambda i, j: (i, j))

  def copy(q_ref, o_ref):
    o_ref[...] = q_ref[...]

  got = _call(copy, jax.typeof(w), [spec], spec, (2, 256 // block[1]))(w)
  assert jax.typeof(got) == jax.typeof(w)
  assert len(hx.qarray_parts(got)) == len(parts)
  for g, want in zip(hx.qarray_parts(got), parts):
    np.testing.assert_array_equal(_bits(g), _bits(want))
  method = "minmax" if f.offset else "absmax"
  if formats.check_method(f, method) is not None:
    return  # f16 scales and q8o come from checkpoints: hx.quantize does not make them

  def quantize(x_ref, q_ref):
    q_ref[...] = hx.quantize(x_ref[...], name, group_size=group, method=method)

  got = _call(quantize, jax.typeof(w), [spec], spec, (2, 256 // block[1]))(x)
  assert jax.typeof(got) == jax.typeof(w)
  for g, want in zip(hx.qarray_parts(got), parts):
    np.testing.assert_array_equal(_bits(g), _bits(want))
