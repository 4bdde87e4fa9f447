"""Print the StableHLO your functions lower to, for lit and FileCheck tests.

A lit test is a Python file that prints modules and checks them::

  # RUN: %python %s | filecheck %s
  import hxmlir as hx
  from hxmlir.testing import print_ir

  def layer(x, w):
    return hx.matmul_q(x, w)

  print_ir("layer", layer, "f32[2,6]", "q8[6,5]")
  # CHECK-LABEL: TEST: layer f32[2,6] q8[6,5]
  # CHECK: stablehlo.composite "hx.matmul_q"

as JAX's own ``tests/filecheck`` helpers do: each module is preceded by a
stable ``TEST: <name> <argument types>`` line to anchor ``CHECK-LABEL``.
Arguments are values (arrays, ``QArray``, ...), types (``jax.ShapeDtypeStruct``,
``ShapedArray``, hi types such as ``hx.QArrayTy``), type strings
(:mod:`hxmlir.types.typestr`: ``"f32[8@i,512]"``, ``"q8[512,256]"``,
``"{w: q8[4,3], b: f32[3]}"``), or tuples, lists and dicts of them.

``hxmlir lower MODULE:FUNCTION --arg TYPE ...`` prints the same module
(:func:`lowered_text`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.experimental.hijax import HiType, ShapedArray
from jax.sharding import AbstractMesh

from hxmlir.targets import check_platforms
from hxmlir.types import typestr


def mesh(axes: str) -> jax.sharding.Mesh:
  """The mesh ``axes`` (``"i=4,j=2"``, :func:`hxmlir.types.typestr.parse_mesh`; explicit axes by
  default) over this process's devices, for ``jax.set_mesh`` around values.

  On CPU, run with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (set
  before JAX starts) for 8 devices. Raises ``ValueError`` when there are fewer
  devices than the mesh needs; use ``mesh=`` of :func:`lowered_text` with type
  strings to lower for a mesh without devices.
  """
  m = typestr.parse_mesh(axes)
  return jax.make_mesh(m.axis_sizes, m.axis_names, axis_types=m.axis_types)


def abstract_args(args: Sequence, mesh: AbstractMesh | None = None) -> list:
  """``args`` with type strings parsed (on ``mesh``) and ``ShapedArray`` leaves made
  ``jax.ShapeDtypeStruct`` (what ``jax.jit(...).trace`` accepts); values and hi types
  stay as they are. Raises :class:`hxmlir.types.typestr.TypeStrError` on bad type text."""
  def conv(x):
    if isinstance(x, ShapedArray) and not isinstance(x, HiType):
      s = x.sharding if x.sharding is not None and not x.sharding.mesh.empty else None
      return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type, sharding=s)
    return x

  out = [typestr.parse_arg(a, mesh, f"argument {i}") if isinstance(a, str) else a
         for i, a in enumerate(args)]
  return jax.tree.map(conv, out, is_leaf=lambda x: isinstance(x, (HiType, ShapedArray)))


def types_label(args: Sequence) -> str:
  """The argument types as the label prints them: ``f32[2,6] q8[6,5]``; a pytree argument
  as ``{b:f32[3],w:q8[4,3]}`` (one word per argument)."""
  def one(a) -> str:
    if isinstance(a, dict):
      return "{" + ",".join(f"{k}:{one(v)}" for k, v in a.items()) + "}"
    if isinstance(a, tuple):
      return "(" + ",".join(map(one, a)) + ")"
    if isinstance(a, list):
      return "[" + ",".join(map(one, a)) + "]"
    if a is None:
      return "None"
    if isinstance(a, jax.ShapeDtypeStruct):
      a = ShapedArray(a.shape, a.dtype, sharding=a.sharding)
    return typestr.type_str(a if isinstance(a, (HiType, ShapedArray)) else jax.typeof(a))
  return " ".join(one(a) for a in args)


def bind_static(fn: Callable, static: dict[str, Any] | None) -> Callable:
  """``fn`` with keyword arguments ``static`` bound (Python values, not traced), keeping its
  name (JAX names the module ``jit_<name>``); ``fn`` itself when there are none."""
  if not static:
    return fn

  def bound(*a, **kw):
    return fn(*a, **static, **kw)
  bound.__name__ = bound.__qualname__ = getattr(fn, "__name__", "fn")
  return bound


def lowered_text(fn: Callable, *args, passes: bool | str = False,
                 platforms: Sequence[str] | None = None, mesh: AbstractMesh | str | None = None,
                 debug_info: bool = False, static: dict[str, Any] | None = None) -> str:
  """The StableHLO module ``jax.jit(fn)`` lowers to for ``args``, as text.

  ``args``: see the module docstring (type strings are parsed on ``mesh``).
  ``passes``: ``False`` lowers in the current state (hxmlir installed or not),
  ``True`` with ``hx.install()``'s default pipeline, a string with that pass
  pipeline (``"hx-verify,hx-fold-scales"``). ``platforms`` lowers for those
  platforms (``("cuda", "tpu")`` works on any machine; default: the default
  backend). ``mesh``: a device-free mesh (``"i=4,j=2"`` or
  :func:`hxmlir.types.typestr.parse_mesh`'s result)
  current while tracing, for sharded arguments without devices; hi *types* on
  a mesh are lowered as :func:`hxmlir.export.export` lowers them (JAX would
  give each of their components the hi type's sharding), so the module's
  ``main`` calls the function's body (``call @fn``). ``static``:
  keyword arguments bound as Python values (``fn(*args, **static)``), not
  traced. ``debug_info`` keeps the locations (``loc(...)``).

  Raises :class:`hxmlir.types.typestr.TypeStrError` on bad type text, ``ValueError`` on
  a platform outside ``hxmlir.targets.PLATFORMS``, and what
  tracing or the pipeline raises (``TypeError`` naming operand types,
  ``hx.VerificationError``, ``PipelineError``).
  """
  from hxmlir.integration.installation import installed
  if isinstance(mesh, str):
    mesh = typestr.parse_mesh(mesh)
  abstract = abstract_args(args, mesh)
  target = bind_static(fn, static)
  if platforms is not None:
    platforms = check_platforms(platforms, "lowered_text platforms")
  if mesh is not None and platforms is None:
    platforms = (jax.default_backend(),)

  def lower() -> str:
    if _hi_types_on_mesh(abstract, mesh):
      return _lowered_via_export(target, abstract, platforms, debug_info)
    traced = jax.jit(target).trace(*abstract)
    lowered = traced.lower() if platforms is None else \
        traced.lower(lowering_platforms=tuple(platforms))
    return lowered.as_text(debug_info=debug_info)

  def in_mesh() -> str:
    if mesh is None:
      return lower()
    with jax.sharding.use_abstract_mesh(mesh):
      return lower()

  if passes is False:
    return in_mesh()
  with installed(None if passes is True else passes):
    return in_mesh()


def _hi_types_on_mesh(args, mesh) -> bool:
  """Whether ``args`` hold a hi *type* (not a value) while a mesh is given.

  ``jax.jit(f).trace(hi_type)`` gives every lo component of a hi argument the
  hi type's own sharding (``_lojax_expand_params`` in ``jax/_src/pjit.py``): a
  ``q8[6,4@j]``'s ``f32[6]`` scale would get the spec ``P(None, 'j')``, and a
  ``Tup``'s elements none. Such arguments are lowered through
  :func:`hxmlir.export.export`, whose lo function takes each component with its
  own sharding.
  """
  return mesh is not None and any(
      isinstance(x, HiType) for x in jax.tree.leaves(args, is_leaf=lambda x: isinstance(x, HiType)))


def _lowered_via_export(fn, args, platforms, debug_info: bool) -> str:
  """The module of ``hxmlir.export.export(jax.jit(fn), platforms)(*args)``, as text."""
  from jax.interpreters import mlir

  from hxmlir.export import export
  exp = export(jax.jit(fn), platforms=platforms)(*args)
  with mlir.make_ir_context():
    module = mlir.ir.Module.parse(exp.mlir_module())
    return module.operation.get_asm(enable_debug_info=debug_info)


def print_ir(name: str, fn: Callable, *args, **kw) -> None:
  """Prints ``TEST: <name> <argument types>`` and the module :func:`lowered_text` gives
  (keywords as there; locations left out unless ``debug_info=True``)."""
  mesh = kw.get("mesh")
  mesh = typestr.parse_mesh(mesh) if isinstance(mesh, str) else mesh
  print(f"\nTEST: {name} {types_label(abstract_args(args, mesh))}".rstrip())
  print(lowered_text(fn, *args, **kw))


def print_exported(name: str, exported) -> None:
  """Prints ``TEST: <name> <platforms>`` and an exported artifact's module (no locations).

  ``exported``: a ``jax.export.Exported`` or an :class:`hxmlir.export.Exported`.
  """
  from jax.interpreters import mlir
  print(f"\nTEST: {name} {','.join(exported.platforms)}")
  with mlir.make_ir_context():
    module = mlir.ir.Module.parse(exported.mlir_module())
    print(module.operation.get_asm(enable_debug_info=False))
