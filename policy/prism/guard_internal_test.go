package prism

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/heartbeat"
	"github.com/lanesnet/lanes/internal/kthread"
	"golang.org/x/sys/unix"
)

// TestBulkWaitShare: the bulk kthread's wait is a share of the time between
// two reads, whatever interval the sampler reports, and never above 100%
// (a guard delayed on its busy core once logged "waited 111%").
func TestBulkWaitShare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var clock time.Time
	var wait uint64
	b := &bulkTarget{
		threads:  []kthread.Info{{PID: 42, Comm: "cpumap/1/map:7"}},
		wait:     map[int]uint64{},
		now:      func() time.Time { return clock },
		readWait: func(int) (uint64, error) { return wait, nil },
	}
	const interval = 40 * time.Millisecond // what the sampler says
	for i, step := range []struct {
		advance time.Duration // clock since the last read
		waited  time.Duration // the kthread's wait since the last read
		want    float64
	}{
		{0, 0, 0}, // first read: no share yet
		{40 * time.Millisecond, 20 * time.Millisecond, 50},  // on time
		{time.Second, 500 * time.Millisecond, 50},           // the guard was late: 500 ms of 1 s, not of 40 ms
		{10 * time.Millisecond, 11 * time.Millisecond, 100}, // schedstat ahead of the clock: capped
		{40 * time.Millisecond, 0, 0},
	} {
		if i == 0 {
			clock = t0
		}
		clock = clock.Add(step.advance)
		wait += uint64(step.waited)
		got, err := b.signal(nil, interval)
		if err != nil {
			t.Fatal(err)
		}
		if got != step.want {
			t.Errorf("read %d: %.1f%%, want %.1f%%", i, got, step.want)
		}
	}
}

// noteKnob is a knob that changes nothing, to make a journal of an
// apply with.
type noteKnob struct{ Name string }

func (k noteKnob) Kind() string          { return "test-note" }
func (k noteKnob) Key() string           { return "test-note:" + k.Name }
func (k noteKnob) Read() ([]byte, error) { return []byte("x"), nil }
func (k noteKnob) Write(v []byte) error  { return nil }

// The bulk queue's guard writes its kthread under the journal's lock,
// while the journal is its apply's, and only to the thread it listed:
// while a reset holds the journal it writes nothing (it once checked the
// generation unlocked, then wrote whatever the reset left), and a pid
// another thread took since (started at another time: a pid reused after
// a reset) is not written. A child process stands for the kthread (its
// nice value only rises here, which needs no privilege).
func TestBulkGuardWritesItsThreadUnderTheJournal(t *testing.T) {
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})
	pid := child.Process.Pid
	ps, err := kthread.Thread{PID: pid}.ProcStat()
	if err != nil {
		t.Fatal(err)
	}
	nice := func() int32 {
		t.Helper()
		a, err := unix.SchedGetAttr(pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		return a.Nice
	}
	state := filepath.Join(t.TempDir(), "state")
	j, err := knobs.Open(state, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Record(noteKnob{"apply"}); err != nil {
		t.Fatal(err)
	}
	gen := knobs.Generation(j.Entries())
	j.Close()
	b := &bulkTarget{core: 1, threads: []kthread.Info{{PID: pid, Comm: "cpumap/1/map:7", Started: ps.StartTime}}, nice: 3, stateDir: state, gen: gen}
	if err := b.set(true); err != nil || nice() != 3 {
		t.Fatalf("premise: the guard demotes its thread to nice 3: %v, nice %d", err, nice())
	}

	j, err = knobs.Open(state, "test") // a reset, under way
	if err != nil {
		t.Fatal(err)
	}
	b.nice = 5
	if err := b.set(true); !errors.Is(err, knobs.ErrBusy) {
		t.Errorf("the guard's write while a reset holds the journal: %v, want busy", err)
	}
	if n := nice(); n != 3 {
		t.Errorf("nice %d after the guard's write during a reset, want 3 left", n)
	}
	j.Close()

	b.threads[0].Started++ // the listed thread gone, its pid taken by another
	b.nice = 6
	if err := b.set(true); !errors.Is(err, knobs.ErrGone) {
		t.Errorf("the guard's write to a pid another thread took: %v, want gone", err)
	}
	if n := nice(); n != 3 {
		t.Errorf("nice %d after the guard wrote a reused pid, want 3 left", n)
	}
}

// fakeSource is a load sampler whose samples a test scripts: each call
// takes the next error (nil: a sample with core 0 at the given signal).
type fakeSource struct {
	mu   sync.Mutex
	errs []error
	idle float64
}

func (f *fakeSource) Sample() (cpuload.Sample, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		if err != nil {
			return cpuload.Sample{}, err
		}
	}
	return cpuload.Sample{At: time.Now(), Interval: time.Millisecond, Cores: []cpuload.Core{{CPU: 0, Idle: f.idle}}}, nil
}

