#!/bin/bash
# every 0.5 s: timestamp, then comm:voluntary switches for napi/cpumap kthreads
while true; do
  line="$(date +%s.%N)"
  for p in $(pgrep -f '^\[?(napi|cpumap)/' ; pgrep 'napi/|cpumap/'); do :; done
  for d in /proc/[0-9]*; do
    c=$(cat $d/comm 2>/dev/null) || continue
    case "$c" in napi/*|cpumap/*) v=$(grep voluntary_ctxt_switches $d/status | head -1 | awk '{print $2}'); line="$line ${c}@${d#/proc/}=$v";; esac
  done
  echo "$line"
  sleep 0.5
done
