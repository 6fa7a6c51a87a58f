package knobs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/napi"
	"github.com/lanesnet/lanes/internal/netnsx"
)

const (
	kindKthreadAffinity = "kthread-affinity"
	kindKthreadSched    = "kthread-sched"
)

// Kthread names a kernel thread by its comm, e.g. "napi/veth0-8195": pids
// change when a device or its threaded mode is recreated, names do not.
// Some threads share a name (VXLAN's GRO cells run one "napi/vxlan0-0" per
// possible CPU); Index picks one of them in pid order, which is their
// creation order.
//
// NAPI, when set, names the thread instead by what it polls: the threaded
// NAPI poller of one receive queue. Its comm carries a NAPI id, which the
// kernel hands out anew whenever the device's NAPI is switched on, so a
// plan that switches it on cannot know the name beforehand.
type Kthread struct {
	Comm  string     `json:"comm,omitempty"`
	Index int        `json:"index,omitempty"`
	NAPI  *NAPIQueue `json:"napi_queue,omitempty"`
	// Started is the thread's start time (boot-relative ticks) when a
	// knob first read it, which the journal keeps: a name, an index
	// among same-named threads, even a queue can come to stand for another
	// thread (a device's NAPI switched off and on, threads of one name
	// created or gone, CPUs taken offline and back); the thread lanes
	// changed is gone then, and its knob restores nothing onto the new
	// one. 0: not known (knobs built to write, journals of older builds).
	Started uint64 `json:"started,omitempty"`
}

// NAPIQueue is receive queue Queue of Device in NetNS.
type NAPIQueue struct {
	NetNS  string `json:"netns,omitempty"`
	Device string `json:"device"`
	Queue  int    `json:"queue"`
}

func (t Kthread) String() string {
	if t.NAPI != nil {
		return fmt.Sprintf("napi/%s:%s/rx-%d", nsLabel(t.NAPI.NetNS), t.NAPI.Device, t.NAPI.Queue)
	}
	if t.Index == 0 {
		return t.Comm
	}
	return fmt.Sprintf("%s#%d", t.Comm, t.Index)
}

// PID finds the thread now.
func (t Kthread) PID() (int, error) {
	if t.NAPI != nil {
		return t.NAPI.pid()
	}
	ths, err := kthread.List(func(comm string) bool { return comm == t.Comm })
	if err != nil {
		return 0, err
	}
	if t.Index >= len(ths) {
		return 0, fmt.Errorf("kernel thread %s: %w (%d threads with that name)", t, ErrGone, len(ths))
	}
	return ths[t.Index].PID, nil
}

// resolve finds the thread now and checks it is the one first read
// (Started); a first read (record) notes its start time.
func (t *Kthread) resolve(record bool) (int, error) {
	pid, err := t.PID()
	if err != nil {
		return 0, err
	}
	started, err := startedAt(pid)
	if err != nil {
		return 0, fmt.Errorf("kernel thread %s (pid %d): %w", t, pid, err)
	}
	switch {
	case t.Started == 0 && record:
		t.Started = started
	case t.Started != 0 && started != t.Started:
		return 0, fmt.Errorf("kernel thread %s: %w: the thread lanes changed (started at tick %d) was replaced by pid %d (started at tick %d)", t, ErrGone, t.Started, pid, started)
	}
	return pid, nil
}

// startedAt is pid's start time (boot-relative ticks): with the pid, what
// tells a thread from one that took its pid or its name since.
func startedAt(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("%w: %w", ErrGone, err)
	}
	if err != nil {
		return 0, err
	}
	ps, err := kthread.ParseProcStat(string(b))
	if err != nil {
		return 0, err
	}
	return ps.StartTime, nil
}

// Thread is one thread by pid and start time, for a writer that found it
// by other means than a name (the bulk queue's kthread, which is lanes'
// own and not a knob): a pid that was reused since names another thread.
type Thread struct {
	PID     int
	Started uint64
}

