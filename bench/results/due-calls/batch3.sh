#!/bin/bash
while pgrep -f "cir/main" > /dev/null || [ ! -f /tmp/cir/ci.log ] || ! grep -q "^real" /tmp/cir/ci.log; do sleep 10; done
D=/tmp/s34/dbg; mkdir -p $D   # traces with a debug log (not kept)
cd /work/wt-dbg; source .venv/bin/activate
for i in 1 2; do python -m bench.cell_trace --workload agents --policy precise --rates 6,12 --out $D/t$i > $D/t$i.log 2>&1; done
R=/tmp/s34/runs3; mkdir -p $R   # copied to runs-moon/
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $3 --policies ${5:-precise} --rates $4 --repeat 1 --no-plots --out $R/$2 > $R/$2.log 2>&1; }
for t in due base; do run $t $t-moon-r3 mooncake 8,16; done
for t in base due; do run $t $t-moon-r4 mooncake 8,16; done
echo done > $R/DONE
