package kthread

import (
	"strings"
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
		if got := tr.observe(7, threadSample{runnable: st.runnable, run: st.run, runAt: at(st.ms), stateAt: at(st.ms)}); got != st.want {
			t.Errorf("at %d ms: stalled %v, want %v", st.ms, got, st.want)
		}
	}
}

// A stall runs from just after the first sample's state read to just
// before the last one's run-time read: the stretch both reads bound.
func TestStallTrackerBounds(t *testing.T) {
	tr := stallTracker{prev: map[int]threadSample{}, since: map[int]time.Time{}}
	t0 := time.Unix(1000, 0)
	ms := func(m float64) time.Time { return t0.Add(time.Duration(m * float64(time.Millisecond))) }
	tr.observe(1, threadSample{run: 5, runAt: ms(0), runnable: true, stateAt: ms(1)})
	if got := tr.observe(1, threadSample{run: 5, runAt: ms(20), runnable: true, stateAt: ms(21)}); got != 19*time.Millisecond {
		t.Errorf("stalled %v, want 19ms (from the first state read to the second run-time read)", got)
	}
}

// Sampling the machine's ksoftirqd threads measures something, and End
// may be called twice (and on nil).
func TestStallsEnd(t *testing.T) {
	var none *Stalls
	if _, ok := none.End(); ok {
		t.Error("nil Stalls measured something")
	}
	s := StartStalls(func(comm string) bool { return strings.HasPrefix(comm, "ksoftirqd/") }, 5*time.Millisecond)
	if s == nil {
		t.Skip("no ksoftirqd threads listed here")
	}
	time.Sleep(40 * time.Millisecond)
	stalls, ok := s.End()
	if !ok || len(stalls) == 0 {
		t.Fatalf("nothing measured: %v %v", stalls, ok)
	}
	for _, st := range stalls {
		if !strings.HasPrefix(st.Comm, "ksoftirqd/") || st.Longest < 0 {
			t.Errorf("odd stall %+v", st)
		}
	}
	if _, ok := s.End(); !ok {
		t.Error("a second End lost the figures")
	}
}
