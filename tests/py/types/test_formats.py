"""Quantization formats: int8, int4 (two per byte), fp8 e4m3fn, per row or per
group, through quantize, dequantize, matmul_q, einsum, make_qarray/qarray_parts, grad,
vmap, scan, explicit sharding and shard_map.

Values are checked against an independent NumPy quantizer (float64 arithmetic on the same
f32 scale), products against float64 einsums of the dequantized weight (exact in float64)
within the f32 dot bound of ``numerics.py`` (``extra=2``: the scale and the conversion).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hx_testing import dense64 as _dense64
from jax.sharding import PartitionSpec as P
from numerics import assert_within, dot_bound

import hxmlir as hx

FORMATS = [(jnp.int8, None), (jnp.int8, 32), (jnp.int4, None), (jnp.int4, 32),
           (jnp.float8_e4m3fn, None), (jnp.float8_e4m3fn, 64)]
QMAX = {"int8": 127, "int4": 7, "float8_e4m3fn": 448}
IDS = [f"{np.dtype(d).name}-g{g}" for d, g in FORMATS]


def _w(shape, seed=0):
  rng = np.random.default_rng(seed)
  w = rng.standard_normal(shape) * rng.uniform(0.1, 3, (*shape[:-1], 1))
  return jnp.asarray(w, jnp.float32)


def _numpy_quantize(x, name, g):
  """float64 reference of absmax quantization: (dense values, f32 scales)."""
  x = np.asarray(x, np.float32)
  xg = x.reshape(*x.shape[:-1], -1, g) if g else x[..., None, :]
  amax = np.abs(xg).max(-1)
  s = (amax * np.float32(1 / QMAX[name])).astype(np.float32)
  div = np.where(s > 0, s, np.float32(1))[..., None]
  v = xg / div
  if name == "float8_e4m3fn":
    v = np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
  else:
    v = np.clip(np.round(v), -QMAX[name], QMAX[name])
  return v.reshape(x.shape), (s if g else s[..., 0])


@pytest.mark.parametrize("dtype, g", FORMATS, ids=IDS)
def test_quantize_matches_a_numpy_quantizer(dtype, g):
  x = _w((6, 128))
  q = hx.quantize(x, dtype, group_size=g)
  name = np.dtype(dtype).name
  prefix = {"int8": "q8", "int4": "q4", "float8_e4m3fn": "f8"}[name]
  assert str(jax.typeof(q)) == f"{prefix}[6,128{'' if g is None else f':g{g}'}]"
  v, s = _numpy_quantize(x, name, g)
  np.testing.assert_array_equal(np.asarray(hx.qarray_parts(q)[1]), s)
  v, s64 = np.asarray(v, np.float64), np.asarray(s, np.float64)
  want = (v.reshape(*s.shape, -1) * s64[..., None]).reshape(v.shape) if g else v * s64[..., None]
  np.testing.assert_array_equal(_dense64(q), want)
  # and dequantize computes it (one f32 product per element: exact or 1/2 ulp)
  assert_within(hx.dequantize(q), want, np.abs(want) * 2.0 ** -24)


def test_int4_pairs_layout_and_bytes():
  x = jnp.asarray(np.tile(np.arange(-7, 9, dtype=np.float32) % 15 - 7, (4, 8)))  # [4, 128]
  q = hx.quantize(x, jnp.int4)
  packed, s = hx.qarray_parts(q)
  assert packed.dtype == jnp.uint8 and packed.shape == (4, 64)
  vals = np.rint(np.asarray(x) / np.asarray(s)[:, None]).astype(np.int64)
  want = (vals[:, 0::2] & 0xF) | ((vals[:, 1::2] & 0xF) << 4)
  np.testing.assert_array_equal(np.asarray(packed), want)
  # half a byte per value at rest: a q4[4096, 4096:g128] is 8 MiB of values
  big = hx.quantize(jnp.ones((4096, 4096), jnp.float32), jnp.int4, group_size=128)
  vb, sb = hx.qarray_parts(big)
  assert vb.addressable_shards[0].data.on_device_size_in_bytes() <= 4096 * 4096 // 2
  assert sb.addressable_shards[0].data.on_device_size_in_bytes() == 4096 * 32 * 4


LAYOUTS = [
    ("mk,kn->mn", (5, 64), (64, 96)),            # [in, out]: groups along the free axis
    ("bsk,nk->bsn", (2, 3, 128), (48, 128)),     # [out, in]: groups along the contraction
    ("...k,nk->...n", (2, 3, 128), (48, 128)),
    ("hmk,hkn->hmn", (3, 5, 64), (3, 64, 64)),    # batched weights
    ("mk,kn->mn", (4, 128), (128, 64)),
    ("...ij,hjk->...ik", (2, 4, 32), (4, 32, 64)),  # stacked, summed over h
    ("bn,bn->b", (3, 128), (3, 128)),            # groups along a batch-paired contraction
    ("mj,jn->mjn", (5, 16), (16, 64)),           # the quantized axis free, j batch-like
]


@pytest.mark.parametrize("dtype, g", FORMATS, ids=IDS)
@pytest.mark.parametrize("sub, xshape, qshape", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_einsum_every_format_within_the_dot_bound(dtype, g, sub, xshape, qshape):
  if g is not None and qshape[-1] % g:
    pytest.skip(f"{qshape[-1]} is not a multiple of {g}")
  x = _w(xshape, 1)
  q = hx.quantize(_w(qshape), dtype, group_size=g)
  w64 = _dense64(q)
  want = np.einsum(sub, np.asarray(x, np.float64), w64)
  bound = dot_bound(sub, np.asarray(x), w64, extra=2)
  assert_within(hx.einsum(sub, x, q), want, bound)
  assert_within(jax.jit(hx.einsum, static_argnums=0)(sub, x, q), want, bound)


@pytest.mark.parametrize("dtype, g", FORMATS, ids=IDS)
def test_matmul_q_grads_and_vmap(dtype, g):
  x, w = _w((5, 64), 1), _w((64, 128))
  q = hx.quantize(w, dtype, group_size=g)
  w64 = _dense64(q)
  ct = np.asarray(_w((5, 128), 2))
  gx, gq = jax.grad(lambda x, q: jnp.sum(hx.matmul_q(x, q) * ct), argnums=(0, 1))(x, q)
  assert jax.typeof(gq) == jax.typeof(w)  # the tangent type is dense f32
  assert_within(gx, ct.astype(np.float64) @ w64.T, dot_bound("mn,kn->mk", ct, w64, extra=2))
  assert_within(gq, np.asarray(x, np.float64).T @ ct, dot_bound("mk,mn->kn", np.asarray(x), ct))
  # vmap: a stack of quantized weights, one op
  ws = jnp.stack([w, 2 * w])
  qs = jax.vmap(lambda w: hx.quantize(w, dtype, group_size=g), out_axes=hx.QArraySpec())(ws)
  assert str(jax.typeof(qs)).endswith(f"[2,64,128{'' if g is None else f':g{g}'}]")
  ys = jax.vmap(hx.matmul_q, in_axes=(None, hx.QArraySpec()), axis_size=2)(x, qs)
  for i in range(2):
    qi = hx.quantize(ws[i], dtype, group_size=g)
    np.testing.assert_array_equal(_dense64(qi), _dense64(qs)[i])
    assert_within(ys[i], np.asarray(x, np.float64) @ _dense64(qi),
                  dot_bound("mk,kn->mn", np.asarray(x), _dense64(qi), extra=2))
  # scan over the stack carries each format
  def step(c, qw):
    return c + hx.matmul_q(x, qw), None
  tot, _ = jax.lax.scan(step, jnp.zeros((5, 128)), qs, length=2)
  assert_within(tot, ys[0] + ys[1], np.abs(np.asarray(ys[0] + ys[1])) * 2.0 ** -23)


@pytest.mark.parametrize("dtype, g", FORMATS, ids=IDS)
def test_components_round_trip_and_scale_grad(dtype, g):
  q = hx.quantize(_w((4, 64)), dtype, group_size=g)
  v, s = hx.qarray_parts(q)
  q2 = jax.jit(hx.make_qarray)(v, s)
  assert jax.typeof(q2) == jax.typeof(q)
  for a, b in zip(hx.qarray_parts(q2), (v, s)):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
  # d/ds sum(ct * dequantize(make_qarray(v, s))) = sum of ct * values per row or group
  ct = _w((4, 64), 3)
  gs = jax.grad(lambda s: jnp.sum(hx.dequantize(hx.make_qarray(v, s)) * ct))(s)
  vals = _dense64(hx.make_qarray(v, jnp.ones_like(s)))
  terms = (np.asarray(ct, np.float64) * vals).reshape(*s.shape, -1)
  assert_within(gs, terms.sum(-1), 2 * 64 * 2.0 ** -24 * np.abs(terms).sum(-1))
  # qarray_parts differentiates back to the identity in s where the values are nonzero
  ds = jax.jvp(lambda s: hx.qarray_parts(hx.make_qarray(v, s))[1], (s,), (jnp.ones_like(s),))[1]
  assert_within(ds, np.ones(ds.shape), 2.0 ** -20)


@pytest.mark.parametrize("dtype, g", FORMATS, ids=IDS)
def test_nonfinite_rows_dequantize_to_nan_per_scale(dtype, g):
  x = np.array(_w((3, 1024)))
  x[1, 5] = np.nan
  x[2, 1000] = np.inf
  d = np.asarray(jax.jit(lambda x: hx.dequantize(hx.quantize(x, dtype, group_size=g)))(x))
  span = 1024 if g is None else g
  for r, c in ((1, 5), (2, 1000)):
    lo = c // span * span
    assert np.isnan(d[r, lo:lo + span]).all()
    assert np.isfinite(np.delete(d[r], np.s_[lo:lo + span])).all()
  assert np.isfinite(d[0]).all()


@pytest.mark.parametrize("dtype, g", [(jnp.int4, 32), (jnp.int4, None), (jnp.int8, 32)])
def test_mse_clipping_lowers_the_squared_error(dtype, g):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_t(3, (64, 256)), jnp.float32)  # heavy tails, as real weights
  err = {}
  for method in ("absmax", "mse"):
    q = hx.quantize(x, dtype, group_size=g, method=method)
    e = (_dense64(q) - np.asarray(x, np.float64)) ** 2
    err[method] = e.reshape(64, -1, g or 256).sum(-1)
  # per scale never worse (ratio 1 is absmax and is tried first), overall better
  assert np.all(err["mse"] <= err["absmax"] * (1 + 1e-6))
  if dtype == jnp.int4:  # at 4 bits clipping pays (at 8 bits it hardly ever does)
    assert err["mse"].sum() < 0.95 * err["absmax"].sum()


@pytest.mark.parametrize("dtype, g", [(jnp.int8, None), (jnp.int4, 32)], ids=["int8", "int4-g32"])
def test_mse_quantize_passes_hx_verify_installed(dtype, g):
  """The mse decomposition is plain StableHLO (it once squared with ``jnp.square``, which
  lowers to ``chlo.square`` and hx-verify rejected): installed, eagerly and under jit, it
  gives the values and scales it gives without installing."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_t(3, (16, 64)), jnp.float32)
  quantize = lambda x: hx.quantize(x, dtype, group_size=g, method="mse")
  want = [np.asarray(c) for c in hx.qarray_parts(quantize(x))]
  with hx.installed():
    for got in (quantize(x), jax.jit(quantize)(x)):
      for c, w in zip(hx.qarray_parts(got), want):
        np.testing.assert_array_equal(np.asarray(c), w)


