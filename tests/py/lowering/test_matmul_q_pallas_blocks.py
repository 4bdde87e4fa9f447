"""The Pallas kernels of GGUF's block formats in the checkpoint layout ``W[out, in]``.

``matmul_q_nk_blocks_pallas`` (kernel ``hx_matmul_q_nk_blocks_v1``) on Mosaic decodes each
block's words as the bit planes of :mod:`hxmlir.block_layout`; on Triton it gathers each
element's bits by the table that :func:`nk_blocks_triton.gather_table` derives from the same
layout (checked here bit for bit by evaluating it with NumPy). The Triton kernel lowers for
``cuda`` from CPU and runs in interpret mode; no GPU has run it. The tables themselves are checked bit for bit
against :mod:`hxmlir.block_decode` (itself checked against ``gguf.quants`` in
``tests/py/io/test_gguf_blocks.py``). Numbers: Pallas interpret mode against float64 NumPy
from the stored bytes, within a bound derived from the kernel's arithmetic (:func:`_bound`).
IR: the kernel lowers for ``tpu`` from CPU (Mosaic only); the lowering rules keep the
reference decomposition for block weights. On a TPU v5e (0.8.5) Mosaic compiled the kernel
for every format and matched float64 within 7e-8 of ``|x|·|W|``, but it ran slower than
XLA's own decode and dot for most formats.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import assert_within, gamma
from test_matmul_q_kernels import _custom_calls
from test_matmul_q_pallas import _check_export_errors

import hxmlir as hx
from hxmlir import block_decode, block_layout, formats, targets
from hxmlir import export as hxe
from hxmlir.lowering.matmul_q import pallas as mqp
from hxmlir.lowering.matmul_q.pallas import nk_blocks, nk_blocks_triton

KERNEL = "hx_matmul_q_nk_blocks_v1"
NAMES = [f.name for f in formats.BLOCK_FORMATS]


def _bytes(rs, name: str, lead: tuple, nblk: int) -> np.ndarray:
  return rs.randint(0, 256, size=(*lead, nblk, block_layout.LAYOUTS[name].nbytes)).astype(
      np.uint8)


def _weight(name: str, lead: tuple, n: int, nblk: int, seed: int):
  """A random ``name`` weight ``[*lead, n, nblk * B]`` (random bytes, f16 ``d``/``dmin`` of
  either sign) and its bytes."""
  rs = np.random.RandomState(seed)
  by = _bytes(rs, name, (*lead, n), nblk)
  comps = [jnp.asarray(by.view(np.uint16))]
  for _ in range(2 if formats.FORMATS[name].offset else 1):
    comps.append(jnp.asarray((rs.randn(*lead, n, nblk) * 0.02).astype(np.float16)))
  return hx.make_qarray(*comps), by


def _terms(w, by):
  """``(u·d, v·dmin, minus·|sc·d|)`` per element in float64 (``[*lead, n, k]``)."""
  name = jax.typeof(w).format.name
  lay = block_layout.LAYOUTS[name]
  parts = [np.asarray(c, np.float64) for c in hx.qarray_parts(w)]
  u, v = block_layout.decode(by, lay)
  rep = lambda a: np.repeat(a, lay.block, axis=-1)  # noqa: E731
  flat = lambda a: a.reshape(*a.shape[:-2], -1)  # noqa: E731
  ud = flat(u.astype(np.float64)) * rep(parts[1])
  vd = 0 * ud if v is None else flat(v.astype(np.float64)) * rep(parts[2])
  const = 0 * ud
  if lay.minus:  # the kernel subtracts minus·sc·d per sub-block: |sc| per element
    sc = block_layout.factors(by, lay)[0] if lay.scale else np.ones((*by.shape[:-1], 1))
    sc = np.repeat(np.abs(sc).astype(np.float64), lay.sub or lay.block, axis=-1)
    const = lay.minus * flat(sc) * rep(np.abs(parts[1]))
  return ud, vd, const


def _bound(x, w, by):
  """A bound of ``|kernel - x @ Wᵀ|``: per element ``x·(bits·sc·d)`` per plane (``d`` spread
  exactly, one rounding for ``·d``, one in the product), plus the sub-block term ``xs·C``
  (``C = -minus·sc·d - m·dmin``: two roundings and a sum; ``xs`` a sum of ``sub``), all
  summed in f32: ``gamma(P·L + S·nblk + sub + 4)`` times the magnitudes."""
  name = jax.typeof(w).format.name
  lay = block_layout.LAYOUTS[name]
  ud, vd, const = _terms(w, by)
  nblk = by.shape[-2]
  terms = len(nk_blocks.planes(name)) * nblk * lay.nbytes // 2 + nblk * lay.subs + \
      (lay.sub or lay.block) + 4
  mag = np.abs(ud) + np.abs(vd) + 2 * const
  ax = np.abs(np.asarray(x, np.float64))
  return gamma(terms) * np.einsum("...mk,...nk->...mn", ax, mag) + 1e-37 * x.shape[-1]


def _bound_triton(x, w, by):
  """A bound of ``|kernel - x @ Wᵀ|`` for the Triton kernel: each dense weight ``u·d + v·dmin``
  (``u``, ``v`` exact; two products and a sum, three roundings), times ``x`` and summed over
  ``k`` in f32 in any order: ``gamma(k + 3)`` times ``|x|·(|u·d| + |v·dmin|)``."""
  ud, vd, _ = _terms(w, by)
  ax = np.abs(np.asarray(x, np.float64))
  return gamma(x.shape[-1] + 3) * np.einsum("...mk,...nk->...mn", ax, np.abs(ud) + np.abs(vd)) \
      + 1e-37 * x.shape[-1]


def _want(x, w):
  return np.einsum("...mk,...nk->...mn", np.asarray(x, np.float64),
                   np.asarray(hx.dequantize(w), np.float64))


@pytest.mark.parametrize("name", NAMES)
def test_layout_tables_decode_as_block_decode(name):
  # every bit field of the tables against the decoders: u and v bit for bit
  by = _bytes(np.random.RandomState(1), name, (4,), 3)
  u, v = block_decode.units(jnp.asarray(by.view(np.uint16)), name)
  u2, v2 = block_layout.decode(by, block_layout.LAYOUTS[name])
  np.testing.assert_array_equal(np.asarray(u), u2.reshape(4, -1))
  assert (v is None) == (v2 is None)
  if v is not None:
    np.testing.assert_array_equal(np.asarray(v), v2.reshape(4, -1))


@pytest.mark.parametrize("name", NAMES)
def test_planes_hold_every_bit_of_every_element_once(name):
  # per field the planes partition the block's elements: each (element, field) once
  lay = block_layout.LAYOUTS[name]
  seen = {}
  for p in nk_blocks.planes(name):
    for e in p.elements:
      if e >= 0:
        seen[(e, p.weight)] = seen.get((e, p.weight), 0) + 1
  fields = {1 << f.dest for f in lay.fields}
  assert seen == {(e, wt): 1 for e in range(lay.block) for wt in fields}


# (lead, m, n, blocks per row): two row tiles with a ragged edge (n > BLOCK_N), a batch with
# odd m, and rows of more blocks than one chunk holds (a partial last chunk)
SHAPES = [((), 1, 300, 3), ((2,), 5, 40, 2), ((), 3, 16, None)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("lead,m,n,nblk", SHAPES)
def test_kernel_in_interpret_mode_against_float64(name, lead, m, n, nblk):
  lay = block_layout.LAYOUTS[name]
  if nblk is None:
    nblk = 2 * nk_blocks.chunk_blocks(name, 1 << 20) + 1  # two chunks and one block
  w, by = _weight(name, lead, n, nblk, seed=n + m)
  x = np.random.default_rng(m).standard_normal((*lead, m, nblk * lay.block)).astype(np.float32)
  got = mqp.matmul_q_nk_pallas(x, *hx.qarray_parts(w), backend="mosaic_tpu", interpret=True)
  assert got.shape == (*lead, m, n)
  assert_within(got, _want(x, w), _bound(x, w, by), f"{name}: ")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("lead,m,n,nblk", [((), 1, 70, 3), ((2,), 5, 16, 2), ((), 17, 33, 1)])
def test_triton_kernel_in_interpret_mode_against_float64(name, lead, m, n, nblk):
  # n = 70: three row tiles of 32, the last one clamped; m = 17: two row blocks of x
  lay = block_layout.LAYOUTS[name]
  w, by = _weight(name, lead, n, nblk, seed=n + m + 1)
  x = np.random.default_rng(m).standard_normal((*lead, m, nblk * lay.block)).astype(np.float32)
  got = mqp.matmul_q_nk_pallas(x, *hx.qarray_parts(w), backend="triton", interpret=True)
  assert got.shape == (*lead, m, n)
  assert_within(got, _want(x, w), _bound_triton(x, w, by), f"{name}: ")


def _eval_gather_table(by, name: str):
  """``(u, v)`` of blocks ``by: uint8[..., nbytes]`` evaluated from
  :func:`nk_blocks_triton.gather_table` alone, as the Triton kernel reads it."""
  lay = block_layout.LAYOUTS[name]
  t = nk_blocks_triton.gather_table(name).astype(np.int64)
  first = nk_blocks_triton.table_rows(name)
  words = by.view(np.uint16).astype(np.int64)

  def part(kind, i, mask=None):
    r = first[(kind, i)]
    bits = words[..., t[r]] >> t[r + 1]
    return (bits & mask) if mask is not None else (bits & t[r + 2]) << t[r + 3]

  q = sum(part("field", i, (1 << f.width) - 1) << f.dest for i, f in enumerate(lay.fields))
  value = np.asarray(lay.table, np.int64)[q] if lay.table else q - lay.minus
  if lay.scale:
    sc = sum(part("scale", i) for i in range(len(lay.scale)))
    sc = np.where(sc >= 128, sc - 256, sc) if lay.signed_scale else sc
    value = value * (sc - lay.factor_minus)
  v = None
  if lay.mins:
    v = -sum(part("min", i) for i in range(len(lay.mins))).astype(np.float32)
  elif lay.offset_as_is:
    v = np.ones(value.shape, np.float32)
  return value.astype(np.float32), v


@pytest.mark.parametrize("name", NAMES)
def test_gather_table_decodes_as_block_decode(name):
  # the Triton kernel's table, evaluated with NumPy: u and v bit for bit
  by = _bytes(np.random.RandomState(2), name, (4,), 3)
  u, v = block_decode.units(jnp.asarray(by.view(np.uint16)), name)
  u2, v2 = _eval_gather_table(by, name)
  np.testing.assert_array_equal(np.asarray(u), u2.reshape(4, -1))
  assert (v is None) == (v2 is None)
  if v is not None:
    np.testing.assert_array_equal(np.asarray(v), v2.reshape(4, -1))


def test_the_triton_bound_catches_a_wrong_shift():
  # one field's shift off by one in the table: the kernel's error is far outside the bound
  name = "q5_k"
  w, by = _weight(name, (), 24, 2, seed=7)
  x = np.random.default_rng(8).standard_normal((2, 512)).astype(np.float32)
  good = nk_blocks_triton.gather_table(name)
  bad = good.copy()
  bad[1] = (bad[1] + 1) % 16
  import unittest.mock as mock
  with mock.patch.object(nk_blocks_triton, "gather_table", lambda _n: bad):
    got = mqp.matmul_q_nk_pallas(x, *hx.qarray_parts(w), backend="triton", interpret=True)
  err = np.abs(np.asarray(got) - _want(x, w)) - _bound_triton(x, w, by)
  assert err.max() > 0


def test_the_bound_catches_a_wrong_plane():
  # one plane's weight doubled: the kernel's error is then far outside the bound
  name = "q4_k"
  w, by = _weight(name, (), 24, 2, seed=3)
  x = np.random.default_rng(4).standard_normal((2, 512)).astype(np.float32)
  good = nk_blocks.planes(name)
  bad = (good[0].__class__(good[0].shift, good[0].width, 2, good[0].elements), *good[1:])
  nk_blocks.planes.cache_clear()
  try:
    import unittest.mock as mock
    with mock.patch.object(nk_blocks, "planes", lambda _n: bad):
      got = mqp.matmul_q_nk_pallas(x, *hx.qarray_parts(w), backend="mosaic_tpu",
                                   interpret=True)
  finally:
    nk_blocks.planes.cache_clear()
  err = np.abs(np.asarray(got) - _want(x, w)) - _bound(x, w, by)
  assert err.max() > 0


def test_kernel_is_registered_for_tpu_and_gpus():
  ks = {(k.target, k.ir_name): k for k in targets.registered_kernels()}
  assert ks[(targets.MOSAIC_TPU, KERNEL)].platforms == ("tpu",)
  assert ks[(targets.TRITON, KERNEL)].platforms == ("cuda", "rocm")
  assert all(f.pallas == ("nk",) for f in formats.BLOCK_FORMATS)


def _einsum(x, w):
  return hx.einsum("...k,nk->...n", x, w)


@pytest.mark.parametrize("name", ["q4_k", "q5_0", "iq4_xs"])
def test_kernel_lowers_for_tpu_and_the_rules_keep_the_reference(name):
  # the kernel, called directly, lowers for tpu from CPU: one tpu_custom_call, by its name;
  # hx.einsum on a block weight keeps the reference decomposition on every platform
  # (measured slower than XLA's on a TPU v5e), installed or not
  w, by = _weight(name, (), 40, 2, seed=5)
  x = np.random.default_rng(6).standard_normal((2, 3, w.shape[-1])).astype(np.float32)
  direct = jax.jit(lambda x, *c: mqp.matmul_q_nk_pallas(x, *c, backend="mosaic_tpu"))
  text = direct.trace(x[0], *hx.qarray_parts(w)).lower(lowering_platforms=("tpu",)).as_text()
  assert _custom_calls(text) == [(targets.MOSAIC_TPU, KERNEL)]
  with hx.installed():  # export lowering runs hx-check-export, which must accept it
    exp = hxe.export(_einsum, platforms=["cpu", "cuda", "tpu"])(x, w)
  text = exp.mlir_module()
  assert text.count('stablehlo.composite "hx.matmul_q"') == 3  # one per platform branch
  assert _custom_calls(text) == []
  assert _check_export_errors(text) == []
  got = hxe.deserialize(exp.serialize()).call(x, w)  # the CPU branch
  assert_within(got, _want(x, w), _bound(x, w, by))


def test_the_reference_on_tpu_follows_the_default_matmul_precision():
  # the rules' reference for block weights is XLA's dot at JAX's default precision (bf16
  # passes on a TPU v5e: 2e-4 of |x|·|W| at m = 16); jax.default_matmul_precision("highest")
  # reaches its dots, as docs/limits.md tells users
  w, _ = _weight("q4_k", (), 8, 2, seed=3)
  x = np.ones((4, w.shape[-1]), np.float32)
  f = jax.jit(_einsum)

  def precisions():
    text = f.trace(x, w).lower(lowering_platforms=("tpu",)).as_text()
    return {line.split("precision = ")[1].split("]")[0] + "]"
            for line in text.splitlines() if "stablehlo.dot_general" in line}

  with hx.installed():
    assert precisions() == {"[DEFAULT, DEFAULT]"}
    with jax.default_matmul_precision("highest"):
      assert precisions() == {"[HIGHEST, HIGHEST]"}


def test_mosaic_tiles_are_those_that_compiled_on_a_tpu():
  # a TPU v5e (0.8.7) ran out of scoped VMEM for Q5_0 and Q5_1 at 256 weight rows per
  # program with two or more tiles of x's rows, and at block_m = 40 (m = 64, k = 4096);
  # 128 rows and a 2 MiB bound on the permuted x block compiled for every format
  assert {n: nk_blocks.default_block_n(n) for n in NAMES} == {
    n: 128 if n in ("q5_0", "q5_1") else 256 for n in NAMES}
  assert nk_blocks.XP_BYTES == 2 << 20


@pytest.mark.parametrize("name", ["q4_k", "q6_k", "iq4_nl", "q5_1"])
def test_triton_kernel_lowers_for_cuda(name):
  # one Triton custom call by the kernel's name, whose operands are x, the words, d (and
  # dmin) and the gather table
  w, _ = _weight(name, (), 40, 2, seed=10)
  x = np.ones((3, w.shape[-1]), np.float32)
  direct = jax.jit(lambda x, *c: mqp.matmul_q_nk_pallas(x, *c, backend="triton"))
  text = direct.trace(x, *hx.qarray_parts(w)).lower(lowering_platforms=("cuda",)).as_text()
  assert _custom_calls(text) == [(targets.TRITON, KERNEL)]
  table = nk_blocks_triton.gather_table(name)
  assert f"tensor<{table.shape[0]}x{table.shape[1]}xi32>" in text


def test_errors_name_the_operands_and_the_backend():
  w, _ = _weight("q4_k", (), 8, 1, seed=9)
  parts = hx.qarray_parts(w)
  with pytest.raises(ValueError, match="unknown backend 'cuda'"):
    nk_blocks.matmul_q_nk_blocks_pallas(np.ones((1, 256), np.float32), *parts, backend="cuda")
  x = np.ones((1, 256), np.float32)
  for bad in (24, 0, -16, 8):
    with pytest.raises(ValueError, match=f"Triton's block_n must be a power of two >= 16, "
                                         f"got {bad}"):
      nk_blocks.matmul_q_nk_blocks_pallas(x, *parts, backend="triton", block_n=bad)
  for bad in (0, -16, 3):
    with pytest.raises(ValueError, match=f"Mosaic's block_n must be a multiple of 128 .* or "
                                         f"cover all 8 rows, got {bad}"):
      nk_blocks.matmul_q_nk_blocks_pallas(x, *parts, block_n=bad)
  # a block_n covering n is a whole tile
  got = nk_blocks.matmul_q_nk_blocks_pallas(x, *parts, block_n=8, interpret=True)
  assert got.shape == (1, 8)
  with pytest.raises(TypeError, match=r"expects f32\[\*b, m, k\].*got f32\[1,128\], "
                                      r"ui16\[8,1,70\], f16\[8,1\], f16\[8,1\]"):
    nk_blocks.matmul_q_nk_blocks_pallas(np.ones((1, 128), np.float32), *parts)


@pytest.mark.parametrize("backend", ["triton", "mosaic_tpu"])
def test_every_kernel_returns_zeros_for_an_empty_product(backend):
  # no grid of zero blocks: x with m = 0 or a zero batch, n = 0, k = 0; every Pallas kernel
  wb, _ = _weight("q4_k", (), 8, 2, seed=11)
  wb0, _ = _weight("q4_k", (), 0, 2, seed=11)
  wz, _ = _weight("q4_k", (0,), 8, 2, seed=11)  # a batch of none
  w_nk = hx.quantize(jnp.ones((8, 64)), group_size=32)
  w_kn = hx.quantize(jnp.ones((64, 8)))
  cases = [(mqp.matmul_q_nk_pallas, np.zeros((0, 512)), wb, (0, 8)),
           (mqp.matmul_q_nk_pallas, np.zeros((0, 2, 512)), wz, (0, 2, 8)),
           (mqp.matmul_q_nk_pallas, np.ones((2, 512)), wb0, (2, 0)),
           (mqp.matmul_q_nk_pallas, np.zeros((0, 64)), w_nk, (0, 8)),
           (mqp.matmul_q_pallas, np.zeros((0, 64)), w_kn, (0, 8))]
  for fn, x, w, shape in cases:
    got = fn(jnp.asarray(x, jnp.float32), *hx.qarray_parts(w), backend=backend, interpret=True)
    assert got.shape == shape and got.dtype == jnp.float32 and not np.asarray(got).any()


# --- benchmarks/matmul_q_blocks_pallas.py on a machine without a TPU or GPU ----------

@pytest.mark.parametrize("backend", ["mosaic_tpu", "triton"])
def test_benchmark_runs_in_interpret_mode_and_refuses_bad_shapes(capsys, backend):
  import pathlib
  import runpy
  bench = runpy.run_path(str(pathlib.Path(__file__).parents[3] / "benchmarks" /
                             "matmul_q_blocks_pallas.py"))
  assert bench["main"]([]) == 0  # no TPU or GPU here: says so
  assert "no TPU or GPU visible" in capsys.readouterr().out
  assert bench["main"](["--interpret", "--backend", backend, "--shapes", "40x512", "--formats",
                        "q4_k", "q5_0", "--m", "2", "--rounds", "1"]) == 0
  out = capsys.readouterr().out
  assert f"{backend} kernel" in out
  rows = [line.split("|") for line in out.splitlines() if "|" in line][1:]
  assert [r[0].split()[:4] for r in rows] == [["q4_k", "40", "512", "2"],
                                              ["q5_0", "40", "512", "2"]]
  errs = [r[-1].split() for r in rows]  # the kernel and hx.einsum against float64, |x|·|W|
  assert all(len(e) == 2 and max(map(float, e)) < 1e-6 for e in errs), errs
  with pytest.raises(SystemExit):
    bench["main"](["--shapes", "40x100", "--formats", "q4_k"])
  assert "the in axis 100 of 40x100 is not a multiple of the block of q4_k" in \
      capsys.readouterr().err


def test_layout_decode_refuses_other_bytes():
  lay = block_layout.LAYOUTS["q4_k"]
  for bad, got in [(np.zeros((2, 144), np.uint8), r"uint8\[2, 144\]"),
                   (np.zeros((2, 140), np.int8), r"int8\[2, 140\]")]:
    with pytest.raises(ValueError, match=r"q4_k blocks are uint8\[\.\.\., 140\] .*got " + got):
      block_layout.decode(bad, lay)
    with pytest.raises(ValueError, match="q4_k blocks are"):
      block_layout.factors(bad, lay)


@pytest.mark.parametrize("backend", ["triton", "mosaic_tpu"])
def test_direct_calls_are_differentiable_in_x_only(backend):
  # grad of every Pallas entry point in x against the dense product's (f64), both layouts
  # and a block format; a derivative in a weight component is a TypeError naming the call
  rng = np.random.default_rng(12)
  wb, _ = _weight("q5_k", (), 24, 2, seed=12)
  w_nk = hx.quantize(jnp.asarray(rng.standard_normal((24, 64)), jnp.float32), group_size=32)
  w_kn = hx.quantize(jnp.asarray(rng.standard_normal((64, 24)), jnp.float32))
  for fn, w, k, transposed in [(mqp.matmul_q_nk_pallas, wb, 512, True),
                               (mqp.matmul_q_nk_pallas, w_nk, 64, True),
                               (mqp.matmul_q_pallas, w_kn, 64, False)]:
    x = rng.standard_normal((3, k)).astype(np.float32)
    c = rng.standard_normal((3, 24)).astype(np.float32)
    parts = hx.qarray_parts(w)
    got = jax.grad(lambda x, c=c, fn=fn, parts=parts: jnp.sum(
        c * fn(x, *parts, backend=backend, interpret=True)))(x)
    dense = np.asarray(hx.dequantize(w), np.float64)
    dense = dense if transposed else dense.T  # [n, k]
    want = c.astype(np.float64) @ dense
    bound = gamma(24 + 2) * (np.abs(c) @ np.abs(dense))
    assert_within(got, want, bound, f"{fn.__name__}: ")
    scale = parts[1].astype(jnp.float32)
    with pytest.raises(TypeError, match=f"{fn.__name__} is differentiable in x only"):
      jax.grad(lambda s, x=x, fn=fn, parts=parts: jnp.sum(
          fn(x, parts[0], s.astype(parts[1].dtype), *parts[2:], backend=backend,
             interpret=True)))(scale)
