"""The Pallas kernel of the checkpoint layout ``W[out, in]`` on GPU/TPU.

``matmul_q_nk_pallas`` (``lowering/matmul_q/pallas/``, kernel ``hx_matmul_q_nk_v1``):
``hx.einsum("...k,nk->...n", x, w)`` with groups along the contraction ``k``, every
format of :data:`hxmlir.formats.FORMATS` (int8, int4 and uint4 pairs, fp8; f32 or f16
scales; offsets). Numbers: Pallas interpret mode (both flavours: Triton's masked loads,
Mosaic's unmasked edge blocks, which interpret mode fills with NaN or the integer
minimum, so a stale value that reached the sum would show) against float64 NumPy from
the stored components (nibbles decoded by hand, :func:`_dense64`). The
kernel dequantizes each tile, ``w = q·s + o`` (two roundings, one without an offset),
then sums ``x·w`` (one more): each term carries at most 3 roundings beyond the sum's
relative to ``|x|·(|q·s| + |o|)`` (``_mags64``), hence ``dot_bound(..., extra=3)`` on those
magnitudes. No GPU or TPU is lent to this project: the Triton and Mosaic flavours are
lowered and exported for ``cuda`` and ``tpu`` on CPU, never run.
"""

from __future__ import annotations

import hx_testing
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from numerics import assert_within, dot_bound
from test_matmul_q_kernels import _custom_calls
from test_matmul_q_pallas import _check_export_errors

import hxmlir as hx
from hxmlir import export as hxe
from hxmlir import formats, targets
from hxmlir.lowering.matmul_q import pallas as mqp

NK = "hx_matmul_q_nk_v1"
# the formats the Pallas [out, in] kernel takes (the block formats have their own kernel,
# test_matmul_q_pallas_blocks.py)
FORMATS = [(name, g) for name, f in formats.FORMATS.items()
           if "nk" in f.pallas and not f.block for g in (None, 32)]
IDS = [f"{name}-g{g}" for name, g in FORMATS]

# Every format on a batched weight, ragged m, n and k (k against block_k, a multiple of
# the group): 5 k chunks (Mosaic: 2.5 of 128 stored bytes), 2 column blocks, a batch of 2
# (rank-3 x and weight); and a decode row (m = 1) with the default blocks, one k chunk
# reaching past k, for a few formats (each kind of component once).
SHAPE = ((2,), 5, 320, 136, (16, 128, 64))
DECODE = [("int8", None), ("uint4_f16", 32), ("float8_e4m3fn", 32), ("int8_offset_f16", None)]


def _terms64(w) -> tuple[np.ndarray, np.ndarray]:
  """``(q·s, o)`` of ``w`` elementwise in float64 from its components (int4/uint4 nibbles
  decoded by hand; int8 and fp8 values are exact in float64; ``o`` 0 without offsets)."""
  parts = [np.asarray(c) for c in hx.qarray_parts(w)]
  f = jax.typeof(w).format
  vals = hx_testing.nibbles(parts[0], f.signed) if f.pack == 2 else parts[0].astype(np.float64)
  s, *o = (p.astype(np.float64) if p.ndim == vals.ndim else p.astype(np.float64)[..., None]
           for p in parts[1:])
  g = vals.shape[-1] // s.shape[-1]
  rep = lambda a: np.repeat(a, g, axis=-1)  # noqa: E731
  return vals * rep(s), rep(o[0]) if o else np.zeros(vals.shape)


def _dense64(w) -> np.ndarray:
  """The float64 value ``q·s + o`` of ``w``."""
  qs, o = _terms64(w)
  return qs + o


def _mags64(w) -> np.ndarray:
  """``|q·s| + |o|``: the magnitude each product term of a matmul with ``w`` can carry."""
  qs, o = _terms64(w)
  return np.abs(qs) + np.abs(o)


def _weight(name, g, b, n, k, seed):
  """A weight ``W[*b, n, k]`` of format ``name`` (groups of ``g`` along ``k``), ``x``-free."""
  rng = np.random.default_rng(seed)
  w, *_ = hx_testing.any_format(rng, (*b, n, k), name, g)
  return w


