"""The TYPE-string grammar (hxmlir.types.typestr): every type JAX and hxmlir print parses back to
itself, every hi array type of the table (each quantized format) included, pytrees, meshes;
bad text is one error naming the column and what was expected there."""

from __future__ import annotations

import hx_testing
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import hxmlir as hx
from hxmlir.types import typedesc, typestr
from hxmlir.types.typestr import TypeStrError, parse_arg, parse_mesh, parse_type


@pytest.mark.parametrize("text", [
    "f32[8,512]", "i32[4]", "f32[]", "bf16[2,3]", "f16[1]", "i8[3]", "u32[2]", "bool[5]",
    "c64[2]", "f8_e4m3fn[4]", "f64[2,2]",
    "q8[512,256]", "q8[3]", "r1[6,5]", "r1[2,6,5]",
    "Tup{}", "Tup{f32[3]}", "Tup{f32[3],q8[2,4]}", "Tup{Tup{i32[1]},r1[2,3]}",
])
def test_printed_types_parse_back_to_themselves(text):
  ty = parse_type(text)
  assert typestr.type_str(ty) == text
  assert parse_arg(text) == ty


@pytest.mark.parametrize("name", sorted(typestr.HI_TYPES))
def test_every_hi_array_type_of_the_table_parses_to_its_descriptor(name):
  """Each entry (each quantized format) builds the type typedesc builds; a block format's
  group and f16 scales are implied by its name, and printed."""
  entry = typestr.HI_TYPES[name]
  block = hx_testing.block_of(name)
  n = block or 6
  ty = parse_type(f"{name}[4,{n}]")
  assert typedesc.to_json(ty)["type"] == entry.descriptor
  assert typestr.type_str(ty) == (f"{name}[4,{n}:g{block},f16]" if block else f"{name}[4,6]")
  assert parse_type(typestr.type_str(ty)) == ty


def test_types_are_the_types_of_real_values():
  x = jnp.ones((2, 3), jnp.float32)
  assert parse_type("q8[2,3]") == jax.typeof(hx.quantize(x))
  assert parse_type("r1[2,3]") == jax.typeof(hx.outer(jnp.ones(2), jnp.ones(3)))
  assert parse_type("Tup{f32[2,3],i32[]}") == jax.typeof(hx.make_tup(x, jnp.int32(1)))
  assert parse_type("f32[2,3]") == jax.typeof(x).update(weak_type=False)


def test_sharded_dims_are_on_the_mesh():
  mesh = parse_mesh("i=4,j=2")
  ty = parse_type("f32[8@i,6@j]", mesh)
  assert ty.sharding.spec == P("i", "j") and ty.sharding.mesh.axis_sizes == (4, 2)
  assert ty.sharding.mesh.axis_types == (AxisType.Explicit,) * 2
  assert typestr.type_str(ty) == "f32[8@i,6@j]"
  both = parse_type("q8[8@(i,j),3]", mesh)
  assert both.sharding.spec == P(("i", "j"), None)
  assert typestr.type_str(both) == "q8[8@(i,j),3]"
  # an unsharded type given a mesh is replicated on it
  assert parse_type("f32[2]", mesh).sharding.mesh.axis_names == ("i", "j")


def test_mesh_axis_types():
  mesh = parse_mesh("i=2:auto, j=4:explicit,k=1")
  assert mesh.axis_names == ("i", "j", "k") and mesh.axis_sizes == (2, 4, 1)
  assert mesh.axis_types == (AxisType.Auto, AxisType.Explicit, AxisType.Explicit)
  assert isinstance(parse_type("f32[4@j]", mesh).sharding, NamedSharding)


@pytest.mark.parametrize("text, message", [
    ("i", "entry 'i': expected NAME=SIZE"), ("i=2:weird", "TYPE one of"),
    ("i=0", "entry 'i=0': axis 'i' has size 0; a mesh axis's size must be positive"),
    ("i=2,i=3", "axis 'i' given twice"),
])
def test_bad_meshes(text, message):
  with pytest.raises(TypeStrError, match=message):
    parse_mesh(text)


def test_pytrees_of_types():
  got = parse_arg('{w: q8[4,3], "b-1": f32[3], n: None}')
  assert got == {"w": parse_type("q8[4,3]"), "b-1": parse_type("f32[3]"), "n": None}
  assert parse_arg("(f32[2],)") == (parse_type("f32[2]"),)
  assert parse_arg("( f32[2] , [i32[1], {}] )") == (parse_type("f32[2]"),
                                                    [parse_type("i32[1]"), {}])
  assert parse_arg("[]") == []


