package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/bench/results"
)

func TestCoreRxKthread(t *testing.T) {
	for _, tc := range []struct {
		comm string
		core int
		want bool
	}{
		{"ksoftirqd/0", 0, true},
		{"ksoftirqd/10", 1, false},
		{"ksoftirqd/1", 1, true},
		{"cpumap/0/map:76", 0, true},
		{"cpumap/10/map:76", 1, false},
		{"cpumap/1/map:76", 1, true},
		{"kworker/0:3", 0, false},
		{"napi/ul1-3153", 1, false},
	} {
		if got := coreRxKthread(tc.comm, tc.core); got != tc.want {
			t.Errorf("coreRxKthread(%q, %d) = %v, want %v", tc.comm, tc.core, got, tc.want)
		}
	}
}

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

// A thread runnable at two samples with no run time between them stalled
// from the first; running, sleeping or a first sight resets it.
func TestStallTracker(t *testing.T) {
	tr := stallTracker{prev: map[int]threadSample{}, since: map[int]time.Time{}}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	steps := []struct {
		ms       int
		runnable bool
		run      uint64
		want     time.Duration
	}{
		{0, true, 100, 0},                       // first sight
		{20, true, 100, 20 * time.Millisecond},  // waiting since 0
		{40, true, 100, 40 * time.Millisecond},  // still
		{60, true, 180, 0},                      // ran: runnable again from here
		{80, true, 180, 20 * time.Millisecond},  // waiting since 60
		{100, false, 250, 0},                    // ran and slept
		{120, true, 250, 0},                     // woken: from here
		{140, true, 250, 20 * time.Millisecond}, // waiting since 120
	}
	for _, st := range steps {
		if got := tr.observe(7, threadSample{runnable: st.runnable, run: st.run}, at(st.ms)); got != st.want {
			t.Errorf("at %d ms: stalled %v, want %v", st.ms, got, st.want)
		}
	}
}
