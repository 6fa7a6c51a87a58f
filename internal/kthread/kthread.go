// Package kthread reads and moves one thread by pid: its affinity, last
// CPU and flags. List finds kernel threads by name, with their affinity
// and scheduling; internal/napi maps a device to its NAPI pollers' pids,
// and datapath/knobs keeps threads by name for the journal (pids change
// across a device's life). OnThread runs lanes' own work (an agent's
// rounds) on a thread of its own at a chosen policy.
package kthread

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Thread is one kernel thread.
type Thread struct {
	PID  int
	Comm string
}

// Pin restricts t to the given cores.
func (t Thread) Pin(cpus ...int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(t.PID, &set); err != nil {
		return fmt.Errorf("pinning %s (pid %d) to %v: %w", t.Comm, t.PID, cpus, err)
	}
	return nil
}

// SetFIFO gives t SCHED_FIFO at prio (1-99).
func (t Thread) SetFIFO(prio int) error {
	a := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(prio)}
	if err := unix.SchedSetAttr(t.PID, a, 0); err != nil {
		return fmt.Errorf("setting %s (pid %d) to SCHED_FIFO %d: %w", t.Comm, t.PID, prio, err)
	}
	return nil
}

// Affinity returns the cores t may run on.
func (t Thread) Affinity() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(t.PID, &set); err != nil {
		return nil, err
	}
	var out []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// LastCPU is the core t last ran on (field 39 of /proc/PID/stat).
func (t Thread) LastCPU() (int, error) {
	_, cpu, err := t.Stat()
	return cpu, err
}

// Stat returns the flags (field 9, e.g. PFKthread) and the last CPU
// (field 39) of /proc/PID/stat.
func (t Thread) Stat() (flags uint64, cpu int, err error) {
	ps, err := t.ProcStat()
	if err != nil {
		return 0, -1, err
	}
	return ps.Flags, ps.CPU, nil
}

// ProcStat reads t's /proc/PID/stat.
func (t Thread) ProcStat() (ProcStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", t.PID))
	if err != nil {
		return ProcStat{}, err
	}
	ps, err := ParseProcStat(string(b))
	if err != nil {
		return ProcStat{}, fmt.Errorf("/proc/%d/stat: %w", t.PID, err)
	}
	return ps, nil
}

// CPUMapOn says whether comm names a cpumap kthread of core
// ("cpumap/<core>/map:<id>").
func CPUMapOn(comm string, core int) bool {
	return strings.HasPrefix(comm, "cpumap/"+strconv.Itoa(core)+"/")
}

// Schedstat reads /proc/PID/schedstat: the time t ran and the time it
// waited runnable for a core, in ns. The scheduler adds a stretch to
// either when it ends (at a switch), so a thread still waiting shows
// nothing of that wait yet.
func (t Thread) Schedstat() (run, wait uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", t.PID))
	if err != nil {
		return 0, 0, err
	}
	return ParseSchedstat(string(b))
}

// Schedstats reads threads' /proc/PID/schedstat (Thread.Schedstat)
// through files kept open, one pread each: a sampler that reads a few
// threads ten times a second skips a path walk, an open and a close each
// time. An open file stays with its thread: once the thread exits, its
// reads fail (ESRCH) even if another thread gets the PID, and the file is
// dropped. The zero value is ready; Close drops every file.
type Schedstats struct {
	files map[int]*os.File
	buf   [128]byte
}

// Read is Thread{PID: pid}.Schedstat through the kept file.
func (s *Schedstats) Read(pid int) (run, wait uint64, err error) {
	f := s.files[pid]
	if f == nil {
		if f, err = os.Open(fmt.Sprintf("/proc/%d/schedstat", pid)); err != nil {
			return 0, 0, err
		}
		if s.files == nil {
			s.files = map[int]*os.File{}
		}
		s.files[pid] = f
	}
	n, err := f.ReadAt(s.buf[:], 0)
	if n == 0 && err != nil {
		f.Close()
		delete(s.files, pid)
		return 0, 0, fmt.Errorf("/proc/%d/schedstat: %w", pid, err)
	}
	return ParseSchedstat(string(s.buf[:n]))
}

// Close drops every kept file.
func (s *Schedstats) Close() {
	for pid, f := range s.files {
		f.Close()
		delete(s.files, pid)
	}
}

// ParseSchedstat parses /proc/PID/schedstat: the thread's run time
// (se.sum_exec_runtime) and the time it spent runnable, waiting for a
// core, both in ns; then the count of timeslices.
func ParseSchedstat(s string) (run, wait uint64, err error) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("schedstat %q: want run and wait time", strings.TrimSpace(s))
	}
	if run, err = strconv.ParseUint(f[0], 10, 64); err == nil {
		wait, err = strconv.ParseUint(f[1], 10, 64)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("schedstat %q: %w", s, err)
	}
	return run, wait, nil
}

