package kthread

import (
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseProcStat(t *testing.T) {
	cases := []struct {
		in   string
		want ProcStat
	}{
		// A threaded NAPI poller as 6.18 prints it.
		{"3926 (napi/ul2-259) S 2 0 0 0 -1 2129984 0 0 0 0 0 14235 0 0 20 0 1 0 12336 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			ProcStat{State: 'S', Flags: 2129984, Comm: "napi/ul2-259", Kthread: true, Ticks: 14235, StartTime: 12336, CPU: 1}},
		// A user process whose comm holds spaces and parentheses.
		{"4242 (evil) (napi/x) 1) R 1 4242 4242 34816 4242 4194304 120 0 0 0 7 3 0 0 20 0 1 0 99 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			ProcStat{State: 'R', Flags: 4194304, Comm: "evil) (napi/x) 1", Kthread: false, Ticks: 10, StartTime: 99, CPU: 0}},
		// cpumap kthread, last on core 3.
		{"812 (cpumap/3/map:17) S 2 0 0 0 -1 2129984 0 0 0 0 0 88 0 0 20 0 1 0 5000 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 17 3 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			ProcStat{State: 'S', Flags: 2129984, Comm: "cpumap/3/map:17", Kthread: true, Ticks: 88, StartTime: 5000, CPU: 3}},
	}
	// The stress generator's thread: SCHED_IDLE (policy 5, field 41).
	cases = append(cases, struct {
		in   string
		want ProcStat
	}{"777 (lanes) R 1 777 777 0 -1 4194368 0 0 0 0 10 290 0 0 39 19 1 0 4000 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 -1 0 0 5 0 0 0 0 0 0 0 0 0 0 0\n",
		ProcStat{State: 'R', Flags: 4194368, Comm: "lanes", Ticks: 300, StartTime: 4000, CPU: 0, Policy: SchedIdle}})
	for _, tc := range cases {
		got, err := ParseProcStat(tc.in)
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%q:\n got %+v\nwant %+v", tc.in, got, tc.want)
		}
	}
	for _, bad := range []string{"", "12 napi S 2", "12 (napi) S 2 0 0", "12 (napi) S 2 0 0 0 -1 x 0 0 0 0 0 1 0 0 20 0 1 0 1 0 0 1 0 0 0 0 0 0 0 0 0 1 0 0 17 1 0"} {
		if _, err := ParseProcStat(bad); err == nil {
			t.Errorf("ParseProcStat(%q): no error", bad)
		}
	}
}

func TestParseProcStatCommWithParen(t *testing.T) {
	// The comm holds a space and a ')': fields must count from the last ')'.
	line := "42 (napi/x) y-1) I 2 0 0 0 -1 2129984 0 0 0 0 30 12 0 0 20 0 1 0 99 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
	ps, err := ParseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if ps.Comm != "napi/x) y-1" || ps.Ticks != 42 || ps.CPU != 1 || !ps.Kthread {
		t.Errorf("got %+v", ps)
	}
}

// OnThread's f runs at the policy asked for; the caller's thread keeps its
// own, and so does the next goroutine.
func TestOnThread(t *testing.T) {
	policy := func() uint32 {
		a, err := unix.SchedGetAttr(0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return a.Policy
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := policy()
	count := func() int {
		n, err := ThreadsAt(unix.SCHED_BATCH)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	outside := count()
	var inside uint32
	var batch int
	if err := OnThread(unix.SCHED_BATCH, func() { inside, batch = policy(), count() }); err != nil {
		t.Fatal(err)
	}
	if inside != unix.SCHED_BATCH {
		t.Errorf("policy inside f = %d, want SCHED_BATCH (%d)", inside, unix.SCHED_BATCH)
	}
	if batch != outside+1 {
		t.Errorf("ThreadsAt(SCHED_BATCH) inside f = %d, want %d", batch, outside+1)
	}
	if after := policy(); after != before {
		t.Errorf("caller's policy changed from %d to %d", before, after)
	}
	if err := OnThread(12345, func() { t.Error("f ran although its policy could not be set") }); err == nil {
		t.Error("OnThread with a bogus policy: no error")
	}
}

func TestParseSchedstat(t *testing.T) {
	run, wait, err := ParseSchedstat("521682886 6547457988 4564\n")
	if err != nil || run != 521682886 || wait != 6547457988 {
		t.Errorf("got %d %d %v", run, wait, err)
	}
	if r, w, err := ParseSchedstat("142359404534 58211072258 2606549\n"); err != nil || r != 142359404534 || w != 58211072258 {
		t.Errorf("got %d %d, %v", r, w, err)
	}
	if r, w, err := ParseSchedstat("0 0 0\n"); err != nil || r != 0 || w != 0 {
		t.Errorf("got %d %d, %v", r, w, err)
	}
	for _, bad := range []string{"", "\n", "12", "x 1 2", "abc 1 2", "1 x 2", "1 -2 3"} {
		if _, _, err := ParseSchedstat(bad); err == nil {
			t.Errorf("ParseSchedstat(%q): no error", bad)
		}
	}
}

func TestCPUMapOn(t *testing.T) {
	for _, tc := range []struct {
		comm string
		core int
		want bool
	}{
		{"ksoftirqd/0", 0, false},
		{"cpumap/0/map:76", 0, true},
		{"cpumap/10/map:76", 1, false},
		{"cpumap/1/map:76", 1, true},
		{"kworker/0:3", 0, false},
		{"napi/ul1-3153", 1, false},
	} {
		if got := CPUMapOn(tc.comm, tc.core); got != tc.want {
			t.Errorf("CPUMapOn(%q, %d) = %v, want %v", tc.comm, tc.core, got, tc.want)
		}
	}
}

// TestSchedstatsKeepsTheThread: reads through the kept file follow the
// thread (its run time never goes back, nor is it ahead of a fresh
// read's), and once the thread has exited the read fails and the file
// is dropped, whoever gets the PID next.
func TestSchedstatsKeepsTheThread(t *testing.T) {
	var s Schedstats
	defer s.Close()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Process.Kill()
	run1, _, err := s.Read(pid)
	if err != nil {
		t.Fatal(err)
	}
	run2, _, err := s.Read(pid)
	if err != nil || run2 < run1 {
		t.Fatalf("second read: run %d after %d (%v)", run2, run1, err)
	}
	if fresh, _, err := (Thread{PID: pid}).Schedstat(); err != nil || fresh < run2 {
		t.Errorf("a fresh read: run %d after the kept file's %d (%v)", fresh, run2, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, _, err := s.Read(pid); err == nil {
		t.Error("the process was reaped, its schedstat still reads")
	}
	if len(s.files) != 0 {
		t.Errorf("%d files kept after the thread exited", len(s.files))
	}
}
