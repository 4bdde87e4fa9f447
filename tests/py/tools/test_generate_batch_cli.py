"""``hxmlir generate --batch FILE``: one prompt per line, decoded together, each completion the
one ``--prompt`` gives for that line alone; the file's problems and the options the batched
step does not support are one error line naming the file, the line or the option.

The models are gguf_families.py's tiny random-weight files (llama, and gemma3 with its
sliding-window layers; K-quant weights, an untied head so that greedy tokens vary), run
in-process with ``cli.main``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from hxmlir.models import from_gguf, lora
from hxmlir.tools import cli, generate_cli

pytest.importorskip("gguf")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
import gguf_families  # noqa: E402

CTX = "96"  # --chat's template adds ~40 tokens to a prompt
LINES = ["the cat sat on", "", "a dog", "   ", "it is the end of the world and"]
PROMPTS = [t for t in LINES if t.strip()]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("batch_cli")
  out = {}
  for fam in ("llama", "gemma3"):
    out[fam] = str(d / f"{fam}.gguf")
    gguf_families.write(out[fam], fam, qtype="Q4_K_M", tied=False)
  out["prompts"] = d / "prompts.txt"
  out["prompts"].write_text("\n".join(LINES) + "\n", encoding="utf-8")
  return out


def _main(capsys, *argv):
  try:
    rc = cli.main([str(a) for a in argv])
  except SystemExit as e:  # argparse's errors
    rc = e.code
  out, err = capsys.readouterr()
  return rc, out, err


def _alone(capsys, path, prompt, *flags):
  """``hxmlir generate --prompt PROMPT --json``'s object."""
  rc, out, err = _main(capsys, "generate", "--gguf", path, "--prompt", prompt, "--max-context",
                       CTX, "--json", *flags)
  assert rc == 0, err
  return json.loads(out)