@pytest.mark.parametrize("call, msg", [
    (lambda: hx.quantize(jnp.ones((64, 100)), jnp.int4, group_size=32),
     r"q4\[64,100:g32\]: the last axis \(100\) is not a multiple of the group size 32"),
    (lambda: hx.quantize(jnp.ones((4, 5)), jnp.int4),
     r"q4\[4,5\]: int4 packs 2 values per byte: the last axis \(5\) must be even"),
    (lambda: hx.quantize(jnp.ones((4, 6)), jnp.int4, group_size=3),
     r"q4\[4,6:g3\]: int4 packs 2 values per byte: the group size must be even"),
    (lambda: hx.quantize(jnp.ones((4, 6)), jnp.int16), r"no quantization format for dtype"),
    (lambda: hx.quantize(jnp.ones((4, 6)), method="l1"), r"method must be one of"),
    (lambda: hx.make_qarray(jnp.zeros((4, 6), jnp.int8), jnp.ones((4, 4))),
     r"expects qvalue: i8\[\*l, n\] and scale: f32\[\*l\], got i8\[4,6\], f32\[4,4\]"),
])
def test_format_errors_name_the_type(call, msg):
  with pytest.raises((TypeError, ValueError), match=msg):
    call()


def test_group_sharding_is_checked_by_the_type(on_mesh):
  x = _w((8, 128))
  # 4 groups of 32 over i x j = 8 devices: a shard would hold half a group
  xs = jax.device_put(x, P(None, ("i", "j")))
  with pytest.raises(TypeError, match=r"q4\[8,128@\(i,j\):g32\] sharded over mesh axis "
                     r"'i'=4, 'j'=2: 4 groups of 32 cannot be split 8 ways"):
    jax.jit(lambda x: hx.quantize(x, jnp.int4, group_size=32)).trace(xs)
  with pytest.raises(TypeError, match=r"2 groups of 64 cannot be split 4 ways"):
    hx.quantize(jax.device_put(x, P(None, "i")), jnp.int8, group_size=64)


