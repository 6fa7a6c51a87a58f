package falcon_test

import (
	"testing"
	"time"

	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/modetest"
	"github.com/lanesnet/lanes/testbed"
)

// TestFalconHome: with spread=busy (the default) and an idle IRQ core, the
// agent puts every stage on its at-home fast path once no flow runs
// elsewhere; traffic then crosses on vanilla placement without per-flow
// work (the Home counters grow, nothing is steered), and reset restores
// every knob.
func TestFalconHome(t *testing.T) {
	online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	before := modetest.Snapshot(t, tb)
	a := apply(t, tb, "falcon", nil)
	dp := a.Open(t)
	src, dst := s.Containers[0], r.Containers[0]
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200) // flow states at "stay"

	_, stopAgent := a.StartAgent(t)
	want := [steer.NumStages]bool{true, true, true}
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, err := dp.Home()
		if err != nil {
			t.Fatal(err)
		}
		if h == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stages at home after 5 s: %v, want all", h)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st0, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200)
	st1, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for stage := range steer.NumStages {
		d := sub(st1[stage], st0[stage])
		if d.Home == 0 || d.Steered != 0 {
			t.Errorf("%s stage at home: %+v, want frames on the fast path and none steered", steer.StageName(stage), d)
		}
	}
	stopAgent()
	a.ResetAndCheck(t, before)
}
