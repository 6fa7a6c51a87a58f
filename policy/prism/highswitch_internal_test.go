package prism

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/datapath/steer"
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

// fakeHigh is a datapath for the switch: the rules, their frame counts,
// the config's threshold and the rules' switches.
type fakeHigh struct {
	rules     []steer.Rule
	frames    map[steer.Rule]uint64
	pps       uint32
	inline    map[steer.Rule]bool
	until     map[steer.Rule]time.Duration // the switches' deadlines
	forgot    []steer.Rule
	sets      int
	fail      error
	closed    int
	refuses   bool
	refuse    map[steer.Rule]bool // writes of these rules fail
	bulkQuiet bool
	bqFail    error // BulkQuietNow alone fails
	aside     time.Duration
	asideMax  time.Duration // the latest deadline written
	asideSets int
	below     uint32 // the config's aside-below
	depth     uint32 // its aside-depth, hundredths
	core      int
	opens     int
	pins      string // the pins' stamp
}

// serve makes h open f, under f's stamp.
func (f *fakeHigh) serve(h *highSwitch) {
	h.open = func(string) (highDatapath, error) { f.opens++; return f, nil }
	h.stamp = func(string) (string, error) { return f.pins, nil }
}

func newFakeHigh(pps uint32, rules ...steer.Rule) *fakeHigh {
	return &fakeHigh{rules: rules, pps: pps, frames: map[steer.Rule]uint64{}, inline: map[steer.Rule]bool{}}
}

func (f *fakeHigh) Rules() ([]steer.Rule, error) { return f.rules, f.fail }
func (f *fakeHigh) HighRuleFrames() (map[steer.Rule]uint64, error) {
	return maps.Clone(f.frames), f.fail
}
func (f *fakeHigh) HighAuto() (uint32, []steer.Rule, error) {
	var on []steer.Rule
	for r, v := range f.inline {
		if v && f.pps != 0 {
			on = append(on, r)
		}
	}
	return f.pps, on, f.fail
}

// SetHighInline counts the switches (sets), not their renewals.
func (f *fakeHigh) SetHighInline(r steer.Rule, until time.Duration) error {
	if f.refuses || f.refuse[r] {
		return errors.New("refused")
	}
	on := until != 0
	if f.inline[r] != on {
		f.sets++
	}
	f.inline[r] = on
	if f.until == nil {
		f.until = map[steer.Rule]time.Duration{}
	}
	f.until[r] = until
	return nil
}
func (f *fakeHigh) SetAside(until time.Duration) error {
	if f.refuses {
		return errors.New("refused")
	}
	f.asideSets++
	f.aside = until
	f.asideMax = max(f.asideMax, until)
	return nil
}
func (f *fakeHigh) AsideConfig() (uint32, int) { return f.below, f.core }
func (f *fakeHigh) AsideDepth() uint32         { return f.depth }
func (f *fakeHigh) ForgetHigh(r steer.Rule) error {
	f.forgot = append(f.forgot, r)
	delete(f.inline, r)
	delete(f.frames, r)
	return nil
}
func (f *fakeHigh) BulkQuietNow() (bool, error) {
	if f.bqFail != nil {
		return false, f.bqFail
	}
	return f.bulkQuiet, f.fail
}
func (f *fakeHigh) Close() error { f.closed++; return nil }

