"""The fast tier's measured list (tests/py/slow_tests.txt, written by scripts/slow_tests.py):
every entry names a test function that exists, and the script reads pytest's JUnit XML the
way conftest matches node ids (classes, parameters with brackets and dots)."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("slow_tests", ROOT / "scripts" / "slow_tests.py")
slow_tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slow_tests)


def _entries():
  lines = (ROOT / "tests" / "py" / "slow_tests.txt").read_text().splitlines()
  return [ln.split("#")[0].strip() for ln in lines if ln.split("#")[0].strip()]


@pytest.mark.parametrize("entry", _entries())
def test_every_listed_function_exists(entry):
  path, *cls, name = entry.split("::")
  source = (ROOT / path).read_text()  # FileNotFoundError: a module moved or was removed
  assert re.search(rf"^\s*def {re.escape(name)}\(", source, re.M), \
      f"{entry}: no function {name} in {path}; rerun scripts/slow_tests.py"
  for c in cls:
    assert re.search(rf"^class {re.escape(c)}\b", source, re.M), entry


def test_the_script_groups_cases_by_function(tmp_path):
  junit = tmp_path / "j.xml"
  junit.write_text(
      '<testsuites><testsuite>'
      '<testcase classname="tests.py.m.test_x" name="test_f[a.b-1]" time="0.7"/>'
      '<testcase classname="tests.py.m.test_x" name="test_f[c]" time="0.1"/>'
      '<testcase classname="tests.py.m.test_x" name="test_g" time="0.4"/>'
      '<testcase classname="tests.py.m.test_x.TestK" name="test_h" time="2"/>'
      '</testsuite></testsuites>')
  got = slow_tests.slow_functions([junit], 0.5)
  assert got == {"tests/py/m/test_x.py::test_f": 0.7,
                 "tests/py/m/test_x.py::TestK::test_h": 2.0}