func (f *fakeSource) Close() error { return nil }

// fakeTarget records what the guard switches it to; err is what set
// returns, sig the signal it shows, at what current says it is at
// (demoted, known).
type fakeTarget struct {
	mu   sync.Mutex
	sets []bool
	err  error
	sig  float64
	at   [2]bool
}

func (f *fakeTarget) signal([]cpuload.Thread, time.Duration) (float64, error) { return f.sig, nil }
func (f *fakeTarget) needsThreads() bool                                      { return false }
func (f *fakeTarget) current() (demoted, known bool)                          { return f.at[0], f.at[1] }
func (f *fakeTarget) set(d bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, d)
	return f.err
}
func (f *fakeTarget) names() []string { return nil }
func (f *fakeTarget) watch() string   { return "fake" }
func (f *fakeTarget) demote() string  { return "demote %v %v %v" }
func (f *fakeTarget) promote() string { return "promote %v %v %v" }
func (f *fakeTarget) calls() []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sets)
}

func runGuard(t *testing.T, g *guard, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return g.run(ctx)
}

// A sampling error skips the round (it once ended the agent, and the
// guard's exit put the NIC poll back on the ladder under overload); many
// in a row hold the safe placement, demoted, and say so, until sampling
// works again.
func TestGuardSurvivesSamplerFailures(t *testing.T) {
	fail := errors.New("sampler broke")
	src := &fakeSource{errs: []error{nil, fail, fail, fail, fail, fail, fail}, idle: 100}
	tg := &fakeTarget{}
	g := &guard{rule: GuardRule{Demote: 90, DemoteAfter: 3, Promote: 10, PromoteAfter: 1000, Interval: time.Millisecond}, target: tg,
		newSource: func() (cpuload.Source, error) { return src, nil }}
	if err := runGuard(t, g, 200*time.Millisecond); err != nil {
		t.Fatalf("the guard ended: %v", err)
	}
	st := g.Status()
	if st.SampleErrors != 6 || !strings.Contains(st.Err, "sampler broke") {
		t.Errorf("status %+v: want 6 sample errors shown", st)
	}
	if !slices.Contains(tg.calls(), true) {
		t.Errorf("target switched %v: want the safe placement (demoted) after %d failures in a row", tg.calls(), guardFailLimit)
	}
	if st.Fallback != "" {
		t.Errorf("fallback %q still held once sampling worked again", st.Fallback)
	}
	// Stopped while demoted: left demoted, the last switch is to demoted.
	if c := tg.calls(); c[len(c)-1] != true {
		t.Errorf("switches %v: the guard put the plan's value back on its way out", c)
	}
}

// A guard restarted under overload over a target its predecessor left
// demoted starts demoted: it never puts the NIC poll back on the ladder
// for its first samples (the collapse it exists to prevent) to demote it
// again three samples later. One over a target at the plan's value
// starts there and demotes once; one over a target it cannot tell
// writes its decision at the first sample.
func TestGuardResumesWhereItsTargetIs(t *testing.T) {
	rule := GuardRule{Demote: 90, DemoteAfter: 3, Promote: 10, PromoteAfter: 3, Interval: time.Millisecond}
	for _, c := range []struct {
		name string
		at   [2]bool
		want []bool
	}{
		{"left demoted", [2]bool{true, true}, nil},
		{"at the plan's value", [2]bool{false, true}, []bool{true}},
		{"not known", [2]bool{false, false}, []bool{false, true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tg := &fakeTarget{sig: 100, at: c.at} // overload: the NIC poll runs all the time, the core never idles
			g := &guard{rule: rule, target: tg, newSource: func() (cpuload.Source, error) { return &fakeSource{idle: 0}, nil }}
			waitUntil, stop := startGuard(t, g)
			waitUntil("a demoted guard", func() bool { return g.Status().Demoted })
			time.Sleep(20 * time.Millisecond) // more samples under overload
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got := tg.calls(); !slices.Equal(got, c.want) {
				t.Errorf("switches %v under overload, want %v", got, c.want)
			}
		})
	}
}

