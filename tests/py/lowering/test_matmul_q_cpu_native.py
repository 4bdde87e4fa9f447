"""The native CPU kernel of ``hx.matmul_q`` (``csrc/``, ``lowering/matmul_q/cpu.py``).

Numbers: the kernel sums ``k`` f32 products ``fl(x s) * q`` in f32, in an order
of its own (chunks of ``k`` added at the end for small ``m``); against the exact
sum of the same products (float64, from the same rounded ``fl(x s)``: products
of an f32 and an int8 are exact in float64) each result is off by at most
``gamma_k * S``, ``gamma_k = k eps / (1 - k eps)``, ``S = |fl(x s)| @ |q|``
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 3.5).
A lost block, a wrong offset or a missed tail is off by about ``S / k`` or more
and fails it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import jax
import numpy as np
import pytest

import hxmlir as hx
import hxmlir.export as hxe
from hxmlir.lowering.matmul_q import cpu as native

EPS = np.finfo(np.float32).eps
INFO = hx.cpu_kernel_info()
needs_native = pytest.mark.skipif(not INFO.active, reason=f"native kernel inactive: {INFO}")


def _operands(rng, b, m, k, n):
  x = rng.standard_normal((*b, m, k)).astype(np.float32)
  q = rng.integers(-127, 128, (*b, k, n)).astype(np.int8)
  s = rng.uniform(0.001, 0.1, (*b, k)).astype(np.float32)
  return x, q, s


def _assert_within_f32_bound(y, x, q, s):
  """``|y - exact| <= gamma_k |fl(x s)| @ |q|`` elementwise (see the module docstring)."""
  k = x.shape[-1]
  xs = (x * s[..., None, :]).astype(np.float64)  # fl(x s), as the kernel rounds it
  exact = xs @ q.astype(np.float64)
  bound = k * EPS / (1 - k * EPS) * (np.abs(xs) @ np.abs(q.astype(np.float64)))
  y = np.asarray(y)
  assert y.shape == exact.shape and y.dtype == np.float32
  err = np.abs(y.astype(np.float64) - exact)
  worst = np.unravel_index(np.argmax(err - bound), err.shape)
  assert np.all(err <= bound), f"error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"


def _run(code: str, **env) -> subprocess.CompletedProcess:
  """Runs ``code`` in a fresh Python (the kernel's choice is made at import)."""
  full = {**os.environ, **env}
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                        text=True, env=full, timeout=300)


def test_extension_is_built_and_active_on_this_machine():
  # CI builds the extension; a build that silently failed must not pass as the fallback.
  if os.environ.get(native.DISABLE_ENV, "") not in ("", "0"):
    pytest.skip("native kernel disabled by the environment")
  from hxmlir import _matmul_q_cpu as ext
  assert ext.compiled_isas()[-1] == "generic"
  assert "generic" in ext.supported_isas()
  if any(i in ext.supported_isas() for i in native.DEFAULT_ISAS):
    assert INFO.active and INFO.isa == ext.selected_isa() == INFO.supported_isas[0]
    assert str(INFO).startswith(f"native CPU kernel hx_matmul_q_cpu_v1 ({INFO.isa};")


# (batch, m, k, n): each regime (m <= 4 rows, m <= 64 panel, above packed), rows
# and columns not multiples of any register tile or vector, k split into chunks
# with a remainder, batch dims.
SHAPES = [
    ((), 1, 4096, 300), ((), 1, 7, 5), ((2,), 3, 601, 77), ((), 4, 1000, 1031),
    ((), 5, 300, 130), ((), 16, 512, 2048), ((3,), 17, 65, 19), ((), 64, 129, 200),
    ((), 65, 300, 517), ((2, 2), 130, 384, 96), ((), 9, 2, 1),
]


@needs_native
@pytest.mark.parametrize("isa", INFO.supported_isas)
@pytest.mark.parametrize("b,m,k,n", SHAPES)
def test_kernel_within_f32_bound_on_every_isa(isa, b, m, k, n):
  from hxmlir import _matmul_q_cpu as ext
  x, q, s = _operands(np.random.default_rng(m * 1000 + n), b, m, k, n)
  ext.select_isa(isa)
  try:
    y = jax.jit(native.matmul_q_native)(x, q, s)
  finally:
    ext.select_isa(INFO.isa)
  _assert_within_f32_bound(y, x, q, s)


@pytest.mark.skipif(not {"avx512", "avx2"} <= set(INFO.supported_isas),
                    reason="needs a CPU with AVX-512 and AVX2")
