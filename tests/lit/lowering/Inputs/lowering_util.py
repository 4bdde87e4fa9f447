"""Shared by the lit tests in tests/lit/lowering: print a lowered module for FileCheck.

The RUN lines give the process 8 host CPU devices (``XLA_FLAGS``, read when
JAX's CPU backend starts, so also set here for running a test by hand); the
sharded cases use the explicit-sharding mesh ``i=4, j=2`` from :func:`mesh`.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()

import jax  # noqa: E402


def mesh():
  """The 4x2 mesh ``("i", "j")`` with explicit axes (use it with ``jax.set_mesh``)."""
  return jax.make_mesh((4, 2), ("i", "j"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)


def print_ir(name, fn, *args, **lower_kw):
  """Prints ``TEST: <name> <arg types>`` and ``jax.jit(fn)``'s module (no locations)."""
  types = " ".join(jax.typeof(a).str_short(short_dtypes=True) for a in args)
  print(f"\nTEST: {name} {types}")
  print(jax.jit(fn).lower(*args, **lower_kw).as_text(debug_info=False))


def print_exported(name, exported):
  """Prints ``TEST: <name> <platforms>`` and a ``jax.export.Exported``'s module (no locations)."""
  from jax.interpreters import mlir
  print(f"\nTEST: {name} {','.join(exported.platforms)}")
  with mlir.make_ir_context():
    module = mlir.ir.Module.parse(exported.mlir_module())
    print(module.operation.get_asm(enable_debug_info=False))
