"""``$HXMLIR_CPU_ISA`` and ``$HXMLIR_DISABLE_NATIVE``: values hxmlir cannot honour warn.

The native CPU kernel is chosen once, at import (``lowering/matmul_q/cpu.py:_load``), so
each case runs in a fresh Python. A typo, an ISA this CPU lacks, or a
``HXMLIR_DISABLE_NATIVE`` that is not a truth value issues a ``UserWarning`` naming the
value, the valid ones and what is used instead (the StableHLO lowering).
"""

import os
import subprocess
import sys
import textwrap

import pytest

from hxmlir.lowering.matmul_q import cpu as native

try:
  from hxmlir import _matmul_q_cpu as ext
except ImportError:
  ext = None

# A stand-in for the extension on a CPU that runs only the portable build: installed in
# sys.modules before hxmlir is imported, so _load finds it instead of the real one.
_PORTABLE_ONLY_CPU = f"""
    import sys, types
    ext = types.ModuleType("hxmlir._matmul_q_cpu")
    for name in {native.EXTENSION_API!r}:
      setattr(ext, name, lambda *args: None)  # the whole API: not an older build
    ext.supported_isas = lambda: ("generic",)
    sys.modules["hxmlir._matmul_q_cpu"] = ext
"""


def _import_hxmlir(env: dict, prelude: str = "") -> tuple[str, list[str]]:
  """``str(hx.cpu_kernel_info())`` and the UserWarnings of ``import hxmlir`` under ``env``."""
  code = textwrap.dedent(prelude) + textwrap.dedent("""
      import warnings
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import hxmlir as hx
      print(hx.cpu_kernel_info())
      for w in caught:
        if w.category is UserWarning:
          print("WARNING", w.message)
      """)
  base = {k: v for k, v in os.environ.items() if k not in (native.ISA_ENV, native.DISABLE_ENV)}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                     env={**base, **env}, timeout=300)
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  return lines[0], [ln.removeprefix("WARNING ") for ln in lines[1:] if ln.startswith("WARNING")]


@pytest.mark.parametrize("value", ["avx-512", "sse9", "avx512f"])
def test_unknown_isa_warns_and_keeps_stablehlo(value):
  info, warns = _import_hxmlir({native.ISA_ENV: value})
  assert info.startswith(f"StableHLO lowering (${native.ISA_ENV}={value}, but"), info
  assert warns == [f"hxmlir: ${native.ISA_ENV}={value!r} is not one of avx512, avx2, generic; "
                   "hx.matmul_q uses the StableHLO lowering on CPU (unset $HXMLIR_CPU_ISA for "
                   "the best ISA this CPU runs)"]


def test_isa_this_cpu_lacks_warns_and_keeps_stablehlo():
  info, warns = _import_hxmlir({native.ISA_ENV: "avx2"}, _PORTABLE_ONLY_CPU)
  assert info == "StableHLO lowering ($HXMLIR_CPU_ISA=avx2, but this CPU and build run only generic)"
  assert warns == ["hxmlir: $HXMLIR_CPU_ISA='avx2', but this CPU and build run only generic; "
                   "hx.matmul_q uses the StableHLO lowering on CPU (set one of those, or unset "
                   "$HXMLIR_CPU_ISA for the best of them)"]
  # without the variable such a CPU keeps the StableHLO lowering quietly: nothing was asked
  info, warns = _import_hxmlir({}, _PORTABLE_ONLY_CPU)
  assert info.startswith("StableHLO lowering (this CPU has neither AVX-512 nor AVX2") and not warns


def test_disable_native_reads_truth_values_like_jax():
  info, warns = _import_hxmlir({native.DISABLE_ENV: "maybe"})
  assert info == ("StableHLO lowering (disabled by $HXMLIR_DISABLE_NATIVE=maybe (not a truth "
                  "value: read as true))")
  assert warns == ["hxmlir: $HXMLIR_DISABLE_NATIVE='maybe' is not a truth value "
                   "(1/true/t/yes/y/on to disable, 0/false/f/no/n/off or empty to enable, as "
                   "JAX's boolean flags); read as true: hx.matmul_q uses the StableHLO lowering "
                   "on CPU"]
  info, warns = _import_hxmlir({native.DISABLE_ENV: "TRUE"})
  assert info == "StableHLO lowering (disabled by $HXMLIR_DISABLE_NATIVE=TRUE)" and not warns


@pytest.mark.skipif(ext is None, reason="the native extension is not built")
@pytest.mark.parametrize("env", [{native.DISABLE_ENV: "false"}, {native.DISABLE_ENV: "0"},
                                 {native.ISA_ENV: "GENERIC"}, {}])
def test_accepted_values_do_not_warn(env):
  info, warns = _import_hxmlir(env)
  assert not warns, warns
  if env.get(native.ISA_ENV):
    assert info == "native CPU kernel hx_matmul_q_cpu_v1 (generic; forced by $HXMLIR_CPU_ISA)"
  elif any(i in ext.supported_isas() for i in native.DEFAULT_ISAS):
    assert info.startswith("native CPU kernel hx_matmul_q_cpu_v1 ("), info


# --- the kernel's choices against the machine (kernels that hold on any x86-64) ---

# The CPU features each native build needs, as csrc/matmul_q_ffi.cc asks
# __builtin_cpu_supports for them; spelled as Linux's /proc/cpuinfo "flags" line spells them.
_ISA_FLAGS = {"avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"},
              "avx2": {"avx2", "fma"}, "generic": set()}


