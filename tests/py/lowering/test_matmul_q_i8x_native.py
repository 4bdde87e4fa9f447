"""``hx_matmul_q_cpu_i8x_v1``: the integer-activation CPU kernel of the ``[out, in]`` layout.

Opt-in only (``hx.install(activations="int8")``). ``x: f32[m, k]`` is quantized per block
of ``B`` along ``k`` (``B = 32`` for weights with one scale per row or groups of a multiple
of 32, else the group), ``s_x = fl(amax / 127)``, ``qx = rint(fl(x / s_x))``; the kernel
computes, per block, ``fl(s_w s_x) * D + fl(o - c s_w) * fl(s_x Sq)`` with ``D = sum u qx``
exact in int32 (``u = v + c``: ``c`` = 128 int8, 8 int4, 0 uint4), ``Sq = sum qx``
(``csrc/matmul_q_i8x.h``).

Numbers, two ways:

- against float64 ``(s_x qx) @ (v s + o).T``, the same integer-activation semantics with
  ``qx`` computed here in numpy with the same f32 operations (so exactly the kernel's):
  a block's ``D`` is summed in parts (the lanes it is spread over), each converted
  exactly to f32 (below 2^24); each term has at most 3 roundings before it is added
  (``fl(s_w s_x)``, the product; or ``fl(o - c s_w)``, ``fl(s_x Sq)``, the product). On
  the super-block path (``m > 16`` or ``B != 32``, but not the panels) a lane's terms are
  added in sequence over its ``nsb <= nb / 16 + 4`` super-blocks (2 adds each), the 16 lanes as a tree (4): the
  error is at most ``gamma_{2 nsb + 7} * T``,
  ``T = sum_b (s_w s_x sum_{kk in b} |u qx| + |(o - c s_w) s_x Sq|)``. On the row path
  (``m <= 16``, ``B = 32``: the weight read in place) a lane gets one term per unit of 64
  stored bytes (``nu <= ceil(nb / 2)`` of them) and one offset term per 16 blocks (at most
  ``nu``), then 1 + 4 adds (the two accumulators, the tree of 16 lanes): at most
  ``gamma_{ceil(nb / 2) + 8} * T``. The panels (``m > 8``, groups of 32, f16 scales: GGUF's
  Q8_0, Q4_0, Q4_1; ``csrc/matmul_q_i8x_blocks.h``) evaluate ``fl(s_w s_x) D' + fl(o s_x) Sq``
  per block with ``D' = sum v qx`` (the values themselves), one sum per output over the
  ``ns = 8 ceil(k / 256)`` block slots (2 terms each, 2 roundings of their own): at most
  ``gamma_{2 ns + 2} * T'``, ``T' = sum_b (|s_w s_x| sum |v qx| + |o s_x Sq|)``. The tests
  take the largest of these (whichever path a call takes);
- against f32 activations (``hx_matmul_q_cpu_v3``): ``|s_x qx - x| <= s_x / 2`` per element
  (round to nearest; ``|x / s_x| <= 127`` needs no clipping), so the two differ by at most
  ``sum_b s_x / 2 * sum_{kk in b} |v s + o|`` plus the two kernels' own rounding bounds.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from numerics import TINY, assert_within, gamma
from test_matmul_q_formats_native import _with_isa
from test_matmul_q_nk_native import LANES, _components

import hxmlir as hx
import hxmlir.export as hxe
from hxmlir import formats
from hxmlir.lowering.matmul_q import cpu as native

INFO = hx.cpu_kernel_info()
needs_native = pytest.mark.skipif(not INFO.active, reason=f"native kernel inactive: {INFO}")
I8X = jax.jit(native.matmul_q_native_i8x)
V3 = jax.jit(native.matmul_q_native_v3)
NAMES = [n for n, f in formats.FORMATS.items() if f.value_dtype.name in native.I8X_DTYPES]
BIAS = {"int8": 128, "int4": 8, "uint4": 0}


def _values(fmt: formats.Format, q) -> np.ndarray:
  """The integer values of stored ``q`` (``[n, k / pack]``) as int64 ``[n, k]``."""
  if fmt.pack == 1:
    return np.asarray(q).astype(np.int64)
  b = np.asarray(q).astype(np.int64)
  u = np.stack([b & 15, b >> 4], axis=-1).reshape(b.shape[0], -1)
  return np.where(u >= 8, u - 16, u) if fmt.value_dtype.name == "int4" else u


def _block(group: int | None) -> int:
  return 32 if group is None or group % 32 == 0 else group


def _quantize(x: np.ndarray, b: int):
  """``x: f32[m, k]`` -> (``qx: int64[m, nb * b]`` zero-padded, ``s_x: f32[m, nb]``), as the
  kernel quantizes it (module docstring)."""
  m, k = x.shape
  nb = -(-k // b)
  xb = np.zeros((m, nb * b), np.float32)
  xb[:, :k] = x
  xb = xb.reshape(m, nb, b)
  sx = (np.max(np.abs(xb), axis=-1) / np.float32(127)).astype(np.float32)
  with np.errstate(divide="ignore", invalid="ignore"):
    v = np.where(sx[..., None] > 0, xb / sx[..., None], np.float32(0)).astype(np.float32)
  qx = np.rint(np.clip(v, -127, 127)).astype(np.int64)
  return qx.reshape(m, nb * b), sx


def _expected(x, q, s, o, fmt, group):
  """(float64 ``y`` of the integer-activation semantics, its rounding bound, the f32
  activations' difference bound ``sum_b s_x / 2 * sum |w|``)."""
  n = q.shape[0]
  k = x.shape[-1]
  b = _block(group)
  qx, sx = _quantize(x.reshape(-1, k), b)
  nb = sx.shape[1]
  per = k if group is None else group
  s64 = np.repeat(np.asarray(s, np.float64).reshape(n, -1), per, axis=1)
  o64 = (np.zeros_like(s64) if o is None
         else np.repeat(np.asarray(o, np.float64).reshape(n, -1), per, axis=1))
  v = _values(fmt, q).astype(np.float64)
  c = BIAS[fmt.value_dtype.name]

  def blocks(a):  # [rows, k] -> [rows, nb, b], zero-padded
    out = np.zeros((a.shape[0], nb * b))
    out[:, :k] = a
    return out.reshape(a.shape[0], nb, b)

  qb = qx.reshape(-1, nb, b).astype(np.float64)
  sw_b = blocks(s64)[:, :, 0] if b <= per else None  # one scale per block (B divides g)
  assert sw_b is not None
  ow_b = blocks(o64)[:, :, 0]
  # sum |u qx| per block: at least |D| of every part of a block the kernel sums apart
  d = np.einsum("mbe,nbe->mnb", np.abs(qb), blocks(np.abs(v + c)))
  sq = qb.sum(-1)  # [m, nb]
  y = np.einsum("mb,mbe,nbe->mn", sx.astype(np.float64), qb, blocks(v * s64 + o64))
  terms = (np.abs(sw_b[None] * sx[:, None] * d)
           + np.abs((ow_b - c * sw_b)[None] * (sx * sq)[:, None]))
  nsb = nb // 16 + 4  # super-blocks: whole ones of 16 blocks and at most 4 narrower
  depth = max(2 * nsb + 7, -(-nb // 2) + 8)  # the super-block path's, the row path's
  # the panels': the values themselves (no c) and the offset's term o s_x Sq
  dv = np.einsum("mbe,nbe->mnb", np.abs(qb), blocks(np.abs(v)))
  terms_p = np.abs(sw_b[None] * sx[:, None] * dv) + np.abs(ow_b[None] * (sx * sq)[:, None])
  ns = 8 * -(-k // 256)
  bound = (np.maximum(gamma(depth) * terms.sum(-1), gamma(2 * ns + 2) * terms_p.sum(-1))
           + 2 * nb * TINY)
  dx = np.einsum("mb,nb->mn", sx.astype(np.float64) / 2, blocks(np.abs(v * s64 + o64)).sum(-1))
  shape = (*x.shape[:-1], n)
  return y.reshape(shape), bound.reshape(shape), dx.reshape(shape)


# (x's leading shape, n, k): m in {1, 3, 17, 128} and a rank-3 x; n odd; k with 15 (8 + 4
# + 2 + 1: every narrow super-block), 18 (16 + 2), 16 (one whole super-block, the last row
# read to its end) and 6 blocks of 32, k = 90 (groups of 2 or 3, a block of 26 left over
# per row), k = 333 (odd: int8 only).
SHAPES = [((1,), 67, 480), ((3,), 33, 96), ((17,), 41, 192), ((128,), 29, 576),
          ((2, 3), 35, 96), ((6,), 13, 90), ((17,), 19, 333), ((5,), 7, 512)]
GROUPS = [None, 32, 16, "small"]  # small: 3 (one value per byte) or 2 (pairs)


def _group(fmt, group):
  return (2 if fmt.pack == 2 else 3) if group == "small" else group


def _cases(name, group, shapes=SHAPES, salt="i8x"):
  """``(fmt, g, x, operands, (vs, oo))`` of random weights of format ``name`` with groups
  ``group`` and random ``x`` for each ``(lead, n, k)`` of ``shapes`` the format takes."""
  fmt = formats.FORMATS[name]
  g = _group(fmt, group)
  rng = np.random.default_rng(abs(hash((name, str(group), salt))) % 2**32)
  for lead, n, k in shapes:
    if k % fmt.pack or (g is not None and k % g):
      continue
    q, s, o, vs, oo = _components(rng, fmt, n, k, g)
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    yield fmt, g, x, (x, q, s) if o is None else (x, q, s, o), (vs, oo)


def _check_every_isa(name, fmt, g, x, args, vs, oo):
  """The kernel on every ISA this machine runs within its bound of the float64 contract,
  and within the quantization bound of the f32-activation kernel."""
  want, bound, dx = _expected(x, args[1], args[2], args[3] if len(args) > 3 else None, fmt, g)
  y_f32 = V3(*args)
  k = x.shape[-1]
  x64 = np.asarray(x, np.float64)
  f32_bound = gamma(k + LANES + 2) * (np.abs(x64) @ (np.abs(vs) + np.abs(oo)).T) + k * TINY
  for isa in INFO.supported_isas:
    y = _with_isa(isa, I8X, *args)
    what = f"{name} g{g} {isa} x{list(x.shape)} W[{args[1].shape[0]},{k}]: "
    assert y.shape == want.shape and y.dtype == np.float32
    assert_within(y, want, bound, what)
    assert_within(y, y_f32, dx + bound + f32_bound, what + "vs f32 activations: ")


@needs_native
@pytest.mark.parametrize("group", GROUPS, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_kernel_matches_float64_integer_activations_every_isa(name, group):
  for fmt, g, x, args, (vs, oo) in _cases(name, group):
    _check_every_isa(name, fmt, g, x, args, vs, oo)


# The row path (x of at most 16 rows, B = 32: the weight read in place; tiles of 4 rows)
# and its neighbour m = 17 (super-blocks): k = 576 (18 blocks: 4.5 units of 4-bit values, 9 of int8: a
# partial chunk, the row's last unit half full), 1056 (33 blocks), 330 and 333 (a last
# block of 10 or 13 values: one scale per row only), 64 (2 blocks); x of rank 3 (m = 4);
# m = 6 (tiles of 4 + 2), 8, 9, 16 and 17 (from 9 rows groups of 32 with f16 scales take
# the panels).
ROW_SHAPES = [((1,), 37, 576), ((2,), 19, 1056), ((3,), 23, 576), ((1,), 29, 1056),
              ((3,), 21, 330), ((1,), 19, 333), ((2, 2), 13, 576), ((6,), 11, 576),
              ((1,), 300, 64), ((8,), 7, 576), ((9,), 7, 576), ((16,), 7, 576),
              ((17,), 7, 576)]


@needs_native
@pytest.mark.parametrize("group", [None, 32, 64], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_row_path_matches_float64_every_isa(name, group):
  for fmt, g, x, args, (vs, oo) in _cases(name, group, ROW_SHAPES, "rows"):
    x[..., :32] *= 100  # blocks of very different s_x (x is the operand itself)
    _check_every_isa(name, fmt, g, x, args, vs, oo)


@needs_native
def test_activations_are_really_quantized():
  """The kernel's result is off the f32-activation value by more than its rounding bound
  (x is quantized, not used as f32), and within the quantization bound."""
  fmt = formats.FORMATS["uint4_f16"]
  fmt_, g, x, args, _ = next(_cases("uint4_f16", 32))
  want, bound, _ = _expected(x, args[1], args[2], args[3], fmt, g)
  y = np.asarray(I8X(*args), np.float64)
  y_f32 = np.asarray(V3(*args), np.float64)
  assert np.max(np.abs(y - y_f32) - bound) > 0
  assert_within(y, want, bound)


@needs_native
@pytest.mark.parametrize("rows", [4, 17], ids=["row_path", "super_blocks"])
def test_nan_in_a_block_makes_its_row_nan_and_zeros_give_zeros(rows):
  fmt_, g, x, args, _ = next(_cases("int8_f16", 32))
  x = np.tile(x, (rows, 1))
  x[1, 5] = np.nan
  x[2, 40] = np.inf
  x[3] = 0
  y = np.asarray(I8X(x, *args[1:]))
  assert np.isnan(y[1]).all() and np.isnan(y[2]).all()
  assert np.isfinite(y[0]).all() and (y[3] == 0).all()


@needs_native
def test_kernel_refuses_fp8_and_bad_operands():
  x = np.ones((3, 64), np.float32)
  q = np.zeros((5, 64), np.uint8).view(np.dtype("float8_e4m3fn"))
  out = jax.ShapeDtypeStruct((3, 5), np.float32)
  attrs = dict(dtype="float8_e4m3fn", layout="plain", group_size=np.int64(32),
               scale_dtype="f32", offset=False)
  with pytest.raises(Exception, match="hx_matmul_q_cpu_i8x_v1: dtype float8_e4m3fn has no "
                                      "integer-activation kernel"):
    jax.ffi.ffi_call(native.TARGET_I8X, out)(x, q, np.ones((5, 2), np.float32), **attrs)
  with pytest.raises(Exception, match=r"hx_matmul_q_cpu_i8x_v1: expects f32\[\*b, k\], s8\[n, k\]"):
    jax.ffi.ffi_call(native.TARGET_I8X, out)(
        x, np.zeros((5, 64), np.int8), np.ones((5, 3), np.float32), **(attrs | dict(
            dtype="int8")))


def _calls(text):
  return re.findall(r"stablehlo\.custom_call @(\w+)\(", text)


@needs_native
@pytest.mark.parametrize("name", [n for n, f in formats.FORMATS.items() if not f.block])
def test_only_the_opt_in_emits_the_i8x_target(name):
  """Installed by default (and with ``activations="f32"``), ``hx.einsum("bmk,nk->bmn")``
  calls hx_matmul_q_cpu_v3, never the integer-activation target; with
  ``activations="int8"`` the formats it takes call hx_matmul_q_cpu_i8x_v1 for ``x`` of
  any number of rows with groups of 32 (a decode step's single row too: the kernel's row
  path; fp8 keeps v3)."""
  fmt = formats.FORMATS[name]
  rng = np.random.default_rng(5)
  q, s, o, _, _ = _components(rng, fmt, 260, 288, 32)
  w = hx.make_qarray(q, s, o) if o is not None else hx.make_qarray(q, s)
  rows = 16
  x = rng.standard_normal((2, rows // 2, 288)).astype(np.float32)
  f = jax.jit(lambda x, w: hx.einsum("bmk,nk->bmn", x, w))
  for kw in ({}, {"activations": "f32"}):
    with hx.installed(**kw):
      assert _calls(f.lower(x, w).as_text()) == ["hx_matmul_q_cpu_v3"]
  with hx.installed(activations="int8"):
    text = f.lower(x, w).as_text()
    y = f(x, w)
    takes = name in NAMES
    for fewer in (x[:1, :1], np.concatenate([x[0], x[1, :-1]])[None]):  # 1, rows - 1 rows
      assert _calls(f.lower(fewer, w).as_text()) == [
          "hx_matmul_q_cpu_i8x_v1" if takes else "hx_matmul_q_cpu_v3"]
  assert _calls(text) == ["hx_matmul_q_cpu_i8x_v1" if takes else "hx_matmul_q_cpu_v3"]
  if takes:  # the jitted call ran the opt-in kernel: its numbers
    want, bound, _ = _expected(x.reshape(rows, 288), q, s, o, fmt, 32)
    assert_within(np.asarray(y).reshape(rows, 260), want, bound)
  with hx.installed(activations="int8", kernels=False):
    assert _calls(f.lower(x, w).as_text()) == []


@needs_native
def test_few_rows_take_the_i8x_target_only_with_blocks_of_32():
  """With groups that are not a multiple of 32 (x's block: the group) the kernel re-lays the
  weight out on every call: ``x`` of fewer than ``I8X_MIN_ROWS`` rows keeps
  hx_matmul_q_cpu_v3; with blocks of 32 (per row, groups of 32 or 64) every ``x`` takes the
  integer-activation target."""
  fmt = formats.FORMATS["int8"]
  rng = np.random.default_rng(7)
  f = jax.jit(lambda x, w: hx.einsum("mk,nk->mn", x, w))
  for group, rows, want in ((16, 1, "v3"), (16, native.I8X_MIN_ROWS - 1, "v3"),
                            (16, native.I8X_MIN_ROWS, "i8x_v1"), (None, 1, "i8x_v1"),
                            (32, 1, "i8x_v1"), (64, 2, "i8x_v1")):
    assert native.i8x_takes(fmt, group, rows) == (want == "i8x_v1")
    q, s, _, _, _ = _components(rng, fmt, 260, 256, group)
    x = rng.standard_normal((rows, 256)).astype(np.float32)
    with hx.installed(activations="int8"):
      assert _calls(f.lower(x, hx.make_qarray(q, s)).as_text()) == [f"hx_matmul_q_cpu_{want}"]


@needs_native
def test_export_keeps_stablehlo_unless_asked():
  """An export lowered with ``activations="int8"`` is portable StableHLO, as for the other
  native kernels; with ``hx.keep_native_cpu_calls()`` it calls the versioned target,
  which ``jax.export`` accepts (registered) and which runs after deserialization."""
  fmt = formats.FORMATS["uint4_f16"]
  rng = np.random.default_rng(11)
  q, s, o, _, _ = _components(rng, fmt, 260, 288, 32)  # above the kernels' size bound
  x = rng.standard_normal((native.I8X_MIN_ROWS, 288)).astype(np.float32)
  w = hx.make_qarray(q, s, o)
  f = lambda x, w: hx.einsum("mk,nk->mn", x, w)
  with hx.installed(activations="int8"):
    portable = hxe.export(f)(x, w)
    with hx.keep_native_cpu_calls():
      kept = hxe.export(f)(x, w)
  assert "custom_call" not in portable.mlir_module()
  assert _calls(kept.mlir_module()) == ["hx_matmul_q_cpu_i8x_v1"]
  want, bound, _ = _expected(x, q, s, o, fmt, 32)
  assert_within(hxe.deserialize(kept.serialize()).call(x, w), want, bound)


def test_native_call_problem_knows_the_target():
  assert native.TARGET_I8X in native.TARGETS
  msg = native.native_call_problem(["hx_matmul_q_cpu_i8x_v3"])
  assert msg.startswith("it calls the native CPU kernel hx_matmul_q_cpu_i8x_v3, which this "
                        "hxmlir does not have")


def test_install_refuses_an_unknown_activation_dtype():
  with pytest.raises(ValueError, match="activations='int4' is not one of 'f32', 'int8'"):
    hx.installed(activations="int4")
