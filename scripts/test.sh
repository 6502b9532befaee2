#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite: unit, contract (in-memory and real Valkey),
# integration (real gRPC, ZMQ, HTTP) and end-to-end (real Envoy + the simulator). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
