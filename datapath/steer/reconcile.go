package steer

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Reconciler runs beside every mode's agent where a steering datapath is
// pinned (control.NewAgent). A flow whose frames are counted in flight on a
// core's split-stage queues leaves them only once they were seen empty
// (c, struct steer_queue): every frame counted in came out or was
// reported dropped by the kernel. A frame lost where nothing reports it
// (a redirect that fails after the verdict, a program ahead of lanes' tc
// program that takes the skb) would hold that core's waiting flows for
// good. The reconciler books such frames lost, and only when nothing can
// still hold them: the core's counts did not change over a quiet window
// and every cpumap kthread of the core was asleep in it (a cpumap kthread
// sleeps only with an empty ring, after flushing its GRO). A starved
// kthread is runnable, not asleep, so its frames are never booked.
type Reconciler struct {
	dir   string
	logf  func(string, ...any)
	every time.Duration // between checks
	quiet time.Duration // each half of the quiet window
}

// NewReconciler reconciles the datapath pinned in dir; logf reports what it
// books (nil: quiet).
func NewReconciler(dir string, logf func(string, ...any)) *Reconciler {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Reconciler{dir: dir, logf: logf, every: time.Second, quiet: 50 * time.Millisecond}
}

// Run checks every second until ctx ends.
func (r *Reconciler) Run(ctx context.Context) {
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := r.Once(ctx); err != nil {
				r.logf("queue reconciler: %v", err)
			}
		}
	}
}

// Once checks once, booking what it finds lost.
func (r *Reconciler) Once(ctx context.Context) error {
	if !Pinned(r.dir) {
		return nil
	}
	d, err := OpenQueues(r.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	before, tracked, err := d.Queues()
	if err != nil || !tracked || !anyQueued(before) {
		return err
	}
	if !sleepCtx(ctx, r.quiet) {
		return nil
	}
	asleep, err := cpumapAsleep(d)
	if err != nil {
		return err
	}
	if !sleepCtx(ctx, r.quiet) {
		return nil
	}
	after, _, err := d.Queues()
	if err != nil {
		return err
	}
	for core, n := range lostFrames(before, after, asleep) {
		if err := d.BookLost(core, n); err != nil {
			return err
		}
		r.logf("queue reconciler: core %d: %d frames counted into its split-stage queues were never seen nor reported dropped, with its cpumap kthreads asleep and nothing moving; booked lost, so the flows waiting on them can move", core, n)
	}
	return nil
}

func anyQueued(qs []Queue) bool {
	for _, q := range qs {
		if q.Queued() > 0 {
			return true
		}
	}
	return false
}

// lostFrames says, per core, how many frames to book lost: those still
// counted as queued on a core whose counts were the same at both samples
// and whose cpumap kthreads were all asleep between them (asleep[core]
// false: one was not). A core without a kthread (asleep has no entry) has
// only its NIC poll's marked frames, which the poll takes to tc itself:
// nothing can be in flight there once its counts stop.
func lostFrames(before, after []Queue, asleep map[int]bool) map[int]uint64 {
	out := map[int]uint64{}
	for _, a := range after {
		if sleeping, known := asleep[a.Core]; a.Queued() == 0 || a.Untracked || (known && !sleeping) {
			continue
		}
		for _, b := range before {
			if b == a {
				out[a.Core] = a.Queued()
			}
		}
	}
	return out
}

// cpumapAsleep says, per core, whether every kthread of the datapath's
// cpumap entries there (both classes) is asleep. Kthreads are named
// "cpumap/<core>/map:<id>".
func cpumapAsleep(d *Datapath) (map[int]bool, error) {
	bulk, err := d.BulkKthreads()
	if err != nil {
		return nil, err
	}
	hi, err := d.HiKthreads()
	if err != nil {
		return nil, err
	}
	out := map[int]bool{}
	for _, th := range append(bulk, hi...) {
		rest, ok := strings.CutPrefix(th.Comm, "cpumap/")
		if !ok {
			continue
		}
		c, _, _ := strings.Cut(rest, "/")
		core, err := strconv.Atoi(c)
		if err != nil {
			continue
		}
		st, err := taskState(th.PID)
		if err != nil {
			return nil, err
		}
		sleeping := st == 'S' || st == 'I'
		if prev, seen := out[core]; seen {
			sleeping = sleeping && prev
		}
		out[core] = sleeping
	}
	return out, nil
}

// taskState is the state letter of /proc/<pid>/stat (R, S, D, I, ...).
func taskState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("/proc/%d/stat: no state field", pid)
	}
	return b[i+2], nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
