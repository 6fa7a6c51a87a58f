//go:build linux

package steer

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
)

// The skb side of MFLOW: BPF_PROG_RUN in live-frame mode turns XDP's
// output into real skbs on the loopback device of the calling thread's
// namespace: redirected frames through the cpumap, built by the target
// core's kthread (as on a NIC), passed frames at once on the calling core.
// A tc program on that loopback device then reads what steer_xdp left in
// the metadata, as tc ingress on the underlay does.

var skbSideSeq atomic.Int32

// scratchNetNS creates a network namespace of the test's own, deleted
// when the test ends, and returns its name.
func scratchNetNS(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("lanes-steer-%d-%d", os.Getpid(), skbSideSeq.Add(1))
	if err := nsx.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nsx.Delete(name); err != nil {
			t.Error(err)
		}
	})
	return name
}

// skbSide creates a throwaway namespace with progs on its loopback device's
// tc ingress, in that order, and returns a function that runs fn inside
// it. Everything goes when the test ends.
func skbSide(t *testing.T, progs ...*ebpf.Program) func(fn func() error) {
	t.Helper()
	name := scratchNetNS(t)
	err := nsx.Do(name, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		for _, p := range progs {
			l, err := link.AttachTCX(link.TCXOptions{Interface: lo.Attrs().Index, Program: p, Attach: ebpf.AttachTCXIngress, Anchor: link.Tail()})
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			t.Cleanup(func() { l.Close() })
		}
		return nil
	})
	if err != nil {
		t.Fatalf("attaching to lo in %s: %v", name, err)
	}
	return func(fn func() error) {
		t.Helper()
		if err := nsx.Do(name, fn); err != nil {
			t.Fatal(err)
		}
	}
}

// liveXDP runs an XDP program once on frame in live-frame mode: what it
// redirects or passes goes on as a real frame. Repeat 1: the kernel checks
// for signals only between repetitions, so the frame is sent exactly once.
func liveXDP(p *ebpf.Program, frame []byte) error {
	_, err := p.Run(&ebpf.RunOptions{Data: frame, Repeat: 1, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES})
	return err
}

// waitFor polls cond for up to 5 s (the cpumap kthreads build the skbs
// asynchronously, behind whatever else runs on their cores).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5s for %s", what)
		}
	}
}

// TestMflowSeqReachesSkb: micro-flows split at the NIC poll arrive as skbs
// on their split cores with their sequence numbers: tc ingress counts them
// on exactly the core each micro-flow was sent to and records the highest
// sequence number it read.
func TestMflowSeqReachesSkb(t *testing.T) {
	const batch, rounds = 4, 3
	cores := testCores(t)
	d := mflowDatapath(t, cores, everyFlow(SplitAtIRQ, batch, cores...))
	in := skbSide(t, d.TCSplitSeen())
	f := udpFlow(40000)
	frame := vxlanFrame(frameSpec{flow: f})
	sent := batch * len(cores) * rounds
	in(func() error {
		for range sent {
			if err := liveXDP(d.XDP(), frame); err != nil {
				return err
			}
		}
		return nil
	})
	if st := stats(t, d)[StageSplit]; st.MicroFrames != uint64(sent) {
		t.Fatalf("split counters %+v, want %d micro-flow frames", st, sent)
	}
	waitFor(t, "the split cores to take every frame", func() bool {
		return stats(t, d)[StageSplit].MicroArrived == uint64(sent)
	})
	per, err := d.CoreStats()
	if err != nil {
		t.Fatal(err)
	}
	for cpu := range per {
		want := uint64(0)
		for _, c := range cores {
			if c == cpu {
				want = batch * rounds
			}
		}
		if got := per[cpu][StageSplit].MicroArrived; got != want {
			t.Errorf("core %d: %d micro-flow frames arrived, want %d", cpu, got, want)
		}
	}
	mf := microState(t, d, f, StageSplit)
	if !mf.SeenAny || mf.Seen != mf.Started-1 {
		t.Errorf("state %+v: want the last micro-flow's sequence %d seen on the skb side", mf, mf.Started-1)
	}
	t.Logf("late frames (micro-flows overtaken on the way, not deterministic): %d", stats(t, d)[StageSplit].MicroLate)
}

// metaProg is an XDP program that puts a micro-flow's metadata with
// sequence seq, marked as d's (its generation), in front of the frame and
// passes it: in live-frame mode the
// skb reaches the loopback device's tc ingress on the calling core before
// the run returns, so the order of arrival is the test's.
func metaProg(t *testing.T, d *Datapath, seq uint32) *ebpf.Program {
	t.Helper()
	return markProg(t, d, metaMFlow, &seq)
}

