"""The description of a GGUF decoder: what one architecture family computes, as data.

Every GGUF decoder family hxmlir runs is the same pre/post-norm transformer; what differs is
read from the file into one frozen :class:`Config` (printed with :meth:`Config.describe`):

========================  ==================================================================
field                     meaning (llama.cpp's ``src/models/<family>.cpp``)
========================  ==================================================================
``norms``                 where RMSNorms sit: ``attn_pre`` (``attn_norm``), ``attn_post``
                          (``post_attention_norm``), ``ffn_pre`` (``ffn_norm``),
                          ``ffn_post`` (``post_ffw_norm``). Gemma's ``1 + w`` is baked into
                          the stored weight by llama.cpp's converter, so every norm is
                          ``x / rms(x) * w``.
``qk_norm``               ``"none"``, ``"head"`` (RMSNorm of each head's ``head_dim``
                          entries: qwen3, gemma3) or ``"proj"`` (over the whole Q or K
                          projection before the heads split: olmo2)
``qkv_bias``              Q/K/V projections add a bias (qwen2)
``activation``            the gated FFN's gate: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (Gemma)
``rope_style``            ``"norm"``: rotate consecutive pairs ``(2i, 2i+1)`` (llama, whose
                          converter permutes Q/K rows); ``"neox"``: pairs ``(i, i + d/2)``
``rope_bases``            one rotary base per layer (gemma3: 10000 on sliding layers, the
                          file's ``rope.freq_base`` on global ones)
``rope_scales``           one linear position scale per layer (``rope.scaling.type =
                          linear``: ``1 / rope.scaling.factor``; gemma3 scales global layers
                          only), 1.0 when the file has none
``rope_factors``          the file's ``rope_freqs.weight`` (Llama 3) divides each pair's
                          frequency: angle ``pos * base^(-2i/d) / factor[i]``
``windows``               one sliding window per layer (0: full causal): a query at ``p``
                          reads keys ``p - window < c <= p`` (llama.cpp's
                          ``LLAMA_SWA_TYPE_STANDARD``); gemma2 every other layer from the
                          first, gemma3 five of every six
``embed_scale``           the token embedding times it (Gemma: ``sqrt(hidden)``)
``attn_scale``            multiplies ``q . k`` (``1 / sqrt(head_dim)``, or the file's
                          ``attention.scale``)
``attn_softcap``          scores become ``c * tanh(s / c)`` (gemma2), 0 for none
``final_softcap``         logits become ``c * tanh(z / c)`` (gemma2), 0 for none
``tied``                  the head is the token embedding (no ``output.weight``)
``experts``               mixture of experts (qwen3moe): ``experts`` FFNs of ``expert_ffn``,
                          ``experts_used`` chosen per token by a softmax router, their
                          weights renormalised to sum to 1; 0 for a dense FFN
========================  ==================================================================

:func:`describe` reads a file's metadata and tensor table into a :class:`Config`, checking
every hyperparameter's type and range and the tensors the family needs; anything the
decoder does not implement (another rope scaling, an unknown key or tensor) is a
:class:`hxmlir.gguf.GGUFError` naming the file and the key or tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from hxmlir.gguf import GGUFError


@dataclass(frozen=True)
class Family:
  """What a GGUF ``general.architecture`` fixes (the rest is read from the file)."""
  norms: tuple[str, ...]
  qk_norm: str = "none"
  qkv_bias: bool = False
  activation: str = "silu"
  rope_style: str = "neox"
  embed_scale: bool = False
  swa_period: int = 0         # layers i with i % period < period - 1 slide (0: none)
  swa_rope_base: float | None = None  # the sliding layers' rope base (None: the file's)
  softcaps: bool = False      # reads attn_logit_softcapping / final_logit_softcapping
  rope_freqs: bool = False    # may carry rope_freqs.weight
  moe: bool = False


_PRE = ("attn_pre", "ffn_pre")
FAMILIES: dict[str, Family] = {
    "llama": Family(_PRE, rope_style="norm", rope_freqs=True),
    "qwen2": Family(_PRE, qkv_bias=True),
    "qwen3": Family(_PRE, qk_norm="head"),
    "qwen3moe": Family(_PRE, qk_norm="head", moe=True),
    "gemma2": Family(("attn_pre", "attn_post", "ffn_pre", "ffn_post"), activation="gelu_tanh",
                     embed_scale=True, swa_period=2, softcaps=True),
    "gemma3": Family(("attn_pre", "attn_post", "ffn_pre", "ffn_post"), qk_norm="head",
                     activation="gelu_tanh", embed_scale=True, swa_period=6,
                     swa_rope_base=10000.0),
    "olmo2": Family(("attn_post", "ffn_post"), qk_norm="proj"),
}
"""The GGUF architectures the decoder runs, each one :class:`Family`."""

ARCHITECTURES = tuple(FAMILIES)

NORM_TENSORS = {"attn_pre": "attn_norm", "attn_post": "post_attention_norm",
                "ffn_pre": "ffn_norm", "ffn_post": "post_ffw_norm"}
"""The per-layer tensor (``blk.N.<name>.weight``) of each norm position."""

# keys read (or known to change nothing the decoder computes), under "<arch>."
_KEYS = {"block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
         "attention.key_length", "attention.value_length", "feed_forward_length",
         "context_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
         "rope.dimension_count", "vocab_size", "attention.sliding_window",
         "attn_logit_softcapping", "final_logit_softcapping", "rope.scaling.type",
         "rope.scaling.factor", "rope.scaling.original_context_length",
         "rope.scaling.finetuned", "expert_count", "expert_used_count",
         "expert_feed_forward_length", "attention.scale"}


@dataclass(frozen=True)
class Config:
  """One decoder, described (module docstring: each field). Sizes are counts; ``head_dim``
  is the width of one Q/K/V head (``attention.key_length``, ``hidden / heads`` by
  default); the per-layer tuples have ``layers`` entries."""
  family: str
  layers: int
  hidden: int
  heads: int
  kv_heads: int
  head_dim: int
  ffn: int
  vocab: int
  context_length: int
  rms_eps: float
  rope_base: float
  norms: tuple[str, ...] = ("attn_pre", "ffn_pre")
  qk_norm: str = "none"
  qkv_bias: bool = False
  activation: str = "silu"
  rope_style: str = "norm"
  rope_bases: tuple[float, ...] = ()
  rope_scales: tuple[float, ...] = ()
  rope_factors: bool = False
  windows: tuple[int, ...] = ()
  embed_scale: float = 1.0
  attn_scale: float = 0.0
  attn_softcap: float = 0.0
  final_softcap: float = 0.0
  tied: bool = True
  experts: int = 0
  experts_used: int = 0
  expert_ffn: int = 0
  bos: int | None = None
  eos: int | None = None

  def __post_init__(self):  # defaults that follow from the sizes (a hand-built Config)
    set_ = lambda k, v: object.__setattr__(self, k, v)
    if not self.rope_bases:
      set_("rope_bases", (self.rope_base,) * self.layers)
    if not self.rope_scales:
      set_("rope_scales", (1.0,) * self.layers)
    if not self.windows:
      set_("windows", (0,) * self.layers)
    if not self.attn_scale:
      set_("attn_scale", 1.0 / math.sqrt(self.head_dim))

  def first_layers(self, n: int) -> Config:
    """This description cut to its first ``n`` layers (the per-layer tuples too): a decoder
    of the file's first ``n`` blocks, for tests and timing."""
    return replace(self, layers=n, rope_bases=self.rope_bases[:n],
                   rope_scales=self.rope_scales[:n], windows=self.windows[:n])

  def describe(self) -> str:
    """The description as ``key: value`` lines, per-layer tuples run-length folded
    (``windows: 512 x5, 0, 512 x5, 0``)."""
    def fold(v):
      if isinstance(v, str):
        return v
      if not isinstance(v, tuple):
        return f"{v:g}" if isinstance(v, float) else str(v)
      if not v or isinstance(v[0], str):
        return ", ".join(v)
      runs = []
      for x in v:
        if runs and runs[-1][0] == x:
          runs[-1][1] += 1
        else:
          runs.append([x, 1])
      return ", ".join(f"{x:g}" + (f" x{n}" if n > 1 else "") for x, n in runs)
    return "\n".join(f"{f.name}: {fold(getattr(self, f.name))}" for f in fields(self))


