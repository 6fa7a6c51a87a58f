//go:build linux

package steer

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// Drain accounting: each stage counts the frames it queues per flow, the
// next stage's program counts them seen, and a flow moves only when its old
// queue is empty (or after Config.Drain idle, for frames that were dropped).

// skbCtx is the kernel's struct __sk_buff as BPF_PROG_RUN takes it; only
// gso_segs is set, at its UAPI offset.
type skbCtx [192]byte

const skbGSOSegsOff = 164

// runTCSegs runs a tc program on frame as one skb standing for segs frames
// (a GRO-merged skb).
func runTCSegs(t *testing.T, p *ebpf.Program, frame []byte, segs uint32) uint32 {
	t.Helper()
	var ctx skbCtx
	binary.NativeEndian.PutUint32(ctx[skbGSOSegsOff:], segs)
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx}
	ret, err := p.Run(&opts)
	if err != nil {
		t.Fatalf("running %s: %v", p, err)
	}
	return ret
}

func drainDatapath(t *testing.T, drain time.Duration) *Datapath {
	t.Helper()
	d, _ := newDatapath(t)
	cfg := Config{Enabled: true, CountSplit: true, CPUs: []int{0, 1}, Flowlet: 0, Drain: drain, VXLANPort: testPort, VNIs: []uint32{testVNI}}
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return d
}

func inFlight(t *testing.T, d *Datapath, f flowSpec, stage int) int64 {
	t.Helper()
	return mustFlow(t, d, f, stage).InFlight
}

// TestXDPMarksQueuedFrames: a frame handed to the cpumap carries lanes'
// metadata (for tc ingress on the split core) and counts in flight; a frame
// left where it is carries nothing.
func TestXDPMarksQueuedFrames(t *testing.T) {
	d := drainDatapath(t, time.Hour)
	f := udpFlow(40000)
	frame := vxlanFrame(frameSpec{flow: f})
	b := Bucket(f.hash(), loIfindex, StageSplit)

	ret, out, meta := runXDPMeta(t, d, frame)
	if ret != xdpPass || meta != nil {
		t.Fatalf("stay: verdict %d, metadata %x; want XDP_PASS and none", ret, meta)
	}
	sameBytes(t, "stayed frame", frame, out)
	if n := inFlight(t, d, f, StageSplit); n != 0 {
		t.Errorf("stayed frame counted in flight: %d", n)
	}

	if err := d.Placement().SetBucket(StageSplit, b, 1); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		ret, out, meta = runXDPMeta(t, d, frame)
		if i == 1 {
			// The move from "stay" is free: nothing was queued.
			if ret != xdpRedirect {
				t.Fatalf("verdict %d, want XDP_REDIRECT", ret)
			}
		}
		sameBytes(t, "steered frame", frame, out)
		if len(meta) != 8 || binary.NativeEndian.Uint32(meta) != metaMagic || binary.NativeEndian.Uint32(meta[4:])&metaQueued == 0 {
			t.Fatalf("metadata %x, want magic %#x and the queued flag", meta, metaMagic)
		}
		if n := inFlight(t, d, f, StageSplit); n != int64(i) {
			t.Errorf("after %d steered frames: %d in flight", i, n)
		}
	}

	// Without CountSplit (nothing on the underlay's tc ingress would
	// count them seen) frames are neither marked nor counted.
	cfg, _ := d.Config()
	if !cfg.CountSplit {
		t.Fatalf("config %+v does not read back CountSplit", cfg)
	}
	cfg.CountSplit = false
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if ret, _, meta := runXDPMeta(t, d, frame); ret != xdpRedirect || meta != nil {
		t.Errorf("without CountSplit: verdict %d, metadata %x; want XDP_REDIRECT and none", ret, meta)
	}
	if n := inFlight(t, d, f, StageSplit); n != 3 {
		t.Errorf("without CountSplit: %d in flight, want still 3", n)
	}
}

