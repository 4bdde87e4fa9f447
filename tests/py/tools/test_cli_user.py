"""``hxmlir lower/export MODULE:FUNCTION --arg TYPE``, ``run`` with pytree arguments and
Tup/r1 results, and ``inspect``, on a small user module: in-process (``cli.main``) and as
subprocesses (the installed ``hxmlir`` script)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import hx_testing
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hxmlir as hx
from hxmlir.lowering import schema
from hxmlir.tools import cli, npzio
from hxmlir.types import typestr

USER_MODULE = textwrap.dedent('''\
    import jax.numpy as jnp
    import hxmlir as hx

    def layer(x, w, *, act="relu"):
      y = hx.matmul_q(x, w)
      return jnp.maximum(y, 0) if act == "relu" else y

    def block(x, params):
      return jnp.tanh(hx.matmul_q(x, params["w"]) + params["b"])

    def swap(t):
      return hx.make_tup(hx.get_tuple_element(t, 1), hx.get_tuple_element(t, 0) * 2)

    def outer(c, r):
      return hx.outer(c, r), c.sum()

    def first(xs):
      return xs[0] + xs[1]
    ''')


@pytest.fixture(scope="module")
def user(tmp_path_factory):
  d = tmp_path_factory.mktemp("user")
  (d / "mylayer.py").write_text(USER_MODULE)
  return d


def _run(capsys, *argv) -> tuple[int, str, str]:
  rc = cli.main([str(a) for a in argv])
  out = capsys.readouterr()
  return rc, out.out, out.err


def _bound(x, w) -> np.ndarray:
  """An f32 error bound of ``x @ w`` summed over k terms (inputs exact): k eps |x| @ |w|."""
  k = x.shape[-1]
  return 2 * k * np.finfo(np.float32).eps * (np.abs(x).astype(np.float64) @ np.abs(w))


def _deq(qv, s):
  return qv.astype(np.float64) * s.astype(np.float64)[..., None]


# --- lower ---------------------------------------------------------------------------------

def test_lower_a_py_file_function(user, capsys):
  rc, out, err = _run(capsys, "lower", user / "mylayer.py:layer", "--arg", "f32[2,6]",
                      "--arg", "q8[6,5]")
  assert rc == 0, err
  assert out.startswith("module @jit_layer")
  assert re.search(r"func.func public @main\(%arg0: tensor<2x6xf32>, %arg1: tensor<6x5xi8>, "
                   r"%arg2: tensor<6xf32>\) -> \(tensor<2x5xf32>", out), out
  assert re.search(r'stablehlo.composite "hx.matmul_q" %arg0, %arg1, %arg2 .*version = 3', out)
  assert "stablehlo.maximum" in out


def test_lower_an_importable_module_with_a_static_argument(user, capsys, monkeypatch):
  monkeypatch.chdir(user)  # MODULE is looked up in the current directory first
  rc, out, err = _run(capsys, "lower", "mylayer:layer", "--arg", "f32[2,6]", "--arg", "q8[6,5]",
                      "--static", "act='none'", "--no-passes")
  assert rc == 0, err
  assert "hx.matmul_q" in out and "stablehlo.maximum" not in out


def test_lower_a_function_taking_a_dict(user, capsys):
  rc, out, err = _run(capsys, "lower", f"{user}/mylayer.py:block", "--arg", "f32[2,4]",
                      "--arg", "{w: q8[4,3], b: f32[3]}")
  assert rc == 0, err
  # dict entries in sorted key order, as JAX flattens them: b, then w's two components
  assert re.search(r"@main\(%arg0: tensor<2x4xf32>, %arg1: tensor<3xf32>, "
                   r"%arg2: tensor<4x3xi8>, %arg3: tensor<4xf32>\)", out), out
  assert 'stablehlo.composite "hx.matmul_q" %arg0, %arg2, %arg3' in out


def test_lower_with_arguments_from_a_json_file(user, capsys, tmp_path):
  (tmp_path / "args.json").write_text(json.dumps(["f32[2,4]", {"w": "q8[4,3]", "b": "f32[3]"}]))
  rc, out, err = _run(capsys, "lower", f"{user}/mylayer.py:block", "--args-json",
                      tmp_path / "args.json")
  assert rc == 0, err
  assert "%arg2: tensor<4x3xi8>, %arg3: tensor<4xf32>" in out


def test_lower_a_sharded_argument(user, capsys):
  rc, out, err = _run(capsys, "lower", f"{user}/mylayer.py:layer", "--mesh", "i=4,j=2",
                      "--arg", "f32[8@i,6]", "--arg", "q8[6,4@j]")
  assert rc == 0, err
  assert 'sdy.mesh @mesh = <["i"=4, "j"=2]>' in out
  assert re.search(r'%arg0: tensor<8x6xf32> \{sdy.sharding = #sdy.sharding<@mesh, '
                   r'\[\{"i"\}, \{\}\]>\}', out), out
  assert re.search(r'%arg1: tensor<6x4xi8> \{sdy.sharding = #sdy.sharding<@mesh, '
                   r'\[\{\}, \{"j"\}\]>\}', out), out
  # the result: rows like x, columns like the weight
  assert re.search(r'"hx.matmul_q".*sdy.sharding_per_value<\[<@mesh, \[\{"i"\}, \{"j"\}\]>\]>',
                   out), out


def test_lower_a_sharded_tuple(user, capsys):
  rc, out, err = _run(capsys, "lower", f"{user}/mylayer.py:swap", "--mesh", "i=4",
                      "--arg", "Tup{f32[8@i],q8[4@i,3]}")
  assert rc == 0, err
  assert re.search(r'@main\(%arg0: tensor<8xf32> \{sdy.sharding = #sdy.sharding<@mesh, '
                   r'\[\{"i"\}\]>\}, %arg1: tensor<4x3xi8> \{sdy.sharding = '
                   r'#sdy.sharding<@mesh, \[\{"i"\}, \{\}\]>\}, %arg2: tensor<4xf32> '
                   r'\{sdy.sharding = #sdy.sharding<@mesh, \[\{"i"\}\]>\}\)', out), out


@pytest.mark.parametrize("fn, args, want", [
    ("swap", ["Tup{f32[3],q8[2,4]}"], r"@main\(%arg0: tensor<3xf32>, %arg1: tensor<2x4xi8>, "
                                      r"%arg2: tensor<2xf32>\)"),
    ("outer", ["f32[6]", "f32[5]"], r'stablehlo.composite "hx.outer"'),
    ("first", ["[f32[2], f32[2]]"], r"@main\(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>\)"),
])
def test_lower_every_hi_type(user, capsys, fn, args, want):
  argv = [x for a in args for x in ("--arg", a)]
  rc, out, err = _run(capsys, "lower", f"{user}/mylayer.py:{fn}", *argv, "--no-passes")
  assert rc == 0, err
  assert re.search(want, out), out


@pytest.mark.parametrize("fmt", sorted(typestr.HI_TYPES))
def test_lower_every_format(user, capsys, tmp_path, fmt):
  """Each hi array type of the TYPE table (each quantized format) lowers as an argument."""
  (tmp_path / "ident.py").write_text("def ident(w):\n  return w\n")
  n = hx_testing.block_of(fmt) or 6
  rc, out, err = _run(capsys, "lower", f"{tmp_path}/ident.py:ident", "--arg", f"{fmt}[4,{n}]",
                      "--no-passes")
  assert rc == 0, err
  los = typestr.parse_type(f"{fmt}[4,{n}]").lo_ty()
  sig = ", ".join(f"%arg{i}: tensor<{'x'.join(map(str, a.shape))}x"
                  f"{schema.TensorType.of(a).dtype}>" for i, a in enumerate(los))
  assert f"@main({sig})" in out, out


def test_lower_for_other_platforms(user, capsys):
  rc, out, err = _run(capsys, "lower", f"{user}/mylayer.py:layer", "--arg", "f32[2,6]",
                      "--arg", "q8[6,5]", "--platforms", "cpu,tpu")
  assert rc == 0, err
  assert "stablehlo.case" in out or "platform_index" in out, out


@pytest.mark.parametrize("argv, message", [
    (["--arg", "f32[2,x]"], "TypeStrError: --arg 1 'f32[2,x]': column 7: expected a dimension "
                            "size (an integer), got 'x'"),
    (["--arg", "f32[2,6]", "--arg", "q9[6,5]"], "TypeStrError: --arg 2 'q9[6,5]': column 1: "
                                                "expected a type"),
    (["--arg", "f32[8@i,6]"], "column 7: expected an unsharded dimension: a sharded dimension "
                              "needs a mesh (--mesh i=N)"),
    (["--mesh", "i=four", "--arg", "f32[2]"], "TypeStrError: mesh 'i=four': entry 'i=four'"),
    (["--arg", "f32[2,6]", "--arg", "q8[7,5]"], "TypeError: hx.matmul_q"),
    (["--naive"], "UsageError: --naive goes with --model"),
    (["--model", "builtin"], "UsageError: give either MODULE:FUNCTION"),
    (["--static", "3=x"], "UsageError: --static '3=x': expected NAME=VALUE"),
])
def test_lower_errors_are_one_line(user, capsys, argv, message):
  rc, out, err = _run(capsys, "lower", f"{user}/mylayer.py:layer", *argv)
  assert rc == (2 if "UsageError" in message else 1) and out == ""
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("hxmlir lower: error: "), err
  assert message in lines[0], lines[0]


@pytest.mark.parametrize("target, message", [
    ("mylayer.py", "expected MODULE:FUNCTION"),
    ("nowhere.py:f", "ImportError: nowhere.py: no such file"),
    ("nowhere/x:f", "ImportError: nowhere/x: no such file"),
    # a directory is said to be one ("/tmp:dense" said "no such file")
    ("{d}:dense", "IsADirectoryError: {d}: is a directory; give a .py file in it "
                  "({d}/FILE.py:dense) or an importable module (MODULE:dense)"),
    ("{d}/:dense", "IsADirectoryError: {d}/: is a directory; give a .py file in it "
                   "({d}/FILE.py:dense)"),
    ("no_such_module_xyz:f", "ImportError: cannot import module 'no_such_module_xyz'"),
    ("{d}/mylayer.py:nope", "AttributeError: module '{d}/mylayer.py' has no function 'nope'; "
                            "it defines: block, first, layer, outer, swap"),
])
def test_bad_function_names(user, capsys, target, message):
  rc, _, err = _run(capsys, "lower", target.format(d=user), "--arg", "f32[2]")
  assert rc == (2 if "MODULE:FUNCTION" in message else 1)  # a usage error, or a bad file
  assert message.format(d=user) in err, err


def test_inputs_out_with_a_function_says_what_works(user, capsys, tmp_path):
  # `hxmlir run` suggested `hxmlir export --inputs-out`, which export refuses for a function
  rc, _, err = _run(capsys, "export", f"{user}/mylayer.py:layer", "--arg", "f32[2,6]", "--arg",
                    "q8[6,5]", "-o", tmp_path / "l.hxa", "--inputs-out", tmp_path / "in")
  assert rc == 2 and ("UsageError: --inputs-out goes with --model (a built-in model's example "
                      "inputs), not with a MODULE:FUNCTION: write your function's inputs with "
                      "numpy.savez, keyed as `hxmlir inspect ARTIFACT` lists") in err, err
  assert not (tmp_path / "l.hxa").exists()


def test_model_options_are_refused_with_a_function(user, capsys):
  rc, _, err = _run(capsys, "export", "--model", "builtin", "--arg", "f32[2]", "-o", "x.hxa")
  assert rc == 2 and "UsageError: --arg go with MODULE:FUNCTION, not with --model" in err


# --- export, run, inspect --------------------------------------------------------------------

@pytest.fixture(scope="module")
def block_files(user):
  """``block`` exported for cpu,cuda,tpu, and inputs keyed as hxmlir.tools.npzio documents."""
  art = user / "block.hxa"
  assert cli.main(["export", f"{user}/mylayer.py:block", "--arg", "f32[2,4]",
                   "--arg", "{w: q8[4,3], b: f32[3]}", "-o", str(art)]) == 0
  rng = np.random.default_rng(1)
  arrays = {"a0": rng.standard_normal((2, 4)).astype(np.float32),
            "a1['b']": rng.standard_normal(3).astype(np.float32),
            "a1['w'].qvalue": rng.integers(-127, 128, (4, 3)).astype(np.int8),
            "a1['w'].scale": rng.uniform(0.001, 0.02, 4).astype(np.float32)}
  np.savez(user / "block_in.npz", **arrays)
  return art, user / "block_in.npz", arrays


def test_export_and_run_a_function_taking_a_dict(block_files, capsys, tmp_path):
  art, inp, a = block_files
  rc, out, err = _run(capsys, "run", art, "--inputs", inp, "--output", tmp_path / "out")
  assert rc == 0, err
  assert out == "" and err.startswith(f"ran {art} on 3 arguments: float32[2,3]")
  with np.load(tmp_path / "out.npz") as z:
    y = z["a0"]
  w = _deq(a["a1['w'].qvalue"], a["a1['w'].scale"])
  pre = a["a0"].astype(np.float64) @ w + a["a1['b']"]
  # tanh is 1-Lipschitz: the matmul's bound plus the add's and tanh's rounding
  tol = _bound(a["a0"], w) + 4 * np.finfo(np.float32).eps * (np.abs(pre) + 1)
  assert np.all(np.abs(y - np.tanh(pre)) <= tol), (y, np.tanh(pre))


@pytest.mark.parametrize("target, args, count", [
    ("block", ["f32[2,4]", "{w: q8[4,3], b: f32[3]}"], "3 arguments"),  # a dict: its 2 values
    ("swap", ["Tup{f32[3],q8[2,4]}"], "1 argument"),                    # a Tup is one value
    ("first", ["[f32[2], f32[2]]"], "2 arguments"),
])
def test_export_run_and_errors_count_arguments_alike(user, capsys, tmp_path, target, args,
                                                     count):
  # export counted positional arguments ("2 arguments" for x and a dict) while run and its
  # errors counted the signature's values ("3 arguments"), and "1 arguments"
  art = tmp_path / f"{target}.hxa"
  argv = [a for t in args for a in ("--arg", t)]
  rc, out, err = _run(capsys, "export", f"{user}/mylayer.py:{target}", *argv, "--platforms",
                      "cpu", "-o", art)
  assert rc == 0, err
  assert out == "" and err.endswith(f"platforms cpu, {count}\n"), err
  rc, out, _ = _run(capsys, "inspect", art, "--json")
  assert len(json.loads(out)["inputs"]) == int(count.split()[0]), out
  np.savez(tmp_path / "extra.npz", zz=np.ones(1))
  rc, _, err = _run(capsys, "run", art, "--inputs", tmp_path / "extra.npz")
  assert rc == 1 and f"{target} takes {count} (" in err, err


def test_run_names_a_pytree_argument_that_does_not_match(block_files, capsys, tmp_path):
  art, _, a = block_files
  bad = dict(a)
  del bad["a1['w'].scale"]
  np.savez(tmp_path / "bad.npz", **bad)
  rc, _, err = _run(capsys, "run", art, "--inputs", tmp_path / "bad.npz")
  assert rc == 1
  assert ("argument 1['w'] (q8[4,3]) is missing: no array \"a1['w'].scale\"; block takes 3 "
          "arguments (f32[2,4], f32[3], q8[4,3]) -> (f32[2,3]), named a0, a1['b'], "
          "a1['w'].qvalue, a1['w'].scale") in err, err


def test_inspect(block_files, capsys):
  art, _, _ = block_files
  rc, out, err = _run(capsys, "inspect", art)
  assert rc == 0, err
  assert out.splitlines()[0] == f"{art}: block (f32[2,4], f32[3], q8[4,3]) -> (f32[2,3])"
  assert "  platforms: cpu, cuda, tpu" in out
  assert "    a1['w']: q8[4,3]  (npz: a1['w'].qvalue, a1['w'].scale)" in out
  assert re.search(r"  hx ops: hx\.matmul_q v3 x\d+", out), out
  assert "tpu_custom_call x1 [hx_matmul_q_v1]" in out
  assert "__gpu$xla.gpu.triton x1 [hx_matmul_q_v1]" in out
  assert "versions: artifact format 2, written by hxmlir " in out
  assert f"size: {art.stat().st_size} bytes" in out
  rc, out, _ = _run(capsys, "inspect", art, "--json")
  info = json.loads(out)
  assert info["platforms"] == ["cpu", "cuda", "tpu"]
  assert info["versions"]["type_schemas"] == {"array": 1, "q8": 1}
  assert info["size"]["artifact_bytes"] == art.stat().st_size
  assert [k["registered"] for c in info["custom_calls"] for k in c["kernels"]] == [True, True]
  assert [e["npz_keys"] for e in info["inputs"]] == [["a0"], ["a1['b']"],
                                                     ["a1['w'].qvalue", "a1['w'].scale"]]


@pytest.mark.parametrize("content", [b"", b"not an artifact at all, just text\n"])
def test_inspect_a_corrupt_file(capsys, tmp_path, content):
  (tmp_path / "x.hxa").write_bytes(content)
  rc, out, err = _run(capsys, "inspect", tmp_path / "x.hxa")
  assert rc == 1 and out == ""
  assert err.startswith(f"hxmlir inspect: error: ArtifactError: {tmp_path / 'x.hxa'}: ")
  assert len(err.strip().splitlines()) == 1


def test_inspect_a_flipped_byte(block_files, capsys, tmp_path):
  blob = bytearray(block_files[0].read_bytes())
  blob[len(blob) // 2] ^= 0x40
  (tmp_path / "f.hxa").write_bytes(bytes(blob))
  rc, _, err = _run(capsys, "inspect", tmp_path / "f.hxa")
  assert rc == 1 and "ArtifactError" in err and "corrupted" in err


# --- Tup and r1 results: components under documented keys -------------------------

def test_run_writes_tup_results_as_components(user, capsys, tmp_path):
  art = tmp_path / "swap.hxa"
  assert _run(capsys, "export", f"{user}/mylayer.py:swap", "--arg", "Tup{f32[3],q8[2,4]}",
              "--platforms", "cpu", "-o", art)[0] == 0
  ins = {"a0.0": np.array([1.5, -2.0, 3.25], np.float32),
         "a0.1.qvalue": np.arange(8, dtype=np.int8).reshape(2, 4),
         "a0.1.scale": np.array([0.5, 2.0], np.float32)}
  np.savez(tmp_path / "in.npz", **ins)
  rc, out, err = _run(capsys, "run", art, "--inputs", tmp_path / "in.npz", "--output",
                      tmp_path / "out.npz")
  assert rc == 0, err
  assert out == "" and "Tup{q8[2,4],f32[3]}" in err
  with np.load(tmp_path / "out.npz", allow_pickle=False) as z:  # plain arrays: no pickles
    got = {k: z[k] for k in z.files}
  assert sorted(got) == ["a0.0.qvalue", "a0.0.scale", "a0.1"]
  np.testing.assert_array_equal(got["a0.0.qvalue"], ins["a0.1.qvalue"])
  np.testing.assert_array_equal(got["a0.0.scale"], ins["a0.1.scale"])
  np.testing.assert_array_equal(got["a0.1"], ins["a0.0"] * 2)  # exact: times 2


def test_run_writes_r1_results_as_factors(user, capsys, tmp_path):
  art = tmp_path / "outer.hxa"
  assert _run(capsys, "export", f"{user}/mylayer.py:outer", "--arg", "f32[3]", "--arg", "f32[2]",
              "--platforms", "cpu", "-o", art)[0] == 0
  c, r = np.array([1.0, 2.0, 4.0], np.float32), np.array([0.5, -1.0], np.float32)
  np.savez(tmp_path / "in.npz", a0=c, a1=r)
  assert _run(capsys, "run", art, "--inputs", tmp_path / "in.npz", "--output",
              tmp_path / "out.npz")[0] == 0
  with np.load(tmp_path / "out.npz", allow_pickle=False) as z:
    assert sorted(z.files) == ["a0.col", "a0.row", "a1"]
    np.testing.assert_array_equal(z["a0.col"], c)
    np.testing.assert_array_equal(z["a0.row"], r)
    assert z["a1"] == np.float32(7.0)  # 1 + 2 + 4, exact in f32


def test_npz_keys_round_trip_every_hi_type():
  tup = hx.make_tup(jnp.arange(3.0), hx.quantize(jnp.ones((2, 4))))
  r1 = hx.outer(jnp.ones(3), jnp.arange(2.0))
  vals = [jnp.ones(2), hx.quantize(jnp.ones((2, 3))), r1, tup]
  tys = [jax.typeof(v) for v in vals]
  arrays = npzio.flatten_values(vals)
  assert sorted(arrays) == ["a0", "a1.qvalue", "a1.scale", "a2.col", "a2.row", "a3.0",
                            "a3.1.qvalue", "a3.1.scale"]
  for i, ty in enumerate(tys):
    keys = [f"a{i}{s}" for s in npzio.component_keys(ty)]
    back = npzio.from_arrays(ty, [arrays[k] for k in keys])
    assert jax.typeof(back) == ty
    again = npzio.to_arrays([f"a{i}"], [ty], [back])
    for k in keys:
      np.testing.assert_array_equal(again[k], arrays[k])


def test_tree_paths_and_leaves():
  tree = {"tuple": [{"tuple": ["*", {"dict": [["b", "*"], ["w", {"list": ["*", None]}]]}]},
                    {"dict": [["k", "*"]]}]}
  assert npzio.leaf_paths(tree) == ["a0", "a1['b']", "a1['w'][0]", "kw['k']"]
  args = npzio.build_tree(tree, [1, 2, 3, 4])
  assert args == ((1, {"b": 2, "w": [3, None]}), {"k": 4})
  out_tree = {"tuple": ["*", {"dict": [["x", "*"]]}]}
  assert npzio.leaf_paths(out_tree, results=True) == ["a0", "a1['x']"]
  assert npzio.tree_leaves(out_tree, (5, {"x": 6})) == [5, 6]
  with pytest.raises(ValueError, match="expected a dict with keys"):
    npzio.tree_leaves(out_tree, (5, {"y": 6}))


# --- as subprocesses: the installed script ---------------------------------------------------

def _hxmlir(*argv, cwd=None):
  exe = os.path.join(os.path.dirname(sys.executable), "hxmlir")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([exe, *map(str, argv)], capture_output=True, text=True, cwd=cwd,
                        env=env, timeout=300)


def test_the_three_commands_as_subprocesses(user, tmp_path):
  p = _hxmlir("lower", "mylayer:layer", "--arg", "f32[2,6]", "--arg", "q8[6,5]", cwd=user)
  assert p.returncode == 0, p.stderr
  assert '"hx.matmul_q"' in p.stdout
  p = _hxmlir("lower", "mylayer:layer", "--arg", "f32[2,6", cwd=user)
  assert p.returncode == 1 and p.stdout == ""
  assert p.stderr == ("hxmlir lower: error: TypeStrError: --arg 1 'f32[2,6': column 8: "
                      "expected ',' or ']' after a dimension, got the end of the text\n")
  art = tmp_path / "layer.hxa"
  p = _hxmlir("export", "mylayer:layer", "--arg", "f32[2,6]", "--arg", "q8[6,5]", "--platforms",
              "cpu", "-o", art, cwd=user)
  assert p.returncode == 0, p.stderr
  assert p.stdout == ""  # the artifact is the output; the status line goes to stderr
  assert p.stderr == f"wrote {art}: {art.stat().st_size} bytes, platforms cpu, 2 arguments\n"
  p = _hxmlir("inspect", art, "--json")
  assert p.returncode == 0, p.stderr
  assert json.loads(p.stdout)["signature"] == "(f32[2,6], q8[6,5]) -> (f32[2,5])"
