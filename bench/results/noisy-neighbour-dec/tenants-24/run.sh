#!/bin/bash
# alternate runs: the untouched tree (b15500c) and wt-ten, tenants workload at 24 req/s, precise (no shares)
for i in 1 2; do
  (cd /tmp/before-wt-ten && PYTHONPATH=/tmp/before-wt-ten flock /tmp/bench.lock /work/wt/ten/.venv/bin/python -m bench --workload tenants --policies precise --rates 24 --no-plots --out /tmp/ten-tenants/before-$i)
  (cd /work/wt/ten && PYTHONPATH=/work/wt/ten flock /tmp/bench.lock .venv/bin/python -m bench --workload tenants --policies precise --rates 24 --no-plots --out /tmp/ten-tenants/after-$i)
done
