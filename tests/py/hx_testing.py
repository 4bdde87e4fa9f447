"""Helpers shared by the test modules (not a test module: pytest does not collect it).

Compile and run an MLIR module with JAX's CPU backend, strip locations from IR text,
compare quantized values. Fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import jax.extend.backend
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir
from jaxlib import xla_client
from jaxlib.mlir import ir
from numerics import assert_within, elementwise_bound

import hxmlir as hx
from hxmlir import formats


def compile_and_run(text: str, args: Sequence[np.ndarray]) -> list[np.ndarray]:
  """Compiles StableHLO ``text`` (a module with a public ``@main``) for one CPU device
  and runs it on ``args``; returns the results as numpy arrays."""
  client = jax.extend.backend.get_backend("cpu")
  device = client.devices()[0]
  exe = client.compile_and_load(text, xla_client.DeviceList((device,)),
                                xla_client.CompileOptions())
  outs = exe.execute([jax.device_put(np.asarray(a), device) for a in args])
  return [np.asarray(o) for o in outs]


def without_locations(text: str) -> str:
  """MLIR text with its location aliases (``#loc...`` lines) and ``loc(...)`` suffixes removed."""
  lines = [line for line in text.splitlines() if not line.startswith("#loc")]
  return "\n".join(re.sub(r" loc\((?:[^()]|\([^()]*\))*\)", "", line) for line in lines)


def assert_same_q_values(a, b) -> None:
  """Same int8 values and bitwise-same scales of two ``q8`` values (types not compared)."""
  np.testing.assert_array_equal(np.asarray(a.qvalue), np.asarray(b.qvalue))
  np.testing.assert_array_equal(np.asarray(a.scale), np.asarray(b.scale))


def assert_same_q(a, b, scale_roundings: int = 0) -> None:
  """Same type, same int8 values, same scales: bitwise, or within
  :func:`numerics.elementwise_bound` of ``scale_roundings`` f32 roundings (those the two
  scales' computations went through, together)."""
  assert jax.typeof(a) == jax.typeof(b)
  if not scale_roundings:
    assert_same_q_values(a, b)
    return
  np.testing.assert_array_equal(np.asarray(a.qvalue), np.asarray(b.qvalue))
  assert_within(a.scale, b.scale, elementwise_bound(np.asarray(b.scale), scale_roundings),
                "scale: ")


def dense64(q) -> np.ndarray:
  """The dequantized value in float64, from the components (unpacking int4 by hand)."""
  v, s = (np.asarray(c) for c in hx.qarray_parts(q))
  if v.dtype == np.uint8:
    lo = (v & 0xF).astype(np.int8)
    hi = (v >> 4).astype(np.int8)
    lo, hi = np.where(lo > 7, lo - 16, lo), np.where(hi > 7, hi - 16, hi)
    v = np.stack([lo, hi], -1).reshape(*v.shape[:-1], -1)
  v = v.astype(np.float64)
  s = np.asarray(s, np.float64)
  if s.ndim == v.ndim:
    g = v.shape[-1] // s.shape[-1]
    return (v.reshape(*s.shape, g) * s[..., None]).reshape(v.shape)
  return v * s[..., None]


def nibbles(p: np.ndarray, signed: bool) -> np.ndarray:
  """``ui8[..., m]`` -> the ``2m`` values: element ``2j`` the low nibble of byte ``j``."""
  p = np.asarray(p, np.uint8)
  lo, hi = (p & 0xF).astype(np.int64), (p >> 4).astype(np.int64)
  if signed:
    lo, hi = np.where(lo > 7, lo - 16, lo), np.where(hi > 7, hi - 16, hi)
  return np.stack([lo, hi], -1).reshape(*p.shape[:-1], 2 * p.shape[-1])


def block_of(prefix: str) -> int:
  """The block (elements per block) of the hi type printed ``prefix`` if it is a block
  format (``q4_k``: 256), else 0: a last dimension its type text takes."""
  return max((f.block for f in formats.FORMATS.values() if f.prefix == prefix), default=0)


def any_format(rng, shape, name, group):
  """A QArray of format ``name`` from normal data (f16 formats: the f32 format's
  components with f16 scales and offsets), its components, its dense value
  ``values * scale + offset`` in numpy float64 and the bound of an f32 evaluation's
  error (a rounding of the product and one of the sum, or one fused: ``eps`` each
  relative to the value rounded), and the f32 data."""
  f = formats.FORMATS[name]
  if f.block:
    raise ValueError(f"any_format builds the elementwise formats; {name} is a block format "
                     "(build it from GGUF blocks: hxmlir.gguf.block_parts)")
  base = formats.FORMATS[name.removesuffix("_f16")]
  x = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
  method = "minmax" if f.offset else "absmax"
  n_scales = (*shape[:-1], shape[-1] // group) if group else shape[:-1]
  if formats.check_method(base, method) is None:
    parts = hx.qarray_parts(hx.quantize(x, base.name, group_size=group, method=method))
  else:  # q8o holds checkpoints' 5-bit values (hx.quantize does not make it)
    parts = (jnp.asarray(rng.integers(0, 32, shape).astype(np.int8)),
             jnp.asarray(rng.uniform(0.01, 0.1, n_scales).astype(np.float32)),
             jnp.asarray(rng.standard_normal(n_scales).astype(np.float32)))
  parts = [parts[0]] + [p.astype(f.scale_dtype) for p in parts[1:]]
  w = hx.make_qarray(*parts)
  v = np.asarray(formats.values_f32(parts[0], f), np.float64)
  g = group or shape[-1]

  def per_element(c):
    return np.repeat(np.asarray(c, np.float64).reshape(*shape[:-1], -1), g, axis=-1)

  product = v * per_element(parts[1])
  dense = product + (per_element(parts[2]) if f.offset else 0.0)
  bound = np.finfo(np.float32).eps * (np.abs(product) + np.abs(dense))
  return w, parts, dense, bound, x


KERNEL_TARGETS = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}
"""The custom-call target each platform's Pallas kernel lowers to."""


def kernel_calls(text: str) -> list[tuple[str, bool]]:
  """(target, whether inside an sdy.manual_computation) of every Pallas kernel custom call
  (:data:`KERNEL_TARGETS`) in the module ``text``."""
  found = []
  with mlir.make_ir_context():
    module = ir.Module.parse(text)

    def visit(op, manual):
      if op.name == "stablehlo.custom_call":
        target = ir.StringAttr(op.attributes["call_target_name"]).value
        if target in KERNEL_TARGETS.values():
          found.append((target, manual))
      inside = manual or op.name == "sdy.manual_computation"
      for region in op.regions:
        for block in region.blocks:
          for child in block.operations:
            visit(child.operation, inside)
    for op in module.body.operations:
      visit(op.operation, False)
  return found


def custom_calls(hlo: str) -> list[tuple[str, str]]:
  """The ``(target, backend_config)`` of each ``stablehlo.custom_call`` in a lowered module's
  text, in order (the attributes as the IR prints them, without braces)."""
  return re.findall(r"stablehlo\.custom_call @(\w+)\(.*mhlo\.backend_config = \{([^}]*)\}", hlo)


def block_call(target: str, fmt) -> tuple[str, str]:
  """The custom call a GGUF block format ``fmt`` (:class:`hxmlir.format_spec.Format`) lowers to
  on ``target``, as :func:`custom_calls` reads it: its attributes dtype, group_size, layout,
  offset and scale_dtype."""
  return (target, f'dtype = "{fmt.name}", group_size = {fmt.block} : i64, '
                  f'layout = "{fmt.layout}", offset = {str(fmt.offset).lower()}, '
                  'scale_dtype = "f16"')

