# ruff: noqa: F821  (lit provides `config`)
# lit configuration for your project's IR tests (copied from hxmlir's examples/lit).
# RUN lines use %python, and find hxmlir, hxmlir-opt and filecheck on PATH: the bin
# directory of the Python environment that runs lit (`pip install hxmlir lit filecheck`).
# %src is the directory of your code (src/ here), also put on PYTHONPATH so tests
# import it as `import mylayer`.
import os
import sys

import lit.formats

config.name = "my-project"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.excludes = ["lit.cfg.py", "src", "Output"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.test_source_root, "Output")

src = os.path.join(config.test_source_root, "src")
bindir = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "")])
config.environment["PYTHONPATH"] = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])
config.environment["FILECHECK_OPTS"] = "-enable-var-scope"
config.environment["JAX_PLATFORMS"] = "cpu"
for var in ("HOME", "TMPDIR", "XLA_FLAGS"):
  if var in os.environ:
    config.environment[var] = os.environ[var]
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(("%src", src))
