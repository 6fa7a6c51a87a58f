package cpuload

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/cpuset"
)

// Task classes of cpuacct.c.
const (
	clsIdle = iota
	clsOther
	clsYield
	clsRxK
	nCls
)

// readTries bounds the map reads per sample while a core's copy is torn.
const readTries = 4

// onlineEvery bounds how often the online cores are re-read: cores come and
// go rarely, and a sample should cost one map read.
const onlineEvery = time.Second

// SchedSampler takes per-core load samples from the scheduler's own events
// (cpuacct.c: tracing programs on sched_switch and softirq entry/exit). A
// sample is one read of a per-CPU map, where a Sampler reads /proc/stat and
// one /proc file per receive kthread and SCHED_IDLE thread at every sample
// and walks all of /proc once a second. Its figures are nanosecond-exact
// where /proc/stat counts 10 ms ticks.
//
// It fills the fields the balancer uses: Busy, Idle, SoftIRQ, RxKthreads,
// Rx, Yielding and Tasks. User, System, IRQ and Steal are not measured (0):
// interrupts and stolen time count as time of the task they interrupted,
// busy unless that was the idle task. Close detaches the programs; nothing
// is pinned, so a crashed agent leaves nothing behind.
type SchedSampler struct {
	objs cpuacctObjects
	// links are the accounting programs' (none while SetAccounting is
	// off); accounted: they were attached over the whole interval since
	// the previous reading.
	links     []link.Link
	accounted bool
	online    []int
	onlineAt  time.Time
	prev      map[int]cpuTotals
	// Counting a NIC's polls (WatchNAPIs), and whether the previous
	// reading did.
	nic         nicPolls
	prevWatched bool
}

// cpuTotals is one core's cumulative time by class up to a reading.
type cpuTotals struct {
	at         uint64 // ns, CLOCK_MONOTONIC
	wall, sirq [nCls]uint64
	nic        NICCount
}

// NewSchedSampler loads and attaches the accounting programs and takes the
// first reading; the first Sample measures from here. It fails on kernels
// without BTF or BPF tracing programs (the caller falls back to Sampler).
func NewSchedSampler() (*SchedSampler, error) {
	var objs cpuacctObjects
	if err := loadCpuacctObjects(&objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading the scheduler accounting programs: %w", ve)
		}
		return nil, fmt.Errorf("loading the scheduler accounting programs: %w", err)
	}
	s := &SchedSampler{objs: objs, prev: map[int]cpuTotals{}}
	s.nic.objs = &s.objs
	if err := s.refreshOnline(); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.attach(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// attach starts the scheduler accounting from zero and takes the reading
// the next Sample measures from.
func (s *SchedSampler) attach() error {
	// Zeroed while nothing writes it: a core's last switch and softirq
	// start from before a detach would charge the whole pause to
	// whatever ran then.
	if err := s.objs.Acct.Put(uint32(0), make([]cpuacctAcct, ebpf.MustPossibleCPU())); err != nil {
		return fmt.Errorf("clearing the scheduler accounting map: %w", err)
	}
	for _, p := range []*ebpf.Program{s.objs.AcctSwitch, s.objs.AcctSirqEntry, s.objs.AcctSirqExit} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p})
		if err != nil {
			s.detach()
			return fmt.Errorf("attaching %v: %w", p, err)
		}
		s.links = append(s.links, l)
	}
	// A core only gets a class once it switches tasks; one that runs a
	// single task (a busy NAPI thread) may not switch for seconds.
	if err := visit(s.online); err != nil {
		s.detach()
		return fmt.Errorf("visiting every core once: %w", err)
	}
	if _, err := s.read(); err != nil {
		s.detach()
		return err
	}
	return nil
}

func (s *SchedSampler) detach() {
	for _, l := range s.links {
		l.Close()
	}
	s.links, s.accounted = nil, false
}

// SetAccounting turns the scheduler accounting (the programs on every
// task switch and softirq) off or back on; the NIC's polls are counted
// either way. Off, the cores pay for the NIC poll counter alone, and
// samples say NICOnly; back on, the accounting starts from zero with a
// reading of its own, so the next sample measures from the switch and is
// accounted (the NIC's polls between the last sample and the switch are
// in neither).
func (s *SchedSampler) SetAccounting(on bool) error {
	switch {
	case on && s.links == nil:
		return s.attach()
	case !on && s.links != nil:
		s.detach()
	}
	return nil
}

// Close detaches the programs and frees the map.
func (s *SchedSampler) Close() error {
	s.detach()
	s.nic.close()
	return s.objs.Close()
}

// WatchNAPIs has the samples count the polls of the NAPI instances with
// these ids (a NIC's: Core.NIC) and no others; the first call attaches
// the counting program (tp_btf/napi_poll). The next Sample still covers
// time before a change, so it is not NICWatched; the one after is. No
// ids stops the counting.
func (s *SchedSampler) WatchNAPIs(ids []uint32) error {
	changed, err := s.nic.watch(ids)
	if changed {
		// The interval up to the next reading mixes the old set and the new.
		s.prevWatched = false
	}
	return err
}

// ArmWake has the kernel send a Wake (Wakes) for each window of window
// in which the polls of the watched NAPI instances on core (-1: on any
// core, each judged apart), at least minPolls of them, found depth frames
// each or more on average (cpuacct.c, nic_wake): a caller that samples
// slowly while the NIC queues little learns at once when it queues more.
// Needs WatchNAPIs first. An arming replaces the one before.
func (s *SchedSampler) ArmWake(core int, depth float64, window time.Duration, minPolls int) error {
	return s.nic.armWake(core, depth, window, minPolls)
}

