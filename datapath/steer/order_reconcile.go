package steer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/lanesnet/lanes/internal/heartbeat"
	"github.com/lanesnet/lanes/internal/kthread"
	"golang.org/x/sys/unix"
)

// Reconciler runs beside every mode's agent where a steering datapath is
// pinned (control.NewAgent; a mode without an agent of its own gets one
// that runs only this). A flow whose frames are counted in flight on a
// core's split-stage queues leaves them only once they were seen empty
// (bpf/maps.h, struct steer_queue): every frame counted in came out or was
// reported dropped by the kernel. A frame lost where nothing reports it
// (a redirect that fails after the verdict, a program ahead of lanes' tc
// program that takes the skb) would hold that core's waiting flows for
// good. The reconciler books such frames lost, and only when nothing can
// still hold them: the core's counts did not change over a quiet window,
// and in its middle every thread that could hold a frame of the core was
// asleep: the core's cpumap kthreads (one sleeps only with an empty ring,
// after flushing its GRO), its ksoftirqd and every threaded NAPI poll (a
// NIC poll may keep frames in its GRO between polls). A starved thread is
// runnable, not asleep, so its frames are never booked. RPS on the
// underlay, which would hold skbs in another core's backlog, is not
// looked for (lanes never sets it there).
type Reconciler struct {
	dir     string
	logf    func(string, ...any)
	every   time.Duration // between checks
	quiet   time.Duration // each half of the quiet window
	lastErr string
	// Beats is where Run beats, for the agent's liveness (nil: nowhere).
	Beats *heartbeat.Board
}

// NewReconciler reconciles the datapath pinned in dir; logf reports what it
// books (nil: quiet).
func NewReconciler(dir string, logf func(string, ...any)) *Reconciler {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Reconciler{dir: dir, logf: logf, every: time.Second, quiet: 50 * time.Millisecond}
}

// Run checks every second until ctx ends. An error is logged once until
// it changes (a datapath of another version would otherwise log every
// second).
func (r *Reconciler) Run(ctx context.Context) {
	beat := r.Beats.Loop("queue reconciler", r.every)
	defer beat.Stop()
	t := time.NewTicker(r.every)
	defer t.Stop()
	for ; ; beat.Beat() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			err := r.Once(ctx)
			if msg := fmt.Sprint(err); err != nil && msg != r.lastErr {
				r.logf("queue reconciler: %v", err)
				r.lastErr = msg
			} else if err == nil {
				r.lastErr = ""
			}
		}
	}
}

// Once checks once, booking what it finds lost, and undoes a booking the
// counts prove wrong (more frames out than in).
func (r *Reconciler) Once(ctx context.Context) error {
	if !Pinned(r.dir) {
		return nil
	}
	// One reconciler per datapath: two would book the same frames twice.
	unlock, ok, err := lockDir(r.dir)
	if err != nil || !ok {
		return err
	}
	defer unlock()
	d, err := OpenQueues(r.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	s0, tracked, err := d.Order().Queues()
	if err != nil || !tracked || (!anyQueued(s0) && !anyLost(s0)) {
		return err
	}
	if !sleepCtx(ctx, r.quiet) {
		return nil
	}
	s1, _, err := d.Order().Queues()
	if err != nil {
		return err
	}
	if undone, err := r.undoOverbooking(d, s0, s1); err != nil || undone {
		return err
	}
	var cores []int
	for core := range lostFrames(s0, s1, nil) {
		cores = append(cores, core)
	}
	if len(cores) == 0 {
		return nil
	}
	asleep, err := coresAsleep(d, cores)
	if err != nil {
		return err
	}
	if !sleepCtx(ctx, r.quiet) {
		return nil
	}
	s2, _, err := d.Order().Queues()
	if err != nil {
		return err
	}
	for core, n := range lostFrames(s0, s2, asleep) {
		if err := d.Order().BookLost(core, n); err != nil {
			return err
		}
		r.logf("queue reconciler: core %d: %d frames counted into its split-stage queues were never seen nor reported dropped, with every thread that could hold them asleep and nothing moving; booked lost, so the flows waiting on them can move", core, n)
	}
	return nil
}

// undoOverbooking takes off a core's booked-lost count what the counts
// prove was never lost: more frames out by the first sample than in by
// the second. Comparing two samples, out read before in, keeps a sample
// taken while the counts move from looking like over-booking (one map
// read copies enq before seen). An over-booking smaller than the frames
// in flight at the time does not show: the core then looks empty up to
// that many frames early until the next pass that finds it.
func (r *Reconciler) undoOverbooking(d *Datapath, s0, s1 []Queue) (bool, error) {
	undone := false
	for _, b := range s0 {
		for _, a := range s1 {
			if a.Core != b.Core || b.Out() <= a.Enqueued || a.Lost == 0 {
				continue
			}
			n := min(b.Out()-a.Enqueued, a.Lost)
			if err := d.setLost(a.Core, a.Lost-n); err != nil {
				return undone, err
			}
			undone = true
			r.logf("queue reconciler: core %d: %d frames booked lost came out after all; booking undone", a.Core, n)
		}
	}
	return undone, nil
}

func anyLost(qs []Queue) bool {
	for _, q := range qs {
		if q.Lost > 0 {
			return true
		}
	}
	return false
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
// and, unless asleep is nil (a first pass that only finds candidates),
// where every thread that could hold its frames was asleep between them.
func lostFrames(before, after []Queue, asleep map[int]bool) map[int]uint64 {
	out := map[int]uint64{}
	for _, a := range after {
		if a.Queued() == 0 || a.Untracked || (asleep != nil && !asleep[a.Core]) {
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

// coresAsleep says, for each of cores, whether every thread that could
// hold a frame of its queues is asleep: the datapath's cpumap kthreads
// there (both classes, "cpumap/<core>/map:<id>"), the core's ksoftirqd,
// and every threaded NAPI poll ("napi/..."), wherever it runs.
func coresAsleep(d *Datapath, cores []int) (map[int]bool, error) {
	bulk, err := d.CPUMap().Kthreads()
	if err != nil {
		return nil, err
	}
	hi, err := d.HiCPUMap().Kthreads()
	if err != nil {
		return nil, err
	}
	napi, err := kthread.List(func(c string) bool { return strings.HasPrefix(c, "napi/") })
	if err != nil {
		return nil, err
	}
	out := map[int]bool{}
	for _, core := range cores {
		soft, err := kthread.List(func(c string) bool { return c == fmt.Sprintf("ksoftirqd/%d", core) })
		if err != nil {
			return nil, err
		}
		if len(soft) == 0 {
			return nil, fmt.Errorf("ksoftirqd/%d is not visible (a PID namespace?): no frame can be booked lost from here", core)
		}
		ths := append(soft, napi...)
		for _, th := range append(bulk, hi...) {
			if kthread.CPUMapOn(th.Comm, core) {
				ths = append(ths, th)
			}
		}
		sleeping := true
		for _, th := range ths {
			st, err := taskState(th.PID)
			if errors.Is(err, fs.ErrNotExist) {
				continue // exited since listed: it holds nothing
			}
			if err != nil {
				return nil, err
			}
			sleeping = sleeping && (st == 'S' || st == 'I')
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

// lockDir takes an exclusive lock on the pin directory, without waiting:
// ok is false when another reconciler holds it.
func lockDir(dir string) (unlock func(), ok bool, err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, fmt.Errorf("locking %s: %w", dir, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("locking %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, true, nil
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
