#!/bin/bash
# A/B: old and new lanes binaries, alternated, each run vanilla vs falcon interleaved.
cd /work/main
for r in 1 2; do
  for v in old new; do
    echo "=== $v round $r $(date -u +%H:%M:%S)"
    /tmp/exp/lanes-$v bench --quick --duration 3s --repeats 3 --modes vanilla,falcon --workloads tcp_stream,udp_stress --out /tmp/exp/ab/$v-$r > /tmp/exp/ab/$v-$r.log 2>&1
    echo "rc $?"
  done
done
echo AB-DONE $(date -u +%H:%M:%S)
