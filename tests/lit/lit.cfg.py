# lit configuration for hxmlir: RUN lines use %python and the tools on PATH
# (hxmlir-opt, hxmlir, filecheck) from the Python environment running lit.
import os
import sys

import lit.formats

config.name = "hxmlir"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.excludes = ["lit.cfg.py", "Inputs", "Output"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.test_source_root, "Output")

bindir = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "")])
config.environment["FILECHECK_OPTS"] = "-enable-var-scope"
config.environment["JAX_PLATFORMS"] = "cpu"
for var in ("HOME", "TMPDIR", "XLA_FLAGS"):
  if var in os.environ:
    config.environment[var] = os.environ[var]
config.substitutions.append(("%python", sys.executable))
# `lit --param fast=1` (scripts/test.sh --fast): the feature "fast" is on, and the files that
# say `UNSUPPORTED: fast` (dozens of tool runs, each a fresh interpreter) are left to the full run
if lit_config.params.get("fast", "0") not in ("", "0"):
  config.available_features.add("fast")