def _check(y, x, w, subscripts="...mk,...nk->...mn"):
  assert np.asarray(y).dtype == np.float32
  x64 = np.asarray(x, np.float64)
  assert_within(y, np.einsum(subscripts, x64, _dense64(w)),
                dot_bound(subscripts, x, _mags64(w), extra=3))


@pytest.mark.parametrize("backend", mqp.BACKENDS)
@pytest.mark.parametrize("name,g,b,m,k,n,blocks",
                         [(*fmt, *SHAPE) for fmt in FORMATS] +
                         [(*fmt, (), 1, 96, 72, None) for fmt in DECODE],
                         ids=[*IDS, *(f"decode-{n}-g{g}" for n, g in DECODE)])
def test_kernel_every_format_in_interpret_mode(backend, name, g, b, m, k, n, blocks):
  w = _weight(name, g, b, n, k, seed=m * 1000 + k)
  x = np.random.default_rng(k).standard_normal((*b, m, k)).astype(np.float32)
  if blocks is not None and backend == "mosaic_tpu":
    blocks = (8, 128, 128 * formats.FORMATS[name].pack)
  f = jax.jit(lambda x, *c: mqp.matmul_q_nk_pallas(x, *c, backend=backend, interpret=True,
                                                   blocks=blocks))
  _check(f(x, *hx.qarray_parts(w)), x, w)


@pytest.mark.parametrize("backend", mqp.BACKENDS)
@pytest.mark.parametrize("g,k,block_k", [(32, 288, 128),   # 4 groups a chunk, last chunk 1
                                         (128, 384, 128),  # one group a chunk
                                         (256, 768, 128),  # chunk inside a group
                                         (512, 1536, 256)])
def test_group_scales_across_chunks(backend, g, k, block_k):
  w = _weight("uint4_f16", g, (), 40, k, seed=g)
  x = np.random.default_rng(g).standard_normal((3, k)).astype(np.float32)
  bm = 16 if backend == "triton" else 8
  if backend == "mosaic_tpu":
    block_k = max(block_k, 256)
  if g % block_k and block_k % g:
    pytest.skip("no tile")
  y = mqp.matmul_q_nk_pallas(x, *hx.qarray_parts(w), backend=backend, interpret=True,
                             blocks=(bm, 128, block_k))
  _check(y, x, w)


@pytest.mark.parametrize("backend", mqp.BACKENDS)
@pytest.mark.parametrize("name", ["int4_f16", "uint4_f16"])
def test_pairs_layout_and_full_range_in_the_kernel(backend, name):
  # x = I, unit scales, zero offsets: y is W.T exactly (each sum is one product by 1).
  # Q4_0's -8 and Q4_1's 15 included; byte j holds elements 2j (low) and 2j + 1 (high).
  f = formats.FORMATS[name]
  lo, hi = f.value_range
  vals = np.arange(lo, hi + 1, dtype=np.int8)
  dense = vals[np.arange(34 * 64) % len(vals)].reshape(34, 64)
  packed = np.asarray(formats.pack_int4(jnp.asarray(dense)))
  if not f.signed:
    assert formats.pack_int4(jnp.asarray([[15, 0]], jnp.int8)).tolist() == [[0x0F]]
  ones = np.ones((34, 2), np.float16)
  parts = (packed, ones) + ((np.zeros_like(ones),) if f.offset else ())
  y = mqp.matmul_q_nk_pallas(np.eye(64, dtype=np.float32), *parts, backend=backend,
                             interpret=True)
  np.testing.assert_array_equal(np.asarray(y), dense.T.astype(np.float32))


