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

// fakeHigh is a datapath for the switch: a frame count, the config's
// threshold and the switch.
type fakeHigh struct {
	frames  uint64
	pps     uint32
	inline  bool
	sets    int
	fail    error
	closed  int
	refuses bool
}

func (f *fakeHigh) HighFrames() (uint64, error) { return f.frames, f.fail }
func (f *fakeHigh) HighAuto() (uint32, bool, error) {
	return f.pps, f.inline && f.pps != 0, f.fail
}
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
// rate, sets the datapath's switch when its decision changes and whenever
// the switch differs from it, takes its threshold from the applied config
// at every sample (a re-apply without high=auto stands it down), opens the
// datapath at every sample, keeps an error in its status until the next
// good sample, and puts the class back in its queue when it stops.
func TestHighSwitchFollows(t *testing.T) {
	dp := &fakeHigh{pps: 5000}
	opens := 0
	h := newHighSwitch("/nowhere")
	h.open = func(string) (highDatapath, error) { opens++; return dp, nil }
	at := time.Unix(1000, 0)
	tick := func(frames uint64) string {
		t.Helper()
		at = at.Add(100 * time.Millisecond)
		dp.frames += frames
		msg := h.sample(at)
		if h.err != "" {
			t.Fatal(h.err)
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
	dp.inline = false // written under the switch
	if msg := tick(800); msg != "" || !dp.inline {
		t.Errorf("switch cleared under the agent: not set again (%q, inline %v)", msg, dp.inline)
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

	// A re-apply with a higher threshold: 8000 frames/s is light now.
	dp.pps = 20000
	for range 5 {
		tick(800)
	}
	if dp.inline {
		t.Error("8000 frames/s under a threshold of 20000: inline")
	}
	// A re-apply without high=auto: the switch stands down.
	dp.pps = 0
	if msg := tick(5000); !strings.Contains(msg, "stands down") || !h.status().Off || !strings.Contains(h.status().Summary(), "off") {
		t.Errorf("config without high=auto: log %q, status %+v", msg, h.status())
	}
	for range 5 {
		tick(5000)
	}
	if dp.inline {
		t.Error("switched on under a config without high=auto")
	}
	dp.pps = 5000

	dp.fail = errors.New("gone")
	h.sample(at.Add(100 * time.Millisecond))
	if h.err == "" || !strings.Contains(h.status().Summary(), "gone") {
		t.Errorf("read error: status %+v", h.status())
	}
	dp.fail = nil
	tick(0)
	if h.status().Err != "" || opens != dp.closed {
		t.Errorf("status %+v, %d opens and %d closes: want the error cleared, every open closed", h.status(), opens, dp.closed)
	}
	// Busy again, then a re-apply pins a new datapath: its count starts
	// over and its class in the queue, and the decision follows it there.
	for range 4 {
		tick(800)
	}
	if !dp.inline {
		t.Fatal("not inline after 0.4 s at 8000 frames/s")
	}
	dp.frames, dp.inline = 0, false
	tick(0)
	if dp.inline || h.state.inline() {
		t.Errorf("after a new datapath: switch %v, decision %v, want both in the queue", dp.inline, h.state.inline())
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
