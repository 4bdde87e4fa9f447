"""hxmlir.testing: the lit helper's label, pipeline, platforms, mesh and static arguments."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import hxmlir as hx
from hxmlir import testing
from hxmlir.types.typestr import TypeStrError


def dequant_dot(x, w):
  return x @ hx.dequantize(w)


def test_label_names_the_argument_types(capsys):
  qw = hx.quantize(jnp.ones((6, 5), jnp.float32))
  testing.print_ir("mm", hx.matmul_q, jnp.ones((2, 6), jnp.float32), qw)
  out = capsys.readouterr().out
  assert out.startswith("\nTEST: mm f32[2,6] q8[6,5]\nmodule @jit_matmul_q")
  assert "loc(" not in out  # no locations unless asked for


def test_type_strings_and_pytrees_in_the_label(capsys):
  testing.print_ir("d", lambda x, p: x @ hx.dequantize(p["w"]) + p["b"], "f32[2,4]",
                   "{w: q8[4,3], b: f32[3]}")
  first = capsys.readouterr().out.splitlines()[1]
  assert first == "TEST: d f32[2,4] {b:f32[3],w:q8[4,3]}"  # dict keys sorted, as JAX flattens


def test_passes_false_true_and_a_pipeline():
  plain = testing.lowered_text(dequant_dot, "f32[2,4]", "q8[4,3]")
  assert '"hx.dequantize"' in plain and '"hx.matmul_q"' not in plain
  folded = testing.lowered_text(dequant_dot, "f32[2,4]", "q8[4,3]", passes=True)
  assert '"hx.matmul_q"' in folded and '"hx.dequantize"' not in folded
  decomposed = testing.lowered_text(dequant_dot, "f32[2,4]", "q8[4,3]", passes="hx-decompose")
  assert "stablehlo.composite" not in decomposed
  assert not hx.is_installed()  # the pipeline was scoped to the call


def test_platforms():
  text = testing.lowered_text(dequant_dot, "f32[2,4]", "q8[4,3]", platforms=("cpu", "tpu"))
  assert re.search(r"@main\(%arg0: tensor<i32>", text), text  # the platform index argument


def test_mesh_without_devices_and_hi_types_keep_component_shardings():
  text = testing.lowered_text(lambda t: t, "Tup{f32[8@i],q8[4,6@j]}", mesh="i=4,j=2")
  assert '%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"i"}]>}' in text
  assert '%arg1: tensor<4x6xi8> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"j"}]>}' in text
  # the scale drops the quantized (last) axis, and its sharding
  assert '%arg2: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}' in text


def test_static_arguments_are_bound_not_traced():
  def scale(x, *, by):
    return x * by
  text = testing.lowered_text(scale, "f32[3]", static={"by": 3.0})
  assert text.startswith("module @jit_scale")
  assert "dense<3.000000e+00>" in text


def test_bad_type_text():
  with pytest.raises(TypeStrError, match=r"argument 1 'q8\[4,\]': column 6: expected a "
                                         r"dimension size"):
    testing.lowered_text(dequant_dot, "f32[2,4]", "q8[4,]")


def test_mesh_of_devices():
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices")
  m = testing.mesh("i=4,j=2:auto")
  assert m.shape == {"i": 4, "j": 2}
  assert m.axis_types == (jax.sharding.AxisType.Explicit, jax.sharding.AxisType.Auto)
