"""A GGUF decoder ready to run: :class:`Decoder` (weights placed, jitted prefill/step, KV cache,
generation, export) and :func:`from_gguf`, the one entry point for every supported file.

Python API::

  from hxmlir.models import from_gguf
  m = from_gguf(path)                       # any supported architecture (arch.ARCHITECTURES)
  print(m.config.describe())                # what the file's architecture computes
  m.logits(ids)                             # np.float32[T, vocab], teacher-forced
  for t in m.generate(ids, 16): ...         # greedy token ids (or text with a tokenizer)
  m.export_step().serialize()               # the decode step, for hxmlir run

Tensor parallelism: ``mesh=`` (a one-axis ``jax.sharding.Mesh``) places the weights and the
cache by :mod:`hxmlir.models.llama_sharding` (weights it has no rule for are replicated); the
same jitted functions then run partitioned.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hxmlir import formats, huge_pages
from hxmlir.install_state import ACTIVATIONS, current, is_installed, use_kernels
from hxmlir.integration.dispatch import jit as hx_jit
from hxmlir.integration.installation import installed
from hxmlir.models import llama_sharding
from hxmlir.models.arch import (
  Config,
  check_architecture,
  describe,
  peek_architecture,
)
from hxmlir.models.forward import forward
from hxmlir.models.forward import proj as _proj
from hxmlir.models.params import params_of
from hxmlir.models.sampling import check_sampling, sample
from hxmlir.types.qarray import QArrayTy, make_qarray, qarray_parts
from hxmlir.types.qarray_type import QArraySpec

KV_CACHES = ("f32", "int8")
"""The KV cache formats :func:`from_gguf` takes: ``"f32"`` (4 bytes per element) or
``"int8"`` (``q8`` rows over head_dim: 1 byte per element plus one f32 scale per row)."""


def _installed_for(kernels: bool | None, fn, activations: str = "f32"):
  """``fn`` (a jitted function) called, and lowered by its ``lower``, with hxmlir installed
  as ``kernels`` and ``activations`` ask (:class:`Decoder`): JAX's caches key on the setting,
  so it must hold at every call, not only when the function is made. ``kernels=None``:
  ``fn`` itself."""
  if kernels is None:
    return fn
  block = installed(kernels=kernels, activations=activations)

  def under(method):
    def call(*args):
      if is_installed() and use_kernels() == kernels and current().activations == activations:
        return method(*args)  # the caller's own pipeline, with the kernels asked for
      with block:
        return method(*args)
    return call

  call = under(fn)
  call.lower = under(fn.lower)
  return call


def _check_cache(kv_cache: str, max_context: int | None = None,
                 cfg: Config | None = None) -> None:
  """Raises ``ValueError`` for a ``kv_cache`` other than :data:`KV_CACHES`, or a
  ``max_context`` that is not an int in ``[1, cfg.context_length]``."""
  if kv_cache not in KV_CACHES:
    raise ValueError(f"kv_cache={kv_cache!r} is not supported (supported: "
                     f"{', '.join(map(repr, KV_CACHES))})")
  if cfg is not None and (not isinstance(max_context, (int, np.integer))
                          or isinstance(max_context, bool)
                          or not 1 <= max_context <= cfg.context_length):
    raise ValueError(f"max_context={max_context!r} must be an int in [1, "
                     f"{cfg.context_length}] (the file's context_length)")


class Decoder:
  """A GGUF decoder ready to run (any :data:`hxmlir.models.arch.ARCHITECTURES`): ``config``, ``params`` (the weights pytree on the
  device, in the file's formats), ``tokenizer`` (``None`` until built), ``max_context``.

  Build with :func:`from_gguf`. The weights' CPU buffers are moved into huge pages
  (:func:`hxmlir.huge_pages.collapse`: Gemma 3's decode step 1.02-1.06x what it is from
  4 KiB pages; ``huge_page_bytes`` says how many bytes). ``mesh``: ``None`` (one device) or
  the one-axis mesh ``params`` are placed on (:mod:`hxmlir.models.llama_sharding`).
  ``kernels``: ``True`` (default): the model's functions are compiled and called with
  hxmlir installed (:func:`hxmlir.installed`; the caller's own installed pipeline is
  kept when it already uses the kernels), so its projections run hxmlir's kernels (on
  CPU the native ``hx_matmul_q_cpu_v3``); ``False``: installed with ``kernels=False``
  (the reference decompositions, e.g. to compare with); ``None``: as the caller's
  setting is at each call. ``activations``: ``"f32"`` (default) or ``"int8"``, the opt-in
  integer-activation kernel for the projections (``hx.install(activations="int8")``: x
  quantized to int8 per block of 32 at run time; it changes the numerics), with
  ``kernels=True``. Raises ``ValueError`` for a ``kv_cache`` other than
  :data:`KV_CACHES`, a ``max_context`` outside ``[1, config.context_length]`` or other
  ``activations``."""

  def __init__(self, config: Config, params: dict[str, Any], *, max_context: int,
               kv_cache: str = "f32", metadata: dict[str, Any] | None = None,
               path: str = "<gguf>", mesh: jax.sharding.Mesh | None = None,
               kernels: bool | None = True, activations: str = "f32"):
    if activations not in ACTIVATIONS:
      raise ValueError(f"activations={activations!r} is not one of "
                       f"{', '.join(map(repr, ACTIVATIONS))}")
    _check_cache(kv_cache, max_context, config)
    shardings = None
    if mesh is not None:
      mesh = llama_sharding.auto_mesh(mesh)
      shardings = llama_sharding.param_shardings(params, mesh)
      params = llama_sharding.shard_params(params, mesh)
    self.config, self.params, self.max_context = config, params, max_context
    self.huge_page_bytes = huge_pages.collapse(params)
    """Bytes of the weights' CPU buffers moved into huge pages when the decoder was built
    (:func:`hxmlir.huge_pages.collapse`; 0 where the system cannot)."""
    self.mesh = mesh
    self.kv_cache, self.metadata, self.path = kv_cache, metadata or {}, path
    self.tokenizer = None
    self.traces = {"logits": 0, "prefill": 0, "step": 0, "greedy_step": 0, "batch_step": 0}
    """How many times each jitted function has been traced (= compiled)."""
    proj = _proj if mesh is None else llama_sharding.projection(params, mesh)
    def counted(name, outs=slice(None)):
      def fwd(*args):
        self.traces[name] += 1
        return forward(*args, cfg=config, proj=proj)[outs]
      return fwd
    def greedy(*args):  # the decode step and the argmax in one executable
      self.traces["greedy_step"] += 1
      logits, k, v = forward(*args, cfg=config, proj=proj)
      return jnp.argmax(logits[-1:], axis=-1).astype(jnp.int32), k, v
    # on a mesh: the placement declared (lowered and exported alike), ids and logits
    # replicated (every process holds them), the caches kept where they are
    logits, step = {}, {}
    if mesh is not None:
      rep, (ks, vs) = llama_sharding.replicated(mesh), self._cache_sharding(max_context)
      logits = {"in_shardings": (shardings, rep, rep, None, None), "out_shardings": rep}
      step = {"in_shardings": (shardings, rep, rep, ks, vs), "out_shardings": (rep, ks, vs)}
    # one device: hx.jit (the weights cross the call as their arrays, JAX's C++ dispatch);
    # a mesh: jax.jit, whose shardings hx.jit does not take
    jit = jax.jit if mesh is not None else hx_jit
    self.kernels, self.activations = kernels, activations
    self._logits = _installed_for(kernels, jit(counted("logits", 0), **logits), activations)
    self._prefill = _installed_for(
        kernels, jit(counted("prefill"), donate_argnums=(3, 4), **step), activations)
    self._step = _installed_for(
        kernels, jit(counted("step"), donate_argnums=(3, 4), **step), activations)
    self._greedy_step = _installed_for(
        kernels, jit(greedy, donate_argnums=(3, 4), **step), activations)
    def batch_greedy(*args):  # B sequences' decode steps: the weights shared (not mapped)
      self.traces["batch_step"] += 1
      cache = QArraySpec() if kv_cache == "int8" else 0  # (a q8 cache maps by its own spec)
      axes = (None, 0, 0, (cache,) * config.layers, (cache,) * config.layers)
      return jax.vmap(greedy, in_axes=axes, out_axes=(0, axes[3], axes[4]))(*args)
    self._batch_greedy_step = None if mesh is not None else _installed_for(
        kernels, jit(batch_greedy, donate_argnums=(3, 4)), activations)

  @classmethod
  def from_gguf(cls, path: str | os.PathLike, *, kv_cache: str = "f32",
                max_context: int = 2048, mesh: jax.sharding.Mesh | None = None,
                kernels: bool | None = True, activations: str = "f32") -> Decoder:
    """:func:`from_gguf` (this class's constructor on the file's description and weights)."""
    from hxmlir import gguf
    _check_cache(kv_cache)
    path = os.fspath(path)
    arch = peek_architecture(path)
    if arch is not None:  # before the vocabulary is read (seconds for 262k tokens)
      check_architecture(arch, path)
    header = gguf.read_header(path)  # once: load() takes it
    meta = header.metadata
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist()))
              for t in header.reader.tensors}
    cfg = describe(meta, shapes, path)  # before loading: a bad file fails fast
    _check_cache(kv_cache, max_context, cfg)
    if mesh is not None:
      llama_sharding.auto_mesh(mesh)  # before loading: a wrong mesh fails fast
    m = cls(cfg, params_of(gguf.load(header), cfg), max_context=max_context,
            kv_cache=kv_cache, metadata=meta, path=path, mesh=mesh, kernels=kernels,
            activations=activations)
    m.tokenizer = _tokenizer(meta, path)
    return m

  def new_cache(self, positions: int | None = None):
    """Zeroed ``(k, v)`` of ``positions`` (default :attr:`max_context`) positions, each a
    tuple of one array per layer: ``k`` of ``f32[kv_heads, positions, head_dim]`` and
    ``v`` of ``f32[kv_heads, head_dim, positions]`` (:func:`attention` says why), or for
    ``kv_cache="int8"`` both of ``q8[kv_heads, positions, head_dim]`` (zero values, zero
    scales); on a mesh placed by :func:`~hxmlir.models.llama_sharding.cache_spec`."""
    c = self.config
    positions = self.max_context if positions is None else positions
    ks, vs = self._cache_sharding(positions)
    if self.kv_cache == "int8":
      shape = (c.kv_heads, positions, c.head_dim)
      def new(s):
        q = make_qarray(jnp.zeros(shape, jnp.int8),
                        jnp.zeros(formats.scale_shape(shape, None), jnp.float32))
        return q if s is None else jax.device_put(q, s)
      return tuple(new(s) for s in ks), tuple(new(s) for s in vs)
    k_shape = (c.kv_heads, positions, c.head_dim)
    v_shape = (c.kv_heads, c.head_dim, positions)
    return (tuple(jnp.zeros(k_shape, jnp.float32, device=s) for s in ks),
            tuple(jnp.zeros(v_shape, jnp.float32, device=s) for s in vs))

  def _cache_sharding(self, positions: int) -> tuple[tuple, tuple]:
    """The shardings of :meth:`new_cache`'s ``k`` and ``v`` layers (``None`` each off a
    mesh)."""
    layers = self.config.layers
    if self.mesh is None:
      return (None,) * layers, (None,) * layers
    def of(layout):
      spec = llama_sharding.cache_spec(self.config.kv_heads, positions, self.mesh, layout)
      return (jax.sharding.NamedSharding(self.mesh, spec),) * layers
    return of("kcd"), of("kcd" if self.kv_cache == "int8" else "kdc")

  def cache_bytes_per_token(self) -> int:
    """Device bytes of K and V for one position, all layers: ``2 * layers * kv_heads *
    head_dim * 4`` for ``"f32"``, ``2 * layers * kv_heads * (head_dim + 4)`` for
    ``"int8"`` (an int8 per element, an f32 scale per row)."""
    c = self.config
    row = c.head_dim * 4 if self.kv_cache == "f32" else c.head_dim + 4
    return 2 * c.layers * c.kv_heads * row

  def cache_bytes(self) -> int:
    """Device bytes of one KV cache (K and V) of :attr:`max_context` positions."""
    return self.max_context * self.cache_bytes_per_token()

  def step_types(self) -> tuple:
    """The decode step's argument types ``(params, ids: i32[1], start: i32[], k, v)``,
    the caches as :meth:`new_cache` makes them (``f32[...]`` or ``q8[...]``); the
    weights' types are :attr:`params`' (``u4o[576,576:g32,f16]`` ...)."""
    i32 = lambda shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    k, v = jax.eval_shape(self.new_cache)
    return jax.tree.map(jax.typeof, self.params), i32((1,)), i32(()), k, v

  def export_step(self, platforms=None):
    """The decode step exported with :func:`hxmlir.export.export` for
    :meth:`step_types`: hi-typed weights and KV cache in the signature, ``(params, ids:
    i32[1], start: i32[], k, v) -> (f32[1, vocab], k, v)``. ``platforms``: as
    :func:`hxmlir.export.export` takes them (default: the default backend's). Returns
    the :class:`hxmlir.export.Exported`; ``.serialize()`` gives the artifact's bytes,
    which ``hxmlir run`` runs on an ``.npz`` of the arguments keyed as
    :mod:`hxmlir.tools.npzio` says (``a0['layers'][0]['qkv'].qvalue``, ``a3[0].scale`` for layer 0's keys ...)."""
    from hxmlir.export import export
    cfg = self.config
    def decode_step(params, ids, start, k_cache, v_cache):
      return forward(params, ids, start, k_cache, v_cache, cfg=cfg)
    return export(jax.jit(decode_step), platforms)(*self.step_types())

  def weight_bytes(self) -> int:
    """Device bytes of :attr:`params` (values, scales, offsets, norms)."""
    from hxmlir.gguf import device_bytes
    return sum(device_bytes(v) for v in jax.tree.leaves(self.params))

  def _ids(self, ids) -> jax.Array:
    a = np.asarray(ids)
    if a.size == 0:
      raise ValueError("the prompt is empty (no token ids)")
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
      raise ValueError(f"expected a 1-D sequence of token ids in [0, {self.config.vocab}), "
                       f"got {a.dtype}{list(a.shape)}")
    bad = a[(a < 0) | (a >= self.config.vocab)]
    if bad.size:
      raise ValueError(f"token id {int(bad[0])} is outside the vocabulary [0, "
                       f"{self.config.vocab})")
    return np.asarray(a, np.int32)  # NumPy: a value every process of a mesh holds alike

  def _prompt_ids(self, prompt: str | Sequence[int], what: str) -> jax.Array:
    """A prompt's token ids (text encoded with :attr:`tokenizer`), checked: ``ValueError``
    without a tokenizer for text, for ids outside the vocabulary or none, and for
    ``max_context`` tokens or more (the message calls it ``what``)."""
    if isinstance(prompt, str) and self.tokenizer is None:
      raise ValueError("this model has no tokenizer (its GGUF file has none, or it was built "
                       "without one): pass token ids, or set .tokenizer")
    ids = self._ids(self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt)
    if ids.shape[0] >= self.max_context:
      raise ValueError(f"{what} has {ids.shape[0]} tokens; max_context is {self.max_context}")
    return ids

  def logits(self, ids: Sequence[int]) -> np.ndarray:
    """Teacher-forced logits ``np.float32[T, vocab]`` of the token ids ``ids`` (length
    ``T``): row ``t`` predicts token ``t + 1``. One jitted forward per length, with a
    cache of ``T`` positions in the model's ``kv_cache`` format (``"int8"``: attention
    reads the quantized K and V, as in :meth:`generate`). Raises ``ValueError`` for ids outside the vocabulary."""
    ids = self._ids(ids)
    out = self._logits(self.params, ids, np.int32(0), *self.new_cache(ids.shape[0]))
    return np.asarray(out)

  def generate(self, prompt_or_ids: str | Sequence[int], max_tokens: int, *,
               temperature: float = 0.0, top_k: int | None = None,
               top_p: float | None = None, seed: int = 0) -> Iterator[int]:
    """Yield up to ``max_tokens`` new token ids after the prompt (text, encoded with
    :attr:`tokenizer`, or token ids), stopping before the file's EOS id (not yielded)
    or when the cache's ``max_context`` positions are full.

    The prompt is prefilled in one call; each further token is one call of the same
    compiled decode step (``T = 1``, the caches donated). ``temperature=0``: greedy
    (argmax, computed inside the step: only the token id comes back to the host);
    otherwise sampling from ``softmax(logits / temperature)`` restricted to
    the ``top_k`` most likely tokens and then to the smallest set whose probability
    reaches ``top_p``, with NumPy's generator seeded by ``seed``. Raises
    ``ValueError`` for an empty prompt, a prompt of ``max_context`` tokens or more, or
    bad sampling parameters (:func:`check_sampling`)."""
    ids = self._prompt_ids(prompt_or_ids, "the prompt")
    check_sampling(max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    return self._generate(ids, max_tokens, temperature, top_k, top_p, seed)

  def _generate(self, ids, max_tokens, temperature, top_k, top_p, seed):
    # the file's EOS, and the tokenizer's end of turn (Gemma's <end_of_turn>) where it has one
    stops = {t for t in (self.config.eos, getattr(self.tokenizer, "eot", None)) if t is not None}
    rng = np.random.default_rng(seed)
    k, v = self.new_cache()
    logits, k, v = self._prefill(self.params, ids, np.int32(0), k, v)
    pos = ids.shape[0]
    tok = sample(np.asarray(logits[-1]), temperature, top_k, top_p, rng)
    if temperature == 0:  # the argmax on the device: only the ids come back
      steps = max(0, min(max_tokens - 1, self.max_context - pos))
      toks = itertools.chain([tok], self._greedy_tokens(tok, pos, k, v, steps))
      for tok in itertools.islice(toks, max_tokens):
        if tok in stops:
          return
        yield tok
      return
    for n in range(max_tokens):
      if tok in stops:
        return
      yield tok
      if n + 1 == max_tokens or pos >= self.max_context:
        return
      logits, k, v = self._step(self.params, np.asarray([tok], np.int32),
                                np.int32(pos), k, v)
      tok = sample(np.asarray(logits[-1]), temperature, top_k, top_p, rng)
      pos += 1

  def generate_batch(self, prompts: Sequence[str | Sequence[int]],
                     max_tokens: int) -> list[list[int]]:
    """Greedy token ids after each of ``B`` prompts (texts or token ids, of any lengths),
    decoded together: each prompt is prefilled alone, then every step is one call for all
    ``B`` sequences (the decode step mapped over them with ``jax.vmap``, the weights shared:
    each projection multiplies ``x`` of ``B`` rows, so a step reads the weights once for
    all of them). The same tokens as :meth:`generate` with ``temperature=0`` for each
    prompt alone: each list stops before the file's EOS (or end of turn) or after
    ``max_tokens`` ids, and all of them when the longest prompt's cache is full (the
    steps are shared). Raises ``TypeError`` for ``prompts`` that is one prompt (a ``str``,
    or token ids not in a list: ``[prompt]`` is a batch of one), ``ValueError`` for no
    prompts, an empty prompt or one of ``max_context`` tokens or more, ``max_tokens < 0``,
    and on a mesh (not supported)."""
    _check_prompts(prompts)
    if self._batch_greedy_step is None:
      raise ValueError("generate_batch is not supported on a mesh: call generate per prompt")
    if not prompts:
      raise ValueError("generate_batch needs at least one prompt")
    check_sampling(max_tokens)
    stops = {t for t in (self.config.eos, getattr(self.tokenizer, "eot", None)) if t is not None}
    caches, firsts, starts = [], [], []
    for prompt in prompts:
      ids = self._prompt_ids(prompt, "a prompt")
      logits, k, v = self._prefill(self.params, ids, np.int32(0), *self.new_cache())
      caches.append((k, v))
      firsts.append(int(np.asarray(logits[-1]).argmax()))
      starts.append(ids.shape[0])
    k = tuple(_stack([c[0][i] for c in caches]) for i in range(self.config.layers))
    v = tuple(_stack([c[1][i] for c in caches]) for i in range(self.config.layers))
    del caches
    out = [[t] for t in firsts]
    done = [t in stops or max_tokens == 0 for t in firsts]
    steps = max(0, min(max_tokens - 1, self.max_context - max(starts)))
    ids, start, pending = np.asarray(firsts, np.int32)[:, None], np.asarray(starts, np.int32), None

    def read(step_ids):  # one step's ids on the host, appended to the unfinished sequences
      for b, t in enumerate(np.asarray(step_ids)[:, 0].tolist()):
        done[b] = done[b] or t in stops
        if not done[b]:
          out[b].append(t)
    for i in range(steps):
      if all(done):
        break
      ids, k, v = self._batch_greedy_step(self.params, ids, start + np.int32(i), k, v)
      if pending is not None:  # read while this step runs
        read(pending)
      pending = ids
    if pending is not None:
      read(pending)
    return [list(itertools.takewhile(lambda t: t not in stops, o))[:max_tokens] for o in out]

  def _greedy_tokens(self, tok: int, pos: int, k_cache, v_cache, n: int) -> Iterator[int]:
    """The ``n`` greedy token ids after ``tok`` at position ``pos`` (the caches hold the
    positions before it), one call of the decode step with the argmax inside each. Each
    step is dispatched before the previous step's id is read, with that id still on the
    device as its input: the host's dispatch of a step (~2 ms for SmolLM2's ~480 arrays)
    overlaps the device's work on the one before. A consumer that stops early (an EOS)
    leaves at most one step computed that nobody reads. The caller keeps
    ``pos + n <= max_context``."""
    ids, pending = np.asarray([tok], np.int32), None
    if self.mesh is not None:  # typed as the step's ids come back (replicated): one trace
      first = ids
      ids = jax.make_array_from_callback(first.shape, llama_sharding.replicated(self.mesh),
                                         lambda index: first[index])
    for i in range(n):
      ids, k_cache, v_cache = self._greedy_step(self.params, ids, np.int32(pos + i),
                                                k_cache, v_cache)
      if pending is not None:
        yield int(np.asarray(pending)[0])
      pending = ids
    if pending is not None:
      yield int(np.asarray(pending)[0])



def _tokenizer(meta: dict[str, Any], path: str = "<gguf>"):
  """The file's tokenizer (:func:`hxmlir.models.tokenizer.tokenizer_from_metadata`), or
  ``None`` when the file has none (the model then runs on token ids)."""
  from hxmlir.models.tokenizer import tokenizer_from_metadata
  return tokenizer_from_metadata(meta, path)


def from_gguf(path: str | os.PathLike, *, kv_cache: str = "f32", max_context: int = 2048,
              mesh: jax.sharding.Mesh | None = None, kernels: bool | None = True,
              activations: str = "f32") -> Decoder:
  """The :class:`Decoder` of the GGUF file ``path``, for any architecture of
  :data:`hxmlir.models.arch.ARCHITECTURES` (its :class:`~hxmlir.models.arch.Config` read by
  :func:`~hxmlir.models.arch.describe`, every tensor in its stored format by
  :func:`hxmlir.gguf.load`). ``kv_cache``: :data:`KV_CACHES`. ``max_context``: the KV
  cache's positions (at most the file's ``context_length``). ``mesh``: a one-axis
  ``jax.sharding.Mesh`` to run tensor-parallel on, or ``None``. ``kernels``, ``activations``:
  as for :class:`Decoder`. The architecture is checked before the vocabulary is read.
  Raises :class:`hxmlir.gguf.GGUFError` (:class:`~hxmlir.models.arch.UnsupportedModelError`
  for another architecture) naming the file and the key or tensor the decoder cannot run
  exactly, ``ValueError`` for a ``kv_cache`` other than :data:`KV_CACHES` or a
  ``max_context`` outside ``[1, context_length]``, and :func:`hxmlir.gguf.load`'s errors."""
  return Decoder.from_gguf(path, kv_cache=kv_cache, max_context=max_context, mesh=mesh,
                           kernels=kernels, activations=activations)


def _check_prompts(prompts) -> None:
  """Raises ``TypeError`` when :meth:`Decoder.generate_batch`'s ``prompts`` is one prompt,
  not a list of them: a ``str`` (each character would be taken as a prompt) or token ids."""
  if isinstance(prompts, str):
    raise TypeError(f"generate_batch: prompts is one str ({len(prompts)} characters), not a "
                    "list of prompts: pass a list of prompts (texts, or lists of token ids), "
                    "[prompt] for one")
  first = next(iter(prompts), None) if isinstance(prompts, Sequence) else None
  if isinstance(first, (int, np.integer)) or getattr(prompts, "ndim", None) == 1:
    raise TypeError("generate_batch: prompts is one prompt's token ids, not a list of "
                    "prompts: pass a list of prompts (texts, or lists of token ids), [ids] "
                    "for one")


def _stack(layers: list) -> Any:
  """The caches of one layer of ``B`` sequences (``f32[...]`` or ``q8[...]`` each) as one
  of a leading dimension ``B``."""
  if isinstance(jax.typeof(layers[0]), QArrayTy):
    return make_qarray(*(jnp.stack(parts) for parts in zip(*map(qarray_parts, layers))))
  return jnp.stack(layers)
