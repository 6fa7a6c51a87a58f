package prism_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/heartbeat"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/prism"
	"github.com/lanesnet/lanes/testbed"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestPrismSync applies prism-sync to the docker testbed's receiver and
// checks with real traffic that a high-priority stream runs to completion
// from XDP (decapsulated, redirected to its container's veth) in order and
// to that container only, that bulk and unlisted traffic keep the queues,
// that the agent withdraws the shortcut when a filter appears on the path
// and brings it back when it goes, and that reset restores every knob.
func TestPrismSync(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	src, c0, c1 := s.Containers[0], r.Containers[0], r.Containers[1]
	// The bridge learns the receiving containers' MACs from their traffic.
	overlaytest.UDPMost(t, c0.NetNS, src.NetNS, src.Addr.Addr(), 100)
	overlaytest.UDPMost(t, c1.NetNS, src.NetNS, src.Addr.Addr(), 100)
	before := modetest.Snapshot(t, tb)

	a := modetest.Apply(t, tb, "prism-sync", nil)
	if a.State.Plan.Agent != prism.SyncAgentName {
		t.Errorf("plan agent %q, want %q", a.State.Plan.Agent, prism.SyncAgentName)
	}
	dp := a.Open(t)
	if cfg, err := dp.Config(); err != nil || !cfg.Sync || !cfg.Prio {
		t.Fatalf("config %+v (%v): want priority classes and sync", cfg, err)
	}
	targets := func() string {
		t.Helper()
		ts, err := dp.Sync().Targets()
		if err != nil {
			t.Fatal(err)
		}
		return steer.FormatSync(ts)
	}
	applied := targets()
	for _, c := range []testbed.Container{c0, c1} {
		if !strings.Contains(applied, "/"+c.MAC.String()+">") {
			t.Errorf("sync destinations %q lack container %s (%s)", applied, c.Name, c.MAC)
		}
		if b, err := knobs.Feature(c.NetNS, c.Veth, ethtool.GRO).Read(); err != nil || string(b) != "on" {
			t.Errorf("%s GRO %q (%v), want on: its veth takes no redirected frames otherwise", c.NetNS, b, err)
		}
	}

	set := modetest.Prio(t, r.NetNS)
	for _, c := range []testbed.Container{c0, c1} {
		rule, err := steer.ParseRule("dst " + c.Addr.Addr().String() + " udp")
		if err != nil {
			t.Fatal(err)
		}
		if err := set.Add(rule); err != nil {
			t.Fatal(err)
		}
	}
	stream := overlaytest.Stream{Count: 5000, Size: 200, Burst: 100, Pause: time.Millisecond, CPU: 0}
	rx := func(c testbed.Container) uint64 {
		t.Helper()
		b, err := knobs.Sysfs(c.NetNS, "/sys/class/net/"+c.Veth+"/statistics/rx_packets").Read()
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	counters := func() steer.Counters {
		t.Helper()
		st, err := dp.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st[steer.StageSplit]
	}

	// A high-priority stream to c0: through the shortcut, in order, to
	// c0 alone.
	st0, c1rx := counters(), rx(c1)
	res := stream.Delivered(t, "high-priority stream on the shortcut", true, src.NetNS, c0.NetNS, c0.Addr.Addr())
	st1 := counters()
	if d := st1.Sync - st0.Sync; d < uint64(res.Received) {
		set, _ := dp.Sync().Get()
		t.Errorf("%d frames took the shortcut, %d datagrams arrived (counters %+v, set %s)", d, res.Received, st1.Sub(st0), steer.FormatSyncSet(set))
	}
	// A leak would be most of the stream; the slack is for what the
	// other container gets anyway (IPv6 neighbour discovery, multicast:
	// 12 frames were seen once).
	if d := rx(c1) - c1rx; d > 100 {
		t.Errorf("container %s received %d frames during a stream to %s", c1.Name, d, c0.Name)
	}
	flows, err := dp.Flows()
	if err != nil {
		t.Fatal(err)
	}
	onShortcut := 0
	for _, f := range flows {
		if f.Sync {
			onShortcut++
			if f.Dst != c0.Addr.Addr() || f.Proto != 17 {
				t.Errorf("flow %v:%d -> %v:%d proto %d on the shortcut", f.Src, f.SrcPort, f.Dst, f.DstPort, f.Proto)
			}
		}
	}
	if onShortcut == 0 {
		t.Error("no flow on the shortcut")
	}
	// Bulk TCP to the same container keeps the queues.
	overlaytest.TCP(t, src.NetNS, c0.NetNS, c0.Addr.Addr(), 1<<20)
	flows, _ = dp.Flows()
	for _, f := range flows {
		if f.Proto == 6 && (f.Sync || f.High) {
			t.Errorf("bulk TCP flow %v:%d -> %v:%d classified high", f.Src, f.SrcPort, f.Dst, f.DstPort)
		}
	}

	// A container the shortcut does not list: high priority, batch path.
	only0, err := dp.Sync().Get()
	if err != nil {
		t.Fatal(err)
	}
	only0.Targets = slices.DeleteFunc(only0.Targets, func(tg steer.SyncTarget) bool { return tg.MAC.String() == c1.MAC.String() })
	if err := netnsx.Do(r.NetNS, func() error { return dp.Sync().Set(only0, time.Hour) }); err != nil {
		t.Fatal(err)
	}
	st2 := counters()
	res = stream.Delivered(t, "high-priority stream without a destination", true, src.NetNS, c1.NetNS, c1.Addr.Addr())
	if st3 := counters(); st3.Sync != st2.Sync || st3.SyncMiss-st2.SyncMiss < uint64(res.Received) {
		t.Errorf("unlisted container: %d shortcut, %d misses for %d datagrams", st3.Sync-st2.Sync, st3.SyncMiss-st2.SyncMiss, res.Received)
	}

	// The agent puts c1 back (the bridge still forwards to it plainly),
	// withdraws everything while an nftables table exists in the host's
	// namespace, and restores the shortcut when the table is gone.
	ag, _, err := control.NewAgent(control.AgentOptions{NetNS: r.NetNS, StateDir: a.StateDir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	waitFor(t, "the agent to restore the destinations", func() bool { return targets() == applied })
	nft := func(args ...string) {
		t.Helper()
		out, err := exec.Command("nsenter", append([]string{"--net=" + nsx.Path(r.NetNS), "nft"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("nft %v: %v: %s", args, err, out)
		}
	}
	nft("add", "table", "inet", "lanes_sync_test")
	waitFor(t, "the agent to withdraw the shortcut under a filter table", func() bool { return targets() == "" })
	st4 := counters()
	res = stream.Delivered(t, "high-priority stream with a filter table on the host", true, src.NetNS, c0.NetNS, c0.Addr.Addr())
	if st5 := counters(); st5.Sync != st4.Sync {
		t.Errorf("%d frames took the shortcut past a filter table", st5.Sync-st4.Sync)
	}
	nft("delete", "table", "inet", "lanes_sync_test")
	waitFor(t, "the agent to restore the shortcut", func() bool { return targets() == applied })
	// The agent publishes its status after it writes the map, so the map
	// can show the change a moment before the status does.
	statusOK := func() bool {
		status, ok := ag.Status().(prism.SyncStatus)
		return ok && len(status.Targets) == 2 && status.Changes >= 3
	}
	for deadline := time.Now().Add(10 * time.Second); !statusOK() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !statusOK() {
		t.Errorf("agent status %+v (%T), want 2 targets after at least 3 changes", ag.Status(), ag.Status())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("agent: %v", err)
	}
	done <- nil // the deferred stop finds it stopped

	a.ResetAndCheck(t, before)
}

// learnedTestbed is the Docker testbed whose receiving bridge has learned
// the receiver's first container (c0) from its traffic to the sender's
// (src): the shortcut's destination.
func learnedTestbed(t *testing.T) (tb *testbed.Testbed, r, s *testbed.Host, src, c0 testbed.Container) {
	t.Helper()
	tb = modetest.UpTestbed(t, testbed.Docker)
	r, s = tb.Receiver(), tb.Sender()
	src, c0 = s.Containers[0], r.Containers[0]
	overlaytest.UDPMost(t, c0.NetNS, src.NetNS, src.Addr.Addr(), 100)
	return tb, r, s, src, c0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// nftIn runs nft in namespace ns.
func nftIn(t *testing.T, ns string, args ...string) {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + nsx.Path(ns), "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
}

// firewallVXLAN adds to ns a host firewall rule that drops every VXLAN
// datagram from peer, removed when the test ends.
func firewallVXLAN(t *testing.T, ns string, peer netip.Addr) {
	t.Helper()
	nftIn(t, ns, "add", "table", "inet", "lanes_fw")
	t.Cleanup(func() {
		exec.Command("nsenter", "--net="+nsx.Path(ns), "nft", "delete", "table", "inet", "lanes_fw").Run()
	})
	nftIn(t, ns, "add", "chain", "inet", "lanes_fw", "input", "{ type filter hook input priority 0 ; policy accept ; }")
	nftIn(t, ns, "add", "rule", "inet", "lanes_fw", "input", "ip", "saddr", peer.String(), "udp", "dport", "4789", "drop")
}

// With a host firewall on the path (a rule in the receiving host dropping
// all VXLAN from the other host) the shortcut stays off, and its agent
// starts, keeps it closed, and reads the path less often while it has no
// destination to vouch for. (What reaches the containers past such rules:
// TestPrismSyncFirewall.)
func TestPrismSyncHostFirewall(t *testing.T) {
	modetest.Online(t)
	tb, r, s, _, _ := learnedTestbed(t)
	before := modetest.Snapshot(t, tb)
	firewallVXLAN(t, r.NetNS, s.UnderlayAddr.Addr())
	a := modetest.Apply(t, tb, "prism-sync", map[string]string{"sync-interval": "100ms"})
	if notes := strings.Join(a.State.Plan.Notes, "\n"); !strings.Contains(notes, `"inet lanes_fw"`) || !strings.Contains(notes, "sync off") {
		t.Errorf("plan notes %q do not say the firewall's table turned sync off", a.State.Plan.Notes)
	}
	dp := a.Open(t)
	ag, stop := a.StartAgent(t)
	waitFor(t, "the agent's first round", func() bool {
		st, ok := ag.Status().(prism.SyncStatus)
		return ok && st.Refreshes > 0
	})
	if ts, _ := dp.Sync().Targets(); len(ts) != 0 {
		t.Errorf("the agent opened destinations %v past the firewall", ts)
	}
	// Vouching for nothing, it reads the path every tenth interval (and
	// on changes: none here), not every 100 ms. A slow machine only
	// makes the rounds fewer.
	r0 := ag.Status().(prism.SyncStatus).Refreshes
	time.Sleep(1500 * time.Millisecond)
	if r1 := ag.Status().(prism.SyncStatus).Refreshes; r1 > r0+2 {
		t.Errorf("%d rounds in 1.5 s at sync-interval=100ms with no destination to vouch for, want at most 2", r1-r0)
	}
	stop()
	a.ResetAndCheck(t, before)
}

// A filter appearing on the path withdraws the destinations at once (the
// nftables notification, not the agent's interval, which is a minute
// here), and they come back when it goes.
func TestPrismSyncWithdrawsAtOnce(t *testing.T) {
	modetest.Online(t)
	tb, r, s, _, c0 := learnedTestbed(t)
	before := modetest.Snapshot(t, tb)
	a := modetest.Apply(t, tb, "prism-sync", map[string]string{"sync-interval": "1m"})
	dp := a.Open(t)
	targets := func() string {
		ts, err := dp.Sync().Targets()
		if err != nil {
			t.Fatal(err)
		}
		return steer.FormatSync(ts)
	}
	applied := targets()
	if !strings.Contains(applied, c0.MAC.String()) {
		t.Fatalf("destinations %q lack %s", applied, c0.MAC)
	}
	ag, stop := a.StartAgent(t)
	waitFor(t, "the agent's rounds and its destinations (premise)", func() bool {
		st, ok := ag.Status().(prism.SyncStatus)
		return ok && st.Refreshes > 0 && st.Watch == "" && targets() == applied
	})
	at := time.Now()
	firewallVXLAN(t, r.NetNS, s.UnderlayAddr.Addr())
	waitFor(t, "the destinations to be withdrawn", func() bool { return targets() == "" })
	if d := time.Since(at); d > 5*time.Second {
		t.Errorf("withdrawn after %v", d)
	}
	// A round another event asked for (the guard's, when PRISM stops
	// standing aside) may read the table first; the notification still
	// withdraws, within the same 5 s.
	withdrawn := func(st prism.SyncStatus) bool {
		return st.Withdrawals > 0 && strings.Contains(st.Withdrawn, "nftables")
	}
	st := ag.Status().(prism.SyncStatus)
	for ; !withdrawn(st) && time.Since(at) < 5*time.Second; st = ag.Status().(prism.SyncStatus) {
		time.Sleep(20 * time.Millisecond)
	}
	if !withdrawn(st) {
		t.Errorf("status %+v: want a withdrawal for an nftables change", st)
	}
	nftIn(t, r.NetNS, "delete", "table", "inet", "lanes_fw")
	waitFor(t, "the destinations to come back", func() bool { return targets() == applied })
	stop()
	a.ResetAndCheck(t, before)
}

// A dead agent leaves the shortcut closed: once the agent stops renewing
// them, the destinations lapse, and high-priority frames take the batch
// path. The premise is a destination in the datapath when the agent stops:
// a change the agent sees (here a link change the test makes, as the
// apply's own changes can make late) withdraws every destination until
// its next round writes them back, and an agent stopped in between would
// leave nothing to lapse. So the test waits for the destination to be
// back before it stops the agent, and checks it is still there after.
func TestPrismSyncFailsClosed(t *testing.T) {
	modetest.Online(t)
	tb, r, _, src, c0 := learnedTestbed(t)
	a, dp := applyMarked(t, tb, r, c0, "100ms")
	has := hasTarget(t, dp, c0)
	for try := 1; ; try++ {
		ag, stop := a.StartAgent(t)
		status := func() prism.SyncStatus { st, _ := ag.Status().(prism.SyncStatus); return st }
		waitFor(t, "the agent's rounds and c0's destination (premise)", func() bool { return status().Refreshes > 1 && has() })
		if try == 1 {
			linkChange(t, r.NetNS, c0.HostVeth)
			waitFor(t, "the link change to withdraw the destinations (premise)", func() bool { return status().Withdrawals > 0 })
			waitFor(t, "c0's destination back after the withdrawal (premise)", func() bool { return has() && status().Refreshes > 1 })
		}
		stop() // as a crash would: nothing renews the destinations from here
		if has() {
			break
		}
		if try == 3 {
			t.Fatalf("premise: c0's destination was gone when the agent stopped, %d times (last withdrawn: %s)", try, status().Withdrawn)
		}
		t.Logf("c0's destination withdrawn as the agent stopped (%s): again", status().Withdrawn)
	}
	time.Sleep(1500 * time.Millisecond) // the lifetime: 3 rounds + 1 s
	if ts, _ := dp.Sync().Targets(); len(ts) != 0 {
		t.Errorf("destinations %v outlived their agent", ts)
	}
	st0, _ := dp.Stats()
	res := overlaytest.Stream{Count: 200, Size: 200, Burst: 50, Pause: time.Millisecond, CPU: 0}.Run(t, src.NetNS, c0.NetNS, c0.Addr.Addr())
	st1, _ := dp.Stats()
	if d := st1[steer.StageSplit].Sub(st0[steer.StageSplit]); d.Sync != 0 || d.SyncExpired < uint64(res.Received) {
		t.Errorf("after the agent stopped: %d on the shortcut, %d expired, %d received", d.Sync, d.SyncExpired, res.Received)
	}
}

// linkChange makes the kernel announce a change of device dev in ns (its
// alias set, and cleared when the test ends).
func linkChange(t *testing.T, ns, dev string) {
	t.Helper()
	set := func(alias string) error {
		return netnsx.Do(ns, func() error {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return err
			}
			return netlink.LinkSetAlias(l, alias)
		})
	}
	if err := set("lanes-test"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set("") })
}

// The frames the shortcut takes skip the bridge, whose learning would
// have kept the sender's forwarding entry fresh; the agent refreshes it
// in their stead, so the entry outlives the bridge's ageing time while
// the sender's frames arrive on the shortcut (else the replies would
// flood every port).
func TestPrismSyncKeepsBridgeFDB(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	src, c0 := s.Containers[0], r.Containers[0]
	ageing := knobs.Sysfs(r.NetNS, "/sys/class/net/"+r.Bridge+"/bridge/ageing_time")
	old, err := ageing.Read()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ageing.Write(old) })
	if err := ageing.Write([]byte("300")); err != nil { // 3 s
		t.Fatal(err)
	}
	overlaytest.UDPMost(t, c0.NetNS, src.NetNS, src.Addr.Addr(), 100)
	// The receiving container only receives here, so its own entry would
	// age too (and the shortcut rightly stop): a static one keeps it.
	c0Entry := &netlink.Neigh{Family: unix.AF_BRIDGE, State: netlink.NUD_NOARP, Flags: netlink.NTF_MASTER, HardwareAddr: c0.MAC}
	if err := netnsx.Do(r.NetNS, func() error {
		veth, err := netlink.LinkByName(c0.HostVeth)
		if err != nil {
			return err
		}
		c0Entry.LinkIndex = veth.Attrs().Index
		return netlink.NeighSet(c0Entry)
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netnsx.Do(r.NetNS, func() error { return netlink.NeighDel(c0Entry) }) })
	// A stream this light would step PRISM aside, off the shortcut: the
	// test needs its frames there.
	a := modetest.Apply(t, tb, "prism-sync", map[string]string{"sync-interval": "200ms", "aside-below": "0"})
	dp := a.Open(t)
	if err := modetest.Prio(t, r.NetNS).Add(modetest.Rule(t, "dst "+c0.Addr.Addr().String()+" udp")); err != nil {
		t.Fatal(err)
	}
	a.StartAgent(t)
	// Every deletion of the sender's entry while the stream runs.
	ns, err := netnsx.Open(r.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	updates, done := make(chan netlink.NeighUpdate, 256), make(chan struct{})
	if err := netlink.NeighSubscribeWithOptions(updates, done, netlink.NeighSubscribeOptions{Namespace: &ns}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	deleted := 0
	go func() {
		for u := range updates {
			if u.Type == unix.RTM_DELNEIGH && u.Family == unix.AF_BRIDGE && u.Flags&netlink.NTF_SELF == 0 && u.HardwareAddr.String() == src.MAC.String() {
				mu.Lock()
				deleted++
				mu.Unlock()
			}
		}
	}()
	st0, _ := dp.Stats()
	res := overlaytest.Stream{Count: 700, Size: 100, Burst: 1, Pause: 10 * time.Millisecond, CPU: 0}.Run(t, src.NetNS, c0.NetNS, c0.Addr.Addr())
	st1, _ := dp.Stats()
	close(done)
	if d := st1[steer.StageSplit].Sync - st0[steer.StageSplit].Sync; d < uint64(res.Received)*9/10 {
		t.Errorf("%d of %d datagrams on the shortcut: the test needs the sender's frames there", d, res.Received)
	}
	mu.Lock()
	defer mu.Unlock()
	if deleted > 0 {
		t.Errorf("the bridge forgot %s (the sender) %d times while its frames took the shortcut for 7 s (ageing time 3 s)", src.MAC, deleted)
	}
}

// The sync agent degrades instead of dying: a container's device removed
// under it, or its namespace, ends nothing; the agent goes on, with the
// shortcut to what is left.
func TestPrismSyncAgentSurvivesFaults(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	src := s.Containers[0]
	var cs []testbed.Container
	for range 2 {
		c, err := testbed.AddContainer(tb.Config.Prefix, 2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { testbed.RemoveContainer(tb.Config.Prefix, 2, c.Name) })
		overlaytest.UDPMost(t, c.NetNS, src.NetNS, src.Addr.Addr(), 100)
		cs = append(cs, c)
	}
	// Stepped aside on an idle testbed, the agent would wait with its
	// rounds (TestPrismSyncPausesWhileAside): off here.
	a := modetest.Apply(t, tb, "prism-sync", map[string]string{"sync-interval": "100ms", "aside-below": "0"})
	dp := a.Open(t)
	ag, stop := a.StartAgent(t)
	defer stop()
	has := func(c testbed.Container) bool {
		ts, err := dp.Sync().Targets()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(steer.FormatSync(ts), "/"+c.MAC.String()+">")
	}
	waitFor(t, "both containers on the shortcut", func() bool { return has(cs[0]) && has(cs[1]) })
	rounds := func() uint64 { return ag.Status().(prism.SyncStatus).Refreshes }

	// The device, under the agent.
	if err := netnsx.Do(r.NetNS, func() error {
		l, err := netlink.LinkByName(cs[0].HostVeth)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the removed device's destination to go", func() bool { return !has(cs[0]) })
	// The namespace, under the agent.
	if err := testbed.RemoveContainer(tb.Config.Prefix, 2, cs[1].Name); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the removed namespace's destination to go", func() bool { return !has(cs[1]) })
	n := rounds()
	waitFor(t, "the agent to go on", func() bool { return rounds() > n+2 })
}

// While PRISM stands aside (an idle testbed: the NIC's polls find nothing)
// marked frames take the NIC poll, not the shortcut, and the agent's
// rounds wait: the status says so, and the destinations lapse by their
// deadline.
func TestPrismSyncPausesWhileAside(t *testing.T) {
	modetest.Online(t)
	tb, _, _, _, _ := learnedTestbed(t)
	a := modetest.Apply(t, tb, "prism-sync", map[string]string{"sync-interval": "100ms"})
	dp := a.Open(t)
	ag, stop := a.StartAgent(t)
	defer stop()
	status := func() prism.SyncStatus { return ag.Status().(prism.SyncStatus) }
	waitFor(t, "the rounds to wait for PRISM standing aside", func() bool { return status().Aside })
	if !strings.Contains(strings.Join(status().Summary(), "\n"), "rounds paused") {
		t.Errorf("status %q does not say the rounds wait", status().Summary())
	}
	// asides counts PRISM's steps aside: unchanged over the window, with
	// PRISM aside at both ends, it stood aside throughout (stray frames
	// on the testbed can bring the queues back for a while, and rounds
	// with them).
	asides := func(st prism.SyncStatus) uint64 {
		if st.Guard == nil || st.Guard.High == nil || st.Guard.High.Aside == nil {
			t.Fatalf("status %+v: no aside state", st)
		}
		return st.Guard.High.Aside.Asides
	}
	st0 := status()
	time.Sleep(1500 * time.Millisecond) // the destinations' lifetime at 100 ms: 3 rounds + 1 s
	st := status()
	ts, _ := dp.Sync().Targets()
	if !st.Aside || asides(st) != asides(st0) {
		t.Skipf("PRISM did not stand aside throughout the window (%d steps aside)", asides(st)-asides(st0))
	}
	if st.Refreshes > st0.Refreshes+1 {
		t.Errorf("%d rounds in 1.5 s standing aside, want at most one", st.Refreshes-st0.Refreshes)
	}
	if len(ts) != 0 {
		t.Errorf("destinations %v held past their deadline while the rounds waited", ts)
	}
}

// A firewall rule a test puts in the receiving host: add puts it in and
// returns what takes it out (also run when the test ends).
type firewallRule struct {
	name string
	add  func(t *testing.T, r, s *testbed.Host, dst testbed.Container) (del func())
}

// firewallRules are the kinds of rule that drop an overlay flow before it
// reaches its container: on the outer datagram's way to the VXLAN socket
// (iptables INPUT, an nftables verdict map) and on the inner frame's way
// through the bridge (iptables FORWARD, which br_netfilter runs for bridged
// frames with bridge-nf-call-iptables on, as Docker sets it).
var firewallRules = []firewallRule{
	{"iptables INPUT drop of VXLAN from the peer", func(t *testing.T, r, s *testbed.Host, _ testbed.Container) func() {
		return iptablesRule(t, r.NetNS, "INPUT", "-s", s.UnderlayAddr.Addr().String(), "-p", "udp", "--dport", strconv.Itoa(r.Port), "-j", "DROP")
	}},
	{"nftables verdict map dropping VXLAN from the peer", func(t *testing.T, r, s *testbed.Host, _ testbed.Container) func() {
		return nftVmap(t, r.NetNS, fmt.Sprintf("udp dport %d ip saddr vmap { %s : drop }", r.Port, s.UnderlayAddr.Addr()))
	}},
	{"nftables verdict map keyed by the peer and the VXLAN port", func(t *testing.T, r, s *testbed.Host, _ testbed.Container) func() {
		return nftVmap(t, r.NetNS, fmt.Sprintf("ip saddr . udp dport vmap { %s . %d : drop }", s.UnderlayAddr.Addr(), r.Port))
	}},
	{"iptables FORWARD drop of the container with bridge-nf-call-iptables on", func(t *testing.T, r, _ *testbed.Host, dst testbed.Container) func() {
		call := knobs.Sysctl(r.NetNS, "net.bridge.bridge-nf-call-iptables")
		old, err := call.Read()
		if err != nil {
			t.Skipf("br_netfilter is not in this kernel (%v): bridged frames meet no iptables rule, so there is no FORWARD rule to test", err)
		}
		if err := call.Write([]byte("1")); err != nil {
			t.Fatal(err)
		}
		del := iptablesRule(t, r.NetNS, "FORWARD", "-d", dst.Addr.Addr().String(), "-j", "DROP")
		return once(t, func() {
			del()
			if err := call.Write(old); err != nil {
				t.Errorf("putting bridge-nf-call-iptables back: %v", err)
			}
		})
	}},
}

// nftVmap adds rule to the input chain of a table of its own in ns, in
// one transaction.
func nftVmap(t *testing.T, ns, rule string) (del func()) {
	t.Helper()
	script := "table inet lanes_vmap {\n chain input {\n  type filter hook input priority 0; policy accept;\n  " + rule + "\n }\n}\n"
	cmd := exec.Command("nsenter", "--net="+nsx.Path(ns), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f %q: %v: %s", script, err, out)
	}
	return once(t, func() { nftIn(t, ns, "delete", "table", "inet", "lanes_vmap") })
}

// iptablesRule appends a rule to chain of iptables' filter table in ns.
// iptables must be iptables-nft: its table is then an nftables table,
// which del removes whole where the rule made it, leaving the namespace
// as it was (a legacy table, once made, stays); a table that was there
// before keeps all but the rule.
func iptablesRule(t *testing.T, ns, chain string, rule ...string) (del func()) {
	t.Helper()
	if out, err := exec.Command("iptables", "-V").CombinedOutput(); err != nil || !strings.Contains(string(out), "nf_tables") {
		t.Skipf("iptables is not iptables-nft (%q, %v): a legacy table could not be removed from the testbed", out, err)
	}
	had := exec.Command("nsenter", "--net="+nsx.Path(ns), "nft", "list", "table", "ip", "filter").Run() == nil
	ipt := func(args ...string) error {
		out, err := exec.Command("nsenter", append([]string{"--net=" + nsx.Path(ns), "iptables", "-w"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables %v: %v: %s", args, err, out)
		}
		return nil
	}
	if err := ipt(append([]string{"-A", chain}, rule...)...); err != nil {
		t.Fatal(err)
	}
	return once(t, func() {
		if err := ipt(append([]string{"-D", chain}, rule...)...); err != nil {
			t.Error(err)
		}
		if !had {
			nftIn(t, ns, "delete", "table", "ip", "filter")
		}
	})
}

// once returns f to run once, now or when the test ends.
func once(t *testing.T, f func()) func() {
	var o sync.Once
	g := func() { o.Do(f) }
	t.Cleanup(g)
	return g
}

// udpFlow is one UDP flow between two containers, sent in rounds on the
// same sockets (one 5-tuple), each datagram carrying its sequence number.
type udpFlow struct {
	rc, sc *net.UDPConn
	next   uint64
}

func newUDPFlow(t *testing.T, src, dst testbed.Container) *udpFlow {
	t.Helper()
	rc, sc := overlaytest.UDPPair(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 8<<20)
	t.Cleanup(func() { rc.Close(); sc.Close() })
	return &udpFlow{rc: rc, sc: sc}
}

// send sends n datagrams (bursts of 50 a millisecond apart) and returns
// how many of them arrived; one that comes later than 300 ms after the
// last arrival counts as lost (and not in a later round).
func (f *udpFlow) send(t *testing.T, n int) int {
	t.Helper()
	from := f.next
	msg := make([]byte, 200)
	for i := range n {
		binary.BigEndian.PutUint64(msg, f.next)
		f.next++
		if _, err := f.sc.Write(msg); err != nil {
			t.Fatalf("sending: %v", err)
		}
		if (i+1)%50 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	got := 0
	buf := make([]byte, 2048)
	for {
		f.rc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		m, err := f.rc.Read(buf)
		if err != nil {
			return got
		}
		if seq := binary.BigEndian.Uint64(buf); m >= 8 && seq >= from && seq < f.next {
			got++
		}
	}
}

// No mode that takes a shortcut past netfilter (PRISM-sync, as prism-sync
// and as prism with prio-mode=sync) delivers a datagram of a marked flow
// that a firewall rule drops, and vanilla drops, for each kind of rule
// (firewallRules), whether the rule came before the apply or while the
// flow ran on the shortcut. Vanilla runs the same flow past the same rule
// at the same moment first, and delivers none of it (the rule's premise).
// A rule added while the flow runs counts the datagrams sent after the
// command that added it returned.
func TestPrismSyncFirewall(t *testing.T) {
	modetest.Online(t)
	tb, r, s, src, c0 := learnedTestbed(t)
	const n = 200
	// Stepped aside on an idle testbed, marked frames would take the NIC
	// poll, not the shortcut: off here, so the shortcut is what is tried.
	modes := []struct {
		mode   string
		params map[string]string
	}{
		{"prism-sync", map[string]string{"aside-below": "0"}},
		{"prism", map[string]string{"prio-mode": "sync", "aside-below": "0"}},
	}
	for _, m := range modes {
		for _, rule := range firewallRules {
			for _, during := range []bool{false, true} {
				when := "before the apply"
				if during {
					when = "while the flow runs"
				}
				t.Run(m.mode+"/"+rule.name+"/"+when, func(t *testing.T) {
					before := modetest.Snapshot(t, tb)
					f := newUDPFlow(t, src, c0)
					if during {
						if got := f.send(t, n); got < n*9/10 {
							t.Fatalf("premise: vanilla delivered %d of %d datagrams with no rule", got, n)
						}
					}
					del := rule.add(t, r, s, c0)
					if got := f.send(t, n); got != 0 {
						t.Fatalf("premise: vanilla delivered %d of %d datagrams past the rule: it does not drop the flow", got, n)
					}
					if during {
						del()
					}
					a := modetest.Apply(t, tb, m.mode, m.params)
					dp := a.Open(t)
					if err := modetest.Prio(t, r.NetNS).Add(modetest.Rule(t, "dst "+c0.Addr.Addr().String()+" udp")); err != nil {
						t.Fatal(err)
					}
					ag, stop := a.StartAgent(t)
					waitFor(t, "the agent's first round", func() bool {
						st, ok := ag.Status().(prism.SyncStatus)
						return ok && st.Refreshes > 0
					})
					shortcut := func() uint64 {
						st, err := dp.Stats()
						if err != nil {
							t.Fatal(err)
						}
						return st[steer.StageSplit].Sync
					}
					if during {
						waitFor(t, "c0's destination (premise)", func() bool {
							ts, err := dp.Sync().Targets()
							return err == nil && strings.Contains(steer.FormatSync(ts), "/"+c0.MAC.String()+">")
						})
						sc0 := shortcut()
						got := f.send(t, n)
						if d := shortcut() - sc0; got < n*9/10 || d < uint64(got) {
							t.Fatalf("premise: %d of %d datagrams arrived, %d frames on the shortcut: the flow must run there before the rule", got, n, d)
						}
						rule.add(t, r, s, c0)
						added := time.Now()
						sc0 = shortcut()
						// The kernel counted the rule's notification
						// before the command returned, which voided the
						// destinations, whenever the agent reads it.
						if got := f.send(t, n); got != 0 {
							t.Errorf("%s delivered %d of %d datagrams sent right after the rule was added (vanilla: 0), %d frames on the shortcut", m.mode, got, n, shortcut()-sc0)
						}
						// Then once the agent has read the path again.
						waitFor(t, "a round of the agent begun after the rule was added", func() bool {
							st, _ := ag.Status().(prism.SyncStatus)
							return st.At.After(added)
						})
					}
					sc0 := shortcut()
					if got := f.send(t, n); got != 0 {
						t.Errorf("%s delivered %d of %d datagrams sent after the rule was in place (vanilla: 0), %d frames on the shortcut", m.mode, got, n, shortcut()-sc0)
					}
					stop()
					a.ResetAndCheck(t, before)
				})
			}
		}
	}
}

// A reset under a running sync agent makes its journal stale: the agent
// ends (knobs.ErrStale), as the guard and the follower do, rather than
// serve a plan that is gone and keep the pod unready for good.
func TestPrismSyncEndsWhenStale(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Docker)
	a := modetest.Apply(t, tb, "prism-sync", map[string]string{"sync-interval": "100ms"})
	ag, _, err := control.NewAgent(control.AgentOptions{NetNS: a.NS, StateDir: a.StateDir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	waitFor(t, "the agent's first round", func() bool {
		st, ok := ag.Status().(prism.SyncStatus)
		return ok && st.Refreshes > 0
	})
	a.Reset(t)
	select {
	case err := <-done:
		if !errors.Is(err, knobs.ErrStale) {
			t.Errorf("the agent ended with %v, want ErrStale", err)
		}
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Errorf("the agent still ran 30 s after the reset")
	}
}

// A netlink subscription that fails under the sync agent withdraws every
// destination, the status saying why, and the agent subscribes again: a
// change after that is seen (withdrawn at once, the interval a minute).
func TestPrismSyncWatchResubscribes(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Docker)
	r := tb.Receiver()
	watches := make(chan func(), 4)
	defer prism.OnWatch(func(b func()) { watches <- b })()
	a := modetest.Apply(t, tb, "prism-sync", map[string]string{"sync-interval": "1m"})
	ag, stop := a.StartAgent(t)
	defer stop()
	status := func() prism.SyncStatus { return ag.Status().(prism.SyncStatus) }
	var breakIt func()
	select {
	case breakIt = <-watches:
	case <-time.After(30 * time.Second):
		t.Fatalf("premise: the agent subscribes: status %+v", status())
	}
	waitFor(t, "the agent's first round", func() bool { return status().Refreshes > 0 && status().Watch == "" })
	n := status().Withdrawals
	breakIt()
	waitFor(t, "a withdrawal for the failed watch", func() bool {
		st := status()
		return st.Withdrawals > n && strings.Contains(st.Withdrawn, "netlink watch failed")
	})
	select {
	case <-watches:
	case <-time.After(30 * time.Second):
		t.Fatalf("the agent did not subscribe again: status %+v", status())
	}
	waitFor(t, "the status to say the watch is back", func() bool { return status().Watch == "" })
	n = status().Withdrawals
	err := nsx.Do(r.NetNS, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lw-resub"}, PeerName: "lw-resub-p"})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nsx.Do(r.NetNS, func() error {
			l, err := netlink.LinkByName("lw-resub")
			if err == nil {
				err = netlink.LinkDel(l)
			}
			return err
		})
	})
	waitFor(t, "the new watch to see a link change", func() bool {
		st := status()
		return st.Withdrawals > n && strings.Contains(st.Withdrawn, "link")
	})
}

// applyMarked applies prism-sync to r at sync-interval interval, with a
// priority rule marking c's UDP. It never stands aside: stepped aside,
// marked frames would take the NIC poll, not the shortcut, whatever its
// destinations.
func applyMarked(t *testing.T, tb *testbed.Testbed, r *testbed.Host, c testbed.Container, interval string) (*modetest.Applied, *steer.Datapath) {
	t.Helper()
	a := modetest.Apply(t, tb, "prism-sync", map[string]string{"sync-interval": interval, "aside-below": "0"})
	dp := a.Open(t)
	if err := modetest.Prio(t, r.NetNS).Add(modetest.Rule(t, "dst "+c.Addr.Addr().String()+" udp")); err != nil {
		t.Fatal(err)
	}
	return a, dp
}

// syncTarget says whether the datapath lists c's destination.
func syncTarget(dp *steer.Datapath, c testbed.Container) (bool, error) {
	ts, err := dp.Sync().Targets()
	return strings.Contains(steer.FormatSync(ts), "/"+c.MAC.String()+">"), err
}

// hasTarget is syncTarget on the test's goroutine, failing it on an error.
func hasTarget(t *testing.T, dp *steer.Datapath, c testbed.Container) func() bool {
	return func() bool {
		ok, err := syncTarget(dp, c)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
}

// With no netlink watch live, nothing counts the nftables and IPsec
// changes on the path: the agent writes no destination, whatever the path
// allows, withdraws those the apply wrote, and its status says why. Once
// it can subscribe, the destinations come.
func TestPrismSyncNoWatchNoDestination(t *testing.T) {
	modetest.Online(t)
	tb, _, _, _, c0 := learnedTestbed(t)
	undo := prism.RefuseWatch()
	defer undo()
	a := modetest.Apply(t, tb, "prism-sync", map[string]string{"sync-interval": "100ms", "aside-below": "0"})
	dp := a.Open(t)
	has := hasTarget(t, dp, c0)
	if !has() {
		t.Fatalf("premise: the apply wrote c0's destination")
	}
	ag, stop := a.StartAgent(t)
	defer stop()
	status := func() prism.SyncStatus { return ag.Status().(prism.SyncStatus) }
	waitFor(t, "three rounds", func() bool { return status().Refreshes >= 3 })
	if has() {
		t.Errorf("c0's destination after %d rounds with no watch (status %+v)", status().Refreshes, status())
	}
	if st := status(); !strings.Contains(st.Watch, "subscriptions refused") || len(st.Targets) != 0 {
		t.Errorf("status %+v: want no target and the watch's failure", st)
	}
	undo()
	waitFor(t, "c0's destination once the agent subscribes", has)
}

// An nftables change the agent's first round did not read and that came
// before its watch counted changes (here a table dropping the peer's
// VXLAN, added as the agent subscribes) never lets a frame past it on the
// shortcut: that round writes no destination (it withdraws the apply's)
// before its watch is live, and the round after reads the table.
func TestPrismSyncSubscribesBeforeItWrites(t *testing.T) {
	modetest.Online(t)
	tb, r, s, src, c0 := learnedTestbed(t)
	a, dp := applyMarked(t, tb, r, c0, "1m")
	if ok, err := syncTarget(dp, c0); err != nil || !ok {
		t.Fatalf("premise: the apply wrote c0's destination (%v)", err)
	}
	table := fmt.Sprintf("table inet lanes_fw {\n chain input {\n  type filter hook input priority 0; policy accept;\n  ip saddr %s udp dport %d drop\n }\n}\n", s.UnderlayAddr.Addr(), r.Port)
	t.Cleanup(func() {
		exec.Command("nsenter", "--net="+nsx.Path(r.NetNS), "nft", "delete", "table", "inet", "lanes_fw").Run()
	})
	type early struct {
		wrote bool
		err   error
	}
	first := make(chan early, 1)
	var once sync.Once
	defer prism.BeforeWatch(func() {
		once.Do(func() {
			var e early
			e.wrote, e.err = syncTarget(dp, c0)
			if e.err == nil {
				cmd := exec.Command("nsenter", "--net="+nsx.Path(r.NetNS), "nft", "-f", "-")
				cmd.Stdin = strings.NewReader(table)
				if out, err := cmd.CombinedOutput(); err != nil {
					e.err = fmt.Errorf("nft -f %q: %v: %s", table, err, out)
				}
			}
			first <- e
		})
	})()
	watches := make(chan func(), 4)
	defer prism.OnWatch(func(b func()) { watches <- b })()
	_, stop := a.StartAgent(t)
	defer stop()
	var e early
	select {
	case e = <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("premise: the agent subscribes")
	}
	if e.err != nil {
		t.Fatalf("premise: %v", e.err)
	}
	if e.wrote {
		t.Errorf("the round before the watch left c0's destination in place")
	}
	select {
	case <-watches:
	case <-time.After(30 * time.Second):
		t.Fatal("premise: the agent's watch is live")
	}
	st0, _ := dp.Stats()
	got := newUDPFlow(t, src, c0).send(t, 200)
	st1, _ := dp.Stats()
	if d := st1[steer.StageSplit].Sub(st0[steer.StageSplit]); got != 0 || d.Sync != 0 {
		t.Errorf("%d of 200 datagrams delivered past the table, %d frames on the shortcut; want none", got, d.Sync)
	}
}

// testClock is a clock a test moves, read by other goroutines.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *testClock) add(d time.Duration) { c.ns.Add(int64(d)) }

// A round that waits for the CPU (SCHED_IDLE on a busy host) is no hang:
// the agent's liveness holds past the loop's due time while it waits.
// One that never ends is a hang once it waited five dozes.
func TestPrismSyncStarvedRoundIsNotStuck(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Docker)
	a := modetest.Apply(t, tb, "prism-sync", map[string]string{"sync-interval": "100ms", "aside-below": "0"})
	clock := &testClock{}
	board := heartbeat.NewBoard(clock.now)
	ag, _, err := control.NewAgent(control.AgentOptions{NetNS: a.NS, StateDir: a.StateDir, Logf: t.Logf, Beats: board})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	held, release := prism.HoldSyncRound()
	defer func() {
		release()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("premise: a round starts")
	}
	stuck := func() string {
		for _, s := range heartbeat.Stuck(board.Loops()) {
			if strings.HasPrefix(s, "prism-sync rounds") {
				return s
			}
		}
		return ""
	}
	clock.add(heartbeat.StaleAfter + time.Second)
	if s := stuck(); s != "" {
		t.Errorf("a round waiting %v is taken for a hang: %s", heartbeat.StaleAfter+time.Second, s)
	}
	clock.add(10 * time.Minute)
	if s := stuck(); s == "" {
		t.Errorf("a round waiting 10 min is not taken for a hang: loops %+v", board.Loops())
	}
}
