"""Writes tests/py/slow_tests.txt, the fast tier's measured exclusions, from a full run's timings.

Usage::

    pytest -q -p no:randomly --junitxml=/tmp/full.xml      # the full suite
    pytest -q -p no:randomly -m "not slow" --junitxml=/tmp/fast.xml   # then the fast tier
    python scripts/slow_tests.py /tmp/full.xml /tmp/fast.xml [--threshold 0.5]

A test function (all its parameters together) is listed when one of its cases took at least
``--threshold`` seconds (call time as pytest's JUnit XML reports it; a module fixture's cost
lands on the first case that uses it, so the whole function goes; once those are deselected it
lands on the next: give the fast tier's run too, and every file's cases count). ``tests/py/conftest.py``
marks the listed functions ``slow``, beside its rules for real models; ``scripts/test.sh
--fast`` deselects them. Run it on a quiet 2-core machine after tests are added or sped up.
"""

from __future__ import annotations

import argparse
import collections
import re
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "py" / "slow_tests.txt"
HEADER = """\
# The fast tier's measured exclusions: test functions (module path::name, all parameters) one of
# whose cases took >= {threshold} s in a full run. Written by scripts/slow_tests.py from
# pytest's JUnit XML; read by tests/py/conftest.py, which marks them slow.
"""


def function_id(classname: str, name: str) -> str:
  """``tests/py/m/test_x.py::test_f`` (or ``...::Class::test_f``) from a JUnit ``testcase``'s
  ``classname`` (dotted: ``tests.py.m.test_x[.Class]``) and ``name`` (``test_f[params]``)."""
  parts = classname.split(".")
  cls = [parts.pop()] if parts[-1][:1].isupper() else []
  return "::".join(["/".join(parts) + ".py", *cls, re.sub(r"\[.*", "", name, flags=re.S)])


def slow_functions(junits: list[Path], threshold: float) -> dict[str, float]:
  """The functions one of whose cases took ``>= threshold`` s in one of the JUnit XML files
  ``junits``: id -> the slowest case's seconds."""
  worst: dict[str, float] = collections.defaultdict(float)
  for junit in junits:
    for case in ET.parse(junit).getroot().iter("testcase"):
      fid = function_id(case.get("classname", ""), case.get("name", ""))
      worst[fid] = max(worst[fid], float(case.get("time", 0)))
  return {f: s for f, s in worst.items() if s >= threshold}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("junit", type=Path, nargs="+",
                 help="pytest --junitxml files: a full run, and optionally fast-tier runs")
  p.add_argument("--threshold", type=float, default=0.5, help="seconds (default 0.5)")
  p.add_argument("--out", type=Path, default=OUT)
  a = p.parse_args(argv)
  slow = slow_functions(a.junit, a.threshold)
  a.out.write_text(HEADER.format(threshold=a.threshold)
                   + "".join(f"{f}  # {s:.1f} s\n" for f, s in sorted(slow.items())))
  print(f"{len(slow)} slow test functions -> {a.out}")


if __name__ == "__main__":
  main()
