package cpuload

import (
	"github.com/lanesnet/lanes/internal/kthread"

	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeProc is a /proc tree in a temporary directory.
type fakeProc struct {
	t    *testing.T
	root string
}

func newFakeProc(t *testing.T) *fakeProc {
	return &fakeProc{t: t, root: t.TempDir()}
}

func (p *fakeProc) write(rel, content string) {
	p.t.Helper()
	path := filepath.Join(p.root, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

func (p *fakeProc) stat(cpus ...CPUTimes) {
	var b strings.Builder
	b.WriteString("cpu  0 0 0 0 0 0 0 0 0 0\n")
	for i, c := range cpus {
		fmt.Fprintf(&b, "cpu%d %d %d %d %d %d %d %d %d 0 0\n", i, c.User, c.Nice, c.System, c.Idle, c.IOWait, c.IRQ, c.SoftIRQ, c.Steal)
	}
	b.WriteString("intr 1 2 3\nctxt 10\nbtime 1767000000\n")
	p.write("stat", b.String())
}

type task struct {
	pid     int
	comm    string
	kthread bool
	ticks   uint64
	start   uint64
	cpu     int
	sched   string // schedstat content; "" for no file
	policy  int
	dir     string // task directory relative to /proc; "" for "PID"
}

func (p *fakeProc) task(k task) {
	p.t.Helper()
	f := make([]string, 50) // fields 3..52
	for i := range f {
		f[i] = "0"
	}
	set := func(field int, v any) { f[field-3] = fmt.Sprint(v) }
	set(3, "S")
	set(4, 2)
	flags := 0x00400040
	if k.kthread {
		flags |= kthread.PFKthread
	}
	set(9, flags)
	set(14, k.ticks)
	set(22, k.start)
	set(39, k.cpu)
	set(41, k.policy)
	dir := fmt.Sprint(k.pid)
	if k.dir != "" {
		dir = k.dir
	}
	p.write(filepath.Join(dir, "stat"), fmt.Sprintf("%d (%s) %s\n", k.pid, k.comm, strings.Join(f, " ")))
	if k.sched != "" {
		p.write(filepath.Join(dir, "schedstat"), k.sched)
	}
}

func (p *fakeProc) remove(pid int) {
	if err := os.RemoveAll(filepath.Join(p.root, fmt.Sprint(pid))); err != nil {
		p.t.Fatal(err)
	}
}

// clock returns t0, t0+step, t0+2*step, ... one per call.
func clock(step time.Duration) func() time.Time {
	t := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(-step)
	return func() time.Time { t = t.Add(step); return t }
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func sched(ns uint64) string { return fmt.Sprintf("%d 12345 678\n", ns) }

func TestSampler(t *testing.T) {
	p := newFakeProc(t)
	p.stat(CPUTimes{User: 1000, System: 1000, Idle: 5000}, CPUTimes{User: 2000, Idle: 4000})
	p.task(task{pid: 2, comm: "kthreadd", kthread: true})
	p.write("2/task/2/children", "100 3922 3926 300 4000 812\n")
	p.task(task{pid: 100, comm: "kworker/0:1-events", kthread: true, cpu: 0, sched: sched(5e9)})
	p.task(task{pid: 3922, comm: "napi/ul1-258", kthread: true, cpu: 1, start: 10, sched: sched(1e9)})
	// No schedstat worth the name: run time comes from ticks.
	p.task(task{pid: 3926, comm: "napi/ul2-259", kthread: true, cpu: 0, start: 11, ticks: 500, sched: "0 0 0\n"})
	p.task(task{pid: 300, comm: "cpumap/1/map:3", kthread: true, cpu: 1, start: 12, sched: sched(7e9)})
	p.task(task{pid: 4000, comm: "napi/old-1", kthread: true, cpu: 0, start: 13, sched: sched(9e9)})
	p.task(task{pid: 812, comm: "cpumap/0/map:17", kthread: true, cpu: 1, start: 14, sched: sched(2e9)})

	s, err := newSampler(p.root, clock(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s.rescan = time.Hour

	// One second, 100 ticks per core.
	p.stat(
		CPUTimes{User: 1015, Nice: 5, System: 1010, IRQ: 2, SoftIRQ: 30, Steal: 3, Idle: 5030, IOWait: 5},
		CPUTimes{User: 2000, SoftIRQ: 10, Idle: 4090},
	)
	p.task(task{pid: 100, comm: "kworker/0:1-events", kthread: true, cpu: 0, sched: sched(6e9)})
	p.task(task{pid: 3922, comm: "napi/ul1-258", kthread: true, cpu: 1, start: 10, sched: sched(1.25e9)})         // +250 ms
	p.task(task{pid: 3926, comm: "napi/ul2-259", kthread: true, cpu: 0, start: 11, ticks: 520, sched: "0 0 0\n"}) // +200 ms
	p.remove(300)                                                                                                 // exited: dropped without error
	// pid 4000 now names another thread: no delta against the old one.
	p.task(task{pid: 4000, comm: "napi/new-2", kthread: true, cpu: 0, start: 99, sched: sched(1e6)})
	// Migrated to core 0 and ran 900 ms: all of it lands on core 0.
	p.task(task{pid: 812, comm: "cpumap/0/map:17", kthread: true, cpu: 0, start: 14, sched: sched(2.9e9)})

	sm, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if sm.Interval != time.Second || len(sm.Cores) != 2 {
		t.Fatalf("sample %+v", sm)
	}
	c0, c1 := sm.Cores[0], sm.Cores[1]
	want0 := Core{CPU: 0, Busy: 65, User: 20, System: 10, IRQ: 2, SoftIRQ: 30, Steal: 3, Idle: 35, RxKthreads: 100, Rx: 100}
	want1 := Core{CPU: 1, Busy: 10, SoftIRQ: 10, Idle: 90, RxKthreads: 25, Rx: 35}
	for _, tc := range []struct{ got, want Core }{{c0, want0}, {c1, want1}} {
		g, w := tc.got, tc.want
		if g.CPU != w.CPU || !near(g.Busy, w.Busy) || !near(g.User, w.User) || !near(g.System, w.System) ||
			!near(g.IRQ, w.IRQ) || !near(g.SoftIRQ, w.SoftIRQ) || !near(g.Steal, w.Steal) || !near(g.Idle, w.Idle) ||
			!near(g.RxKthreads, w.RxKthreads) || !near(g.Rx, w.Rx) || !near(g.Tasks, w.Tasks) {
			t.Errorf("core %d:\n got %+v\nwant %+v", w.CPU, g, w)
		}
	}
	if c, ok := sm.Core(1); !ok || c != c1 {
		t.Errorf("Core(1) = %+v, %v", c, ok)
	}
	if _, ok := sm.Core(7); ok {
		t.Error("Core(7) found")
	}

	// 20 ticks = 200 ms (3926) and 900 ms (812) on core 0, uncapped.
	want := []Thread{
		{PID: 812, Comm: "cpumap/0/map:17", CPU: 0, Percent: 90},
		{PID: 3922, Comm: "napi/ul1-258", CPU: 1, Percent: 25},
		{PID: 3926, Comm: "napi/ul2-259", CPU: 0, Percent: 20},
	}
	checkThreads(t, s.Threads(), want)

	// Second interval: the reused pid 4000 is measured against its new
	// baseline, and a thread that appeared is picked up by the rescan but
	// only measured from the next sample.
	s.rescan = 0
	p.write("2/task/2/children", "100 3922 3926 4000 812 5000\n")
	p.task(task{pid: 5000, comm: "napi/veth1-9000", kthread: true, cpu: 1, start: 200, sched: sched(3e9)})
	p.task(task{pid: 4000, comm: "napi/new-2", kthread: true, cpu: 0, start: 99, sched: sched(101e6)}) // +100 ms
	p.stat(
		CPUTimes{User: 1115, Nice: 5, System: 1010, IRQ: 2, SoftIRQ: 30, Steal: 3, Idle: 5030, IOWait: 5},
		CPUTimes{User: 2000, SoftIRQ: 10, Idle: 4190},
	)
	if sm, err = s.Sample(); err != nil {
		t.Fatal(err)
	}
	// A user task burned the core but for the receive kthread's 10%.
	if c := sm.Cores[0]; !near(c.Busy, 100) || !near(c.User, 100) || !near(c.RxKthreads, 10) || !near(c.Rx, 10) || !near(c.Tasks, 90) {
		t.Errorf("core 0 in second interval: %+v", c)
	}
	checkThreads(t, s.Threads(), []Thread{
		{PID: 812, Comm: "cpumap/0/map:17", CPU: 0, Percent: 0},
		{PID: 3922, Comm: "napi/ul1-258", CPU: 1, Percent: 0},
		{PID: 3926, Comm: "napi/ul2-259", CPU: 0, Percent: 0},
		{PID: 4000, Comm: "napi/new-2", CPU: 0, Percent: 10},
	})

	p.task(task{pid: 5000, comm: "napi/veth1-9000", kthread: true, cpu: 1, start: 200, sched: sched(3.5e9)})
	if _, err = s.Sample(); err != nil {
		t.Fatal(err)
	}
	if th := s.Threads(); len(th) != 5 || th[4].PID != 5000 || !near(th[4].Percent, 50) {
		t.Errorf("new thread not measured after its first sample: %+v", th)
	}
}

func checkThreads(t *testing.T, got, want []Thread) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("threads %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.PID != w.PID || g.Comm != w.Comm || g.CPU != w.CPU || !near(g.Percent, w.Percent) {
			t.Errorf("thread %d: %+v, want %+v", i, g, w)
		}
	}
}

// Without kthreadd's children list, /proc is walked, and a user process
// that names itself like a NAPI thread is not taken for one.
func TestSamplerWalk(t *testing.T) {
	p := newFakeProc(t)
	p.stat(CPUTimes{Idle: 100})
	p.task(task{pid: 2, comm: "kthreadd", kthread: true}) // no children file
	p.task(task{pid: 3922, comm: "napi/ul1-258", kthread: true, sched: sched(1e9)})
	p.task(task{pid: 4242, comm: "napi/ul1-258", kthread: false, sched: sched(1e9)})
	p.write("self/stat", "not a pid directory")
	s, err := newSampler(p.root, clock(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	p.stat(CPUTimes{Idle: 110})
	p.task(task{pid: 3922, comm: "napi/ul1-258", kthread: true, sched: sched(1.05e9)})
	p.task(task{pid: 4242, comm: "napi/ul1-258", kthread: false, sched: sched(1.05e9)})
	sm, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	checkThreads(t, s.Threads(), []Thread{{PID: 3922, Comm: "napi/ul1-258", CPU: 0, Percent: 50}})
	if c := sm.Cores[0]; !near(c.RxKthreads, 50) || !near(c.Idle, 100) || !near(c.Rx, 50) {
		t.Errorf("core 0: %+v", c)
	}
}

// CPUs that come online mid-way have no baseline; counters that step back
// and intervals without a tick read as 0, not as garbage.
func TestSamplerEdges(t *testing.T) {
	p := newFakeProc(t)
	p.stat(CPUTimes{User: 10, Idle: 100})
	s, err := newSampler(p.root, clock(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	p.stat(CPUTimes{User: 10, Idle: 100}, CPUTimes{Idle: 7})
	sm, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if len(sm.Cores) != 1 || sm.Cores[0] != (Core{CPU: 0}) {
		t.Errorf("tickless interval / new CPU: %+v", sm.Cores)
	}
	p.stat(CPUTimes{User: 11, Idle: 99}, CPUTimes{Idle: 8})
	if sm, err = s.Sample(); err != nil {
		t.Fatal(err)
	}
	if len(sm.Cores) != 2 || !near(sm.Cores[0].Busy, 100) || !near(sm.Cores[1].Idle, 100) {
		t.Errorf("idle stepping back: %+v", sm.Cores)
	}

	// A broken /proc/stat is an error and keeps the previous snapshot.
	p.write("stat", "garbage\n")
	if _, err := s.Sample(); err == nil {
		t.Error("no error for a /proc/stat without CPUs")
	}
	p.stat(CPUTimes{User: 12, Idle: 99}, CPUTimes{Idle: 9})
	if sm, err = s.Sample(); err != nil || sm.Interval != 10*time.Millisecond {
		t.Errorf("after an error: interval %v, %v; want both intervals", sm.Interval, err)
	}
	if _, err := newSampler(filepath.Join(p.root, "nope"), time.Now); err == nil {
		t.Error("no error without /proc/stat")
	}
}

// SCHED_IDLE user threads' run time is Yielding on the core they last ran
// on, and Contended leaves it out; other threads and kthreads are not
// yielders, and a thread that leaves SCHED_IDLE stops counting.
func TestSamplerYielding(t *testing.T) {
	p := newFakeProc(t)
	p.stat(CPUTimes{System: 1000, Idle: 1000}, CPUTimes{System: 1000, Idle: 1000})
	gen := task{pid: 700, comm: "lanes", cpu: 0, start: 5, policy: kthread.SchedIdle, sched: sched(1e9), dir: "700/task/701"}
	p.task(gen)
	p.task(task{pid: 700, comm: "lanes", cpu: 1, start: 5, sched: sched(1e9), dir: "700/task/700"})                                 // normal policy
	p.task(task{pid: 9, comm: "ksoftirqd/0", kthread: true, cpu: 0, policy: kthread.SchedIdle, sched: sched(1e9), dir: "9/task/9"}) // kthreads are not yielders

	s, err := newSampler(p.root, clock(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s.rescan = time.Hour
	// One second: core 0 100% system, 90% of it the generator's.
	p.stat(CPUTimes{System: 1100, Idle: 1000}, CPUTimes{System: 1050, Idle: 1050})
	gen.sched = sched(1.9e9)
	p.task(gen)
	p.task(task{pid: 700, comm: "lanes", cpu: 1, start: 5, sched: sched(1.5e9), dir: "700/task/700"})
	p.task(task{pid: 9, comm: "ksoftirqd/0", kthread: true, cpu: 0, policy: kthread.SchedIdle, sched: sched(1.5e9), dir: "9/task/9"})
	sm, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	c0, c1 := sm.Cores[0], sm.Cores[1]
	if !near(c0.Busy, 100) || !near(c0.Yielding, 90) || !near(c0.Contended(), 10) {
		t.Errorf("core 0: busy %v yielding %v contended %v, want 100 90 10", c0.Busy, c0.Yielding, c0.Contended())
	}
	if !near(c1.Yielding, 0) || !near(c1.Contended(), 50) {
		t.Errorf("core 1: yielding %v contended %v, want 0 50", c1.Yielding, c1.Contended())
	}
	// Back to normal scheduling: no longer a yielder.
	gen.policy, gen.sched = 0, sched(2.9e9)
	p.task(gen)
	p.stat(CPUTimes{System: 1200, Idle: 1000}, CPUTimes{System: 1100, Idle: 1100})
	if sm, err = s.Sample(); err != nil {
		t.Fatal(err)
	}
	if c := sm.Cores[0]; !near(c.Yielding, 0) || !near(c.Contended(), 100) {
		t.Errorf("after leaving SCHED_IDLE: yielding %v contended %v, want 0 100", c.Yielding, c.Contended())
	}
	// Yielding never exceeds Busy (a whole-interval thread on an idle-looking core).
	if c := (Core{Busy: 20, Yielding: 20}); c.Contended() != 0 {
		t.Errorf("Contended %v", c.Contended())
	}
}