def test_json_arguments():
  got = typestr.parse_json_args(["f32[2]", {"w": "q8[2,3]", "l": ["i32[1]", None]}])
  assert got == [parse_type("f32[2]"), {"w": parse_type("q8[2,3]"),
                                        "l": [parse_type("i32[1]"), None]}]
  with pytest.raises(TypeStrError, match=r"JSON argument 1\['w'\] 'q8\[2,x\]': column 6: "
                                         r"expected a dimension size"):
    typestr.parse_json_args(["f32[2]", {"w": "q8[2,x]"}])
  with pytest.raises(TypeStrError, match="expected a list of arguments"):
    typestr.parse_json_args({"a": "f32[2]"})
  with pytest.raises(TypeStrError, match=r"argument 0: expected a type string.*got 3"):
    typestr.parse_json_args([3])


@pytest.mark.parametrize("text, message", [
    ("f32[8,x]", "column 7: expected a dimension size (an integer), got 'x'"),
    ("x32[4]", "column 1: expected a type (a dtype such as f32[8,512], q8[...], q4[...], "
               "f8[...], u4o[...], q8o[...], q5_0[...], q5_1[...], iq4_nl[...], q4_k[...], "
               "q5_k[...], q6_k[...], q2_k[...], q3_k[...], iq4_xs[...], r1[...] or Tup{...}); "
               "'x32' is not a dtype"),
    ("f32[4", "column 6: expected ',' or ']' after a dimension, got the end of the text"),
    ("f32(4)", "column 4: expected '[' after f32, got '('"),
    ("f32[4]]", "column 7: expected the end of the text, got ']'"),
    ("f32[4] f32[3]", "column 8: expected the end of the text, got 'f32'"),
    ("", "column 1: expected a type"),
    ("{w q8[3]}", "column 4: expected ':' after dict key 'w', got 'q8'"),
    ("{3: f32[1]}", "column 2: expected a dict key"),
    ("Tup[f32[1]]", "column 4: expected '{' after Tup, got '['"),
    ("Tup{f32[1] q8[2]}", "column 12: expected ',' or '}' after a tuple element type"),
    ("r1[4,3:g32]", "column 8: expected ']': r1 takes no options, got 'g32'"),
    ("q4[4,3:x32]", "column 8: expected an option of q4 (gN, f16 (f16 scales)), got 'x32'"),
    ("u4o[64,64:g32,f64]", "column 15: expected an option of u4o (gN, f16 (f16 scales)), "
                           "got 'f64'"),
    ("q8[192,576:g32,f16,f16]", "column 20: expected an option not given before (f16 is "
                                "already there), got 'f16'"),
    ("q8[192,576:g32,g16]", "column 16: expected an option not given before (g32 is already "
                            "there), got 'g16'"),
    ("q8[4,3:g32]", "q8[4,3:g32]: the last axis (3) is not a multiple of the group size 32"),
    ("f32[8@i]", "column 7: expected an unsharded dimension: a sharded dimension needs a mesh "
                 "(--mesh i=N), got 'i'"),
    ("f32[8@]", "column 7: expected a mesh axis name, got ']'"),
    ("f32[-1]", "column 5: expected a dimension size (an integer), got '-'"),
    ("f32[2;3]", "column 6: expected ',' or ']' after a dimension, got ';'"),
    ("q8[]", "a quantized array needs at least one axis"),
    ("r1[3]", "a rank-1 matrix has at least two axes"),
])
def test_bad_type_text_is_one_error_naming_the_column(text, message):
  with pytest.raises(TypeStrError) as e:
    parse_arg(text, what="--arg 1")
  msg = str(e.value)
  assert msg.startswith(f"--arg 1 {text!r}"), msg
  assert message in msg and "\n" not in msg, msg


def test_unknown_mesh_axis_is_named():
  with pytest.raises(TypeStrError, match=r"column 7: expected a mesh axis of the mesh \(i, j\), "
                                         "got 'k'"):
    parse_arg("f32[8@k]", parse_mesh("i=4,j=2"))


def test_a_new_format_is_one_table_entry(monkeypatch):
  """A format with options (``q4[...:g32]``) needs only its entry (and a descriptor): the
  parser reads its options into the descriptor it hands typedesc."""
  seen = {}

  def fake_from_json(d, where="descriptor"):
    seen.update(d)
    return "built"
  monkeypatch.setitem(typestr.HI_TYPES, "q4", typestr.HiArrayType("q4", "q8", {"g": "group"}))
  monkeypatch.setattr(typedesc, "from_json", fake_from_json)
  assert parse_type("q4[512,256:g32]") == "built"
  assert seen["type"] == "q8" and seen["shape"] == [512, 256] and seen["group"] == 32
  with pytest.raises(TypeStrError, match=r"column 12: expected an option of q4 \(gN, f16 \(f16 scales\)\), got 'x3'"):
    parse_type("q4[512,256:x3]")
