"""The block formats (GGUF's Q5_0, Q5_1, IQ4_NL, Q2_K ... Q6_K, IQ4_XS at the file's bytes).

Files are written with ``gguf.GGUFWriter``: random valid blocks (random bytes with finite
f16 ``d``/``dmin``; ``gguf.quants.quantize`` where it makes the type: Q5_0, Q5_1). The
reference is ``gguf.quants.dequantize`` of the same bytes, an implementation independent
of hxmlir's decoders (:mod:`hxmlir.block_decode`): every product of the formula is exact
in f32 or rounded once, as gguf's, so the dense values agree bit for bit.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import assert_within, gamma

import hxmlir as hx
from hxmlir import block_decode, formats
from hxmlir import gguf as hg
from hxmlir.types import typedesc, typestr

gguf = pytest.importorskip("gguf", reason="pip install 'hxmlir[gguf]'")
T = gguf.GGMLQuantizationType
KINDS = [f.gguf for f in formats.BLOCK_FORMATS]


def _blocks(rs, kind: str, rows: int, blocks: int) -> np.ndarray:
  """``uint8[rows, blocks * bytes]``: random blocks of GGUF type ``kind`` with finite f16
  ``d`` (and ``dmin``) of either sign."""
  size = hg._BLOCK_BYTES[kind]
  d_at, m_at, _ = hg._HEADERS[kind]
  raw = rs.randint(0, 256, size=(rows, blocks, size)).astype(np.uint8)
  for at in (d_at,) if m_at is None else (d_at, m_at):
    h = (rs.randn(rows, blocks) * 0.02).astype(np.float16)
    raw[..., at:at + 2] = h[..., None].view(np.uint8)
  return raw.reshape(rows, blocks * size)


def _shape(kind: str, rows: int = 8) -> tuple[int, int]:
  return (rows, 3 * hg._BLOCK_SIZES[kind])


def _write(path, tensors: dict) -> str:
  w = gguf.GGUFWriter(os.fspath(path), "llama")
  for name, (kind, raw) in tensors.items():
    w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=T[kind])
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return os.fspath(path)


@pytest.fixture(scope="module")
def blockfile(tmp_path_factory):
  """One GGUF file with a tensor per block type (random blocks), and Q5_0/Q5_1 quantized
  by ``gguf.quants.quantize``; ``(path, {name: gguf reference f32})``."""
  rs = np.random.RandomState(40)
  tensors = {kind: (kind, _blocks(rs, kind, _shape(kind)[0], 3)) for kind in KINDS}
  for kind in ("Q5_0", "Q5_1"):
    x = (rs.randn(*_shape(kind)) * 2 + 0.3).astype(np.float32)
    x[0, :32] = 0  # an all-zero block
    tensors[f"{kind}.quantized"] = (kind, gguf.quants.quantize(x, T[kind]))
  path = _write(tmp_path_factory.mktemp("blocks") / "blocks.gguf", tensors)
  r = gguf.GGUFReader(path)
  ref = {t.name: gguf.quants.dequantize(np.asarray(t.data), t.tensor_type) for t in r.tensors}
  return path, ref


@pytest.mark.parametrize("name", [*KINDS, "Q5_0.quantized", "Q5_1.quantized"])
def test_loads_at_the_file_bytes_and_dequantizes_bit_for_bit(blockfile, name):
  path, ref = blockfile
  kind = name.split(".")[0]
  ck = hg.load(path, names={name})
  v = ck[name]
  f = formats.FORMATS[kind.lower()]
  shape = _shape(kind)
  assert str(jax.typeof(v)) == f"{kind.lower()}[{shape[0]},{shape[1]}:g{f.block},f16]"
  assert hg.hx_type_name(kind, shape) == str(jax.typeof(v))
  assert hg.device_bytes(v) == ck.file_bytes[name]  # the file's bytes, exactly
  got = np.asarray(jax.jit(hx.dequantize)(v))
  np.testing.assert_array_equal(got, ref[name].reshape(shape))
  np.testing.assert_array_equal(np.asarray(hx.dequantize(v)), got)  # eager too


def test_inspect_shows_equal_file_and_hx_bytes(blockfile):
  path, _ = blockfile
  info = hg.inspect(path)
  for t in info["tensors"]:
    assert t["hx_bytes"] == t["file_bytes"], t
  assert info["hx_bytes"] == info["file_bytes"]
  text = hg.format_inspect(info)
  q4k = next(t for t in info["tensors"] if t["name"] == "Q4_K")["file_bytes"]
  assert f"by type Q4_K: 1 tensor, {q4k:,} file bytes, {q4k:,} hx bytes (1.000x)" in text
  assert "by type Q5_0: 2 tensors" in text  # random blocks and quantized ones
  assert text.splitlines()[-1] == (f"total: {info['file_bytes']:,} file bytes, "
                                   f"{info['file_bytes']:,} hx bytes")
  ck = hg.load(path)
  for t in info["tensors"]:
    assert t["hx_bytes"] == hg.device_bytes(ck[t["name"]])
    assert t["hx_type"] == str(jax.typeof(ck[t["name"]]))


def _bound(x, q, contract: str) -> np.ndarray:
  """A bound of ``|fl32(x @ W) - x @ W|`` for the decomposition: per element ``x·(u·d)`` and
  ``x·(v·dmin)`` (each product rounded once, the scale applied to ``x`` or each group's
  partial sum: two more roundings), summed in f32 with the offset term added once more."""
  u, v = block_decode.units(jnp.asarray(q.qvalue), jax.typeof(q).format.name)
  g = jax.typeof(q).group
  def per_elem(units, s):
    s = np.repeat(np.asarray(s, np.float64), g, axis=-1)
    return np.abs(np.asarray(units, np.float64) * s)
  mag = per_elem(u, q.scale) + (0 if v is None else per_elem(v, q.offset))
  k = x.shape[-1]
  return gamma(k + 4) * np.einsum(contract, np.abs(x.astype(np.float64)), mag) + 1e-37 * k


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("installed", [False, True])
def test_matmul_and_einsum_against_float64(blockfile, kind, installed):
  path, ref = blockfile
  q = hg.load(path, names={kind})[kind]
  w = ref[kind].reshape(_shape(kind)).astype(np.float64)  # [n, k]
  rs = np.random.RandomState(1)
  x = rs.randn(3, w.shape[1]).astype(np.float32)
  xt = rs.randn(2, w.shape[0]).astype(np.float32)
  with hx.installed() if installed else _nothing():
    y = jax.jit(lambda x, q: hx.einsum("mk,nk->mn", x, q))(x, q)  # the checkpoint layout
    yt = jax.jit(hx.matmul_q)(xt, q)  # [in, out]: q quantized along the free axis
  assert_within(y, x.astype(np.float64) @ w.T, _bound(x, q, "mk,nk->mn"), f"{kind} nk: ")
  assert_within(yt, xt.astype(np.float64) @ w, _bound(xt, q, "mn,nk->mk"), f"{kind} kn: ")


@pytest.fixture(scope="module")
def smallfile(tmp_path_factory):
  """A GGUF file of one ``[64, 256]`` tensor per block type (random blocks: below
  ``SMALL_WEIGHT``, the decomposition's path, not the native kernel's);
  ``(path, {name: gguf reference f32})``."""
  rs = np.random.RandomState(41)
  tensors = {kind: (kind, _blocks(rs, kind, 64, 256 // hg._BLOCK_SIZES[kind]))
             for kind in KINDS}
  path = _write(tmp_path_factory.mktemp("small") / "small.gguf", tensors)
  r = gguf.GGUFReader(path)
  ref = {t.name: gguf.quants.dequantize(np.asarray(t.data), t.tensor_type) for t in r.tensors}
  return path, ref


# XLA CPU (jaxlib 0.10.2, its YNNPACK fusion) summed a batched dot against a constant of ones
# wrongly at some rows of x (8, 16; up to 1e35): Q5_1's offset term in the decomposition of
# 0.8.3 was such a dot, silently wrong on small weights. Every block format, rows of x
# around those counts, both layouts.
@pytest.mark.parametrize("kind", KINDS)
def test_small_weights_against_float64_at_many_rows(smallfile, kind):
  path, ref = smallfile
  q = hg.load(path, names={kind})[kind]
  w = ref[kind].reshape(64, 256).astype(np.float64)
  rs = np.random.RandomState(2)
  for m in (1, 7, 8, 12, 16, 32):
    x = rs.randn(m, 256).astype(np.float32)
    xt = rs.randn(m, 64).astype(np.float32)
    y = jax.jit(lambda x, q: hx.einsum("mk,nk->mn", x, q))(x, q)
    yt = jax.jit(hx.matmul_q)(xt, q)
    assert_within(y, x.astype(np.float64) @ w.T, _bound(x, q, "mk,nk->mn"), f"{kind} m={m}: ")
    assert_within(yt, xt.astype(np.float64) @ w, _bound(xt, q, "mn,nk->mk"),
                  f"{kind} kn m={m}: ")


class _nothing:
  def __enter__(self):
    return self

  def __exit__(self, *a):
    return False


def test_the_bound_catches_a_wrong_decode(blockfile):
  # the test above would fail if the decode were one sub-block off
  path, ref = blockfile
  q = hg.load(path, names={"Q4_K"})["Q4_K"]
  w = ref["Q4_K"].reshape(_shape("Q4_K")).astype(np.float64)
  x = np.random.RandomState(2).randn(3, w.shape[1]).astype(np.float32)
  y = jax.jit(lambda x, q: hx.einsum("mk,nk->mn", x, q))(x, q)
  with pytest.raises(AssertionError):
    assert_within(y, x.astype(np.float64) @ np.roll(w, 32, axis=1).T,
                  _bound(x, q, "mk,nk->mn"))


def test_vmap_scan_grad_and_parts(blockfile):
  path, ref = blockfile
  q = hg.load(path, names={"Q6_K"})["Q6_K"]
  w = ref["Q6_K"].reshape(_shape("Q6_K"))
  parts = hx.qarray_parts(q)
  # stacked weights: vmap over a leading axis of every component
  stacked = jax.jit(lambda *p: hx.make_qarray(*(jnp.stack([c, c]) for c in p)))(*parts)
  assert str(jax.typeof(stacked)) == "q6_k[2,8,768:g256,f16]"
  dense = jax.vmap(hx.dequantize, in_axes=hx.QArraySpec(), axis_size=2)(stacked)
  np.testing.assert_array_equal(np.asarray(dense), np.stack([w, w]))
  def body(c, qi):
    return c + hx.dequantize(qi).sum(), None
  total, _ = jax.lax.scan(body, jnp.float32(0), stacked, length=2)
  # f32 sums of the 2 * w.size exact values, in any order: within gamma_n of the sum of |w|
  w64 = w.astype(np.float64)
  assert_within(float(total), 2 * w64.sum(), gamma(2 * w.size) * 2 * np.abs(w64).sum())
  # the gradient in x is the dense weight's transpose applied to the cotangent
  x = np.ones((1, w.shape[1]), np.float32)
  gx = jax.grad(lambda x: hx.einsum("mk,nk->mn", x, q).sum())(x)
  # each column a sum of its n exact products with 1 (the ones cotangent and x)
  assert_within(np.asarray(gx)[0], w64.sum(0), gamma(w.shape[0]) * np.abs(w64).sum(0))
  # an embedding lookup gathers rows of each component, never the dense table
  ids = jnp.asarray([3, 0, 7, 3])
  np.testing.assert_array_equal(np.asarray(jax.jit(hx.take_rows)(q, ids)), w[np.asarray(ids)])
  # make_qarray / qarray_parts round trip, bit for bit
  back = jax.jit(lambda *p: hx.qarray_parts(hx.make_qarray(*p)))(*parts)
  for a, b in zip(parts, back):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_make_qarray_tangent_is_linear_in_d_and_dmin(blockfile):
  path, ref = blockfile
  q, s, o = hx.qarray_parts(hg.load(path, names={"Q4_K"})["Q4_K"])
  s32, o32 = np.asarray(s, np.float32), np.asarray(o, np.float32)
  def dense(s, o):
    return hx.dequantize(hx.make_qarray(q, s.astype(jnp.float16), o.astype(jnp.float16)))
  ds, do = np.ones_like(s32), np.zeros_like(o32)
  _, t = jax.jvp(dense, (s32, o32), (ds, do))
  u, v = block_decode.units(q, "q4_k")
  np.testing.assert_array_equal(np.asarray(t), np.asarray(u))  # d x / d d = sc · q
  _, t = jax.jvp(dense, (s32, o32), (np.zeros_like(s32), np.ones_like(o32)))
  np.testing.assert_array_equal(np.asarray(t), np.asarray(v))  # d x / d dmin = -m
  # the transpose: the cotangents of d and dmin are the sums of ct · u and ct · v per block
  ct = np.random.RandomState(3).randn(*u.shape).astype(np.float32)
  gs, go = jax.grad(lambda s, o: jnp.sum(dense(s, o) * ct), argnums=(0, 1))(s32, o32)
  for got, w in ((gs, u), (go, v)):
    want = (ct.astype(np.float64) * np.asarray(w, np.float64)).reshape(*s32.shape, 256).sum(-1)
    bound = gamma(256) * (np.abs(ct) * np.abs(np.asarray(w))).reshape(*s32.shape, 256).sum(-1)
    # the f16 cast of the cotangent (make_qarray's components are f16) rounds once more
    assert_within(np.asarray(got, np.float64), want, bound + np.abs(want) * 2.0 ** -11)


def test_type_text_and_descriptors_round_trip():
  for text in ("q4_k[8,512:g256,f16]", "iq4_nl[4,64:g32,f16]", "q5_1[2,32:g32,f16]"):
    ty = typestr.parse_type(text)
    assert typestr.type_str(ty) == text
    assert typedesc.parse(typedesc.describe(ty)) == ty
  with pytest.raises(typestr.TypeStrError, match="q4_k has one scale per block of 256"):
    typestr.parse_type("q4_k[8,512:g32,f16]")


def test_errors_name_the_format():
  with pytest.raises(TypeError, match=r"hx.quantize does not make q4_k \(GGUF's Q4_K blocks "
                                      r"come from checkpoints"):
    hx.quantize(jnp.ones((2, 256)), "q4_k")
  b = jnp.zeros((4, 2, 70), jnp.uint16)
  s = jnp.ones((4, 2), jnp.float16)
  q = hx.make_qarray(b, s, s)
  assert str(jax.typeof(q)) == "q4_k[4,512:g256,f16]"
  with pytest.raises(TypeError, match=r"f32\[2,100\] @ q4_k\[4,512:g256,f16\]"):
    hx.matmul_q(jnp.ones((2, 100)), q)
  with pytest.raises(TypeError, match=r"a q4_k\[4,512:g256,f16\] is mapped with hx.QArraySpec"):
    jax.vmap(hx.dequantize, in_axes=0)(q)
  with pytest.raises(TypeError, match=r"no quantization format has components|expects qvalue"):
    hx.make_qarray(jnp.zeros((4, 2, 71), jnp.uint16), s, s)  # 71 words: no block format


def test_a_split_super_block_is_a_type_error():
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P
  if jax.device_count() < 4:
    pytest.skip("needs 4 devices")
  mesh = jax.make_mesh((4,), ("i",), axis_types=(AxisType.Explicit,))
  b = jnp.zeros((4, 2, 70), jnp.uint16)
  s = jnp.ones((4, 2), jnp.float16)
  q = hx.make_qarray(b, s, s)  # q4_k[4,512]: 2 blocks along the last axis
  with pytest.raises(TypeError, match=r"its 2 blocks of 256 \(q4_k super-blocks\) cannot be "
                                      r"split 4 ways"):
    jax.device_put(q, NamedSharding(mesh, P(None, "i")))
  rows = jax.device_put(q, NamedSharding(mesh, P("i")))  # rows: fine
  assert str(jax.typeof(rows)) == "q4_k[4@i,512:g256,f16]"
  np.testing.assert_array_equal(np.asarray(hx.dequantize(rows)), np.asarray(hx.dequantize(q)))


def test_composites_name_the_format_and_verify(blockfile, tmp_path):
  path, _ = blockfile
  q = hg.load(path, names={"Q2_K"})["Q2_K"]
  x = np.ones((2, q.shape[1]), np.float32)
  text = jax.jit(lambda x, q: hx.einsum("mk,nk->mn", x, q)).lower(x, q).as_text()
  assert 'stablehlo.composite "hx.matmul_q"' in text
  assert 'dtype = "q2_k"' in text and 'layout = "gguf_q2_k_v1"' in text
  assert "version = 5 : i32" in text
  rc, out, err = _opt(tmp_path, text, "hx-verify,hx-fold-scales,hx-decompose")
  assert rc == 0, err
  assert "hx.matmul_q" not in out and "tensor<8x3x40xui16>" in out
  # the older version does not hold a block format: hx-verify says so
  rc, _, err = _opt(tmp_path, text.replace("version = 5 : i32", "version = 4 : i32"),
                    "hx-verify")
  assert rc == 1
  assert "dtype 'q2_k' is a block format (GGUF's Q2_K), which hx.matmul_q holds from " \
         "version 5 on, not in version 4" in err


def _opt(tmp_path, text: str, passes: str) -> tuple[int, str, str]:
  """``hxmlir-opt`` in process: ``(exit status, output, stderr)``."""
  import contextlib
  import io

  from hxmlir.tools import opt
  src, dst = tmp_path / "in.mlir", tmp_path / "out.mlir"
  src.write_text(text)
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    try:
      rc = opt.main([os.fspath(src), "-p", passes, "-o", os.fspath(dst)])
    except SystemExit as e:  # the driver exits with its status
      rc = e.code
  return rc, dst.read_text() if dst.exists() else "", err.getvalue()


def test_unsupported_types_stay_a_clear_error(tmp_path):
  raw = np.zeros((4, 66), np.uint8)  # IQ2_XXS: a grid codebook, not held
  path = _write(tmp_path / "u.gguf", {"w": ("IQ2_XXS", raw)})
  with pytest.raises(hg.GGUFError, match=r"tensor 'w' has GGUF type IQ2_XXS, which hxmlir "
                                         r"cannot hold exactly; supported: .*Q2_K, Q3_K, "
                                         r"Q4_K, Q5_K, Q6_K, IQ4_XS"):
    hg.load(path)


def test_fold_scales_makes_a_matmul_q_of_a_dequantized_block_weight(blockfile, tmp_path):
  path, ref = blockfile
  q = hg.load(path, names={"Q5_K"})["Q5_K"]
  w = ref["Q5_K"].reshape(_shape("Q5_K")).astype(np.float64)  # [k, n] here: x @ W
  x = np.random.RandomState(4).randn(2, w.shape[0]).astype(np.float32)
  f = jax.jit(lambda x, q: x @ hx.dequantize(q))
  with hx.installed():  # the jaxpr stage of hx-fold-scales rewrites the dot
    text = f.lower(x, q).as_text()
    y = f(x, q)
  assert 'stablehlo.composite "hx.matmul_q"' in text and "hx.dequantize" not in text
  assert_within(y, x.astype(np.float64) @ w, _bound(x, q, "mn,nk->mk"))
  # the MLIR stage leaves f16-scale formats (block formats included) as they are
  plain = f.lower(x, q).as_text()
  rc, out, err = _opt(tmp_path, plain, "hx-verify,hx-fold-scales,hx-verify")
  assert rc == 0, err
  assert 'stablehlo.composite "hx.dequantize"' in out and "stablehlo.dot_general" in out
