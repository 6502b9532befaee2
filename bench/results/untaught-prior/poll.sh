#!/bin/bash
# poll the picker's learned cost gauges while a suite runs; $1 = suite log, $2 = out file
for i in $(seq 1 120); do URL=$(grep -o "picker0: http://[0-9.:]*" $1 | head -1 | sed 's/picker0: //'); [ -n "$URL" ] && break; sleep 1; done
while true; do
  T=$(date +%s.%N)
  curl -s --max-time 2 $URL/metrics | grep "^router_cost_model" | sed "s/^/$T /" >> $2 || break
  grep -q "^results:" $1 && break
  sleep 1
done
