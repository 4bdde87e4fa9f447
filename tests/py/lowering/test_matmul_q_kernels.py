"""``hx.matmul_q`` kernels: the streaming CPU implementation, the Pallas kernel, their rules.

Numbers are compared with the reference (``lowering/reference.py``) within the
bound of a reordered f32 sum: both compute ``sum_k (x s)[m, k] * q[k, n]`` in
f32 from the same rounded ``x * s`` (the int8 -> f32 conversion is exact), only
in a different order, so by the standard dot-product bound (Higham, *Accuracy
and Stability of Numerical Algorithms*, 2nd ed., eq. 3.5) each differs from the
exact sum by at most ``gamma_k * S`` with ``gamma_k = k eps / (1 - k eps)`` and
``S = |x s| @ |q|``; hence ``|y - y_ref| <= 2 gamma_k S``. The bound is
computed in float64 per element, so a wrong block offset or a lost remainder
(errors of the order of ``S / k`` or more) fails it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir
from numerics import assert_within, dot_bound, sum_bound

import hxmlir as hx
from hxmlir import targets
from hxmlir.lowering import reference
from hxmlir.lowering.matmul_q import pallas as mqp
from hxmlir.lowering.matmul_q import streaming
from hxmlir.lowering.primitives import hx_matmul_q_p


@pytest.fixture(autouse=True)
def _stream_small_weights(monkeypatch):
  """These tests exercise the streaming schemes on small, fast shapes: lower the
  size under which the CPU rule converts the weight whole for m > 32 (1M
  elements by default) to 64K elements, the threshold for small m. JAX's caches are cleared so no lowering made under
  another threshold is reused."""
  monkeypatch.setattr(streaming, "N_BLOCKING_MIN_WEIGHT", 64 * 1024)
  jax.clear_caches()
  yield
  jax.clear_caches()

# A test-only primitive whose CPU lowering is build_matmul_q_streaming with
# explicit parameters (the real rule picks them from the shapes).
_stream_p = Primitive("test_matmul_q_streaming")
_stream_p.def_abstract_eval(
    lambda x, q, s, **_: jax.core.ShapedArray((*x.shape[:-1], q.shape[-1]), jnp.float32))
mlir.register_lowering(
    _stream_p, lambda ctx, x, q, s, **kw: [streaming.build_matmul_q_streaming(x, q, s, **kw)])


def _streaming(x, q, s, **params):
  return jax.jit(lambda x, q, s: _stream_p.bind(x, q, s, **params))(x, q, s)


def _operands(rng, b, m, k, n):
  x = rng.standard_normal((*b, m, k)).astype(np.float32)
  w = rng.standard_normal((*b, k, n)).astype(np.float32) * rng.uniform(0.1, 3, (*b, k, 1))
  qw = hx.quantize(w.astype(np.float32))
  return x, np.asarray(qw.qvalue), np.asarray(qw.scale)


def _assert_close_to_reference(y, x, q, s):
  """``|y - reference| <= 2 gamma_k |x s| @ |q|`` elementwise (see the module docstring)."""
  ref = np.asarray(jax.jit(reference.matmul_q)(x, q, s))
  y = np.asarray(y)
  assert y.shape == ref.shape and y.dtype == np.float32
  xs = x.astype(np.float64) * s.astype(np.float64)[..., None, :]
  assert_within(y, ref, 2 * dot_bound("...mk,...kn->...mn", xs, q))


# (batch, m, k, n, scheme, block): k or n not a multiple of the block, one
# block, a block larger than the axis, batch dims, m = 1; rows (block 1).
SHAPES = [
    ((), 1, 100, 33, "k", 16),      # 6 steps + remainder 4
    ((), 3, 64, 20, "k", 16),       # exact multiple
    ((), 5, 40, 7, "k", 32),        # 1 step + remainder 8 (no loop)
    ((), 2, 30, 9, "k", 64),        # block > k: one dot
    ((2,), 4, 50, 12, "k", 8),      # batch dim
    ((2, 3), 1, 37, 5, "k", 10),    # two batch dims
    ((), 7, 45, 50, "n", 16),       # 3 steps + remainder 2
    ((), 1, 20, 64, "n", 16),       # exact multiple
    ((3,), 6, 19, 23, "n", 5),      # batch dim, remainder 3
    ((), 2, 9, 4, "n", 8),          # block > n
    ((2,), 3, 11, 13, "whole", 0),
    ((), 1, 100, 33, "rows", 1),    # one row of q per step
    ((), 2, 57, 9, "rows", 4),      # 14 steps + 1 row left
    ((), 4, 64, 9, "rows", 4),      # exact multiple
    ((2, 3), 2, 37, 5, "rows", 3),  # two batch dims, 12 steps + 1 row left
    ((), 1, 3, 40, "rows", 4),      # fewer rows than a step: no loop
    ((), 1, 1, 40, "rows", 1),      # a single step
]


@pytest.mark.parametrize("b,m,k,n,scheme,block", SHAPES)
def test_streaming_matches_reference(b, m, k, n, scheme, block):
  rng = np.random.default_rng(abs(hash((b, m, k, n))) % 2**32)
  x, q, s = _operands(rng, b, m, k, n)
  params = {"scheme": scheme}
  if scheme == "k":
    params["block_k"] = block
  elif scheme == "n":
    params["block_n"] = block
  elif scheme == "rows":
    params["rows_per_step"] = block
  _assert_close_to_reference(_streaming(x, q, s, **params), x, q, s)


def test_a_lost_remainder_would_fail_the_tolerance():
  # The check is sharp enough to see one missing row of q: drop the last row's
  # contribution (what an off-by-one remainder would do) and it must fail.
  rng = np.random.default_rng(0)
  x, q, s = _operands(rng, (), 3, 100, 33)
  y = np.asarray(_streaming(x, q, s, scheme="k", block_k=16))
  y_wrong = y - (x[:, -1:] * s[-1]) @ q[-1:].astype(np.float32)
  with pytest.raises(AssertionError, match="error .* > bound"):
    _assert_close_to_reference(y_wrong, x, q, s)


def test_rows_scheme_matches_reference_over_random_shapes():
  # The matrix-vector scheme sums the k products sequentially, the longest
  # chain of any scheme: still within the bound, with batch dims and m = 1..4.
  rng = np.random.default_rng(3)
  for _ in range(8):
    b = tuple(int(d) for d in rng.integers(1, 4, int(rng.integers(0, 3))))
    m = int(rng.integers(1, 5))
    k, n = (int(v) for v in rng.integers(1, 600, 2))
    x, q, s = _operands(rng, b, m, k, n)
    _assert_close_to_reference(_streaming(x, q, s, scheme="rows"), x, q, s)


def test_default_choice_matches_reference_over_random_shapes():
  rng = np.random.default_rng(42)
  for _ in range(6):
    m = int(rng.choice([1, 2, 5, 33, 40]))
    k, n = (int(v) for v in rng.integers(257, 700, 2))  # never a multiple of 256
    x, q, s = _operands(rng, (), m, k, n)
    _assert_close_to_reference(_streaming(x, q, s), x, q, s)


def test_choose_blocking():
  # K-streaming, blocks of K_BLOCK_BYTES or 1/MAX_FRACTION of the weight
  assert streaming.choose_blocking(5, 4096, 4096) == ("k", streaming.K_BLOCK_BYTES // (4 * 4096))
  assert streaming.choose_blocking(streaming.K_STREAMING_MAX_M, 4096, 4096)[0] == "k"
  assert streaming.choose_blocking(5, 2048, 2048) == ("k", 2048 // streaming.MAX_FRACTION)
  assert streaming.choose_blocking(5, 1000, 4096) == ("k", 1000 // streaming.MAX_FRACTION // 8 * 8)
  assert streaming.choose_blocking(5, 300, 4096) == ("k", streaming.MIN_BLOCK)
  # few rows of x: rank-1 updates, ROWS_PER_STEP rows of q per step, whatever the shape
  rows = ("rows", streaming.ROWS_PER_STEP)
  assert streaming.choose_blocking(1, 4096, 4096) == rows
  assert streaming.choose_blocking(streaming.ROWS_MAX_M, 2048, 8192) == rows
  assert streaming.choose_blocking(1, 30, 4096) == rows
  assert streaming.choose_blocking(streaming.ROWS_MAX_M + 1, 4096, 4096)[0] == "k"
  # N-blocking
  assert streaming.choose_blocking(streaming.K_STREAMING_MAX_M + 1, 4096, 4096) == (
      "n", streaming.N_BLOCK_BYTES // (4 * 4096))
  assert streaming.choose_blocking(streaming.LARGE_M + 1, 4096, 4096) == (
      "n", streaming.N_BLOCK_BYTES_LARGE_M // (4 * 4096))
  # no loop
  assert streaming.choose_blocking(256, 64, 64) == ("whole", 0)  # small weight
  assert streaming.choose_blocking(1, 256, 256) == ("whole", 0)  # small weight, m = 1
  assert streaming.choose_blocking(5, 30, 4096) == ("whole", 0)  # a single block


# --- the CPU lowering rule ----------------------------------------------------

def _decomposition_ops(text: str) -> set[str]:
  with mlir.make_ir_context():
    module = ir.Module.parse(text)
    ops = set()

    def visit(op):
      ops.add(op.name)
      return ir.WalkResult.ADVANCE
    for fn in module.body.operations:
      if ir.StringAttr(fn.attributes["sym_name"]).value.startswith("hx.matmul_q.impl"):
        fn.operation.walk(visit)
  return ops


@pytest.mark.parametrize("m,k,n", [(1, 600, 300), (3, 513, 260), (40, 300, 301)])
def test_cpu_rule_streams_and_matches_reference(m, k, n):
  rng = np.random.default_rng(m * k + n)
  x, q, s = _operands(rng, (), m, k, n)
  qw = hx.QArray(jnp.asarray(q), jnp.asarray(s))
  lowered = jax.jit(hx.matmul_q).lower(x, qw)
  text = lowered.as_text()
  assert 'stablehlo.composite "hx.matmul_q"' in text
  assert "stablehlo.while" in _decomposition_ops(text)
  _assert_close_to_reference(lowered.compile()(x, qw), x, q, s)


def test_cpu_rule_keeps_small_weights_on_the_reference_decomposition():
  x = np.ones((2, 6), np.float32)
  qw = hx.quantize(np.ones((6, 5), np.float32))
  text = jax.jit(hx.matmul_q).lower(x, qw).as_text()
  ops = _decomposition_ops(text)
  assert "stablehlo.while" not in ops and "stablehlo.dot_general" in ops


def test_cpu_rule_under_vmap_and_grad():
  rng = np.random.default_rng(7)
  x, q, s = _operands(rng, (3,), 2, 300, 260)
  qw = hx.QArray(jnp.asarray(q), jnp.asarray(s))
  y = jax.jit(jax.vmap(hx.matmul_q, in_axes=(0, hx.QArraySpec())))(x, qw)
  _assert_close_to_reference(y, x, q, s)
  # d/dx sum(x @ w) = sum over columns of w, per row of x
  qw0 = hx.QArray(qw.qvalue[0], qw.scale[0])
  gx = jax.jit(jax.grad(lambda x, qw: hx.matmul_q(x, qw).sum()))(x[0], qw0)
  # a sum over n of q * s (the scale applied before or after the sum: extra=1)
  terms = q[0].astype(np.float32) * s[0][:, None]
  want = (q[0].astype(np.float64) * s[0][:, None]).sum(1)
  assert_within(gx, want, sum_bound(terms, 1, extra=1))


def test_cpu_rule_bounds_temporary_memory():
  # k = n = 2048: the dequantized f32 weight is 16 MiB; the streaming
  # decomposition keeps one block (plus the f32[m, n] accumulator).
  k = n = 2048
  x = jnp.zeros((1, k), jnp.float32)
  qw = hx.QArray(jnp.zeros((k, n), jnp.int8), jnp.zeros((k,), jnp.float32))
  temp = jax.jit(hx.matmul_q).lower(x, qw).compile().memory_analysis().temp_size_in_bytes
  ref_temp = jax.jit(reference.matmul_q).lower(x, qw.qvalue, qw.scale).compile() \
      .memory_analysis().temp_size_in_bytes
  assert ref_temp >= k * n * 4  # the reference materialises the weight...
  assert temp <= k * n * 4 // 8  # ...the streaming form at most an eighth of it


def test_multi_platform_export_keeps_the_cpu_rule_for_cpu_only():
  x = np.ones((1, 600), np.float32)
  q, s = np.ones((600, 260), np.int8), np.ones((600,), np.float32)
  exp = jax.export.export(jax.jit(hx_matmul_q_p.bind), platforms=["cpu", "tpu"])(x, q, s)
  text = exp.mlir_module()
  assert text.count('stablehlo.composite "hx.matmul_q"') == 2  # one per platform branch
  assert text.count("stablehlo.while") == 1  # only the CPU decomposition streams
  y = exp.call(x, q, s)
  # exact: every partial sum of 600 products 1 * 1 * 1 is an integer below 2**24
  np.testing.assert_array_equal(np.asarray(y), np.full((1, 260), 600.0, np.float32))


# --- errors -------------------------------------------------------------------

def test_builder_names_bad_operand_types():
  with pytest.raises(TypeError, match=r"f32\[2,5\], i8\[3,4\], f32\[3\]"):
    _streaming(np.ones((2, 5), np.float32), np.ones((3, 4), np.int8), np.ones(3, np.float32))


@pytest.mark.parametrize("params,msg", [({"scheme": "tiles"},
                                         r"unknown scheme 'tiles' \(expected one of 'rows', "),
                                        ({"scheme": "k", "block_k": 0}, "block_k=0")])
def test_builder_rejects_bad_parameters(params, msg):
  with pytest.raises(ValueError, match=msg):
    _streaming(np.ones((2, 5), np.float32), np.ones((5, 4), np.int8), np.ones(5, np.float32),
               **params)


# --- the Pallas kernel ----------------------------------------------------------

# (batch, m, k, n, blocks): ragged m, k and n; several row, column and k blocks;
# batch dims; a single element.
PALLAS_SHAPES = [
    ((), 1, 100, 33, None),
    ((), 5, 300, 260, None),
    ((2, 3), 3, 17, 129, None),
    ((), 20, 70, 50, (16, 16, 32)),   # 2 row blocks, 4 column blocks, 3 k chunks
    ((2,), 16, 64, 32, (16, 16, 16)),  # exact multiples
    ((), 1, 1, 1, None),
]


@pytest.mark.parametrize("backend", ["triton", "mosaic_tpu"])
@pytest.mark.parametrize("b,m,k,n,blocks", PALLAS_SHAPES)
def test_pallas_kernel_in_interpret_mode_matches_reference(backend, b, m, k, n, blocks):
  rng = np.random.default_rng(abs(hash((b, m, k, n))) % 2**32)
  x, q, s = _operands(rng, b, m, k, n)
  if blocks is not None and backend == "mosaic_tpu":
    blocks = (8, *blocks[1:])
  f = jax.jit(lambda x, q, s: mqp.matmul_q_pallas(x, q, s, backend=backend, interpret=True,
                                                  blocks=blocks))
  _assert_close_to_reference(f(x, q, s), x, q, s)


def _custom_calls(text: str) -> list[tuple[str, str | None]]:
  """``(target, kernel name)`` of every custom call in a module's text."""
  found = []
  with mlir.make_ir_context():
    module = ir.Module.parse(text)

    def visit(op):
      if op.name == "stablehlo.custom_call":
        found.append((ir.StringAttr(op.attributes["call_target_name"]).value,
                      targets.kernel_name_of(op)))
      return ir.WalkResult.ADVANCE
    module.operation.walk(visit)
  return found


