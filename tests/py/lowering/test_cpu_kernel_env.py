"""``$HXMLIR_CPU_ISA`` and ``$HXMLIR_DISABLE_NATIVE``: values hxmlir cannot honour warn.

The native CPU kernel is chosen once, at import (``lowering/matmul_q_cpu.py:_load``), so
each case runs in a fresh Python. A typo, an ISA this CPU lacks, or a
``HXMLIR_DISABLE_NATIVE`` that is not a truth value issues a ``UserWarning`` naming the
value, the valid ones and what is used instead (the StableHLO lowering).
"""

import os
import subprocess
import sys
import textwrap

import pytest

from hxmlir.lowering import matmul_q_cpu as native

try:
  from hxmlir import _matmul_q_cpu as ext
except ImportError:
  ext = None

# A stand-in for the extension on a CPU that runs only the portable build: installed in
# sys.modules before hxmlir is imported, so _load finds it instead of the real one.
_PORTABLE_ONLY_CPU = """
    import sys, types
    ext = types.ModuleType("hxmlir._matmul_q_cpu")
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
