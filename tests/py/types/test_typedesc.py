"""Type descriptors (hxmlir.types.typedesc): exact text, round trips, and refusals."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.hijax import ShapedArray
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import hxmlir as hx
from hxmlir.types import typedesc as td


def _mesh():
  return jax.make_mesh((2, 4), ("i", "j"), axis_types=(AxisType.Explicit,) * 2)


def test_q8_descriptor_text_is_stable():
  # The exact text is a compatibility promise: artifacts embed it.
  ty = jax.typeof(hx.quantize(jnp.ones((3, 4), "float32")))
  assert td.describe(ty) == (
      '{"shape":[3,4],"sharding":{"axis_types":[],"mesh":[],"spec":[null,null]},'
      '"type":"q8","v":1}')


def test_sharded_q8_descriptor_records_mesh_axes_and_spec():
  mesh = _mesh()
  x = jax.device_put(jnp.ones((8, 4), "float32"), NamedSharding(mesh, P("i")))
  d = td.to_json(jax.typeof(hx.quantize(x)))
  assert d == {"type": "q8", "v": 1, "shape": [8, 4],
               "sharding": {"mesh": [["i", 2], ["j", 4]],
                            "axis_types": ["Explicit", "Explicit"], "spec": ["i", None]}}


def _types():
  mesh = _mesh()
  xs = jax.device_put(jnp.ones((8, 4), "float32"), NamedSharding(mesh, P(("i", "j"))))
  q = hx.quantize(jnp.ones((3, 4), "float32"))
  r = hx.outer(jnp.ones(6, "float32"), jnp.ones(5, "float32"))
  return {
      "f32": jax.typeof(jnp.ones((2, 3), "float32")),
      "bf16": jax.typeof(jnp.ones((2,), "bfloat16")),
      "weak_scalar": jax.typeof(1.0),
      "i8_sharded": jax.typeof(jax.device_put(jnp.ones((8, 2), "int8"),
                                              NamedSharding(mesh, P("j")))),
      "q8": jax.typeof(q),
      "q8_sharded": jax.typeof(hx.quantize(xs)),
      "r1": jax.typeof(r),
      "tup": jax.typeof(hx.make_tup(xs, q, hx.make_tup(r, jnp.int32(3)))),
  }


@pytest.mark.parametrize("name", list(_types()))
def test_round_trip(name):
  ty = _types()[name]
  text = td.describe(ty)
  back = td.parse(text)
  assert back == td.canonical(ty)
  assert td.describe(back) == text
  assert back.str_short() == ty.str_short()
  if name in ("f32", "bf16", "weak_scalar", "q8", "r1"):  # no mesh: nothing device-specific
    assert back == ty


def test_weak_type_is_kept():
  back = td.parse(td.describe(jax.typeof(1.0)))
  assert isinstance(back, ShapedArray) and back.weak_type and back.dtype == jnp.float32


def test_unknown_type_name_is_refused():
  with pytest.raises(td.DescriptorError, match=r"unknown type name 'q2'; this hxmlir knows "
                     r"array, f8, iq4_nl, iq4_xs, q2_k, q3_k, q4, q4_k, q5_0, q5_1, q5_k, q6_k, "
                     r"q8, q8o, r1, tup, u4o"):
    td.parse('{"type":"q2","v":1,"shape":[3,4]}')


def test_newer_schema_version_is_refused():
  d = td.to_json(jax.typeof(hx.quantize(jnp.ones((3, 4), "float32"))))
  d["v"] = 4
  with pytest.raises(td.DescriptorError, match=r"type 'q8' has schema version 4, newer than "
                     r"the 3 this hxmlir reads; upgrade hxmlir"):
    td.from_json(d)


def test_newer_version_inside_a_tuple_names_the_element():
  d = td.to_json(jax.typeof(hx.make_tup(jnp.ones(2), hx.quantize(jnp.ones((3, 4))))))
  d["elts"][1]["v"] = 7
  with pytest.raises(td.DescriptorError, match=r"element 1: type 'q8' has schema version 7"):
    td.from_json(d)


@pytest.mark.parametrize("text,msg", [
    ("not json", "not a JSON type descriptor"),
    ('{"v":1}', "expected an object with a 'type' name"),
    ('{"type":"q8","shape":[3]}', "needs an integer schema version"),
    ('{"type":"q8","v":1,"shape":[3,-4],"sharding":{"mesh":[],"spec":[]}}',
     "'shape' must be a list of non-negative ints"),
    ('{"type":"q8","v":1,"shape":[],"sharding":{"mesh":[],"spec":[]}}',
     "a quantized array needs at least one axis"),
    ('{"type":"array","v":1,"dtype":"float33","shape":[2],"sharding":{"mesh":[],"spec":[]}}',
     "unknown dtype 'float33'"),
    ('{"type":"r1","v":1,"shape":[4,4],"sharding":{"mesh":[["i",2]],"spec":["k",null]}}',
     "spec axis 'k' is not a mesh axis"),
])
def test_malformed_descriptors_are_refused(text, msg):
  with pytest.raises(td.DescriptorError, match=msg):
    td.parse(text)


def test_descriptor_is_json_with_sorted_keys():
  text = td.describe(jax.typeof(hx.outer(jnp.ones(2), jnp.ones(3))))
  assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