def test_avx512_and_avx2_agree_bit_for_bit():
  # Same FMAs in the same order per element, whatever the vector width or the
  # thread count: artifacts that keep the native call reproduce their outputs.
  from hxmlir import _matmul_q_cpu as ext
  rng = np.random.default_rng(6)
  for b, m, k, n in SHAPES:
    x, q, s = _operands(rng, b, m, k, n)
    ys = []
    for isa in ("avx512", "avx2"):
      ext.select_isa(isa)
      try:
        ys.append(np.asarray(jax.jit(native.matmul_q_native)(x, q, s)))
      finally:
        ext.select_isa(INFO.isa)
    np.testing.assert_array_equal(ys[0], ys[1])


@needs_native
def test_empty_dims_and_nan_rows():
  rng = np.random.default_rng(1)
  x, q, s = _operands(rng, (), 0, 64, 32)
  assert jax.jit(native.matmul_q_native)(x, q, s).shape == (0, 32)
  x, q, s = _operands(rng, (), 8, 64, 40)
  x[3, 5] = np.nan
  y = np.asarray(jax.jit(native.matmul_q_native)(x, q, s))
  assert np.isnan(y[3]).all() and np.isfinite(np.delete(y, 3, axis=0)).all()


def _lowered(f, *args) -> str:
  return jax.jit(f).lower(*args).as_text()


@needs_native
def test_lowering_calls_the_kernel_only_while_installed():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((16, 512)).astype(np.float32)
  qw = hx.quantize(rng.standard_normal((512, 256)).astype(np.float32))
  plain = _lowered(hx.matmul_q, x, qw)
  assert "custom_call" not in plain and "stablehlo.while" in plain
  with hx.installed():
    text = _lowered(hx.matmul_q, x, qw)
    y = jax.jit(hx.matmul_q)(x, qw)
    # weights of at most SMALL_WEIGHT elements keep the reference decomposition
    small = _lowered(hx.matmul_q, x[:, :64], hx.quantize(np.ones((64, 64), np.float32)))
  assert 'stablehlo.composite "hx.matmul_q"' in text
  assert "stablehlo.custom_call @hx_matmul_q_cpu_v1(" in text
  assert "custom_call" not in small
  _assert_within_f32_bound(y, x, np.asarray(qw.qvalue), np.asarray(qw.scale))


@needs_native
def test_batch_dims_vmap_and_grad_run_through_the_kernel():
  rng = np.random.default_rng(3)
  x = rng.standard_normal((3, 8, 256)).astype(np.float32)
  qb = hx.quantize(rng.standard_normal((3, 256, 512)).astype(np.float32))
  qw = hx.quantize(rng.standard_normal((256, 512)).astype(np.float32))
  with hx.installed():
    yb = jax.jit(hx.matmul_q)(x, qb)
    yv = jax.jit(jax.vmap(lambda xi: hx.matmul_q(xi, qw)))(x)
    assert "hx_matmul_q_cpu_v1" in _lowered(hx.matmul_q, x, qb)
    assert "hx_matmul_q_cpu_v1" in _lowered(jax.vmap(lambda xi: hx.matmul_q(xi, qw)), x)
    g = jax.jit(jax.grad(lambda x: hx.matmul_q(x, qw).sum()))(x[0])
  _assert_within_f32_bound(yb, x, np.asarray(qb.qvalue), np.asarray(qb.scale))
  q, s = np.asarray(qw.qvalue), np.asarray(qw.scale)
  _assert_within_f32_bound(yv, x, np.broadcast_to(q, (3, *q.shape)),
                           np.broadcast_to(s, (3, *s.shape)))
  # d/dx sum(x @ w) = row sums of w, the same for every row of x (512 terms each)
  wd = q.astype(np.float64) * s[:, None].astype(np.float64)
  tol = 512 * EPS / (1 - 512 * EPS) * np.abs(wd).sum(-1)
  assert np.all(np.abs(np.asarray(g, np.float64) - wd.sum(-1)) <= tol)


@needs_native
def test_concurrent_calls_from_many_threads():
  rng = np.random.default_rng(4)
  cases = [_operands(rng, (), m, 512, 384) for m in (1, 4, 12, 40, 80, 2, 33, 100)]
  fns = [jax.jit(native.matmul_q_native) for _ in cases]
  for f, (x, q, s) in zip(fns, cases):
    f(x, q, s).block_until_ready()  # compile outside the threads
  results: dict[int, list] = {}

  def work(i):
    f, (x, q, s) = fns[i], cases[i]
    results[i] = [np.asarray(f(x, q, s)) for _ in range(20)]

  threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  for i, (x, q, s) in enumerate(cases):
    for y in results[i]:
      np.testing.assert_array_equal(y, results[i][0])  # deterministic, whatever the threads did
    _assert_within_f32_bound(results[i][0], x, q, s)


