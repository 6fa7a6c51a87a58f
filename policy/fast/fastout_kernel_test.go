package fast_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/fast"
	"github.com/lanesnet/lanes/testbed"
)

// On every layout, flows from a container on the host lanes runs on (the
// receiver) back to the other host's, once their first packets took the
// kernel's path, leave the host on the fast path out: a UDP flow's
// datagrams are all counted there and arrive, in order, with the payload,
// TTL and TOS the kernel's path delivered (the same flow through vanilla
// first), the VXLAN device sending none of them; a TCP request-response
// exchange and a bulk transfer through a socket with TSO on (GSO frames)
// take it and arrive intact. An nftables output rule dropping the flow,
// added while it runs on the fast path out, drops every datagram sent
// after the command returned; with the agent killed (SIGKILL), nothing
// takes the fast path out once its lease has passed and the kernel's path
// delivers everything. Reset restores every knob.
func TestFastOutTestbed(t *testing.T) {
	for _, topo := range []testbed.Topology{testbed.Docker, testbed.Flannel, testbed.Calico} {
		t.Run(string(topo), func(t *testing.T) { testFastOut(t, topo) })
	}
}

func testFastOut(t *testing.T, topo testbed.Topology) {
	const n, bulk = 200, 4 << 20
	tb := modetest.UpTestbed(t, topo)
	r, s := tb.Receiver(), tb.Sender()
	src, dst := r.Containers[0], s.Containers[0]
	f, vanilla, before := vanillaFlow(t, tb, src, dst, n)
	dropOut := fmt.Sprintf("ip daddr %s udp dport %d drop", s.UnderlayAddr.Addr(), r.Port)
	del := nftRule(t, r, "output", dropOut)
	if got := f.send(t, n); len(got) != 0 {
		t.Fatalf("premise: vanilla delivered %d of %d datagrams past the output rule", len(got), n)
	}
	del()

	a := modetest.Apply(t, tb, fast.Mode, map[string]string{"x-interval": "100ms"})
	dp := a.Open(t)
	kill := startAgentProcess(t, a)
	onFastOut := func() {
		t.Helper()
		waitVouched(t, dp, f, "the flow's entry out", func() (int, error) { es, err := dp.Fast().OutEntries(); return len(es), err })
	}
	onFastOut()
	tx0, c0 := vxlanStats(t, r).TxPackets, counters(t, dp)
	got := f.send(t, n)
	same(t, "on the fast path out", got, vanilla, n)
	c := counters(t, dp).Sub(c0)
	if tx := vxlanStats(t, r).TxPackets - tx0; tx >= n || c.FastOut < n {
		t.Errorf("%s sent %d packets of %d datagrams, %d frames took the fast path out (counters %+v): want the fast path to carry them", r.VXLAN, tx, n, c.FastOut, c)
	}

	// lanes fast list shows the flow's entry out.
	ft, err := control.OpenFast(a.NS)
	if err != nil {
		t.Fatal(err)
	}
	es, err := ft.List()
	ft.Close()
	if err != nil || !strings.Contains(strings.Join(es, "\n"), "out "+src.Addr.Addr().String()+":") {
		t.Errorf("lanes fast list: %q, %v: want the flow's entry out", es, err)
	}

	c0 = counters(t, dp)
	tcpRR(t, src, dst, 50)
	if c := counters(t, dp).Sub(c0); c.FastOut == 0 {
		t.Errorf("no TCP segment took the fast path out (counters %+v)", c)
	}

	tx0, c0 = vxlanStats(t, r).TxPackets, counters(t, dp)
	overlaytest.TCP(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), bulk)
	c = counters(t, dp).Sub(c0)
	if tx := vxlanStats(t, r).TxPackets - tx0; c.FastOut == 0 || tx >= c.FastOut {
		t.Errorf("TCP bulk: %d frames took the fast path out, %s sent %d (counters %+v): want the fast path to carry most", c.FastOut, r.VXLAN, tx, c)
	}
	// Fewer frames than full-sized segments would take: GSO frames took it.
	if c.FastOut >= bulk/1500 {
		t.Errorf("TCP bulk: %d frames for %d bytes took the fast path out: want GSO frames among them", c.FastOut, bulk)
	}

	// A firewall rule on the way out, added while the flow is on the fast
	// path out, drops every datagram sent after the command returned.
	onFastOut()
	del = nftRule(t, r, "output", dropOut)
	if got := f.send(t, n); len(got) != 0 {
		t.Errorf("%d of %d datagrams sent after an output rule dropping them was added were delivered", len(got), n)
	}
	del()

	// With the agent killed, nothing takes the fast path out once its
	// lease has passed, and the kernel's path delivers everything.
	onFastOut()
	lapse(t, dp, kill)
	c0 = counters(t, dp)
	if got := f.send(t, n); len(got) != n {
		t.Errorf("with the agent killed: %d of %d datagrams delivered", len(got), n)
	}
	if c := counters(t, dp).Sub(c0); c.FastOut != 0 || c.FastOutLease == 0 {
		t.Errorf("with the agent killed and its lease past: counters %+v, want nothing on the fast path out", c)
	}
	a.ResetAndCheck(t, before)
}

// waitVouched waits for the agent's lease, then sends 5 datagrams of f at
// a time until entries (of one way) counts one: the flow's.
func waitVouched(t *testing.T, dp *steer.Datapath, f *udpFlow, what string, entries func() (int, error)) {
	t.Helper()
	waitFor(t, "the agent's lease", func() bool {
		d, _, err := dp.Fast().Lease()
		return err == nil && d > steer.Now()
	})
	waitFor(t, what, func() bool {
		f.send(t, 5)
		n, err := entries()
		return err == nil && n > 0
	})
}

// lapse kills the agent and waits for its lease to pass.
func lapse(t *testing.T, dp *steer.Datapath, kill func()) {
	t.Helper()
	kill()
	waitFor(t, "the lease to pass", func() bool {
		d, _, err := dp.Fast().Lease()
		return err == nil && d <= steer.Now()
	})
}
