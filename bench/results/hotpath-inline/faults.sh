#!/bin/bash
# minor page faults of the picker process over an agent session, per tree
cd /work/main && source .venv/bin/activate
for t in /work/wt-a /work/main; do
  python -m bench.picker_latency --quick --sizes 1K --concurrency 1 --agent-tokens 100000 --verify-fraction 0 --picker-tree $t > /tmp/s31/faults-$(basename $t).txt 2>&1 &
  bp=$!
  pid=""; for i in $(seq 1 120); do pid=$(pgrep -f "extproc.cli serve --config /tmp/picker-latency" | head -1); [ -n "$pid" ] && break; sleep 0.5; done
  while kill -0 $bp 2>/dev/null; do echo "$(date +%s.%N) $(awk '{print $10, $14+$15}' /proc/$pid/stat 2>/dev/null)"; sleep 1; done > /tmp/s31/faults-$(basename $t).log
  echo "$t: $(head -1 /tmp/s31/faults-$(basename $t).log) -> $(grep -v ' $' /tmp/s31/faults-$(basename $t).log | tail -1)"; grep "last quarter" /tmp/s31/faults-$(basename $t).txt
done