def test_pallas_kernel_is_registered_for_gpu_and_tpu():
  ks = {(k.target, k.ir_name): k for k in targets.registered_kernels()}
  assert ks[(targets.TRITON, "hx_matmul_q_v1")].platforms == ("cuda", "rocm")
  assert ks[(targets.MOSAIC_TPU, "hx_matmul_q_v1")].platforms == ("tpu",)
  assert all(k.owner == "hxmlir" for k in ks.values() if k.name == "hx_matmul_q")


@pytest.mark.parametrize("platform,backend,target", [
    ("cuda", "triton", targets.TRITON), ("tpu", "mosaic_tpu", targets.MOSAIC_TPU)])
def test_pallas_kernel_exports_after_install(platform, backend, target):
  x, q, s = np.ones((3, 300), np.float32), np.ones((300, 260), np.int8), np.ones(300, np.float32)
  f = jax.jit(lambda x, q, s: mqp.matmul_q_pallas(x, q, s, backend=backend))
  with hx.installed():
    exp = jax.export.export(f, platforms=[platform])(x, q, s)
  assert _custom_calls(exp.mlir_module()) == [(target, "hx_matmul_q_v1")]
  if backend == "triton":  # the compiler parameters are the ones we chose
    assert f"num_warps = {mqp.TRITON_NUM_WARPS} : i32" in exp.mlir_module()
    assert f"num_stages = {mqp.TRITON_NUM_STAGES} : i32" in exp.mlir_module()


