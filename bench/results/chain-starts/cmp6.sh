#!/bin/bash
D=/tmp/s33/runs4
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $3 --policies precise --rates $4 --repeat 1 --no-plots --out $D/$2 > $D/$2.log 2>&1; }
for t in a c; do run $t $t-moon16-r2 mooncake 16; done
for t in c a; do run $t $t-moon16-r3 mooncake 16; done
echo done > $D/DONE6
