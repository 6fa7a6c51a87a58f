package bench

import (
	"strings"
	"testing"

	"github.com/lanesnet/lanes/bench/results"
)

// The note counts, per mode and point, the repeats whose cpumap kthread on
// the generator's core stalled stallFlagMs or more; runs without the
// figure (no generator) are left out, and no stall means no note.
func TestStallNote(t *testing.T) {
	run := func(mode string, ms float64, has bool) results.Run {
		r := results.Run{Mode: mode, Workload: "prio_latency", Proto: "udp", MsgSize: 64, Background: 0.65, Awake: true}
		if has {
			r.Extra = map[string]float64{"gen_core_cpumap_stall_ms": ms}
		}
		return r
	}
	if n := stallNote([]results.Run{run("vanilla", 0, true), run("falcon", 99, true), run("falcon", 0, false)}); n != "" {
		t.Errorf("no stall, but note %q", n)
	}
	n := stallNote([]results.Run{run("falcon-prism", 3619, true), run("falcon-prism", 0, true), run("falcon-prism", 2240, true), run("vanilla", 0, true), run("falcon", 100, true)})
	for _, want := range []string{"falcon-prism at prio_latency 64B bg65% awake in 2 of 3", "falcon at prio_latency 64B bg65% awake in 1 of 1"} {
		if !strings.Contains(n, want) {
			t.Errorf("note %q lacks %q", n, want)
		}
	}
	if strings.Contains(n, "vanilla") {
		t.Errorf("note %q names vanilla, which never stalled", n)
	}
}
