"""hxmlir-opt driven in-process (HxmlirOpt) and once as the installed console script."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from hxmlir.passes import PASS_REGISTRY, HxPass, PassResult
from hxmlir.tools.opt import HxmlirOpt, main

GOOD = """// a comment line
func.func @main(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 1 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.convert %q : (tensor<4x8xi8>) -> tensor<4x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}
"""

BAD_VERSION = """func.func @f(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.composite "hx.dequantize" %q, %s {decomposition = @deq, version = 5 : i32} : (tensor<4x8xi8>, tensor<4xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @deq(%q: tensor<4x8xi8>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
"""


@dataclass
class Run:
  status: int
  out: str
  err: str


def run(args, stdin: str | bytes = "", tmp_path=None) -> Run:
  raw = stdin.encode() if isinstance(stdin, str) else stdin
  inp = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8")
  out, err = io.StringIO(), io.StringIO()
  status = HxmlirOpt(list(args), stdin=inp, stdout=out, stderr=err).run()
  assert "Traceback" not in err.getvalue()
  return Run(status, out.getvalue(), err.getvalue())


@pytest.fixture
def good(tmp_path):
  p = tmp_path / "good.mlir"
  p.write_text(GOOD)
  return str(p)


def test_file_in_text_out_round_trips(good, tmp_path):
  first = run([good, "-p", "hx-verify"])
  assert first.status == 0 and first.err == ""
  assert 'stablehlo.composite "hx.dequantize" %arg0, %arg1' in first.out
  second = run(["-"], stdin=first.out)
  assert second.status == 0 and second.out == first.out


def test_output_file_and_bytecode(good, tmp_path):
  bc = tmp_path / "m.mlirbc"
  assert run([good, "--emit-bytecode", "-o", str(bc)]).status == 0
  data = bc.read_bytes()
  assert data[:4] == b"ML\xefR"
  back = run([str(bc)])
  assert back.status == 0
  assert back.out == run([good]).out
  from_stdin = run([], stdin=data)
  assert from_stdin.out == back.out
  txt = tmp_path / "out.mlir"
  assert run([good, "-o", str(txt)]).status == 0
  assert txt.read_text() == back.out


def test_split_input_file_keeps_line_numbers(tmp_path):
  p = tmp_path / "split.mlir"
  p.write_text(GOOD + "// -----\n" + BAD_VERSION + "// -----\n" + GOOD)
  r = run([str(p), "--split-input-file", "-p", "hx-verify"])
  assert r.status == 1
  # BAD_VERSION starts on line 13 (GOOD has 11 lines, then the separator).
  assert f"{p}:14:8: error: 'hx.dequantize' version 5 is not accepted" in r.err
  assert r.out.count("// -----\n") == 1  # the two good chunks are printed
  assert r.out.count("func.func @main") == 2


def test_verify_diagnostics(tmp_path):
  p = tmp_path / "diag.mlir"
  p.write_text(BAD_VERSION.replace(
      "  %0 = stablehlo.composite",
      "  // expected-error @+1 {{version 5 is not accepted; this code accepts 1}}\n"
      "  %0 = stablehlo.composite"))
  ok = run([str(p), "--verify-diagnostics", "-p", "hx-verify"])
  assert ok.status == 0 and ok.err == ""
  p.write_text(BAD_VERSION.replace(
      "  %0 = stablehlo.composite",
      "  // expected-error @+1 {{something else}}\n  %0 = stablehlo.composite"))
  bad = run([str(p), "--verify-diagnostics", "-p", "hx-verify"])
  assert bad.status == 1
  assert f"{p}:3:8: error: unexpected error: 'hx.dequantize' version 5" in bad.err
  assert f'{p}:2:6: error: expected error "something else" was not produced' in bad.err


@pytest.mark.parametrize("where, line", [("@-1", 2), ("@above", 2), ("@below", 4), ("", 3)])
def test_expected_locations(tmp_path, where, line):
  from hxmlir.tools.expectations import expectations as _expectations
  text = "a\nb\n// expected-remark " + where + " {{x}}\nc\n"
  (e,) = _expectations("f.mlir", text, 10)
  assert e.line == line + 10 and e.severity == "remark" and e.text == "x"


@pytest.mark.parametrize("kind", ["error", "warning", "remark", "note"])
def test_expected_re_annotations_are_regexes(kind):
  from hxmlir.tools.expectations import expectations as _expectations
  text = f"// expected-{kind}-re @below {{{{version {{{{[0-9]+}}}} is not (accepted)}}}}\nx\n"
  (e,) = _expectations("f.mlir", text, 0)
  assert e.severity == kind and e.line == 2 and e.pattern is not None
  assert e.matches("'hx.q' version 5 is not (accepted); this code accepts 1")
  assert not e.matches("version x is not (accepted)")
  assert not e.matches("version 5 is not accepted")  # outside {{}} the text is literal


def test_verify_diagnostics_with_regexes(tmp_path):
  p = tmp_path / "diag.mlir"
  annotate = lambda line: BAD_VERSION.replace(  # noqa: E731
      "  %0 = stablehlo.composite", f"  {line}\n  %0 = stablehlo.composite")
  p.write_text(annotate("// expected-error-re @+1 {{'hx.{{[a-z]+}}' version {{[0-9]}} is not}}"))
  assert run([str(p), "--verify-diagnostics", "-p", "hx-verify"]).status == 0
  p.write_text(annotate("// expected-error-re @+1 {{version {{[a-z]+}} is not}}"))
  bad = run([str(p), "--verify-diagnostics", "-p", "hx-verify"])
  assert bad.status == 1
  assert f"{p}:3:8: error: unexpected error: 'hx.dequantize' version 5" in bad.err
  assert (f'{p}:2:6: error: expected error matching "version {{{{[a-z]+}}}} is not" was not '
          "produced") in bad.err


@pytest.mark.parametrize("line, message", [
    ("// expected-errors @+1 {{version 5}}", "unknown annotation 'expected-errors'"),
    ("// expected-error-regex @+1 {{version 5}}", "unknown annotation 'expected-error-regex'"),
    ("// expected-fatal {{version 5}}", "unknown annotation 'expected-fatal'"),
    ("// expected-error-re @+1 {{version {{[0-9}}}}", "invalid regex in expected-error-re"),
])
def test_bad_annotations_are_errors(tmp_path, line, message):
  p = tmp_path / "diag.mlir"
  p.write_text(BAD_VERSION.replace("  %0 = stablehlo.composite",
                                   f"  {line}\n  %0 = stablehlo.composite"))
  r = run([str(p), "--verify-diagnostics", "-p", "hx-verify"])
  assert r.status == 1
  assert f"{p}:2:6: error: {message}" in r.err, r.err


def test_print_ir_after_all_and_timing(good):
  r = run([good, "-p", "hx-verify,hx-decompose,cse", "--print-ir-after-all", "--timing"])
  assert r.status == 0
  dumps = [ln for ln in r.err.splitlines() if ln.startswith("// -----// IR Dump After")]
  assert dumps == [f"// -----// IR Dump After {n} //----- //"
                   for n in ("hx-verify", "hx-decompose", "cse")]
  assert "Execution time report" in r.err
  for name in ("(parse)", "hx-verify", "hx-decompose", "cse", "(output)", "Total"):
    assert any(ln.strip().endswith(name) for ln in r.err.splitlines()), name


def test_debuginfo(good):
  r = run([good, "--mlir-print-debuginfo"])
  assert f'loc("{good}":3:8)' in r.out
  assert "loc(" not in run([good]).out


def test_help_goes_to_the_drivers_stdout():
  r = run(["--help"])
  assert r.status == 0 and r.err == ""
  assert r.out.startswith("usage: hxmlir-opt")
  assert "--verify-diagnostics" in r.out and "--pass-pipeline" in r.out


def test_list_passes_and_version():
  r = run(["--list-passes"])
  assert r.status == 0
  for name, getter in PASS_REGISTRY.items():
    assert f"  {name:<18} {getter().summary}" in r.out
  assert "      form-matmul-q=bool (default True)" in r.out
  assert "  canonicalize" in r.out
  v = run(["--version"])
  assert v.status == 0 and v.out.startswith("hxmlir-opt (hxmlir ")


@pytest.mark.parametrize("args, stdin, message", [
    (["--no-such-flag"], "", "hxmlir-opt: error: unrecognized arguments: --no-such-flag"),
    (["/no/such/file.mlir"], "", "could not open input file '/no/such/file.mlir'"),
    (["-p", "hx-verify,bogus-pass"], "", "<pass-pipeline>:1:11: error: unknown pass 'bogus-pass'"),
    (["-p", "hx-fold-scales{x=1}"], "", "<pass-pipeline>:1:16: error: hx-fold-scales: unknown "
     "option 'x'"),
    ([], "func.func @f( {", "<stdin>:1:14: error: expected non-function type"),
    ([], b"\xff\xfe not text", "<stdin>:0:0: error: input is neither UTF-8 MLIR text nor MLIR "
     "bytecode"),
    ([], '"x.y"() : () -> ()', "<stdin>:1:6: error: operation being parsed with an unregistered "
     "dialect"),
    (["--split-input-file", "--emit-bytecode"], GOOD + "// -----\n" + GOOD,
     "--emit-bytecode writes one module"),
])
def test_bad_command_lines_and_inputs(args, stdin, message):
  r = run(args, stdin=stdin)
  assert r.status == 1
  assert message in r.err, r.err
  assert r.out == ""


@pytest.mark.parametrize("flag", ["allow-unregistered-dialect", "split-input-file",
                                  "verify-diagnostics", "mlir-print-debuginfo"])
def test_mlir_opt_single_dash_long_flags(flag, tmp_path):
  p = tmp_path / "u.mlir"
  p.write_text('"x.y"() : () -> ()\n')
  assert run([f"-{flag}", f"--{flag}", "-allow-unregistered-dialect", str(p)]).status == 0
  assert run([str(p), f"-{flag}=oops"]).status == 1


def test_mlir_opt_single_dash_pipeline_bytecode_and_list(good, tmp_path):
  bc = tmp_path / "m.mlirbc"
  assert run([good, "-pass-pipeline=hx-verify,hx-decompose", "-emit-bytecode", "-o",
              str(bc)]).status == 0
  r = run([str(bc)])
  assert r.status == 0 and "func.func @main" in r.out and "hx.dequantize" not in r.out
  assert run(["-pass-pipeline", "hx-decompose", good]).out == r.out
  assert run(["-list-passes"]).out == run(["--list-passes"]).out
  assert run(["--", "-split-input-file"]).err.startswith(
      "hxmlir-opt: error: could not open input file '-split-input-file'")


@pytest.mark.parametrize("where, reason", [
    ("missing/x.mlir", "No such file or directory"), (".", "Is a directory")])
@pytest.mark.parametrize("bytecode", [False, True])
def test_unwritable_output_is_an_error(good, tmp_path, where, reason, bytecode):
  out = str(tmp_path / where)
  r = run([good, "-o", out, *(["--emit-bytecode"] if bytecode else [])])
  assert r.status == 1 and "internal error" not in r.err
  assert r.err == f"hxmlir-opt: error: could not open output file '{out}': {reason}\n"


@pytest.mark.parametrize("args, message", [
    (["-p", "cse", "-p", "canonicalize"], "-p given twice ('cse', then 'canonicalize'); give one "
     "pipeline, its passes separated by ','"),
    (["--pass-pipeline=cse", "-pass-pipeline=cse"], "--pass-pipeline given twice"),
    (["-p", "cse", "--passes", "cse"], "--passes given twice"),
    (["-o", "a", "-o", "b"], "-o given twice ('a', then 'b'); give it once"),
])
def test_repeated_flags_are_errors(good, args, message):
  r = run([good, *args])
  assert r.status == 1
  assert r.err.startswith(f"hxmlir-opt: error: {message}"), r.err


def test_unregistered_dialect_flag():
  r = run(["--allow-unregistered-dialect"], stdin='"x.y"() : () -> ()')
  assert r.status == 0 and '"x.y"() : () -> ()' in r.out


def test_internal_errors_are_one_line(monkeypatch, good):
  @dataclass(frozen=True)
  class Crash(HxPass):
    name: ClassVar[str] = "test-crash"

    def apply(self, module, diags):
      raise RuntimeError("boom")

  monkeypatch.setitem(PASS_REGISTRY, "test-crash", lambda: Crash)
  monkeypatch.delenv("HXMLIR_OPT_TRACEBACK", raising=False)
  r = run([good, "-p", "test-crash"])
  assert r.status == 1
  assert r.err == "hxmlir-opt: internal error: RuntimeError: boom\n"


def test_main_exits_with_status(good, capsys):
  with pytest.raises(SystemExit) as e:
    main([good, "-p", "hx-nothing"])
  assert e.value.code == 1
  assert "unknown pass 'hx-nothing'" in capsys.readouterr().err
  with pytest.raises(SystemExit) as e:
    main(["--help"])
  assert e.value.code == 0


def test_console_script_is_installed(good):
  exe = os.path.join(os.path.dirname(sys.executable), "hxmlir-opt")
  r = subprocess.run([exe, good, "-p", "hx-verify,hx-decompose"], capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert "stablehlo.composite" not in r.stdout
  bad = subprocess.run([exe, "-p", "nope"], input="", capture_output=True, text=True,
                       timeout=120)
  assert bad.returncode == 1 and "Traceback" not in bad.stderr
  assert bad.stderr.startswith("<pass-pipeline>:1:1: error: unknown pass 'nope'")


# --- corrupted bytecode: a diagnostic and status 1, never a signal -----------------

@pytest.fixture
def bytecode(good, tmp_path):
  bc = tmp_path / "m.mlirbc"
  assert run([good, "--emit-bytecode", "-o", str(bc)]).status == 0
  return bc.read_bytes()


def _corrupt(tmp_path, data: bytes, name: str, xors=(), sets=()) -> str:
  """Writes ``data`` with ``d[pos] ^= mask`` for ``xors`` and ``d[pos] = v`` for ``sets``."""
  d = bytearray(data)
  for pos, mask in xors:
    d[pos] ^= mask
  for pos, value in sets:
    d[pos] = value
  p = tmp_path / name
  p.write_bytes(bytes(d))
  return str(p)


def test_bytecode_with_non_utf8_strings_is_an_error(bytecode, tmp_path):
  strings_at = bytecode.index(b"hx.dequantize")
  cases = {  # the tester's case: a non-UTF-8 producer plus a later parse error
      "producer.mlirbc": ([(len(bytecode) - 9, 0xFF)], [(5, 0xCC)],
                          "the producer string is not valid UTF-8 (byte 5 of the file)"),
      "strings.mlirbc": ([], [(strings_at + 3, 0xCC)],
                         "the string section holds text that is not valid UTF-8"),
      "version.mlirbc": ([], [(4, 0)], "ends inside the version number"),
  }
  for name, (xors, sets, message) in cases.items():
    data = bytecode[:5] if name == "version.mlirbc" else bytecode
    path = _corrupt(tmp_path, data, name, xors, sets)
    r = run([path])
    assert r.status == 1 and r.out == ""
    assert r.err.startswith(f"{path}:0:0: error: corrupted MLIR bytecode: "), r.err
    assert message in r.err, r.err


def test_bytecode_errors_name_the_file(bytecode, tmp_path):
  path = _corrupt(tmp_path, bytecode, "bad.mlirbc", [(len(bytecode) - 9, 0xFF)])
  r = run([path])
  assert r.status == 1 and "-:0:0" not in r.err
  assert r.err.startswith(f"{path}:0:0: error: "), r.err


def test_corrupted_bytecode_corpus_never_kills_the_process(bytecode, tmp_path):
  """Random bit flips (fixed seed), each run as the console script: a diagnostic, status 1."""
  rng = random.Random(1234)
  exe = os.path.join(os.path.dirname(sys.executable), "hxmlir-opt")
  procs = []
  for i in range(12):
    xors = [(rng.randrange(4, len(bytecode)), 1 << rng.randrange(8))
            for _ in range(rng.randint(1, 3))]
    sets = [(rng.randrange(5, 12), 0xCC)] if i % 3 == 0 else []  # a non-UTF-8 producer too
    path = _corrupt(tmp_path, bytecode, f"x{i}.mlirbc", xors, sets)
    procs.append((path, subprocess.Popen([exe, path], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)))
  for path, proc in procs:
    err = proc.communicate(timeout=300)[1].decode("utf-8", "replace")
    assert proc.returncode in (0, 1), (path, proc.returncode, err)
    assert "Traceback" not in err and "terminate called" not in err, err
    if proc.returncode == 1:
      assert err.startswith(f"{path}:0:0: error: "), err


# --- foreign IR: what nobody here wrote ------------------------------------------------

def test_declarations_and_type_aliases(tmp_path):
  decl = run(["-p", "hx-verify,hx-decompose,hx-fold-scales"],
             stdin="func.func private @ext(tensor<f32>) -> tensor<f32>\n")
  assert decl.status == 0 and decl.err == ""
  assert "func.func private @ext(tensor<f32>) -> tensor<f32>" in decl.out
  p = tmp_path / "alias.mlir"
  p.write_text("!t = tensor<4xf32>\n#a = 1 : i32\nfunc.func @f(%x: !t) -> !t {\n"
               "  return %x : !t\n}\nfunc.func @g(%x: !t) -> !t {\n  return %y : !t\n}\n")
  r = run([str(p), "-p", "hx-verify"])
  assert r.status == 1  # the error is where it is (line 7), not at the wrapper
  assert r.err.startswith(f"{p}:7:10: error: use of undeclared SSA value name"), r.err
  p.write_text(p.read_text().replace("%y", "%x"))
  r = run([str(p), "-p", "hx-verify"])
  assert r.status == 0 and r.out.count("func.func @") == 2


def test_verify_diagnostics_ignores_the_current_operation_note(tmp_path):
  p = tmp_path / "v.mlir"
  p.write_text("func.func @f(%a: tensor<2xf32>) -> tensor<3xf32> {\n"
               "  // expected-error @+1 {{op requires the same shape for all operands and results}}\n"
               "  %0 = \"stablehlo.add\"(%a, %a) : (tensor<2xf32>, tensor<2xf32>) -> tensor<3xf32>\n"
               "  return %0 : tensor<3xf32>\n}\n")
  r = run([str(p), "--verify-diagnostics"])
  assert r.status == 0 and r.err == "", r.err
  plain = run([str(p)])  # without verify mode the note is printed, as mlir-opt does
  assert plain.status == 1 and "note: see current operation" in plain.err


def test_an_internal_error_fails_only_its_chunk(monkeypatch, good, tmp_path):
  @dataclass(frozen=True)
  class CrashOnF(HxPass):
    name: ClassVar[str] = "test-crash-on-f"

    def apply(self, module, diags):
      if "@f(" in str(module):
        raise RuntimeError("boom")
      return PassResult()

  monkeypatch.setitem(PASS_REGISTRY, CrashOnF.name, lambda: CrashOnF)
  p = tmp_path / "s.mlir"
  p.write_text(GOOD + "// -----\n" + BAD_VERSION + "// -----\n" + GOOD)
  r = run([str(p), "--split-input-file", "-p", "test-crash-on-f"])
  assert r.status == 1
  assert r.err == f"hxmlir-opt: internal error (in the chunk at {p}:13): RuntimeError: boom\n"
  assert r.out.count("func.func @main") == 2  # the other chunks are printed


CRASHERS = {  # inputs that kill jaxlib 0.10.2's parser with a signal
    "SIGSEGV": "func.func @f(%x: tensor<?x!foo.bar, #stablehlo.bounds<4>>) {\n  return\n}\n",
    "SIGFPE": ("func.func @f(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {\n"
               '  %0 = "stablehlo.all_to_all"(%x) {split_dimension = 1 : i64, concat_dimension = '
               "0 : i64, split_count = 2 : i64, replica_groups = dense<0> : tensor<0x2xi64>} : "
               "(tensor<8x8xf32>) -> tensor<8x8xf32>\n  return %0 : tensor<8x8xf32>\n}\n"),
}


@pytest.mark.parametrize("signal", sorted(CRASHERS))
def test_inputs_that_crash_the_parser_are_a_diagnostic(signal, tmp_path, good):
  p = tmp_path / "c.mlir"
  p.write_text(GOOD + "// -----\n" + CRASHERS[signal])
  r = run([str(p), "--split-input-file", "-p", "hx-verify"])  # in this very process
  assert r.status == 1
  assert r.err == (f"{p}:13:1: error: cannot parse this input: MLIR's parser crashed on it "
                   f"(signal {signal})\n")
  assert r.out.count("func.func @main") == 1


def _exported_hx_module() -> str:
  import jax
  import jax.numpy as jnp

  import hxmlir as hx
  w = hx.quantize(jnp.linspace(-1, 1, 12, dtype=jnp.float32).reshape(3, 4))
  with hx.installed():
    exp = jax.export.export(jax.jit(lambda x: hx.matmul_q(x, w)))(jnp.ones((2, 3)))
  return exp.mlir_module_serialized


def test_hxmlir_export_module_as_the_docs_say(tmp_path):
  # the docs named exp.mlir_module_serialized, which hxmlir.export.Exported has not
  import jax.numpy as jnp

  import hxmlir as hx
  from hxmlir import export as hxe
  page = " ".join((Path(__file__).parents[3] / "docs" / "passes.md").read_text().split())
  assert "`exp.lo.mlir_module_serialized` of an `hxmlir.export.Exported`" in page
  w = hx.quantize(jnp.linspace(-1, 1, 12, dtype=jnp.float32).reshape(3, 4))
  exp = hxe.export(lambda x: hx.matmul_q(x, w), platforms=["cpu"])(jnp.ones((2, 3)))
  art = tmp_path / "e.mlirbc"
  art.write_bytes(bytes(exp.lo.mlir_module_serialized))
  r = run([str(art)])
  assert r.status == 0 and "vhlo." not in r.out
  assert 'stablehlo.composite "hx.matmul_q"' in r.out


def test_vhlo_input_is_upgraded_to_stablehlo(tmp_path):
  art = tmp_path / "a.mlirbc"
  art.write_bytes(_exported_hx_module())  # a portable artifact: VHLO bytecode
  vhlo = run([str(art)])
  assert vhlo.status == 0 and "vhlo." not in vhlo.out
  assert 'stablehlo.composite "hx.matmul_q"' in vhlo.out
  text = tmp_path / "a.mlir"  # the same module as VHLO text
  from hxmlir.passes import parsing
  ctx = parsing.make_context()
  text.write_text(parsing.parse_module(art.read_bytes(), ctx).get_asm())
  assert "vhlo.func_v1" in text.read_text()
  r = run([str(text), "-p", "hx-verify,hx-decompose"])
  assert r.status == 0 and "vhlo." not in r.out and "hx.matmul_q" not in r.out
  assert "stablehlo.dot_general" in r.out or "stablehlo.while" in r.out


WHILE_DYNAMIC = """func.func @f(%x: tensor<2xf32>) -> tensor<?xf32> {
  %0 = "stablehlo.while"(%x) ({
  ^bb0(%a: tensor<?xf32>):
    %c = stablehlo.constant dense<false> : tensor<i1>
    stablehlo.return %c : tensor<i1>
  }, {
  ^bb0(%a: tensor<?xf32>):
    stablehlo.return %a : tensor<?xf32>
  }) : (tensor<2xf32>) -> tensor<?xf32>
  return %0 : tensor<?xf32>
}
"""


def test_print_op_generic_round_trips_where_the_pretty_form_does_not():
  generic = run(["--mlir-print-op-generic"], stdin=WHILE_DYNAMIC)
  assert generic.status == 0 and '"stablehlo.while"' in generic.out
  assert '"func.func"()' in generic.out
  again = run(["--mlir-print-op-generic"], stdin=generic.out)
  assert again.status == 0 and again.out == generic.out
  pretty = run([], stdin=WHILE_DYNAMIC)
  assert run([], stdin=pretty.out).status == 1  # jaxlib's pretty form loses the block types


def test_parse_guard_in_a_process_running_jax_uses_the_parse_server(monkeypatch):
  # (the lit test foreign-ir.mlir covers the forked child of the command-line tool)
  from hxmlir.passes import parsing
  monkeypatch.setattr(parsing._jax, "runtime_started", lambda: True)
  ctx = parsing.make_context()
  got = parsing.parse_crashes([GOOD, CRASHERS["SIGFPE"], GOOD, CRASHERS["SIGSEGV"], "x"], ctx)
  assert got == [None, "MLIR's parser crashed on it (signal SIGFPE)", None,
                 "MLIR's parser crashed on it (signal SIGSEGV)", None]
