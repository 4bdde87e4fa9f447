"""Hi types inside Pallas kernels: ``q8``, ``r1`` and ``Tup`` operands and results of ``pl.pallas_call``.

Kernels run in interpret mode on CPU. Data are chosen so every result is exact
in f32 (integer values, power-of-two scales, short sums of small integers), so
results are compared for equality with numpy references computed from the
components. The lowering tests export for ``tpu`` and ``cuda`` from this CPU
machine. Every format (normal data, products within a float64 reference's bound) is
in ``test_pallas_hi_formats.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import hxmlir as hx
from hxmlir import pallas as hx_pallas


def _q8(rng, shape):
  """A q8 of integer values in [-127, 127] and power-of-two scales, with its dense numpy value."""
  q = rng.integers(-127, 128, shape).astype(np.int8)
  s = (2.0 ** rng.integers(-4, 3, shape[:-1])).astype(np.float32)
  return hx.make_qarray(jnp.asarray(q), jnp.asarray(s)), q, s


def _dense(q, s):
  return q.astype(np.float32) * s[..., None]


def _call(kernel, out_shape, in_specs, out_specs, grid, **kw):
  return pl.pallas_call(kernel, out_shape=out_shape, in_specs=in_specs, out_specs=out_specs,
                        grid=grid, interpret=True, **kw)


def _dequantize_twice(q_ref, o_ref):
  o_ref[...] = hx.dequantize(q_ref[...]) * 2


@pytest.mark.parametrize("jit", [False, True])
def test_issue_example_exact(jit):
  rng = np.random.default_rng(0)
  qw, q, s = _q8(rng, (16, 256))
  call = _call(_dequantize_twice, jax.ShapeDtypeStruct((16, 256), jnp.float32),
               [pl.BlockSpec((8, 256), lambda i: (i, 0))],
               pl.BlockSpec((8, 256), lambda i: (i, 0)), (2,))
  out = (jax.jit(call) if jit else call)(qw)
  np.testing.assert_array_equal(np.asarray(out), _dense(q, s) * 2)


def test_issue_example_from_quantize():
  qw = hx.quantize(jnp.ones((16, 256)))
  out = _call(_dequantize_twice, jax.ShapeDtypeStruct((16, 256), jnp.float32),
              [pl.BlockSpec((8, 256), lambda i: (i, 0))],
              pl.BlockSpec((8, 256), lambda i: (i, 0)), (2,))(qw)
  np.testing.assert_array_equal(np.asarray(out), np.full((16, 256), 2, np.float32))


def test_grid_splits_quantized_axis():
  # a 2-D grid: blocks of 8 rows x 128 of the 256 quantized columns; each
  # block's scale block is its 8 rows' scales
  rng = np.random.default_rng(1)
  qw, q, s = _q8(rng, (16, 256))
  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
  out = _call(_dequantize_twice, jax.ShapeDtypeStruct((16, 256), jnp.float32), [spec], spec,
              (2, 2))(qw)
  np.testing.assert_array_equal(np.asarray(out), _dense(q, s) * 2)


def test_slices_of_a_q8_ref_are_q8():
  rng = np.random.default_rng(2)
  qw, q, s = _q8(rng, (16, 256))

  def kernel(q_ref, o_ref):
    left = q_ref[:, 0:128]               # a q8[8,128]: the rows' scales, half the columns
    top = q_ref.at[0:4][:, 128:256]      # a view, then an index
    o_ref[:, 0:128] = hx.dequantize(left)
    o_ref[0:4, 128:256] = hx.dequantize(top)
    o_ref[4:8, 128:256] = jnp.zeros((4, 128), jnp.float32)

  out = _call(kernel, jax.ShapeDtypeStruct((16, 256), jnp.float32),
              [pl.BlockSpec((8, 256), lambda i: (i, 0))],
              pl.BlockSpec((8, 256), lambda i: (i, 0)), (2,))(qw)
  want = _dense(q, s)
  want[4:8, 128:] = 0
  want[12:16, 128:] = 0
  np.testing.assert_array_equal(np.asarray(out), want)


def test_q8_result_quantize_in_kernel():
  # per-row quantization is row-local: blocks of whole rows give hx.quantize's result
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((16, 256)).astype(np.float32))

  def kernel(x_ref, q_ref):
    q_ref[...] = hx.quantize(x_ref[...])

  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  out_ty = jax.typeof(hx.quantize(x))
  got = _call(kernel, out_ty, [spec], spec, (2,))(x)
  want = hx.quantize(x)
  assert jax.typeof(got) == out_ty
  np.testing.assert_array_equal(np.asarray(got.qvalue), np.asarray(want.qvalue))
  np.testing.assert_array_equal(np.asarray(got.scale), np.asarray(want.scale))


def test_matmul_q_in_kernel():
  rng = np.random.default_rng(4)
  qw, q, s = _q8(rng, (32, 256))
  x = rng.integers(-3, 4, (16, 32)).astype(np.float32)

  def kernel(x_ref, q_ref, o_ref):
    o_ref[...] = hx.matmul_q(x_ref[...], q_ref[...])

  out = _call(kernel, jax.ShapeDtypeStruct((16, 256), jnp.float32),
              [pl.BlockSpec((8, 32), lambda i, j: (i, 0)),
               pl.BlockSpec((32, 128), lambda i, j: (0, j))],
              pl.BlockSpec((8, 128), lambda i, j: (i, j)), (2, 2))(jnp.asarray(x), qw)
  np.testing.assert_array_equal(np.asarray(out), x @ _dense(q, s))


def test_input_output_aliases_q8():
  rng = np.random.default_rng(5)
  qw, q, s = _q8(rng, (16, 256))

  def kernel(q_ref, o_ref):
    v = q_ref[...]
    o_ref[...] = hx.make_qarray(v.qvalue, v.scale * 2)

  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  got = jax.jit(_call(kernel, jax.typeof(qw), [spec], spec, (2,),
                      input_output_aliases={0: 0}))(qw)
  np.testing.assert_array_equal(np.asarray(got.qvalue), q)
  np.testing.assert_array_equal(np.asarray(got.scale), s * 2)


# --- errors: named types, blocks and the way out ------------------------------

def test_block_squeezing_the_quantized_axis_is_a_type_error():
  qw, _, _ = _q8(np.random.default_rng(6), (16, 256))
  with pytest.raises(TypeError, match=r"q8\[16,256\] block .* squeezes axis 1, which one scale"):
    _call(lambda q_ref, o_ref: None, jax.ShapeDtypeStruct((16,), jnp.float32),
          [pl.BlockSpec((16, pl.squeezed), lambda i: (0, i))],
          pl.BlockSpec((16,), lambda i: (0,)), (256,))(qw)


def test_integer_index_on_quantized_axis_is_a_type_error():
  qw, _, _ = _q8(np.random.default_rng(7), (16, 256))

  def kernel(q_ref, o_ref):
    o_ref[...] = hx.dequantize(q_ref[:, 3])

  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  with pytest.raises(TypeError, match=r"integer on axis 1 leaves no q8; slice it"):
    _call(kernel, jax.ShapeDtypeStruct((16, 256), jnp.float32), [spec], spec, (2,))(qw)


def test_writing_part_of_a_row_is_a_type_error():
  x = jnp.ones((16, 256), jnp.float32)

  def kernel(x_ref, q_ref):
    q_ref[:, 0:128] = hx.quantize(x_ref[:, 0:128])

  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  with pytest.raises(TypeError, match=r"writing a q8\[8,256\] through index .* covers part of "
                                      r"axis 1"):
    _call(kernel, jax.typeof(hx.quantize(x)), [spec], spec, (2,))(x)


def test_result_block_splitting_rows_is_a_type_error():
  x = jnp.ones((16, 256), jnp.float32)

  def kernel(x_ref, q_ref):
    q_ref[...] = hx.quantize(x_ref[...])

  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
  with pytest.raises(TypeError, match=r"block .* of result q8\[16,256\] splits axis 1 "
                                      r"\(128 of 256\)"):
    _call(kernel, jax.typeof(hx.quantize(x)), [spec], spec, (2, 2))(x)


def test_wrong_value_type_written_is_a_type_error():
  x = jnp.ones((16, 256), jnp.float32)

  def kernel(x_ref, q_ref):
    q_ref[:, :] = hx.quantize(x_ref[0:4, :])

  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  with pytest.raises(TypeError, match=r"writing q8\[4,256\] to a ref of q8\[8,256\]"):
    _call(kernel, jax.typeof(hx.quantize(x)), [spec], spec, (2,))(x)


def _write_to_ref(ref_ty, value, index):
  """A kernel that writes ``value(x_ref)`` to its result of type ``ref_ty`` at ``index``."""
  def kernel(x_ref, o_ref):
    o_ref[index] = value(x_ref[...])
  return pl.pallas_call(kernel, out_shape=ref_ty, interpret=True)


@pytest.mark.parametrize("ref, value, index, message", [
    # a whole hi ref (no index) takes exactly its type
    ("q8", lambda x: x, ..., r"writing float32\[8,128\] to a ref of q8\[8,128\]: a write of "
                             r"the whole ref takes a value of its type q8\[8,128\]"),
    ("q8", lambda x: hx.quantize(x[0:4]), ..., r"writing q8\[4,128\] to a ref of q8\[8,128\]"),
    ("q8", lambda x: hx.outer(x[:, 0], x[0]), ..., r"writing r1\[8,128\] to a ref of q8\[8,128\]"),
    ("r1", lambda x: x, ..., r"writing float32\[8,128\] to a ref of r1\[8,128\]"),
    ("tup", lambda x: hx.make_tup(x, x), ...,
     r"writing Tup\{f32\[8,128\],f32\[8,128\]\} to a ref of Tup\{f32\[8,128\],q8\[8,128\]\}"),
    # a hi value never goes into an array ref, whole or indexed
    ("f32", hx.quantize, ..., r"writing q8\[8,128\] to a ref of float32\[8,128\]: an array ref "
                              r"holds arrays"),
    ("f32", lambda x: hx.quantize(x[0:4]), (slice(0, 4), slice(None)),
     r"writing q8\[4,128\] to a ref of float32\[8,128\] at .*: an array ref holds arrays"),
    ("f32", lambda x: hx.outer(x[:, 0], x[0]), ..., r"writing r1\[8,128\] to a ref of float32"),
])
def test_whole_ref_and_array_ref_writes_of_the_wrong_type_are_type_errors(ref, value, index,
                                                                            message):
  # o_ref[...] = v reaches JAX's array rule of swap (no transforms), which failed in
  # _swap_to_lojax (safe_zip) or on an assert; hxmlir's check names both types first
  x = jnp.ones((8, 128), jnp.float32)
  q = hx.quantize(x)
  ref_ty = {"q8": jax.typeof(q), "r1": jax.typeof(hx.outer(x[:, 0], x[0])),
            "tup": jax.typeof(hx.make_tup(x, q)),
            "f32": jax.ShapeDtypeStruct((8, 128), jnp.float32)}[ref]
  with pytest.raises(TypeError, match=message):
    _write_to_ref(ref_ty, value, index)(x)


def test_whole_ref_writes_of_the_right_type_still_work():
  x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) / 100
  q = hx.quantize(x)
  out = _write_to_ref(jax.typeof(q), hx.quantize, ...)(x)
  np.testing.assert_array_equal(np.asarray(out.qvalue), np.asarray(q.qvalue))
  np.testing.assert_array_equal(np.asarray(out.scale), np.asarray(q.scale))
  dense = _write_to_ref(jax.ShapeDtypeStruct((8, 128), jnp.float32), lambda v: v * 2, ...)(x)
  np.testing.assert_array_equal(np.asarray(dense), np.asarray(x) * 2)


@pytest.mark.parametrize("block, ok", [((8, 128), True), ((8, 256), True), ((8, 80), False),
                                       ((8, 32), True), ((8, 48), False)])
def test_group_alignment_check(block, ok):
  # today's q8 has one scale per row (group None: any block is whole); a grouped
  # format (g elements per scale) passes its g -- here 32
  hx_pallas.check_whole_groups("q8[16,256]", block, None)
  hx_pallas.check_whole_groups("q8[16,256]", (8, pl.Blocked(96)), None)
  check = functools.partial(hx_pallas.check_whole_groups, "q4g32[16,256]", block, 32)
  if ok:
    check()
  else:
    with pytest.raises(TypeError, match=rf"q4g32\[16,256\] block \(8, {block[1]}\) splits "
                                        r"quantization groups of size 32"):
      check()


# --- r1 -------------------------------------------------------------------------

def _r1(rng, m, n):
  col = rng.integers(-8, 9, m).astype(np.float32)
  row = rng.integers(-8, 9, n).astype(np.float32)
  return hx.outer(jnp.asarray(col), jnp.asarray(row)), col, row


def test_r1_operand_blocks_split_both_axes():
  # a block (8, 128) of r1[16,256]: col block (8,), row block (128,)
  r1, col, row = _r1(np.random.default_rng(10), 16, 256)

  def kernel(r_ref, o_ref):
    c, r = hx.factors(r_ref[...])
    o_ref[...] = c[:, None] * r[None, :]

  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
  out = _call(kernel, jax.ShapeDtypeStruct((16, 256), jnp.float32), [spec], spec, (2, 2))(r1)
  np.testing.assert_array_equal(np.asarray(out), np.outer(col, row))


def test_r1_result_and_slices():
  _, col, row = _r1(np.random.default_rng(11), 16, 256)

  def kernel(c_ref, r_ref, o_ref, top_ref):
    o_ref[...] = hx.outer(c_ref[...], r_ref[...])
    top = hx.factors(o_ref[0:4, :])      # reading a slice of an r1 ref back
    top_ref[...] = top[0][:, None] * top[1][None, :]

  got, top = pl.pallas_call(
      kernel, out_shape=(jax.typeof(hx.outer(jnp.asarray(col), jnp.asarray(row))),
                         jax.ShapeDtypeStruct((4, 256), jnp.float32)),
      interpret=True)(jnp.asarray(col), jnp.asarray(row))
  c, r = hx.factors(got)
  np.testing.assert_array_equal(np.asarray(c), col)
  np.testing.assert_array_equal(np.asarray(r), row)
  np.testing.assert_array_equal(np.asarray(top), np.outer(col[:4], row))


def test_r1_result_block_splitting_an_axis_is_a_type_error():
  r1, _, _ = _r1(np.random.default_rng(12), 16, 256)

  def kernel(r_ref, o_ref):
    o_ref[...] = r_ref[...]

  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  with pytest.raises(TypeError, match=r"block .* of result r1\[16,256\] splits axis 0 "
                                      r"\(8 of 16\)"):
    _call(kernel, jax.typeof(r1), [spec], spec, (2,))(r1)


# --- Tup ------------------------------------------------------------------------

def test_tup_operand_of_array_and_q8():
  # one block spec over the shared dense shape, applied to every element
  rng = np.random.default_rng(20)
  qw, q, s = _q8(rng, (16, 256))
  x = rng.integers(-4, 5, (16, 256)).astype(np.float32)
  tup = hx.make_tup(jnp.asarray(x), qw)

  def kernel(t_ref, o_ref, top_ref):
    t = t_ref[...]
    o_ref[...] = hx.get_tuple_element(t, 0) * hx.dequantize(hx.get_tuple_element(t, 1))
    head = t_ref[0:4, :]                  # a slice of a Tup ref is a Tup of slices
    top_ref[...] = hx.dequantize(hx.get_tuple_element(head, 1))

  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
  out, top = _call(kernel, (jax.ShapeDtypeStruct((16, 256), jnp.float32),
                            jax.ShapeDtypeStruct((8, 256), jnp.float32)),
                   [spec], (spec, pl.BlockSpec((4, 128), lambda i, j: (i, j))), (2, 2))(tup)
  np.testing.assert_array_equal(np.asarray(out), x * _dense(q, s))
  np.testing.assert_array_equal(np.asarray(top), _dense(q, s)[[0, 1, 2, 3, 8, 9, 10, 11]])


def test_tup_result_built_in_kernel():
  rng = np.random.default_rng(21)
  x = jnp.asarray(rng.standard_normal((16, 256)).astype(np.float32))

  def kernel(x_ref, t_ref):
    v = x_ref[...]
    t_ref[...] = hx.make_tup(v * 2, hx.quantize(v))

  out_ty = jax.typeof(hx.make_tup(x, hx.quantize(x)))
  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  got = jax.jit(_call(kernel, out_ty, [spec], spec, (2,)))(x)
  assert jax.typeof(got) == out_ty
  want = hx.quantize(x)
  np.testing.assert_array_equal(np.asarray(hx.get_tuple_element(got, 0)), np.asarray(x) * 2)
  q = hx.get_tuple_element(got, 1)
  np.testing.assert_array_equal(np.asarray(q.qvalue), np.asarray(want.qvalue))
  np.testing.assert_array_equal(np.asarray(q.scale), np.asarray(want.scale))


def test_tup_of_differently_shaped_elements_has_no_block():
  tup = hx.make_tup(jnp.ones((8, 128)), jnp.ones((4,)))
  assert not hasattr(jax.typeof(tup), "shape")
  with pytest.raises(ValueError, match="Array type must have a `shape` attribute, but got "
                                       ".*TupTy"):
    _call(lambda t_ref, o_ref: None, jax.ShapeDtypeStruct((8, 128), jnp.float32),
          [pl.BlockSpec((8, 128), lambda: (0, 0))], pl.BlockSpec((8, 128), lambda: (0, 0)),
          ())(tup)


# --- transformations ----------------------------------------------------------

def test_vmap_over_dense_operand_with_unbatched_q8():
  rng = np.random.default_rng(30)
  qw, q, s = _q8(rng, (16, 256))
  xs = rng.integers(-4, 5, (3, 16, 256)).astype(np.float32)

  def kernel(x_ref, q_ref, o_ref):
    o_ref[...] = x_ref[...] * hx.dequantize(q_ref[...])

  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  call = _call(kernel, jax.ShapeDtypeStruct((16, 256), jnp.float32), [spec, spec], spec, (2,))
  out = jax.jit(jax.vmap(lambda x: call(x, qw)))(jnp.asarray(xs))
  np.testing.assert_array_equal(np.asarray(out), xs * _dense(q, s))


def test_batched_q8_blocks_over_a_grid_axis():
  # the way to run a kernel over a batch of q8 weights: a grid axis over the batch
  rng = np.random.default_rng(31)
  qw, q, s = _q8(rng, (3, 16, 256))
  spec = pl.BlockSpec((None, 8, 256), lambda b, i: (b, i, 0))
  out = _call(_dequantize_twice, jax.ShapeDtypeStruct((3, 16, 256), jnp.float32), [spec], spec,
              (3, 2))(qw)
  np.testing.assert_array_equal(np.asarray(out), _dense(q, s) * 2)


# --- lowering for TPU (Mosaic) and GPU (Triton) from this CPU machine -----------

def _user_kernel(q_ref, o_ref):
  o_ref[...] = hx.dequantize(q_ref[...]) * 2


def _triton_call(name):
  from jax.experimental.pallas import triton as pltriton
  spec = pl.BlockSpec((16, 256), lambda i: (i, 0))
  return jax.jit(pl.pallas_call(_user_kernel, out_shape=jax.ShapeDtypeStruct((16, 256),
                                                                           jnp.float32),
                                in_specs=[spec], out_specs=spec, grid=(1,), name=name,
                                compiler_params=pltriton.CompilerParams()))


def test_gpu_export_registered_and_unregistered_user_kernels():
  from hxmlir import targets
  qw, _, _ = _q8(np.random.default_rng(40), (16, 256))
  kernel = targets.register_kernel(targets.TRITON, "hx_test_pallas_hi", 1, ("cuda",),
                                   owner="test")
  hx.install()
  try:
    exp = jax.export.export(_triton_call("hx_test_pallas_hi_v1"), platforms=["cuda"])(qw)
    text = exp.mlir_module()
    assert 'name = "hx_test_pallas_hi_v1"' in text
    # the q8 crosses the call as its components, the scale in its kernel form f32[16, 1]
    assert "(tensor<16x256xi8>, tensor<16x1xf32>) -> tensor<16x256xf32>" in text
    with pytest.raises(hx.VerificationError,
                       match=r"(?s)kernel 'mine' is not registered.*hxmlir.targets.register_kernel"):
      jax.export.export(_triton_call("mine"), platforms=["cuda"])(qw)
  finally:
    hx.uninstall()
    targets.unregister_kernel(kernel)


def test_tpu_export_of_a_q8_kernel():
  # Mosaic tiles the scale's blocks like any array's: here the scale's kernel form
  # f32[16, 128, 1] in blocks of (8, 128, 1), as the Pallas TPU lowering requires of
  # every block's last two dims
  qw = hx.make_qarray(jnp.ones((16, 128, 256), jnp.int8), jnp.ones((16, 128), jnp.float32))
  x = jnp.ones((16, 8, 128), jnp.float32)

  def kernel(x_ref, q_ref, o_ref):
    o_ref[...] = hx.matmul_q(x_ref[...], q_ref[...])

  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 8, 256), jnp.float32),
                        in_specs=[pl.BlockSpec((8, 8, 128), lambda i: (i, 0, 0)),
                                  pl.BlockSpec((8, 128, 256), lambda i: (i, 0, 0))],
                        out_specs=pl.BlockSpec((8, 8, 256), lambda i: (i, 0, 0)), grid=(2,))
  exp = jax.export.export(jax.jit(call), platforms=["tpu"])(x, qw)
  text = exp.mlir_module()
  assert "stablehlo.custom_call @tpu_custom_call" in text
  assert ("(tensor<16x8x128xf32>, tensor<16x128x256xi8>, tensor<16x128x1xf32>) -> "
          "tensor<16x8x256xf32>") in text


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_dense_kernel_with_hx_ops_lowers_after_use_in_kernels(platform):
  from jax.experimental.pallas import triton as pltriton

  def kernel(x_ref, o_ref):                # fake quantization, dense in and out
    o_ref[...] = hx.dequantize(hx.quantize(x_ref[...]))

  params = pltriton.CompilerParams() if platform == "cuda" else None
  f = jax.jit(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 256), jnp.float32),
                             compiler_params=params))
  hx_pallas.use_in_kernels()
  text = f.trace(jnp.ones((16, 256), jnp.float32)).lower(
      lowering_platforms=(platform,)).as_text()
  target = "__gpu$xla.gpu.triton" if platform == "cuda" else "tpu_custom_call"
  assert f"stablehlo.custom_call @{target}" in text


def test_triton_rounding_is_round_half_even():
  # Triton kernels have no round: hx.quantize's rule there rounds with floor
  from hxmlir.lowering import rules
  v = np.concatenate([np.arange(-130, 130.25, 0.25, dtype=np.float32),
                      np.nextafter(np.arange(-128.5, 129, 1, dtype=np.float32), np.float32(0)),
                      np.nextafter(np.arange(-128.5, 129, 1, dtype=np.float32), np.float32(200))])
  got = jax.jit(rules.round_half_even_by_floor)(jnp.asarray(v))
  np.testing.assert_array_equal(np.asarray(got), np.round(v))


@pytest.mark.parametrize("flavour", ["mosaic", "triton"])
def test_kernel_rule_of_quantize_equals_the_reference(flavour):
  # what hx.quantize computes inside Mosaic / Triton kernels, run here as plain JAX
  from hxmlir.lowering import reference, rules
  rng = np.random.default_rng(50)
  x = rng.standard_normal((8, 256)).astype(np.float32) * 10
  x[1] = 0
  x[2, 7] = np.nan
  x[3, 9] = np.inf
  x[4, :] = np.round(x[4, :]) + 0.5        # ties after scaling are rare; exact halves here
  round_ = jnp.round if flavour == "mosaic" else rules.round_half_even_by_floor
  q, s = jax.jit(functools.partial(rules.quantize_in_kernel, round_half_even=round_))(x)
  q_ref, s_ref = jax.jit(reference.quantize)(x)
  np.testing.assert_array_equal(np.asarray(q), np.asarray(q_ref))
  np.testing.assert_array_equal(np.asarray(s), np.asarray(s_ref))
  assert np.isnan(np.asarray(s)[[2, 3]]).all() and (np.asarray(q)[[2, 3]] == 0).all()


def test_integer_index_on_batch_axes_of_q8_and_r1_refs():
  rng = np.random.default_rng(60)
  qw, q, s = _q8(rng, (2, 8, 128))
  col = rng.integers(-4, 5, (2, 8)).astype(np.float32)
  row = rng.integers(-4, 5, (2, 128)).astype(np.float32)
  r1 = hx.outer(jnp.asarray(col), jnp.asarray(row))

  def kernel(q_ref, r_ref, o_ref):
    c, r = hx.factors(r_ref[1])               # r1[8,128]: batch 1
    o_ref[...] = hx.dequantize(q_ref[1]) + c[:, None] * r[None, :]

  out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                       interpret=True)(qw, r1)
  np.testing.assert_array_equal(np.asarray(out), _dense(q, s)[1] + np.outer(col[1], row[1]))


def test_installed_interpret_mode_and_tup_aliasing():
  # with hxmlir installed (passes, native CPU kernels) the kernel body's hx ops run
  # through hxmlir's CPU lowering; a Tup operand aliased to its result
  rng = np.random.default_rng(70)
  qw, q, s = _q8(rng, (16, 256))
  x = rng.integers(-4, 5, (16, 256)).astype(np.float32)
  tup = hx.make_tup(jnp.asarray(x), qw)

  def kernel(t_ref, o_ref):
    t = t_ref[...]
    v = hx.get_tuple_element(t, 1)
    o_ref[...] = hx.make_tup(hx.get_tuple_element(t, 0) + hx.dequantize(v), v)

  spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
  hx.install()
  try:
    got = jax.jit(_call(kernel, jax.typeof(tup), [spec], spec, (2,),
                        input_output_aliases={0: 0}))(tup)
  finally:
    hx.uninstall()
  np.testing.assert_array_equal(np.asarray(hx.get_tuple_element(got, 0)), x + _dense(q, s))
  np.testing.assert_array_equal(np.asarray(hx.get_tuple_element(got, 1).qvalue), q)