// SetSched sets t's scheduling, or fails with ErrGone when t's pid is
// gone or names another thread now. The start time is checked, then the
// scheduling set: two system calls, between which the pid would name
// another thread only if t exited and its pid were handed out again, and
// the kernel hands pids out in turn, a freed one again only after every
// other up to pid_max. The thread it is used for, the bulk queue's
// kthread, ends with its datapath, which a reset or an apply tears down:
// the journal's lock its caller holds (RuntimeDo) keeps both out
// meanwhile.
func (t Thread) SetSched(a *unix.SchedAttr) error {
	started, err := startedAt(t.PID)
	if err == nil && started != t.Started {
		err = fmt.Errorf("%w: pid %d started at tick %d, not %d: another thread took it", ErrGone, t.PID, started, t.Started)
	}
	if err == nil {
		err = gone(unix.SchedSetAttr(t.PID, a, 0))
	}
	if err != nil {
		return fmt.Errorf("setting the scheduling of pid %d: %w", t.PID, err)
	}
	return nil
}

func gone(err error) error {
	if errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("%w: %w", ErrGone, err)
	}
	return err
}

// KthreadAffinity is the CPU affinity of a kernel thread. Its value is a CPU
// list ("0-1"), as in /proc/PID/status Cpus_allowed_list.
type KthreadAffinity struct {
	Kthread
}

// QueueAffinity returns the affinity knob of the threaded NAPI poller of
// receive queue q of dev in ns.
func QueueAffinity(ns, dev string, q int) *KthreadAffinity {
	return &KthreadAffinity{Kthread{NAPI: &NAPIQueue{NetNS: ns, Device: dev, Queue: q}}}
}

// QueueSched returns the scheduling knob of the threaded NAPI poller of
// receive queue q of dev in ns.
func QueueSched(ns, dev string, q int) *KthreadSched {
	return &KthreadSched{Kthread{NAPI: &NAPIQueue{NetNS: ns, Device: dev, Queue: q}}}
}

// Affinity returns the affinity knob of the kernel thread comm (index 0).
func Affinity(comm string, index int) *KthreadAffinity {
	return &KthreadAffinity{Kthread{Comm: comm, Index: index}}
}

func (k *KthreadAffinity) Kind() string { return kindKthreadAffinity }
func (k *KthreadAffinity) Key() string  { return kindKthreadAffinity + ":" + k.Kthread.String() }

func (k *KthreadAffinity) Read() ([]byte, error) {
	pid, err := k.resolve(true)
	if err != nil {
		return nil, err
	}
	cpus, err := kthread.Thread{PID: pid}.Affinity()
	if err != nil {
		return nil, fmt.Errorf("reading affinity of %s (pid %d): %w", k.Kthread, pid, gone(err))
	}
	return []byte(cpuset.FormatList(cpus)), nil
}

