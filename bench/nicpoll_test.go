package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/policy/prism"
)

// TestPrismAside reads prism's own status types, as the agents report
// them, and what held at a moment before the report.
func TestPrismAside(t *testing.T) {
	at := time.Unix(1000, 0)
	high := func(on bool, since time.Time) *prism.HighStatus {
		return &prism.HighStatus{Aside: &prism.AsideStatus{On: on, Since: since}}
	}
	for _, c := range []struct {
		name   string
		ag     plan.Agent
		at     time.Time
		on, ok bool
	}{
		{"prism-batch's guard, aside", fakeAgent{prism.GuardStatus{Watch: "bulk queue", High: high(true, time.Time{})}}, at, true, true},
		{"high=auto alone, not aside", fakeAgent{prism.GuardStatus{High: high(false, time.Time{})}}, at, false, true},
		{"prism-sync's guard", fakeAgent{prism.SyncStatus{Guard: &prism.GuardStatus{High: high(true, at.Add(-time.Second))}}}, at, true, true},
		{"aside after the moment: queued then", fakeAgent{prism.SyncStatus{Guard: &prism.GuardStatus{High: high(true, at.Add(time.Second))}}}, at, false, true},
		{"back after the moment: aside then", fakeAgent{prism.GuardStatus{High: high(false, at.Add(time.Second))}}, at, true, true},
		{"no moment: as reported", fakeAgent{prism.GuardStatus{High: high(true, at.Add(time.Second))}}, time.Time{}, true, true},
		{"aside off", fakeAgent{prism.GuardStatus{High: &prism.HighStatus{}}}, at, false, false},
		{"falcon-like", fakeAgent{struct {
			Moves int `json:"moves"`
		}{3}}, at, false, false},
		{"no agent", nil, at, false, false},
	} {
		on, ok := prismAside(statusOf(c.ag), c.at)
		if on != c.on || ok != c.ok {
			t.Errorf("%s: aside %v (%v), want %v (%v)", c.name, on, ok, c.on, c.ok)
		}
	}
}

func TestDepthNote(t *testing.T) {
	run := func(mode string, bg, d float64, aside int) results.Run {
		r := results.Run{Mode: mode, Workload: "prio_latency", Proto: "udp", MsgSize: 64, Background: bg, Awake: true, Extra: map[string]float64{"nic_frames_per_poll": d}}
		if aside >= 0 {
			r.Extra["prism_aside_at_end"] = float64(aside)
		}
		return r
	}
	if n := depthNote([]results.Run{{Mode: "vanilla", Workload: "prio_latency"}}); n != "" {
		t.Errorf("nothing counted: note %q", n)
	}
	n := depthNote([]results.Run{
		run("vanilla", 0.3, 1.2, -1), run("prism-batch", 0.3, 1.1, 1), run("vanilla", 0.3, 1.4, -1), run("prism-batch", 0.3, 2.9, 0), run("vanilla", 0.3, 1.3, -1),
		run("vanilla", 0.65, 2.8, -1), run("prism-batch", 0.65, 3.6, 0),
	})
	for _, want := range []string{"vanilla 1.30 [1.20-1.40]", "prism-batch 2.00 [1.10-2.90] (aside at the end of 1 of 2)", "prism-batch 3.60 [3.60-3.60] (aside at the end of 0 of 1)"} {
		if !strings.Contains(n, want) {
			t.Errorf("note %q lacks %q", n, want)
		}
	}
	if i, j := strings.Index(n, "bg30%"), strings.Index(n, "bg65%"); i < 0 || j < i {
		t.Errorf("note %q: points out of order", n)
	}
}
