"""JAX's everyday placement, sharding and debugging APIs on hi values.

Every hi type (q8, r1, Tup), eagerly and under ``jit``: ``jax.device_put``,
``jax.lax.with_sharding_constraint``, ``jit(in_shardings=, out_shardings=)``,
``jax.debug.print`` / ``jax.debug.callback``, and the value classes' refusals of
numpy conversion, ``==`` and ``hash``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from numerics import assert_matmul_close, assert_within, elementwise_bound, sum_bound

import hxmlir as hx


def _w(shape=(4, 8), offset=0.0):
  return (jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape) - 7 + offset) / 3


def _q(shape=(4, 8)):
  return hx.quantize(_w(shape))


def _r1():
  return hx.outer(jnp.arange(4, dtype=jnp.float32) + 1, jnp.arange(8, dtype=jnp.float32) - 2)


def _tup():
  return hx.make_tup(jnp.arange(3.0), _q())


# --- value classes: numpy conversion, ==, hash -------------------------------

@pytest.mark.parametrize("make, name, how", [
    (_q, "q8[4,8]", "hx.dequantize(q)"),
    (_r1, "r1[4,8]", "hx.factors(r)"),
    (_tup, "Tup{f32[3],q8[4,8]}", "hx.get_tuple_element(t, i)"),
])
def test_value_refuses_numpy_eq_hash(make, name, how):
  v, w = make(), make()
  for convert in (np.asarray, np.array):  # jnp.asarray: test_not_an_array.py
    with pytest.raises(TypeError, match=rf"a {name.replace('[', '.').replace('{', '.')} value "
                       rf"has no single numpy form.*{how.replace('(', '.').replace(')', '.')}"):
      convert(v)
  with pytest.raises(TypeError, match="== / != on .* values is not defined"):
    _ = v == w
  with pytest.raises(TypeError, match="== / != on .* values is not defined"):
    _ = v != w
  with pytest.raises(TypeError, match=r"not hashable.*hash\(jax.typeof\(v\)\)"):
    hash(v)
  with pytest.raises(TypeError, match="truth value of a .* value is not defined"):
    bool(v)
  # the type stays hashable and comparable: JAX keys its caches on it
  assert hash(jax.typeof(v)) == hash(jax.typeof(w)) and jax.typeof(v) == jax.typeof(w)


def test_value_refusals_leave_transforms_working():
  q = _q()
  x = _w((3, 4))
  got_jit = jax.jit(hx.matmul_q)(x, q)
  got_const = jax.jit(lambda x: hx.matmul_q(x, q))(x)
  np.testing.assert_array_equal(got_jit, got_const)
  # the scale applied to either operand or after the sum: up to 2 more roundings a term
  assert_matmul_close(got_jit, x, hx.dequantize(q), extra=2)
  g = jax.grad(lambda w: hx.dequantize(hx.quantize(w)).sum())(_w())
  np.testing.assert_array_equal(g, jnp.ones((4, 8)))


# --- meshes ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def auto_mesh():
  """The 4 x 2 mesh ``("i", "j")`` with Auto axes (JAX's default for ``jit`` sharding)."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices")
  return jax.make_mesh((4, 2), ("i", "j"), axis_types=(AxisType.Auto, AxisType.Auto))


def _specs(v):
  """The partition specs of a concrete hi value's components (q8: qvalue, scale)."""
  return tuple(tuple(c.sharding.spec) for c in _arrays(v))


def _arrays(v):
  """The arrays a hi value is made of, depth first."""
  if isinstance(v, (hx.QArray, hx.Rank1, hx.HiTup)):
    return [a for p in _parts(v) for a in _arrays(p)]
  return [v]


def _parts(v):
  if isinstance(v, hx.QArray):
    return (v.qvalue, v.scale)
  if isinstance(v, hx.Rank1):
    return (v.col, v.row)
  return tuple(v.elts)


def _dense(v):
  return hx.dequantize(v) if isinstance(v, hx.QArray) else np.outer(*hx.factors(v))


# --- jax.device_put ----------------------------------------------------------------

def _partial_put(d):
  return lambda v: jax.device_put(v, d)


@pytest.mark.parametrize("make, specs", [
    (_q, ((("i", None), ("i",)), (("i", "j"), ("i",)))),
    (_r1, ((("i",), (None,)), (("i",), ("j",)))),
])
@pytest.mark.parametrize("jit", [False, True])
def test_device_put_named_sharding(auto_mesh, make, specs, jit):
  v = make()
  for spec, want in zip((P("i", None), P("i", "j")), specs):
    s = NamedSharding(auto_mesh, spec)
    put = _partial_put(s)
    out = (jax.jit(put) if jit else put)(v)
    assert type(out) is type(v)
    if not jit:  # under jit on CPU device_put lowers to nothing (for arrays too)
      assert _specs(out) == want
    np.testing.assert_array_equal(_dense(out), _dense(v))


@pytest.mark.parametrize("make", [_q, _r1, _tup])
@pytest.mark.parametrize("jit", [False, True])
def test_device_put_device_or_none(make, jit):
  v = make()
  for d in (None, jax.devices()[1]):
    put = _partial_put(d)
    out = (jax.jit(put) if jit else put)(v)
    assert jax.typeof(out) == jax.typeof(v)
    for a, b in zip(_arrays(out), _arrays(v)):
      np.testing.assert_array_equal(a, b)
    if d is not None and not jit:
      assert all(c.devices() == {d} for c in _arrays(out))


def test_device_put_explicit_mesh_types_and_pytrees(mesh):
  q, w = _q(), _w()
  out = jax.device_put(q, NamedSharding(mesh, P("i", "j")))
  assert str(jax.typeof(out)) == "q8[4@i,8@j]"
  assert _specs(out) == (("i", "j"), ("i",))
  with jax.set_mesh(mesh):
    assert str(jax.typeof(jax.device_put(q, P("i", None)))) == "q8[4@i,8]"
    assert str(jax.typeof(jax.jit(lambda q: jax.device_put(q, P("i", None)))(q))) == "q8[4@i,8]"
  s = NamedSharding(mesh, P("i", None))
  tree = jax.device_put({"q": q, "w": w}, {"q": s, "w": s})
  assert _specs(tree["q"]) == (("i", None), ("i",)) and tuple(tree["w"].sharding.spec) == ("i", None)
  np.testing.assert_array_equal(hx.dequantize(tree["q"]), hx.dequantize(q))


@pytest.mark.parametrize("jit", [False, True])
def test_device_put_grad(auto_mesh, jit):
  s = NamedSharding(auto_mesh, P("i", None))
  f = jax.grad(lambda w: (hx.dequantize(jax.device_put(hx.quantize(w), s)) * w).sum())
  w = _w()
  g = (jax.jit(f) if jit else f)(w)
  # d/dw sum(deq(quant(w)) * w) with straight-through quantize: w + deq(quant(w)); the
  # scale (1/127 and the product), the dequantize product and the sum, on each side
  deq = np.asarray(hx.dequantize(hx.quantize(w)))
  assert_within(g, np.asarray(w) + deq, elementwise_bound(np.abs(w) + np.abs(deq), 8))


def test_device_put_refusals(auto_mesh):
  s = NamedSharding(auto_mesh, P("i", None))
  with pytest.raises(TypeError, match=r"a Tup\{f32\[3\],q8\[4,8\]\} has no dense sharding.*"
                     "hx.make_tup"):
    jax.device_put(_tup(), s)
  with pytest.raises(TypeError, match=r"a Tup\{f32\[3\],q8\[4,8\]\} has no dense sharding"):
    jax.jit(lambda t: jax.device_put(t, s))(_tup())
  with pytest.raises(TypeError, match=r"partition spec .* more than the dense rank 2 of q8\[4,8\]"):
    jax.device_put(_q(), NamedSharding(auto_mesh, P("i", "j", None)))


# --- jax.lax.with_sharding_constraint ------------------------------------------------

@pytest.mark.parametrize("make, spec, want", [
    (_q, P("i", None), ('{"i"}, {}]', '[{"i"}]')),
    (_q, P("i", "j"), ('{"i"}, {"j"}]', '[{"i"}]')),
    (_r1, P("i", "j"), ('[{"i"}]', '[{"j"}]')),
])
def test_with_sharding_constraint_auto_mesh(auto_mesh, make, spec, want):
  v = make()
  s = NamedSharding(auto_mesh, spec)
  f = jax.jit(lambda v: _dense_traced(jax.lax.with_sharding_constraint(v, s)))
  text = f.lower(v).as_text()
  constraints = [line for line in text.splitlines() if "sdy.sharding_constraint" in line]
  assert len(constraints) == 2, text
  for line, w in zip(constraints, want):
    assert w in line, line
  np.testing.assert_array_equal(f(v), _dense(v))
  # eagerly: the constraint is JAX's own impl, per component
  np.testing.assert_array_equal(_dense(jax.lax.with_sharding_constraint(v, s)), _dense(v))


def _dense_traced(v):
  if isinstance(jax.typeof(v), hx.QArrayTy):
    return hx.dequantize(v)
  c, r = hx.factors(v)
  return c[:, None] * r[None, :]


def test_with_sharding_constraint_grad_vmap_and_refusals(auto_mesh):
  s = NamedSharding(auto_mesh, P("i", None))
  w = _w()
  g = jax.jit(jax.grad(lambda w: hx.dequantize(
      jax.lax.with_sharding_constraint(hx.quantize(w), s)).sum()))(w)
  np.testing.assert_array_equal(g, jnp.ones_like(w))
  qs = jax.vmap(hx.quantize, out_axes=hx.QArraySpec())(jnp.stack([w, 2 * w]))
  out = jax.jit(jax.vmap(lambda q: hx.dequantize(jax.lax.with_sharding_constraint(
      q, NamedSharding(auto_mesh, P(None, "j")))), in_axes=hx.QArraySpec(), axis_size=2))(qs)
  np.testing.assert_array_equal(out, jax.vmap(hx.dequantize, in_axes=hx.QArraySpec(),
                                              axis_size=2)(qs))
  with pytest.raises(TypeError, match=r"a Tup\{f32\[3\],q8\[4,8\]\} has no dense sharding"):
    jax.jit(lambda t: jax.lax.with_sharding_constraint(t, s))(_tup())


# --- jax.jit(in_shardings=, out_shardings=) -----------------------------------------

@pytest.mark.parametrize("explicit", [False, True])
def test_jit_in_shardings_q8(auto_mesh, mesh, explicit):
  m = mesh if explicit else auto_mesh
  s = NamedSharding(m, P("i", "j"))
  q = _q()
  f = jax.jit(hx.dequantize, in_shardings=s)
  text = f.lower(q).as_text()
  assert 'tensor<4x8xi8> {sdy.sharding = #sdy.sharding<@mesh, [{"i"}, {"j"}]>' in text, text
  assert 'tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"i"}]>' in text, text
  np.testing.assert_array_equal(f(q), hx.dequantize(q))


@pytest.mark.parametrize("explicit", [False, True])
def test_jit_out_shardings_q8_r1(auto_mesh, mesh, explicit):
  m = mesh if explicit else auto_mesh
  s = NamedSharding(m, P("i", "j"))
  w = _w()
  q = jax.jit(hx.quantize, out_shardings=s)(w)
  assert _specs(q) == (("i", "j"), ("i",))
  if explicit:
    assert str(jax.typeof(q)) == "q8[4@i,8@j]"
  np.testing.assert_array_equal(hx.dequantize(q), hx.dequantize(hx.quantize(w)))
  col, row = jnp.arange(4.0), jnp.arange(8.0)
  r = jax.jit(hx.outer, out_shardings=s)(col, row)
  assert _specs(r) == (("i",), ("j",))
  np.testing.assert_array_equal(hx.factors(r)[0], col)


def test_jit_shardings_pytree_nested_grad_refusals(auto_mesh):
  s = NamedSharding(auto_mesh, P("i", None))
  q, x = _q(), _w((2, 4))
  f = jax.jit(lambda x, q: hx.matmul_q(x, q), in_shardings=(None, s))
  deq = hx.dequantize(q)
  assert_matmul_close(f(x, q), x, deq, extra=2)  # extra: as in the refusals test above
  nested = jax.jit(lambda x, q: jax.jit(hx.matmul_q, in_shardings=(None, s))(x, q) * 2)
  assert_matmul_close(np.asarray(nested(x, q)) / 2, x, deq, extra=2)  # / 2 is exact
  g = jax.jit(jax.grad(lambda x, q: hx.matmul_q(x, q).sum(), argnums=1), in_shardings=(None, s))
  # each column of the cotangent is x summed over its rows
  x64 = np.asarray(x, np.float64)
  assert_within(g(x, q), x64.sum(0)[:, None], sum_bound(x, 0)[:, None])
  with pytest.raises(TypeError, match=r"a Tup\{f32\[3\],q8\[4,8\]\} has no dense sharding"):
    jax.jit(lambda t: hx.get_tuple_element(t, 0), in_shardings=s)(_tup())


# --- jax.debug.print / jax.debug.callback --------------------------------------------

@pytest.mark.parametrize("make, words", [
    (_q, ("QArray(qvalue=", "scale=")),
    (_r1, ("Rank1(col=", "row=")),
    (_tup, ("HiTup(elts=",)),
])
@pytest.mark.parametrize("jit", [False, True])
def test_debug_print(capfd, make, words, jit):
  v = make()

  def f(v):
    jax.debug.print("v={} k={k}", v, k=1.5)
    return v
  (jax.jit(f) if jit else f)(v)
  jax.effects_barrier()
  out = capfd.readouterr().out
  assert out.startswith("v=") and "k=1.5" in out, out
  for word in words:
    assert word in out, out


def test_debug_callback_gets_values(capfd):
  got = []
  w = _w()

  def f(w):
    jax.debug.callback(lambda q: got.append(np.asarray(hx.dequantize(q))), hx.quantize(w))
    return w
  f(w)
  jax.jit(f)(w)
  jax.effects_barrier()
  assert len(got) == 2
  for g in got:
    np.testing.assert_array_equal(g, hx.dequantize(hx.quantize(w)))


@pytest.mark.parametrize("jit", [False, True])
def test_debug_print_under_vmap_prints_each_example(capfd, jit):
  ws = jnp.stack([_w(), 2 * _w(), -_w()])
  qs = hx.QArray(jnp.stack([hx.quantize(w).qvalue for w in ws]),
                 jnp.stack([hx.quantize(w).scale for w in ws]))

  def f(q, k):
    jax.debug.print("q={} k={}", q, k)
    jax.debug.print("t={}", hx.make_tup(k, q))
    return k

  g = jax.vmap(f, in_axes=(hx.QArraySpec(), 0))
  (jax.jit(g) if jit else g)(qs, jnp.arange(3))
  jax.effects_barrier()
  got = capfd.readouterr().out
  for b in range(3):  # the same lines as a Python loop over the batch
    f(hx.QArray(qs.qvalue[b], qs.scale[b]), jnp.arange(3)[b])
  jax.effects_barrier()
  want = capfd.readouterr().out
  assert sorted(got.splitlines()) == sorted(want.splitlines()) and got.count("q=QArray") == 3


def test_with_sharding_constraint_explicit_mesh_is_jax_refusal(mesh):
  # as for arrays: JAX takes Auto axes only there and names reshard
  q = jax.device_put(_q(), NamedSharding(mesh, P("i", None)))
  with pytest.raises(ValueError, match="can only refer to Auto axes.*reshard"):
    jax.jit(lambda q: jax.lax.with_sharding_constraint(q, NamedSharding(mesh, P("i", None))))(q)


def test_jit_in_shardings_r1(auto_mesh):
  s = NamedSharding(auto_mesh, P("i", "j"))
  r = _r1()
  f = jax.jit(lambda r: hx.factors(r)[0][:, None] * hx.factors(r)[1], in_shardings=s)
  text = f.lower(r).as_text()
  assert 'tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"i"}]>' in text, text
  assert 'tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"j"}]>' in text, text
  np.testing.assert_array_equal(f(r), np.outer(*hx.factors(r)))
