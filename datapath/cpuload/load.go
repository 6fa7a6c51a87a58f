// Package cpuload measures per-core CPU load the way Falcon's balancer
// needs it, on a stock kernel: Falcon reads per-CPU busy time inside the
// kernel every 10 jiffies. There are two samplers with the same figures.
//
// SchedSampler (acct.go, cpuacct.c) has the kernel hand the time over as it
// switches tasks, through BPF tracing programs: a sample is one map read.
// It needs BTF and tracing programs; Falcon's agent uses it by default.
//
// Sampler reads /proc, which every kernel has, and also lists the receive
// kthreads one by one (`lanes status`, PRISM's guard). Two sources are
// combined there. /proc/stat gives each core's split of time
// (user, system, softirq, ...) in USER_HZ ticks: coarse over short
// intervals, but it covers everything. Receive processing that runs in
// kernel threads instead of softirq context - threaded NAPI ("napi/...")
// and cpumap ("cpumap/...") kthreads - appears there only as system time,
// mixed with every syscall; /proc/PID/schedstat gives those threads' run
// time in nanoseconds, so Rx = SoftIRQ + RxKthreads is the receive load of
// a core. The two do not overlap much: a thread's run time excludes
// interrupt time when the kernel accounts IRQ time separately, and NAPI
// polling in a kthread runs with bottom halves disabled, which the kernel
// books as the thread's system time, not as softirq.
package cpuload

