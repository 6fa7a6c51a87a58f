package falcon_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/falcon"
	"github.com/lanesnet/lanes/testbed"
)

// pathKnobs keeps the knobs of a snapshot that parking switches: the tcx
// programs of every device and every RPS map.
func pathKnobs(snap map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range snap {
		if strings.HasPrefix(k, "tcx:") || strings.HasSuffix(k, "/rps_cpus") {
			out[k] = v
		}
	}
	return out
}

// waitParked waits until the agent reports parked (or not).
func waitParked(t *testing.T, ag plan.Agent, want bool, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if ag.Status().(falcon.AgentStatus).Parked == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: agent parked=%v after %v, want %v (status %+v)", what, !want, within, want, ag.Status())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFalconParks: with every stage at home for a second on an idle IRQ
// core, the agent takes lanes' programs and RPS maps off the path (the
// path's knobs are as before the apply, and no frame passes a program),
// and a stream crosses in order; a busy IRQ core makes it put them back
// before stages leave home (in order throughout); once the load is gone
// it parks again; a stopped agent leaves the plan's state, and reset
// restores every knob.
func TestFalconParks(t *testing.T) {
	cpus := online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	before := modetest.Snapshot(t, tb)
	a := apply(t, tb, "falcon", nil)
	applied := pathKnobs(modetest.Snapshot(t, tb))
	if maps.Equal(applied, pathKnobs(before)) {
		t.Fatal("falcon changed no program or RPS map: nothing to park")
	}
	dp := a.Open(t)
	src, dst := s.Containers[0], r.Containers[0]
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200) // ARP resolved

	ag, stopAgent := a.StartAgent(t)
	waitParked(t, ag, true, 10*time.Second, "idle")
	modetest.SameSnapshot(t, "parked", pathKnobs(modetest.Snapshot(t, tb)), pathKnobs(before))
	if _, err := os.Stat(filepath.Join(control.Dir(a.StateDir, a.NS), plan.AgentStateFile)); err != nil {
		t.Errorf("parked, but the state directory has no record of it: %v", err)
	}
	if got := strings.Join(ag.Status().(falcon.AgentStatus).Summary(), "\n"); !strings.Contains(got, "parked") {
		t.Errorf("status does not say parked:\n%s", got)
	}
	st0, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	overlaytest.Stream{Count: 2000, Size: 64, Burst: 50, Pause: 200 * time.Microsecond}.
		Delivered(t, "stream while parked", true, s.Containers[1].NetNS, r.Containers[1].NetNS, r.Containers[1].Addr.Addr())
	st1, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for stage := range steer.NumStages {
		if d := sub(st1[stage], st0[stage]); d != (steer.Counters{}) {
			t.Errorf("%s stage while parked: %+v, want no frame through lanes' programs", steer.StageName(stage), d)
		}
	}

	// A busy IRQ core: the agent unparks before any stage leaves home.
	irq := tb.Config.IRQCPU
	if irq < 0 || !slices.Contains(cpus, irq) {
		t.Skipf("IRQ core %d is not online (%v)", irq, cpus)
	}
	stopHog := hogCores(t, []int{irq})
	left := false
	for try := 0; try < 20 && !left; try++ {
		overlaytest.Stream{Count: 2000, Size: 200, Burst: 50, Pause: 2 * time.Millisecond, CPU: cpus[0]}.Delivered(t, fmt.Sprintf("stream %d with the IRQ core busy", try), true, src.NetNS, dst.NetNS, dst.Addr.Addr())
		h, err := dp.Placement().Home()
		if err != nil {
			t.Fatal(err)
		}
		left = !h[steer.StageBridge] || !h[steer.StageContainer]
	}
	if !left {
		t.Fatal("the IRQ core was busy for 20 streams and no stage left home")
	}
	if ag.Status().(falcon.AgentStatus).Parked {
		t.Error("a stage left home while parked")
	}
	modetest.SameSnapshot(t, "unparked", pathKnobs(modetest.Snapshot(t, tb)), applied)
	stopHog()
	overlaytest.Stream{Count: 2000, Size: 200, Burst: 50, Pause: 2 * time.Millisecond, CPU: cpus[0]}.Delivered(t, "stream after the busy loop stopped", true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	waitParked(t, ag, true, 15*time.Second, "after the load")

	// A stopping agent puts the plan's programs and maps back.
	stopAgent()
	modetest.SameSnapshot(t, "agent stopped", pathKnobs(modetest.Snapshot(t, tb)), applied)
	a.ResetAndCheck(t, before)
}

// TestFalconParkOff: x-park=false, and modes with an XDP hook, never park;
// the status says why.
func TestFalconParkOff(t *testing.T) {
	online(t)
	tb := upTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	for _, c := range []struct {
		params map[string]string
		why    string
	}{
		{map[string]string{"x-park": "false"}, "x-park=false"},
		{map[string]string{"prio": "true"}, "XDP"},
	} {
		a := apply(t, tb, "falcon", c.params)
		applied := pathKnobs(modetest.Snapshot(t, tb))
		ag, stopAgent := a.StartAgent(t)
		time.Sleep(1500 * time.Millisecond) // past parkAfter rounds at home
		st := plan.OwnStatus(ag.Status()).(falcon.AgentStatus)
		if st.Parked || !strings.Contains(st.ParkOff, c.why) {
			t.Errorf("%v: parked=%v, why not %q; want not parked because of %q", c.params, st.Parked, st.ParkOff, c.why)
		}
		modetest.SameSnapshot(t, fmt.Sprint(c.params), pathKnobs(modetest.Snapshot(t, tb)), applied)
		stopAgent()
		a.ResetAndCheck(t, before)
	}
}

// TestFalconParkedAgentKilled: an agent killed while parked leaves the
// path parked and says so on disk; the next agent finds it parked and,
// stopping, puts the plan's programs and maps back; reset after another
// such kill restores every knob and leaves no state.
func TestFalconParkedAgentKilled(t *testing.T) {
	online(t)
	tb := upTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	a := apply(t, tb, "falcon", nil)
	applied := pathKnobs(modetest.Snapshot(t, tb))
	dir := control.Dir(a.StateDir, a.NS)
	// An agent brings every stage home (and parks); stopped, it unparks
	// and leaves the stages at home, where the killed one parks them.
	ag, stopAgent := a.StartAgent(t)
	waitParked(t, ag, true, 10*time.Second, "first agent")
	stopAgent()
	if err := falcon.ParkLikeAKilledAgent(dir); err != nil {
		t.Fatal(err)
	}
	modetest.SameSnapshot(t, "parked, agent killed", pathKnobs(modetest.Snapshot(t, tb)), pathKnobs(before))

	ag, stopAgent = a.StartAgent(t)
	waitParked(t, ag, true, 2*time.Second, "next agent")
	stopAgent()
	modetest.SameSnapshot(t, "next agent stopped", pathKnobs(modetest.Snapshot(t, tb)), applied)
	if _, err := os.Stat(filepath.Join(dir, plan.AgentStateFile)); !os.IsNotExist(err) {
		t.Errorf("unparked, and %s is still there (%v)", plan.AgentStateFile, err)
	}

	if err := falcon.ParkLikeAKilledAgent(dir); err != nil {
		t.Fatal(err)
	}
	a.ResetAndCheck(t, before)
}