@needs_native
def test_export_keeps_stablehlo_unless_asked_and_deserialize_checks(tmp_path):
  rng = np.random.default_rng(5)
  x = rng.standard_normal((4, 512)).astype(np.float32)
  qw = hx.quantize(rng.standard_normal((512, 256)).astype(np.float32))
  with hx.installed():
    portable = hxe.export(hx.matmul_q)(x, qw)
    with hx.keep_native_cpu_calls():
      kept = hxe.export(hx.matmul_q)(x, qw)
  assert "custom_call" not in portable.mlir_module()
  assert "stablehlo.custom_call @hx_matmul_q_cpu_v1(" in kept.mlir_module()
  blob = kept.serialize()
  y = hxe.deserialize(blob).call(x, qw)
  _assert_within_f32_bound(y, x, np.asarray(qw.qvalue), np.asarray(qw.scale))
  path = tmp_path / "native.hxa"
  path.write_bytes(blob)
  r = _run(f"""
      import hxmlir.export as hxe
      try:
        hxe.deserialize(open({str(path)!r}, 'rb').read())
      except hxe.ArtifactError as e:
        print('ArtifactError:', e)
      """, HXMLIR_DISABLE_NATIVE="1")
  assert r.returncode == 0, r.stderr
  assert ("ArtifactError: artifact of 'matmul_q' cannot run here: it calls the native CPU kernel "
          "hx_matmul_q_cpu_v1 (exported with hx.keep_native_cpu_calls()), which is not available "
          "in this process: disabled by $HXMLIR_DISABLE_NATIVE=1") in r.stdout


def test_native_call_problem_names_versions():
  assert native.native_call_problem(["stablehlo_foo", "lapack_sgetrf_ffi"]) is None
  msg = native.native_call_problem(["hx_matmul_q_cpu_v9", "hx_matmul_q_cpu_v2"])
  assert msg.startswith("it calls the native CPU kernel hx_matmul_q_cpu_v9, which this hxmlir "
                        "does not have (it has hx_matmul_q_cpu_v1, hx_matmul_q_cpu_v2, "
                        "hx_matmul_q_cpu_v3, hx_matmul_q_cpu_v4, hx_matmul_q_cpu_i8x_v1, "
                        "hx_matmul_q_cpu_nkt_v1, hx_matmul_q_cpu_i8x_v2)")
  assert "hx_matmul_q_cpu_nkt_v2, which this hxmlir does not have" in \
      native.native_call_problem(["hx_matmul_q_cpu_nkt_v2"])
  if INFO.active:
    assert native.native_call_problem(["hx_matmul_q_cpu_v1", "hx_matmul_q_cpu_v2",
                                       "hx_matmul_q_cpu_v3", "hx_matmul_q_cpu_v4",
                                       "hx_matmul_q_cpu_nkt_v1", "hx_matmul_q_cpu_i8x_v2"]) is None


@pytest.mark.parametrize("env,reason", [
    ({"HXMLIR_DISABLE_NATIVE": "1"}, "disabled by $HXMLIR_DISABLE_NATIVE=1"),
    ({"HXMLIR_CPU_ISA": "sse9"}, "$HXMLIR_CPU_ISA=sse9, but this CPU and build run only"),
])
def test_fallback_keeps_the_stablehlo_lowering(env, reason):
  r = _run("""
      import numpy as np, jax, hxmlir as hx
      info = hx.cpu_kernel_info()
      print('active', info.active)
      print('str', info)
      x = np.ones((16, 512), np.float32)
      qw = hx.quantize(np.linspace(-1, 1, 512 * 256, dtype=np.float32).reshape(512, 256))
      with hx.installed():
        text = jax.jit(hx.matmul_q).lower(x, qw).as_text()
        y = np.asarray(jax.jit(hx.matmul_q)(x, qw))
      print('custom_call' in text, 'stablehlo.while' in text)
      ref = (np.asarray(qw.qvalue, np.float64) * np.asarray(qw.scale, np.float64)[:, None]).sum(0)
      print(np.abs(y - ref).max() <= 512 * 1e-6 * np.abs(ref).max() + 1e-6)
      """, **env)
  assert r.returncode == 0, r.stderr
  assert "active False" in r.stdout
  assert f"str StableHLO lowering ({reason}" in r.stdout
  assert "False True\nTrue" in r.stdout


@needs_native
def test_generic_isa_can_be_forced():
  r = _run("""
      import numpy as np, jax, hxmlir as hx
      from hxmlir import _matmul_q_cpu as ext
      print(hx.cpu_kernel_info().isa, ext.selected_isa())
      """, HXMLIR_CPU_ISA="generic")
  assert r.returncode == 0, r.stderr
  assert r.stdout.split() == ["generic", "generic"]