def _cpuinfo_flags() -> set[str] | None:
  """The CPU feature flags of /proc/cpuinfo (the kernel clears those the OS does not
  enable, as __builtin_cpu_supports checks XCR0), or None off Linux."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.split(":", 1)[1].split())
  except OSError:
    return None
  return None


@pytest.mark.skipif(ext is None, reason="the native extension is not built")
@pytest.mark.skipif(_cpuinfo_flags() is None, reason="no /proc/cpuinfo flags (not Linux)")
def test_isa_matches_the_cpu_flags():
  flags = _cpuinfo_flags()
  built = tuple(ext.compiled_isas())
  assert set(built) <= set(_ISA_FLAGS) and built[-1] == "generic", built
  # every build this CPU has the features for, best first, and no other
  want = tuple(i for i in built if _ISA_FLAGS[i] <= flags)
  assert tuple(ext.supported_isas()) == want, (ext.supported_isas(), sorted(flags & set().union(
      *_ISA_FLAGS.values())))
  # without $HXMLIR_CPU_ISA the best of them (generic only when asked for)
  info = native.cpu_kernel_info()
  if os.environ.get(native.ISA_ENV) or os.environ.get(native.DISABLE_ENV):
    pytest.skip("the environment forces the ISA or disables the kernel")
  best = next((i for i in native.DEFAULT_ISAS if i in want), None)
  assert info.isa == best and info.active == (best is not None), (info, flags)
  assert info.supported_isas == want


def _kernel_threads(env: dict) -> tuple[int, int]:
  """``(hx.cpu_kernel_info().threads, cores this process may use)`` in a fresh Python."""
  code = ("import os, hxmlir as hx\n"
          "print(hx.cpu_kernel_info().threads, len(os.sched_getaffinity(0)))")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                     env={**os.environ, **env}, timeout=300)
  assert r.returncode == 0, r.stderr
  threads, cores = map(int, r.stdout.split())
  return threads, cores


@pytest.mark.skipif(ext is None, reason="the native extension is not built")
@pytest.mark.skipif(not hasattr(native.CpuKernelInfo, "threads"),
                    reason="the kernel does not report its thread count yet "
                           "(CpuKernelInfo.threads)")
def test_thread_count_is_at_most_the_cores_whatever_the_host_device_count():
  # XLA's intra-op pool has max(cores, devices) threads: with
  # --xla_force_host_platform_device_count=8 on 2 cores, 8 (the int8 demo model
  # went from 0.6x to 1.2-1.7x f32 with that flag). The kernel must put no more busy
  # threads on the cores than there are cores, whatever the number of host devices.
  flags = os.environ.get("XLA_FLAGS", "")
  one = _kernel_threads({})
  eight = _kernel_threads({"XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count=8"})
  cores = one[1]
  assert 1 <= one[0] <= cores and eight[0] == one[0], (one, eight)


def test_an_extension_older_than_the_package_turns_the_kernel_off(monkeypatch):
  # an editable install whose C++ was not rebuilt lacks the newer entry points: the kernel
  # is off with the rebuild command, never an AttributeError at `import hxmlir`
  import types

  import hxmlir
  from hxmlir.lowering.matmul_q import cpu as matmul_q_cpu
  real = hxmlir._matmul_q_cpu
  old = types.SimpleNamespace(**{f: getattr(real, f) for f in matmul_q_cpu.EXTENSION_API
                                 if f not in ("handler_v3", "max_threads")},
                              __file__="old.so")
  monkeypatch.setattr(hxmlir, "_matmul_q_cpu", old)
  monkeypatch.delenv("HXMLIR_DISABLE_NATIVE", raising=False)
  with pytest.warns(UserWarning, match=r"older than this hxmlir \(it lacks handler_v3, "
                                       r"max_threads\).*pip install -e \."):
    info = matmul_q_cpu._load()
  assert not info.active and "lacks handler_v3, max_threads" in info.reason


@pytest.mark.skipif(ext is None, reason="the native extension is not built")
@pytest.mark.parametrize("value,linger,warning", [
    (None, 50, None), ("", 50, None), ("37", 37, None), ("0", 0, None),
    ("abc", 50, "'abc' is not an integer number of microseconds; the native kernels' helper "
                "threads linger 50 us"),
    ("-5", 0, "'-5' is outside [0, 500] microseconds; the native kernels' helper threads "
              "linger 0 us"),
    ("100000", 500, "'100000' is outside [0, 500] microseconds; the native kernels' helper "
                    "threads linger 500 us")])
def test_linger_time_comes_from_the_environment_checked(value, linger, warning):
  # a helper thread spins this long for the next call's blocks (matmul_q_parallel.h)
  env = {} if value is None else {native.LINGER_ENV: value}
  _, warns = _import_hxmlir(env)
  code = textwrap.dedent("""
      import hxmlir
      from hxmlir import _matmul_q_cpu as ext
      print(ext.linger_us())
      ext.set_linger_us(-5)
      print(ext.linger_us())
      """)
  base = {k: v for k, v in os.environ.items() if k != native.LINGER_ENV}
  r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                     text=True, env={**base, **env}, timeout=300)
  assert r.returncode == 0, r.stderr
  assert r.stdout.split() == [str(linger), "0"], r.stdout
  assert warns == ([] if warning is None else [f"hxmlir: ${native.LINGER_ENV}={warning}"])