func (k *KthreadAffinity) Write(v []byte) error {
	cpus, err := cpuset.ParseList(string(v))
	if err != nil {
		return fmt.Errorf("affinity of %s: %w", k.Kthread, err)
	}
	pid, err := k.resolve(false)
	if err != nil {
		return err
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(pid, &set); err != nil {
		return fmt.Errorf("setting affinity of %s (pid %d) to %s: %w", k.Kthread, pid, v, gone(err))
	}
	return nil
}

// KthreadSched is the scheduling policy, RT priority and nice value of a
// kernel thread. Its value reads like "policy=fifo prio=50 nice=0".
type KthreadSched struct {
	Kthread
}

// Sched returns the scheduling knob of the kernel thread comm.
func Sched(comm string, index int) *KthreadSched {
	return &KthreadSched{Kthread{Comm: comm, Index: index}}
}

func (k *KthreadSched) Kind() string { return kindKthreadSched }
func (k *KthreadSched) Key() string  { return kindKthreadSched + ":" + k.Kthread.String() }

func (k *KthreadSched) Read() ([]byte, error) {
	pid, err := k.resolve(true)
	if err != nil {
		return nil, err
	}
	a, err := unix.SchedGetAttr(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("reading scheduling of %s (pid %d): %w", k.Kthread, pid, gone(err))
	}
	return []byte(FormatSched(a)), nil
}

func (k *KthreadSched) Write(v []byte) error {
	a, err := ParseSched(string(v))
	if err != nil {
		return fmt.Errorf("scheduling of %s: %w", k.Kthread, err)
	}
	pid, err := k.resolve(false)
	if err != nil {
		return err
	}
	if err := unix.SchedSetAttr(pid, a, 0); err != nil {
		return fmt.Errorf("setting scheduling of %s (pid %d) to %q: %w", k.Kthread, pid, v, gone(err))
	}
	return nil
}

// FormatSched renders what sched_setattr needs to restore a, and nothing
// more (utilization clamps are left alone by lanes).
func FormatSched(a *unix.SchedAttr) string {
	s := fmt.Sprintf("policy=%s prio=%d nice=%d", kthread.PolicyName(a.Policy), a.Priority, a.Nice)
	if a.Flags&unix.SCHED_FLAG_RESET_ON_FORK != 0 {
		s += " reset-on-fork"
	}
	if a.Policy == unix.SCHED_DEADLINE {
		s += fmt.Sprintf(" runtime=%d deadline=%d period=%d", a.Runtime, a.Deadline, a.Period)
	}
	return s
}

// ParseSched is the inverse of FormatSched. prio and nice may be omitted
// (0); policy may not.
func ParseSched(s string) (*unix.SchedAttr, error) {
	a := &unix.SchedAttr{}
	havePolicy := false
	for _, f := range strings.Fields(s) {
		if f == "reset-on-fork" {
			a.Flags |= unix.SCHED_FLAG_RESET_ON_FORK
			continue
		}
		key, val, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("bad scheduling %q: %q is not key=value", s, f)
		}
		if key == "policy" {
			p, found := kthread.PolicyByName(val)
			if !found {
				return nil, fmt.Errorf("bad scheduling %q: unknown policy %q (use other, fifo, rr, batch, idle)", s, val)
			}
			a.Policy = p
			havePolicy = true
			continue
		}
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad scheduling %q: %s is not a number", s, f)
		}
		switch key {
		case "prio":
			a.Priority = uint32(n)
		case "nice":
			a.Nice = int32(n)
		case "runtime":
			a.Runtime = uint64(n)
		case "deadline":
			a.Deadline = uint64(n)
		case "period":
			a.Period = uint64(n)
		default:
			return nil, fmt.Errorf("bad scheduling %q: unknown field %q", s, key)
		}
	}
	if !havePolicy {
		return nil, fmt.Errorf("bad scheduling %q: missing policy=", s)
	}
	if (a.Policy == unix.SCHED_FIFO || a.Policy == unix.SCHED_RR) && (a.Priority < 1 || a.Priority > 99) {
		return nil, fmt.Errorf("bad scheduling %q: fifo and rr need prio 1..99", s)
	}
	return a, nil
}

func (q *NAPIQueue) pid() (int, error) {
	var ifindex int
	err := netnsx.Do(q.NetNS, func() error {
		l, err := netlink.LinkByName(q.Device)
		if err != nil {
			return fmt.Errorf("%s in %s: %w: %w", q.Device, nsLabel(q.NetNS), ErrGone, err)
		}
		ifindex = l.Attrs().Index
		return nil
	})
	if err != nil {
		return 0, err
	}
	name, err := netnsx.EntryName(q.NetNS)
	if err != nil {
		return 0, err
	}
	pid, err := napi.RxQueueThread(name, ifindex, q.Queue)
	if errors.Is(err, napi.ErrNoQueue) {
		return 0, fmt.Errorf("%w: %w", ErrGone, err)
	}
	if err != nil {
		return 0, err
	}
	if pid == 0 {
		return 0, fmt.Errorf("rx queue %d of %s in %s: %w (no threaded NAPI poller)", q.Queue, q.Device, nsLabel(q.NetNS), ErrGone)
	}
	return pid, nil
}
