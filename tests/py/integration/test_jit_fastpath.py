"""``jax.jit`` of hx code on JAX's C++ dispatch path while hxmlir is installed.

JAX's public instruments tell the paths apart: under ``jax.no_tracing(True)`` a call that
misses JAX's C++ cache (its Python ``cache_miss``, taken on every call of hi code in JAX
0.10.2) raises ``RuntimeError``, and ``f._cache_size()`` counts the C++ cache's entries.
``_jax.jax_python_dispatch()`` runs JAX's own path for comparison.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hx_testing import any_format, dense64
from jax.sharding import NamedSharding, PartitionSpec
from numerics import assert_matmul_close, assert_within, gamma

import hxmlir as hx
import hxmlir.export as hx_export
from hxmlir import _jax

RNG = np.random.default_rng(11)


@pytest.fixture
def installed(uninstalled):
  hx.install()
  yield
  hx.uninstall()


def _w(*shape):
  return jnp.asarray(RNG.standard_normal(shape).astype(np.float32))


def _on_cpp_path(f, *args, **kwargs):
  """Calls ``f`` twice more under ``jax.no_tracing``: raises unless JAX's C++ path takes it."""
  with jax.no_tracing(True):
    f(*args, **kwargs)
    return f(*args, **kwargs)


def _parts(v) -> list:
  """The arrays of a value: its own, a hi value's components (a tuple's, in turn)."""
  if isinstance(v, hx.HiTup):
    return [p for e in v.elts for p in _parts(e)]
  if isinstance(v, hx.QArray):
    return list(hx.qarray_parts(v))
  return list(hx.factors(v)) if isinstance(v, hx.Rank1) else [v]


def _same(a, b):
  """Equal pytrees of arrays and hi values: same types, bitwise-equal components."""
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    assert jax.typeof(x) == jax.typeof(y)
    for u, v in zip(_parts(x), _parts(y), strict=True):
      np.testing.assert_array_equal(np.asarray(u).view(np.uint8), np.asarray(v).view(np.uint8))


def _jax_path(f, *args, **kwargs):
  """``f(*args, **kwargs)`` through JAX's own (Python) dispatch of hi code, afresh."""
  jax.clear_caches()
  with _jax.jax_python_dispatch():
    return f(*args, **kwargs)


def test_array_arguments_with_hi_equations_take_the_cpp_path(installed):
  q = hx.quantize(_w(64, 32))
  qvalue, scale = hx.qarray_parts(q)
  x = _w(8, 64)
  f = jax.jit(lambda x, qvalue, scale: hx.matmul_q(x, hx.make_qarray(qvalue, scale)))
  got = f(x, qvalue, scale)
  np.testing.assert_array_equal(_on_cpp_path(f, x, qvalue, scale), got)
  assert f._cache_size() == 1
  assert_matmul_close(got, x, dense64(q).astype(np.float32))
  np.testing.assert_array_equal(got, _jax_path(f, x, qvalue, scale))


@pytest.mark.parametrize("name,group", [("int8", None), ("int4", 32), ("float8_e4m3fn", None),
                                        ("uint4", 16), ("int8_offset_f16", 32)])
def test_hi_arguments_and_results_take_the_cpp_path(installed, name, group):
  w, _, dense, bound, _ = any_format(RNG, (64, 32), name, group)
  x = _w(5, 64)

  def step(x, params):
    return hx.matmul_q(x, params["w"]) + params["b"], params["w"]

  f = jax.jit(step)
  params = {"w": w, "b": jnp.arange(32.0)}
  y, w_out = f(x, params)
  _same(_on_cpp_path(f, x, params), (y, w_out))
  _same(_jax_path(f, x, params), (y, w_out))
  _same(w_out, w)  # rebuilt from the executable's outputs by the C++ path
  want = np.asarray(x, np.float64) @ dense + np.arange(32.0)
  # the product of f32 x with the f32-evaluated weight (error `bound` per element) in
  # k = 64 terms, then the bias: gamma(k + 1) of the magnitudes
  mags = np.abs(np.asarray(x, np.float64)) @ (np.abs(dense) + bound) + np.arange(32.0)
  assert_within(y, want, gamma(66) * mags + np.abs(np.asarray(x, np.float64)) @ bound)


