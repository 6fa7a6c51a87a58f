//go:build linux

package steer

import (
	"os/exec"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nsx"
)

// A change announced to a socket that counts changes (CountChanges) voids
// every destination written before it, by the time the command that made
// the change has returned: nobody reads the socket here, so only the
// kernel's run of steer_sync_notify, as it sends the notification, can
// have counted it. Each way a firewall rule comes about is tried in a
// namespace of the test's own: an nftables table and base chain, a rule in
// it, iptables-nft. A set written under the new count opens the shortcut
// again, and the socket still gets every message whole.
func TestSyncVoidedByAnnouncedChange(t *testing.T) {
	d := syncDatapath(t, 0, 0)
	addRule(t, d, "dst "+innerDst.String()+" udp")
	ns := scratchNetNS(t)
	var s *nl.NetlinkSocket
	if err := netnsx.Do(ns, func() (err error) {
		s, err = nl.Subscribe(unix.NETLINK_NETFILTER, 7) // NFNLGRP_NFTABLES
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := d.Sync().CountChanges(s.GetFd()); err != nil {
		t.Fatal(err)
	}
	frame := vxlanFrame(frameSpec{flow: udpFlow(40000)})
	changes := func() uint64 {
		t.Helper()
		n, err := d.Sync().Changes()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	setNow := func() {
		t.Helper()
		set := testSyncSet(1500)
		set.Changes = changes()
		if err := d.Sync().Set(set, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		cmd  []string
	}{
		{"nftables table and base chain", []string{"nft", "add table inet lanes_t; add chain inet lanes_t input { type filter hook input priority 0 ; }"}},
		{"nftables rule", []string{"nft", "add rule inet lanes_t input udp dport 4789 drop"}},
		{"iptables-nft rule", []string{"iptables-nft", "-A", "FORWARD", "-j", "DROP"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := exec.LookPath(c.cmd[0]); err != nil {
				t.Skipf("%s is not installed", c.cmd[0])
			}
			setNow()
			if ret, _ := runXDP(t, d, frame); ret != xdpRedirect {
				t.Fatalf("premise: verdict %d before the change, want XDP_REDIRECT", ret)
			}
			n0 := changes()
			if out, err := exec.Command("nsenter", append([]string{"--net=" + nsx.Path(ns)}, c.cmd...)...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v: %s", c.cmd, err, out)
			}
			if n := changes(); n == n0 {
				t.Fatalf("no change counted when %v returned", c.cmd)
			}
			wantVoid(t, d, frame, "after the change")
		})
	}
	// Written under the count it now is, the set holds again.
	setNow()
	if ret, _ := runXDP(t, d, frame); ret != xdpRedirect {
		t.Errorf("verdict %d under the current count, want XDP_REDIRECT", ret)
	}
	msgs, _, err := s.Receive()
	if err != nil || len(msgs) == 0 || len(msgs[0].Data) < 4 {
		t.Errorf("the socket got %d messages (%v), want the notifications whole", len(msgs), err)
	}
}
