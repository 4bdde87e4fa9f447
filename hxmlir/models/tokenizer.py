"""A GGUF file's tokenizer and chat template, giving llama.cpp's token ids.

:meth:`Tokenizer.from_metadata` builds the tokenizer a GGUF file describes
(``tokenizer.ggml.*`` keys) with the ``tokenizers`` library:

* ``tokenizer.ggml.model == "llama"`` (SentencePiece vocabularies: Gemma, Llama 2,
  Mistral): a BPE over the pieces whose merges come from the pieces' scores (llama.cpp's
  ``llm_tokenizer_spm`` merges the adjacent pair whose concatenation is the
  highest-scoring piece first: each piece ``a + b`` of the vocabulary gives the merge
  ``(a, b)`` ranked by that score), spaces written as ``▁``, a ``▁`` put in front of
  the text when ``tokenizer.ggml.add_space_prefix`` says so (default true), unknown
  characters as their UTF-8 bytes (``<0x..>`` pieces).
* ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE from ``tokenizer.ggml.merges``) with
  the pre-tokenizer ``tokenizer.ggml.pre`` names (:data:`PRE_TOKENIZERS`: llama.cpp's
  regular expressions for ``llama-bpe`` (Llama 3), ``qwen2``, ``smollm``, ``olmo``,
  ``gpt-2``; Llama 3's whole words found in the vocabulary are taken as they are, as
  llama.cpp's ``ignore_merges``).

Either way, control tokens (``token_type`` 3: ``<start_of_turn>``, ``<|im_start|>``) are
matched in the text when ``special=True`` (llama.cpp's ``tokenize(..., special=True)``)
and user-defined ones (type 4: Gemma's runs of spaces and newlines) always. The BOS id is
put in front when ``tokenizer.ggml.add_bos_token`` says so (default: true for ``llama``,
false for ``gpt2``), as llama.cpp's ``tokenize(text, add_bos=True)``.

Chat templates: ``tokenizer.chat_template`` (Jinja2, rendered in ``jinja2``'s sandbox
with ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``), or, for a
file without one whose vocabulary has Gemma's ``<start_of_turn>``, Gemma's turn format
(:data:`GEMMA_TEMPLATE`).

Reading the metadata: :func:`read_metadata` parses a GGUF file's key/value section
directly (a 262k-token vocabulary such as Gemma 3's in well under a second; ``gguf``'s
``GGUFReader`` builds a NumPy array per string and takes 13-40 s on it), and
:meth:`Tokenizer.from_gguf` reads only that.

Python API::

  from hxmlir.models.tokenizer import Tokenizer
  tok = Tokenizer.from_gguf(path)
  tok.encode("The capital of France is")        # [2, 818, 5279, ...] on Gemma 3 (BOS 2)
  tok.decode(ids)
  tok.chat([{"role": "user", "content": "Hi"}])  # the prompt text, ready for encode
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

PRE_TOKENIZERS = {
    # GPT-2's expression (llama.cpp: gpt2, mpt, olmo, ...)
    "gpt-2": ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",),
    "olmo": ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",),
    # digits one by one, then GPT-2's expression (llama.cpp: smollm, starcoder, ...)
    "smollm": ("\\p{N}",
               "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"),
    # Llama 3 (numbers in runs of up to three digits)
    "llama-bpe": ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
                  "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    # Qwen 2 / 2.5 / 3 (digits one by one)
    "qwen2": ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
              "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
}
"""``tokenizer.ggml.pre`` names of ``gpt2`` vocabularies and llama.cpp's regular expressions
for them (``llama-vocab.cpp``), applied one after the other, each splitting the pieces of
the one before."""

IGNORE_MERGES = ("llama-bpe",)
"""Pre-tokenizers whose words found whole in the vocabulary are one token (llama.cpp's
``ignore_merges``)."""

GEMMA_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{% if ns.system %}{{ ns.system + '\\n\\n' }}{% set ns.system = '' %}{% endif %}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")
"""Gemma's turn format, for a Gemma file without ``tokenizer.chat_template`` (Gemma 3
270M's GGUF has none): ``<start_of_turn>user\\n...<end_of_turn>\\n`` per message, the
assistant's role written ``model``, a system message put at the head of the next turn; no
BOS (:meth:`Tokenizer.encode` adds it)."""


class ChatTemplateError(ValueError):
  """The file's chat template (``tokenizer.chat_template``) does not parse, or fails while
  rendering (its own ``raise_exception`` included): the message names the template and the
  line."""


class TokenizerError(ValueError):
  """A GGUF tokenizer hxmlir cannot build: names the file, the key and what it holds."""


def _decoded(b: bytes) -> str:
  return b.decode("utf-8", errors="replace")


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
  """The key/value metadata of the GGUF file ``path`` (format version 2 or 3), read from
  its header only: scalars as Python values, string arrays as lists of ``str``, numeric
  arrays as lists (``tokenizer.ggml.scores`` ...). The GGUF layout (``ggml/docs/gguf.md``):
  magic ``GGUF``, ``u32`` version, ``u64`` tensor and key counts, then each key as a
  ``u64``-length string, a ``u32`` type and the value. Raises :class:`TokenizerError`
  naming the file for another magic or version or a truncated header."""
  p = os.fspath(path)
  with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
    try:
      return _parse_kv(m, p)
    except (struct.error, IndexError, ValueError) as e:
      raise TokenizerError(f"{p}: the GGUF header is truncated or malformed ({e})") from None


def _parse_kv(m, path: str) -> dict[str, Any]:
  if m[:4] != b"GGUF":
    raise TokenizerError(f"{path}: not a GGUF file (magic {bytes(m[:4])!r})")
  version, _, n_kv = struct.unpack_from("<IQQ", m, 4)
  if version not in (2, 3):
    raise TokenizerError(f"{path}: GGUF version {version} is not supported (2 or 3)")
  pos, out = 24, {}
  unpack = struct.unpack_from

  def string(pos):
    (n,) = unpack("<Q", m, pos)
    return _decoded(m[pos + 8:pos + 8 + n]), pos + 8 + n

  for _ in range(n_kv):
    key, pos = string(pos)
    (vtype,) = unpack("<I", m, pos)
    pos += 4
    if vtype == 8:
      out[key], pos = string(pos)
    elif vtype == 9:
      etype, count = unpack("<IQ", m, pos)
      pos += 12
      if etype == 8:
        items = []
        append = items.append
        for _ in range(count):
          (n,) = unpack("<Q", m, pos)
          append(_decoded(m[pos + 8:pos + 8 + n]))
          pos += 8 + n
        out[key] = items
      elif etype in _NUMPY:
        dt = np.dtype(_NUMPY[etype])
        a = np.frombuffer(m, dt, count, pos).copy()
        out[key] = (a.astype(bool) if etype == 7 else a).tolist()
        pos += dt.itemsize * count
      else:
        raise TokenizerError(f"{path}: key {key!r} is an array of GGUF type {etype}, "
                             "which this reader does not parse")
    elif vtype in _SCALAR:
      (out[key],) = unpack(_SCALAR[vtype], m, pos)
      pos += struct.calcsize(_SCALAR[vtype])
    else:
      raise TokenizerError(f"{path}: key {key!r} has GGUF type {vtype}, unknown")
  return out


def _spm_merges(tokens: Sequence[str], scores: Sequence[float],
                types: Sequence[int]) -> list[tuple[str, str]]:
  """BPE merges equivalent to llama.cpp's score-driven SentencePiece merging: ``(a, b)``
  for every split of a normal or user-defined piece into two pieces ``a + b``, ranked by
  the merged piece's score (higher first; ties by the parts' ids, as ``tokenizers``'
  SentencePiece converter orders them).

  Vectorized (a Python loop over Gemma 3's 1.2M splits takes seconds): every substring is
  identified by a polynomial hash of its code points modulo 2^64 and its length
  (``hash(l, r) = (S[r] - S[l]) * B^-l`` from prefix sums ``S[k] = sum_{j<k} (c_j + 1)
  B^j`` over the concatenated pieces), looked up among the pieces' own by binary search;
  each hit is then checked exactly (``a + b == piece``)."""
  lens = np.fromiter(map(len, tokens), np.int64, len(tokens))
  codes = np.frombuffer("".join(tokens).encode("utf-32-le"), np.uint32).astype(np.uint64)
  starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
  n = codes.size
  base = np.uint64(0x9E3779B97F4A7C15)
  inv = np.uint64(pow(int(base), -1, 2**64))
  salt = np.uint64(0x100000001B3)
  with np.errstate(over="ignore"):
    pw = np.concatenate([[np.uint64(1)], np.cumprod(np.full(n, base, np.uint64))])
    ipw = np.concatenate([[np.uint64(1)], np.cumprod(np.full(n, inv, np.uint64))])
    s = np.concatenate([[np.uint64(0)], np.cumsum((codes + np.uint64(1)) * pw[:n])])
    def key(lo, hi):  # the substring [lo, hi) of the concatenation
      return ((s[hi] - s[lo]) * ipw[lo]) ^ ((hi - lo).astype(np.uint64) * salt)
    keys = key(starts, starts + lens)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    def lookup(k):  # queries sorted first: the binary searches then run in cache
      qo = np.argsort(k)
      pos = np.empty_like(qo)
      pos[qo] = np.minimum(np.searchsorted(sorted_keys, k[qo]), sorted_keys.size - 1)
      return np.where(sorted_keys[pos] == k, order[pos], -1)
    ty = np.asarray(types)
    merged = np.nonzero(((ty == 1) | (ty == 4)) & (lens >= 2))[0]
    splits = lens[merged] - 1
    piece = np.repeat(merged, splits)
    i = np.arange(piece.size) - np.repeat(np.cumsum(splits) - splits, splits) + 1
    lo = starts[piece]
    a, b = lookup(key(lo, lo + i)), lookup(key(lo + i, lo + lens[piece]))
  hit = (a >= 0) & (b >= 0)
  piece, a, b = piece[hit], a[hit], b[hit]
  o = np.lexsort((b, a, -np.asarray(scores, np.float64)[piece]))
  piece, a, b = piece[o], a[o], b[o]
  # each hit checked with a second, independent hash: h2(a + b) = h2(a) + B2^len(a) h2(b)
  base2 = np.uint64(0xD6E8FEB86659FD93)
  with np.errstate(over="ignore"):
    pw2 = np.concatenate([[np.uint64(1)], np.cumprod(np.full(n, base2, np.uint64))])
    s2 = np.concatenate([[np.uint64(0)], np.cumsum((codes + np.uint64(1)) * pw2[:n])])
    def h2(t):  # the piece t's hash, from its start
      return (s2[starts[t] + lens[t]] - s2[starts[t]]) * _inverse_power(pw2, starts[t])
    if not np.array_equal(h2(a) + pw2[lens[a]] * h2(b), h2(piece)):
      raise AssertionError("a 64-bit hash collision among the vocabulary's pieces")
  get = tokens.__getitem__
  return list(zip(map(get, a.tolist()), map(get, b.tolist())))


def _inverse_power(pw: np.ndarray, k: np.ndarray) -> np.ndarray:
  """``B^-k`` modulo 2^64 for the odd base ``B = pw[1]`` of the powers ``pw``."""
  inv = np.uint64(pow(int(pw[1]), -1, 2**64))
  with np.errstate(over="ignore"):
    ipw = np.concatenate([[np.uint64(1)], np.cumprod(np.full(pw.size - 1, inv, np.uint64))])
  return ipw[k]


class Tokenizer:
  """The tokenizer of a GGUF file's metadata (module docstring: which kinds, and how).

  ``encode(text) -> list[int]``: llama.cpp's ids for the text; ``decode(ids) -> str``;
  ``chat(messages) -> str``: the chat template rendered. Attributes: ``bos``, ``eos``
  (ids or ``None``), ``eot`` (the end-of-turn id, or ``None``: ``tokenizer.ggml.eot_token_id``,
  else Gemma's ``<end_of_turn>``; generation stops there too), ``add_bos``, ``kind`` (``"llama"`` or ``"gpt2"``), ``pre``,
  ``vocab_size``, ``chat_template`` (the Jinja2 source, or ``None``)."""

  def __init__(self, tok, *, kind: str, pre: str | None, bos: int | None, eos: int | None,
               add_bos: bool, chat_template: str | None, tokens: Sequence[str],
               eot: int | None = None):
    self._tok, self.kind, self.pre, self.eot = tok, kind, pre, eot
    self.bos, self.eos, self.add_bos = bos, eos, add_bos
    self.chat_template, self.vocab_size = chat_template, len(tokens)
    self._bos_text = tokens[bos] if bos is not None and 0 <= bos < len(tokens) else None
    self._eos_text = tokens[eos] if eos is not None and 0 <= eos < len(tokens) else None

  @classmethod
  def from_gguf(cls, path: str | os.PathLike) -> Tokenizer | None:
    """The tokenizer of the GGUF file ``path`` (:func:`read_metadata`: the header only),
    or ``None`` when the file has none. Raises as :meth:`from_metadata`."""
    return cls.from_metadata(read_metadata(path), os.fspath(path))

  @classmethod
  def from_metadata(cls, meta: dict[str, Any], path: str = "<gguf>") -> Tokenizer | None:
    """The tokenizer of a GGUF file's metadata ``meta`` (``tokenizer.ggml.*``), or ``None``
    when it has no ``tokenizer.ggml.tokens``. Raises :class:`TokenizerError` naming
    ``path`` and the key for a tokenizer model or pre-tokenizer not supported (the
    supported ones in the message) or a missing ``scores``/``merges`` list;
    ``ImportError`` with the install command when ``tokenizers`` is missing."""
    if "tokenizer.ggml.tokens" not in meta:
      return None
    try:
      from tokenizers import Tokenizer as _Tok  # noqa: F401
    except ImportError:
      raise ImportError("the GGUF tokenizer needs tokenizers: pip install tokenizers (or "
                        "pip install 'hxmlir[llama]')") from None
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if kind == "llama":
      tok = _spm(meta, tokens, types, path)
      add_bos_default = True
    elif kind == "gpt2":
      tok = _bpe(meta, tokens, types, path, pre)
      add_bos_default = False
    else:
      raise TokenizerError(f"{path}: tokenizer.ggml.model {kind!r} is not supported "
                           "(supported: 'llama' (SentencePiece), 'gpt2' (byte-level BPE))")
    def tid(key):
      v = meta.get(key)
      return None if v is None or not 0 <= int(v) < len(tokens) else int(v)
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    template = meta.get("tokenizer.chat_template")
    if template is None and "<start_of_turn>" in tokens:
      template = GEMMA_TEMPLATE
    eot = tid("tokenizer.ggml.eot_token_id")
    if eot is None and "<end_of_turn>" in tokens:  # Gemma's turns end there (llama.cpp's EOT)
      eot = tokens.index("<end_of_turn>")
    return cls(tok, kind=kind, pre=pre, bos=tid("tokenizer.ggml.bos_token_id"),
               eos=tid("tokenizer.ggml.eos_token_id"),
               add_bos=bool(add_bos_default if add_bos is None else add_bos),
               chat_template=template, tokens=tokens, eot=eot)

  def encode(self, text: str, *, add_bos: bool | None = None,
             special: bool = True) -> list[int]:
    """Token ids of ``text``: llama.cpp's ``tokenize(text, add_bos, special)``.
    ``add_bos``: put the BOS id in front (default: the file's ``add_bos_token``);
    ``special``: match control tokens written in the text (``<start_of_turn>``). Raises
    ``ValueError`` when ``text`` is not valid Unicode (a lone surrogate, as a command line
    decoded with ``surrogateescape`` may give)."""
    try:
      text.encode("utf-8")
    except UnicodeEncodeError as e:
      raise ValueError(f"the text is not valid UTF-8: {text[e.start:e.end]!r} at character "
                       f"{e.start}") from None
    tok = self._tok
    previous = tok.encode_special_tokens
    tok.encode_special_tokens = not special
    try:
      ids = tok.encode(text, add_special_tokens=False).ids
    finally:
      tok.encode_special_tokens = previous
    if (self.add_bos if add_bos is None else add_bos) and self.bos is not None:
      ids = [self.bos] + ids
    return ids

  def decode(self, ids: Sequence[int]) -> str:
    """The text of token ids ``ids`` (control tokens written out). Raises ``ValueError``
    for an id outside the vocabulary."""
    ids = list(map(int, ids))
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
    return self._tok.decode(ids, skip_special_tokens=False)

  def chat(self, messages: Sequence[dict[str, str]], *,
           add_generation_prompt: bool = True) -> str:
    """The prompt text of ``messages`` (``[{"role": "user", "content": ...}, ...]``) by the
    file's chat template, rendered in ``jinja2``'s sandbox with ``bos_token`` and
    ``eos_token``; a leading BOS text is dropped when :meth:`encode` adds the BOS id (no
    double BOS). Raises ``ValueError`` when the file has no template, and
    :class:`ChatTemplateError` (naming the template and its line) when the template does not
    parse or fails while rendering, its own ``raise_exception`` included."""
    if self.chat_template is None:
      raise ValueError("this GGUF file has no chat template (tokenizer.chat_template): "
                       "write the prompt yourself")
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
      raise jinja2.TemplateError(f"raise_exception({message!r})")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    template = self.chat_template
    if template is GEMMA_TEMPLATE:
      template = "{% set ns = namespace(system='') %}" + template
    try:
      text = env.from_string(template).render(
          messages=list(messages), add_generation_prompt=add_generation_prompt,
          bos_token=self._bos_text or "", eos_token=self._eos_text or "")
    except jinja2.TemplateError as e:
      line = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
      raise ChatTemplateError(f"chat template (tokenizer.chat_template){line}: "
                              f"{type(e).__name__}: {e.message or e}") from None
    if self.add_bos and self._bos_text and text.startswith(self._bos_text):
      text = text[len(self._bos_text):]
    return text


def _added_tokens(tok, tokens: Sequence[str], types: Sequence[int]) -> None:
  """Control tokens (type 3) as special added tokens, user-defined ones (type 4) as
  added tokens always matched, both on the raw text."""
  from tokenizers import AddedToken
  tok.add_tokens([AddedToken(t, special=False, normalized=False)
                  for t, ty in zip(tokens, types) if ty == 4])
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t, ty in zip(tokens, types) if ty == 3])


def _spm(meta: dict[str, Any], tokens: list[str], types: list[int], path: str):
  """The SentencePiece-style tokenizer (``tokenizer.ggml.model == "llama"``)."""
  from tokenizers import Tokenizer as _Tok
  from tokenizers import decoders, models, normalizers
  scores = meta.get("tokenizer.ggml.scores")
  if scores is None:
    raise TokenizerError(f"{path}: tokenizer.ggml.scores is missing (a 'llama' "
                         "tokenizer ranks its merges by them)")
  vocab = dict(zip(tokens, range(len(tokens))))
  unk = meta.get("tokenizer.ggml.unknown_token_id")
  model = models.BPE(vocab, _spm_merges(tokens, scores, types), fuse_unk=True,
                     byte_fallback=True,
                     unk_token=tokens[int(unk)] if unk is not None else None)
  tok = _Tok(model)
  space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
  norm = [normalizers.Replace(" ", "▁")]
  if space_prefix:
    norm.insert(0, normalizers.Prepend("▁"))
  tok.normalizer = normalizers.Sequence(norm)
  dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
  if space_prefix:
    dec.append(decoders.Strip(" ", 1, 0))
  tok.decoder = decoders.Sequence(dec)
  _added_tokens(tok, tokens, types)
  return tok


def _bpe(meta: dict[str, Any], tokens: list[str], types: list[int], path: str,
         pre: str | None):
  """The byte-level BPE tokenizer (``tokenizer.ggml.model == "gpt2"``)."""
  from tokenizers import Regex, decoders, models, pre_tokenizers
  from tokenizers import Tokenizer as _Tok
  if pre not in PRE_TOKENIZERS:
    raise TokenizerError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported "
                         f"(supported: {', '.join(map(repr, PRE_TOKENIZERS))})")
  if "tokenizer.ggml.merges" not in meta:
    raise TokenizerError(f"{path}: tokenizer.ggml.merges is missing (a 'gpt2' tokenizer "
                         "needs its merges)")
  vocab = dict(zip(tokens, range(len(tokens))))
  merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
  tok = _Tok(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False,
                        ignore_merges=pre in IGNORE_MERGES))
  tok.pre_tokenizer = pre_tokenizers.Sequence(
      [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[pre]]
      + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  _added_tokens(tok, tokens, types)
  return tok


def tokenizer_from_metadata(meta: dict[str, Any], path: str = "<gguf>") -> Tokenizer | None:
  """:meth:`Tokenizer.from_metadata` (the name :mod:`hxmlir.models.llama` used)."""
  return Tokenizer.from_metadata(meta, path)