@pytest.mark.parametrize("dtype, g", [(jnp.int4, 32), (jnp.int8, 16), (jnp.float8_e4m3fn, 32)])
def test_aligned_group_sharding_gives_the_unsharded_numbers(on_mesh, dtype, g):
  w, x = _w((8, 128)), _w((5, 128), 1)
  ref = hx.quantize(w, dtype, group_size=g)
  for spec in (P("i", None), P(None, "i"), P("j", "i")):
    ws = jax.device_put(w, spec)
    q = jax.jit(lambda w: hx.quantize(w, dtype, group_size=g))(ws)
    assert jax.typeof(hx.qarray_parts(q)[1]).sharding.spec == P(*spec)
    for a, b in zip(hx.qarray_parts(q), hx.qarray_parts(ref)):
      np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(hx.dequantize(q)), np.asarray(hx.dequantize(ref)))
    if spec[1] is None:  # on Explicit axes the contraction ("mk,nk->mn" over k) must be unsharded
      y = jax.jit(lambda x, q: hx.einsum("mk,nk->mn", x, q))(x, q)
      w64 = _dense64(ref)
      assert_within(y, np.asarray(x, np.float64) @ w64.T,
                    dot_bound("mk,nk->mn", np.asarray(x), w64, extra=2))


def test_shard_map_takes_every_format(on_mesh):
  from jax import shard_map
  w = _w((8, 128))
  for dtype, g in FORMATS:
    q = jax.device_put(hx.quantize(w, dtype, group_size=g), P("i"))
    f = jax.jit(shard_map(hx.dequantize, in_specs=hx.QArrayP(P("i")), out_specs=P("i")))
    np.testing.assert_array_equal(np.asarray(f(q)), np.asarray(hx.dequantize(q)))