import (
	"github.com/lanesnet/lanes/internal/kthread"

	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Core is one core's load over a sample's interval. The /proc/stat fields
// are percents of the core's ticks in the interval; they are all 0 when the
// interval was too short for a single tick (USER_HZ is 100: sample every
// 100 ms or more for a 10% resolution).
type Core struct {
	CPU     int
	Busy    float64 // everything but Idle, steal included: stolen time is not ours to use
	User    float64 // user + nice
	System  float64
	IRQ     float64
	SoftIRQ float64
	Steal   float64
	Idle    float64 // idle + iowait: a core waiting on I/O can run other work
	// RxKthreads is the run time of the receive kthreads that last ran on
	// this core, as a percent of the interval, capped at 100. A thread that
	// migrated within the interval is counted whole on its last core.
	RxKthreads float64
	// Rx is the core's receive processing: SoftIRQ + RxKthreads, capped at
	// 100.
	Rx float64
	// Yielding is the run time of SCHED_IDLE threads that last ran on this
	// core, as a percent of the interval, capped at Busy. Such a thread
	// runs only when nothing else wants the core, so that time is free for
	// receive work (the benchmark's traffic generator is one, standing in
	// for a sender on another machine; batch jobs are others).
	Yielding float64
	// Tasks is the run time of the core's other tasks - applications,
	// and kernel threads that are not receive kthreads - as a percent of
	// the interval: Busy less softirq, receive kthreads and SCHED_IDLE
	// threads. It tells a busy application on a receive core (a CPU-bound
	// server) from receive work that keeps the core (softirq, its
	// ksoftirqd), which PRISM's starvation guard must tell apart.
	Tasks float64
	// NIC is what the watched NIC's polls did on this core
	// (SchedSampler.WatchNAPIs; Sample.NICWatched says whether any were
	// watched).
	NIC NICCount
}

// Contended is the core's busy time that receive work would compete for:
// Busy less Yielding. It is the balancer's "busy" figure.
func (c Core) Contended() float64 { return max(0, c.Busy-c.Yielding) }

// Sample is the load of every online core over the interval that ended at
// At.
type Sample struct {
	At       time.Time
	Interval time.Duration
	Cores    []Core // by CPU number; cores that came online in the interval are left out
	// NICWatched: the NIC polls of every core were counted over the
	// whole interval (SchedSampler.WatchNAPIs).
	NICWatched bool
	// NICOnly: the scheduler accounting was off for some of the interval
	// (SchedSampler.SetAccounting): each core's NIC counts are figures,
	// its times (Busy, Idle, Rx, ...) are not and read 0.
	NICOnly bool
}

// Core returns the entry for cpu.
func (s Sample) Core(cpu int) (Core, bool) {
	for _, c := range s.Cores {
		if c.CPU == cpu {
			return c, true
		}
	}
	return Core{}, false
}

// Thread is a receive kthread as measured over the last sample.
type Thread struct {
	PID     int
	Comm    string
	CPU     int     // the core it last ran on
	Percent float64 // its run time as a percent of the interval (not capped)
}

// IsRxKthread tells receive-processing kthreads by name: threaded NAPI
// pollers are "napi/<dev>-<napi id>", cpumap entries "cpumap/<cpu>/map:<id>".
func IsRxKthread(comm string) bool {
	return strings.HasPrefix(comm, "napi/") || strings.HasPrefix(comm, "cpumap/")
}

const (
	// userHZ is the unit of /proc tick counts. The kernel fixes it at 100
	// for user space whatever its internal HZ.
	userHZ = 100
	// rescanEvery bounds how often /proc is searched for new receive
	// kthreads. Known threads are read at every sample; a search reads every
	// kernel thread's stat, which adds up at Falcon's sampling rate, while
	// new threads appear only when a device or its threaded mode changes.
	rescanEvery = time.Second
)

// tracked is a receive kthread's reading at the previous snapshot.
type tracked struct {
	start   uint64 // start time, to notice a reused pid
	run     uint64 // ns (or ticks when !precise)
	precise bool   // run comes from schedstat, not from stat's ticks
}

// Sampler takes per-core load samples. It is not safe for concurrent use.
type Sampler struct {
	proc    string
	now     func() time.Time
	rescan  time.Duration
	at      time.Time
	stat    map[int]CPUTimes
	threads map[int]tracked
	scanned time.Time
	last    []Thread
	// yielders are the SCHED_IDLE user threads, by /proc-relative path of
	// their task directory ("PID/task/TID").
	yielders map[string]tracked
}

// NewSampler takes the first snapshot; the first Sample measures from here.
func NewSampler() (*Sampler, error) {
	return newSampler("/proc", time.Now)
}

func newSampler(proc string, now func() time.Time) (*Sampler, error) {
	s := &Sampler{proc: proc, now: now, rescan: rescanEvery, threads: map[int]tracked{}, yielders: map[string]tracked{}}
	at, stat, err := s.readStat()
	if err != nil {
		return nil, err
	}
	s.at, s.stat = at, stat
	if err := s.scan(at); err != nil {
		return nil, err
	}
	s.scanYielders()
	return s, nil
}

// Sample returns the load since the previous call (or NewSampler). On error
// the previous snapshot is kept, so the next call covers both intervals.
func (s *Sampler) Sample() (Sample, error) {
	at, stat, err := s.readStat()
	if err != nil {
		return Sample{}, err
	}
	interval := at.Sub(s.at)
	out := Sample{At: at, Interval: interval}

	rxNS := map[int]uint64{}
	var threads []Thread
	for pid, old := range s.threads {
		st, run, precise, ok := s.readThread(pid)
		if !ok || !st.Kthread || !IsRxKthread(st.Comm) {
			delete(s.threads, pid) // exited, or its pid now names another task
			continue
		}
		s.threads[pid] = tracked{start: st.StartTime, run: run, precise: precise}
		if st.StartTime != old.start || precise != old.precise || run < old.run {
			// A new receive kthread under a reused pid, or a change of
			// source: no common baseline, so measured from the next sample.
			continue
		}
		ns := run - old.run
		if !precise {
			ns *= uint64(time.Second / userHZ)
		}
		rxNS[st.CPU] += ns
		threads = append(threads, Thread{PID: pid, Comm: st.Comm, CPU: st.CPU, Percent: percentOf(ns, interval)})
	}
	yieldNS := s.measureYielders()
	if at.Sub(s.scanned) >= s.rescan {
		// The threads already known are measured either way; a failed search
		// for new ones is retried at the next sample.
		_ = s.scan(at)
		s.scanYielders()
	}

	for cpu, cur := range stat {
		prev, ok := s.stat[cpu]
		if !ok {
			continue
		}
		c := cpuLoad(cpu, prev, cur)
		c.RxKthreads = min(100, percentOf(rxNS[cpu], interval))
		c.Rx = min(100, c.SoftIRQ+c.RxKthreads)
		c.Yielding = min(c.Busy, percentOf(yieldNS[cpu], interval))
		// /proc/stat books kthreads and SCHED_IDLE threads as user or
		// system time, softirqs apart (with IRQ time accounting).
		c.Tasks = max(0, min(c.User+c.System-c.RxKthreads-c.Yielding, c.Busy))
		out.Cores = append(out.Cores, c)
	}
	slices.SortFunc(out.Cores, func(a, b Core) int { return a.CPU - b.CPU })
	slices.SortFunc(threads, func(a, b Thread) int { return a.PID - b.PID })
	s.at, s.stat, s.last = at, stat, threads
	return out, nil
}

// Source is what takes samples: a SchedSampler or a Sampler.
type Source interface {
	Sample() (Sample, error)
	Close() error
}

// Close is there for Source: a Sampler holds nothing open.
func (s *Sampler) Close() error { return nil }

// Threads lists the receive kthreads measured by the last Sample, by pid.
// Threads found during that sample are measured from the next one on.
func (s *Sampler) Threads() []Thread {
	return slices.Clone(s.last)
}

func (s *Sampler) readStat() (time.Time, map[int]CPUTimes, error) {
	f, err := os.Open(filepath.Join(s.proc, "stat"))
	if err != nil {
		return time.Time{}, nil, err
	}
	defer f.Close()
	at := s.now()
	stat, err := ParseStat(f)
	return at, stat, err
}

// cpuLoad splits a core's ticks between two readings. Counters are taken
// as never going back (iowait and idle can, slightly, on tickless cores);
// a field that did counts as 0.
func cpuLoad(cpu int, a, b CPUTimes) Core {
	d := func(x, y uint64) float64 {
		if y < x {
			return 0
		}
		return float64(y - x)
	}
	user := d(a.User, b.User) + d(a.Nice, b.Nice)
	sys, irq, soft, steal := d(a.System, b.System), d(a.IRQ, b.IRQ), d(a.SoftIRQ, b.SoftIRQ), d(a.Steal, b.Steal)
	idle := d(a.Idle, b.Idle) + d(a.IOWait, b.IOWait)
	total := user + sys + irq + soft + steal + idle
	c := Core{CPU: cpu}
	if total == 0 {
		return c
	}
	p := func(v float64) float64 { return 100 * v / total }
	c.User, c.System, c.IRQ, c.SoftIRQ, c.Steal, c.Idle = p(user), p(sys), p(irq), p(soft), p(steal), p(idle)
	c.Busy = p(total - idle)
	return c
}

func percentOf(ns uint64, interval time.Duration) float64 {
	if interval <= 0 {
		return 0
	}
	return 100 * float64(ns) / float64(interval.Nanoseconds())
}

// readThread reads a thread's stat and run time; ok is false if it is gone.
// schedstat is preferred (ns, exact); without it (kernels built without
// CONFIG_SCHED_INFO print "0 0 0" or nothing) stat's ticks stand in. For a
// thread that is not a receive kthread (which every caller skips) the run
// time is not read: a scan meets every kernel thread.
func (s *Sampler) readThread(pid int) (st kthread.ProcStat, run uint64, precise, ok bool) {
	dir := filepath.Join(s.proc, strconv.Itoa(pid))
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return kthread.ProcStat{}, 0, false, false
	}
	if st, err = kthread.ParseProcStat(string(b)); err != nil {
		return kthread.ProcStat{}, 0, false, false
	}
	if !st.Kthread || !IsRxKthread(st.Comm) {
		return st, 0, false, true
	}
	if b, err := os.ReadFile(filepath.Join(dir, "schedstat")); err == nil {
		if ns, _, err := kthread.ParseSchedstat(string(b)); err == nil && (ns > 0 || st.Ticks == 0) {
			return st, ns, true, true
		}
	}
	return st, st.Ticks, false, true
}