def test_pallas_triton_export_without_install_is_refused_by_jax():
  x, q, s = np.ones((3, 300), np.float32), np.ones((300, 260), np.int8), np.ones(300, np.float32)
  f = jax.jit(lambda x, q, s: mqp.matmul_q_pallas(x, q, s, backend="triton"))
  with pytest.raises(ValueError, match="custom calls whose targets have no compatibility"):
    jax.export.export(f, platforms=["cuda"])(x, q, s)


def test_hx_matmul_q_uses_the_kernel_on_accelerators_only_when_installed():
  x, q, s = np.ones((1, 600), np.float32), np.ones((600, 260), np.int8), np.ones(600, np.float32)
  f = jax.jit(hx_matmul_q_p.bind)
  with hx.installed():
    exp = jax.export.export(f, platforms=["cpu", "cuda", "tpu"])(x, q, s)
    text = exp.mlir_module()
  assert text.count('stablehlo.composite "hx.matmul_q"') == 3  # one per platform branch
  assert sorted(_custom_calls(text)) == sorted([(targets.MOSAIC_TPU, "hx_matmul_q_v1"),
                                                (targets.TRITON, "hx_matmul_q_v1")])
  # exact: every partial sum of 600 products 1 * 1 * 1 is an integer below 2**24
  np.testing.assert_array_equal(np.asarray(exp.call(x, q, s)), np.full((1, 260), 600.0))
  plain = jax.export.export(f, platforms=["cuda", "tpu"])(x, q, s).mlir_module()
  assert _custom_calls(plain) == []  # not installed: the reference decomposition