@pytest.mark.parametrize("dtype, g", FORMATS, ids=IDS)
@pytest.mark.parametrize("sub, xshape, qshape", [
    ("mk,kn->mn", (3, 256), (256, 512)),        # walks the quantized axis: groups, bytes
    ("bsk,nk->bsn", (2, 3, 256), (512, 256)),   # walks the rows: partial sums per group
    ("mk,kn->mn", (40, 256), (256, 512)),
], ids=["in_out", "out_in", "in_out_m40"])
def test_large_weights_are_walked_in_blocks_installed_or_not(dtype, g, sub, xshape, qshape):
  x = _w(xshape, 1)
  q = hx.quantize(_w(qshape), dtype, group_size=g)
  w64 = _dense64(q)
  want = np.einsum(sub, np.asarray(x, np.float64), w64)
  bound = dot_bound(sub, np.asarray(x), w64, extra=2)
  f = jax.jit(lambda x, q: hx.einsum(sub, x, q))
  assert_within(f(x, q), want, bound)
  with hx.installed():  # the native CPU kernel takes int8 per-row weights only
    assert_within(jax.jit(lambda x, q: hx.einsum(sub, x, q))(x, q), want, bound)


@pytest.mark.parametrize("sub", ["mk,kn->mn", "mk,nk->mn"])
def test_int4_matmul_never_widens_the_weight(sub):
  """XLA's compiled temporary memory for a q4[4096, 4096:g128] weight: at most 1/8 of the
  64 MiB f32 weight (measured: about 2 MiB, one block)."""
  q = jax.eval_shape(lambda w: hx.quantize(w, jnp.int4, group_size=128),
                     jax.ShapeDtypeStruct((4096, 4096), jnp.float32))
  x = jax.ShapeDtypeStruct((4, 4096), jnp.float32)
  f = jax.jit(lambda x, q: hx.einsum(sub, x, q))
  temp = f.lower(x, q).compile().memory_analysis().temp_size_in_bytes
  assert temp <= 4096 * 4096 * 4 // 8, temp