// A kernel thread that is gone is skipped; a reset, or a newer apply,
// ends the guard without another write.
func TestGuardKthreadGoneAndStale(t *testing.T) {
	rule := GuardRule{Demote: 90, DemoteAfter: 3, Promote: 10, PromoteAfter: 3, Interval: time.Millisecond}
	gone := &fakeTarget{err: fmt.Errorf("thread: %w", knobs.ErrGone)}
	g := &guard{rule: rule, target: gone, newSource: func() (cpuload.Source, error) { return &fakeSource{idle: 100}, nil }}
	if err := runGuard(t, g, 50*time.Millisecond); err != nil {
		t.Fatalf("the guard ended on a gone thread: %v", err)
	}
	stale := &fakeTarget{err: fmt.Errorf("x: %w", knobs.ErrStale)}
	g = &guard{rule: rule, target: stale, newSource: func() (cpuload.Source, error) { return &fakeSource{idle: 100}, nil }}
	start := time.Now()
	if err := runGuard(t, g, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 4*time.Second || len(stale.calls()) != 1 || g.Status().Stopped == "" {
		t.Errorf("after a stale write: %d writes, status %+v: want the guard stopped at once", len(stale.calls()), g.Status())
	}
}

// A guard with no target of its own (high=auto alone) opens a load
// sampler once the applied config steps aside, and hands its samples of
// the config's core to the switch, which then steps aside; with no
// aside-below in the config it opens none.
func TestGuardFeedsAside(t *testing.T) {
	for _, below := range []uint32{20, 0} {
		dp := newFakeHigh(5000)
		dp.below, dp.core = below, 0
		opens := 0
		src := &fakeSource{idle: 100} // core 0, no receive work
		h := newHighSwitch("/nowhere")
		dp.serve(h)
		g := &guard{rule: GuardRule{Interval: time.Millisecond}, core: -1, high: h,
			newSource: func() (cpuload.Source, error) { opens++; return src, nil }}
		if err := runGuard(t, g, 200*time.Millisecond); err != nil {
			t.Fatalf("aside-below %d: the guard ended: %v", below, err)
		}
		if below == 0 {
			if opens != 0 || dp.asideSets != 0 {
				t.Errorf("aside-below 0: %d samplers opened, deadline written %d times; want none", opens, dp.asideSets)
			}
			continue
		}
		st := g.Status()
		if opens != 1 || st.High == nil || st.High.Aside == nil || st.High.Aside.Asides == 0 || st.High.Aside.RxPercent != 0 {
			t.Errorf("aside-below %d: %d samplers opened, status %+v; want one, and PRISM stepped aside at 0%%", below, opens, st.High)
		}
		if dp.aside != 0 {
			t.Errorf("the guard stopped, but the deadline %v stays", dp.aside)
		}
	}
}

// startGuard runs g until stop; waitUntil fails the test (stopping g)
// when cond does not hold within 10 s.
func startGuard(t *testing.T, g *guard) (waitUntil func(what string, cond func() bool), stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.run(ctx) }()
	stop = func() error {
		cancel()
		return <-done
	}
	waitUntil = func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("no %s in 10 s", what)
			}
		}
	}
	return waitUntil, stop
}

// The guard says while the datapath stands PRISM aside (the sync agent's
// rounds wait then), and calls back when it no longer does: when the
// load can no longer be sampled here, and when the guard stops.
func TestGuardTellsWhenAsideEnds(t *testing.T) {
	dp := newFakeHigh(5000)
	dp.below, dp.core = 20, 0
	src := &fakeSource{idle: 100} // core 0, no receive work: aside
	h := newHighSwitch("/nowhere")
	dp.serve(h)
	g := &guard{rule: GuardRule{Interval: time.Millisecond}, core: -1, high: h,
		newSource: func() (cpuload.Source, error) { return src, nil }}
	ends := make(chan struct{}, 10)
	g.whenAsideEnds(func() { ends <- struct{}{} })
	waitUntil, stop := startGuard(t, g)
	waitUntil("stepping aside", g.standsAside)
	if len(ends) != 0 {
		t.Errorf("called back %d times while aside", len(ends))
	}
	src.mu.Lock()
	src.errs = []error{errors.New("no sample"), errors.New("no sample"), errors.New("no sample")}
	src.mu.Unlock()
	waitUntil("end of aside", func() bool { return len(ends) > 0 })
	if g.standsAside() {
		t.Error("called back, still aside")
	}
	waitUntil("stepping aside again", g.standsAside)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if g.standsAside() || len(ends) != 2 {
		t.Errorf("stopped: aside %v, %d callbacks; want not aside, two", g.standsAside(), len(ends))
	}
}

