package cpuload

import (
	"fmt"
	"math"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/hog"
)

// spin runs a thread on core at policy until stop is called.
func spin(t *testing.T, core int, policy uint32) (stop func()) {
	t.Helper()
	stop, err := hog.Start(core, policy)
	if err != nil {
		t.Fatal(err)
	}
	return stop
}

func newSchedSampler(t *testing.T) *SchedSampler {
	t.Helper()
	s, err := NewSchedSampler()
	if err != nil {
		t.Skip("no scheduler accounting on this kernel:", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// checkFigures: every figure a percentage, Busy + Idle = 100, the parts
// within the whole.
func checkFigures(t *testing.T, sm Sample) {
	t.Helper()
	const eps = 1e-6
	for _, c := range sm.Cores {
		t.Logf("cpu%d busy %.1f%% softirq %.1f%% rx-kthreads %.1f%% rx %.1f%% yielding %.1f%% tasks %.1f%% idle %.1f%%",
			c.CPU, c.Busy, c.SoftIRQ, c.RxKthreads, c.Rx, c.Yielding, c.Tasks, c.Idle)
		for _, v := range []float64{c.Busy, c.SoftIRQ, c.Idle, c.RxKthreads, c.Rx, c.Yielding, c.Tasks} {
			if v < 0 || v > 100+eps || math.IsNaN(v) {
				t.Errorf("cpu%d: figure %v outside 0..100 in %+v", c.CPU, v, c)
			}
		}
		if math.Abs(c.Busy+c.Idle-100) > eps || c.Yielding > c.Busy+eps || c.Tasks > c.Busy+eps {
			t.Errorf("cpu%d: busy %v, idle %v, yielding %v, tasks %v do not add up", c.CPU, c.Busy, c.Idle, c.Yielding, c.Tasks)
		}
	}
}

// TestSchedSampler: a thread burning a core at normal priority makes it
// busy; the same at SCHED_IDLE is that core's Yielding time, which
// Contended leaves out. The machine may run other work (in a full `make
// test`, the kernel's namespace cleanup after the testbeds of the packages
// before can take most of a core at normal priority), so the bounds
// are loose, they separate "counted" from "not counted", not timings, and
// a window may be measured three times before one must meet them.
func TestSchedSampler(t *testing.T) {
	core := firstCore(t)
	s := newSchedSampler(t)
	for _, tc := range []struct {
		name   string
		policy uint32
	}{{"normal", unix.SCHED_NORMAL}, {"sched_idle", unix.SCHED_IDLE}} {
		t.Run(tc.name, func(t *testing.T) {
			var why string
			for try := 0; try < 3; try++ {
				if why = spinAndSample(t, s, core, tc.policy); why == "" {
					return
				}
				t.Logf("try %d: %s", try+1, why)
			}
			t.Error(why)
		})
	}
}

// spinAndSample burns core at policy for 300 ms and says what in the
// sample is wrong ("" if nothing).
func spinAndSample(t *testing.T, s *SchedSampler, core int, policy uint32) string {
	t.Helper()
	stop := spin(t, core, policy)
	if _, err := s.Sample(); err != nil { // from the spin on
		stop()
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	sm, err := s.Sample()
	stop()
	if err != nil {
		t.Fatal(err)
	}
	if sm.Interval < 300*time.Millisecond {
		t.Errorf("interval %v, slept 300ms", sm.Interval)
	}
	checkFigures(t, sm)
	c, ok := sm.Core(core)
	if !ok {
		t.Fatalf("core %d missing from %+v", core, sm.Cores)
	}
	if c.Busy <= 50 {
		return fmt.Sprintf("core %d burned by a thread, only %.1f%% busy", core, c.Busy)
	}
	switch policy {
	case unix.SCHED_IDLE:
		if c.Yielding <= 50 || c.Contended() >= c.Busy {
			return fmt.Sprintf("core %d: yielding %.1f%% of busy %.1f%%: the SCHED_IDLE thread was not counted", core, c.Yielding, c.Busy)
		}
		if c.Tasks >= 50 {
			return fmt.Sprintf("core %d: a SCHED_IDLE thread counted as a task (%.1f%%)", core, c.Tasks)
		}
	default:
		if c.Yielding >= 50 {
			return fmt.Sprintf("core %d: a normal thread counted as yielding (%.1f%%)", core, c.Yielding)
		}
		if c.Tasks <= 50 {
			return fmt.Sprintf("core %d: a normal thread burning it counted as %.1f%% tasks", core, c.Tasks)
		}
	}
	return ""
}

// TestSchedSamplerAccounting: with the accounting off samples say
// NICOnly and carry no times; back on, the next sample is accounted again
// with figures that add up, and a burned core reads busy.
func TestSchedSamplerAccounting(t *testing.T) {
	core := firstCore(t)
	s := newSchedSampler(t)
	if err := s.SetAccounting(false); err != nil {
		t.Fatal(err)
	}
	stop := spin(t, core, unix.SCHED_NORMAL)
	time.Sleep(200 * time.Millisecond)
	sm, err := s.Sample()
	stop()
	if err != nil {
		t.Fatal(err)
	}
	if !sm.NICOnly || len(sm.Cores) == 0 {
		t.Fatalf("accounting off: NICOnly %v, %d cores", sm.NICOnly, len(sm.Cores))
	}
	for _, c := range sm.Cores {
		if c.Busy != 0 || c.Idle != 0 || c.Rx != 0 || c.Tasks != 0 {
			t.Errorf("accounting off: cpu%d has times %+v", c.CPU, c)
		}
	}
	if err := s.SetAccounting(false); err != nil { // already off: nothing to do
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := s.SetAccounting(true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if sm, err = s.Sample(); err != nil {
		t.Fatal(err)
	}
	if sm.NICOnly {
		t.Fatal("the sample after the accounting came back says NICOnly")
	}
	checkFigures(t, sm)
	// Back on, a burned core reads busy again.
	for try := 0; ; try++ {
		why := spinAndSample(t, s, core, unix.SCHED_NORMAL)
		if why == "" {
			break
		}
		if try == 2 {
			t.Fatal(why)
		}
		t.Logf("try %d: %s", try+1, why)
	}
}

// TestSchedSamplerIdle: with nothing running on a core but an occasional
// sleeper, the core reads mostly idle, and a sample with no time passed
// leaves the core out instead of dividing by zero.
func TestSchedSamplerIdle(t *testing.T) {
	s := newSchedSampler(t)
	time.Sleep(200 * time.Millisecond)
	sm, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	checkFigures(t, sm)
	if len(sm.Cores) == 0 {
		t.Fatal("no cores in the sample")
	}
}

// TestCoreLoad checks the arithmetic on synthetic readings: softirq time
// on top of the idle task is busy, on top of a SCHED_IDLE thread it is not
// that thread's, on top of a receive kthread it is not counted twice.
func TestCoreLoad(t *testing.T) {
	ms := uint64(time.Millisecond)
	a := cpuTotals{at: 1000 * ms}
	b := a
	b.at += 100 * ms
	b.wall[clsIdle] = 40 * ms
	b.wall[clsOther] = 10 * ms
	b.wall[clsYield] = 30 * ms
	b.wall[clsRxK] = 20 * ms
	b.sirq[clsIdle] = 5 * ms
	b.sirq[clsYield] = 10 * ms
	b.sirq[clsRxK] = 4 * ms
	b.sirq[clsOther] = 3 * ms // ksoftirqd's, or on top of an application
	c := coreLoad(3, a, b)
	want := Core{CPU: 3, Busy: 65, Idle: 35, SoftIRQ: 22, RxKthreads: 16, Rx: 38, Yielding: 20, Tasks: 7}
	if math.Abs(c.Busy-want.Busy) > 1e-9 || math.Abs(c.Idle-want.Idle) > 1e-9 || math.Abs(c.SoftIRQ-want.SoftIRQ) > 1e-9 ||
		math.Abs(c.RxKthreads-want.RxKthreads) > 1e-9 || math.Abs(c.Rx-want.Rx) > 1e-9 || math.Abs(c.Yielding-want.Yielding) > 1e-9 ||
		math.Abs(c.Tasks-want.Tasks) > 1e-9 || c.CPU != 3 {
		t.Errorf("coreLoad = %+v, want %+v", c, want)
	}
	if got := c.Contended(); math.Abs(got-45) > 1e-9 {
		t.Errorf("contended %v, want 45", got)
	}
	// Counters never go back; if they seem to, that part is 0.
	b.wall[clsOther] = 0
	a.wall[clsOther] = 5 * ms
	if c := coreLoad(3, a, b); math.Abs(c.Busy-55) > 1e-9 {
		t.Errorf("busy with a counter gone back: %v, want 55", c.Busy)
	}
}

// The samplers' cost, for the README's comparison:
//
//	go test -run XXX -bench Sampler ./datapath/cpuload/
func BenchmarkSampler(b *testing.B) {
	s, err := NewSampler()
	if err != nil {
		b.Fatal(err)
	}
	s.rescan = 1 << 62 // the per-sample part; the walk is measured below
	for b.Loop() {
		if _, err := s.Sample(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSamplerRescan is the walk of /proc a Sampler makes once a second.
func BenchmarkSamplerRescan(b *testing.B) {
	s, err := NewSampler()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		s.threads = map[int]tracked{}
		s.yielders = map[string]tracked{}
		if err := s.scan(s.at); err != nil {
			b.Fatal(err)
		}
		s.scanYielders()
	}
}

func BenchmarkSchedSampler(b *testing.B) {
	s, err := NewSchedSampler()
	if err != nil {
		b.Skip("no scheduler accounting on this kernel:", err)
	}
	defer s.Close()
	for b.Loop() {
		if _, err := s.Sample(); err != nil {
			b.Fatal(err)
		}
	}
}