// scan looks for receive kthreads not yet tracked and takes their baseline.
// kthreadd (pid 2) parents every kthread, so its children list is the short
// way; without it (kernels built without CONFIG_PROC_CHILDREN, or a /proc
// whose pid 2 is not kthreadd) all of /proc is walked.
func (s *Sampler) scan(at time.Time) error {
	pids, err := s.kthreadPIDs()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if _, ok := s.threads[pid]; ok {
			continue
		}
		st, run, precise, ok := s.readThread(pid)
		if !ok || !st.Kthread || !IsRxKthread(st.Comm) {
			continue
		}
		s.threads[pid] = tracked{start: st.StartTime, run: run, precise: precise}
	}
	s.scanned = at
	return nil
}

func (s *Sampler) kthreadPIDs() ([]int, error) {
	if b, err := os.ReadFile(filepath.Join(s.proc, "2", "stat")); err == nil {
		if st, err := kthread.ParseProcStat(string(b)); err == nil && st.Kthread && st.Comm == "kthreadd" {
			if b, err := os.ReadFile(filepath.Join(s.proc, "2", "task", "2", "children")); err == nil {
				if pids, err := parsePIDList(string(b)); err == nil {
					return pids, nil
				}
			}
		}
	}
	ents, err := os.ReadDir(s.proc)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", s.proc, err)
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// measureYielders returns, per core, the run time of the tracked SCHED_IDLE
// threads since the last reading (each counted whole on the core it last
// ran on), and drops those that exited or left SCHED_IDLE.
func (s *Sampler) measureYielders() map[int]uint64 {
	ns := map[int]uint64{}
	for dir, old := range s.yielders {
		st, run, ok := s.readYielder(dir)
		if !ok {
			delete(s.yielders, dir)
			continue
		}
		s.yielders[dir] = tracked{start: st.StartTime, run: run, precise: true}
		if st.StartTime == old.start && run >= old.run {
			ns[st.CPU] += run - old.run
		}
	}
	return ns
}

// scanYielders looks through every user thread for SCHED_IDLE ones not yet
// tracked. It reads one small file per thread of the host, so it runs at
// the kthread rescan's pace, not at every sample; errors only mean a
// thread is found later or not at all.
func (s *Sampler) scanYielders() {
	procs, err := os.ReadDir(s.proc)
	if err != nil {
		return
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		tasks, err := os.ReadDir(filepath.Join(s.proc, p.Name(), "task"))
		if err != nil {
			continue
		}
		for _, t := range tasks {
			dir := filepath.Join(p.Name(), "task", t.Name())
			if _, ok := s.yielders[dir]; ok {
				continue
			}
			if st, run, ok := s.readYielder(dir); ok {
				s.yielders[dir] = tracked{start: st.StartTime, run: run, precise: true}
			}
		}
	}
}

// readYielder reads a task's stat and schedstat run time; ok only for a
// live SCHED_IDLE user thread with a schedstat.
func (s *Sampler) readYielder(dir string) (kthread.ProcStat, uint64, bool) {
	b, err := os.ReadFile(filepath.Join(s.proc, dir, "stat"))
	if err != nil {
		return kthread.ProcStat{}, 0, false
	}
	st, err := kthread.ParseProcStat(string(b))
	if err != nil || st.Kthread || st.Policy != kthread.SchedIdle {
		return kthread.ProcStat{}, 0, false
	}
	b, err = os.ReadFile(filepath.Join(s.proc, dir, "schedstat"))
	if err != nil {
		return kthread.ProcStat{}, 0, false
	}
	ns, _, err := kthread.ParseSchedstat(string(b))
	if err != nil {
		return kthread.ProcStat{}, 0, false
	}
	return st, ns, true
}