// depthSource is a scheduler-event sampler's fake: its samples count the
// NIC's polls on core 0 at fpp frames a poll and, like SchedSampler's,
// say NICOnly while its accounting is off; it records the switches.
type depthSource struct {
	mu       sync.Mutex
	fpp      float64
	off      bool
	switches []bool
	failOn   bool // SetAccounting(true) fails, leaving it off
}

func (f *depthSource) Sample() (cpuload.Sample, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := cpuload.Core{CPU: 0, Idle: 50, Rx: 50, NIC: cpuload.NICCount{Polls: 100, Frames: uint64(f.fpp * 100)}}
	if f.off {
		c.Idle, c.Rx = 0, 0
	}
	return cpuload.Sample{At: time.Now(), Interval: time.Millisecond, NICWatched: true, NICOnly: f.off, Cores: []cpuload.Core{c}}, nil
}

func (f *depthSource) SetAccounting(on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on && f.failOn {
		return errors.New("attach refused")
	}
	if f.off == on {
		f.switches = append(f.switches, on)
	}
	f.off = !on
	return nil
}

func (f *depthSource) Close() error { return nil }

func (f *depthSource) set(fpp float64) {
	f.mu.Lock()
	f.fpp = fpp
	f.mu.Unlock()
}

// asideGuard is a guard with high=auto stepping aside by the depth
// (threshold 2 frames a poll on core 0) over src, sampling every
// millisecond and dozing every doze (0: never), with a target to guard.
func asideGuard(src cpuload.Source, doze time.Duration) (*guard, *fakeHigh, *fakeTarget) {
	dp := newFakeHigh(5000)
	dp.below, dp.depth, dp.core = 50, 200, 0
	h := newHighSwitch("/nowhere")
	dp.serve(h)
	tg := &fakeTarget{}
	g := &guard{rule: GuardRule{Demote: 90, DemoteAfter: 3, Promote: 10, PromoteAfter: 3, Interval: time.Millisecond, Doze: doze}, core: 0, high: h, target: tg,
		newSource: func() (cpuload.Source, error) { return src, nil }}
	g.status.Watch = tg.watch()
	return g, dp, tg
}

// While PRISM stands aside by the NIC's poll depth the guard turns the
// sampler's scheduler accounting off (the depth is all coming back
// needs), leaves its target alone and says the load is not sampled; it
// turns the accounting on again when the queues come back.
func TestGuardPausesAccountingAside(t *testing.T) {
	src := &depthSource{fpp: 1}
	g, _, tg := asideGuard(src, 0)
	waitUntil, stop := startGuard(t, g)
	paused := func() bool { return g.Status().LoadPaused }
	waitUntil("load paused while aside", paused)
	if !g.standsAside() {
		t.Error("load paused, not aside")
	}
	if sum := strings.Join(g.Status().Summary(), "\n"); !strings.Contains(sum, "load not sampled while PRISM stands aside") {
		t.Errorf("summary %q does not say the load is not sampled", sum)
	}
	sets := len(tg.calls())
	time.Sleep(20 * time.Millisecond)
	if n := len(tg.calls()); n != sets {
		t.Errorf("target switched %d times while the load was not sampled", n-sets)
	}
	src.set(3)
	waitUntil("load sampled again", func() bool { return !paused() && !g.standsAside() })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if !slices.Equal(src.switches, []bool{false, true}) {
		t.Errorf("accounting switched %v; want off once aside, on once back", src.switches)
	}
}

// wakeSource is a depthSource the kernel can wake (waker): the test
// sends the wakes.
type wakeSource struct {
	depthSource
	samples int
	arms    []float64 // the depths armed, in order
	disarms int
	window  time.Duration
	polls   int
	wakes   chan cpuload.Wake
}

func (f *wakeSource) Sample() (cpuload.Sample, error) {
	f.mu.Lock()
	f.samples++
	f.mu.Unlock()
	return f.depthSource.Sample()
}

func (f *wakeSource) ArmWake(core int, depth float64, window time.Duration, minPolls int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.arms, f.window, f.polls = append(f.arms, depth), window, minPolls
	return nil
}