def test_export_round_trips_every_format_in_a_fresh_process(tmp_path):
  import subprocess
  import sys
  import textwrap

  from hxmlir import export as hxe
  x, xo = _w((2, 128), 1), _w((2, 3, 128), 2)
  qs = [hx.quantize(_w((128, 64), 3 + i), d, group_size=g) for i, (d, g) in enumerate(FORMATS)]
  qo = hx.quantize(_w((48, 128), 9), jnp.int4, group_size=32)   # [out, in], groups along in
  def f(x, xo, qo, *qs):
    return (hx.einsum("bsk,nk->bsn", xo, qo), *(hx.matmul_q(x, q) for q in qs),
            hx.quantize(x, jnp.int4, group_size=32, method="mse"))
  exp = hxe.export(jax.jit(f), platforms=("cpu", "cuda", "tpu"))(x, xo, qo, *qs)
  assert exp.signature().startswith("(f32[2,128], f32[2,3,128], q4[48,128:g32], q8[128,64], "
                                    "q8[128,64:g32], q4[128,64], q4[128,64:g32], f8[128,64], "
                                    "f8[128,64:g64]) -> (")
  (tmp_path / "f.hxa").write_bytes(bytes(exp.serialize()))
  comps = {"x": x, "xo": xo, "qo_v": qo.qvalue, "qo_s": qo.scale}
  for i, q in enumerate(qs):
    comps[f"q{i}_v"], comps[f"q{i}_s"] = (np.asarray(c).view(np.uint8) if c.dtype.itemsize == 1
                                          else c for c in hx.qarray_parts(q))
  np.savez(tmp_path / "in.npz", **comps)
  script = textwrap.dedent("""
      import sys, numpy as np, hxmlir.export as hxe, hxmlir as hx
      d = sys.argv[1]
      exp = hxe.deserialize(open(d + "/f.hxa", "rb").read())
      a = np.load(d + "/in.npz")
      qs = []
      for i, ty in enumerate(exp.in_types[3:]):
        vt = ty.lo_ty()[0].dtype
        qs.append(hx.QArray(a[f"q{i}_v"].view(vt), a[f"q{i}_s"]))
      outs = exp.call(a["x"], a["xo"], hx.QArray(a["qo_v"], a["qo_s"]), *qs)
      q = outs[-1]
      np.savez(d + "/out.npz", *[np.asarray(o) for o in outs[:-1]],
               qv=np.asarray(q.qvalue), qs=np.asarray(q.scale))
  """)
  res = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                       text=True, timeout=300, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin"})
  assert res.returncode == 0, res.stderr[-2000:]
  got = np.load(tmp_path / "out.npz")
  want = exp.call(x, xo, qo, *qs)
  for i, w in enumerate(want[:-1]):
    np.testing.assert_array_equal(got[f"arr_{i}"], np.asarray(w))  # exact: the same program
  np.testing.assert_array_equal(got["qv"], np.asarray(want[-1].qvalue))
  np.testing.assert_array_equal(got["qs"], np.asarray(want[-1].scale))


