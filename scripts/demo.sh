#!/usr/bin/env bash
# Sets up .venv (if needed) and runs the main job: `hxmlir demo` on the built-in model.
# Usage: bash scripts/demo.sh [demo args, e.g. --model minilm --json --out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh "minilm,llama"
exec "$VENV/bin/hxmlir" demo "$@"