func (f *wakeSource) DisarmWake() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disarms++
	return nil
}

func (f *wakeSource) Wakes() <-chan cpuload.Wake { return f.wakes }

func (f *wakeSource) count() (samples, arms, disarms int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.samples, len(f.arms), f.disarms
}

// Stood aside by the depth for dozeAfter samples, the guard dozes: the
// kernel's wake armed at the depth over windows of its interval, no
// sample until the next doze tick (an hour here) or a wake, the deadline
// written to hold three doze ticks, the status saying so. A wake has it
// sample at once and at its interval again; a wake the depth does not
// confirm has it doze again after dozeAfter samples, and one it does
// brings the queues back, undozed.
func TestGuardDozesAside(t *testing.T) {
	src := &wakeSource{depthSource: depthSource{fpp: 1}, wakes: make(chan cpuload.Wake, 1)}
	const doze = time.Hour
	g, dp, _ := asideGuard(src, doze)
	g.high.mono = func() time.Duration { return 0 } // deadlines are their TTL
	waitUntil, stop := startGuard(t, g)
	dozing := func() bool {
		st := g.Status()
		return st.High != nil && st.High.Aside != nil && st.High.Aside.Doze == doze
	}
	waitUntil("dozing", dozing)
	if sum := strings.Join(g.Status().Summary(), "\n"); !strings.Contains(sum, "the agent samples every 1h0m0s until the NIC's polls deepen") {
		t.Errorf("summary %q does not say the agent dozes", sum)
	}
	n, arms, _ := src.count()
	time.Sleep(20 * time.Millisecond)
	if m, _, _ := src.count(); m != n {
		t.Errorf("%d samples while dozing, before any wake", m-n)
	}
	if arms != 1 {
		t.Errorf("wake armed %d times, want once", arms)
	}
	src.wakes <- cpuload.Wake{CPU: 0, Polls: 10, Frames: 25}
	waitUntil("a sample after the wake", func() bool { m, _, _ := src.count(); return m > n })
	// Still aside by the depth (1 frame a poll): dozing again.
	waitUntil("dozing again", func() bool { _, a, _ := src.count(); return a == 2 && dozing() })
	src.set(3)
	src.wakes <- cpuload.Wake{CPU: 0, Polls: 10, Frames: 30}
	waitUntil("the queues back", func() bool { return !g.standsAside() && !g.Status().LoadPaused })
	if dozing() {
		t.Error("dozing with the queues back")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if !slices.Equal(src.arms, []float64{2, 2}) || src.window != time.Millisecond || src.polls != dozeMinPolls || src.disarms < 2 {
		t.Errorf("armed %v over %v, %d polls, disarmed %d times: want depth 2 twice over the interval, %d polls, disarmed on each wake", src.arms, src.window, src.polls, src.disarms, dozeMinPolls)
	}
	if dp.asideMax != 3*doze {
		t.Errorf("latest aside deadline %v ahead, want %v (three doze ticks)", dp.asideMax, 3*doze)
	}
}

// Dozing, a sample that found the depth ends the doze though no wake
// came (a window of too few polls wakes nothing), and so does a config
// with another threshold or core than the wake was armed for; a quiet
// one at the armed depth and core does not. Each end disarms.
func TestGuardDozeEnds(t *testing.T) {
	for _, c := range []struct {
		name  string
		fpp   float64
		depth uint32
		core  int
		ends  bool
	}{
		{"quiet", 1, 200, 0, false},
		{"the depth found", 2, 200, 0, true},
		{"another threshold", 1, 150, 0, true},
		{"another core", 1, 200, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := &wakeSource{depthSource: depthSource{off: true}}
			h := newHighSwitch("/nowhere")
			h.aside.on, h.asideSet = true, true
			h.depth, h.core, h.fpp, h.doze = c.depth, c.core, c.fpp, time.Hour
			g := &guard{rule: GuardRule{Interval: time.Millisecond, Doze: time.Hour}, high: h, accountOff: true,
				armed: armed{core: 0, depth: 200}}
			tick := time.NewTicker(time.Hour)
			defer tick.Stop()
			g.doze(src, tick)
			if _, _, disarms := src.count(); g.dozing() == c.ends || (disarms == 1) != c.ends {
				t.Errorf("dozing %v after the round, disarmed %d times; want the doze ended: %v", g.dozing(), disarms, c.ends)
			}
			if c.ends && h.doze != 0 {
				t.Errorf("the switch still told of a %v doze", h.doze)
			}
		})
	}
}

