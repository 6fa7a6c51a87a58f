//go:build linux

package steer

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Order across an eviction (bpf/order.h's remake): a flow state the LRU
// evicted while frames of its flow were still queued is made anew where
// those frames went, in another count epoch, so the flow's next frames
// queue behind them and its count is its own.

// evict deletes f's state at stage, as the LRU evicts it.
func evict(t *testing.T, d *Datapath, f flowSpec, stage int) {
	t.Helper()
	if err := d.objs.SteerFlows.Delete(flowKeyOf(refTuple(f), stage)); err != nil {
		t.Fatalf("premise: evicting %+v at the %s stage: %v", f, StageName(stage), err)
	}
}

// epochOf is the count epoch of f's state at stage.
func epochOf(t *testing.T, d *Datapath, f flowSpec, stage int) uint32 {
	t.Helper()
	var st steerSteerFlowState
	if err := d.objs.SteerFlows.Lookup(flowKeyOf(refTuple(f), stage), &st); err != nil {
		t.Fatalf("no %s state for %+v: %v", StageName(stage), f, err)
	}
	return st.Epoch
}

// queueID is the core (plus one) whose queue accounting counted a frame
// with this metadata in, or 0: unmarked.
func queueID(meta []byte) uint32 {
	if len(meta) < metaLen || binary.NativeEndian.Uint32(meta) != metaMagic {
		return 0
	}
	return binary.NativeEndian.Uint32(meta[4:]) >> metaQIDShift & 0xff
}

// A flow whose frames are queued on core 1, told by the table to move to
// core 0, has its state evicted by a burst of new flows. Its next frame
// goes to core 1's queue, behind the ones queued there, not to core 0's,
// where it could overtake them; the state made anew then moves once core
// 1's queue is seen empty, as any.
func TestRemadeStateKeepsItsQueue(t *testing.T) {
	defer pinThread(t, 0)() // the burst evicts what this core made (floodFlows)
	d := trackedDatapath(t, time.Hour)
	f, frame, b := splitFlow(t, d, 40000, 1)
	for i := range 3 {
		if ret, _, meta := runXDPMeta(t, d, frame); ret != xdpRedirect || queueID(meta) != 2 {
			t.Fatalf("premise: frame %d: verdict %d, metadata %x; want core 1's queue", i, ret, meta)
		}
	}
	if err := d.Placement().SetBucket(StageSplit, b, 0); err != nil {
		t.Fatal(err)
	}
	if ret, _, meta := runXDPMeta(t, d, frame); ret != xdpRedirect || queueID(meta) != 2 {
		t.Fatalf("premise: frame after the table change: verdict %d, metadata %x; want held on core 1's queue", ret, meta)
	}
	if q := queueOf(t, d, 1); q.Enqueued != 4 || q.Seen != 0 {
		t.Fatalf("premise: core 1's queue %+v, want 4 frames in, none out", q)
	}
	n := floodFlows(t, d)
	if _, ok := flowState(t, d, f, StageSplit); ok {
		t.Fatalf("premise: the flow's state survived %d newer flows", n)
	}

	before := stats(t, d)[StageSplit]
	ret, _, meta := runXDPMeta(t, d, frame)
	if ret != xdpRedirect || queueID(meta) != 2 {
		t.Fatalf("made anew: verdict %d, metadata %x; want core 1's queue, behind its 4 frames there", ret, meta)
	}
	if fl := mustFlow(t, d, f, StageSplit); fl.CPUIndex != 1 || fl.InFlight != 1 {
		t.Errorf("made anew: %+v, want on core index 1 with its one frame in flight", fl)
	}
	if got := stats(t, d)[StageSplit].Sub(before); got.Remade != 1 {
		t.Errorf("counters %+v, want one state remade", got)
	}

	// The kernel reports all 5 dropped at the ring: the queue is empty,
	// and the flow follows the table.
	reportDrops(t, d.objs.SteerDropsRing, 0, cpumapID(t, d.objs.SteerCpumap), 5, 5, 1)
	if ret, _, meta := runXDPMeta(t, d, frame); ret != xdpRedirect || queueID(meta) != 1 {
		t.Errorf("after core 1's queue emptied: verdict %d, metadata %x; want core 0's queue", ret, meta)
	}
}

// A high-priority flow with a frame in its queue that a destination would
// take onto PRISM-sync's shortcut is evicted: made anew, its next frame
// keeps the queue rather than take the shortcut past that frame.
func TestRemadeStateOffShortcut(t *testing.T) {
	d, f, frame := queuedBeforeSync(t)
	evict(t, d, f, StageSplit)
	ret, out, meta := runXDPMeta(t, d, frame)
	sameBytes(t, "made anew", frame, out)
	if fl := mustFlow(t, d, f, StageSplit); fl.Sync || !fl.High || ret != xdpRedirect || queueID(meta) != 1 {
		t.Errorf("made anew: %+v, verdict %d, metadata %x; want the high-priority queue of core 0, behind its frame", fl, ret, meta)
	}
}

// slotMates are n flows whose states share f's slot of steer_epochs at
// every stage (its flow hash modulo the slots).
func slotMates(f flowSpec, n int) []flowSpec {
	var out []flowSpec
	for i := uint32(1); len(out) < n; i++ {
		g := f
		g.sport, g.dport = uint16(i), uint16(i>>16)+1
		if g.hash()%epochSlots == f.hash()%epochSlots {
			out = append(out, g)
		}
	}
	return out
}

// setHashProg is a tc program that gives every skb hash h and lets the
// next program run: a frame as an earlier stage's rps_to marked it.
func setHashProg(t *testing.T, h uint32) *ebpf.Program {
	t.Helper()
	return newProg(t, ebpf.SchedCLS, asm.Mov.Imm32(asm.R2, int32(h)), asm.FnSetHash.Call(),
		asm.Mov.Imm(asm.R0, -1)) // TCX_NEXT
}

// passProg is an XDP program that passes every frame.
func passProg(t *testing.T) *ebpf.Program {
	t.Helper()
	return newProg(t, ebpf.XDP, asm.Mov.Imm(asm.R0, xdpPass))
}

// newProg loads a program of type typ made of insns and a return, closed
// with the test.
func newProg(t *testing.T, typ ebpf.ProgramType, insns ...asm.Instruction) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "lanes_test", Type: typ, Instructions: append(insns, asm.Return()), License: "MIT"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// The epoch-reuse case: a flow's bridge-stage state with frames in flight
// in epoch e is evicted after its slot handed out seven more epochs, so
// that the slot's next is e again. The state made anew counts in another
// epoch, and a frame of the old count, seen at the container stage,
// leaves its count alone: the count is that of the frames it queued
// itself, and no move can overtake them.
func TestRemadeStateEpochReuse(t *testing.T) {
	d := drainDatapath(t, time.Hour)
	f := udpFlow(40100)
	fh := f.hash()
	if err := d.Placement().SetBucket(StageBridge, Bucket(fh, loIfindex, StageBridge), 1); err != nil {
		t.Fatal(err)
	}
	frame := vxlanFrame(frameSpec{flow: f})
	runTC(t, d.TCIngress(), frame)
	runTC(t, d.TCIngress(), frame)
	old := epochOf(t, d, f, StageBridge)
	for _, g := range slotMates(f, HashEpochs-1) {
		runTC(t, d.TCIngress(), vxlanFrame(frameSpec{flow: g}))
	}
	var slot steerFlowSlot
	if err := d.objs.SteerEpochs.Lookup(uint32(StageBridge)*epochSlots+fh%epochSlots, &slot); err != nil || uint32(slot.N)%HashEpochs != old {
		t.Fatalf("premise: slot %+v (%v) does not hand out the flow's epoch %d next", slot, err, old)
	}
	evict(t, d, f, StageBridge)
	runTC(t, d.TCIngress(), frame)
	fresh := epochOf(t, d, f, StageBridge)
	if fresh == old {
		t.Fatalf("made anew in its evicted state's epoch %d, whose frames may be in flight", old)
	}
	if n := inFlight(t, d, f, StageBridge); n != 1 {
		t.Fatalf("premise: %d in flight after the first frame made anew, want 1", n)
	}

	// At the container stage's program on a device, the hash tells the
	// count: the old epoch's frame is not this state's.
	send := func(epoch uint32) {
		t.Helper()
		in := skbSide(t, setHashProg(t, RPSHash(1, 2, fh, StageBridge, epoch, true)), d.TCEgress())
		in(func() error { return liveXDP(passProg(t), innerFrame(frameSpec{flow: f})) })
	}
	countsItsOwn(t, d, f, StageBridge, old, fresh, send)
}

// countsItsOwn checks that a frame of the old epoch, seen (send), leaves
// f's count of 1 at stage alone, and one of the fresh epoch takes it out.
func countsItsOwn(t *testing.T, d *Datapath, f flowSpec, stage int, old, fresh uint32, send func(epoch uint32)) {
	t.Helper()
	send(old)
	if n := inFlight(t, d, f, stage); n != 1 {
		t.Errorf("a frame of the evicted state's count took the new count to %d, want 1", n)
	}
	send(fresh)
	if n := inFlight(t, d, f, stage); n != 0 {
		t.Errorf("the new count's own frame left %d in flight, want 0", n)
	}
}

// The split stage's frames carry their count's epoch in their metadata: a
// frame of the evicted state's count, seen on the skb side after the state
// was made anew, does not lower the new count; one of the new count does.
func TestRemadeSplitCountsItsOwn(t *testing.T) {
	d := drainDatapath(t, time.Hour)
	f, frame, _ := splitFlow(t, d, 40200, 1)
	runXDP(t, d, frame)
	runXDP(t, d, frame)
	old := epochOf(t, d, f, StageSplit)
	evict(t, d, f, StageSplit)
	if ret, _, meta := runXDPMeta(t, d, frame); ret != xdpRedirect || queueID(meta) != 2 {
		t.Fatalf("premise: made anew: verdict %d, metadata %x; want core 1's queue", ret, meta)
	}
	fresh := epochOf(t, d, f, StageSplit)
	if fresh == old {
		t.Fatalf("made anew in its evicted state's epoch %d", old)
	}
	in := skbSide(t, d.TCSplitSeen())
	seen := func(epoch uint32) {
		t.Helper()
		in(func() error {
			return liveXDP(markProg(t, d, metaQueued|2<<metaQIDShift|epoch<<metaEpochShift, nil), frame)
		})
	}
	countsItsOwn(t, d, f, StageSplit, old, fresh, seen)
}

// A staying container stage holds the core its counted frames queued on
// (stay_core). Evicted and made anew on another core, its state goes on
// holding that core: its next frame is steered there, behind the ones
// queued, and the stage follows to the new core once its own are out.
func TestRemadeContainerHoldsItsCore(t *testing.T) {
	d, f, inner := stayingOnCore0(t, 40300)
	evict(t, d, f, StageContainer)
	defer pinThread(t, 1)()
	runTC(t, d.TCEgress(), inner)
	if fl := mustFlow(t, d, f, StageContainer); fl.CPUIndex != 0 || fl.InFlight != 1 {
		t.Fatalf("made anew on core 1: %+v, want steered to core 0 (index 0), behind its frames there, 1 in flight", fl)
	}
	runTCSegs(t, d.TCSeen(), inner, 1)
	runTC(t, d.TCEgress(), inner)
	if fl := mustFlow(t, d, f, StageContainer); fl.CPUIndex != Stay || fl.StayCore != 1 {
		t.Errorf("once its own frame was seen: %+v, want staying on core 1", fl)
	}
}