// TestMoveWaitsForDrain: with no flowlet gap at all, a table change reaches
// a flow only once the next stage has seen every frame the old core queued.
// Bridge -> container -> seen is the chain BPF_PROG_RUN can drive (skb
// metadata, which carries the split stage's mark, cannot be fed to a tc
// test run; the integration test covers it with real frames).
func TestMoveWaitsForDrain(t *testing.T) {
	d := drainDatapath(t, time.Hour)
	f := tcpFlow(40000)
	outer, inner := vxlanFrame(frameSpec{flow: f}), innerFrame(frameSpec{flow: f})
	b := Bucket(f.hash(), loIfindex, StageBridge)
	if err := d.Placement().SetBucket(StageBridge, b, 0); err != nil {
		t.Fatal(err)
	}
	runTCSegs(t, d.TCIngress(), outer, 0)
	runTCSegs(t, d.TCIngress(), outer, 5) // a GRO-merged skb of 5 frames
	if n := inFlight(t, d, f, StageBridge); n != 6 {
		t.Fatalf("%d in flight after 1 + 5 frames, want 6", n)
	}

	if err := d.Placement().SetBucket(StageBridge, b, 1); err != nil {
		t.Fatal(err)
	}
	runTCSegs(t, d.TCIngress(), outer, 0)
	if fl := mustFlow(t, d, f, StageBridge); fl.CPUIndex != 0 || fl.InFlight != 7 {
		t.Fatalf("moved with frames queued: %+v", fl)
	}
	if st := stats(t, d)[StageBridge]; st.Held != 1 || st.Moved != 0 {
		t.Errorf("counters %+v, want 1 held", st)
	}

	// The container stage's program sees the frames leave the bridge
	// stage; it counts them into its own queue, which tc ingress in the
	// container drains.
	runTCSegs(t, d.TCEgress(), inner, 6)
	if n := inFlight(t, d, f, StageBridge); n != 1 {
		t.Fatalf("%d in flight after 6 seen, want 1", n)
	}
	runTCSegs(t, d.TCEgress(), inner, 1)
	if n := inFlight(t, d, f, StageContainer); n != 7 {
		t.Errorf("container stage: %d in flight, want 7", n)
	}
	runTCSegs(t, d.TCSeen(), inner, 7)
	if n := inFlight(t, d, f, StageContainer); n != 0 {
		t.Errorf("container stage: %d in flight after all seen, want 0", n)
	}

	// Drained: the next frame follows the table.
	runTCSegs(t, d.TCIngress(), outer, 0)
	if fl := mustFlow(t, d, f, StageBridge); fl.CPUIndex != 1 || fl.InFlight != 1 {
		t.Errorf("after the drain: %+v, want index 1 with the new frame in flight", fl)
	}
	if st := stats(t, d)[StageBridge]; st.Moved != 1 || st.Undrained != 0 {
		t.Errorf("counters %+v, want 1 moved, none undrained", st)
	}

	// Seeing more than was queued never takes the count below zero.
	runTCSegs(t, d.TCEgress(), inner, 50)
	if n := inFlight(t, d, f, StageBridge); n != 0 {
		t.Errorf("over-seen: %d in flight, want 0", n)
	}
}

// TestDrainTimeout: frames that never arrive (dropped) hold a flow only
// until it has been idle for Config.Drain; the move is counted undrained
// and the count starts afresh.
func TestDrainTimeout(t *testing.T) {
	const drain = 30 * time.Millisecond
	d := drainDatapath(t, drain)
	f := tcpFlow(40000)
	outer := vxlanFrame(frameSpec{flow: f})
	b := Bucket(f.hash(), loIfindex, StageBridge)
	if err := d.Placement().SetBucket(StageBridge, b, 0); err != nil {
		t.Fatal(err)
	}
	runTCSegs(t, d.TCIngress(), outer, 0)
	if err := d.Placement().SetBucket(StageBridge, b, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * drain)
	runTCSegs(t, d.TCIngress(), outer, 0)
	if fl := mustFlow(t, d, f, StageBridge); fl.CPUIndex != 1 || fl.InFlight != 1 {
		t.Errorf("after the drain timeout: %+v, want index 1, only the new frame in flight", fl)
	}
	if st := stats(t, d)[StageBridge]; st.Moved != 1 || st.Undrained != 1 {
		t.Errorf("counters %+v, want 1 moved, 1 undrained", st)
	}
}

// TestSeenPassesUntouched: the container-side program changes no frame
// and creates no flow state, whatever it gets.
func TestSeenPassesUntouched(t *testing.T) {
	d, _ := newDatapath(t)
	frames := innerMalformed()
	frames["unknown flow"] = innerFrame(frameSpec{flow: udpFlow(40000)})
	for name, frame := range frames {
		ret, out := runTC(t, d.TCSeen(), frame)
		if ret != tcUnspec {
			t.Errorf("%s: verdict %d, want TC_ACT_UNSPEC", name, int32(ret))
		}
		sameBytes(t, name, frame, out)
	}
	// Cuts BPF_PROG_RUN accepts (TestTCTruncated says which it refuses).
	full := frames["unknown flow"]
	for cut := ethHeaderLen + 20; cut < len(full); cut++ {
		frame := full[:cut:cut]
		if ret, out := runTC(t, d.TCSeen(), frame); ret != tcUnspec {
			t.Errorf("truncated at %d: verdict %d", cut, int32(ret))
		} else {
			sameBytes(t, "truncated", frame, out)
		}
	}
	if flows, _ := d.Flows(); len(flows) != 0 {
		t.Errorf("seen created flows: %+v", flows)
	}
}