def test_default_blocks_hold_whole_groups_along_k():
  assert mqp.default_blocks_nk(1, 4096, 4096, "triton", "int4", 32) == (16, 128, 128)
  assert mqp.default_blocks_nk(1, 4096, 4096, "mosaic_tpu", "int4", 32) == (8, 128, 256)
  assert mqp.default_blocks_nk(256, 576, 49152, "mosaic_tpu", "int8_f16", 32) == (128, 128, 128)
  assert mqp.default_blocks_nk(1, 4800, 64, "triton", "int8", 96) == (16, 128, 32)
  assert mqp.default_blocks_nk(1, 4800, 64, "mosaic_tpu", "int8", 96) == (8, 128, 384)
  assert mqp.default_blocks_nk(1, 4800, 64, "triton", "int8", 24) is None   # 8 | 24 only
  assert mqp.default_blocks_nk(1, 3000, 64, "mosaic_tpu", "int8", 1000) is None


def test_kernel_errors_name_the_problem():
  w = _weight("int4", 32, (), 8, 64, seed=1)
  q, s = hx.qarray_parts(w)
  x = np.ones((2, 64), np.float32)
  with pytest.raises(ValueError, match=r"block_k = 48 must be a multiple or a divisor of the "
                     r"group size 32"):
    mqp.matmul_q_nk_pallas(x, q, s, backend="mosaic_tpu", interpret=True, blocks=(8, 128, 48))
  with pytest.raises(ValueError, match=r"Triton blocks must be powers of two >= 16, got "
                     r"\(block_m, block_n, block_k\) = \(8, 128, 32\)"):
    mqp.matmul_q_nk_pallas(x, q, s, backend="triton", interpret=True, blocks=(8, 128, 32))
  with pytest.raises(ValueError, match="no triton block_k holds whole groups of 24"):
    mqp.matmul_q_nk_pallas(np.ones((2, 96), np.float32),
                           *hx.qarray_parts(_weight("int8", 24, (), 8, 96, seed=2)),
                           backend="triton", interpret=True)
  with pytest.raises(TypeError, match=r"got f32\[2,64\], ui8\[8,32\], f32\[8,3\]"):
    mqp.matmul_q_nk_pallas(x, q, np.ones((8, 3), np.float32), backend="triton")
  uq, us, uo = hx.qarray_parts(_weight("uint4", 32, (), 8, 64, seed=3))
  with pytest.raises(TypeError, match=r"got f32\[2,64\], ui8\[8,32\], f32\[8,2\], "
                     r"f32\[8,1\]$"):
    mqp.matmul_q_nk_pallas(x, uq, us, uo[:, :1], backend="triton")  # offsets unlike scales
  with pytest.raises(ValueError, match="unknown backend 'cuda'"):
    mqp.matmul_q_nk_pallas(x, q, s, backend="cuda")


# --- the cuda/rocm/tpu lowering rules, export and hx-check-export ---------------

def test_nk_kernel_is_registered_per_platform():
  ks = {(k.target, k.ir_name): k for k in targets.registered_kernels()}
  assert ks[(targets.TRITON, NK)].platforms == ("cuda", "rocm")
  assert ks[(targets.MOSAIC_TPU, NK)].platforms == ("tpu",)
  assert {ks[(t, NK)].owner for t in (targets.TRITON, targets.MOSAIC_TPU)} == {"hxmlir"}
  # every format has an [out, in] kernel (the block formats hx_matmul_q_nk_blocks_v1)
  assert all("nk" in f.pallas for f in formats.FORMATS.values())
  assert [f.name for f in formats.FORMATS.values() if "kn" in f.pallas] == \
      ["int8", "int4", "float8_e4m3fn"]
  assert set(formats.WEIGHT_LAYOUTS) == {"kn", "nk"}


def _einsum(x, w):
  return hx.einsum("...k,nk->...n", x, w)


