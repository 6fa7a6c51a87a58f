//go:build linux

package steer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/lanesnet/lanes/datapath/knobs"
)

// Order is order keeping (bpf/order.h): the split stage's queue
// accounting, the drop tracepoints, the adoption windows of containers
// taken over after apply (and, apart, the queue Reconciler).
type Order struct{ *core }

func (d *Datapath) Order() Order { return Order{d.core} }

// Queue is one core's split-stage queue accounting (bpf/maps.h, struct
// steer_queue): the frames steer_xdp marked for the core's cpumap queues
// (both classes) and, under prism's PLACE_LOCAL, for its NIC poll, and
// where they went.
type Queue struct {
	Core int `json:"core"`
	// Enqueued frames, of which the skb side saw Seen; DroppedRing were
	// refused by a full ring, DroppedKthread dropped by a kthread before
	// an skb existed, Lost booked lost by lanes agent (BookLost).
	// Enqueued minus the four is what is queued now (Queued).
	Enqueued       uint64 `json:"enqueued"`
	Seen           uint64 `json:"seen"`
	DroppedRing    uint64 `json:"dropped_ring"`
	DroppedKthread uint64 `json:"dropped_kthread"`
	Lost           uint64 `json:"lost,omitempty"`
	// Untracked: a frame went in that could not be marked, so the queues
	// can no longer be told empty and their flows fall back to the drain
	// time.
	Untracked bool `json:"untracked,omitempty"`
}

// Dropped is every frame the kernel reported dropped in the queues.
func (q Queue) Dropped() uint64 { return q.DroppedRing + q.DroppedKthread }

// Out is every frame that left: seen, dropped or booked lost.
func (q Queue) Out() uint64 { return q.Seen + q.Dropped() + q.Lost }

// Queued is what is in the queues now, or on its way from a kthread to
// the skb side's count (GRO).
func (q Queue) Queued() uint64 {
	if out := q.Out(); out < q.Enqueued {
		return q.Enqueued - out
	}
	return 0
}

// Queues reads the accounting of every core whose queues ever took a
// frame, by core; and whether the drop tracepoints are attached
// (TrackQueues), without which no queue is tracked.
func (d Order) Queues() ([]Queue, bool, error) {
	var out []Queue
	var v steerSteerQueue
	for core := uint32(0); core < MaxCPUs; core++ {
		if err := d.objs.SteerQueues.Lookup(core, &v); err != nil {
			return nil, false, fmt.Errorf("reading queue accounting: %w", err)
		}
		if v.Enq == 0 && v.Untracked == 0 && v.Seen == 0 {
			continue
		}
		var lost uint64
		if err := d.objs.SteerQueueLost.Lookup(core, &lost); err != nil {
			return nil, false, fmt.Errorf("reading lost frames: %w", err)
		}
		out = append(out, Queue{Core: int(core), Enqueued: v.Enq, Seen: v.Seen,
			DroppedRing: v.DroppedEnq, DroppedKthread: v.DroppedKthread, Lost: lost, Untracked: v.Untracked != 0})
	}
	var id uint32
	if err := d.objs.SteerQmaps.Lookup(uint32(0), &id); err != nil {
		return nil, false, fmt.Errorf("reading cpumap ids: %w", err)
	}
	return out, id != 0, nil
}

// BookLost counts n more frames of core's queues as lost: counted in,
// never seen nor reported dropped. Only lanes agent's reconciler
// (Reconciler, order_reconcile.go) calls it, and only when nothing can
// still be in those queues; the datapath then treats them as out, so the
// flows that wait for the core's queues to empty can move.
func (d Order) BookLost(core int, n uint64) error {
	if core < 0 || core >= MaxCPUs {
		return fmt.Errorf("core %d out of range", core)
	}
	var lost uint64
	if err := d.objs.SteerQueueLost.Lookup(uint32(core), &lost); err != nil {
		return fmt.Errorf("reading lost frames: %w", err)
	}
	return d.setLost(core, lost+n)
}

