"""``HXMLIR_REQUIRE_NATIVE=1`` (set by scripts/test.sh under CI) turns a test skipped for an
inactive native kernel into a failure (tests/py/conftest.py); without it the test skips."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TEST = "lowering/test_matmul_q_cpu_native.py::test_extension_is_built_and_active_on_this_machine"


@pytest.mark.parametrize("require, want", [("", "1 skipped"), ("1", "1 failed")])
def test_require_native_turns_a_native_skip_into_a_failure(require, want):
  # HXMLIR_DISABLE_NATIVE=1: the kernel is off, so the test skips for it
  env = {**os.environ, "HXMLIR_DISABLE_NATIVE": "1", "HXMLIR_REQUIRE_NATIVE": require}
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST],
                     cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
  assert want in r.stdout, r.stdout + r.stderr
  assert r.returncode == (1 if require else 0), r.stdout
  if require:
    assert "HXMLIR_REQUIRE_NATIVE=1 and this test was skipped: native kernel disabled by the " \
           "environment" in r.stdout, r.stdout