@pytest.mark.parametrize("text", ["q8[64,128]", "q8[64,128:g32]", "q4[64,128]",
                                  "q4[64,128:g32]", "f8[64,128]", "f8[64,128:g64]"])
def test_type_text_and_descriptors_know_every_format(text):
  from hxmlir.types import typedesc, typestr
  ty = typestr.parse_type(text)
  assert typestr.type_str(ty) == text
  assert typedesc.parse(typedesc.describe(ty)) == ty
  dtype = {"q8": jnp.int8, "q4": jnp.int4, "f8": jnp.float8_e4m3fn}[text[:2]]
  g = int(text.split(":g")[1][:-1]) if ":g" in text else None
  assert jax.typeof(hx.quantize(jnp.ones((64, 128)), dtype, group_size=g)) == ty


@pytest.mark.parametrize("text", ["q4[64,16:g8]", "f8[64,16:g8]"])
def test_cli_exports_and_runs_every_format(tmp_path, capsys, text):
  """``hxmlir export --arg 'f8[64,16:g8]'`` then ``hxmlir run`` on an .npz written with
  np.savez (which stores float8 components as raw bytes): the values of hx.matmul_q."""
  from hxmlir.tools import cli
  (tmp_path / "layer.py").write_text("import hxmlir as hx\n"
                                     "def dense(x, w):\n  return hx.matmul_q(x, w)\n")
  hxa, inp, out = tmp_path / "d.hxa", tmp_path / "in.npz", tmp_path / "out.npz"
  assert cli.main(["export", f"{tmp_path}/layer.py:dense", "--arg", "f32[2,64]",
                   "--arg", text, "-o", str(hxa)]) == 0
  dtype = jnp.int4 if text.startswith("q4") else jnp.float8_e4m3fn
  x, q = _w((2, 64), 1), hx.quantize(_w((64, 16)), dtype, group_size=8)
  np.savez(inp, **{"a0": np.asarray(x), "a1.qvalue": np.asarray(q.qvalue),
                   "a1.scale": np.asarray(q.scale)})
  assert cli.main(["run", str(hxa), "--inputs", str(inp), "--output", str(out)]) == 0, \
      capsys.readouterr().err
  np.testing.assert_array_equal(np.load(out)["a0"], np.asarray(jax.jit(hx.matmul_q)(x, q)))


def test_pallas_blocks_take_other_formats():
  # was refused ("Pallas blocks take q8 values with per-row scales only"); every format
  # is an operand now (tests/py/types/test_pallas_hi.py tests each one)
  from jax.experimental import pallas as pl

  def kernel(x_ref, q_ref, o_ref):
    o_ref[...] = hx.matmul_q(x_ref[...], q_ref[...])
  q = hx.quantize(_w((64, 32)), jnp.int4, group_size=32)
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 32), jnp.float32),
                        in_specs=[pl.BlockSpec((8, 64), lambda i: (0, 0)),
                                  pl.BlockSpec((64, 32), lambda i: (0, 0))],
                        out_specs=pl.BlockSpec((8, 32), lambda i: (0, 0)), grid=(1,),
                        interpret=True)
  x = _w((8, 64))
  dense = np.asarray(hx.dequantize(q))  # exact: int4 values times f32 scales
  assert_within(np.asarray(call(x, q)), np.asarray(x, np.float64) @ dense.astype(np.float64),
                dot_bound("mk,kn->mn", np.asarray(x), dense, extra=1))


