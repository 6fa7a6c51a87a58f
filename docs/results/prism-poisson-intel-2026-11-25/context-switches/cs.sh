#!/bin/bash
# per-second context switches on cpu1 with a timestamp
while true; do
  t=$(date +%s.%N)
  n=$(perf stat -C 1 -e context-switches -x, -- sleep 1 2>&1 | grep context-switches | cut -d, -f1)
  echo "$t $n"
done
