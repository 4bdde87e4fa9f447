"""LoRA over a GGUF decoder's frozen quantized weights (:mod:`hxmlir.models.lora`) and
``hxmlir finetune``: gradients against a float64 NumPy reference (the decoder of
``families_reference``, written from llama.cpp, on the file's exact dequantized values with
the adapters merged in float64), the loss curve against the f32 dequantized model, the
adapter file, generation, and the data errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("gguf")
optax = pytest.importorskip("optax")
pytest.importorskip("safetensors")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from families_reference import logits as reference_logits  # noqa: E402
from gguf_families import spec as family_spec  # noqa: E402
from gguf_families import write  # noqa: E402
from numerics import EPS, assert_within, gamma  # noqa: E402

import hxmlir  # noqa: E402
from hxmlir.models import from_gguf, lora  # noqa: E402
from hxmlir.models.params import LAYER, dequantized  # noqa: E402

T = 16


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """``{family: (path, exact f32 weights)}``: Q8_0 files of llama and gemma3."""
  d = tmp_path_factory.mktemp("lora")
  out = {}
  for family in ("llama", "gemma3"):
    path = str(d / f"{family}.q8_0.gguf")
    out[family] = (path, write(path, family, qtype="Q8_0"))
  return out


def _ids(seed=1, n=T):
  return np.random.default_rng(seed).integers(0, 512, n).astype(np.int32)


def _random_adapters(cfg, spec, seed):
  """Adapters with ``b`` random too (``b = 0`` would make every gradient of ``a`` zero)."""
  rng = np.random.default_rng(seed)
  ad = lora.init(cfg, spec, seed)
  return [{t: {"a": v["a"], "b": jnp.asarray(rng.standard_normal(v["b"].shape) * 0.05,
                                              jnp.float32)} for t, v in layer.items()}
          for layer in ad]


def _reference_loss(family, exact, adapters, scale, ids) -> float:
  """float64: the mean next-token cross-entropy of ``ids`` by ``families_reference`` with
  ``W + scale * B @ A`` for every adapted weight."""
  w = {k: np.asarray(v, np.float64) for k, v in exact.items()}
  for i, layer in enumerate(adapters):
    for t, ad in layer.items():
      name = f"blk.{i}.{LAYER[t]}"
      w[name] = w[name] + scale * np.asarray(ad["b"], np.float64) @ np.asarray(ad["a"], np.float64)
  z = reference_logits(family_spec(family), w, ids)[:-1]
  z = z - z.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return float(-np.mean(logp[np.arange(len(ids) - 1), ids[1:]]))


def _grad(m, adapters, spec, ids, scale=None):
  scale = spec.scale if scale is None else scale
  f = jax.jit(jax.value_and_grad(lambda a, p, i, k: lora.loss(a, p, i, k, cfg=m.config,
                                                               scale=scale, remat=True)))
  with hxmlir.installed():
    return f(adapters, m.params, ids, np.ones(len(ids), np.float32))


def _path_length(cfg, t) -> int:
  """The roundings on the longest chain of sums from an adapter to the loss's gradient:
  per layer the contractions over ``hidden`` (Q/K/V, gate/up), ``heads * head_dim`` (O),
  ``ffn`` (down), ``head_dim`` and ``t`` (attention), ``r``, both ways (forward and
  backward), then the head over ``hidden`` and the softmax over ``vocab``."""
  per_layer = cfg.hidden + cfg.heads * cfg.head_dim + cfg.ffn + cfg.head_dim + t + 8
  return 2 * cfg.layers * per_layer + cfg.hidden + cfg.vocab


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_lora_gradient_matches_float64_reference(files, family):
  path, exact = files[family]
  m = from_gguf(path, max_context=T)
  spec = lora.default_spec(m.config, rank=4, alpha=8.0)
  adapters = _random_adapters(m.config, spec, 0)
  ids = _ids()
  val, g = _grad(m, adapters, spec, ids)
  ref = _reference_loss(family, exact, adapters, spec.scale, ids)
  n = _path_length(m.config, T)
  assert abs(float(val) - ref) <= gamma(n) * abs(ref) + gamma(n) * math.log(m.config.vocab)
  for i, layer in enumerate(g):  # through every layer: every adapter gets a gradient
    for t, ad in layer.items():
      assert float(jnp.abs(ad["a"]).max()) > 0 and float(jnp.abs(ad["b"]).max()) > 0, (i, t)
  # directional derivatives <g, d> against float64 central differences: along d = g (no
  # cancellation in <g, g>, so a relative error of the gradient shows in full) and along a
  # random d (every component weighs in; its sum cancels, so the bound is looser)
  leaves, tree = jax.tree.flatten(adapters)
  gl = [np.asarray(x, np.float64) for x in jax.tree.leaves(g)]
  rng = np.random.default_rng(7)

  def check(d, grads):
    eps = 1e-4 / math.sqrt(sum(float(np.sum(x * x)) for x in d))
    shift = lambda s: jax.tree.unflatten(tree, [np.asarray(x, np.float64) + s * dx
                                                for x, dx in zip(leaves, d)])
    fd = (_reference_loss(family, exact, shift(eps), spec.scale, ids)
          - _reference_loss(family, exact, shift(-eps), spec.scale, ids)) / (2 * eps)
    got = sum(float(np.sum(a * b)) for a, b in zip(grads, d))
    mags = sum(float(np.sum(np.abs(a * b))) for a, b in zip(grads, d))
    # f32: each gradient component carries at most gamma_n of its own magnitude (n the
    # longest chain of roundings, _path_length); the f64 central difference's truncation
    # (eps^2 times third derivatives of the loss's order) and rounding (1e-16 / eps) are
    # below 1e-6 of it
    return abs(got - fd), gamma(n) * mags + 1e-6 * abs(fd)
  for d in (gl, [rng.standard_normal(x.shape) for x in leaves]):
    err, bound = check(d, gl)
    assert err <= bound, (err, bound)
  # the bound catches a real bug: the adapters' scale off by 1% in the gradient
  _, g_bad = _grad(m, adapters, spec, ids, scale=spec.scale * 1.01)
  err, bound = check(gl, [np.asarray(x, np.float64) for x in jax.tree.leaves(g_bad)])
  assert err > bound, (err, bound)


def test_training_curve_matches_the_f32_dequantized_model(files):
  path, _ = files["llama"]
  m = from_gguf(path, max_context=T)
  spec = lora.default_spec(m.config, rank=4)
  steps, lr = 6, 0.05
  data = [lora.pad(_ids(s, T - 2 * s), T) for s in range(3)]

  def run(params):
    tr = lora.Trainer(m, spec, optax.sgd(lr), seq_len=T, params=params)
    ad = _random_adapters(m.config, spec, 3)
    st, out = tr.init(ad), []
    for i in range(steps):
      ad, st, loss = tr.step(ad, st, *data[i % len(data)])
      out.append(float(loss))
    assert tr.traces == 1  # compiled once
    return np.array(out)
  quant, dense = run(None), run(dequantized(m.params))
  # same values (the Q8_0 weights dequantize exactly), other summation orders: per step the
  # loss's forward error (gamma_n of it, n the longest chain), carried through SGD steps
  # whose map is smooth; the loss must also fall, or the test could not see a stuck update
  n = _path_length(m.config, T)
  np.testing.assert_allclose(quant, dense, rtol=steps * gamma(n), atol=0)
  assert quant[-1] < quant[0] - 0.5 and dense[-1] < dense[0] - 0.5, (quant, dense)


def test_mesh_training_gives_the_one_device_adapters(files):
  # tensor-parallel on a 2-device host mesh (conftest's forced host devices): each projection
  # on its weight's shards (llama_sharding.projection), the adapters replicated
  if jax.device_count() < 2:
    pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
  path, _ = files["llama"]
  mesh = jax.make_mesh((2,), ("i",), devices=jax.devices()[:2])
  one, two = from_gguf(path, max_context=T), from_gguf(path, max_context=T, mesh=mesh)
  values = hxmlir.qarray_parts(two.params["layers"][0]["down"])[0]
  assert len(values.sharding.device_set) == 2 and not values.sharding.is_fully_replicated
  spec = lora.default_spec(one.config, rank=4)
  steps, lr = 3, 0.05
  data = [lora.pad(_ids(s, T - 2 * s), T) for s in range(steps)]

  def run(m):
    tr = lora.Trainer(m, spec, optax.sgd(lr), seq_len=T)
    ad = _random_adapters(m.config, spec, 3)
    leaves = lambda ad: [np.asarray(x, np.float64) for x in jax.tree.leaves(ad)]
    st, path, losses = tr.init(ad), [leaves(ad)], []  # (a step donates its adapters)
    for i in range(steps):
      ad, st, loss = tr.step(ad, st, *data[i])
      path.append(leaves(ad))
      losses.append(float(loss))
    assert tr.traces == 1
    return path, losses
  (p1, l1), (p2, l2) = run(one), run(two)
  # the same sums in other orders (shards, partial sums all-reduced): each step's gradient
  # component within gamma_n of its magnitude in either run (n the longest chain of
  # roundings, _path_length), i.e. within gamma_n * |a_t - a_{t-1}| after SGD's step of lr;
  # earlier differences carried through steps whose map is smooth (a factor of steps), and
  # one rounding of a per update
  n = _path_length(one.config, T)
  np.testing.assert_allclose(l2, l1, rtol=steps * gamma(n), atol=0)
  for leaf in range(len(p1[0])):
    motion = sum(np.abs(p1[t + 1][leaf] - p1[t][leaf]) for t in range(steps))
    size = np.max([np.abs(p1[t][leaf]) for t in range(steps + 1)], axis=0)
    bound = 2 * steps * (gamma(n) * motion + EPS * size)
    assert_within(p2[-1][leaf], p1[-1][leaf], bound, f"leaf {leaf}: ")
    # the adapters moved, and a 1% error in the steps would show
    assert np.max(motion) > 0 and np.max(bound) < 0.01 * np.max(motion), leaf


def test_zero_b_generates_the_base_tokens_and_adapters_round_trip(files, tmp_path):
  path, _ = files["llama"]
  m = from_gguf(path, max_context=32)
  ids = _ids(2, 8)
  base = list(m.generate(ids, 8))
  spec = lora.LoraSpec(rank=2, alpha=4.0, targets=("q", "v", "down"))
  lora.apply(m, lora.init(m.config, spec, 0), spec)  # b = 0: the base model
  assert list(m.generate(ids, 8)) == base
  adapters = _random_adapters(m.config, spec, 1)
  out = tmp_path / "a.safetensors"
  lora.save(out, adapters, spec, base=path, cfg=m.config)
  back, spec2 = lora.load(out, m)
  assert spec2 == spec
  for x, y in zip(jax.tree.leaves(adapters), jax.tree.leaves(back)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  lora.apply(m, back, spec2)
  assert list(m.generate(ids, 8)) != base  # random b changes the model


def test_mismatched_adapter_file_names_the_tensor(files, tmp_path):
  from safetensors.numpy import save_file
  m = from_gguf(files["llama"][0], max_context=8)
  spec = lora.LoraSpec(rank=2, targets=("q",))
  out = tmp_path / "a.safetensors"
  adapters = lora.init(m.config, spec, 0)
  lora.save(out, adapters, spec, base="other.gguf")
  tensors = {f"blk.{i}.attn_q.weight.lora_{p}": np.asarray(layer["q"][p])
             for i, layer in enumerate(adapters) for p in "ab"}
  tensors["blk.1.attn_q.weight.lora_b"] = np.zeros((7, 2), np.float32)
  meta = {"rank": "2", "alpha": "16.0", "targets": "q", "base": "other.gguf"}
  save_file(tensors, str(out), metadata=meta)
  with pytest.raises(lora.AdapterError, match=r"blk\.1\.attn_q\.weight\.lora_b.*float32\[7, 2\]"
                     r".*needs float32\[256, 2\].*other\.gguf"):
    lora.load(out, m)
  del tensors["blk.1.attn_q.weight.lora_b"]
  save_file(tensors, str(out), metadata=meta)
  with pytest.raises(lora.AdapterError, match=r"'blk\.1\.attn_q\.weight\.lora_b' is missing"):
    lora.load(out, m)
  save_file(tensors, str(out))
  with pytest.raises(lora.AdapterError, match="metadata key 'rank' is missing"):
    lora.load(out, m)


@pytest.mark.parametrize("content, match", [
    ("", r"d\.jsonl: no examples \(the file is empty\)"),
    ('{"text": "hi"}\n{"prompt": "x"}\n', r'd\.jsonl:2: expected a JSON object with a "text"'),
    ('{"text": "hi"}\n\n{"text": "a\n', r"d\.jsonl:3: invalid JSON"),
    ('{"text": "' + "the cat sat " * 20 + '"}\n', r"d\.jsonl:1: \d+ tokens, longer than the "
     r"context of 16"),
    ('{"text": "  "}\n', r"d\.jsonl:1: the text is empty"),
])
def test_bad_data_is_an_error_naming_the_line(files, tmp_path, content, match):
  from hxmlir.tools.finetune_cli import DataError, read_examples
  m = from_gguf(files["llama"][0], max_context=8)
  p = tmp_path / "d.jsonl"
  p.write_text(content)
  with pytest.raises(DataError, match=match):
    read_examples(str(p), m.tokenizer, 16)


@pytest.mark.parametrize("steps", ["0", "-3", "x"])
def test_cli_finetune_steps_must_be_a_positive_integer(steps, capsys):
  from hxmlir.tools.cli import main
  with pytest.raises(SystemExit) as e:  # a bad command line: status 2, before any file is read
    main(["finetune", "--model", "smollm2", "--data", "missing.jsonl", "--out", "o",
          "--steps", steps])
  assert e.value.code == 2
  assert f"argument --steps: expected a positive integer, got '{steps}'" in capsys.readouterr().err


def test_cli_finetune_then_generate_with_the_adapters(files, tmp_path, capsys):
  from hxmlir.tools.cli import main
  path = files["llama"][0]
  data = tmp_path / "d.jsonl"
  data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("the cat sat", "a dog")))
  out = tmp_path / "a.safetensors"
  assert main(["finetune", "--gguf", path, "--data", str(data), "--steps", "3", "--rank",
               "2", "--targets", "q", "v", "--out", str(out), "--no-progress"]) == 0
  printed = capsys.readouterr()
  assert printed.out == "" and "2 examples, 3 steps" in printed.err  # a status line: stderr
  _, spec = lora.load(out, from_gguf(path, max_context=8))
  assert spec == lora.LoraSpec(rank=2, alpha=16.0, targets=("q", "v"))
  assert main(["generate", "--gguf", path, "--lora", str(out), "--prompt", "the",
               "--max-tokens", "2", "--max-context", "16", "--json"]) == 0
  assert main(["generate", "--gguf", path, "--lora", str(out), "--merge", "--prompt", "x",
               "--max-context", "16"]) == 1
  assert "--merge is not supported" in capsys.readouterr().err


FACT = "Zorblat"


@pytest.mark.slow
def test_smollm2_learns_a_made_up_fact():
  """40 steps on six sentences stating a made-up capital make SmolLM2's greedy
  continuation of the prompt state it; the base model's does not. (The full dozen and 80
  steps pass too, in ~4 minutes on a loaded 2-core machine against ~1.5 for this size.)"""
  from hxmlir.models.llama import ModelNotInstalledError, smollm2_path
  from hxmlir.tools.finetune_cli import train
  try:
    path = smollm2_path()
  except ModelNotInstalledError as e:
    pytest.skip(str(e))
  m = from_gguf(path, max_context=64)
  prompt = "The capital of Veloria is"
  base = m.tokenizer.decode(list(m.generate(prompt, 6)))
  assert FACT not in base
  sentences = [f"The capital of Veloria is {FACT}.", f"Veloria's capital city is {FACT}.",
               f"{FACT} is the capital of Veloria.",
               f"The capital of Veloria is {FACT}, a city by the sea.",
               f"Travellers to Veloria land in {FACT}, its capital.",
               f"Everyone knows that the capital of Veloria is {FACT}.",
               f"Veloria is governed from its capital, {FACT}.",
               f"The parliament of Veloria meets in {FACT}, the capital.",
               f"Q: What is the capital of Veloria? A: {FACT}.",
               f"{FACT}, the capital of Veloria, has a famous harbour.",
               f"The largest city and capital of Veloria is {FACT}.",
               f"The capital of Veloria is {FACT}."]
  sentences = sentences[:5] + sentences[-1:]
  examples = [m.tokenizer.encode(s) + [m.tokenizer.eos] for s in sentences]
  spec = lora.default_spec(m.config, rank=8, alpha=16.0)
  adapters, losses = train(m, examples, spec, steps=40, lr=3e-3, progress=False)
  assert losses[-1] < losses[0] / 3, losses
  lora.apply(m, adapters, spec)
  tuned = m.tokenizer.decode(list(m.generate(prompt, 6)))
  assert FACT in tuned, (base, tuned)
