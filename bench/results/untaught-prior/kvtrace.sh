#!/bin/bash
D=/tmp/s30/kvtrace; mkdir -p $D; cd /work/wt-c; source .venv/bin/activate
python -m bench.cell_trace --workload agents --policy vllm_kv_aware --rates 6,6 --out $D/kv > $D/kv.log 2>&1
echo done > $D/DONE