// setLost sets core's booked-lost count (the reconciler, under its lock).
func (d *core) setLost(core int, n uint64) error {
	if err := d.objs.SteerQueueLost.Put(uint32(core), n); err != nil {
		return fmt.Errorf("booking lost frames: %w", err)
	}
	return nil
}

// metaGen is the datapath's mark in the metadata's generation bits
// (bpf/maps.h, steer_cfg.meta_gen): the low 16 bits of its bulk cpumap's map
// id, which differ from the datapath loaded before it unless 65536 maps
// were created in between.
func (d *core) metaGen() (uint32, error) {
	info, err := d.objs.SteerCpumap.Info()
	if err != nil {
		return 0, fmt.Errorf("reading the cpumap's id: %w", err)
	}
	id, ok := info.ID()
	if !ok {
		return 0, nil // no map ids: every datapath marks 0
	}
	return uint32(id) & 0xffff, nil
}

// Uncounted is what a flow's in-flight count (Flow.InFlight) carries on
// top of its frames once one of them went unmarked (bpf/order.h, UNCOUNTED;
// TestConstsMatchC checks it).
const Uncounted = 1 << 40

// The drop tracepoints' links (TrackQueues), pinned beside the maps so
// they outlive the process that attached them and go with Unpin. The
// first two report the split stage's cpumap drops, the last every skb
// drop, of which steer_drops_skb counts the later stages' own.
var dropTraces = []struct{ pin, group, tracepoint string }{
	{steerProgSteerDropsRing + "_link", "xdp", "xdp_cpumap_enqueue"},
	{steerProgSteerDropsKthread + "_link", "xdp", "xdp_cpumap_kthread"},
	{steerProgSteerDropsSkb + "_link", "skb", "kfree_skb"},
	{steerProgSteerSyncXmit + "_link", "xdp", "xdp_devmap_xmit"},
	{steerProgSteerSyncRedirectErr + "_link", "xdp", "xdp_redirect_err"},
}

// NoDropTracesError is TrackQueues failing to attach to a drop tracepoint
// (a kernel built without BPF raw tracepoints, or one that renamed them).
// The datapath works without: the flows of what it would have tracked
// (the cpumap queues; the later stages' frames, for skb:kfree_skb) fall
// back to the drain time when frames are dropped, and `lanes status` says
// so.
type NoDropTracesError struct {
	Tracepoint string // group:name
	Err        error
}

func (e *NoDropTracesError) Error() string {
	return fmt.Sprintf("attaching to tracepoint %s to count drops: %v", e.Tracepoint, e.Err)
}

func (e *NoDropTracesError) Unwrap() error { return e.Err }

// TrackQueues attaches the programs that count frames the kernel drops,
// pins their links in dir, and then tells the datapath which cpumap is
// which, which turns the queues' accounting on: from then on a flow whose
// frames are counted in flight on a cpumap queue moves only once they came
// out or were dropped, however long the queue waits for its core, instead
// of after the drain time (bpf/maps.h, struct steer_queue). Last it attaches
// steer_drops_skb (skb:kfree_skb), which counts the later stages' frames
// the kernel drops out of their flows' counts; if only that one fails, the
// cpumap queues stay tracked and the error says which is missing. Only a
// freshly loaded Datapath can attach; links pinned in dir before are
// replaced.
func (d Order) TrackQueues(dir string) error {
	err := d.trackCPUMaps(dir)
	var nt *NoDropTracesError
	if err != nil && !errors.As(err, &nt) {
		return err
	}
	// The later stages' drops are tracked (or not) whatever became of
	// the cpumap's; the first degradation is the one reported.
	var skbErr error = &NoDropTracesError{Tracepoint: "skb:kfree_skb", Err: d.dropsSkbErr}
	if d.dropsSkbErr == nil {
		skbErr = attachTrace(dir, 2, d.objs.SteerDropsSkb)
	} else if rerr := os.Remove(filepath.Join(dir, dropTraces[2].pin)); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		// A stale link there would say tracked, counting into another
		// datapath's maps.
		return fmt.Errorf("tracking drops: removing the stale link: %w", rerr)
	}
	if skbErr != nil && !errors.As(skbErr, &nt) {
		return skbErr
	}
	// PRISM-sync's redirects that the devmap or the veth dropped
	// (Counters.SyncDropped); without, they go uncounted. The devmap's
	// trace reads the device through CO-RE, as steer_drops_skb does.
	// Both tracepoints fire for every XDP redirect on the host, anyone's:
	// only a mode with the shortcut attaches them (a reload into another
	// mode takes its links away).
	var syncErr error
	sync := d.mode.Flags&modeSync != 0
	for i, p := range map[int]*ebpf.Program{3: d.objs.SteerSyncXmit, 4: d.objs.SteerSyncRedirectErr} {
		var e error
		switch {
		case sync && (i == 4 || d.dropsSkbErr == nil):
			e = attachTrace(dir, i, p)
		case sync:
			e = &NoDropTracesError{Tracepoint: dropTraces[i].group + ":" + dropTraces[i].tracepoint, Err: d.dropsSkbErr}
			fallthrough
		default: // no trace here: a link an earlier load left goes
			if rerr := os.Remove(filepath.Join(dir, dropTraces[i].pin)); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				return fmt.Errorf("tracking drops: removing a stale link: %w", rerr)
			}
		}
		if e != nil && !errors.As(e, &nt) {
			return e
		}
		syncErr = errors.Join(syncErr, e)
	}
	// Only degradations (NoDropTracesError) from here.
	d.tracked = true
	return errors.Join(err, skbErr, syncErr)
}

