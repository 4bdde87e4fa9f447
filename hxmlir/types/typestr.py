"""Types written as JAX and hxmlir print them: ``f32[8,512]``, ``q8[512,256]``, ``Tup{...}``.

The grammar (what ``hxmlir lower/export --arg`` and :func:`hxmlir.testing`
read)::

  arg    := type | dict | tuple | list | 'None'          (a pytree of types)
  dict   := '{' [KEY ':' arg (',' KEY ':' arg)*] '}'     KEY: a name or a "quoted" string
  tuple  := '(' [arg (',' arg)*] ')'                     always a tuple, also with one element
  list   := '[' [arg (',' arg)*] ']'
  type   := DTYPE '[' dims ']'                           f32[8,512], i32[4], bf16[], bool[3]
          | HI '[' dims [':' OPT (',' OPT)*] ']'         q8[512,256], r1[6,5] (see HI_TYPES)
          | 'Tup' '{' [type (',' type)*] '}'             Tup{f32[3],q8[2,4]}
  dims   := [dim (',' dim)*]
  dim    := INT ['@' AXIS | '@' '(' AXIS (',' AXIS)* ')']   8@i: sharded over mesh axis i

``DTYPE`` is JAX's short name (``f32``, ``bf16``, ``i8``, ``u32``, ``c64``,
``f8_e4m3fn``, ``bool``) or the NumPy name (``float32``). A sharded dimension
needs a mesh (:func:`parse_mesh`, ``--mesh i=4,j=2``); given a mesh, every
type lives on it (unsharded dimensions replicated). Spaces are allowed between
tokens.

Types are built through :mod:`hxmlir.types.typedesc` (the artifact format's
descriptors), so the text reads exactly what artifacts can hold. A hi array
type is one entry of :data:`HI_TYPES`: its name as printed, the descriptor
type it builds, and the options it takes after ``:`` (``q4[512,256:g32]``, int4 values
with one scale per 32 elements, is ``HiArrayType("q4", "q4", {"g": "group"})``).

Errors are :class:`TypeStrError`: one line naming the text, the column
(1-based) and what was expected there.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, NoReturn

import jax.numpy as jnp
from jax.sharding import AbstractMesh, AxisType

from hxmlir import formats
from hxmlir.types import typedesc


@dataclass(frozen=True)
class HiArrayType:
  """A hi array type's text form: ``name[dims(:opts)]`` builds descriptor ``descriptor``.

  ``options`` maps an option's letter prefix to the descriptor key it sets
  (``{"g": "group"}`` reads ``:g32`` as ``"group": 32``).
  """
  name: str
  descriptor: str
  options: dict[str, str] = field(default_factory=dict)


HI_TYPES: dict[str, HiArrayType] = {t.name: t for t in (
    # the quantized formats' printed names (hxmlir.formats.FORMATS): q8[64,128],
    # q4[64,128:g32], f8[64,128:g64], u4o[576,1536:g32] (offsets), q8[64,128:g32,f16]
    *(HiArrayType(p, p, {"g": "group"}) for p in formats.prefix_names()),
    HiArrayType("r1", "r1"),   # rank-1 matrix, two f32 factors (hxmlir.types.rank1)
)}
"""Hi array types by printed name: the quantized formats' (from :data:`hxmlir.formats.FORMATS`,
with their descriptors in :mod:`hxmlir.types.typedesc`) and ``r1``."""

_AXIS_TYPES = {t.name.lower(): t for t in AxisType}


class TypeStrError(ValueError):
  """Type text that does not parse: the message names the text, the column and what was
  expected there."""


_TOKEN = re.compile(r"\s*(?:(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<str>\"(?:[^\"\\]|\\.)*\")|(?P<punct>[\[\]{}(),:@])|(?P<bad>\S))")


class _Parser:
  def __init__(self, text: str, mesh: AbstractMesh | None, what: str):
    self.text, self.mesh, self.what = text, mesh, what
    self.toks: list[tuple[str, str, int]] = []
    for m in _TOKEN.finditer(text):
      kind = m.lastgroup
      if kind is None:
        continue
      self.toks.append((kind, m.group(kind), m.start(kind)))
    self.toks.append(("end", "", len(text)))
    self.i = 0

  # --- tokens --------------------------------------------------------------
  def peek(self) -> tuple[str, str, int]:
    return self.toks[self.i]

  def fail(self, expected: str, at: tuple[str, str, int] | None = None) -> NoReturn:
    kind, val, pos = at or self.peek()
    got = "the end of the text" if kind == "end" else repr(val)
    raise TypeStrError(f"{self.what} {self.text!r}: column {pos + 1}: expected {expected}, "
                       f"got {got}")

  def take(self, value: str, expected: str | None = None) -> None:
    kind, val, _ = self.peek()
    if kind != "punct" or val != value:
      self.fail(expected or repr(value))
    self.i += 1

  def accept(self, value: str) -> bool:
    kind, val, _ = self.peek()
    if kind == "punct" and val == value:
      self.i += 1
      return True
    return False

  def seq(self, close: str, item, expected: str) -> list:
    out: list = []
    if self.accept(close):
      return out
    while True:
      out.append(item())
      if self.accept(close):
        return out
      self.take(",", f"',' or {close!r} after {expected}")
      if self.accept(close):  # a trailing comma
        return out

  # --- grammar ---------------------------------------------------------------
  def arg(self) -> Any:
    kind, val, _ = self.peek()
    if kind == "punct" and val == "{":
      self.i += 1
      return dict(self.seq("}", self.entry, "a dict entry"))
    if kind == "punct" and val == "(":
      self.i += 1
      return tuple(self.seq(")", self.arg, "a tuple element"))
    if kind == "punct" and val == "[":
      self.i += 1
      return self.seq("]", self.arg, "a list element")
    if kind == "name" and val == "None":
      self.i += 1
      return None
    return typedesc.from_json(self.type_desc(), f"{self.what} {self.text!r}")

  def entry(self) -> tuple[str, Any]:
    kind, val, _ = self.peek()
    if kind == "name":
      key = val
    elif kind == "str":
      key = json.loads(val)
    else:
      self.fail("a dict key (a name or a \"quoted\" string)")
    self.i += 1
    self.take(":", f"':' after dict key {key!r}")
    return key, self.arg()

  def type_desc(self) -> dict:
    tok = self.peek()
    kind, val, _ = tok
    expected = ("a type (a dtype such as f32[8,512], "
                f"{', '.join(f'{n}[...]' for n in HI_TYPES)} or Tup{{...}})")
    if kind != "name":
      self.fail(expected + (", or a pytree of types ({...}, (...), [...])" if self.i == 0
                            else ""))
    self.i += 1
    if val == "Tup":
      self.take("{", "'{' after Tup")
      elts = self.seq("}", self.type_desc, "a tuple element type")
      return {"type": "tup", "v": typedesc.SCHEMA_VERSIONS["tup"], "elts": elts}
    hi = HI_TYPES.get(val)
    dtype = None if hi else _dtype(val)
    if hi is None and dtype is None:
      self.fail(f"{expected}; {val!r} is not a dtype, hi type or Tup", tok)
    self.take("[", f"'[' after {val}")
    shape, spec, opts = [], [], []
    if not self.accept("]"):
      while True:
        n, axes = self.dim()
        shape.append(n)
        spec.append(axes)
        if self.accept("]"):
          break
        if hi is not None and self.peek()[1] == ":":
          self.i += 1
          seen: dict = {}
          opts = self.seq("]", functools.partial(self.option, hi, seen), "an option")
          break
        self.take(",", "',' or ']' after a dimension" + (" (or ':' and options)" if hi and
                                                          hi.options else ""))
    d: dict[str, Any] = {"shape": shape, "sharding": self.sharding(spec)}
    if hi is None:
      assert dtype is not None  # refused above
      d.update(type="array", v=typedesc.SCHEMA_VERSIONS["array"], dtype=dtype.name)
    else:
      d.update(type=hi.descriptor, v=typedesc.SCHEMA_VERSIONS[hi.descriptor])
      d.update(dict(opts))
    return d

  def dim(self) -> tuple[int, Any]:
    kind, val, _ = self.peek()
    if kind != "int":
      self.fail("a dimension size (an integer)")
    self.i += 1
    if not self.accept("@"):
      return int(val), None
    if self.accept("("):
      axes = self.seq(")", self.axis, "a mesh axis")
      if not axes:
        self.fail("a mesh axis", self.toks[self.i - 1])
      return int(val), axes
    return int(val), self.axis()

  def axis(self) -> str:
    tok = self.peek()
    kind, val, _ = tok
    if kind != "name":
      self.fail("a mesh axis name")
    if self.mesh is None:
      self.fail("an unsharded dimension: a sharded dimension needs a mesh "
                f"(--mesh {val}=N)", tok)
    if val not in self.mesh.axis_names:
      self.fail(f"a mesh axis of the mesh ({', '.join(self.mesh.axis_names)})", tok)
    self.i += 1
    return val

  def option(self, hi: HiArrayType, seen: dict) -> tuple[str, int | str]:
    """One option of ``hi`` (``g32``; ``f16`` for a quantized type's scales); ``seen``
    holds the options read so far (key -> text): one given twice is an error."""
    tok = self.peek()
    kind, val, _ = tok
    value: int | str
    if val == "f16" and "g" in hi.options:  # a quantized type's f16 scales
      key, value = "scale", "f16"
    else:
      m = re.fullmatch(r"([A-Za-z]+)(\d+)", val) if kind == "name" else None
      if not hi.options:
        self.fail(f"']': {hi.name} takes no options", tok)
      if m is None or m.group(1) not in hi.options:
        valid = [o + "N" for o in hi.options] + (["f16 (f16 scales)"] if "g" in hi.options
                                                  else [])
        self.fail(f"an option of {hi.name} ({', '.join(valid)})", tok)
      key, value = hi.options[m.group(1)], int(m.group(2))
    if key in seen:
      self.fail(f"an option not given before ({seen[key]} is already there)", tok)
    seen[key] = val
    self.i += 1
    return key, value

  def sharding(self, spec: list) -> dict:
    mesh = self.mesh
    if mesh is None:
      return {"mesh": [], "axis_types": [], "spec": [None] * len(spec)}
    return {"mesh": [[n, int(s)] for n, s in zip(mesh.axis_names, mesh.axis_sizes)],
            "axis_types": [t.name for t in mesh.axis_types], "spec": spec}

  def end(self) -> None:
    if self.peek()[0] != "end":
      self.fail("the end of the text")


def _dtype(name: str):
  m = re.fullmatch(r"(bf|f|i|u|c)(\d+)(_\w+)?", name)
  long = name if m is None else \
      {"bf": "bfloat", "f": "float", "i": "int", "u": "uint", "c": "complex"}[m.group(1)] + \
      m.group(2) + (m.group(3) or "")
  try:
    return jnp.dtype(long)
  except TypeError:
    return None


def parse_arg(text: str, mesh: AbstractMesh | None = None, what: str = "type"):
  """The pytree of types written ``text`` (see the module docstring for the grammar).

  ``f32[8,512]`` gives ``ShapedArray((8, 512), float32)``; ``q8[512,256]`` an
  ``hx.QArrayTy``; ``{w: q8[4,3], b: f32[3]}`` a dict of them. Shardings are on
  ``mesh`` (``f32[8@i,512]``: the first axis split over mesh axis ``i``).
  ``what`` names the text in errors (``--arg 2``). Raises
  :class:`TypeStrError` naming the column and what was expected there, also
  for a type the types themselves refuse (``q8[]``).
  """
  p = _Parser(text, mesh, what)
  try:
    out = p.arg()
  except typedesc.DescriptorError as e:
    raise TypeStrError(str(e)) from None
  p.end()
  return out


def parse_type(text: str, mesh: AbstractMesh | None = None, what: str = "type"):
  """One type (no pytree): ``f32[8,512]``, ``q8[4@i,3]``, ``Tup{...}``; see :func:`parse_arg`."""
  p = _Parser(text, mesh, what)
  try:
    out = typedesc.from_json(p.type_desc(), f"{what} {text!r}")
  except typedesc.DescriptorError as e:
    raise TypeStrError(str(e)) from None
  p.end()
  return out


def parse_json_args(data: Any, mesh: AbstractMesh | None = None, what: str = "JSON"):
  """Arguments from decoded JSON: a list of arguments whose leaves are type strings.

  Objects are dicts, arrays lists, ``null`` None, strings types
  (:func:`parse_type`). Raises :class:`TypeStrError` naming the path of a bad
  entry.
  """
  def go(d, path):
    if d is None:
      return None
    if isinstance(d, str):
      return parse_type(d, mesh, f"{what} {path}")
    if isinstance(d, list):
      return [go(e, f"{path}[{i}]") for i, e in enumerate(d)]
    if isinstance(d, dict):
      return {k: go(v, f"{path}[{k!r}]") for k, v in d.items()}
    raise TypeStrError(f"{what} {path}: expected a type string, list, object or null, "
                       f"got {d!r}")
  if not isinstance(data, list):
    raise TypeStrError(f"{what}: expected a list of arguments, got {type(data).__name__}")
  return [go(a, f"argument {i}") for i, a in enumerate(data)]


def parse_mesh(text: str) -> AbstractMesh:
  """The device-free mesh ``i=4,j=2`` (axis ``i`` of size 4, ...); an axis may name its
  type, ``i=4:auto`` (``explicit``, the default; ``auto``; ``manual``).

  Raises :class:`TypeStrError` naming the entry that is not ``NAME=SIZE[:TYPE]``.
  """
  names, sizes, types = [], [], []
  for entry in (e.strip() for e in text.split(",")):
    m = re.fullmatch(r"([A-Za-z_]\w*)\s*=\s*(\d+)(?:\s*:\s*(\w+))?", entry)
    if m is not None and int(m.group(2)) < 1:
      raise TypeStrError(f"mesh {text!r}: entry {entry!r}: axis {m.group(1)!r} has size "
                         f"{m.group(2)}; a mesh axis's size must be positive (1 or more)")
    if m is None or (m.group(3) or "explicit").lower() not in _AXIS_TYPES:
      raise TypeStrError(f"mesh {text!r}: entry {entry!r}: expected NAME=SIZE or "
                         f"NAME=SIZE:TYPE (TYPE one of {', '.join(_AXIS_TYPES)})")
    if m.group(1) in names:
      raise TypeStrError(f"mesh {text!r}: axis {m.group(1)!r} given twice")
    names.append(m.group(1))
    sizes.append(int(m.group(2)))
    types.append(_AXIS_TYPES[(m.group(3) or "explicit").lower()])
  return AbstractMesh(tuple(sizes), tuple(names), axis_types=tuple(types))


def type_str(ty) -> str:
  """``ty`` as this grammar writes it (and JAX prints it): ``f32[8@i,512]``, ``q8[4,3]``."""
  return ty.str_short(short_dtypes=True)
