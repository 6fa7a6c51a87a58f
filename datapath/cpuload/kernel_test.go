package cpuload

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestKernel samples the real kernel while one thread burns a core. The
// machine may be busy with other work, so only sanity is asserted: the
// burned core is clearly busy, every figure is a percentage.
func TestKernel(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc/stat:", err)
	}
	core := firstCore(t)

	s, err := NewSampler()
	if err != nil {
		t.Fatal(err)
	}
	burn := 300 * time.Millisecond
	stop := spin(t, core, unix.SCHED_NORMAL)
	time.Sleep(burn)
	stop()
	sm, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if sm.Interval < burn || len(sm.Cores) == 0 {
		t.Fatalf("interval %v, %d cores", sm.Interval, len(sm.Cores))
	}
	const eps = 1e-6
	inRange := func(v float64) bool { return v >= 0 && v <= 100+eps }
	var burned *Core
	for i, c := range sm.Cores {
		t.Logf("cpu%d busy %.0f%% user %.0f%% sys %.0f%% softirq %.0f%% idle %.0f%% rx-kthreads %.1f%% rx %.1f%%",
			c.CPU, c.Busy, c.User, c.System, c.SoftIRQ, c.Idle, c.RxKthreads, c.Rx)
		for _, v := range []float64{c.Busy, c.User, c.System, c.IRQ, c.SoftIRQ, c.Steal, c.Idle, c.RxKthreads, c.Rx} {
			if !inRange(v) {
				t.Errorf("cpu%d: figure %v outside 0..100 in %+v", c.CPU, v, c)
			}
		}
		if c.Busy+c.Idle > 100+eps || (c.Busy+c.Idle < 100-eps && c.Busy+c.Idle != 0) {
			t.Errorf("cpu%d: busy %v + idle %v != 100", c.CPU, c.Busy, c.Idle)
		}
		if c.CPU == core {
			burned = &sm.Cores[i]
		}
	}
	if burned == nil {
		t.Fatalf("burned core %d missing from %+v", core, sm.Cores)
	}
	if burned.Busy <= 30 {
		t.Errorf("burned core %d only %.0f%% busy over %v", core, burned.Busy, sm.Interval)
	}
	for _, th := range s.Threads() {
		t.Logf("%d %s cpu%d %.1f%%", th.PID, th.Comm, th.CPU, th.Percent)
		if !IsRxKthread(th.Comm) || th.PID <= 0 || th.CPU < 0 || th.Percent < 0 {
			t.Errorf("odd thread %+v", th)
		}
	}
}

// TestKernelYielding: a SCHED_IDLE thread spinning on a core shows up as
// that core's Yielding time, which Contended leaves out.
func TestKernelYielding(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc/stat:", err)
	}
	core := firstCore(t)
	stop := spin(t, core, unix.SCHED_IDLE)
	defer stop()
	s, err := NewSampler() // finds the spinning thread
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	sm, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	c, ok := sm.Core(core)
	if !ok {
		t.Fatalf("core %d missing", core)
	}
	t.Logf("cpu%d busy %.0f%% yielding %.0f%% contended %.0f%%", core, c.Busy, c.Yielding, c.Contended())
	if c.Yielding <= 0 || c.Yielding > c.Busy || c.Contended() != c.Busy-c.Yielding {
		t.Errorf("cpu%d: yielding %v of busy %v: the SCHED_IDLE thread was not counted", core, c.Yielding, c.Busy)
	}
}

// firstCore is core 0 when the test may run there, else the first core it
// may use.
func firstCore(t *testing.T) int {
	t.Helper()
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Fatal(err)
	}
	for c := 0; c < len(allowed)*64; c++ {
		if allowed.IsSet(c) {
			return c
		}
	}
	t.Skip("empty affinity mask")
	return -1
}
