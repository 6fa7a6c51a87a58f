//go:build linux

package steer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// Queue accounting (bpf/maps.h, struct steer_queue): a flow counted in flight
// on a cpumap queue moves once that queue has been seen empty since its
// last frame went in, never on the drain timeout, however long the
// queue's kthread waits for its core.

// trackedDatapath is drainDatapath with the drop tracepoints attached and
// pinned (TrackQueues), in a bpffs directory removed with the test.
func trackedDatapath(t *testing.T, drain time.Duration) *Datapath {
	t.Helper()
	d, _ := trackedDatapathDir(t, drain)
	return d
}

// trackedDatapathDir is trackedDatapath and its pin directory.
func trackedDatapathDir(t *testing.T, drain time.Duration) (*Datapath, string) {
	t.Helper()
	if runtime.NumCPU() < 2 {
		t.Skip("needs two cores (the tests use cores 0 and 1)")
	}
	d := drainDatapath(t, drain)
	return d, trackQueues(t, d)
}

// trackQueues pins d in a bpffs directory removed with the test, attaches
// its drop tracepoints there (TrackQueues) and returns the directory.
func trackQueues(t *testing.T, d *Datapath) string {
	t.Helper()
	dir := filepath.Join(bpffsDir(t), "lanes")
	if err := d.Pin(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Unpin(dir); err != nil {
			t.Error(err)
		}
	})
	if err := d.Order().TrackQueues(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// idleGap is longer than any drain time the tests set plus the coarse
// clock's lag (two ticks at HZ=100 at most).
const idleGap = 30 * time.Millisecond

// afterIdle sends frame once the flow has been idle for idleGap, and
// returns the split stage's counters that frame changed.
func afterIdle(t *testing.T, d *Datapath, frame []byte) Counters {
	t.Helper()
	time.Sleep(idleGap)
	before := stats(t, d)[StageSplit]
	runXDP(t, d, frame)
	return stats(t, d)[StageSplit].Sub(before)
}

// splitFlow is a UDP flow from port whose split-stage bucket sends it to
// index idx, its frame, and the bucket.
func splitFlow(t *testing.T, d *Datapath, port uint16, idx uint32) (flowSpec, []byte, int) {
	t.Helper()
	f := udpFlow(port)
	b := Bucket(f.hash(), loIfindex, StageSplit)
	if err := d.Placement().SetBucket(StageSplit, b, idx); err != nil {
		t.Fatal(err)
	}
	return f, vxlanFrame(frameSpec{flow: f}), b
}

func cpumapID(t *testing.T, m *ebpf.Map) uint64 {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Skip("no map ids on this kernel")
	}
	return uint64(id)
}

// reportDrops runs a drop tracepoint's program as the kernel would call it:
// args are the tracepoint's arguments (raw_tracepoint context), cpu the
// core it runs on.
func reportDrops(t *testing.T, p *ebpf.Program, cpu uint32, args ...uint64) {
	t.Helper()
	opts := ebpf.RunOptions{Context: args, CPU: cpu, Flags: 1 /* BPF_F_TEST_RUN_ON_CPU */}
	if _, err := p.Run(&opts); err != nil {
		t.Fatalf("running %s: %v", p, err)
	}
}

func queueOf(t *testing.T, d *Datapath, core int) Queue {
	t.Helper()
	qs, _, err := d.Order().Queues()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if q.Core == core {
			return q
		}
	}
	return Queue{Core: core}
}

