#!/bin/bash
# Runs inside the virtme-ng guest (kernel 6.12): lanes on an older kernel.
exec > /tmp/exp/vmout/vmtest.log 2>&1
set -x
uname -a
nproc
mount | grep -E ' /sys/fs/bpf | /run | /tmp ' 
cd /work/main
L=./bin/lanes
$L testbed up --irq-cpu 1 | tail -3
/tmp/exp/udpcheck2.sh 100
for mode in vanilla rps falcon falcon-split falcon-pipeline falcon:split=rps prism-batch prism-sync mflow; do
  m=${mode%%:*}; set=""
  [ "$m" != "$mode" ] && set="--set ${mode#*:}"
  echo "=== apply $mode"
  $L apply --mode $m $set --netns lanes-h2; echo "apply rc $?"
  /tmp/exp/udpcheck2.sh 1000; ip netns exec lanes-h2-c1 nstat -a | grep -E "UdpNoPorts|UdpInErrors|UdpRcvbufErrors"
  $L status --netns lanes-h2 --sample 200ms | sed -n '1,40p'
  $L reset --netns lanes-h2; echo "reset rc $?"
done
$L testbed down; echo "down rc $?"
ip netns list
ls /sys/fs/bpf
echo VMTEST-DONE