@pytest.mark.parametrize("kv_cache", ["f32", "int8"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_batch_prints_each_lines_greedy_completion(files, capsys, family, kv_cache):
  rc, out, err = _main(capsys, "generate", "--gguf", files[family], "--batch", files["prompts"],
                       "--max-tokens", "8", "--max-context", CTX, "--kv-cache", kv_cache)
  assert rc == 0, err
  m = from_gguf(files[family], max_context=int(CTX), kv_cache=kv_cache)
  got = m.generate_batch(PROMPTS, 8)
  assert out == "".join(m.tokenizer.decode(g) + "\n" for g in got)
  assert got == [list(m.generate(p, 8)) for p in PROMPTS]  # (the CLI's --prompt: below)
  n_prompt = sum(len(m.tokenizer.encode(p)) for p in PROMPTS)
  assert err.startswith(f"prompts 3, prompt tokens {n_prompt}, generated "
                        f"{sum(map(len, got))} (stop: "), err
  assert err.endswith(f"KV cache bytes {3 * m.cache_bytes():,} (3 caches)\n"), err


@pytest.mark.parametrize("chat", [False, True])
def test_batch_json_is_a_list_of_the_single_prompt_objects(files, capsys, chat):
  flags = ["--chat"] * chat
  rc, out, err = _main(capsys, "generate", "--gguf", files["llama"], "--batch", files["prompts"],
                       "--max-tokens", "6", "--max-context", CTX, "--json", *flags)
  assert rc == 0 and err == "", err
  objs = json.loads(out)
  assert len(objs) == 3
  total = sum(o["stats"]["generated_tokens"] for o in objs)
  for o, p in zip(objs, PROMPTS, strict=True):
    want = _alone(capsys, files["llama"], p, "--max-tokens", "6", *flags)
    assert o.keys() == want.keys()
    for key in ("model", "prompt", "prompt_ids", "text", "ids", "finish_reason", "sampling"):
      assert o[key] == want[key], key
    s = o["stats"]
    assert (s["prompt_tokens"], s["generated_tokens"]) == (len(want["prompt_ids"]),
                                                           len(want["ids"]))
    assert s["batch_size"] == 3 and s["batch_generated_tokens"] == total
    assert s["batch_tokens_per_second"] == pytest.approx(total / s["batch_seconds"])
    for key in ("weight_bytes", "kv_cache", "kv_cache_bytes_per_token", "max_context"):
      assert s[key] == want["stats"][key], key
    assert s["kv_cache_bytes"] == 3 * want["stats"]["kv_cache_bytes"]
  if chat:
    m = from_gguf(files["llama"], max_context=int(CTX))
    assert [o["prompt"] for o in objs] == [generate_cli.chat_prompt(m.tokenizer, p)
                                           for p in PROMPTS]


def test_batch_stops_every_sequence_when_the_longest_prompts_cache_is_full(files, capsys,
                                                                            tmp_path):
  """The steps are shared: the short prompt stops with the long one, reason max_context."""
  long = " ".join(["the cat sat on the mat"] * 2)
  path = tmp_path / "p.txt"
  path.write_text(f"a dog\n{long}\n", encoding="utf-8")
  m = from_gguf(files["llama"], max_context=40)
  n = len(m.tokenizer.encode(long))
  assert n < 40 - 4
  rc, out, err = _main(capsys, "generate", "--gguf", files["llama"], "--batch", path,
                       "--max-tokens", "30", "--max-context", 40, "--json")
  assert rc == 0, err
  objs = json.loads(out)
  assert [o["ids"] for o in objs] == m.generate_batch(["a dog", long], 30)
  assert [len(o["ids"]) for o in objs] == [40 - n + 1] * 2  # no EOS in this model's ids
  assert [o["finish_reason"] for o in objs] == ["max_context"] * 2


def test_batch_with_lora_adapters(files, capsys, tmp_path):
  m = from_gguf(files["llama"], max_context=int(CTX))
  spec = lora.LoraSpec(rank=2, alpha=16.0, targets=("q", "v"))
  rng = np.random.default_rng(1)
  adapters = [{t: {**ad, "b": rng.normal(0, 0.5, ad["b"].shape).astype(np.float32)}
               for t, ad in layer.items()} for layer in lora.init(m.config, spec)]
  path = tmp_path / "a.safetensors"
  lora.save(path, adapters, spec, cfg=m.config)
  rc, out, err = _main(capsys, "generate", "--gguf", files["llama"], "--batch", files["prompts"],
                       "--lora", path, "--max-tokens", "6", "--max-context", CTX, "--json")
  assert rc == 0, err
  got = [o["ids"] for o in json.loads(out)]
  assert got == [_alone(capsys, files["llama"], p, "--lora", path, "--max-tokens", "6")["ids"]
                 for p in PROMPTS]
  assert got != m.generate_batch(PROMPTS, 6)  # the adapters change the tokens


def test_batch_file_errors_name_the_file_and_line(files, capsys, tmp_path):
  def error(path):
    rc, out, err = _main(capsys, "generate", "--gguf", files["llama"], "--batch", path,
                         "--max-context", CTX)
    assert rc == 1 and out == "", err
    return err
  missing = tmp_path / "none.txt"
  assert error(missing) == (f"hxmlir generate: error: BatchFileError: --batch {missing}: cannot "
                            "read the file (No such file or directory)\n")
  assert error(tmp_path) == (f"hxmlir generate: error: BatchFileError: --batch {tmp_path}: "
                             "cannot read the file (Is a directory)\n")
  for name, data in (("empty.txt", b""), ("blank.txt", b"\n  \n\t\r\n")):
    p = tmp_path / name
    p.write_bytes(data)
    assert error(p) == (f"hxmlir generate: error: BatchFileError: --batch {p}: no prompts (the "
                        "file is empty or its lines are blank); give one prompt per line\n")
  p = tmp_path / "latin1.txt"
  p.write_bytes("the cat\ncaf\u00e9 au lait\n".encode("latin-1"))
  assert error(p) == (f"hxmlir generate: error: BatchFileError: --batch {p}:2: not UTF-8 text "
                      "(byte 0xe9 at column 4); give a text file of prompts, one per line\n")


def test_read_batch_keeps_the_lines_text(tmp_path):
  p = tmp_path / "p.txt"
  p.write_bytes("  indented\r\n\nlast, no newline caf\u00e9".encode())
  assert generate_cli.read_batch(str(p)) == [(1, "  indented"), (3, "last, no newline caf\u00e9")]


def test_batch_usage_errors_name_the_option(files, capsys, tmp_path):
  def usage(*flags):
    rc, out, err = _main(capsys, "generate", "--gguf", files["llama"], *flags)
    assert rc == 2 and out == "", err
    return err
  batch = ["--batch", files["prompts"]]
  # refused before any file is read
  for flags, given in ((["--temperature", "0.7"], "--temperature 0.7"),
                       (["--temperature", "0.7", "--top-k", "5"], "--temperature 0.7 --top-k")):
    assert usage(*batch, *flags) == (
        f"hxmlir generate: error: UsageError: {given}: sampling is not supported with --batch "
        "(its batched step is greedy: the most likely token); drop the sampling options, or "
        "sample each prompt with --prompt\n")
  assert "argument --prompt: not allowed with argument --batch" in usage(*batch, "--prompt", "hi")
  assert "one of the arguments --prompt --batch is required" in usage()
  p = tmp_path / "long.txt"
  long = " ".join(["the cat sat on the mat"] * 10)
  p.write_text(f"a dog\n\n{long}\n", encoding="utf-8")
  m = from_gguf(files["llama"], max_context=40)
  n = len(m.tokenizer.encode(long))
  assert usage("--batch", p, "--max-context", 40, "--max-tokens", "8") == (
      f"hxmlir generate: error: UsageError: --batch {p}:3: the prompt has {n} tokens and "
      f"--max-context is 40 (KV cache positions; {files['llama']} allows up to "
      f"{m.config.context_length}): give --max-context {n + 8} or a shorter prompt\n")
