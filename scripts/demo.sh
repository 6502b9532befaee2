#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs the demo: simulated vLLM backends, the picker and real Envoy, the
# classic shared-document case through the picker and through Envoy's round robin. Args go to `extproc demo`
# (--backends N, --requests N, --profile NAME, --keep-logs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/extproc demo "$@"