def peek_architecture(path: str) -> str | None:
  """``general.architecture`` of the GGUF file ``path``, read from the first key/value pairs
  of its header without parsing the rest (a 262k-token vocabulary takes seconds to read);
  ``None`` when the key is not among the keys before the first array. Raises
  :class:`GGUFError` for a file that is not GGUF (as :func:`hxmlir.gguf.read_header`)."""
  import struct
  sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
  try:
    with open(path, "rb") as f:
      magic, _version, _tensors, kvs = struct.unpack("<4sIQQ", f.read(24))
      if magic != b"GGUF":
        return None  # read_header says what is wrong
      for _ in range(min(kvs, 64)):
        (n,) = struct.unpack("<Q", f.read(8))
        key = f.read(n).decode("utf-8", "replace")
        (ty,) = struct.unpack("<I", f.read(4))
        if ty == 8:
          (n,) = struct.unpack("<Q", f.read(8))
          value = f.read(n)
          if key == "general.architecture":
            return value.decode("utf-8", "replace")
        elif ty in sizes:
          f.seek(sizes[ty], 1)
        else:
          return None  # an array: stop here
  except (OSError, struct.error):
    return None
  return None


class UnsupportedModelError(GGUFError):
  """A GGUF file of an architecture the decoder does not run: names the file and what it
  has (the architecture) and the supported ones."""