// DisarmWake stops the wakes; one already waiting is dropped.
func (s *SchedSampler) DisarmWake() error { return s.nic.disarmWake() }

// Wakes delivers the armed wake's windows, one waiting at most (nil
// before the first ArmWake).
func (s *SchedSampler) Wakes() <-chan Wake { return s.nic.wakes() }

// Sample returns the load since the previous call (or NewSchedSampler).
func (s *SchedSampler) Sample() (Sample, error) {
	if time.Since(s.onlineAt) >= onlineEvery {
		if err := s.refreshOnline(); err != nil {
			return Sample{}, err
		}
	}
	prev, watched, accounted := s.prev, s.prevWatched, s.accounted
	at, err := s.read()
	if err != nil {
		return Sample{}, err
	}
	out := Sample{At: at, NICWatched: watched && s.prevWatched, NICOnly: !accounted || !s.accounted}
	for _, cpu := range s.online {
		a, okA := prev[cpu]
		b, okB := s.prev[cpu]
		if !okA || !okB || b.at <= a.at {
			continue
		}
		c := Core{CPU: cpu, NIC: b.nic.since(a.nic)}
		if !out.NICOnly {
			c = coreLoad(cpu, a, b)
		}
		out.Cores = append(out.Cores, c)
		if d := time.Duration(b.at - a.at); d > out.Interval {
			out.Interval = d
		}
	}
	return out, nil
}

// coreLoad turns two readings of a core into its load between them.
func coreLoad(cpu int, a, b cpuTotals) Core {
	interval := time.Duration(b.at - a.at)
	d := func(x, y uint64) uint64 {
		if y < x {
			return 0
		}
		return y - x
	}
	var wall, sirq [nCls]uint64
	for k := range nCls {
		wall[k], sirq[k] = d(a.wall[k], b.wall[k]), d(a.sirq[k], b.sirq[k])
	}
	pct := func(ns uint64) float64 { return min(100, percentOf(ns, interval)) }
	c := Core{CPU: cpu}
	// Softirqs ran on top of a task and are inside its wall time; on top
	// of the idle task they are busy time.
	c.Busy = pct(wall[clsOther] + wall[clsYield] + wall[clsRxK] + sirq[clsIdle])
	c.Idle = 100 - c.Busy
	c.SoftIRQ = pct(sirq[clsIdle] + sirq[clsOther] + sirq[clsYield] + sirq[clsRxK])
	c.RxKthreads = pct(d(sirq[clsRxK], wall[clsRxK]))
	c.Rx = min(100, c.SoftIRQ+c.RxKthreads)
	c.Yielding = min(c.Busy, pct(d(sirq[clsYield], wall[clsYield])))
	c.Tasks = pct(d(sirq[clsOther], wall[clsOther]))
	c.NIC = b.nic.since(a.nic)
	return c
}

// read takes a reading of every online core into s.prev. A core whose copy
// raced with its own update keeps its previous reading (its next sample
// covers both intervals). With the accounting off it reads the NIC
// counts alone.
func (s *SchedSampler) read() (time.Time, error) {
	var vals []cpuacctAcct
	for try := 0; s.links != nil; try++ {
		if err := s.objs.Acct.Lookup(uint32(0), &vals); err != nil {
			return time.Time{}, fmt.Errorf("reading the scheduler accounting map: %w", err)
		}
		// A copy races with its core's update a few times in a thousand;
		// another copy a moment later does not.
		if try == readTries-1 || !slices.ContainsFunc(vals, func(v cpuacctAcct) bool { return v.End != v.Begin }) {
			break
		}
	}
	polls, err := s.nic.read()
	if err != nil {
		return time.Time{}, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Time{}, err
	}
	at, now := time.Now(), uint64(ts.Nano())
	next := make(map[int]cpuTotals, len(s.online))
	for _, cpu := range s.online {
		if s.links == nil {
			t := cpuTotals{at: now}
			if cpu < len(polls) {
				t.nic = polls[cpu]
			}
			next[cpu] = t
			continue
		}
		if cpu >= len(vals) {
			continue
		}
		v := vals[cpu]
		if v.End != v.Begin || v.Last == 0 {
			// Torn copy, or no switch seen yet on this core.
			if p, ok := s.prev[cpu]; ok {
				next[cpu] = p
			}
			continue
		}
		t := cpuTotals{at: now, wall: v.Wall, sirq: v.Sirq}
		if cpu < len(polls) {
			t.nic = polls[cpu]
		}
		// The running task's time since the last switch is not charged
		// yet.
		if v.Cls < nCls && now > v.Last {
			t.wall[v.Cls] += now - v.Last
		}
		next[cpu] = t
	}
	s.prev, s.prevWatched, s.accounted = next, s.nic.counting(), s.links != nil
	return at, nil
}

func (s *SchedSampler) refreshOnline() error {
	cpus, err := cpuset.Online()
	if err != nil {
		return err
	}
	s.online, s.onlineAt = cpus, time.Now()
	return nil
}

// visit runs a thread on each core in turn and sleeps there, so each core
// switches tasks at least once.
func visit(cpus []int) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread exits with the goroutine and takes
		// its narrowed affinity with it.
		runtime.LockOSThread()
		for _, c := range cpus {
			var set unix.CPUSet
			set.Set(c)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				errc <- err
				return
			}
			ts := unix.Timespec{Nsec: 1000}
			_ = unix.Nanosleep(&ts, nil)
		}
		errc <- nil
	}()
	return <-errc
}
