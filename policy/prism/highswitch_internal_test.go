package prism

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestHighRule: high=auto goes inline after InlineAfter samples in a row
// at or above the threshold, and back to the queue only after QueueAfter
// samples in a row under half of it; a rate between the two changes
// nothing (hysteresis).
func TestHighRule(t *testing.T) {
	r := highRule(5000)
	var s highState
	for i, step := range []struct {
		rate   float64
		inline bool
	}{
		{1000, false}, {6000, false}, {6000, false}, {1000, false}, // a burst too short
		{5000, false}, {5000, false}, {5000, true}, // 0.3 s at the threshold
		{3000, true}, {3000, true}, // between half and the threshold: stays
		{2000, true}, {2000, true}, {2000, true}, {2000, true}, {2000, true},
		{2000, true}, {2000, true}, {2000, true}, {2000, true}, {9000, true}, // one busy sample restarts the count
		{2000, true}, {2000, true}, {2000, true}, {2000, true}, {2000, true},
		{2000, true}, {2000, true}, {2000, true}, {2000, true}, {2000, false}, // 1 s under half
	} {
		changed := s.step(r, step.rate)
		if s.inline() != step.inline {
			t.Fatalf("sample %d (%.0f/s): inline %v, want %v", i, step.rate, s.inline(), step.inline)
		}
		if i > 0 && changed != (i == 6 || i == 28) {
			t.Errorf("sample %d: changed %v", i, changed)
		}
	}
}

// fakeHigh is a datapath for the switch: a frame count and the flag.
type fakeHigh struct {
	frames  uint64
	inline  bool
	sets    int
	fail    error
	closed  int
	refuses bool
}

func (f *fakeHigh) HighFrames() (uint64, error) { return f.frames, f.fail }
func (f *fakeHigh) HighInline() (bool, error)   { return f.inline, f.fail }
func (f *fakeHigh) SetHighInline(on bool) error {
	if f.refuses {
		return errors.New("refused")
	}
	f.sets++
	f.inline = on
	return nil
}
func (f *fakeHigh) Close() error { f.closed++; return nil }

// TestHighSwitchFollows: the switch turns the class's frame count into a
// rate, sets the datapath's flag when its decision changes and whenever
// the flag differs from it (a re-apply clears it), reopens the datapath
// after an error, and puts the class back in its queue when it stops.
func TestHighSwitchFollows(t *testing.T) {
	dp := &fakeHigh{}
	opens := 0
	h := newHighSwitch("/nowhere", 5000)
	h.open = func(string) (highDatapath, error) { opens++; return dp, nil }
	at := time.Unix(1000, 0)
	tick := func(frames uint64) string {
		t.Helper()
		at = at.Add(100 * time.Millisecond)
		dp.frames += frames
		msg, err := h.sample(at)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	tick(0)
	for range 3 {
		tick(800) // 8000 frames/s
	}
	if !dp.inline || dp.sets != 1 || h.switches != 1 {
		t.Fatalf("after 0.3 s at 8000 frames/s: inline %v, %d sets, %d switches", dp.inline, dp.sets, h.switches)
	}
	if s := h.status(); !s.Inline || s.Rate != 8000 || !strings.Contains(s.Summary(), "NIC poll") {
		t.Errorf("status %+v: %q", s, s.Summary())
	}
	dp.inline = false // a re-apply cleared the flag
	if msg := tick(800); msg != "" || !dp.inline {
		t.Errorf("flag cleared under the switch: not set again (%q, inline %v)", msg, dp.inline)
	}
	var msg string
	for range 10 {
		if m := tick(100); m != "" {
			msg = m
		}
	}
	if dp.inline || !strings.Contains(msg, "takes its queue") {
		t.Errorf("after 1 s at 1000 frames/s: inline %v, log %q", dp.inline, msg)
	}
	dp.fail = errors.New("gone")
	if _, err := h.sample(at.Add(100 * time.Millisecond)); err == nil || dp.closed != 1 {
		t.Errorf("read error: %v, %d closes", err, dp.closed)
	}
	dp.fail = nil
	tick(0)
	if opens != 2 {
		t.Errorf("%d opens, want the datapath reopened after the error", opens)
	}
	dp.frames = 0 // a new datapath counts from 0: no rate from a count that went back
	if _, err := h.sample(at.Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	dp.inline, h.state.on = true, true
	if err := h.stop(); err != nil || dp.inline {
		t.Errorf("stop: %v, inline %v, want the class back in its queue", err, dp.inline)
	}
	dp.refuses = true
	if err := h.stop(); err == nil {
		t.Error("a refused write at stop not reported")
	}
}
