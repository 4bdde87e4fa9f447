#!/usr/bin/env bash
# Sets up .venv (if needed) and runs every check: ruff, lit (tests/lit and the user example
# examples/lit, so it never rots), pytest (tests/py).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh "test,minilm,llama,flax,train"
export PATH="$PWD/$VENV/bin:$PATH"
echo "== ruff"
ruff check .
echo "== lit"
lit -sv --order=smart tests/lit examples/lit
echo "== pytest"
pytest -q -W error "$@"