def test_pallas_kernel_errors():
  x, q, s = np.ones((2, 5), np.float32), np.ones((3, 4), np.int8), np.ones(3, np.float32)
  with pytest.raises(TypeError, match=r"got f32\[2,5\], i8\[3,4\], f32\[3\]"):
    mqp.matmul_q_pallas(x, q, s, backend="mosaic_tpu", interpret=True)
  q = np.ones((5, 4), np.int8)
  with pytest.raises(ValueError, match="unknown backend 'cuda'"):
    mqp.matmul_q_pallas(x, q, np.ones(5, np.float32), backend="cuda")
  with pytest.raises(ValueError, match="powers of two >= 16"):
    mqp.matmul_q_pallas(x, q, np.ones(5, np.float32), backend="triton", blocks=(16, 24, 16))


def test_builder_works_on_plain_mlir_without_jax_tracing():
  # What a pass does: build hx.matmul_q with the streaming decomposition into a
  # module parsed from text, with nothing but jaxlib.mlir.
  from jaxlib.mlir.dialects import func as func_dialect

  from hxmlir.lowering import composite, schema
  from hxmlir.types.dotdims import v1_dims
  text = """
  func.func @main(%x: tensor<2x600xf32>, %q: tensor<600x300xi8>, %s: tensor<600xf32>)
      -> tensor<2x300xf32> {
    %0 = stablehlo.constant dense<0.0> : tensor<2x300xf32>
    return %0 : tensor<2x300xf32>
  }"""
  with mlir.make_ir_context(), ir.Location.unknown():
    module = ir.Module.parse(text)
    fn = module.body.operations[0]
    ret = fn.regions[0].blocks[0].operations[1]
    with ir.InsertionPoint(ret):
      (y,) = composite.build_composite("hx.matmul_q", list(fn.arguments),
                                       [ir.RankedTensorType.get([2, 300], ir.F32Type.get())],
                                       streaming.streaming_decomposition,
                                       attributes=schema.matmul_q_attributes(
                                           v1_dims(2), schema.format_attributes("int8", None)))
    ret.operands[0] = y
    assert module.operation.verify()
    out = str(module)
  assert isinstance(fn, func_dialect.FuncOp)
  assert 'stablehlo.composite "hx.matmul_q"' in out
  assert "stablehlo.while" in out and "sizes = [1, 300]" in out  # m = 2: one row of q per step


@pytest.mark.parametrize("m,xspec,wspec", [(4, ("i",), (None, "j")),      # K-streaming
                                           (64, ("i",), (None, "j")),     # N-blocking
                                           (8, (None,), (None, None))])
def test_cpu_rule_under_explicit_sharding(m, xspec, wspec, mesh):
  rng = np.random.default_rng(m)
  x = rng.standard_normal((m, 600)).astype(np.float32)
  w = rng.standard_normal((600, 300)).astype(np.float32)
  with jax.set_mesh(mesh):
    qw = hx.quantize(jax.device_put(w, P(*wspec)))
    xd = jax.device_put(x, P(*xspec))
    f = jax.jit(hx.matmul_q)
    assert "stablehlo.while" in _decomposition_ops(f.lower(xd, qw).as_text())
    y = f(xd, qw)
    assert tuple(y.sharding.spec) + (None,) * (2 - len(y.sharding.spec)) == (xspec[0], wspec[1])
  _assert_close_to_reference(np.asarray(y), x, np.asarray(qw.qvalue), np.asarray(qw.scale))
