"""The Pallas ``hx.matmul_q`` kernel on every quantization format.

``lowering/matmul_q/pallas/`` in Pallas interpret mode (both flavours: Triton's
masked loads, Mosaic's unmasked edge blocks, which interpret mode fills with NaN
for floats, so a stale fp8 value or group scale that reached the sum would show),
against the float64 product of ``x`` and the dequantized weight (``_dense64``: int4
nibbles unpacked by hand). Each term of the kernel's sum carries two roundings
(``x * s`` or ``q * s``, then the product), hence ``dot_bound(..., extra=2)``. No GPU
or TPU is lent to this project: the Triton and Mosaic lowerings are checked by
lowering and exporting for ``cuda`` and ``tpu`` on CPU, never run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hx_testing import dense64 as _dense64
from numerics import assert_within, dot_bound
from test_matmul_q_kernels import _custom_calls

import hxmlir as hx
from hxmlir import export as hxe
from hxmlir import formats, targets
from hxmlir.lowering.matmul_q import pallas as mqp

FORMATS = [(jnp.int8, None), (jnp.int4, None), (jnp.float8_e4m3fn, None),
           (jnp.int8, 16), (jnp.int4, 32), (jnp.float8_e4m3fn, 64), (jnp.int4, 256)]
IDS = [f"{jnp.dtype(d).name}-g{g}" for d, g in FORMATS]

# (batch, m, k, n, blocks (block_m, block_n, block_k) or None): ragged m, k, n (n
# ragged against block_n but a multiple of every g used with it); several row, column
# and k blocks; batch dims.
SHAPES = [
    ((), 1, 100, 256, None),
    ((), 5, 300, 768, None),             # 3 k chunks of 128, last one ragged
    ((2, 3), 3, 17, 512, None),
    ((), 20, 70, 1280, (16, 256, 32)),   # 2 row blocks, 5 column blocks, 3 k chunks
    ((2,), 16, 64, 256, (16, 128, 16)),  # exact multiples
]


def _data(dtype, g, b, m, k, n, seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((*b, m, k)).astype(np.float32)
  w = rng.standard_normal((*b, k, n)) * rng.uniform(0.1, 3, (*b, k, 1))
  qw = hx.quantize(jnp.asarray(w, jnp.float32), dtype, group_size=g)
  return x, qw


def _check(y, x, qw):
  w64 = _dense64(qw)
  assert np.asarray(y).dtype == np.float32
  assert_within(y, np.asarray(x, np.float64) @ w64,
                dot_bound("...mk,...kn->...mn", x, w64, extra=2))


@pytest.mark.parametrize("backend", mqp.BACKENDS)
@pytest.mark.parametrize("dtype,g", FORMATS, ids=IDS)
@pytest.mark.parametrize("b,m,k,n,blocks", SHAPES)
def test_kernel_every_format_in_interpret_mode(backend, dtype, g, b, m, k, n, blocks):
  x, qw = _data(dtype, g, b, m, k, n, seed=m * 1000 + k)
  if blocks is not None and backend == "mosaic_tpu":
    blocks = (8, *blocks[1:])
  f = jax.jit(lambda x, q, s: mqp.matmul_q_pallas(x, q, s, backend=backend, interpret=True,
                                                  blocks=blocks))
  _check(f(x, *hx.qarray_parts(qw)), x, qw)


@pytest.mark.parametrize("backend", mqp.BACKENDS)
@pytest.mark.parametrize("g,n,block_n", [(32, 288, 128),    # 4 groups a tile, last tile 1
                                         (64, 320, 128),    # g < block_n, ragged
                                         (128, 384, 128),   # one group a tile
                                         (256, 768, 128),   # tile inside a group
                                         (512, 1536, 256)])
def test_group_scales_across_tiles(backend, g, n, block_n):
  x, qw = _data(jnp.int4, g, (), 3, 200, n, seed=g)
  bm = 16 if backend == "triton" else 8
  y = mqp.matmul_q_pallas(x, *hx.qarray_parts(qw), backend=backend, interpret=True,
                          blocks=(bm, block_n, 64))
  _check(y, x, qw)


@pytest.mark.parametrize("backend", mqp.BACKENDS)
def test_int4_pairs_layout_in_the_kernel(backend):
  # x = I and unit scales: y is the weight exactly (each sum is one product by 1).
  # Byte 0x9F holds element 2j = 0xF (-1, low nibble) and 2j + 1 = 0x9 (-7, high nibble).
  dense = np.arange(-7, 8, dtype=np.int8)[np.arange(40 * 34) % 15].reshape(40, 34)
  packed = np.asarray(formats.pack_int4(jnp.asarray(dense)))
  assert formats.pack_int4(jnp.asarray([[-1, -7]], jnp.int8)).tolist() == [[0x9F]]
  y = mqp.matmul_q_pallas(np.eye(40, dtype=np.float32), packed, np.ones(40, np.float32),
                          backend=backend, interpret=True)
  np.testing.assert_array_equal(np.asarray(y), dense.astype(np.float32))


def test_default_blocks_fit_the_groups():
  assert mqp.default_blocks(1, 4096, 4096, "triton", "int4", 32) == (16, 128, 128)
  assert mqp.default_blocks(1, 4096, 4096, "mosaic_tpu", "int4", 32) == (8, 256, 128)
  assert mqp.default_blocks(1, 4096, 4096, "mosaic_tpu", "int8", 512) == (8, 128, 128)
  assert mqp.default_blocks(1, 4096, 4800, "triton", "int8", 96) == (16, 32, 128)
  assert mqp.default_blocks(1, 4096, 4800, "mosaic_tpu", "int8", 96) == (8, 384, 128)
  assert mqp.default_blocks(1, 4096, 4800, "mosaic_tpu", "int4", 6) == (8, 768, 128)
  assert mqp.default_blocks(1, 4096, 3000, "mosaic_tpu", "int8", 1000) is None
  assert mqp.default_blocks(1, 4096, 4800, "triton", "int8", 24) is None  # 8 | 24 only
  assert mqp.kernel_version(formats.INT8, None) == 1
  assert {mqp.kernel_version(f, g) for f, g in [(formats.INT4, None), (formats.FP8, None),
                                                (formats.INT8, 32)]} == {2}


def test_kernel_errors_name_the_problem():
  x, qw = _data(jnp.int4, 32, (), 2, 64, 128, seed=1)
  q, s = hx.qarray_parts(qw)
  with pytest.raises(ValueError, match=r"block_n = 48 must be a multiple or a divisor of the "
                     r"group size 32"):
    mqp.matmul_q_pallas(x, q, s, backend="mosaic_tpu", interpret=True, blocks=(8, 48, 64))
  _, q24 = _data(jnp.int8, 24, (), 2, 64, 96, seed=2)
  with pytest.raises(ValueError, match="no Triton block_n .* holds whole groups of 24"):
    mqp.matmul_q_pallas(x, *hx.qarray_parts(q24), backend="triton", interpret=True)
  with pytest.raises(TypeError, match=r"got f32\[2,64\], ui8\[64,64\], f32\[64,3\]"):
    mqp.matmul_q_pallas(x, q, np.ones((64, 3), np.float32), backend="triton")


# --- the cuda/rocm/tpu lowering rules, export and hx-check-export ---------------

def _check_export_errors(text: str) -> list:
  from hxmlir.passes import parsing
  from hxmlir.passes.base import Diagnostics
  from hxmlir.passes.check_export import CheckExportPass
  with parsing.make_context():
    module = parsing.parse_module(text, parsing.make_context(), "m.mlir")
    diags = Diagnostics()
    CheckExportPass().apply(module, diags)
  return diags.errors


def test_v2_is_registered_next_to_v1():
  ks = {(k.target, k.ir_name): k for k in targets.registered_kernels()}
  for v in (1, 2):
    assert ks[(targets.TRITON, f"hx_matmul_q_v{v}")].platforms == ("cuda", "rocm")
    assert ks[(targets.MOSAIC_TPU, f"hx_matmul_q_v{v}")].platforms == ("tpu",)
    assert ks[(targets.TRITON, f"hx_matmul_q_v{v}")].owner == "hxmlir"


@pytest.mark.parametrize("dtype,g", FORMATS, ids=IDS)
def test_export_every_format_keeps_the_kernel_and_round_trips(dtype, g):
  # f32[2, 3, k] @ Q[k, n]: leading dims collapsed into m by the rule
  x, qw = _data(dtype, g, (), 6, 40, 512, seed=7)
  x = x.reshape(2, 3, 40)
  name = f"hx_matmul_q_v{mqp.kernel_version(formats.lookup(dtype), g)}"
  with hx.installed():  # export lowering runs hx-check-export, which must accept it
    exp = hxe.export(hx.matmul_q, platforms=["cpu", "cuda", "tpu"])(x, qw)
  text = exp.mlir_module()
  assert text.count('stablehlo.composite "hx.matmul_q"') == 3  # one per platform branch
  # tpu: the formats Mosaic compiles (mqp.mosaic_compiles), else the decomposition
  tpu = [(targets.MOSAIC_TPU, name)] if mqp.mosaic_compiles(formats.lookup(dtype), g) else []
  assert sorted(_custom_calls(text)) == sorted([(targets.TRITON, name), *tpu])
  assert _check_export_errors(text) == []
  y = hxe.deserialize(exp.serialize()).call(x, qw)  # the CPU branch
  _check(y, x, qw)
  plain = hxe.export(hx.matmul_q, platforms=["cuda", "tpu"])(x, qw).mlir_module()
  assert _custom_calls(plain) == []  # not installed: the reference decomposition


def test_group_size_without_a_triton_tile_keeps_the_reference_on_gpu():
  x, qw = _data(jnp.int8, 6, (), 2, 40, 48, seed=3)
  with hx.installed():
    text = hxe.export(hx.matmul_q, platforms=["cuda", "tpu"])(x, qw).mlir_module()
  assert _custom_calls(text) == []  # and on TPU group scales take the decomposition too
  x, qw = _data(jnp.int8, None, (), 2, 40, 48, seed=3)
  with hx.installed():
    text = hxe.export(hx.matmul_q, platforms=["cuda", "tpu"])(x, qw).mlir_module()
  assert sorted(_custom_calls(text)) == [(targets.TRITON, "hx_matmul_q_v1"),
                                         (targets.MOSAIC_TPU, "hx_matmul_q_v1")]


def test_tpu_takes_the_formats_mosaic_compiles():
  # seen on a TPU v5e: int8 and fp8 per row compile; int4 pairs, group scales do not
  take = {(name, g) for name, f in formats.FORMATS.items() for g in (None, 32)
          if mqp.mosaic_compiles(f, g)}
  assert take == {("int8", None), ("float8_e4m3fn", None), *(
      (f.name, g) for f in formats.BLOCK_FORMATS for g in (None, 32))}


def test_out_in_layout_takes_its_own_kernel():
  # hx.einsum("...k,nk->...n"): groups along the contraction, the [out, in] kernel
  # (tests/py/lowering/test_matmul_q_pallas_nk.py), never this one
  x = np.ones((2, 64), np.float32)
  qw = hx.quantize(np.ones((48, 64), np.float32), jnp.int8)  # [out, in]
  with hx.installed():
    exp = hxe.export(lambda x, q: hx.einsum("mk,nk->mn", x, q), platforms=["cuda", "tpu"])(x, qw)
  assert sorted(_custom_calls(exp.mlir_module())) == [(targets.TRITON, "hx_matmul_q_nk_v1"),
                                                      (targets.MOSAIC_TPU, "hx_matmul_q_nk_v1")]


# --- benchmarks/matmul_q_gpu.py on a machine without a GPU ---------------------

def test_gpu_benchmark_parses_formats_and_dry_runs_on_cpu(capsys):
  import pathlib
  import runpy
  bench = runpy.run_path(str(pathlib.Path(__file__).parents[3] / "benchmarks" /
                             "matmul_q_gpu.py"))
  assert bench["parse_format"]("int4:g128") == ("int4", 128)
  assert bench["parse_format"]("fp8") == ("float8_e4m3fn", None)
  assert bench["main"](["--dry-run", "--m", "1", "--k", "64", "--n", "256",
                        "--formats", "int8", "int4:g32", "fp8"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert [line.split()[0] for line in out] == ["q8", "q4:g32", "f8"]
  assert "kernel hx_matmul_q_v1; hx.matmul_q (installed) calls hx_matmul_q_v1" in out[0]
  assert "kernel hx_matmul_q_v2; hx.matmul_q (installed) calls hx_matmul_q_v2" in out[1]
  for argv, msg in [(["--formats", "int3"], "unknown format 'int3'"),
                    (["--formats", "int4:g100"], "--n (8192) is not a multiple of the group "
                                                 "size of q4:g100")]:
    with pytest.raises(SystemExit):
      bench["main"](argv)
    assert msg in capsys.readouterr().err
