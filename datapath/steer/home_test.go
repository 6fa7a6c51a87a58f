//go:build linux

package steer

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// A stage at home (SetHome) keeps vanilla placement without per-flow state:
// no flow is created or updated, frames pass byte for byte, the Home
// counter counts them; leaving home restores the full path. PRISM and MFLOW
// keep steer_xdp on the full path whatever the bit says.
func TestHomeFastPath(t *testing.T) {
	d, _ := newDatapath(t)
	for st := range NumStages {
		if err := d.Placement().SetHome(st, true); err != nil {
			t.Fatal(err)
		}
	}
	if h, err := d.Placement().Home(); err != nil || h != [NumStages]bool{true, true, true} {
		t.Fatalf("Home = %v, %v", h, err)
	}
	f := udpFlow(40000)
	outer, inner := vxlanFrame(frameSpec{flow: f}), innerFrame(frameSpec{flow: f})
	if ret, out := runXDP(t, d, outer); ret != xdpPass {
		t.Errorf("xdp verdict %d, want XDP_PASS", ret)
	} else {
		sameBytes(t, "xdp at home", outer, out)
	}
	for _, run := range []struct {
		name  string
		frame []byte
		prog  func(*Datapath) *ebpf.Program
	}{
		{"ingress", outer, (*Datapath).TCIngress},
		{"egress", inner, (*Datapath).TCEgress},
	} {
		ret, out := runTC(t, run.prog(d), run.frame)
		if ret != tcUnspec {
			t.Errorf("%s: verdict %d, want TC_ACT_UNSPEC", run.name, int32(ret))
		}
		sameBytes(t, run.name+" at home", run.frame, out)
	}
	if ret, _ := runTC(t, d.TCSeen(), inner); ret != tcUnspec {
		t.Errorf("seen: verdict %d", int32(ret))
	}
	for st := range NumStages {
		if _, ok := flowState(t, d, f, st); ok {
			t.Errorf("stage %d: flow state created at home", st)
		}
	}
	s := stats(t, d)
	for st := range NumStages {
		want := Counters{Home: 1}
		if st == StageBridge {
			// Run on without the RPS backlog (stay_direct).
			want.Direct = 1
		}
		if s[st] != want {
			t.Errorf("stage %d counters %+v, want %+v", st, s[st], want)
		}
	}

	// Leaving home: the full path again.
	if err := d.Placement().SetHome(StageBridge, false); err != nil {
		t.Fatal(err)
	}
	runTC(t, d.TCIngress(), outer)
	if fl := mustFlow(t, d, f, StageBridge); fl.CPUIndex != Stay || fl.Packets != 1 {
		t.Errorf("bridge flow after leaving home: %+v", fl)
	}
	if err := d.Placement().DeleteStageFlows(StageBridge); err != nil {
		t.Fatal(err)
	}
	if _, ok := flowState(t, d, f, StageBridge); ok {
		t.Error("DeleteStageFlows left the bridge state")
	}
	if act, err := d.Placement().Activity(time.Second); err != nil || act.Away[StageBridge] {
		t.Errorf("after DeleteStageFlows: away %v, %v", act.Away, err)
	}

	// SetConfig (a new apply) starts on the full path.
	c, err := d.Config()
	if err != nil {
		t.Fatal(err)
	}
	c.Prio = true
	if err := d.SetConfig(c); err != nil {
		t.Fatal(err)
	}
	if h, _ := d.Placement().Home(); h != [NumStages]bool{} {
		t.Errorf("Home after SetConfig = %v, want all off", h)
	}
	// With prio the split stage is classified whatever the bit says.
	if err := d.Placement().SetHome(StageSplit, true); err != nil {
		t.Fatal(err)
	}
	runXDP(t, d, outer)
	if _, ok := flowState(t, d, f, StageSplit); !ok {
		t.Error("prio: steer_xdp took the fast path")
	}
	if err := d.Placement().SetHome(NumStages, true); err == nil {
		t.Error("SetHome accepted a stage out of range")
	}
}

// Activity: a stage is Away while any flow's stage runs away from home,
// and the flow's bucket is active.
func TestActivityAway(t *testing.T) {
	d, cores := newDatapath(t)
	setAll(t, d, StageContainer, uint32(len(cores)-1))
	f := tcpFlow(40001)
	runTC(t, d.TCEgress(), innerFrame(frameSpec{flow: f}))
	act, err := d.Placement().Activity(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !act.Away[StageContainer] {
		t.Error("container stage not away with a flow placed on a core")
	}
	if act.Away[StageBridge] {
		t.Error("bridge stage away with no bridge flows")
	}
	if b := Bucket(f.hash(), loIfindex, StageContainer); !act.Active[StageContainer][b] || act.Flows != 1 {
		t.Errorf("bucket %d active %v, %d flows; want active, 1", b, act.Active[StageContainer][b], act.Flows)
	}
	// Once the flow is idle for longer than the window it no longer keeps
	// the stage away: otherwise a stage never came home after the flow
	// that moved it ended.
	time.Sleep(5 * time.Millisecond)
	if act, err = d.Placement().Activity(time.Millisecond); err != nil || act.Away[StageContainer] || act.Flows != 0 {
		t.Errorf("idle past the window: away %v, %d flows (%v); want not away, 0", act.Away, act.Flows, err)
	}
}

// A flow stamped after Activity read its clock is a busy flow (its
// packets keep coming during the walk), so it is active. Unsigned
// arithmetic once made it idle for ever: under a steady stream the
// balancer saw no active flow, and its stages went home and left again
// every round.
func TestActivityBusyFlow(t *testing.T) {
	d, cores := newDatapath(t)
	setAll(t, d, StageContainer, uint32(len(cores)-1))
	f := tcpFlow(40002)
	runTC(t, d.TCEgress(), innerFrame(frameSpec{flow: f}))
	if n := stampFlows(t, d, Now()+50*time.Millisecond); n != 1 {
		t.Fatalf("%d flow states, want 1", n)
	}
	act, err := d.Placement().Activity(time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if b := Bucket(f.hash(), loIfindex, StageContainer); !act.Active[StageContainer][b] || act.Flows != 1 || !act.Away[StageContainer] {
		t.Errorf("flow stamped after the walk's clock: bucket %d active %v, %d flows, away %v; want active, 1, away", b, act.Active[StageContainer][b], act.Flows, act.Away[StageContainer])
	}
}