// markProg is metaProg for any flags (d's generation added): with seq,
// the micro-flow metadata (struct lanes_meta_mflow), else struct lanes_meta.
func markProg(t *testing.T, d *Datapath, flags uint32, seq *uint32) *ebpf.Program {
	t.Helper()
	gen, err := d.metaGen()
	if err != nil {
		t.Fatal(err)
	}
	n := int32(metaLen)
	if seq != nil {
		n = metaMFLen
	}
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.Mov.Imm(asm.R2, -n),
		asm.FnXdpAdjustMeta.Call(),
		asm.JNE.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R6, 8, asm.Word), // data_meta
		asm.Mov.Reg(asm.R4, asm.R3),
		asm.Add.Imm(asm.R4, n),
		asm.JGT.Reg(asm.R4, asm.R2, "pass"),
		asm.StoreImm(asm.R3, 0, metaMagic, asm.Word),
		asm.StoreImm(asm.R3, 4, int64(int32(flags|gen<<metaGenShift)), asm.Word),
	}
	if seq != nil {
		insns = append(insns, asm.StoreImm(asm.R3, 8, int64(int32(*seq)), asm.Word))
	}
	insns = append(insns, asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"), asm.Return())
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "lanes_meta", Type: ebpf.XDP, Instructions: insns, License: "MIT"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestMflowLateMicroflows: the skb side counts every micro-flow frame it
// reads, and as late those of a micro-flow older than one it already saw
// for the flow, in serial-number order across the 32-bit wrap. Both
// programs on the underlay's tc ingress read it; steer_tc_ingress keeps a
// micro-flow on its core without placing or counting it at the bridge.
func TestMflowLateMicroflows(t *testing.T) {
	for _, prog := range []struct {
		name string
		get  func(*Datapath) *ebpf.Program
	}{
		{"split_seen", (*Datapath).TCSplitSeen},
		{"tc_ingress", (*Datapath).TCIngress},
	} {
		t.Run(prog.name, func(t *testing.T) {
			d, _ := newDatapath(t)
			in := skbSide(t, prog.get(d))
			for _, c := range []struct {
				f    flowSpec
				seqs []uint32
				late uint64
				seen uint32 // the highest in serial-number order
			}{
				{udpFlow(40000), []uint32{0, 0, 1, 0, 2, 1, 1, 3}, 3, 3},
				{udpFlow(40001), []uint32{0xfffffffe, 0xffffffff, 0, 0xffffffff, 1, 0}, 2, 1},
			} {
				frame := vxlanFrame(frameSpec{flow: c.f})
				runXDP(t, d, frame) // the flow's split-stage entry, where the tc side keeps what it saw
				before := stats(t, d)
				in(func() error {
					for _, seq := range c.seqs {
						if err := liveXDP(metaProg(t, d, seq), frame); err != nil {
							return err
						}
					}
					return nil
				})
				after := stats(t, d)
				arrived := after[StageSplit].MicroArrived - before[StageSplit].MicroArrived
				late := after[StageSplit].MicroLate - before[StageSplit].MicroLate
				if arrived != uint64(len(c.seqs)) || late != c.late {
					t.Errorf("sequences %x: %d arrived, %d late; want %d, %d", c.seqs, arrived, late, len(c.seqs), c.late)
				}
				if mf := microState(t, d, c.f, StageSplit); !mf.SeenAny || mf.Seen != c.seen {
					t.Errorf("sequences %x: state %+v, want %d seen", c.seqs, mf, c.seen)
				}
				if _, ok := flowState(t, d, c.f, StageBridge); ok {
					t.Errorf("sequences %x: micro-flow frames placed at the bridge stage", c.seqs)
				}
			}
		})
	}
}

// TestOtherDatapathsMarks: a frame marked by another datapath (one loaded
// before, its frames still queued during a re-apply) counts neither in
// this one's per-flow state nor out of its queues: the metadata's
// generation bits differ.
func TestOtherDatapathsMarks(t *testing.T) {
	d, _ := newDatapath(t)
	other, _ := newDatapath(t)
	g1, _ := d.metaGen()
	g2, _ := other.metaGen()
	if g1 == g2 {
		t.Skipf("both datapaths got generation %d (their cpumap ids share their low 16 bits)", g1)
	}
	in := skbSide(t, d.TCSplitSeen())
	f := udpFlow(40600)
	frame := vxlanFrame(frameSpec{flow: f})
	runXDP(t, d, frame)
	before := stats(t, d)
	in(func() error { return liveXDP(metaProg(t, other, 0), frame) })
	if got := stats(t, d)[StageSplit].MicroArrived - before[StageSplit].MicroArrived; got != 0 {
		t.Errorf("%d frames of another datapath counted as arrived", got)
	}
	in(func() error { return liveXDP(metaProg(t, d, 0), frame) })
	if got := stats(t, d)[StageSplit].MicroArrived - before[StageSplit].MicroArrived; got != 1 {
		t.Errorf("%d of this datapath's frames counted, want 1", got)
	}
}
