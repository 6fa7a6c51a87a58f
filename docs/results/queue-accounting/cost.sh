#!/bin/bash
# A/B of the datapath's per-run cost: lanes before (old) and after (new)
# the queue accounting, prism-batch with a rule (bulk through the bulk queue).
P=/sys/fs/bpf/lanes/lanes-h2
orig=$(cat /proc/sys/kernel/bpf_stats_enabled)
trap 'echo $orig > /proc/sys/kernel/bpf_stats_enabled' EXIT
for round in 1 2 3; do
 for b in old new; do
  L=/tmp/exp/lanes-$b
  $L reset --netns lanes-h2 >/dev/null 2>&1
  $L apply --mode prism-batch --netns lanes-h2 >/dev/null 2>&1 || { echo apply failed; exit 1; }
  $L prio add dst 198.19.0.22 port 11111 udp --netns lanes-h2 >/dev/null
  echo 1 > /proc/sys/kernel/bpf_stats_enabled
  for w in tcp udp; do
   ip netns exec lanes-h2-c1 iperf3 -s -1 -D >/dev/null 2>&1; sleep 0.3
   if [ $w = tcp ]; then args="-t 3"; else args="-u -b 3G -l 1400 -t 3"; fi
   r=$(ip netns exec lanes-h1-c1 iperf3 -c 198.19.0.21 $args -J | python3 -c 'import json,sys; d=json.load(sys.stdin)["end"]; s=d.get("sum_received") or d.get("sum"); print("%.2f Gbit/s lost %s" % (s["bits_per_second"]/1e9, s.get("lost_percent","-")))')
   s=$(/tmp/exp/progstat/progstat $P/steer_xdp $P/steer_tc_split_seen | awk '{print $1" "$5}' | sed "s#$P/##" | tr '\n' ' ')
   echo "round $round $b $w: $r | $s"
  done
  echo 0 > /proc/sys/kernel/bpf_stats_enabled
  $L reset --netns lanes-h2 >/dev/null 2>&1
 done
done