def check_architecture(arch: Any, path: str) -> Family:
  """The :class:`Family` of ``arch``; :class:`UnsupportedModelError` naming the file, the
  architecture and the supported ones otherwise."""
  if arch is None:
    raise UnsupportedModelError(f"{path}: the file has no general.architecture, so hxmlir's "
                                f"decoder cannot run it (supported: {', '.join(ARCHITECTURES)})")
  if arch not in FAMILIES:
    raise UnsupportedModelError(f"{path}: GGUF architecture {arch!r} is not supported by hxmlir's "
                    f"decoder (supported: {', '.join(ARCHITECTURES)})")
  return FAMILIES[arch]


class _Meta:
  """Typed reads of ``<arch>.*`` keys, each error naming the file and the key."""

  def __init__(self, meta: dict[str, Any], arch: str, path: str):
    self.meta, self.arch, self.path = meta, arch, path

  def err(self, key: str, msg: str) -> GGUFError:
    return GGUFError(f"{self.path}: metadata key '{self.arch}.{key}' {msg}")

  def int(self, key: str, default: int | None = None, *, lo: int = 1) -> int:
    v = self.meta.get(f"{self.arch}.{key}", default)
    if v is None:
      raise self.err(key, "is missing")
    if isinstance(v, bool) or not isinstance(v, int):
      raise self.err(key, f"must be an integer, got {v!r}")
    if v < lo:
      raise self.err(key, f"must be >= {lo}, got {v}")
    return v

  def float(self, key: str, default: float | None = None, *, positive: bool = True,
            zero: bool = False) -> float:
    v = self.meta.get(f"{self.arch}.{key}", default)
    if v is None:
      raise self.err(key, "is missing")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
      raise self.err(key, f"must be a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v) or (positive and v < 0) or (v == 0 and not zero):
      raise self.err(key, f"must be a finite number {'>= 0' if zero else '> 0'}, got {v}")
    return v


def describe(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]],
             path: str = "<gguf>") -> Config:
  """The :class:`Config` of a GGUF file: its metadata ``meta`` (key -> value) and tensor
  table ``shapes`` (name -> dense shape, NumPy order ``[out, in]``). Raises
  :class:`GGUFError` naming the file and the key or tensor for: another architecture; a
  missing key, one of the wrong type or out of range (counts >= 1, rope bases finite and
  > 0, heads a multiple of the KV heads, a rope dimension other than the head's, a vocabulary
  that does not match the embedding); an ``<arch>.*`` key or a rope scaling the decoder does
  not implement; a tensor the family needs that is missing, of the wrong shape, or one
  left unused."""
  arch = meta.get("general.architecture")
  fam = check_architecture(arch, path)
  m = _Meta(meta, arch, path)
  unknown = sorted(k for k in meta if k.startswith(f"{arch}.")
                   and k[len(arch) + 1:] not in _KEYS)
  if unknown:
    raise GGUFError(f"{path}: metadata key {unknown[0]!r} is not implemented by hxmlir's "
                    f"{arch} decoder (it would change the computation or is unknown)")
  layers, hidden = m.int("block_count"), m.int("embedding_length")
  heads = m.int("attention.head_count")
  kv_heads = m.int("attention.head_count_kv", heads)
  if heads % kv_heads:
    raise m.err("attention.head_count_kv", f"= {kv_heads} must divide the {heads} heads")
  if f"{arch}.attention.key_length" not in meta and hidden % heads:
    raise m.err("attention.head_count", f"= {heads} must divide embedding_length {hidden}")
  head_dim = m.int("attention.key_length", hidden // heads)
  if m.int("attention.value_length", head_dim) != head_dim:
    raise m.err("attention.value_length", f"must equal key_length {head_dim}")
  if head_dim % 2:
    raise m.err("attention.key_length", f"= {head_dim} must be even (rotary pairs)")
  if m.int("rope.dimension_count", head_dim) != head_dim:
    raise m.err("rope.dimension_count", f"must equal the head dimension {head_dim}: "
                "partial rotary embeddings are not implemented")
  base = m.float("rope.freq_base", 10000.0)
  scaling = meta.get(f"{arch}.rope.scaling.type", "none")
  if scaling not in ("none", "linear"):
    raise m.err("rope.scaling.type", f"= {scaling!r} is not implemented (supported: 'none', "
                "'linear')")
  factor = m.float("rope.scaling.factor", 1.0) if scaling == "linear" else 1.0
  window = m.int("attention.sliding_window", 0, lo=0) if fam.swa_period else 0
  if fam.swa_period and window < 1:
    raise m.err("attention.sliding_window", "is missing or 0: this family slides")
  if not fam.swa_period and f"{arch}.attention.sliding_window" in meta:
    raise m.err("attention.sliding_window", f"is not implemented for {arch}")
  swa = [fam.swa_period > 0 and i % fam.swa_period < fam.swa_period - 1 for i in range(layers)]
  local_base = fam.swa_rope_base or base
  experts = used = expert_ffn = 0
  if fam.moe:
    experts, used = m.int("expert_count"), m.int("expert_used_count")
    if used > experts:
      raise m.err("expert_used_count", f"= {used} exceeds expert_count {experts}")
  emb = shapes.get("token_embd.weight")
  if emb is None or len(emb) != 2 or emb[1] != hidden:
    raise GGUFError(f"{path}: tensor 'token_embd.weight' is "
                    f"{'missing' if emb is None else f'of shape {list(emb)}'}; expected "
                    f"[vocab, {hidden}]")
  vocab = emb[0]
  n_tokens = len(meta.get("tokenizer.ggml.tokens") or ()) or vocab
  if m.int("vocab_size", vocab) != vocab or n_tokens > vocab:
    raise GGUFError(f"{path}: the vocabulary ({n_tokens} tokens, vocab_size "
                    f"{meta.get(f'{arch}.vocab_size')}) does not match token_embd.weight's "
                    f"{vocab} rows")
  ffn = m.int("feed_forward_length", 0 if fam.moe else None, lo=0 if fam.moe else 1)
  if fam.moe:
    expert_ffn = m.int("expert_feed_forward_length", ffn // used if ffn else None)
  cfg = Config(
      family=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
      head_dim=head_dim, ffn=ffn, vocab=vocab, context_length=m.int("context_length"),
      rms_eps=m.float("attention.layer_norm_rms_epsilon"), rope_base=base,
      norms=fam.norms, qk_norm=fam.qk_norm, qkv_bias=fam.qkv_bias, activation=fam.activation,
      rope_style=fam.rope_style,
      rope_bases=tuple(local_base if s else base for s in swa),
      # gemma3 scales its global layers only (llama.cpp: rope_freq_scale_train_swa = 1)
      rope_scales=tuple(1.0 if s else 1.0 / factor for s in swa),
      rope_factors="rope_freqs.weight" in shapes, windows=tuple(window if s else 0 for s in swa),
      embed_scale=math.sqrt(hidden) if fam.embed_scale else 1.0,
      attn_scale=m.float("attention.scale", 1.0 / math.sqrt(head_dim)),
      attn_softcap=m.float("attn_logit_softcapping", 0.0, zero=True) if fam.softcaps else 0.0,
      final_softcap=m.float("final_logit_softcapping", 0.0, zero=True) if fam.softcaps else 0.0,
      tied="output.weight" not in shapes, experts=experts, experts_used=used,
      expert_ffn=expert_ffn, bos=_token(meta, "bos", vocab, path),
      eos=_token(meta, "eos", vocab, path))
  check_tensors(cfg, shapes, path)
  return cfg


def _token(meta, which: str, vocab: int, path: str) -> int | None:
  key = f"tokenizer.ggml.{which}_token_id"
  v = meta.get(key)
  if v is None:
    return None
  if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
    raise GGUFError(f"{path}: metadata key '{key}' = {v!r} must be a token id in [0, {vocab})")
  return v


def expected_tensors(cfg: Config) -> dict[str, tuple[int, ...]]:
  """Every tensor ``cfg`` reads, name -> dense shape ``[out, in]`` (norms ``[d]``, expert
  stacks ``[experts, out, in]``)."""
  d, hd = cfg.hidden, cfg.head_dim
  q, kv = cfg.heads * hd, cfg.kv_heads * hd
  out = {"token_embd.weight": (cfg.vocab, d), "output_norm.weight": (d,)}
  if not cfg.tied:
    out["output.weight"] = (cfg.vocab, d)
  if cfg.rope_factors:
    out["rope_freqs.weight"] = (hd // 2,)
  for i in range(cfg.layers):
    b = f"blk.{i}."
    layer = {"attn_q": (q, d), "attn_k": (kv, d), "attn_v": (kv, d), "attn_output": (d, q)}
    layer.update({NORM_TENSORS[n]: (d,) for n in cfg.norms})
    if cfg.qk_norm == "head":
      layer.update(attn_q_norm=(hd,), attn_k_norm=(hd,))
    elif cfg.qk_norm == "proj":
      layer.update(attn_q_norm=(q,), attn_k_norm=(kv,))
    if cfg.experts:
      e, f = cfg.experts, cfg.expert_ffn
      layer.update(ffn_gate_inp=(e, d), ffn_gate_exps=(e, f, d), ffn_up_exps=(e, f, d),
                   ffn_down_exps=(e, d, f))
    else:
      layer.update(ffn_gate=(cfg.ffn, d), ffn_up=(cfg.ffn, d), ffn_down=(d, cfg.ffn))
    out.update({f"{b}{k}.weight": s for k, s in layer.items()})
    if cfg.qkv_bias:
      out.update({f"{b}attn_q.bias": (q,), f"{b}attn_k.bias": (kv,), f"{b}attn_v.bias": (kv,)})
  return out


def check_tensors(cfg: Config, shapes: dict[str, tuple[int, ...]], path: str) -> None:
  """Raises :class:`GGUFError` naming the file and the first tensor that ``cfg`` needs and
  the file lacks, has another shape, or that the file has and ``cfg`` would leave unused
  (the decoder never ignores a tensor)."""
  want = expected_tensors(cfg)
  for name, shape in want.items():
    if name not in shapes:
      raise GGUFError(f"{path}: tensor {name!r} is missing ({cfg.family} needs it)")
    if tuple(shapes[name]) != shape:
      raise GGUFError(f"{path}: tensor {name!r} has shape {list(shapes[name])}, expected "
                      f"{list(shape)} from the metadata")
  extra = sorted(set(shapes) - set(want))
  if extra:
    raise GGUFError(f"{path}: tensor {extra[0]!r} is not used by hxmlir's {cfg.family} "
                    f"decoder ({len(extra)} unused): the file describes something it does "
                    "not implement")
