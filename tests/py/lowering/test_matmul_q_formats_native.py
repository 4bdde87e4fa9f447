"""``hx_matmul_q_cpu_v2``: the native CPU kernel of every quantization format.

Formats (:mod:`hxmlir.formats`): int8, int4 (layout ``int4_pairs_v1``) and
float8_e4m3fn, one scale per row or per group of ``g`` along ``n``, in the layout
``f32[*b, m, k] x Q[*b, k, n]`` (``csrc/matmul_q_formats.h``).

Numbers: each output element is an f32 sum of ``k`` terms, each the product of
``x``, a stored value and its scale with one rounding besides the sum's (``fl(x s)``
in the "rows" regime, ``fl(q s)`` in the "blocks" one); against the float64 product
of ``x`` and the float64 dequantized weight the error is at most
``gamma_{k+1} |x| @ |w|`` (``tests/py/numerics.py``, ``extra=1``). A lost block, a
wrong nibble or group offset is off by about one term and fails it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from numerics import assert_matmul_close

import hxmlir as hx
import hxmlir.export as hxe
from hxmlir import formats
from hxmlir.lowering.matmul_q import cpu as native

INFO = hx.cpu_kernel_info()
needs_native = pytest.mark.skipif(not INFO.active, reason=f"native kernel inactive: {INFO}")
V2 = jax.jit(native.matmul_q_native_v2)


def _dequantized64(q, s) -> np.ndarray:
  """The exact (float64) dense weight of stored values ``q`` and scales ``s``."""
  qf = np.asarray(formats.values_f32(jnp.asarray(q))).astype(np.float64)
  s64 = np.asarray(s, np.float64)
  if s64.ndim == qf.ndim - 1:
    return qf * s64[..., None]
  g = qf.shape[-1] // s64.shape[-1]
  return (qf.reshape(*qf.shape[:-1], -1, g) * s64[..., None]).reshape(qf.shape)


def _weight(rng, dtype, shape, group):
  """Stored values and scales of a random weight of ``shape`` in format ``dtype``."""
  w = rng.standard_normal(shape).astype(np.float32)
  qw = hx.quantize(w, dtype, group_size=group)
  return np.asarray(qw.qvalue), np.asarray(qw.scale)


def _with_isa(isa, f, *args):
  from hxmlir import _matmul_q_cpu as ext
  ext.select_isa(isa)
  try:
    return np.asarray(f(*args))
  finally:
    ext.select_isa(INFO.isa)


FORMATS = [(jnp.int8, None), (jnp.int8, 16), (jnp.int8, 12), (jnp.int4, None), (jnp.int4, 32),
           (jnp.int4, 16), (jnp.int4, 10), (jnp.int4, 2), (jnp.float8_e4m3fn, None),
           (jnp.float8_e4m3fn, 48), (jnp.float8_e4m3fn, 6)]
# (batch, m, k, n): "rows" (m <= 4) with k split into chunks and a remainder, odd m,
# "panel" (m <= 12 for fp8, 32 for int4, 64 for int8) and "blocks" (larger m, or group
# sizes that split a vector) with k not a multiple of the block (256); n a multiple of
# every group size above but 10 for 96 (480 = 2^5 * 15, 4320 = 2^5 * 3^3 * 5: more
# than one block of 4096 columns), and n = 90 (10, 2 and 6 divide it) for columns past
# the last whole vector in both "panel" and "blocks".
SHAPES = [((), 1, 1000, 480), ((2,), 3, 301, 480), ((), 4, 64, 4320), ((), 5, 257, 480),
          ((3,), 17, 600, 96), ((2, 2), 70, 130, 480), ((), 9, 70, 90), ((), 66, 40, 90)]


@needs_native
@pytest.mark.parametrize("isa", INFO.supported_isas)
@pytest.mark.parametrize("dtype,group", FORMATS, ids=lambda v: str(getattr(v, "__name__", v)))
def test_every_format_within_f32_bound_on_every_isa(isa, dtype, group):
  rng = np.random.default_rng(11)
  for b, m, k, n in SHAPES:
    if group is not None and n % group:
      continue
    q, s = _weight(rng, dtype, (*b, k, n), group)
    x = rng.standard_normal((*b, m, k)).astype(np.float32)
    y = _with_isa(isa, V2, x, q, s)
    assert y.shape == (*b, m, n) and y.dtype == np.float32
    assert_matmul_close(y, x, _dequantized64(q, s), extra=1)


@needs_native
@pytest.mark.parametrize("isa", INFO.supported_isas)
@pytest.mark.parametrize("m", [1, 5])  # regimes "rows" and "blocks"
def test_every_stored_byte_decodes_like_dequantize(isa, m):
  # x = ones((m, 1)), one row of q holding every byte, scale 1: y is the decoded row,
  # exactly (one exact product per element). fp8: subnormals (0x01-0x07), zeros of
  # both signs, 448, and the NaNs 0x7F / 0xFF.
  every = np.arange(256, dtype=np.uint8).reshape(1, 256)
  x = np.ones((m, 1), np.float32)
  for q in (every.view(ml_dtypes.float8_e4m3fn), every, every.view(np.int8)):
    want = np.asarray(hx.dequantize(hx.make_qarray(q, np.ones((1,), np.float32))))[0]
    y = _with_isa(isa, V2, x, q, np.ones((1,), np.float32))
    for row in y:
      np.testing.assert_array_equal(np.isnan(row), np.isnan(want))
      np.testing.assert_array_equal(row[~np.isnan(want)], want[~np.isnan(want)])


def test_fp8_reference_of_this_test():
  # The decode test above compares with hx.dequantize; this pins that reference to
  # ml_dtypes' own float8_e4m3fn values (subnormal 2^-9, NaN at 0x7F and 0xFF).
  f8 = np.arange(256, dtype=np.uint8).reshape(1, 256).view(ml_dtypes.float8_e4m3fn)
  want = np.asarray(hx.dequantize(hx.make_qarray(f8, np.ones((1,), np.float32))))[0]
  ref = f8[0].astype(np.float32)
  assert want[1] == 2.0 ** -9 and want[0x7E] == 448 and np.isnan(want[[0x7F, 0xFF]]).all()
  np.testing.assert_array_equal(want, ref)


@pytest.mark.skipif(not {"avx512", "avx2"} <= set(INFO.supported_isas),
                    reason="needs a CPU with AVX-512 and AVX2")
def test_avx512_and_avx2_agree_bit_for_bit():
  rng = np.random.default_rng(3)
  for dtype, group in FORMATS:
    for b, m, k, n in SHAPES[:4]:
      if group is not None and n % group:
        continue
      q, s = _weight(rng, dtype, (*b, k, n), group)
      x = rng.standard_normal((*b, m, k)).astype(np.float32)
      np.testing.assert_array_equal(_with_isa("avx512", V2, x, q, s),
                                    _with_isa("avx2", V2, x, q, s))


@needs_native
def test_the_handler_refuses_operands_that_disagree_with_the_attributes():
  x = np.ones((2, 64), np.float32)
  q = np.zeros((64, 16), np.uint8)
  call = jax.ffi.ffi_call(native.TARGET_V2, jax.ShapeDtypeStruct((2, 32), jnp.float32))
  s = np.ones((64,), np.float32)
  cases = [
      (dict(dtype="int4", layout="plain", group_size=np.int64(0)),
       "hx_matmul_q_cpu_v2: dtype int4 is stored in layout 'int4_pairs_v1', got layout 'plain'"),
      (dict(dtype="int3", layout="plain", group_size=np.int64(0)),
       "hx_matmul_q_cpu_v2: unknown dtype attribute 'int3'"),
      (dict(dtype="int4", layout="int4_pairs_v1", group_size=np.int64(8)),
       "hx_matmul_q_cpu_v2: expects f32[*b, m, k], u8[*b, k, n / 2], f32[*b, k, n / 8] -> "
       "f32[*b, m, n] for dtype int4, group_size 8, got f32[2,64], u8[64,16], f32[64] -> "
       "f32[2,32]"),
      (dict(dtype="int4", layout="int4_pairs_v1", group_size=np.int64(3)),
       "hx_matmul_q_cpu_v2: group_size must be 0 (one scale per row) or positive and even, "
       "got 3"),
      (dict(dtype="int8", layout="plain", group_size=np.int64(0)),
       "hx_matmul_q_cpu_v2: expects f32[*b, m, k], s8[*b, k, n], f32[*b, k] -> f32[*b, m, n] "
       "for dtype int8, group_size 0, got f32[2,64], u8[64,16]"),
  ]
  for attrs, msg in cases:
    with pytest.raises(Exception, match="INVALID_ARGUMENT") as e:
      jax.jit(lambda x, q, s, a=attrs: call(x, q, s, **a))(x, q, s).block_until_ready()
    assert msg in str(e.value)


def test_python_wrapper_names_bad_operands():
  with pytest.raises(TypeError, match=r"hx_matmul_q_cpu_v2: no quantization format for values "
                                      r"float32\[4, 8\]"):
    native.matmul_q_native_v2(np.ones((1, 4), np.float32), np.ones((4, 8), np.float32),
                              np.ones((4,), np.float32))


@needs_native
def test_lowering_export_and_artifact_of_every_format():
  rng = np.random.default_rng(5)
  x = rng.standard_normal((3, 512)).astype(np.float32)
  for dtype, group in [(jnp.int4, None), (jnp.int4, 32), (jnp.float8_e4m3fn, 64),
                       (jnp.int8, 128)]:
    qw = hx.quantize(rng.standard_normal((512, 256)).astype(np.float32), dtype,
                     group_size=group)
    w64 = _dequantized64(qw.qvalue, qw.scale)
    assert "custom_call" not in jax.jit(hx.matmul_q).lower(x, qw).as_text()
    with hx.installed():
      assert "custom_call @hx_matmul_q_cpu_v2(" in jax.jit(hx.matmul_q).lower(x, qw).as_text()
      assert_matmul_close(jax.jit(hx.matmul_q)(x, qw), x, w64, extra=1)
      portable = hxe.export(hx.matmul_q)(x, qw)
      with hx.keep_native_cpu_calls():
        kept = hxe.export(hx.matmul_q)(x, qw)
    assert "custom_call" not in portable.mlir_module()
    assert "stablehlo.custom_call @hx_matmul_q_cpu_v2(" in kept.mlir_module()
    assert_matmul_close(hxe.deserialize(kept.serialize()).call(x, qw), x, w64, extra=1)


def _run(code: str, **env) -> subprocess.CompletedProcess:
  """Runs ``code`` in a fresh Python (the kernel's choice is made at import)."""
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                        text=True, env={**os.environ, **env}, timeout=300)