// TestQueueSettles: the starved-kthread case. A flow has frames counted in
// flight on core 1's queue and is told to move; with a drain time of 1 ns
// the old rule moved it at once (and reordered it behind a starved
// kthread). On a tracked queue it waits, and moves once the kernel reports
// its frames dropped (the queue is then empty).
func TestQueueSettles(t *testing.T) {
	d := trackedDatapath(t, time.Nanosecond)
	f, frame, b := splitFlow(t, d, 40000, 1)
	for i := 1; i <= 3; i++ {
		ret, _, meta := runXDPMeta(t, d, frame)
		if ret != xdpRedirect || len(meta) != metaLen {
			t.Fatalf("frame %d: verdict %d, metadata %x; want XDP_REDIRECT, marked", i, ret, meta)
		}
		if qid := binary.NativeEndian.Uint32(meta[4:]) >> metaQIDShift & 0xff; qid != 1+1 {
			t.Fatalf("frame %d: queue %d in the metadata, want core 1's (plus one)", i, qid)
		}
	}
	if q := queueOf(t, d, 1); q.Enqueued != 3 || q.Untracked {
		t.Fatalf("queue after 3 frames: %+v", q)
	}
	if _, tracked, _ := d.Order().Queues(); !tracked {
		t.Fatal("TrackQueues left the queues untracked")
	}

	if err := d.Placement().SetBucket(StageSplit, b, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(idleGap)
	before := stats(t, d)[StageSplit]
	runXDP(t, d, frame) // held: goes to the old queue, the 4th frame there
	got := stats(t, d)[StageSplit].Sub(before)
	if got.Held != 1 || got.Moved != 0 || got.Undrained != 0 {
		t.Fatalf("while frames are queued: %+v; want held, no move", got)
	}
	if n := inFlight(t, d, f, StageSplit); n != 4 {
		t.Fatalf("%d in flight, want 4", n)
	}

	// The kernel reports the ring refused all four (full ring behind a
	// starved kthread): 3 then 1, on the producing core, by map id.
	id := cpumapID(t, d.objs.SteerCpumap)
	reportDrops(t, d.objs.SteerDropsRing, 0, id, 3, 3, 1)
	reportDrops(t, d.objs.SteerDropsRing, 0, id+1000, 1, 1, 1) // another cpumap: not ours
	reportDrops(t, d.objs.SteerDropsKthread, 1, id, 1, 1, 0, 0)
	if q := queueOf(t, d, 1); q.DroppedRing != 3 || q.DroppedKthread != 1 {
		t.Fatalf("queue after the drop reports: %+v", q)
	}
	before = stats(t, d)[StageSplit]
	runXDP(t, d, frame)
	got = stats(t, d)[StageSplit].Sub(before)
	if got.Settled != 1 || got.Moved != 1 || got.Undrained != 0 {
		t.Fatalf("after the drops: %+v; want settled and moved", got)
	}
	if fl := mustFlow(t, d, f, StageSplit); fl.CPUIndex != 0 {
		t.Fatalf("flow on index %d after settling, want 0", fl.CPUIndex)
	}
}

// TestQueueUntrackedFallsBack: without the tracepoints (or with a frame in
// the queue that could not be marked) the queue cannot be told empty, and
// the drain time is the only way out, as before.
func TestQueueUntrackedFallsBack(t *testing.T) {
	d := drainDatapath(t, time.Nanosecond)
	_, frame, b := splitFlow(t, d, 40001, 1)
	runXDP(t, d, frame)
	if err := d.Placement().SetBucket(StageSplit, b, 0); err != nil {
		t.Fatal(err)
	}
	if got := afterIdle(t, d, frame); got.Moved != 1 || got.Undrained != 1 || got.Settled != 0 {
		t.Fatalf("untracked queue: %+v; want a move after the drain time", got)
	}
}

// TestQueueUnmarkedFrameUntracks: a frame the queue takes unmarked
// (counting off here) makes the queue untrackable for good.
func TestQueueUnmarkedFrameUntracks(t *testing.T) {
	d := trackedDatapath(t, time.Hour)
	cfg, err := d.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.CountSplit = false
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	_, frame, _ := splitFlow(t, d, 40002, 1)
	if ret, _, meta := runXDPMeta(t, d, frame); ret != xdpRedirect || meta != nil {
		t.Fatalf("verdict %d, metadata %x; want XDP_REDIRECT, unmarked", ret, meta)
	}
	if q := queueOf(t, d, 1); !q.Untracked || q.Enqueued != 0 {
		t.Fatalf("queue %+v, want untracked", q)
	}
}

// TestQueueForeignMetadataUntracks: a frame that comes with metadata of
// its own (a driver's, an earlier XDP program's) leaving no headroom for
// lanes' 8 bytes (216 bytes here, as a generator reusing stale frame
// heads can leave) still goes to its queue, unmarked: the
// queue is untracked and the frame counted as unmarked, which lanes
// status and the metrics show.
func TestQueueForeignMetadataUntracks(t *testing.T) {
	d := trackedDatapath(t, time.Hour)
	_, frame, _ := splitFlow(t, d, 40003, 1)
	const foreign = 216
	in := append(make([]byte, foreign), frame...)
	var ctxOut xdpMd
	opts := ebpf.RunOptions{
		Data:       in,
		DataOut:    make([]byte, len(in)+256),
		Context:    xdpMd{Data: foreign, DataEnd: uint32(len(in)), IngressIfindex: loIfindex},
		ContextOut: &ctxOut,
	}
	ret, err := d.XDP().Run(&opts)
	if err != nil {
		t.Fatal(err)
	}
	if ret != xdpRedirect || ctxOut.Data-ctxOut.DataMeta != foreign {
		t.Fatalf("verdict %d, %d bytes of metadata; want XDP_REDIRECT with the foreign %d untouched", ret, ctxOut.Data-ctxOut.DataMeta, foreign)
	}
	if q := queueOf(t, d, 1); !q.Untracked || q.Enqueued != 0 {
		t.Errorf("queue %+v, want untracked", q)
	}
	if n := stats(t, d)[StageSplit].Unmarked; n != 1 {
		t.Errorf("%d frames counted unmarked, want 1", n)
	}
}

// TestQueueKeptAcrossCoreSetChange: the flow remembers which core's
// queues hold its frames. After the core set changes (indices now name
// other cores), its wait is still on core 0's queues, which hold its
// frame, not on whatever core its old index names now.
func TestQueueKeptAcrossCoreSetChange(t *testing.T) {
	d := trackedDatapath(t, time.Nanosecond)
	_, frame, b := splitFlow(t, d, 40100, 0) // core 0
	runXDP(t, d, frame)
	if q := queueOf(t, d, 0); q.Enqueued != 1 {
		t.Fatalf("core 0's queues: %+v", q)
	}
	cfg, err := d.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.CPUs = []int{1} // index 0 is core 1 now, whose queues are empty
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := d.Placement().SetBucket(StageSplit, b, Stay); err != nil {
		t.Fatal(err)
	}
	if got := afterIdle(t, d, frame); got.Settled != 0 || got.Moved != 0 || got.Held != 1 {
		t.Fatalf("after the core-set change: %+v; want held on core 0's queues", got)
	}
}

// TestQueueBookLost: a frame counted in and never accounted for holds the
// flow; once lanes agent books it lost, the wait ends.
func TestQueueBookLost(t *testing.T) {
	d := trackedDatapath(t, time.Nanosecond)
	_, frame, b := splitFlow(t, d, 40200, 1)
	runXDP(t, d, frame)
	if err := d.Placement().SetBucket(StageSplit, b, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(idleGap)
	runXDP(t, d, frame) // held: the second frame in core 1's queues
	q := queueOf(t, d, 1)
	if q.Queued() != 2 {
		t.Fatalf("core 1's queues: %+v, want 2 queued", q)
	}
	if err := d.Order().BookLost(1, q.Queued()); err != nil {
		t.Fatal(err)
	}
	if q := queueOf(t, d, 1); q.Queued() != 0 || q.Lost != 2 {
		t.Fatalf("after booking: %+v", q)
	}
	before := stats(t, d)[StageSplit]
	runXDP(t, d, frame)
	if got := stats(t, d)[StageSplit].Sub(before); got.Settled != 1 || got.Moved != 1 {
		t.Fatalf("after booking the frames lost: %+v; want settled and moved", got)
	}
}

// TestReconcilerBooksLost: a frame counted into core 1's queues that never
// comes out nor is reported dropped (BPF_PROG_RUN's redirect goes
// nowhere) is booked lost by the reconciler, whose cpumap kthreads sleep;
// the flow waiting on it then moves.
func TestReconcilerBooksLost(t *testing.T) {
	d, dir := trackedDatapathDir(t, time.Nanosecond)
	_, frame, b := splitFlow(t, d, 40300, 1)
	runXDP(t, d, frame)
	if err := d.Placement().SetBucket(StageSplit, b, 0); err != nil {
		t.Fatal(err)
	}
	var logged []string
	r := NewReconciler(dir, func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) })
	r.quiet = 10 * time.Millisecond
	// A thread of the core (ksoftirqd, a NAPI poll) may happen to run
	// during one pass: then that pass books nothing.
	once := func(core int, want uint64) {
		t.Helper()
		for i := 0; i < 50 && queueOf(t, d, core).Lost < want; i++ {
			if err := r.Once(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	once(1, 1)
	if q := queueOf(t, d, 1); q.Lost != 1 || q.Queued() != 0 {
		t.Fatalf("core 1's queues after reconciling: %+v (log %q)", q, logged)
	}
	if len(logged) != 1 {
		t.Errorf("log %q, want one line", logged)
	}
	if got := afterIdle(t, d, frame); got.Settled != 1 || got.Moved != 1 {
		t.Fatalf("after booking: %+v; want settled and moved", got)
	}
	// The frame that moved went to core 0's queues, and nowhere either.
	once(0, 1)
	if q0, q1 := queueOf(t, d, 0), queueOf(t, d, 1); q0.Lost != 1 || q1.Lost != 1 || len(logged) != 2 {
		t.Errorf("second pass: core 0 %+v, core 1 %+v, log %q", q0, q1, logged)
	}
}

// TestReconcilerUndoesOverbooking: frames booked lost that come out after
// all (more out than in) are taken off the booking.
func TestReconcilerUndoesOverbooking(t *testing.T) {
	d, dir := trackedDatapathDir(t, time.Hour)
	_, frame, _ := splitFlow(t, d, 40400, 1)
	runXDP(t, d, frame)
	if err := d.Order().BookLost(1, 3); err != nil { // 2 too many
		t.Fatal(err)
	}
	if err := NewReconciler(dir, nil).Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	if q := queueOf(t, d, 1); q.Lost != 1 || q.Out() != q.Enqueued {
		t.Fatalf("after reconciling: %+v, want 1 booked lost", q)
	}
}

// TestReconcilerLocks: while one reconciler holds the pin directory,
// another does nothing.
func TestReconcilerLocks(t *testing.T) {
	d, dir := trackedDatapathDir(t, time.Hour)
	_, frame, _ := splitFlow(t, d, 40500, 1)
	runXDP(t, d, frame)
	unlock, ok, err := lockDir(dir)
	if err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	r := NewReconciler(dir, nil)
	r.quiet = time.Millisecond
	if err := r.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	unlock()
	if q := queueOf(t, d, 1); q.Lost != 0 {
		t.Fatalf("booked %d while another reconciler held the lock", q.Lost)
	}
}

// TestQueueSharedWaits: two flows share core 1's queues. A's frames were
// dropped, but B's frame, which went in after them, is still queued: the
// core is not empty, so A keeps waiting (its frames might be behind B's
// as far as the counts can tell). Once the kernel reports B's frame
// dropped too, the drop report itself finds the core empty for the wait
// A registered (want), and A moves at its next frame.
func TestQueueSharedWaits(t *testing.T) {
	d := trackedDatapath(t, time.Nanosecond)
	_, a, ba := splitFlow(t, d, 40700, 1)
	_, b, _ := splitFlow(t, d, 40701, 1)
	runXDP(t, d, a)
	runXDP(t, d, b)
	if err := d.Placement().SetBucket(StageSplit, ba, 0); err != nil {
		t.Fatal(err)
	}
	id := cpumapID(t, d.objs.SteerCpumap)
	time.Sleep(idleGap)
	before := stats(t, d)[StageSplit]
	runXDP(t, d, a)                                       // held: A's second frame joins the queue (3 in)
	reportDrops(t, d.objs.SteerDropsRing, 0, id, 2, 2, 1) // A's two frames
	time.Sleep(idleGap)
	runXDP(t, d, a) // B's frame is still counted in: held again (4 in)
	if got := stats(t, d)[StageSplit].Sub(before); got.Held != 2 || got.Settled != 0 || got.Moved != 0 {
		t.Fatalf("with B's frame queued: %+v; want A held twice", got)
	}
	reportDrops(t, d.objs.SteerDropsRing, 0, id, 2, 2, 1) // B's frame and A's third
	runXDP(t, d, a)
	if got := stats(t, d)[StageSplit].Sub(before); got.Settled != 1 || got.Moved != 1 {
		t.Fatalf("after the core emptied: %+v; want A settled and moved", got)
	}
}

// TestTrackQueuesWithoutSkbDrops: where steer_drops_skb could not load
// (Load put a stub in its place: no kernel BTF, a failed relocation),
// TrackQueues still tracks the cpumap queues, reports the missing
// tracepoint as a degradation, and leaves no link (not even a stale one)
// that would say the later stages' drops are tracked.
func TestTrackQueuesWithoutSkbDrops(t *testing.T) {
	d, dir := trackedDatapathDir(t, time.Hour)
	if !LaterDropsTracked(dir) {
		t.Fatal("a fresh datapath does not track the later stages' drops")
	}
	// A datapath loaded where the program could not be: the stale link
	// of the one before must go too.
	spec, err := loadSteer()
	if err != nil {
		t.Fatal(err)
	}
	stubDropsSkb(spec)
	var objs steerObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatalf("loading with the stub: %v", err)
	}
	d2 := &Datapath{&core{objs: objs, dropsSkbErr: errors.New("test: no kernel BTF")}}
	defer d2.Close()
	err = d2.Order().TrackQueues(dir)
	var nt *NoDropTracesError
	if !errors.As(err, &nt) || nt.Tracepoint != "skb:kfree_skb" {
		t.Fatalf("TrackQueues without steer_drops_skb: %v, want a NoDropTracesError for skb:kfree_skb", err)
	}
	if LaterDropsTracked(dir) {
		t.Error("the stale steer_drops_skb link is still pinned: status would say tracked")
	}
	if _, tracked, err := d2.Order().Queues(); err != nil || !tracked {
		t.Errorf("cpumap queues tracked %v (%v), want tracked", tracked, err)
	}
	_ = d
}