def test_rank1_tuples_and_closed_over_weights(installed):
  q = hx.quantize(_w(16, 8))
  r = hx.outer(_w(3), _w(4))
  t = hx.make_tup(q, hx.make_tup(r, jnp.ones(2)))
  w_global = hx.quantize(_w(16, 8), jnp.int4, group_size=8)

  def f(t, r, x):
    inner = hx.get_tuple_element(t, 1)
    y = hx.matmul_q(x, hx.get_tuple_element(t, 0)) + hx.matmul_q(x, w_global)
    return hx.make_tup(hx.get_tuple_element(inner, 0), r), y

  g = jax.jit(f)
  x = _w(2, 16)
  got = g(t, r, x)
  _same(_on_cpp_path(g, t, r, x), got)
  _same(_jax_path(g, t, r, x), got)
  assert str(jax.typeof(got[0])) == "Tup{r1[3,4],r1[3,4]}"
  want = np.asarray(x, np.float64) @ (dense64(q) + dense64(w_global))
  assert_within(got[1], want, gamma(34) * (np.abs(np.asarray(x, np.float64))
                                          @ (np.abs(dense64(q)) + np.abs(dense64(w_global)))))


def _modules(f, *args):
  """The text of every module lowered while ``f(*args)`` runs (after hxmlir's pipeline)."""
  texts = []

  def record(*a, **k):
    result = inner(*a, **k)
    texts.append(str(result.module))
    return result

  inner = _jax.wrap_lower_jaxpr_to_module(record)
  try:
    jax.block_until_ready(f(*args))
  finally:
    assert _jax.unwrap_lower_jaxpr_to_module(record, inner)
  return texts


def test_the_compiled_program_is_jax_s(installed):
  q = hx.quantize(_w(64, 32), jnp.int4, group_size=32)
  x = _w(4, 64)

  def f(x, q):
    return jnp.tanh(hx.matmul_q(x, q)), hx.dequantize(q)

  jax.clear_caches()
  ours = _modules(jax.jit(f), x, q)
  jax.clear_caches()
  with _jax.jax_python_dispatch():
    theirs = _modules(jax.jit(f), x, q)
  assert len(ours) == 1 and ours == theirs
  assert '"hx.matmul_q"' in ours[0] or "hx_matmul_q" in ours[0]


def test_trace_time_errors_are_raised_at_every_call(installed):
  q = hx.quantize(_w(8, 4))
  f = jax.jit(lambda x, q: hx.matmul_q(x, q))
  with pytest.raises(TypeError) as first:
    f(_w(2, 5), q)
  with pytest.raises(TypeError) as again:
    f(_w(2, 5), q)
  hx.uninstall()
  with pytest.raises(TypeError) as jax_s:
    jax.jit(lambda x, q: hx.matmul_q(x, q))(_w(2, 5), q)
  assert str(first.value) == str(again.value) == str(jax_s.value)
  assert "f32[2,5]" in str(first.value) and "q8[8,4]" in str(first.value)


def test_static_arguments_and_donation(installed):
  q = hx.quantize(_w(16, 8))
  x = _w(3, 16)
  f = jax.jit(lambda x, q, scale: hx.matmul_q(x, q) * scale, static_argnums=2)
  want = f(x, q, 2.0)
  np.testing.assert_array_equal(_on_cpp_path(f, x, q, 2.0), want)
  np.testing.assert_array_equal(f(x, q, 3.0), f(x, q, 1.0) * 3.0)
  assert f._cache_size() == 3

  def g(x, q):  # outputs of the components' types: both buffers are used
    qvalue, scale = hx.qarray_parts(q)
    return hx.matmul_q(x, q), hx.make_qarray(qvalue, scale * 2.0)

  g = jax.jit(g, donate_argnums=1)
  copies = [hx.make_qarray(*(jnp.array(c, copy=True) for c in hx.qarray_parts(q)))
            for _ in range(3)]
  g(x, copies[0])
  with jax.no_tracing(True):
    got, _ = g(x, copies[1])
  np.testing.assert_array_equal(got, want / 2.0)
  assert all(c.is_deleted() for c in hx.qarray_parts(copies[1]))  # donated, component-wise


def test_shardings_on_a_mesh(installed, mesh):
  q = jax.device_put(hx.quantize(_w(16, 8)), NamedSharding(mesh, PartitionSpec(None, "i")))
  x = _w(4, 16)
  out = NamedSharding(mesh, PartitionSpec(None, "i"))
  f = jax.jit(lambda x, q: hx.matmul_q(x, q), out_shardings=out)
  want = f(x, q)
  got = _on_cpp_path(f, x, q)
  np.testing.assert_array_equal(got, want)
  assert got.sharding == out
  np.testing.assert_array_equal(_jax_path(f, x, q), want)


