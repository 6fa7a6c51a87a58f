package kthread

import (
	"testing"
	"time"
)

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
