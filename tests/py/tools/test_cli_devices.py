"""Multi-device artifacts on the command line: ``hxmlir inspect`` says how
many devices an artifact needs and on which mesh; ``hxmlir run`` runs it on a mesh of that
shape, inputs placed by the artifact's input shardings, ``--host-devices`` making the CPU
devices first; a clear error (naming the flag) when the devices are not there.

In-process runs use the 8 host devices ``conftest.py`` makes; the one-device case and
``--host-devices`` run the installed script in a subprocess with ``XLA_FLAGS`` unset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from numerics import assert_matmul_close

from hxmlir.export import deserialize
from hxmlir.tools import cli, run_cli

MODULE = textwrap.dedent('''\
    import hxmlir as hx

    def mm(x, w):
      return hx.matmul_q(x, w)

    def dense(x, w):
      return x @ w
    ''')


def _run(capsys, *argv) -> tuple[int, str, str]:
  rc = cli.main([str(a) for a in argv])
  out = capsys.readouterr()
  return rc, out.out, out.err


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
  """Artifacts (cpu) of ``mm`` on an explicit 4-device mesh, on a 16-device one, of ``dense``
  on an Auto 2-device mesh and of ``mm`` on one device; and inputs for them."""
  d = tmp_path_factory.mktemp("devices")
  (d / "mdev.py").write_text(MODULE)
  specs = {"mm4": ("mm", ["f32[8@i,3]", "q8[3,4]"], "i=4"),
           "mm16": ("mm", ["f32[16@i,3]", "q8[3,4]"], "i=16"),
           "dense2": ("dense", ["f32[8,6]", "f32[6,4]"], "i=2:auto"),
           "mm1": ("mm", ["f32[8,3]", "q8[3,4]"], None)}
  for name, (fn, types, mesh) in specs.items():
    argv = ["export", f"{d}/mdev.py:{fn}", *[a for t in types for a in ("--arg", t)],
            *(["--mesh", mesh] if mesh else []), "--platforms", "cpu", "-o", str(d / f"{name}.hxa")]
    assert cli.main(argv) == 0, argv
  rng = np.random.default_rng(7)
  mm_in = {"a1.qvalue": rng.integers(-127, 128, (3, 4)).astype(np.int8),
           "a1.scale": rng.uniform(0.01, 0.1, 3).astype(np.float32)}
  for rows in (8, 16):
    np.savez(d / f"mm_in{rows}.npz", a0=rng.standard_normal((rows, 3)).astype(np.float32),
             **mm_in)
  np.savez(d / "dense_in.npz", a0=rng.standard_normal((8, 6)).astype(np.float32),
           a1=rng.standard_normal((6, 4)).astype(np.float32))
  return d


def _check_mm(out_npz, in_npz):
  with np.load(in_npz) as a, np.load(out_npz) as z:
    w = a["a1.qvalue"].astype(np.float64) * a["a1.scale"].astype(np.float64)[:, None]
    assert_matmul_close(z["a0"], a["a0"], w, extra=1)  # one more rounding: x * s or q * s


# --- inspect ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, line, mesh", [
    ("mm4", "  devices: 4 (mesh i=4; on one CPU machine: hxmlir run --host-devices)",
     {"axes": [["i", 4]], "axis_types": ["Explicit"]}),
    ("dense2", "  devices: 2 (mesh i=2:auto; on one CPU machine: hxmlir run --host-devices)",
     {"axes": [["i", 2]], "axis_types": ["Auto"]}),
    ("mm1", "  devices: 1", None),
])
def test_inspect_says_how_many_devices(arts, capsys, name, line, mesh):
  rc, out, err = _run(capsys, "inspect", arts / f"{name}.hxa")
  assert rc == 0, err
  assert out.splitlines()[2] == line, out
  rc, out, _ = _run(capsys, "inspect", arts / f"{name}.hxa", "--json")
  info = json.loads(out)
  assert (info["devices"], info["mesh"]) == (int(line.split()[1]), mesh)


# --- run in-process (8 devices) -------------------------------------------------------------

def test_run_places_inputs_by_the_artifacts_shardings(arts):
  exp = deserialize((arts / "mm4.hxa").read_bytes())
  mesh = cli.run_mesh(exp)
  assert (mesh.axis_names, mesh.axis_sizes, mesh.size) == (("i",), (4,), 4)
  (x, qw), _ = run_cli.load_inputs(str(arts / "mm_in8.npz"), exp, mesh)
  assert x.sharding.mesh == mesh and x.sharding.spec == P("i", None)
  assert sorted(s.index[0].start for s in x.addressable_shards) == [0, 2, 4, 6]  # 2 rows each
  assert len(qw.qvalue.sharding.device_set) == 4 and qw.qvalue.sharding.is_fully_replicated


@pytest.mark.parametrize("name, inputs", [("mm4", "mm_in8.npz"), ("dense2", "dense_in.npz")])
def test_run_a_multi_device_artifact(arts, capsys, tmp_path, name, inputs):
  rc, out, err = _run(capsys, "run", arts / f"{name}.hxa", "--inputs", arts / inputs,
                      "--output", tmp_path / "out.npz")
  assert rc == 0, err
  if name == "mm4":
    assert out == "" and "float32[8@i,4]" in err
    _check_mm(tmp_path / "out.npz", arts / inputs)
  else:
    with np.load(arts / inputs) as a, np.load(tmp_path / "out.npz") as z:
      assert_matmul_close(z["a0"], a["a0"], a["a1"])


def test_too_few_devices_names_the_flag(arts, capsys):
  rc, out, err = _run(capsys, "run", arts / "mm16.hxa", "--inputs", arts / "mm_in16.npz")
  assert rc == 1 and out == ""
  assert err == (f"hxmlir run: error: DevicesError: {arts / 'mm16.hxa'} was exported for 16 "
                 "devices (mesh i=16) and this process has 8 cpu devices: pass --host-devices "
                 "to run it on 16 CPU devices of this machine (XLA's "
                 "--xla_force_host_platform_device_count=16), or run it where 16 devices are\n")


def test_host_devices_after_jax_started_says_to_use_a_fresh_process(arts, capsys):
  # in this process JAX's CPU backend already runs with 8 devices
  rc, _, err = _run(capsys, "run", arts / "mm16.hxa", "--inputs", arts / "mm_in16.npz",
                    "--host-devices")
  assert rc == 1
  assert ("DevicesError: --host-devices 16: JAX's CPU backend already started in this process "
          f"with 8 devices and {arts / 'mm16.hxa'} needs 16 (mesh i=16); run `hxmlir run "
          "--host-devices` in a fresh process") in err, err
  # enough devices already: accepted
  rc, _, err = _run(capsys, "run", arts / "mm4.hxa", "--inputs", arts / "mm_in8.npz",
                    "--host-devices", "4")
  assert rc == 0, err


def test_host_devices_fewer_than_needed(arts, capsys):
  rc, _, err = _run(capsys, "run", arts / "mm4.hxa", "--inputs", arts / "mm_in8.npz",
                    "--host-devices", "2")
  assert rc == 2 and ("UsageError: --host-devices 2: " f"{arts / 'mm4.hxa'} was exported for 4 "
                      "devices (mesh i=4); give --host-devices 4 (or no N)") in err, err


def test_host_devices_needs_a_cpu_artifact(arts, capsys, tmp_path):
  assert cli.main(["export", f"{arts}/mdev.py:dense", "--arg", "f32[8,6]", "--arg", "f32[6,4]",
                   "--mesh", "i=2:auto", "--platforms", "tpu", "-o", str(tmp_path / "t.hxa")]) == 0
  capsys.readouterr()
  rc, _, err = _run(capsys, "run", tmp_path / "t.hxa", "--inputs", arts / "dense_in.npz",
                    "--host-devices")
  assert rc == 2 and ("UsageError: --host-devices runs on this machine's CPU, and "
                      f"{tmp_path / 't.hxa'} was exported for tpu only (export it with "
                      "--platforms cpu,...)") in err, err


# --- a fresh process with one CPU device ----------------------------------------------------

def _hxmlir(*argv):
  exe = os.path.join(os.path.dirname(sys.executable), "hxmlir")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  return subprocess.run([exe, *map(str, argv)], capture_output=True, text=True, timeout=300,
                        env={**env, "JAX_PLATFORMS": "cpu"})


def test_one_device_process_needs_host_devices(arts, tmp_path):
  p = _hxmlir("run", arts / "mm4.hxa", "--inputs", arts / "mm_in8.npz")
  assert p.returncode == 1 and p.stdout == ""
  assert p.stderr == (f"hxmlir run: error: DevicesError: {arts / 'mm4.hxa'} was exported for 4 "
                      "devices (mesh i=4) and this process has 1 cpu device: pass "
                      "--host-devices to run it on 4 CPU devices of this machine (XLA's "
                      "--xla_force_host_platform_device_count=4), or run it where 4 devices "
                      "are\n")
  p = _hxmlir("run", arts / "mm4.hxa", "--inputs", arts / "mm_in8.npz", "--output",
              tmp_path / "out.npz", "--host-devices")
  assert p.returncode == 0, p.stderr
  assert p.stdout == ""  # the status line goes to stderr
  assert p.stderr == (f"ran {arts / 'mm4.hxa'} on 2 arguments: float32[8@i,4] -> "
                      f"{tmp_path / 'out.npz'}\n")
  _check_mm(tmp_path / "out.npz", arts / "mm_in8.npz")