// When the accounting cannot be turned back on, the guard does not take
// its NIC-only samples for a pause: they count as failed, and enough of
// them hold the safe placement (demoted).
func TestGuardAccountingNotBack(t *testing.T) {
	src := &depthSource{fpp: 1, failOn: true}
	g, _, tg := asideGuard(src, 0)
	waitUntil, stop := startGuard(t, g)
	waitUntil("load paused while aside", func() bool { return g.Status().LoadPaused })
	src.set(3)
	waitUntil("the safe placement", func() bool { return g.Status().Fallback != "" })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := g.Status()
	if !st.Demoted || st.SampleErrors < guardFailLimit || !strings.Contains(st.Err, "could not be turned back on") {
		t.Errorf("status %+v: want demoted after %d failed samples, saying why", st, guardFailLimit)
	}
	if c := tg.calls(); len(c) == 0 || !c[len(c)-1] {
		t.Errorf("target switched %v: want the safe placement last", c)
	}
}

// hangSource is a fakeSource whose Sample hangs, once hang is set, until
// release closes: a guard round stuck in the kernel or behind a lock.
type hangSource struct {
	fakeSource
	hang    atomic.Bool
	hung    chan struct{} // closed when a Sample hangs
	release chan struct{}
}

func (f *hangSource) Sample() (cpuload.Sample, error) {
	if f.hang.CompareAndSwap(true, false) {
		close(f.hung)
		<-f.release
	}
	return f.fakeSource.Sample()
}

// testClock is a clock a test moves, read by other goroutines.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) add(d time.Duration)     { c.ns.Add(int64(d)) }
func stuckLoops(b *heartbeat.Board) []string { return heartbeat.Stuck(b.Loops()) }

// The guard's loop beats at every turn: while it turns, time passing
// leaves it alive; stuck in a round (a sample that hangs), it is overdue
// on the agent's board, by name.
func TestGuardHeartbeat(t *testing.T) {
	clock := &testClock{}
	board := heartbeat.NewBoard(clock.now)
	src := &hangSource{fakeSource: fakeSource{idle: 100}, hung: make(chan struct{}), release: make(chan struct{})}
	g := &guard{env: plan.AgentEnv{Beats: board}, rule: GuardRule{Demote: 90, DemoteAfter: 3, Promote: 10, PromoteAfter: 3, Interval: time.Millisecond},
		target: &fakeTarget{}, newSource: func() (cpuload.Source, error) { return src, nil }}
	_, stop := startGuard(t, g)
	defer func() {
		close(src.release)
		stop()
	}()
	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s in 10 s: loops %+v", what, board.Loops())
			}
		}
	}
	wait("guard's loop on the board", func() bool { return len(board.Loops()) == 1 })
	clock.add(heartbeat.StaleAfter + time.Second)
	wait("beat after the clock moved on", func() bool { return len(stuckLoops(board)) == 0 })
	src.hang.Store(true)
	<-src.hung
	clock.add(heartbeat.StaleAfter + time.Second)
	if s := stuckLoops(board); len(s) != 1 || !strings.HasPrefix(s[0], "prism guard: no beat") {
		t.Errorf("stuck %q, want the guard", s)
	}
}

// A guard that dozes (standing aside, sampling every Doze) says so: its
// beat is due only after five dozes, so a doze longer than StaleAfter is
// not a hang.
func TestGuardDozeIsNotStuck(t *testing.T) {
	clock := &testClock{}
	board := heartbeat.NewBoard(clock.now)
	src := &wakeSource{depthSource: depthSource{fpp: 1}, wakes: make(chan cpuload.Wake, 1)}
	g, _, _ := asideGuard(src, time.Hour)
	g.env.Beats = board
	waitUntil, stop := startGuard(t, g)
	defer stop()
	waitUntil("dozing", func() bool {
		st := g.Status()
		return st.High != nil && st.High.Aside != nil && st.High.Aside.Doze == time.Hour
	})
	clock.add(10 * time.Minute)
	if s := stuckLoops(board); len(s) != 0 {
		t.Errorf("stuck %q while dozing", s)
	}
	if l := board.Loops(); len(l) != 1 || !l[0].Dozing {
		t.Errorf("loops %+v, want the guard, dozing", l)
	}
}