def test_export_and_lower_are_unchanged(installed):
  q = hx.quantize(_w(16, 8))
  x = _w(2, 16)
  f = jax.jit(lambda x, q: hx.matmul_q(x, q))
  text = f.lower(x, q).as_text()
  f(x, q)
  assert f.lower(x, q).as_text() == text
  exported = hx_export.export(f)(x, q)
  call = jax.jit(exported.call)
  np.testing.assert_array_equal(call(x, q), f(x, q))
  np.testing.assert_array_equal(_on_cpp_path(call, x, q), f(x, q))


def test_effects_keep_jax_s_python_path(installed, capsys):
  q = hx.quantize(_w(8, 4))
  f = jax.jit(lambda x, q: jax.debug.print("{}", hx.matmul_q(x, q).sum(), ordered=True))
  f(_w(2, 8), q)
  f(_w(2, 8), q)
  jax.effects_barrier()
  assert len(capsys.readouterr().out.strip().splitlines()) == 2


def test_uninstall_restores_jax_s_dispatch(uninstalled):
  assert _jax.current_run_python_pjit() is _jax.jax_run_python_pjit
  q = hx.quantize(_w(8, 4))
  x = _w(2, 8)
  hx.install()
  assert _jax.current_run_python_pjit() is not _jax.jax_run_python_pjit
  f = jax.jit(lambda x, q: hx.matmul_q(x, q))
  want = f(x, q)
  _on_cpp_path(f, x, q)
  hx.uninstall()
  assert _jax.current_run_python_pjit() is _jax.jax_run_python_pjit
  g = jax.jit(lambda x, q: hx.matmul_q(x, q))
  for h in (f, g):  # JAX's Python path on every call again (the setting keys the cache)
    h(x, q)
    with pytest.raises(RuntimeError, match="re-tracing"), jax.no_tracing(True):
      h(x, q)
  # without hxmlir's kernels, the same numbers within f32 rounding
  assert_matmul_close(g(x, q), x, dense64(q).astype(np.float32))
  assert_matmul_close(want, x, dense64(q).astype(np.float32))


def test_a_thread_without_hxmlir_keeps_jax_s_path(uninstalled):
  q = hx.quantize(_w(8, 4))
  x = _w(2, 8)
  f = jax.jit(lambda x, q: hx.matmul_q(x, q))
  seen = {}

  def other():
    f(x, q)
    try:
      with jax.no_tracing(True):
        f(x, q)
      seen["path"] = "C++"
    except RuntimeError:
      seen["path"] = "Python"

  with hx.installed():
    f(x, q)
    _on_cpp_path(f, x, q)
    t = threading.Thread(target=other)
    t.start()
    t.join()
  assert seen["path"] == "Python"
  assert _jax.current_run_python_pjit() is _jax.jax_run_python_pjit


def test_hx_jit_is_jax_jit_when_installed(installed):
  q = hx.quantize(_w(16, 8))
  x = _w(2, 16)
  f = hx.jit(lambda x, q: (hx.matmul_q(x, q), q))
  y, q_out = f(x, q)
  _same(_on_cpp_path(f, x, q), (y, q_out))
  assert f._cache_size() == 1
  hx.uninstall()
  _same(f(x, q), (y, q_out))  # hx.jit's own crossing: a second executable
  assert f._cache_size() == 2


def test_nnx_jit_of_a_quantized_model(installed):
  nnx = pytest.importorskip("flax.nnx")
  hxf = pytest.importorskip("hxmlir.flax")
  model = nnx.Sequential(nnx.Linear(32, 64, rngs=nnx.Rngs(0)), jax.nn.relu,
                         nnx.Linear(64, 16, rngs=nnx.Rngs(1)))
  qmodel = hxf.quantize(model, jnp.int8)
  x = _w(4, 32)
  f = nnx.jit(lambda m, x: m(x))
  want = f(qmodel, x)
  np.testing.assert_array_equal(_on_cpp_path(f, qmodel, x), want)
  graphdef, state = nnx.split(qmodel)
  g = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
  np.testing.assert_array_equal(g(state, x), want)
  np.testing.assert_array_equal(_on_cpp_path(g, state, x), want)
