"""Back-compat: every stored artifact loads, holds what it claims, and reproduces its outputs.

The artifacts and the script that wrote them are in this directory (see
``generate.py``). Current code must deserialize each one, find in it the
``hx.*`` composite versions (and registered kernels) it was written to cover,
run it on CPU and reproduce the stored outputs bit for bit (CPU kernels under the ISA they
were recorded with), or, for an output of a CPU kernel whose summation order changed
since (the case's ``reordered``), within the derived bound of two f32 orders. A coverage test
requires a case for every composite version the schema accepts and for every
kernel hxmlir registers, per platform.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jaxlib.mlir import ir

from hxmlir import _jax, targets
from hxmlir import export as hxe
from hxmlir.lowering import schema

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())


def _generate_module():
  spec = importlib.util.spec_from_file_location("hxmlir_backcompat_generate", HERE / "generate.py")
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod  # dataclasses look their module up there
  spec.loader.exec_module(mod)
  return mod


generate = _generate_module()


def _contents(exp) -> tuple[set, set]:
  """The (op, version) composites and (target, kernel name) custom calls in ``exp``'s module."""
  composites, kernels = set(), set()
  with _jax.make_ir_context():
    module = exp.lo.mlir_module(serialized=False)

    def visit(op):
      if op.name == "stablehlo.composite":
        version = ir.IntegerAttr(op.attributes["version"]).value \
            if "version" in op.attributes else 0
        composites.add((ir.StringAttr(op.attributes["name"]).value, version))
      elif op.name == "stablehlo.custom_call":
        kernels.add((ir.StringAttr(op.attributes["call_target_name"]).value,
                     targets.kernel_name_of(op)))
      return ir.WalkResult.ADVANCE
    module.operation.walk(visit)
  return composites, kernels


def targets_ext():
  """The native CPU kernels' extension module, or None where it was not built."""
  try:
    from hxmlir import _matmul_q_cpu as ext
  except ImportError:
    return None
  return ext


@contextlib.contextmanager
def _recorded_isa(entry):
  """Runs a case's CPU kernels with the ISA its outputs were recorded with (its manifest's
  ``cpu_isa``, ``i8x_isa``): the kernels' summation order is the ISA's, so their outputs are
  the same bits under that ISA only. Skips the comparison where this CPU lacks it (loading and
  contents were checked by then)."""
  ext = targets_ext()
  if "cpu_isa" not in entry or ext is None or ext.selected_isa() is None:
    yield  # no kernels here: the artifact runs its decompositions
    return
  before = ext.selected_isa()
  if entry["cpu_isa"] not in ext.supported_isas():
    pytest.skip(f"outputs recorded with the {entry['cpu_isa']} kernels; this CPU runs "
                f"{', '.join(ext.supported_isas())}, which sum in another order")
  ext.select_isa(entry["cpu_isa"])
  try:
    if ext.i8x_isa() != entry["i8x_isa"]:
      pytest.skip(f"outputs recorded with the {entry['i8x_isa']} integer kernels; this CPU "
                  f"runs {ext.i8x_isa()}, which sums in another order")
    yield
  finally:
    ext.select_isa(before)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_artifact_loads_and_reproduces_outputs(name):
  entry = MANIFEST[name]
  blob = (DATA / f"{name}.hxa").read_bytes()
  assert hashlib.sha256(blob).hexdigest() == entry["sha256"], "stored artifact was modified"
  exp = hxe.deserialize(blob)
  assert exp.signature() == entry["signature"]
  assert list(exp.platforms) == entry["platforms"]
  composites, kernels = _contents(exp)
  for op, version in entry["covers"]:
    assert (op, version) in composites, f"{name} should hold {op} version {version}"
  for target, kernel_name in entry["kernels"]:
    assert (target, kernel_name) in kernels
  if "cpu" not in exp.platforms:
    return  # kernels for other platforms: loading is what can be checked here
  data = np.load(DATA / f"{name}.npz")
  ins = [data[f"in_{i}"] for i in range(sum(k.startswith("in_") for k in data.files))]
  # np.savez writes ml_dtypes arrays (float8 values) as raw bytes ('V1'): view them back
  lo_dtypes = [t.dtype for ty in exp.in_types
               for t in (ty.lo_ty() if hasattr(ty, "lo_ty") else [ty])]
  ins = [a.view(d) if a.dtype.kind == "V" else a for a, d in zip(ins, lo_dtypes)]
  outs = [data[f"out_{i}"] for i in range(sum(k.startswith("out_") for k in data.files))]
  args, it = [], iter(ins)
  for ty in exp.in_types:
    n = len(ty.lo_ty()) if hasattr(ty, "lo_ty") else 1
    parts = [next(it) for _ in range(n)]
    args.append(ty.raise_val(*parts) if hasattr(ty, "lo_ty") else parts[0])
  with _recorded_isa(entry):
    got = jax.block_until_ready(exp.call(*args))  # (dispatch is asynchronous)
  got = got if isinstance(got, tuple) else (got,)
  got_flat = generate.lo_components(exp.out_types, got)
  assert len(got_flat) == len(outs)
  reordered = generate.CASES[name].reordered
  bounds = reordered[1](*args) if reordered else (None,) * len(outs)
  for g, want, bound in zip(got_flat, outs, bounds):
    if bound is not None:
      assert g.dtype == want.dtype and g.shape == want.shape
      excess = np.abs(np.asarray(g, np.float64) - want) - bound
      assert np.all(excess <= 0), (f"{name}: differs by more than two f32 orders allow "
                                   f"(worst excess {excess.max():.3g})")
      continue
    if want.dtype.kind == "V":  # float8 values stored as raw bytes: compare the bytes
      assert g.dtype.itemsize == want.dtype.itemsize and g.shape == want.shape
      assert g.tobytes() == want.tobytes()
      continue
    assert g.dtype == want.dtype and g.shape == want.shape
    np.testing.assert_array_equal(g, want)  # exact: same bits (NaN where NaN)


def test_every_composite_version_has_a_case():
  covered = {(op, v) for e in MANIFEST.values() for op, v in e["covers"]}
  missing = [(s.name, v) for s in schema.SCHEMAS.values() for v in s.versions
             if (s.name, v) not in covered]
  assert not missing, (f"no back-compat artifact for {missing}: add a case to "
                       "tests/py/integration/backcompat/generate.py and run it for that case")


def test_every_hxmlir_kernel_has_a_case_per_platform():
  covered = {(t, k, p) for e in MANIFEST.values() for t, k in e["kernels"]
             for p in e["platforms"]}
  missing = [(k.target, k.ir_name, p) for k in targets.registered_kernels()
             if k.owner == "hxmlir" for p in k.platforms
             if (k.target, k.ir_name, p) not in covered]
  assert not missing, (f"no back-compat artifact for kernels {missing}: add a case to "
                       "tests/py/integration/backcompat/generate.py and run it for that case")


def test_every_case_is_stored():
  assert set(generate.CASES) == set(MANIFEST)
  for name in generate.CASES:
    assert (DATA / f"{name}.hxa").exists() and (DATA / f"{name}.npz").exists()
