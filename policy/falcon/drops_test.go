package falcon_test

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/testbed"
)

// TestFalconDroppedFramesCountedOut: frames a later stage counted in flight
// and the kernel then dropped, before the next stage's program saw them,
// are counted out of their flow's count (steer_drops_skb on skb:kfree_skb),
// so the flow's count returns to zero and a move need not wait for the
// drain time. A dropper runs ahead of lanes' programs at the two points
// where a later stage's frames are counted out: the host-side veth's tc
// egress (end of the bridge stage) and the container veth's tc ingress
// (end of the container stage). Each drops the datagrams of one size, so
// each stage loses a whole stream; every one must come back as a drop.
func TestFalconDroppedFramesCountedOut(t *testing.T) {
	online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	// spread=always: both later stages placed by hash and counted from the
	// first frame, without the agent.
	a := apply(t, tb, "falcon", map[string]string{"spread": "always"})
	if !steer.LaterDropsTracked(a.PinDir) {
		t.Fatal("falcon applied without steer_drops_skb attached (skb:kfree_skb): later-stage drops are not tracked")
	}
	dp := a.Open(t)
	src, dst := s.Containers[0], r.Containers[0]
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200) // ARP, FDB

	const bridgeSize, containerSize = 333, 444
	frameLen := func(size int) uint32 { return 14 + 20 + 8 + uint32(size) }
	bridgeDrops := modetest.DropFrames(t, r.NetNS, dst.HostVeth, ebpf.AttachTCXEgress, frameLen(bridgeSize))
	containerDrops := modetest.DropFrames(t, dst.NetNS, dst.Veth, ebpf.AttachTCXIngress, frameLen(containerSize))

	st0, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	type lost struct {
		stage   int
		size    int
		dropper *modetest.Dropper
	}
	for _, c := range []lost{{steer.StageBridge, bridgeSize, bridgeDrops}, {steer.StageContainer, containerSize, containerDrops}} {
		res := overlaytest.Stream{Count: n, Size: c.size, Burst: 50, Pause: time.Millisecond}.Run(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
		if res.Received != 0 {
			t.Errorf("%s stage: %d of %d datagrams of %d bytes got past the dropper", steer.StageName(c.stage), res.Received, res.Sent, c.size)
		}
		dropped := c.dropper.Dropped(t)
		if dropped < n*9/10 {
			t.Fatalf("%s stage: the dropper dropped %d of %d datagrams", steer.StageName(c.stage), dropped, n)
		}
		f, ok := settledFlow(t, dp, res, c.stage)
		if !ok {
			t.Fatalf("%s stage: no flow state for the stream %v -> %v", steer.StageName(c.stage), res.Src, res.Dst)
		}
		// Every drop the kernel reports is counted out. Now and then
		// it reports fewer than the dropper made (Dropper.Reported);
		// those stay in flight, and the flow on the drain time.
		reported := c.dropper.Reported(t)
		if reported < n/2 {
			t.Fatalf("%s stage: the kernel reported %d of the dropper's %d drops: too few for the test to mean anything", steer.StageName(c.stage), reported, dropped)
		}
		if f.InFlight != int64(dropped-reported) {
			t.Errorf("%s stage: %d frames still counted in flight; the dropper dropped %d, the kernel reported %d", steer.StageName(c.stage), f.InFlight, dropped, reported)
		}
		t.Logf("%s stage: %d datagrams sent, %d dropped, %d reported by the kernel, %d packets counted at the stage, %d in flight", steer.StageName(c.stage), res.Sent, dropped, reported, f.Packets, f.InFlight)
	}
	st1, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []lost{{steer.StageBridge, bridgeSize, bridgeDrops}, {steer.StageContainer, containerSize, containerDrops}} {
		if got, want := st1[c.stage].Dropped-st0[c.stage].Dropped, c.dropper.Reported(t); got != want {
			t.Errorf("%s stage: %d drops counted out, the kernel reported %d of the dropper's", steer.StageName(c.stage), got, want)
		}
	}

	// Frames dropped after the container stage counted them out (by a
	// program after lanes' on the container veth; the socket's full
	// buffer, an IP-layer filter) are not counted out again: the count
	// they left would go low while other frames are still queued.
	const afterSize = 555
	after := modetest.DropFramesAt(t, dst.NetNS, dst.Veth, ebpf.AttachTCXIngress, frameLen(afterSize), link.Tail())
	res := overlaytest.Stream{Count: n, Size: afterSize, Burst: 50, Pause: time.Millisecond}.Run(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
	if d := after.Dropped(t); res.Received != 0 || d < n*9/10 {
		t.Fatalf("after lanes' program: %d of %d datagrams dropped, %d received", d, res.Sent, res.Received)
	}
	time.Sleep(50 * time.Millisecond)
	st2, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for stage := steer.StageBridge; stage <= steer.StageContainer; stage++ {
		if d := st2[stage].Dropped - st1[stage].Dropped; d != 0 {
			t.Errorf("%s stage: %d frames dropped after the container stage counted them out were counted out again", steer.StageName(stage), d)
		}
	}
	if f, ok := flowAt(t, dp, res, steer.StageContainer); !ok || f.InFlight != 0 {
		t.Errorf("container stage of the stream dropped after lanes' program: state %+v (found %v), want 0 in flight", f, ok)
	}
}

// Frames the bridge stage ran on (datapath/steer/bpf/place.h's stay_direct: a zero L4 hash)
// and the kernel dropped before the host-side veth's program saw them are
// counted out too (steer_drops_skb), so a flow running on does not wait for
// the drain time after a drop.
func TestFalconDroppedDirectFramesCountedOut(t *testing.T) {
	online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	a := apply(t, tb, "falcon", map[string]string{"spread": "always"})
	dp := a.Open(t)
	var stay [steer.Buckets]uint32
	for b := range stay {
		stay[b] = steer.Stay
	}
	if err := dp.Placement().SetTable(steer.StageBridge, stay); err != nil {
		t.Fatal(err)
	}
	src, dst := s.Containers[0], r.Containers[0]
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200) // ARP, FDB

	const size, n = 333, 2000
	drops := modetest.DropFrames(t, r.NetNS, dst.HostVeth, ebpf.AttachTCXEgress, 14+20+8+size)
	st0, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	res := overlaytest.Stream{Count: n, Size: size, Burst: 50, Pause: time.Millisecond}.Run(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
	dropped := drops.Dropped(t)
	if res.Received != 0 || dropped < n*9/10 {
		t.Fatalf("the dropper dropped %d of %d datagrams, %d arrived", dropped, res.Sent, res.Received)
	}
	f, ok := settledFlow(t, dp, res, steer.StageBridge)
	st1, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	d := st1[steer.StageBridge].Sub(st0[steer.StageBridge])
	t.Logf("%d sent, %d dropped; bridge stage: %d ran on, %d counted out as dropped, state %+v", res.Sent, dropped, d.Direct, d.Dropped, f)
	if !ok {
		t.Fatalf("no bridge-stage state for the stream %v -> %v", res.Src, res.Dst)
	}
	if d.Direct == 0 {
		t.Error("no frame ran on: the test does not reach the zero-hash drop path")
	}
	// As in TestFalconDroppedFramesCountedOut: what the kernel reports.
	reported := drops.Reported(t)
	if reported < n/2 {
		t.Fatalf("the kernel reported %d of the dropper's %d drops: too few for the test to mean anything", reported, dropped)
	}
	if f.InFlight != int64(dropped-reported) || d.Dropped != reported {
		t.Errorf("%d in flight, %d counted out as dropped; the dropper dropped %d, the kernel reported %d", f.InFlight, d.Dropped, dropped, reported)
	}
}

// settledFlow waits up to a second for the stream's state at stage to
// count nothing in flight, and returns it as last read (ok: found).
func settledFlow(t *testing.T, dp *steer.Datapath, res overlaytest.StreamResult, stage int) (steer.Flow, bool) {
	t.Helper()
	var f steer.Flow
	var ok bool
	for range 50 {
		if f, ok = flowAt(t, dp, res, stage); ok && f.InFlight == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return f, ok
}
