"""``hx_matmul_q_cpu_v3``: the native CPU kernel of the checkpoint layout ``[out, in]``.

``hx.einsum("...k,nk->...n", x, w)`` with ``w: W[n, k]`` quantized along ``k`` (the
contraction axis), every format of :mod:`hxmlir.formats` (int8, int4 and uint4 pairs,
fp8; f32 or f16 scales; offsets), one scale per row or per group of ``g``
(``csrc/matmul_q_nk.h``).

Numbers: against float64 ``x @ (v * s + o).T`` from the same components. Every term
``x_i (v_i s + o)`` passes through at most ``k + W + 2`` f32 roundings (``W <= 16`` vector
lanes added at the end): a group's partial sum in a lane, the scale, the sum over groups,
the lanes' sum, the elements past the last whole vector, the offset term ``o * sum x``;
or, in "blocks", the decode ``fl(fl(v s) + o)`` and the dot), so the error is at most
``gamma_{k+18} * |x| @ (|v s| + |o|).T + k * tiny`` (``tests/py/numerics.py``). Reading a
neighbour's scale or nibble is off by about one term and fails it
(:func:`test_bound_catches_a_wrong_group`).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from numerics import TINY, assert_within, gamma
from test_matmul_q_formats_native import _with_isa

import hxmlir as hx
from hxmlir import formats
from hxmlir.lowering.matmul_q import cpu as native

INFO = hx.cpu_kernel_info()
needs_native = pytest.mark.skipif(not INFO.active, reason=f"native kernel inactive: {INFO}")
V3 = jax.jit(native.matmul_q_native_v3)
LANES = 16  # the widest vector (AVX-512's f32 lanes): the lanes' sum's roundings


def _components(rng, fmt: formats.Format, n: int, k: int, group: int | None):
  """Random stored values (every value of the format's range), scales and offsets of a
  weight ``W[n, k]`` in ``fmt``, and the exact float64 ``v * s`` and ``o`` per element."""
  if fmt.integer:
    lo, hi = fmt.value_range
    v = rng.integers(int(lo), int(hi) + 1, (n, k))
    u = (v & 15).astype(np.uint8)
    q = (u[:, 0::2] | (u[:, 1::2] << 4)) if fmt.pack == 2 else v.astype(np.int8)
  else:
    q = (rng.standard_normal((n, k)) * 8).astype(ml_dtypes.float8_e4m3fn)
    v = q.astype(np.float64)
  shape = formats.scale_shape((n, k), group)
  s = (rng.random(shape) + 0.25).astype(fmt.scale_dtype)
  o = rng.standard_normal(shape).astype(fmt.scale_dtype) if fmt.offset else None
  per = k if group is None else group

  def expand(a):
    return np.repeat(np.asarray(a, np.float64).reshape(n, -1), per, axis=1)

  vs = v.astype(np.float64) * expand(s)
  return q, s, o, vs, (expand(o) if o is not None else np.zeros_like(vs))


def _check(y, x, vs, o, what=""):
  """``y`` within the module docstring's bound of ``x @ (vs + o).T`` in float64."""
  x64 = np.asarray(x, np.float64)
  k = x64.shape[-1]
  want = x64 @ (vs + o).T
  bound = gamma(k + LANES + 2) * (np.abs(x64) @ (np.abs(vs) + np.abs(o)).T) + k * TINY
  assert_within(np.asarray(y), want, bound, what)


# (x's leading shape, n, k): m in {1, 3, 4, 5, 17, 64} and a rank-3 x; n odd (not a
# multiple of any vector width); k a multiple of 96 (groups of 32, 3 and 2) but not of 64
# (a vector and chunk remainder per row), and k = 90 (per row and small groups only).
# m = 1 (and AVX2's m = 5, a tile of 4 rows and one) take the one-row path: k = 576, 1056, 64
# and 480 give it 18, 33, 2 and 15 groups of 32 (scales past the last whole vector of 16, one
# past it, fewer than one vector).
SHAPES = [((1,), 67, 480), ((1,), 37, 576), ((1,), 21, 1056), ((1,), 9, 64),
          ((3,), 33, 96), ((4,), 45, 672), ((5,), 19, 288), ((17,), 41, 192), ((64,), 23, 288),
          ((2, 3), 35, 96), ((6,), 13, 90)]
GROUPS = [None, 32, "small"]  # small: 3 (one value per byte) or 2 (pairs): no whole vector


def _group(fmt, group):
  return (2 if fmt.pack == 2 else 3) if group == "small" else group


@needs_native
@pytest.mark.parametrize("group", GROUPS, ids=str)
@pytest.mark.parametrize("name", list(formats.FORMATS))
def test_kernel_matches_float64_every_format_shape_and_isa(name, group):
  fmt = formats.FORMATS[name]
  g = _group(fmt, group)
  rng = np.random.default_rng(abs(hash((name, str(group)))) % 2**32)
  for lead, n, k in SHAPES:
    if g is not None and k % g:
      continue
    q, s, o, vs, oo = _components(rng, fmt, n, k, g)
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    args = (x, q, s) if o is None else (x, q, s, o)
    for isa in INFO.supported_isas:
      y = _with_isa(isa, V3, *args)
      assert y.shape == (*lead, n)
      _check(y, x, vs, oo, f"{name} g{g} {isa} x{list(x.shape)} W[{n},{k}]: ")


@needs_native
@pytest.mark.parametrize("name", ["int4_f16", "uint4_f16", "int8_offset"])
def test_bound_catches_a_wrong_group(name):
  """The bound is tight enough to fail a kernel that read the neighbouring group's scale
  and offset: the kernel's own result, checked against that wrong weight, fails."""
  fmt = formats.FORMATS[name]
  rng = np.random.default_rng(7)
  q, s, o, vs, oo = _components(rng, fmt, 37, 192, 32)
  x = rng.standard_normal((3, 192)).astype(np.float32)
  y = V3(x, q, s) if o is None else V3(x, q, s, o)
  _check(y, x, vs, oo)
  shift = np.roll(np.asarray(s, np.float64), 1, axis=1).repeat(32, axis=1)
  v = vs / np.asarray(s, np.float64).repeat(32, axis=1)
  with pytest.raises(AssertionError, match="error .* > bound"):
    _check(y, x, v * shift, np.roll(oo, 32, axis=1))


def _ffi(x, q, s, *o, **attrs):
  out = jax.ShapeDtypeStruct((*x.shape[:-1], q.shape[0]), jnp.float32)
  base = dict(dtype="int8", layout="plain", group_size=np.int64(32), scale_dtype="f32",
              offset=False)
  return jax.ffi.ffi_call(native.TARGET_V3, out)(x, q, s, *o, **(base | attrs))


@needs_native
@pytest.mark.parametrize("attrs,operands,message", [
    (dict(dtype="int5"), {}, "unknown dtype attribute 'int5'"),
    (dict(layout="int4_pairs_v1"), {}, "dtype int8 is stored in layout 'plain', got layout "
                                       "'int4_pairs_v1'"),
    (dict(dtype="int4", layout="int4_pairs_v1"), {},
     "expects f32[*b, k], u8[n, k / 2], f32[n, k / 32] -> f32[*b, n] for dtype int4"),
    (dict(scale_dtype="f16"), {}, "got f32[3,64], s8[5,64], f32[5,2]"),
    (dict(scale_dtype="bf16"), {}, "scale_dtype must be f32 or f16, got 'bf16'"),
    (dict(offset=True), {}, "offset=true expects the operand o after s, got 3 operands"),
    (dict(), {"o": True}, "offset=false expects no operand after s, got 4 operands"),
    (dict(group_size=np.int64(16)), {}, "for dtype int8, group_size 16, scale_dtype f32"),
    (dict(dtype="uint4", layout="uint4_pairs_v1", group_size=np.int64(3)), {},
     "group_size must be 0 (one scale per row) or positive and even, got 3"),
])
def test_kernel_refuses_operands_that_disagree_with_its_attributes(attrs, operands, message):
  x = np.ones((3, 64), np.float32)
  q = np.ones((5, 64), np.int8)
  s = np.ones((5, 2), np.float32)
  extra = (s,) if operands.get("o") else ()
  with pytest.raises(Exception, match=r"hx_matmul_q_cpu_v3: .*" + re.escape(message)):
    jax.block_until_ready(jax.jit(lambda *a: _ffi(*a, **attrs))(x, q, s, *extra))


def test_python_entry_refuses_components_of_no_format():
  x = jnp.ones((3, 64), jnp.float32)
  with pytest.raises(TypeError, match=r"hx_matmul_q_cpu_v3: no quantization format of a "
                                      r"weight \[n, k\] for values int16\[5, 64\]"):
    native.matmul_q_native_v3(x, jnp.ones((5, 64), jnp.int16), jnp.ones((5, 2), jnp.float32))
  with pytest.raises(TypeError, match=r"with scales float32\[5, 3\]: the scale's shape"):
    native.matmul_q_native_v3(x, jnp.ones((5, 64), jnp.int8), jnp.ones((5, 3), jnp.float32))


def _qarray(rng, name, n, k, group):
  fmt = formats.FORMATS[name]
  q, s, o, vs, oo = _components(rng, fmt, n, k, group)
  return hx.make_qarray(q, s, o) if o is not None else hx.make_qarray(q, s), vs, oo


@needs_native
@pytest.mark.parametrize("name", [n for n, f in formats.FORMATS.items() if not f.block])
def test_einsum_out_in_calls_v3_while_installed(name):
  """``hx.einsum("bmk,nk->bmn")`` (a weight above the size bound) lowers to one call of
  hx_matmul_q_cpu_v3 while installed, with the format's attributes, and gives the
  kernel's numbers; uninstalled, no custom call, the same numbers within the bound."""
  fmt = formats.FORMATS[name]
  rng = np.random.default_rng(3)
  w, vs, oo = _qarray(rng, name, 260, 288, 32)
  x = rng.standard_normal((2, 3, 288)).astype(np.float32)
  f = jax.jit(lambda x, w: hx.einsum("bmk,nk->bmn", x, w))
  with hx.installed():
    text = f.lower(x, w).as_text()
    y = f(x, w)
  calls = re.findall(r"stablehlo\.custom_call @(\w+)\(.*mhlo\.backend_config = \{([^}]*)\}", text)
  assert calls == [("hx_matmul_q_cpu_v3",
                    f'dtype = "{fmt.value_dtype.name}", group_size = 32 : i64, '
                    f'layout = "{fmt.layout}", offset = {str(fmt.offset).lower()}, '
                    f'scale_dtype = "{fmt.scale_mlir}"')]
  _check(y, x, vs, oo)
  assert "custom_call" not in f.lower(x, w).as_text()
  _check(f(x, w), x, vs, oo)


def test_format_table_says_native_cpu_takes_nk():
  assert all("nk" in f.native_cpu for f in formats.FORMATS.values())


@needs_native
def test_helpers_that_linger_between_calls_give_the_same_numbers():
  """A jitted chain of calls (a decode step's pattern: each call's helper thread lingers
  for the next call's blocks, csrc/matmul_q_parallel.h) gives bit for bit the numbers of
  the same chain with helpers that never linger, each within the bound of float64."""
  from hxmlir import _matmul_q_cpu as ext

  rng = np.random.default_rng(11)
  weights = [_qarray(rng, name, n, 576, 32)
             for name, n in (("uint4_f16", 960), ("int8", 576), ("int4", 1536), ("uint4", 576))]
  x = rng.standard_normal((1, 576)).astype(np.float32)
  x64 = rng.standard_normal((64, 576)).astype(np.float32)
  f = jax.jit(lambda x, ws: [hx.einsum("mk,nk->mn", x, w) for w in ws])
  before = ext.linger_us()
  try:
    runs = {}
    for linger in (0, 250, 0, 100_000):
      ext.set_linger_us(linger)
      ws = [w for w, _, _ in weights]
      with hx.installed():
        runs.setdefault(linger, []).append([np.asarray(y) for y in f(x, ws) + f(x64, ws)])
  finally:
    ext.set_linger_us(before)
  first = runs[0][0]
  for linger, rs in runs.items():
    for ys in rs:
      for a, b in zip(ys, first):
        np.testing.assert_array_equal(a, b, err_msg=f"linger {linger} us")
  for i, (_, vs, oo) in enumerate(weights):
    _check(first[i], x, vs, oo, f"m=1 weight {i}: ")
    _check(first[len(weights) + i], x64, vs, oo, f"m=64 weight {i}: ")