@pytest.mark.parametrize("name,g", FORMATS, ids=IDS)
def test_export_every_format_calls_the_kernel_and_round_trips(name, g):
  # f32[2, 3, k] x W[n, k]: x's leading dims collapsed into m by the rule
  w = _weight(name, g, (), 40, 64, seed=7)
  x = np.random.default_rng(8).standard_normal((2, 3, 64)).astype(np.float32)
  with hx.installed():  # export lowering runs hx-check-export, which must accept it
    exp = hxe.export(_einsum, platforms=["cpu", "cuda", "tpu"])(x, w)
  text = exp.mlir_module()
  assert text.count('stablehlo.composite "hx.matmul_q"') == 3  # one per platform branch
  # tpu: the formats Mosaic compiles (mqp.mosaic_compiles), else the decomposition
  tpu = [(targets.MOSAIC_TPU, NK)] if mqp.mosaic_compiles(formats.FORMATS[name], g) else []
  assert sorted(_custom_calls(text)) == [(targets.TRITON, NK), *tpu]
  assert f'name = "{NK}"' in text and (f'kernel_name = "{NK}"' in text) == bool(tpu)
  assert _check_export_errors(text) == []
  _check(hxe.deserialize(exp.serialize()).call(x, w), x, w, "bsk,nk->bsn")  # the CPU branch
  plain = hxe.export(_einsum, platforms=["cuda", "tpu"])(x, w).mlir_module()
  assert _custom_calls(plain) == []  # not installed: the reference decomposition


def test_plain_jax_export_accepts_the_kernel_while_installed_and_check_export_refuses_others():
  w = _weight("uint4_f16", 32, (), 16, 64, seed=9)
  x = np.ones((1, 64), np.float32)
  with hx.installed():
    text = jax.export.export(jax.jit(_einsum), platforms=["cuda", "tpu"])(x, w).mlir_module()
  assert sorted(_custom_calls(text)) == [(targets.TRITON, NK)]  # tpu: not a Mosaic format
  assert _check_export_errors(text) == []
  errors = _check_export_errors(text.replace(NK, "hx_matmul_q_nk_v9"))
  assert errors and all("hx_matmul_q_nk_v9" in str(e) for e in errors)
  with pytest.raises(ValueError, match="no compatibility guarantees"):  # not installed
    jax.export.export(jax.jit(lambda x, *c: mqp.matmul_q_nk_pallas(x, *c, backend="triton")),
                      platforms=["cuda"])(x, *hx.qarray_parts(w))


def test_batched_weights_and_rank_1_x_call_the_kernel():
  wb = _weight("int8_offset_f16", 32, (2,), 24, 64, seed=10)
  w = _weight("int4_f16", None, (), 24, 64, seed=11)
  xb = np.random.default_rng(12).standard_normal((2, 3, 64)).astype(np.float32)
  x1 = xb[0, 0]

  def f(xb, x1, wb, w):
    return hx.einsum("bmk,bnk->bmn", xb, wb), hx.einsum("k,nk->n", x1, w)
  with hx.installed():
    exp = hxe.export(f, platforms=["cpu", "cuda", "tpu"])(xb, x1, wb, w)
  # tpu: neither format compiles with Mosaic (mqp.mosaic_compiles): the decomposition
  assert sorted(_custom_calls(exp.mlir_module())) == [(targets.TRITON, NK)] * 2
  yb, y1 = hxe.deserialize(exp.serialize()).call(xb, x1, wb, w)
  _check(yb, xb, wb)
  _check(y1, x1, w, "k,nk->n")
  kn = hxe.export(lambda x, w: hx.einsum("kb,nk->bn", x, w), platforms=["cuda"])
  with hx.installed():  # x contracted on its first axis: neither kernel's layout
    assert _custom_calls(kn(np.ones((64, 2), np.float32), w).mlir_module()) == []


def test_kn_layout_of_offset_and_f16_scale_formats_keeps_the_reference():
  # Format.pallas: f16 scales and offsets have the [out, in] kernel only
  w = _weight("uint4", 32, (), 64, 64, seed=13)  # used as Q[k, n] (quantized along n)
  with hx.installed():
    text = hxe.export(hx.matmul_q, platforms=["cuda", "tpu"])(
        np.ones((2, 64), np.float32), w).mlir_module()
  assert _custom_calls(text) == []