CHECK_IN_SUBPROCESS = """
    import numpy as np, jax, jax.numpy as jnp, hxmlir as hx
    from hxmlir import formats
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 512)).astype(np.float32)
    print(hx.cpu_kernel_info())
    for dtype, g in [(jnp.int4, 32), (jnp.int4, 10), (jnp.float8_e4m3fn, None), (jnp.int8, 16)]:
      qw = hx.quantize(rng.standard_normal((512, 320)).astype(np.float32), dtype, group_size=g)
      with hx.installed():
        text = jax.jit(hx.matmul_q).lower(x, qw).as_text()
        y = np.asarray(jax.jit(hx.matmul_q)(x, qw), np.float64)
      w = np.asarray(hx.dequantize(qw), np.float64)
      bound = 513 * 1.2e-7 / (1 - 513 * 1.2e-7) * (np.abs(x) @ np.abs(w))
      print('custom_call' in text, bool(np.all(np.abs(y - x @ w) <= bound)))
    """


@needs_native
@pytest.mark.parametrize("isa", [i for i in ("avx2", "generic") if i in INFO.supported_isas])
def test_forced_isa_in_a_fresh_process(isa):
  r = _run(CHECK_IN_SUBPROCESS, HXMLIR_CPU_ISA=isa)
  assert r.returncode == 0, r.stderr
  assert r.stdout.splitlines() == [
      f"native CPU kernel hx_matmul_q_cpu_v1 ({isa}; forced by $HXMLIR_CPU_ISA)",
      *["True True"] * 4]


def test_fallback_when_disabled():
  r = _run(CHECK_IN_SUBPROCESS, HXMLIR_DISABLE_NATIVE="1")
  assert r.returncode == 0, r.stderr
  assert r.stdout.splitlines() == [
      "StableHLO lowering (disabled by $HXMLIR_DISABLE_NATIVE=1)", *["False True"] * 4]


@pytest.mark.parametrize("dtype, g, target", [
    ("int8", None, "hx_matmul_q_cpu_v1"), ("int8", 128, "hx_matmul_q_cpu_v2"),
    ("int4", None, "hx_matmul_q_cpu_v2"), ("float8_e4m3fn", 32, "hx_matmul_q_cpu_v2")])
def test_kernel_line_names_the_target_of_the_format(dtype, g, target):
  # the demo's kernel line once named v1 for int4 weights, which never call it
  info = hx.cpu_kernel_info()
  line = info.describe(dtype, g)
  if info.active:
    assert line == f"native CPU kernel {target} ({info.isa}; {info.reason})"
  else:
    assert line == str(info)
