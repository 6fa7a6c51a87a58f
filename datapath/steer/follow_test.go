//go:build linux

package steer

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// A stage that stays runs where the stage before it ran: these tests move
// the earlier stage's core under a staying later stage and check that the
// later one's frames in flight are never overtaken (bpf/order.h's
// followers_out and stay_core).

func needTwoCores(t *testing.T) {
	t.Helper()
	if n, err := ebpf.PossibleCPU(); err != nil || n < 2 {
		t.Skip("needs two cores")
	}
}

// The container stage staying holds the core its counted frames queued on:
// a frame that reaches it on another core (the bridge stage's core
// changed) is steered back to that core until every frame queued there was
// seen, and only then does the stage follow to the new core.
func TestContainerStayHoldsCore(t *testing.T) {
	d, f, inner := stayingOnCore0(t, 40000)
	defer pinThread(t, 1)()
	runTC(t, d.TCEgress(), inner)
	if fl := mustFlow(t, d, f, StageContainer); fl.StayCore != 0 || fl.InFlight != 3 {
		t.Fatalf("first frame on core 1: %+v, want held on core 0 with 3 in flight", fl)
	}
	if s := stats(t, d)[StageContainer]; s.Held != 1 {
		t.Errorf("counters %+v, want 1 held", s)
	}
	// Two of the three seen: the third is still queued on core 0.
	runTCSegs(t, d.TCSeen(), inner, 2)
	runTC(t, d.TCEgress(), inner)
	if fl := mustFlow(t, d, f, StageContainer); fl.StayCore != 0 || fl.InFlight != 2 {
		t.Fatalf("with one frame left on core 0: %+v, want held with 2 in flight", fl)
	}
	runTCSegs(t, d.TCSeen(), inner, 2)
	runTC(t, d.TCEgress(), inner)
	if fl := mustFlow(t, d, f, StageContainer); fl.StayCore != 1 || fl.InFlight != 1 {
		t.Errorf("once all were seen: %+v, want staying on core 1 with 1 in flight", fl)
	}
	if s := stats(t, d)[StageContainer]; s.Held != 2 || s.Undrained != 0 {
		t.Errorf("counters %+v, want 2 held, none undrained", s)
	}
	// The flow's activity reports the held core only while frames are in
	// flight.
	a, err := d.Placement().Activity(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if a.Held[StageContainer] != 1<<1 {
		t.Errorf("activity held %b, want core 1", a.Held[StageContainer])
	}
}

// stayingOnCore0 is a datapath with a flow from port whose container
// stage stays, with two frames queued on core 0, and the flow's inner
// frame.
func stayingOnCore0(t *testing.T, port uint16) (*Datapath, flowSpec, []byte) {
	t.Helper()
	needTwoCores(t)
	d := drainDatapath(t, time.Hour)
	f := udpFlow(port)
	inner := innerFrame(frameSpec{flow: f})
	unpin := pinThread(t, 0)
	runTC(t, d.TCEgress(), inner)
	runTC(t, d.TCEgress(), inner)
	unpin()
	if fl := mustFlow(t, d, f, StageContainer); fl.CPUIndex != Stay || fl.StayCore != 0 || fl.InFlight != 2 {
		t.Fatalf("premise: on core 0: %+v, want staying on core 0 with 2 in flight", fl)
	}
	return d, f, inner
}

// Frames counted on the held core that never come (lost where nothing
// reports it) hold the stage only until the flow was idle for the drain
// time; then it follows, with a fresh count.
func TestContainerStayHoldDrains(t *testing.T) {
	needTwoCores(t)
	d := drainDatapath(t, 5*time.Millisecond)
	f := udpFlow(40000)
	inner := innerFrame(frameSpec{flow: f})
	unpin := pinThread(t, 0)
	runTC(t, d.TCEgress(), inner)
	unpin()
	time.Sleep(20 * time.Millisecond)
	defer pinThread(t, 1)()
	runTC(t, d.TCEgress(), inner)
	if fl := mustFlow(t, d, f, StageContainer); fl.StayCore != 1 || fl.InFlight != 1 {
		t.Errorf("after the drain time: %+v, want staying on core 1 with only the new frame in flight", fl)
	}
	if s := stats(t, d)[StageContainer]; s.Undrained != 1 || s.Held != 0 {
		t.Errorf("counters %+v, want 1 undrained, none held", s)
	}
}

// The container stage counts a frame in before the bridge stage counts it
// out: a bridge-stage move, which waits for its own count, can never find
// a frame counted in neither stage.
func TestHandOffCountsInBeforeOut(t *testing.T) {
	defer pinThread(t, 0)()
	d := drainDatapath(t, time.Hour)
	f := udpFlow(40000)
	outer, inner := vxlanFrame(frameSpec{flow: f}), innerFrame(frameSpec{flow: f})
	runTC(t, d.TCIngress(), outer)
	if n := inFlight(t, d, f, StageBridge); n != 1 {
		t.Fatalf("bridge stage: %d in flight, want 1", n)
	}
	runTC(t, d.TCEgress(), inner)
	if b, c := inFlight(t, d, f, StageBridge), inFlight(t, d, f, StageContainer); b != 0 || c != 1 {
		t.Errorf("after the hand-off: bridge %d, container %d in flight; want 0 and 1", b, c)
	}
}

// A split-stage move waits for the flow's staying bridge stage: its frames
// in flight run where the split stage put them (the old core's GRO cell
// and backlog), and the first frames on the new core would overtake them.
func TestSplitMoveWaitsForStayingBridge(t *testing.T) {
	defer pinThread(t, 0)()
	d := drainDatapath(t, time.Hour)
	f := udpFlow(40000)
	outer, inner := vxlanFrame(frameSpec{flow: f}), innerFrame(frameSpec{flow: f})
	if ret, _ := runXDP(t, d, outer); ret != xdpPass {
		t.Fatalf("stay: verdict %d, want XDP_PASS", ret)
	}
	runTC(t, d.TCIngress(), outer) // the bridge stage stays, 1 in flight
	if err := d.Placement().SetBucket(StageSplit, Bucket(f.hash(), loIfindex, StageSplit), 1); err != nil {
		t.Fatal(err)
	}
	if ret, _ := runXDP(t, d, outer); ret != xdpPass {
		t.Errorf("with the bridge stage's frame in flight: verdict %d, want XDP_PASS (held)", ret)
	}
	if fl := mustFlow(t, d, f, StageSplit); fl.CPUIndex != Stay {
		t.Errorf("split stage moved under the bridge stage's frame: %+v", fl)
	}
	if s := stats(t, d)[StageSplit]; s.Held != 1 || s.Moved != 0 {
		t.Errorf("counters %+v, want 1 held", s)
	}
	runTC(t, d.TCIngress(), outer) // the held frame, on the old core
	runTCSegs(t, d.TCEgress(), inner, 2)
	if ret, _ := runXDP(t, d, outer); ret != xdpRedirect {
		t.Errorf("once the bridge stage's frames were seen: verdict %d, want XDP_REDIRECT", ret)
	}
	if fl := mustFlow(t, d, f, StageSplit); fl.CPUIndex != 1 {
		t.Errorf("split stage after the drain: %+v, want index 1", fl)
	}
}

// A bridge stage placed on a core of its own (not staying) does not follow
// the split stage, so it holds no split-stage move.
func TestSplitMoveIgnoresPlacedBridge(t *testing.T) {
	defer pinThread(t, 0)()
	d := drainDatapath(t, time.Hour)
	f := udpFlow(40000)
	outer := vxlanFrame(frameSpec{flow: f})
	setAll(t, d, StageBridge, 1)
	runXDP(t, d, outer)
	runTC(t, d.TCIngress(), outer)
	if n := inFlight(t, d, f, StageBridge); n != 1 {
		t.Fatalf("bridge stage: %d in flight, want 1", n)
	}
	if err := d.Placement().SetBucket(StageSplit, Bucket(f.hash(), loIfindex, StageSplit), 1); err != nil {
		t.Fatal(err)
	}
	if ret, _ := runXDP(t, d, outer); ret != xdpRedirect {
		t.Errorf("verdict %d, want XDP_REDIRECT: a placed bridge stage does not follow", ret)
	}
}