def test_kernels_in_interpret_mode_agree_with_the_rule_on_cpu():
  # the kernel computes what the CPU branch (reference) does, within the same bound
  w = _weight("int8_f16", 32, (), 130, 96, seed=14)
  x = np.random.default_rng(15).standard_normal((3, 96)).astype(np.float32)
  ref = jax.jit(_einsum)(x, w)
  for backend in mqp.BACKENDS:
    got = mqp.matmul_q_nk_pallas(x, *hx.qarray_parts(w), backend=backend, interpret=True)
    assert_within(got, ref, 2 * dot_bound("mk,nk->mn", x, _mags64(w), extra=3))


# --- programs over several devices ---------------------------------------------

@pytest.mark.parametrize("name,g", [("uint4_f16", 32), ("int8", None)])
def test_sharded_export_runs_the_kernel_per_shard(mesh, name, g):
  from hx_testing import kernel_calls as _kernel_calls
  w = _weight(name, g, (), 64, 96, seed=16)  # W[n, k]: columns n on j
  x = np.random.default_rng(17).integers(-4, 5, (8, 96)).astype(np.float32)
  with jax.set_mesh(mesh), hx.installed():
    args = (jax.device_put(x, NamedSharding(mesh, P("i", None))),
            jax.device_put(w, NamedSharding(mesh, P("j", None))))
    exp = hxe.export(jax.jit(_einsum), platforms=["cpu", "cuda", "tpu"])(*args)
    got = hxe.deserialize(exp.serialize()).call(*args)
  text = exp.mlir_module()
  mosaic = mqp.mosaic_compiles(formats.FORMATS[name], g)
  assert sorted(_kernel_calls(text)) == [(targets.TRITON, True),
                                         *([(targets.MOSAIC_TPU, True)] if mosaic else [])]
  assert sorted(_custom_calls(text)) == [(targets.TRITON, NK),
                                         *([(targets.MOSAIC_TPU, NK)] if mosaic else [])]
  assert 'manual_axes={"i", "j"}' in text
  assert jax.typeof(got).sharding.spec == P("i", "j")
  _check(got, x, w, "mk,nk->mn")


# --- benchmarks/matmul_q_gpu.py --layout nk on a machine without a GPU ------------

def test_gpu_benchmark_nk_layout_dry_runs_and_interprets_on_cpu(capsys):
  import pathlib
  import runpy
  bench = runpy.run_path(str(pathlib.Path(__file__).parents[3] / "benchmarks" /
                             "matmul_q_gpu.py"))
  assert [bench["parse_shape"](t) for t in bench["NK_SHAPES"]] == [
      (576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576), (4096, 4096)]
  assert bench["main"](["--dry-run", "--layout", "nk", "--m", "1", "--shapes", "72x64"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert [line.split()[:2] for line in out] == [
      ["q8:g32,f16", "q8[72,64:g32,f16]"], ["q4:g32,f16", "q4[72,64:g32,f16]"],
      ["u4o:g32,f16", "u4o[72,64:g32,f16]"]]
  assert all(f"kernel {NK}; hx.einsum (installed) calls {NK}" in line for line in out)
  assert bench["main"](["--interpret", "--layout", "nk", "--m", "2", "--shapes", "40x64",
                        "--rounds", "1", "--formats", "uint4_f16:g32"]) == 0
  rows = [line.split() for line in capsys.readouterr().out.splitlines()[3:]]
  assert [(r[4], r[5]) for r in rows] == [("-", "bf16"), ("-", "f32"), ("u4o:g32,f16", "pallas"),
                                          ("u4o:g32,f16", "hx")]
  # the error column: the f32 products (kernel, rule) well inside bf16's rounding (2^-9)
  assert all(float(r[-1]) < float(rows[0][-1]) / 16 for r in rows[2:])
  for argv, msg in [(["--layout", "nk", "--shapes", "64x100"],
                     "the in axis of weight 64x100 (100) is not a multiple of the group size "
                     "of q8:g32,f16"),
                    (["--shapes", "64x64"], "--shapes is for --layout nk")]:
    with pytest.raises(SystemExit):
      bench["main"](argv)
    assert msg in capsys.readouterr().err
