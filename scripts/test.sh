#!/usr/bin/env bash
# Sets up .venv (if needed) and runs every check: ruff, mypy (the scope in pyproject.toml), the
# docs site (mkdocs build --strict), lit (tests/lit and the user example examples/lit, so it
# never rots), pytest (tests/py; it also runs the docs' python blocks).
# Usage: bash scripts/test.sh [--fast] [extra pytest args]
#   pytest runs in HXMLIR_TEST_WORKERS processes (pytest-xdist, default 2; 0: one process),
#   each test file in one of them (module fixtures and the real models load once per process)
#   --fast: the fast tier (~5 min on 2 cores): pytest without the tests marked slow (real
#           models, and those measured slow: tests/py/slow_tests.txt), lit without the files
#           that say UNSUPPORTED: fast
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=()
LIT_FAST=()
if [ "${1:-}" = "--fast" ]; then
  FAST=(-m "not slow")
  LIT_FAST=(--param fast=1)
  shift
fi
source scripts/venv.sh "test,minilm,llama,flax,train,docs"
export PATH="$VENV/bin:$PATH"
echo "== ruff"
ruff check .
echo "== mypy"
mypy
echo "== docs"
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$(mktemp -d)"
echo "== lit"
lit -sv --order=smart "${LIT_FAST[@]}" tests/lit examples/lit
echo "== pytest"
# under CI a native-kernel test that skips (the extension did not build) is a failure
if [ -n "${CI:-}" ]; then export HXMLIR_REQUIRE_NATIVE="${HXMLIR_REQUIRE_NATIVE:-1}"; fi
pytest -q -W error -n "${HXMLIR_TEST_WORKERS:-2}" --dist loadfile "${FAST[@]}" "$@"