func testRule(t *testing.T, s string) steer.Rule {
	t.Helper()
	r, err := steer.ParseRule(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestHighSwitchFollows: the switch turns a rule's frame count into a
// rate, sets the rule's switch when its decision changes and whenever the
// switch differs from it, takes its threshold from the applied config at
// every sample (a re-apply without high=auto stands it down), keeps an
// error in its status until the next good sample, opens the datapath
// afresh after one and when its pins change (and only then), and puts the
// rule's flows back in their queue when it stops.
func TestHighSwitchFollows(t *testing.T) {
	a := testRule(t, "dst 198.19.0.21 port 11211 tcp")
	dp := newFakeHigh(5000, a)
	h := newHighSwitch("/nowhere")
	dp.serve(h)
	at := time.Unix(1000, 0)
	tick := func(frames uint64) string {
		t.Helper()
		at = at.Add(100 * time.Millisecond)
		dp.frames[a] += frames
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
	if !dp.inline[a] || dp.sets != 1 || h.switches != 1 {
		t.Fatalf("after 0.3 s at 8000 frames/s: inline %v, %d sets, %d switches", dp.inline[a], dp.sets, h.switches)
	}
	if s := h.status(); len(s.Rules) != 1 || !s.Rules[0].Inline || s.Rules[0].Rate != 8000 || !strings.Contains(s.Summary(), "NIC poll (busy): "+a.String()) {
		t.Errorf("status %+v: %q", s, s.Summary())
	}
	dp.inline[a] = false // written under the switch
	if msg := tick(800); msg != "" || !dp.inline[a] {
		t.Errorf("switch cleared under the agent: not set again (%q, inline %v)", msg, dp.inline[a])
	}
	var msg string
	for range 10 {
		if m := tick(100); m != "" {
			msg = m
		}
	}
	if dp.inline[a] || !strings.Contains(msg, "take their queue") {
		t.Errorf("after 1 s at 1000 frames/s: inline %v, log %q", dp.inline[a], msg)
	}

	// A re-apply with a higher threshold: 8000 frames/s is light now.
	dp.pps = 20000
	for range 5 {
		tick(800)
	}
	if dp.inline[a] {
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
	if dp.inline[a] {
		t.Error("switched on under a config without high=auto")
	}
	dp.pps = 5000

	if dp.opens != 1 || dp.closed != 0 {
		t.Errorf("pins unchanged: %d opens, %d closes; want the first open held", dp.opens, dp.closed)
	}
	dp.pins = "re-pinned"
	tick(0)
	if dp.opens != 2 || dp.closed != 1 {
		t.Errorf("pins changed: %d opens, %d closes; want the held one closed and one open", dp.opens, dp.closed)
	}
	dp.fail = errors.New("gone")
	h.sample(at.Add(100 * time.Millisecond))
	if h.err == "" || !strings.Contains(h.status().Summary(), "gone") {
		t.Errorf("read error: status %+v", h.status())
	}
	if h.held != nil || dp.closed != dp.opens {
		t.Errorf("after a failed sample: %d opens, %d closes; want the datapath let go", dp.opens, dp.closed)
	}
	dp.fail = nil
	tick(0)
	if h.status().Err != "" || dp.opens != 3 || dp.closed != 2 {
		t.Errorf("status %+v, %d opens and %d closes: want the error cleared, a fresh open held", h.status(), dp.opens, dp.closed)
	}
	// Busy again, then a re-apply pins a new datapath: its count starts
	// over and its flows in the queue, and the decision follows them there.
	for range 4 {
		tick(800)
	}
	if !dp.inline[a] {
		t.Fatal("not inline after 0.4 s at 8000 frames/s")
	}
	dp.frames, dp.inline = map[steer.Rule]uint64{}, map[steer.Rule]bool{}
	tick(0)
	if dp.inline[a] || h.rules[a].state.inline() {
		t.Errorf("after a new datapath: switch %v, decision %v, want both in the queue", dp.inline[a], h.rules[a].state.inline())
	}
	dp.inline[a], h.rules[a].state.on = true, true
	if err := h.stop(); err != nil || dp.inline[a] || h.held != nil || dp.closed != dp.opens {
		t.Errorf("stop: %v, inline %v, %d opens and %d closes; want the flows back in their queue, every open closed", err, dp.inline[a], dp.opens, dp.closed)
	}
	dp.inline[a] = true
	dp.refuses = true
	if err := h.stop(); err == nil {
		t.Error("a refused write at stop not reported")
	}
}

// TestHighSwitchPerRule: each rule is switched by its own rate, so a light
// marked flow keeps its real-time queue while a busy one beside it runs in
// the NIC poll; what a deleted rule left (count, switch) is dropped, and a
// rule deleted and added again starts in the queue.
func TestHighSwitchPerRule(t *testing.T) {
	busy := testRule(t, "dst 198.19.0.21 port 11211 tcp")
	light := testRule(t, "dst 198.19.0.21 port 11111 udp")
	gone := testRule(t, "dst 198.19.0.22")
	dp := newFakeHigh(5000, busy, light)
	dp.frames[gone], dp.inline[gone] = 7, true // left by a rule deleted before
	h := newHighSwitch("/nowhere")
	dp.serve(h)
	at := time.Unix(1000, 0)
	tick := func(b, l uint64) string {
		t.Helper()
		at = at.Add(100 * time.Millisecond)
		dp.frames[busy] += b
		dp.frames[light] += l
		msg := h.sample(at)
		if h.err != "" {
			t.Fatal(h.err)
		}
		return msg
	}
	var log []string
	for range 6 {
		log = append(log, tick(2000, 100)) // 20000 and 1000 frames/s: the class 21000
	}
	if !dp.inline[busy] || dp.inline[light] {
		t.Fatalf("busy rule inline %v, light rule inline %v: want only the busy one in the NIC poll", dp.inline[busy], dp.inline[light])
	}
	if !slices.Contains(dp.forgot, gone) || dp.inline[gone] {
		t.Errorf("a deleted rule's switch and count not dropped (forgot %v)", dp.forgot)
	}
	if j := strings.Join(log, "\n"); !strings.Contains(j, busy.String()+" busy") || strings.Contains(j, light.String()) {
		t.Errorf("log %q: want the busy rule named, the light one not", j)
	}
	s := h.status().Summary()
	if !strings.Contains(s, "in the NIC poll (busy): "+busy.String()) || !strings.Contains(s, "in their queue (light): "+light.String()) || strings.Contains(s, "no bulk") {
		t.Errorf("summary %q", s)
	}
	dp.bulkQuiet = true
	tick(2000, 100)
	if s := h.status().Summary(); !h.status().BulkQuiet || !strings.Contains(s, "no bulk lately, so every rule's flows run in the NIC poll") {
		t.Errorf("bulk quiet: summary %q", s)
	}
	dp.bulkQuiet = false
	// The light rule deleted and added again with a busy flow: it starts
	// over from the queue and needs its 0.3 s like any rule.
	dp.rules = []steer.Rule{busy}
	tick(2000, 0)
	if _, ok := h.rules[light]; ok {
		t.Error("a deleted rule kept its decision")
	}
	dp.rules = []steer.Rule{busy, light}
	delete(dp.frames, light)
	tick(2000, 0)
	tick(2000, 2000)
	tick(2000, 2000)
	if dp.inline[light] {
		t.Error("a re-added rule inline after 0.2 s")
	}
	tick(2000, 2000)
	if !dp.inline[light] || !dp.inline[busy] {
		t.Errorf("both rules busy for 0.3 s: inline %v", dp.inline)
	}
}

// TestHighSwitchOneRuleFails: a rule whose switch cannot be written keeps
// neither the other rules from theirs nor its own switch from being
// logged and counted once the write succeeds.
func TestHighSwitchOneRuleFails(t *testing.T) {
	a := testRule(t, "dst 198.19.0.21 port 11211 tcp")
	b := testRule(t, "dst 198.19.0.22 port 80 tcp")
	dp := newFakeHigh(5000, a, b)
	dp.refuse = map[steer.Rule]bool{a: true}
	dp.bqFail = errors.New("bulk stamp unreadable") // status only: no rule waits for it
	h := newHighSwitch("/nowhere")
	dp.serve(h)
	at := time.Unix(1000, 0)
	var log []string
	tick := func() {
		at = at.Add(100 * time.Millisecond)
		dp.frames[a] += 1000
		dp.frames[b] += 1000
		if m := h.sample(at); m != "" {
			log = append(log, m)
		}
	}
	for range 4 {
		tick()
	}
	if dp.inline[a] || !dp.inline[b] || h.switches != 1 || !strings.Contains(h.err, "refused") || !strings.Contains(h.err, "bulk stamp unreadable") {
		t.Fatalf("one rule refused: inline %v, %d switches, error %q: want the other rule inline and the error shown", dp.inline, h.switches, h.err)
	}
	if j := strings.Join(log, "\n"); strings.Contains(j, a.String()) || !strings.Contains(j, b.String()) {
		t.Errorf("log %q: want only the rule that was switched", j)
	}
	if st := h.status(); st.Rules[0].Inline {
		t.Errorf("status %+v: the refused rule shown inline", st.Rules)
	}
	delete(dp.refuse, a)
	dp.bqFail = nil
	log = nil
	tick()
	if !dp.inline[a] || h.switches != 2 || h.err != "" || !strings.Contains(strings.Join(log, ""), a.String()+" busy") {
		t.Errorf("write accepted again: inline %v, %d switches, error %q, log %q", dp.inline, h.switches, h.err, log)
	}
}

// TestAsideRule: stepping aside takes AsideAfter samples in a row under
// the threshold, coming back BackAfter in a row at or above it, and a
// sample that could not be taken counts as busy.
func TestAsideRule(t *testing.T) {
	r := asideRule(20, 0)
	var s asideState
	for i, step := range []struct {
		rx    float64
		ok    bool
		aside bool
	}{
		{10, true, false}, {10, true, false}, {10, true, false}, {10, true, false}, {25, true, false}, // a busy sample restarts the count
		{10, true, false}, {10, true, false}, {10, true, false}, {10, true, false}, {10, true, false},
		{10, true, false}, {10, true, false}, {10, true, false}, {10, true, false}, {19.9, true, true}, // 1 s under 20%
		{20, true, true}, {10, true, true}, {20, true, true}, {50, true, false}, // two in a row at or above
		{0, true, false}, {0, true, false}, {0, true, false}, {0, true, false}, {0, true, false},
		{0, true, false}, {0, true, false}, {0, true, false}, {0, true, false}, {0, true, true},
		{0, false, true}, {0, false, false}, // unknown load: the plan's placement
	} {
		if _, probe := s.step(r, asideSample{rx: step.rx, ok: step.ok}); probe {
			t.Fatalf("sample %d: a probe without counted polls", i)
		}
		if s.on != step.aside {
			t.Fatalf("sample %d (%.1f%%, ok %v): aside %v, want %v", i, step.rx, step.ok, s.on, step.aside)
		}
	}
}

// TestAsideRuleDepth: with a depth, a sample whose NIC polls were counted
// is quiet by their depth alone, whatever the receive work; one whose
// polls were not counted falls back to the receive work; one not taken
// is busy.
func TestAsideRuleDepth(t *testing.T) {
	r := asideRule(50, 2.5)
	for _, c := range []struct {
		s     asideSample
		quiet bool
	}{
		{asideSample{rx: 90, depth: 1.2, polled: true, ok: true}, true},   // busy core, no queue: aside
		{asideSample{rx: 10, depth: 3.0, polled: true, ok: true}, false},  // light core, frames queue (coalescing): queues
		{asideSample{rx: 90, depth: 2.5, polled: true, ok: true}, false},  // at the threshold: queues
		{asideSample{rx: 10, depth: 0, polled: true, ok: true}, true},     // nothing polled
		{asideSample{rx: 10, depth: -1, polled: false, ok: true}, true},   // not counted: receive work
		{asideSample{rx: 60, depth: -1, polled: false, ok: true}, false},  // not counted: receive work
		{asideSample{rx: 10, depth: 1.0, polled: true, ok: false}, false}, // not taken
	} {
		if got := r.quiet(c.s); got != c.quiet {
			t.Errorf("%+v: quiet %v, want %v", c.s, got, c.quiet)
		}
	}
	if r := asideRule(50, 0); !r.quiet(asideSample{rx: 10, depth: 5, polled: true, ok: true}) {
		t.Error("without a depth the receive work decides")
	}
}

// TestAsideRuleProbe: ten seconds in the queues with polls under twice
// the depth on average (over it queued, as the queues' batches hold them)
// step aside to read vanilla's depth; under it aside stays aside, at or
// over it the queues come back after two samples and the next probe
// waits twice as long, up to 80 s; a probe that stays aside, or stepping
// aside by the rule, brings the wait back to 10 s; polls at or over
// twice the depth on average, or not counted, never probe.
func TestAsideRuleProbe(t *testing.T) {
	r := asideRule(50, 2)
	queued := func(depth float64) asideSample { return asideSample{rx: 80, depth: depth, polled: true, ok: true} }
	var s asideState
	run := func(n int, smp asideSample) (changes, probes int) {
		for range n {
			c, p := s.step(r, smp)
			if c {
				changes++
			}
			if p {
				probes++
			}
		}
		return
	}
	if c, p := run(99, queued(2.7)); c != 0 || p != 0 || s.on {
		t.Fatalf("99 samples at 2.7 queued: %d changes, %d probes, aside %v; want none yet", c, p, s.on)
	}
	if c, p := run(1, queued(2.7)); c != 1 || p != 1 || !s.on {
		t.Fatalf("the 100th sample at 2.7 queued: %d changes, %d probes, aside %v; want a probe", c, p, s.on)
	}
	// Vanilla's depth under 2: aside it stays.
	if c, _ := run(50, queued(1.7)); c != 0 || !s.on {
		t.Fatalf("1.7 aside: %d changes, aside %v; want aside kept", c, s.on)
	}
	// A load where vanilla queues too: back after two samples, and each
	// next probe twice as late, up to 80 s.
	s = asideState{}
	run(100, queued(2.7))
	if !s.on {
		t.Fatal("no probe after 100 samples at 2.7")
	}
	for _, wait := range []int{200, 400, 800, 800} {
		if c, _ := run(2, queued(2.4)); c != 1 || s.on {
			t.Fatalf("2.4 aside: %d changes, aside %v; want the queues back", c, s.on)
		}
		if got := s.nextProbe(r); got != wait {
			t.Fatalf("next probe after %d samples, want %d", got, wait)
		}
		if _, p := run(wait-1, queued(3.5)); p != 0 || s.on {
			t.Fatalf("a probe within %d samples (%d), or aside %v", wait, p, s.on)
		}
		if _, p := run(1, queued(3.5)); p != 1 || !s.on {
			t.Fatalf("no probe after %d samples under 4", wait)
		}
	}
	// One that finds vanilla's polls light stays aside: 10 s again for
	// the next, once a burst brought the queues back.
	run(r.AsideAfter+1, queued(1.5))
	if !s.on || s.nextProbe(r) != 100 {
		t.Fatalf("a probe aside at 1.5 for 1.1 s: aside %v, next probe after %d samples; want aside, 100", s.on, s.nextProbe(r))
	}
	run(2, queued(2.4))
	if _, p := run(100, queued(3.5)); !s.on || p != 1 {
		t.Fatalf("after a light probe: %d probes in 10 s queued, aside %v; want one", p, s.on)
	}
	// The window: back on the tenth sample aside (AsideAfter) still
	// doubles; aside for the whole of it brings the wait back to 10 s.
	s = asideState{}
	run(100, queued(2.7))
	run(r.AsideAfter-2, queued(1.5))
	run(2, queued(2.4))
	if s.on || s.nextProbe(r) != 200 {
		t.Fatalf("a probe back on its 10th sample: aside %v, next after %d samples; want the queues, 200", s.on, s.nextProbe(r))
	}
	s = asideState{}
	run(100, queued(2.7))
	run(r.AsideAfter, queued(1.5))
	if !s.on || s.nextProbe(r) != 100 {
		t.Fatalf("a probe aside for 10 samples: aside %v, next after %d samples; want aside, 100", s.on, s.nextProbe(r))
	}
	// Back on samples that read no depth: nothing learned, no doubling.
	s = asideState{}
	run(100, queued(2.7))
	run(r.BackAfter, asideSample{})
	if s.on || s.nextProbe(r) != 100 {
		t.Fatalf("a probe ended by failed samples: aside %v, next after %d samples; want the queues, 100", s.on, s.nextProbe(r))
	}
	// Without a ProbeMax over ProbeAfter, no doubling.
	flat := r
	flat.ProbeMax = 0
	s = asideState{}
	for i := range 3 {
		for range 99 {
			s.step(flat, queued(3.5))
		}
		if _, p := s.step(flat, queued(3.5)); !p {
			t.Fatalf("ProbeMax 0: no probe at the 100th sample of round %d", i)
		}
		s.step(flat, queued(2.4))
		s.step(flat, queued(2.4))
	}
	// Stepping aside by the rule does the same.
	s = asideState{}
	run(100, queued(2.7))
	run(2, queued(2.4))
	if s.nextProbe(r) != 200 {
		t.Fatalf("after one probe that came back: next after %d samples, want 200", s.nextProbe(r))
	}
	run(r.AsideAfter, queued(1.5))
	if !s.on || s.nextProbe(r) != 100 {
		t.Fatalf("aside by the rule: aside %v, next probe after %d samples; want aside, 100", s.on, s.nextProbe(r))
	}
	// A window whose samples swing either side of twice the depth goes
	// by their mean.
	s = asideState{}
	for i := range 100 {
		s.step(r, queued([]float64{2.5, 4.5}[i%2]))
	}
	if !s.on {
		t.Error("10 s queued at 2.5 and 4.5 frames a poll by turns (3.5 on average): no probe")
	}
	// Deep polls, or polls not counted: never.
	s = asideState{}
	if _, p := run(300, queued(4)); p != 0 || s.on {
		t.Errorf("4 frames a poll (2x the depth): %d probes", p)
	}
	if _, p := run(300, asideSample{rx: 80, depth: -1, ok: true}); p != 0 || s.on {
		t.Errorf("polls not counted, receive work over aside-below: %d probes", p)
	}
}

// loadOn is a load sample with receive work rx on core.
func loadOn(core int, rx float64) cpuload.Sample {
	return cpuload.Sample{Cores: []cpuload.Core{{CPU: core, Rx: rx}}}
}

// TestHighSwitchStepsAside: with aside-below in the applied config, the
// switch steps aside on its load samples of the config's core and writes
// the aside deadline asideTTL on at every sample, says so in its status
// and log, and clears it when it comes back, when the config drops it and
// when it stops; the rules' own switches are left to their rates. A
// sample without that core, or a failed one, counts as busy.
func TestHighSwitchStepsAside(t *testing.T) {
	light := testRule(t, "dst 198.19.0.21 port 11111 udp")
	busy := testRule(t, "dst 198.19.0.22 port 11211 tcp")
	dp := newFakeHigh(5000, light, busy)
	dp.below, dp.core = 20, 1
	h := newHighSwitch("/nowhere")
	dp.serve(h)
	mono := time.Hour
	h.mono = func() time.Duration { return mono }
	now := time.Unix(1000, 0)
	step := func(rx float64) string {
		now = now.Add(100 * time.Millisecond)
		mono += 100 * time.Millisecond
		dp.frames[light] += 100
		dp.frames[busy] += 1000
		h.takeLoad(loadOn(1, rx), true)
		return h.sample(now)
	}
	var log []string
	for range 5 {
		log = append(log, step(60))
	}
	if dp.aside != 0 || dp.inline[light] || !dp.inline[busy] {
		t.Fatalf("busy load: aside until %v, inline %v; want not aside, the busy rule's flows inline", dp.aside, dp.inline)
	}
	if !h.wantsLoad() {
		t.Error("the config steps aside, but the switch does not ask for load samples")
	}
	for range 10 {
		log = append(log, step(5))
	}
	if dp.aside != mono+asideTTL {
		t.Fatalf("stepped aside: deadline %v, want %v", dp.aside, mono+asideTTL)
	}
	if dp.inline[light] || !dp.inline[busy] {
		t.Errorf("stepped aside: inline %v, want the rules' own switches", dp.inline)
	}
	step(5)
	if dp.aside != mono+asideTTL {
		t.Errorf("stepped aside: deadline %v not renewed to %v", dp.aside, mono+asideTTL)
	}
	st := h.status()
	if a := st.Aside; a == nil || !a.On || a.Asides != 1 || a.RxPercent != 5 || a.Core != 1 || a.Below != 20 {
		t.Errorf("status %+v: want stepped aside once, at 5%% on core 1", a)
	}
	if sum := st.Summary(); !strings.Contains(sum, "stepped aside (receive work on core 1 5%, under 20%; asides 1)") {
		t.Errorf("summary %q does not say it stepped aside", sum)
	}
	if j := strings.Join(log, "\n"); !strings.Contains(j, "PRISM steps aside") {
		t.Errorf("log %q does not say it stepped aside", j)
	}
	// A sample that fails to reach the datapath: the deadline is not
	// renewed, and the status does not claim it.
	dp.fail = errors.New("gone")
	step(5)
	if st := h.status(); st.Aside != nil && st.Aside.On {
		t.Errorf("a failed sample: status %+v still claims the deadline", st.Aside)
	}
	dp.fail = nil
	log = log[:0]
	for range 2 {
		log = append(log, step(40))
	}
	if dp.aside != 0 || !dp.inline[busy] {
		t.Fatalf("back: aside until %v, inline %v; want not aside, the busy rule inline", dp.aside, dp.inline)
	}
	if st := h.status(); st.Aside.On || !strings.Contains(st.Summary(), "receive work on core 1 40% (steps aside under 20%; asides 1)") {
		t.Errorf("back: status %+v, summary %q", st.Aside, st.Summary())
	}
	if j := strings.Join(log, "\n"); !strings.Contains(j, "PRISM's queues again") {
		t.Errorf("log %q does not say the queues are back", j)
	}
	// Unknown load (failed, or without the core): the plan's placement.
	for range 10 {
		step(5)
	}
	if dp.aside == 0 {
		t.Fatal("not aside again")
	}
	h.takeLoad(cpuload.Sample{}, false)
	h.sample(now.Add(100 * time.Millisecond))
	h.takeLoad(loadOn(0, 5), true)
	h.sample(now.Add(200 * time.Millisecond))
	if dp.aside != 0 {
		t.Errorf("load unknown: still aside until %v", dp.aside)
	}
	if st := h.status(); st.Aside.RxPercent != -1 || !strings.Contains(st.Summary(), "not sampled") {
		t.Errorf("load unknown: status %+v", st.Aside)
	}
	// A re-apply without aside-below: back at once, said, not followed.
	for range 10 {
		step(5)
	}
	dp.below = 0
	if msg := step(5); !strings.Contains(msg, "does not step aside") || dp.aside != 0 || h.wantsLoad() || h.status().Aside != nil {
		t.Errorf("aside-below=0 applied: log %q, deadline %v, status %+v", msg, dp.aside, h.status().Aside)
	}
	// Stopping ends it too.
	dp.below = 20
	for range 10 {
		step(5)
	}
	if dp.aside == 0 {
		t.Fatal("not aside before the stop")
	}
	if err := h.stop(); err != nil || dp.aside != 0 {
		t.Errorf("stopped: aside until %v (%v), want 0", dp.aside, err)
	}
}

// TestHighSwitchAsideOff: without aside-below in the config the load
// changes nothing, and the deadline is never written.
func TestHighSwitchAsideOff(t *testing.T) {
	light := testRule(t, "dst 198.19.0.21 port 11111 udp")
	dp := newFakeHigh(5000, light)
	h := newHighSwitch("/nowhere")
	dp.serve(h)
	now := time.Unix(1000, 0)
	for range 20 {
		now = now.Add(100 * time.Millisecond)
		dp.frames[light] += 100
		h.takeLoad(loadOn(0, 0), true)
		h.sample(now)
	}
	if dp.inline[light] || dp.asideSets != 0 || h.wantsLoad() {
		t.Errorf("aside off: the light rule's flows went inline (%v), or the deadline was written %d times", dp.inline[light], dp.asideSets)
	}
	if st := h.status(); st.Aside != nil || strings.Contains(st.Summary(), "aside") {
		t.Errorf("aside off: status %+v, summary %q", st.Aside, st.Summary())
	}
}

// depthOn is a load sample with receive work rx on core whose NIC polls
// were counted: polls polls of frames frames.
func depthOn(core int, rx float64, polls, frames uint64) cpuload.Sample {
	return cpuload.Sample{NICWatched: true, Cores: []cpuload.Core{{CPU: core, Rx: rx, NIC: cpuload.NICCount{Polls: polls, Frames: frames}}}}
}

// TestHighSwitchStepsAsideByDepth: with aside-depth in the applied config
// the NIC's poll depth decides where it was counted: a busy core whose
// polls find a frame each steps aside, polls that find the threshold come
// back, and a sample without counted polls falls back to the receive
// work; the status and log say which signal decided.
func TestHighSwitchStepsAsideByDepth(t *testing.T) {
	light := testRule(t, "dst 198.19.0.21 port 11111 udp")
	dp := newFakeHigh(5000, light)
	dp.below, dp.depth, dp.core = 50, 250, 1
	h := newHighSwitch("/nowhere")
	dp.serve(h)
	mono := time.Hour
	h.mono = func() time.Duration { return mono }
	now := time.Unix(1000, 0)
	step := func(s cpuload.Sample) string {
		now = now.Add(100 * time.Millisecond)
		mono += 100 * time.Millisecond
		dp.frames[light] += 100
		h.takeLoad(s, true)
		return h.sample(now)
	}
	var log []string
	for range 11 {
		log = append(log, step(depthOn(1, 80, 1000, 1200)))
	}
	if !h.wantsDepth() {
		t.Error("the config steps aside by depth, but the switch does not ask for the NIC's polls")
	}
	if dp.aside != mono+asideTTL {
		t.Fatalf("busy core, 1.2 frames a poll: deadline %v, want stepped aside until %v", dp.aside, mono+asideTTL)
	}
	st := h.status()
	if a := st.Aside; a == nil || !a.On || a.FramesPerPoll != 1.2 || a.Depth != 2.5 || a.RxPercent != 80 {
		t.Errorf("status %+v: want stepped aside at 1.2 frames a poll (2.5), 80%%", a)
	}
	// The tenth sample stepped aside (AsideAfter), the eleventh renewed.
	asideAt := now.Add(-100 * time.Millisecond)
	if a := st.Aside; a != nil && !a.Since.Equal(asideAt) {
		t.Errorf("stepped aside at %v: status says since %v", asideAt, a.Since)
	}
	if sum := st.Summary(); !strings.Contains(sum, "stepped aside (the NIC's polls on core 1 find 1.20 frames each, under 2.50; receive work 80%") {
		t.Errorf("summary %q does not say the polls' depth stepped aside", sum)
	}
	if j := strings.Join(log, "\n"); !strings.Contains(j, "the NIC's polls on core 1 found under 2.50 frames each") {
		t.Errorf("log %q does not say why it stepped aside", j)
	}
	// Without the scheduler accounting (the guard turns it off while
	// aside by depth) the depth alone keeps it aside, the receive work
	// unknown; a sample that counted no polls either brings the queues
	// back, as one that failed.
	nicOnly := func(s cpuload.Sample) cpuload.Sample { s.NICOnly, s.Cores[0].Rx = true, 0; return s }
	step(nicOnly(depthOn(1, 80, 1000, 1100)))
	if !h.asideByDepth() || dp.aside != mono+asideTTL {
		t.Fatalf("NIC counts alone, 1.1 frames a poll: aside by depth %v, deadline %v; want still aside", h.asideByDepth(), dp.aside)
	}
	if a := h.status().Aside; a.RxPercent != -1 || a.FramesPerPoll != 1.1 {
		t.Errorf("NIC counts alone: status %+v; want no receive work, 1.1 frames a poll", a)
	}
	if sum := h.status().Summary(); !strings.Contains(sum, "receive work not sampled") {
		t.Errorf("summary %q: want the receive work not sampled", sum)
	}
	unpolled := nicOnly(depthOn(1, 0, 0, 0))
	unpolled.NICWatched = false
	step(unpolled)
	step(unpolled)
	if dp.aside != 0 || h.asideByDepth() {
		t.Fatalf("neither load nor polls: still aside until %v", dp.aside)
	}
	for range 10 {
		step(depthOn(1, 80, 1000, 1200))
	}
	if !h.asideByDepth() {
		t.Fatal("1.2 frames a poll: not aside again")
	}
	// Polls deep enough: the queues again after two samples.
	log = append(log, step(nicOnly(depthOn(1, 30, 1000, 2500))), step(depthOn(1, 30, 1000, 3000)))
	if dp.aside != 0 {
		t.Fatalf("2.5-3 frames a poll: still aside until %v", dp.aside)
	}
	if a := h.status().Aside; a.On || !a.Since.Equal(now) {
		t.Errorf("back in the queues at %v: status on %v since %v", now, a.On, a.Since)
	}
	if j := strings.Join(log, "\n"); !strings.Contains(j, "PRISM's queues again") {
		t.Errorf("log %q does not say it came back", j)
	}
	// Polls not counted: the receive work decides (30% < 50%).
	for range 10 {
		step(loadOn(1, 30))
	}
	if dp.aside != mono+asideTTL {
		t.Fatalf("polls not counted, receive work 30%%: deadline %v, want aside", dp.aside)
	}
	if sum := h.status().Summary(); !strings.Contains(sum, "stepped aside (receive work on core 1 30%, under 50%") {
		t.Errorf("summary %q: want the receive work's reason", sum)
	}
	// Queued at 3 frames a poll (under twice 2.5) for 10 s: a probe,
	// logged and counted.
	step(depthOn(1, 80, 1000, 3000))
	step(depthOn(1, 80, 1000, 3000))
	if dp.aside != 0 {
		t.Fatal("3 frames a poll: not back in the queues")
	}
	log = nil
	for range 100 {
		if msg := step(depthOn(1, 80, 1000, 3000)); msg != "" {
			log = append(log, msg)
		}
	}
	if dp.aside != mono+asideTTL || len(log) != 1 || !strings.Contains(log[0], "PRISM steps aside to read vanilla's depth") {
		t.Fatalf("10 s queued at 3 frames a poll: deadline %v, log %q; want one probe", dp.aside, log)
	}
	if st := h.status(); st.Aside.Probes != 1 || !strings.Contains(st.Summary(), "1 to read vanilla's depth") {
		t.Errorf("status %+v, summary %q: want the probe counted", st.Aside, st.Summary())
	}
	// Vanilla's polls at the depth: the queues back, the next probe
	// after 20 s, said in the log and the status, and its log says so.
	step(depthOn(1, 80, 1000, 3000))
	msg := step(depthOn(1, 80, 1000, 3000))
	if dp.aside != 0 || !strings.Contains(msg, "PRISM's queues again; the next probe after 20s in the queues") {
		t.Fatalf("probe at 3 frames a poll: deadline %v, log %q; want the queues back and the next probe after 20s", dp.aside, msg)
	}
	if st := h.status(); st.Aside.NextProbe != 20*time.Second || !strings.Contains(st.Summary(), "the next after 20s in the queues") {
		t.Errorf("status %+v, summary %q: want the next probe after 20s", st.Aside, st.Summary())
	}
	log = nil
	for range 200 {
		if msg := step(depthOn(1, 80, 1000, 3000)); msg != "" {
			log = append(log, msg)
		}
	}
	if len(log) != 1 || !strings.Contains(log[0], "in PRISM's queues over 20s") {
		t.Errorf("20 s queued at 3 frames a poll: log %q; want one probe, over 20s", log)
	}
	// A new threshold: the wait learned against the old one goes.
	step(depthOn(1, 80, 1000, 3000))
	step(depthOn(1, 80, 1000, 3000))
	dp.depth = 300
	step(depthOn(1, 80, 1000, 3500))
	if st := h.status(); st.Aside.NextProbe != 10*time.Second {
		t.Errorf("aside-depth 3 after two probes at 2.5: next probe after %v, want 10s", st.Aside.NextProbe)
	}
}

// A rule's switch into the NIC poll carries a deadline, which the switch
// renews at every sample while the rule is busy (asideTTL ahead, three
// samples while the guard dozes), so that an agent that dies leaves its
// flows to their queue; light again, the switch is cleared.
func TestHighSwitchRenewsInline(t *testing.T) {
	a := testRule(t, "dst 198.19.0.21 port 11211 tcp")
	dp := newFakeHigh(5000, a)
	h := newHighSwitch("/nowhere")
	dp.serve(h)
	var mono time.Duration
	h.mono = func() time.Duration { return mono }
	at := time.Unix(1000, 0)
	tick := func(frames uint64) {
		t.Helper()
		at, mono = at.Add(100*time.Millisecond), mono+100*time.Millisecond
		dp.frames[a] += frames
		if h.sample(at); h.err != "" {
			t.Fatal(h.err)
		}
	}
	tick(0)
	for range 3 {
		tick(800)
	}
	if !dp.inline[a] {
		t.Fatal("premise: 8000 frames/s goes inline")
	}
	for range 3 {
		if tick(800); dp.until[a] != mono+asideTTL {
			t.Errorf("deadline %v at %v, want renewed to %v", dp.until[a], mono, mono+asideTTL)
		}
	}
	h.doze = time.Second
	if tick(80); dp.until[a] != mono+3*time.Second {
		t.Errorf("dozing: deadline %v at %v, want three dozes ahead", dp.until[a], mono)
	}
	h.doze = 0
	for range 10 {
		tick(100)
	}
	if dp.inline[a] || dp.until[a] != 0 {
		t.Errorf("light again: switch %v until %v, want cleared", dp.inline[a], dp.until[a])
	}
}