@pytest.mark.parametrize("axis_type", [jax.sharding.AxisType.Explicit, jax.sharding.AxisType.Auto])
def test_placing_a_value_so_a_shard_splits_a_group_is_a_type_error_on_every_mesh(axis_type):
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices")
  mesh = jax.make_mesh((4, 2), ("i", "j"), axis_types=(axis_type,) * 2)
  q = hx.quantize(_w((8, 128)), jnp.int4, group_size=32)
  msg = r"q4\[8,128:g32\] sharded over mesh axis 'i'=4, 'j'=2: 4 groups of 32 cannot be split"
  s = jax.sharding.NamedSharding(mesh, P(None, ("i", "j")))
  with pytest.raises(TypeError, match=msg):
    jax.device_put(q, s)
  if axis_type == jax.sharding.AxisType.Auto:  # (on Explicit axes JAX's constraint asserts)
    with jax.set_mesh(mesh), pytest.raises(TypeError, match=r"4 groups of 32 cannot be split 8"):
      jax.jit(lambda q: jax.lax.with_sharding_constraint(q, P(None, ("i", "j")))).lower(q)
  ok = jax.device_put(q, jax.sharding.NamedSharding(mesh, P("i", "j")))  # whole groups
  assert_within(hx.dequantize(ok), hx.dequantize(q), 0)


@pytest.mark.parametrize("g", [np.int64(16), np.int32(16), 16])
def test_numpy_group_sizes_are_group_sizes(g):
  # a NumPy integer once reached a cached lowering and broke later calls with Python ints
  w = _w((4, 64))
  q = hx.quantize(w, jnp.int4, group_size=g)
  assert str(jax.typeof(q)) == "q4[4,64:g16]" and type(jax.typeof(q).group) is int
  again = hx.quantize(w, jnp.int4, group_size=16)
  assert all(np.array_equal(a, b) for a, b in zip(hx.qarray_parts(q), hx.qarray_parts(again)))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("fmt, g", [(jnp.int8, None), (jnp.int4, 32), (jnp.float8_e4m3fn, None)])
def test_half_precision_weights_quantize_as_their_exact_f32(dtype, fmt, g):
  w = _w((8, 64)).astype(dtype)
  want = hx.quantize(w.astype(jnp.float32), fmt, group_size=g)
  for got in (hx.quantize(w, fmt, group_size=g),
              jax.jit(lambda w: hx.quantize(w, fmt, group_size=g))(w)):
    assert jax.typeof(got) == jax.typeof(want)
    for a, b in zip(hx.qarray_parts(got), hx.qarray_parts(want)):
      np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


@pytest.mark.parametrize("fmt, g, prefix", [(jnp.int4, 32, "q4"), (jnp.float8_e4m3fn, None, "f8"),
                                            (jnp.int8, None, "q8")])
def test_messages_name_the_format(fmt, g, prefix):
  q = hx.quantize(_w((64, 32)), fmt, group_size=g)
  with pytest.raises(TypeError, match=rf"sums the quantized axis 'k' of the {prefix} operand"):
    hx.einsum("ij,jk->i", _w((3, 64)), q)
  with pytest.raises(TypeError, match=r"one quantized operand \(q8, q4, f8, u4o, q8o, q5_0, "
                                      r"q5_1, iq4_nl, q4_k, q5_k, q6_k, q2_k, q3_k or iq4_xs\)"):
    hx.einsum("ij,jk->ik", _w((3, 64)), _w((64, 32)))


# --- the table: a per-row scale is one group of n; messages list the table -------------

