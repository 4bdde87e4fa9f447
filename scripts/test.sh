#!/usr/bin/env bash
# Sets up .venv (if needed) and runs every check: ruff, lit (tests/lit and the user example
# examples/lit, so it never rots), pytest (tests/py).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh "test,minilm,llama,flax"
export PATH="$PWD/$VENV/bin:$PATH"
echo "== ruff"
ruff check .
echo "== lit"
lit -sv --order=smart tests/lit examples/lit
echo "== pytest"
# under CI a native-kernel test that skips (the extension did not build) is a failure
if [ -n "${CI:-}" ]; then export HXMLIR_REQUIRE_NATIVE="${HXMLIR_REQUIRE_NATIVE:-1}"; fi
pytest -q -W error "$@"
