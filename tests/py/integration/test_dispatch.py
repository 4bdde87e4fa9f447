"""hx.jit: jax.jit with concrete hi arguments and results passed as their lo components."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hxmlir as hx
from hxmlir import formats

RNG = np.random.default_rng(7)


def _w(k, n):
  return jnp.asarray(RNG.standard_normal((k, n)).astype(np.float32))


FORMATS = [(jnp.int8, None), (jnp.int4, 32), (jnp.float8_e4m3fn, None), (jnp.int8, 16)]


def _parts_equal(a, b):
  """Hi values (or arrays) with bitwise-equal components and the same type."""
  assert jax.typeof(a) == jax.typeof(b)
  if isinstance(a, hx.QArray):
    return all(np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))
               for x, y in zip(hx.qarray_parts(a), hx.qarray_parts(b)))
  if isinstance(a, hx.Rank1):
    return all(np.array_equal(x, y) for x, y in zip(hx.factors(a), hx.factors(b)))
  if isinstance(a, hx.HiTup):
    return all(_parts_equal(x, y) for x, y in zip(a.elts, b.elts))
  return np.array_equal(a, b)


@pytest.mark.parametrize("dtype,group", FORMATS)
def test_same_results_as_jax_jit_for_every_format(dtype, group):
  params = {"w": [hx.quantize(_w(64, 32), dtype, group_size=group) for _ in range(3)],
            "b": jnp.arange(32.0)}
  x = _w(5, 64)

  def step(params, x, *, scale=1.0):
    for q in params["w"]:
      x = jnp.tanh(hx.matmul_q(x, q) + params["b"]) @ jnp.ones((32, 64)) * scale
    return x, params["w"][0]

  want_y, want_q = jax.jit(step)(params, x, scale=0.5)
  got_y, got_q = hx.jit(step)(params, x, scale=0.5)
  np.testing.assert_array_equal(got_y, want_y)   # the same program: bitwise equal
  assert isinstance(got_q, hx.QArray) and _parts_equal(got_q, want_q)


def _table_qarray(f, shape=(64, 32), group=16):
  """A concrete ``hx.QArray`` of format ``f`` (``hxmlir.formats.FORMATS``) built from its
  components by ``hx.make_qarray``: values over ``f.value_range``, scales (and offsets)
  of ``f.scale_dtype``, one per group of ``group``; a block format's are ``shape[0]`` rows of
  one block (random words, small f16 scales)."""
  if f.block:
    words = RNG.integers(0, 1 << 16, size=(shape[0], 1, f.block_words)).astype(np.uint16)
    scales = [jnp.asarray(RNG.uniform(0.001, 0.01, (shape[0], 1)).astype(np.float16))
              for _ in range(2 if f.offset else 1)]
    return hx.make_qarray(jnp.asarray(words), *scales)
  lo, hi = f.value_range
  vals = RNG.integers(int(lo), int(hi) + 1, size=shape)
  if f.integer:
    qvalue = formats.store(jnp.asarray(vals.astype(np.int8 if lo < 0 else np.uint8)), f)
  else:
    qvalue = jnp.asarray((vals / 4).astype(f.value_dtype))
  sshape = (*shape[:-1], shape[-1] // group)
  scale = jnp.asarray(RNG.uniform(0.01, 0.1, sshape).astype(f.scale_dtype))
  offset = jnp.asarray(RNG.uniform(-1, 1, sshape).astype(f.scale_dtype)) if f.offset else None
  return hx.make_qarray(qvalue, scale, offset)


@pytest.mark.parametrize("name", sorted(formats.FORMATS))
def test_every_table_format_crosses_as_all_its_components(name):
  # the offset (u4o, q8o) and f16 scales travel too: a u4o came back as q4 (the offset
  # dropped) and matmul_q differed from jax.jit's by ~90
  f = formats.FORMATS[name]
  q = _table_qarray(f)
  assert jax.typeof(q).format is f
  x = _w(5, 64)
  got_id, want_id = hx.jit(lambda w: w)(q), jax.jit(lambda w: w)(q)
  assert jax.typeof(got_id) == jax.typeof(q) and _parts_equal(got_id, want_id)
  assert len(hx.qarray_parts(got_id)) == (3 if f.offset else 2)

  def step(x, q):
    return hx.matmul_q(x, q), q

  (want_y, want_q), (got_y, got_q) = jax.jit(step)(x, q), hx.jit(step)(x, q)
  np.testing.assert_array_equal(got_y, want_y)
  assert _parts_equal(got_q, want_q) and jax.typeof(got_q) == jax.typeof(q)
  dense = np.asarray(formats.decode(*hx.qarray_parts(q)), np.float64)
  # against float64 numpy (k = 64 terms of |x| <~ 4, |w| <~ 17: f32 rounding ~1e-3)
  np.testing.assert_allclose(got_y, np.asarray(x, np.float64) @ dense, rtol=0, atol=1e-2)


def test_rank1_and_nested_tuples_round_trip():
  q = hx.quantize(_w(8, 6))
  r = hx.outer(jnp.arange(3.0), jnp.arange(4.0) + 1)
  t = hx.make_tup(q, hx.make_tup(r, jnp.ones(2)))

  def f(t, r):
    inner = hx.get_tuple_element(t, 1)
    return hx.make_tup(hx.get_tuple_element(inner, 0), r), hx.get_tuple_element(t, 0)

  want, got = jax.jit(f)(t, r), hx.jit(f)(t, r)
  for a, b in zip(got, want):
    assert _parts_equal(a, b)
  assert str(jax.typeof(got[0])) == "Tup{r1[3,4],r1[3,4]}"


def test_compiles_once_per_signature_and_pipeline():
  f = hx.jit(lambda x, q: hx.matmul_q(x, q))
  q = hx.quantize(_w(16, 8))
  f(_w(2, 16), q)
  f(_w(2, 16), q)
  assert f._cache_size() == 1
  f(_w(3, 16), q)                                   # another shape
  assert f._cache_size() == 2
  with hx.installed("hx-verify"):                   # another pipeline keys JAX's caches
    f(_w(3, 16), q)
  assert f._cache_size() == 3


def test_calls_take_jax_cpp_path_and_key_on_weak_types():
  # JAX 0.10.2 calls a jitted function whose jaxpr holds hi equations through its Python
  # path every time (jax.no_tracing then raises); hx.jit's function holds lo equations
  # only, so after the first call of a signature JAX's C++ cache and dispatch take it
  traces = []

  def f(x, q, c):
    traces.append(jax.typeof(c))
    return hx.matmul_q(x, q).astype(jnp.bfloat16) * c

  q, x = hx.quantize(_w(16, 8)), _w(2, 16)
  consts = (2.0, jnp.float32(2.0), np.float32(2.0))  # weak f32, strong f32 (twice)
  wants = [jax.jit(f)(x, q, c) for c in consts]
  traces.clear()
  g = hx.jit(f)
  g(x, q, 2.0)
  with jax.no_tracing(True):
    for _ in range(2):
      g(x, q, 2.0)
  assert len(traces) == 1
  for c, want in zip(consts, wants):
    got = g(x, q, c)
    with jax.no_tracing(True):
      g(x, q, c)
    assert jax.typeof(got) == jax.typeof(want)  # bf16 * weak f32 is bf16; * f32 is f32
    np.testing.assert_array_equal(got, want)
  assert [str(t) for t in traces] == ["~float32[]", "float32[]"]


def test_under_transformations_it_is_jax_jit():
  qs = [hx.quantize(_w(16, 16)) for _ in range(2)]

  def f(x, qs):
    return sum(hx.matmul_q(x, q) for q in qs).sum()

  x = _w(4, 16)
  np.testing.assert_array_equal(jax.grad(hx.jit(f))(x, qs), jax.grad(jax.jit(f))(x, qs))
  xs = _w(12, 16).reshape(3, 4, 16)
  np.testing.assert_array_equal(jax.vmap(hx.jit(f), (0, None))(xs, qs),
                                jax.vmap(jax.jit(f), (0, None))(xs, qs))


def test_called_inside_a_transformation_with_concrete_arguments():
  # a function closing over a tracer of an outer jit (and grad through it), its hi
  # arguments concrete: the call is staged as jax.jit's, not dispatched
  q = hx.quantize(_w(16, 8))

  def outer(make_jit, x):
    return make_jit(lambda q: hx.matmul_q(x, q) * 2)(q).sum()

  x = _w(2, 16)
  for transform in (jax.jit, jax.grad):
    want = transform(functools.partial(outer, jax.jit))(x)
    got = transform(functools.partial(outer, hx.jit))(x)
    np.testing.assert_array_equal(got, want)


def test_lower_is_the_lowering_over_components():
  q = hx.quantize(_w(16, 8))
  text = hx.jit(hx.matmul_q).lower(_w(2, 16), q).as_text()
  assert 'stablehlo.composite "hx.matmul_q"' in text
  assert "tensor<16x8xi8>" in text and "tensor<16xf32>" in text


@pytest.mark.parametrize("kw,why", [({"in_shardings": None}, "jax.device_put"),
                                    ({"out_shardings": None}, "with_sharding_constraint"),
                                    ({"static_argnums": 0}, "functools.partial"),
                                    ({"static_argnames": "n"}, "functools.partial")])
def test_refuses_what_would_name_components(kw, why):
  with pytest.raises(TypeError, match=f"hx.jit does not take {next(iter(kw))}: .*{why}"):
    hx.jit(lambda x: x, **kw)
  with pytest.raises(TypeError, match=f"hx.jit does not take {next(iter(kw))}: .*{why}"):
    hx.jit(**kw)


def test_decorator_with_arguments_as_jax_jit():
  def g(y, x, q):
    return y + hx.matmul_q(x, q)

  f = hx.jit(donate_argnums=0)(g)
  q, x = hx.quantize(_w(16, 8)), _w(2, 16)
  y = _w(2, 8)
  want = jax.jit(g)(y, x, q)
  np.testing.assert_array_equal(f(y, x, q), want)
  assert y.is_deleted()  # donated, as jax.jit(g, donate_argnums=0) would


def test_errors_are_jax_jits():
  q = hx.quantize(_w(16, 8))
  f = functools.partial(hx.matmul_q)
  with pytest.raises(TypeError) as want:
    jax.jit(f)(_w(2, 15), q)
  with pytest.raises(TypeError) as got:
    hx.jit(f)(_w(2, 15), q)
  assert str(got.value) == str(want.value)