@pytest.mark.parametrize("name", ["int8", "int4", "uint4_f16"])
def test_a_per_row_scale_is_one_group_of_n(name):
  # formats' helpers treat per-row scales f32[*lead] as groups of n: viewed [*lead, 1]
  # (as_groups), the same dense numbers as a scale of one group of n, and the transpose
  # (sum_per_scale) is that group's sum; the scale's per-axis entries drop the last one
  from hxmlir import formats
  f = formats.FORMATS[name]
  rng = np.random.default_rng(3)
  lead, n = (2, 3), 8
  v = jnp.asarray(rng.integers(*f.value_range, (*lead, n), endpoint=True).astype(np.int8))
  stored = formats.store(v, f)
  s = jnp.asarray(rng.uniform(0.5, 2, lead).astype(f.scale_dtype))
  o = s * -3 if f.offset else None
  dense = formats.decode(stored, s, o)
  one_group = formats.decode(stored, formats.as_groups(s, dense.shape),
                             None if o is None else formats.as_groups(o, dense.shape))
  want = np.asarray(v, np.float64) * np.asarray(s, np.float64)[..., None] + (
      0 if o is None else np.asarray(o, np.float64)[..., None])
  np.testing.assert_array_equal(np.asarray(dense), want.astype(np.float32))
  np.testing.assert_array_equal(np.asarray(one_group), np.asarray(dense))
  assert formats.as_groups(s, dense.shape).shape == (*lead, 1)
  assert formats.group_size(n, None) == n and formats.group_size(n, 4) == 4
  t = jnp.asarray(rng.standard_normal((*lead, n)).astype(np.float32))
  np.testing.assert_array_equal(np.asarray(formats.sum_per_scale(t, None)),
                                np.asarray(formats.sum_per_scale(t, n))[..., 0])
  for g in (None, 4):
    np.testing.assert_array_equal(
        np.asarray(formats.merge_groups(formats.split_groups(t, g), g)), np.asarray(t))
  assert formats.scale_parts(("i", None, "j"), None) == ("i", None)
  assert formats.scale_parts(("i", None, "j"), 4) == ("i", None, "j")
  assert formats.scale_shape((*lead, n), None) == lead
  assert formats.scale_shape((*lead, n), 4) == (*lead, 2)
  assert (formats.group_attribute(None), formats.group_attribute(4)) == (0, 4)


def test_messages_list_the_formats_of_the_table(monkeypatch):
  # the messages that list the formats read the table: a format added to it is listed
  # with no other edit (hx.make_qarray's message, the schema's)
  import dataclasses

  from hxmlir import formats
  from hxmlir.lowering import schema
  text = formats.components_text("*l")
  for f in formats.FORMATS.values():
    assert f"{f.prefix}: {f.mlir}[*l, n" in text
  assert "q8: i8[*l, n] values, f32 or f16 scales;" in text
  assert "q4: ui8[*l, n/2] int4 pairs, f32 or f16 scales;" in text
  assert "u4o: ui8[*l, n/2] uint4 pairs, f32 or f16 scales and offsets;" in text
  assert "; scales [*l] per row or [*l, n/g] per group of g; " in text
  # then the block formats, each with its words per block and its per-block scales
  assert text.endswith("; iq4_xs: ui16[*l, n/256, 67] IQ4_XS blocks, f16 scales [*l, n/256]")
  assert "q4_k: ui16[*l, n/256, 70] Q4_K blocks, f16 scales and offsets [*l, n/256]" in text
  assert formats.components_text("*b, k", where=lambda f: "kn" in f.pallas) == (
      "q8: i8[*b, k, n] values, f32 scales; q4: ui8[*b, k, n/2] int4 pairs, f32 scales; "
      "f8: f8E4M3FN[*b, k, n] values, f32 scales; scales [*b, k] per row or [*b, k, n/g] "
      "per group of g")
  assert formats.prefix_names(lambda f: f.offset) == ["u4o", "q8o", "q5_1", "q4_k", "q5_k",
                                                       "q2_k"]
  int2 = dataclasses.replace(formats.INT4, name="int2", prefix="q2", value_dtype=np.dtype(
      ml_dtypes.int2), pack=4, qmax=1, layout="int2_quads_v1")
  monkeypatch.setitem(formats.FORMATS, "int2", int2)
  assert "q2: ui8[*l, n/4] int2 values, 4 per byte, f32 scales" in formats.components_text()
  assert formats.prefixes() == ("q8, q4, f8, u4o, q8o, q5_0, q5_1, iq4_nl, q4_k, q5_k, "
                                "q6_k, q2_k, q3_k, iq4_xs or q2")
  with pytest.raises(TypeError, match=r"hx\.make_qarray expects .* got i32\[2,8\], f32\[2\]; "
                     r"convert the values .* q2: u8\[\*l, n/4\] int2 values, 4 per byte"):
    hx.make_qarray(np.zeros((2, 8), np.int32), np.ones(2, np.float32))
  got = schema.quantized_format(schema.TensorType((2, 8), "i32"), schema.TensorType((2,), "f32"))
  assert "q2: ui8[..., n/4] int2 values, 4 per byte" in got
