package falcon_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/datapath/attach"
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
	a := apply(t, tb, "falcon", map[string]string{"split": "true"}) // the XDP stage's home too
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

// TestFalconSplitAutoOnVeth: the default falcon on the testbed, whose
// underlay is a veth, attaches no XDP program (split=auto), says so in the
// plan, steers the later stages with the agent running, carries traffic,
// and reset restores every knob.
func TestFalconSplitAutoOnVeth(t *testing.T) {
	online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	before := modetest.Snapshot(t, tb)
	a := apply(t, tb, "falcon", nil)
	if id, _ := attach.Attached(r.NetNS, r.Underlay); id != 0 {
		t.Errorf("XDP program %d on the veth underlay %s with split=auto", id, r.Underlay)
	}
	if notes := strings.Join(a.State.Plan.Notes, "\n"); !strings.Contains(notes, "split=auto: off") {
		t.Errorf("plan notes do not say splitting is off: %q", notes)
	}
	dp := a.Open(t)
	if cm, _ := dp.CPUMapEntries(); len(cm) != 0 {
		t.Errorf("cpumap entries %v with splitting off", cm)
	}
	_, stopAgent := a.StartAgent(t)
	src, dst := s.Containers[0], r.Containers[0]
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 1000)
	tcpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 1<<20)
	stopAgent()
	a.ResetAndCheck(t, before)
}
