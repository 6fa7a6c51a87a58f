#!/bin/bash
uname -r > /tmp/exp/vmout/vmgotest.log
for t in datapath_steer datapath_load datapath_attach topology policy_falcon policy_prism; do
  pkg=${t//_//}
  echo "=== $pkg $(date +%s)" >> /tmp/exp/vmout/vmgotest.log
  (cd /work/main/$pkg && timeout 900 /tmp/exp/vmtests/$t.test -test.count=1 -test.v > /tmp/exp/vmout/go-$t.log 2>&1; echo "rc $?" >> /tmp/exp/vmout/go-$t.log)
  grep -E '^(--- FAIL|FAIL|PASS|ok|panic|rc )' /tmp/exp/vmout/go-$t.log >> /tmp/exp/vmout/vmgotest.log
  sync
done
ip netns list >> /tmp/exp/vmout/vmgotest.log; ls /sys/fs/bpf >> /tmp/exp/vmout/vmgotest.log
echo VMGOTEST-DONE >> /tmp/exp/vmout/vmgotest.log
