"""``jax.export`` for several platforms at once, with every ``hx.*`` composite.

Multi-platform lowering gives every function a leading platform-index
argument. JAX 0.10.2's own ``jax.lax.composite`` passes it to the
decomposition too, so its composites fail to verify ("has 2 operand(s), but
decomposition has 3"); ours lower their decompositions without it. These tests
export for ``cpu``, ``cuda`` and ``tpu`` on this CPU machine, round-trip the
artifact through ``serialize``/``deserialize``, and run it on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hx_testing import KERNEL_TARGETS
from hx_testing import kernel_calls as _kernel_calls
from jax import export
from jax.interpreters import mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir

import hxmlir as hx
from hxmlir.lowering import schema

PLATFORMS = ["cpu", "cuda", "tpu"]


def every_op(x, w, col, row):
  """Uses each hx composite once: ``f32[m,k], f32[k,n], f32[k], f32[p]`` (attention: ``m``
  queries of one head over a cache of ``n`` positions, keys ``w.T``, values ``w``)."""
  qw = hx.quantize(w)
  return (hx.matmul_q(x, qw), hx.dequantize(qw), hx.matmul_r1(x, hx.outer(col, row)),
          hx.attention(x[:, None, None, :], w.T[None], w[None], 1, scale=0.5))


def _args():
  rng = np.random.default_rng(7)
  return (rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32),
          rng.normal(size=(3,)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32))


def _composites(text: str) -> list[tuple[str, int, int]]:
  """(name, version, number of operands) of every composite, and checks decompositions.

  Asserts that each decomposition's inputs are exactly the composite's operand
  types (no platform-index argument).
  """
  out = []
  with mlir.make_ir_context():
    module = ir.Module.parse(text)
    funcs = {ir.StringAttr(op.attributes["sym_name"]).value: op
             for op in module.body.operations if op.operation.name == "func.func"}

    def visit(op):
      if op.name == "stablehlo.composite":
        name = ir.StringAttr(op.attributes["name"]).value
        fn = funcs[ir.FlatSymbolRefAttr(op.attributes["decomposition"]).value]
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        assert [str(t) for t in ftype.inputs] == [str(v.type) for v in op.operands], name
        assert [str(t) for t in ftype.results] == [str(r.type) for r in op.results], name
        out.append((name, ir.IntegerAttr(op.attributes["version"]).value, len(op.operands)))
      return ir.WalkResult.ADVANCE
    module.operation.walk(visit)
  return out


def test_export_for_three_platforms_keeps_every_composite():
  exp = export.export(jax.jit(every_op), platforms=PLATFORMS)(*_args())
  assert exp.platforms == tuple(PLATFORMS)
  found = _composites(exp.mlir_module())
  names = {n for n, _, _ in found}
  assert names == set(schema.SCHEMAS)
  for name, version, nops in found:
    # the formats with f32 scales and no offset keep the version that holds them (legacy_version)
    spec = schema.SCHEMAS[name]
    # hx.attention without a window or a soft cap keeps version 1 (version 2 adds those)
    assert version == (1 if name == "hx.attention" else spec.legacy_version or spec.version)
    assert nops == schema.SCHEMAS[name].num_operands


def test_serialize_deserialize_round_trip_runs_on_cpu():
  args = _args()
  exp = export.export(jax.jit(every_op), platforms=PLATFORMS)(*args)
  blob = exp.serialize()
  back = export.deserialize(blob)
  assert back.platforms == tuple(PLATFORMS)
  assert sorted(_composites(back.mlir_module())) == sorted(_composites(exp.mlir_module()))
  got = back.call(*args)
  want = jax.jit(every_op)(*args)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  # and the deserialized artifact serializes to the same bytes again
  assert back.serialize() == blob


def test_sharded_export_keeps_sdy_annotations(mesh):
  x, w, col, row = _args()
  with jax.set_mesh(mesh):
    args = (jax.device_put(np.tile(x, (4, 1)), NamedSharding(mesh, P("i", None))),
            jax.device_put(w, NamedSharding(mesh, P(None, None))),
            jax.device_put(col, NamedSharding(mesh, P(None))),
            jax.device_put(np.tile(row, 2)[:4], NamedSharding(mesh, P("j"))))
    exp = export.export(jax.jit(every_op), platforms=PLATFORMS)(*args)
    back = export.deserialize(exp.serialize())
    got = back.call(*args)
    want = jax.jit(every_op)(*args)
  text = back.mlir_module()
  assert 'sdy.sharding_per_value<[<@mesh, [{"i"}, {"j"}]>]>' in text  # matmul_r1: rows i, cols j
  assert 'sdy.sharding_per_value<[<@mesh, [{"i"}, {}]>]>' in text     # matmul_q: rows like x
  for g, w_ in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w_))


def test_jax_lax_composite_fails_where_ours_succeed():
  """Pins the JAX 0.10.2 behaviour hxmlir works around (see the module docstring).

  If this starts failing, JAX fixed multi-platform composites and
  ``lowering/composite.py`` may lower decompositions the way JAX does.
  """
  def plain(x):
    return jax.lax.composite(lambda x: x * 2.0, name="my.double")(x)
  x = jnp.ones((3,), jnp.float32)
  export.export(jax.jit(plain), platforms=["cpu"])(x)  # one platform: fine
  # one operand, plus the platform index in the decomposition:
  with pytest.raises(Exception, match=r"has 1 operand\(s\), but decomposition has 2"):
    export.export(jax.jit(plain), platforms=["cpu", "tpu"])(x)
  # ours, same shape of program:
  exp = export.export(jax.jit(hx.dequantize), platforms=["cpu", "tpu"])(hx.quantize(x[None]))
  assert [n for n, _, _ in _composites(exp.mlir_module())] == ["hx.dequantize"]


# --- installed: hxmlir's kernels in programs over several devices -----------------------
# Mosaic refuses to be partitioned ("Mosaic kernels cannot be automatically partitioned")
# and XLA would replicate a Triton call's operands: under explicit shardings each device
# runs the kernel on its shards (sdy.manual_computation); on Auto axes, whose shardings
# XLA picks after lowering, the decomposition is the reference.

def _dense_np(q):
  from hxmlir import formats
  values, scale = (np.asarray(c) for c in hx.qarray_parts(q))
  v = np.asarray(formats.values_f32(jnp.asarray(values)), np.float64)
  s = scale.astype(np.float64)
  if s.ndim == v.ndim:  # per group
    return (v.reshape(*v.shape[:-1], s.shape[-1], -1) * s[..., None]).reshape(v.shape)
  return v * s[..., None]


@pytest.fixture
def installed():
  hx.install()
  yield
  hx.uninstall()


def _sharded_matmul_q_args(mesh, dtype, group):
  rng = np.random.default_rng(11)
  x = rng.integers(-4, 5, (8, 64)).astype(np.float32)
  q = hx.quantize(jnp.asarray(rng.normal(size=(64, 256)).astype(np.float32)), dtype,
                  group_size=group)
  return (jax.device_put(x, NamedSharding(mesh, P("i", None))),
          jax.device_put(q, NamedSharding(mesh, P(None, "j")))), x, q


@pytest.mark.parametrize("dtype, group", [(jnp.int8, None), (jnp.int4, 32),
                                          (jnp.float8_e4m3fn, 64)])
def test_installed_sharded_export_runs_the_kernels_per_shard(mesh, installed, dtype, group):
  from numerics import assert_matmul_close

  from hxmlir import export as hxe
  with jax.set_mesh(mesh):
    args, x, q = _sharded_matmul_q_args(mesh, dtype, group)
    exp = hxe.export(jax.jit(hx.matmul_q), platforms=PLATFORMS)(*args)
    got = hxe.deserialize(exp.serialize()).call(*args)
  calls = _kernel_calls(exp.mlir_module())
  # tpu: the formats Mosaic compiles (int8 and fp8 per row), else the decomposition
  tpu = [(KERNEL_TARGETS["tpu"], True)] if group is None else []
  assert sorted(calls) == [(KERNEL_TARGETS["cuda"], True), *tpu]
  text = exp.mlir_module()
  assert 'manual_axes={"i", "j"}' in text
  assert 'in_shardings=[<@mesh, [{"i"}, {}]>, <@mesh, [{}, {"j"}]>' in text
  assert jax.typeof(got).sharding.spec == P("i", "j")
  want = jax.jit(hx.matmul_q)(jnp.asarray(x), q)    # unsharded, on one device
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert_matmul_close(np.asarray(got), x, _dense_np(q))


def test_installed_sharded_export_on_auto_axes_keeps_the_reference(installed):
  from jax.sharding import AxisType

  from hxmlir import export as hxe
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices")
  auto = jax.make_mesh((4, 2), ("i", "j"), axis_types=(AxisType.Auto, AxisType.Auto))
  args, x, q = _sharded_matmul_q_args(auto, jnp.int8, None)
  exp = hxe.export(jax.jit(hx.matmul_q), platforms=PLATFORMS)(*args)
  assert _kernel_calls(exp.mlir_module()) == []
  got = exp.call(*args)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(hx.matmul_q)(
      jnp.asarray(x), q)))


def test_installed_single_device_export_calls_the_kernels_directly(installed):
  rng = np.random.default_rng(12)
  x = rng.integers(-4, 5, (8, 64)).astype(np.float32)
  q = hx.quantize(jnp.asarray(rng.normal(size=(64, 256)).astype(np.float32)))
  exp = export.export(jax.jit(hx.matmul_q), platforms=PLATFORMS)(x, q)
  assert sorted(_kernel_calls(exp.mlir_module())) == [(KERNEL_TARGETS["cuda"], False),
                                                      (KERNEL_TARGETS["tpu"], False)]


def test_cli_export_with_a_mesh_for_every_platform(tmp_path, capsys):
  from hxmlir import export as hxe
  from hxmlir.tools import cli
  if jax.device_count() < 4:
    pytest.skip("needs 4 devices")
  art = tmp_path / "mm.hxa"
  rc = cli.main(["export", "hxmlir:matmul_q", "--arg", "f32[8@i,64]", "--arg", "q8[64,256]",
                 "--mesh", "i=4", "-o", str(art)])
  assert rc == 0, capsys.readouterr().err
  exp = hxe.deserialize(art.read_bytes())
  assert "tpu" in exp.platforms and "cuda" in exp.platforms
  assert sorted(_kernel_calls(exp.mlir_module())) == [(KERNEL_TARGETS["cuda"], True),
                                                      (KERNEL_TARGETS["tpu"], True)]


@pytest.mark.parametrize("x_shape, x_spec, q_shape, q_spec", [
    ((4, 8, 16), P("i", None, None), (4, 16, 32), P("i", None, "j")),   # batched, batch on i
    ((4, 2, 16), P("i", None, None), (16, 32), P(None, "j")),           # x's leading dims collapsed
])
def test_installed_sharded_export_of_batched_and_collapsed_layouts(mesh, installed, x_shape,
                                                                   x_spec, q_shape, q_spec):
  from numerics import assert_matmul_close

  from hxmlir import export as hxe
  rng = np.random.default_rng(13)
  x = rng.integers(-4, 5, x_shape).astype(np.float32)
  q = hx.quantize(jnp.asarray(rng.normal(size=q_shape).astype(np.float32)))
  with jax.set_mesh(mesh):
    args = (jax.device_put(x, NamedSharding(mesh, x_spec)),
            jax.device_put(q, NamedSharding(mesh, q_spec)))
    exp = hxe.export(jax.jit(hx.matmul_q), platforms=PLATFORMS)(*args)
    got = exp.call(*args)
  assert sorted(_kernel_calls(exp.mlir_module())) == [(KERNEL_TARGETS["cuda"], True),
                                                      (KERNEL_TARGETS["tpu"], True)]
  dense = _dense_np(q)
  assert_matmul_close(np.asarray(got), x, np.broadcast_to(dense, (*x_shape[:-2], *q_shape[-2:]))
                      if len(q_shape) < len(x_shape) else dense)
