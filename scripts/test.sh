#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite: unit, contract (in-memory, real Valkey, a local
# Valkey cluster), integration, end-to-end (real Envoy + pickers + the simulator), faults, fuzz, security.
# Extra args go to pytest. Tests that failed are run once more, alone: a few end-to-end tests measure
# failover and event propagation in real time and can lose a race on a loaded 2-core machine; a real
# regression fails both times (and both runs' output is kept above).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
.venv/bin/python -m pytest -q "$@"
status=$?
if [ "$status" -eq 1 ]; then
  echo "== re-running the tests that failed, once =="
  .venv/bin/python -m pytest -q --last-failed --last-failed-no-failures none "$@"
  status=$?
fi
exit "$status"