// PFKthread is the PF_KTHREAD bit of ProcStat.Flags (include/linux/sched.h):
// a kernel thread, not a user process that merely took its name.
const PFKthread = 0x00200000

// ProcStat is what lanes reads of /proc/PID/stat.
type ProcStat struct {
	Comm      string
	State     byte   // field 3: R running or runnable, S sleeping, ...
	Flags     uint64 // field 9
	Kthread   bool   // Flags has PFKthread
	Ticks     uint64 // utime + stime, USER_HZ
	StartTime uint64 // boot-relative ticks; tells a reused pid from the thread it had
	CPU       int    // the core it last ran on
	Policy    int    // scheduling policy (field 41; SchedIdle, ...); 0 when the line is shorter
}

// SchedIdle is the SCHED_IDLE policy: a thread that runs only when nothing
// else on its core wants to.
const SchedIdle = 5

// ParseProcStat parses /proc/PID/stat: the one parser of it in lanes. The
// comm sits in parentheses and may itself hold spaces and parentheses, so
// the fields are counted from the last ')'. Field numbers are proc(5)'s,
// 1-based.
func ParseProcStat(s string) (ProcStat, error) {
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return ProcStat{}, fmt.Errorf("pid stat: no comm in %q", s)
	}
	f := strings.Fields(s[end+1:]) // f[0] is field 3, state
	const flags, utime, stime, starttime, processor = 9, 14, 15, 22, 39
	if len(f) < processor-2 {
		return ProcStat{}, fmt.Errorf("pid stat: %d fields, want at least %d", len(f)+2, processor)
	}
	num := func(field int) (uint64, error) { return strconv.ParseUint(f[field-3], 10, 64) }
	fl, err1 := num(flags)
	u, err2 := num(utime)
	st, err3 := num(stime)
	start, err4 := num(starttime)
	cpu, err5 := strconv.Atoi(f[processor-3])
	for _, err := range []error{err1, err2, err3, err4, err5} {
		if err != nil {
			return ProcStat{}, fmt.Errorf("pid stat: %w", err)
		}
	}
	ps := ProcStat{Comm: s[open+1 : end], State: f[0][0], Flags: fl, Kthread: fl&PFKthread != 0, Ticks: u + st, StartTime: start, CPU: cpu}
	const policy = 41
	if len(f) > policy-3 {
		p, err := strconv.Atoi(f[policy-3])
		if err != nil {
			return ProcStat{}, fmt.Errorf("pid stat: policy: %w", err)
		}
		ps.Policy = p
	}
	return ps, nil
}

// OnThread runs f on an OS thread of its own whose scheduling policy is
// policy (a fair one: unix.SCHED_NORMAL, SCHED_BATCH or SCHED_IDLE; the
// thread's nice value is kept) and returns once f has. The thread is never
// handed back to the Go runtime: it exits with f, taking its policy with
// it (a moment after OnThread returns); should the runtime keep it instead
// (the main thread is never ended), it is set back to SCHED_NORMAL first.
// The runtime starts new threads from a template thread, never from a
// locked one, so no other goroutine inherits the policy; a process f
// itself starts would. If the policy cannot be set, f does not run and the
// error says why.
func OnThread(policy uint32, f func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked, see above
		err := SetPolicy(policy)
		// Deferred, so f ending in runtime.Goexit still returns.
		defer func() { errc <- err }()
		if err != nil {
			return
		}
		defer SetPolicy(unix.SCHED_NORMAL)
		f()
	}()
	return <-errc
}

// SetPolicy sets the calling OS thread's scheduling policy (a fair one),
// keeping its nice value. The caller has locked its goroutine to the
// thread, or the policy lands on whichever goroutines the thread runs next.
func SetPolicy(policy uint32) error {
	a, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		return fmt.Errorf("reading this thread's scheduling policy: %w", err)
	}
	nice := a.Nice
	a = &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: policy, Nice: nice}
	if err := unix.SchedSetAttr(0, a, 0); err != nil {
		return fmt.Errorf("setting this thread's scheduling policy to %d: %w", policy, err)
	}
	return nil
}

// ThreadsAt counts this process's threads whose scheduling policy is
// policy. A thread that exits while they are counted is skipped.
func ThreadsAt(policy uint32) (int, error) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range tasks {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if a, err := unix.SchedGetAttr(tid, 0); err == nil && a.Policy == policy {
			n++
		}
	}
	return n, nil
}