// trackCPUMaps is TrackQueues for the split stage's cpumap queues.
func (d *core) trackCPUMaps(dir string) error {
	progs := []*ebpf.Program{d.objs.SteerDropsRing, d.objs.SteerDropsKthread}
	for i := range progs {
		if err := attachTrace(dir, i, progs[i]); err != nil {
			return err
		}
	}
	for class, m := range []*ebpf.Map{d.objs.SteerCpumap, d.objs.SteerCpumapHi} {
		info, err := m.Info()
		if err != nil {
			return fmt.Errorf("tracking cpumap queues: %w", err)
		}
		id, ok := info.ID()
		if !ok {
			return errors.New("tracking cpumap queues: this kernel reports no map ids")
		}
		if err := d.objs.SteerQmaps.Put(uint32(class), uint32(id)); err != nil {
			return fmt.Errorf("tracking cpumap queues: %w", err)
		}
	}
	return nil
}

// attachTrace attaches prog to dropTraces[i] and pins the link in dir.
func attachTrace(dir string, i int, prog *ebpf.Program) error {
	tr := dropTraces[i]
	path := filepath.Join(dir, tr.pin)
	if prog == nil {
		return fmt.Errorf("tracking drops: no program loaded to attach at %s (reopened datapath)", path)
	}
	// A link pinned there is a stale one, whose program counts into
	// another datapath's maps: this one's drops would go uncounted.
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("tracking drops: removing the stale link %s: %w", path, err)
	}
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tr.tracepoint, Program: prog})
	if err != nil {
		return &NoDropTracesError{Tracepoint: tr.group + ":" + tr.tracepoint, Err: err}
	}
	err = l.Pin(path)
	l.Close()
	if err != nil {
		return fmt.Errorf("pinning the %s:%s link: %w", tr.group, tr.tracepoint, err)
	}
	return nil
}

// LaterDropsTracked says whether the datapath pinned in dir counts the
// later stages' dropped frames out (steer_drops_skb attached by
// TrackQueues); without, a flow there with a dropped frame moves only
// after the drain time.
func LaterDropsTracked(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, dropTraces[2].pin))
	return err == nil
}

// OpenQueues reopens only what the queue reconciler reads and writes: the
// queue accounting, the booked-lost counts and the cpumaps (whose
// kthreads it looks at).
func OpenQueues(dir string) (*Datapath, error) {
	if !Pinned(dir) {
		return nil, fmt.Errorf("steer datapath in %s: %w", dir, knobs.ErrGone)
	}
	d, _, err := openMaps(dir, []string{steerMapSteerQueues, steerMapSteerQueueLost, steerMapSteerQmaps, steerMapSteerCpumap, steerMapSteerCpumapHi})
	return d, err
}
