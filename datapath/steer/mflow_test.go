//go:build linux

package steer

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"
)

// MFLOW in the datapath: elephants cut into micro-flows of Batch frames,
// round robin over the split cores, each frame marked with its micro-flow's
// sequence number; mice and foreign frames keep their path.

// microModel mirrors bpf/mflow.h's batching of one elephant: the micro-flow n
// more frames belong to (a GRO skb counts its segments and stays whole in
// the micro-flow it starts in), and whether they start it.
type microModel struct{ batch, left, started uint32 }

func (m *microModel) add(n uint32) (seq uint32, starts bool) {
	if m.left == 0 {
		m.started++
		m.left = m.batch
		starts = true
	}
	m.left -= min(m.left, n)
	return m.started - 1, starts
}

func setConfig(t *testing.T, d *Datapath, c Config) {
	t.Helper()
	if err := d.SetConfig(c); err != nil {
		t.Fatal(err)
	}
}

// mflowConfig is the tests' config over cpus with m's splitting.
func mflowConfig(cpus []int, m MFlow) Config {
	return Config{Enabled: true, CPUs: cpus, Flowlet: time.Hour, VXLANPort: testPort, VNIs: []uint32{testVNI}, MFlow: m}
}

// mflowDatapath is newDatapath (cpumap entries on testCores, tables at
// Stay) configured by mflowConfig.
func mflowDatapath(t *testing.T, cpus []int, m MFlow) *Datapath {
	t.Helper()
	d, _ := newDatapath(t)
	setConfig(t, d, mflowConfig(cpus, m))
	return d
}

// everyFlow splits every flow from its first frame.
func everyFlow(at SplitAt, batch uint32, cores ...int) MFlow {
	return MFlow{At: at, Batch: batch, Cores: cores, Window: time.Hour}
}

// microSeq checks that meta is a micro-flow's metadata and returns its
// sequence number.
func microSeq(t *testing.T, meta []byte) uint32 {
	t.Helper()
	if len(meta) != metaMFLen || binary.NativeEndian.Uint32(meta) != metaMagic || binary.NativeEndian.Uint32(meta[4:])&metaFlagMask != metaMFlow {
		t.Fatalf("metadata %x, want %d bytes: magic %#x, flags %#x, sequence", meta, metaMFLen, metaMagic, metaMFlow)
	}
	return binary.NativeEndian.Uint32(meta[8:])
}

func microState(t *testing.T, d *Datapath, f flowSpec, stage int) MicroFlowState {
	t.Helper()
	return mustFlow(t, d, f, stage).MicroFlow
}

// TestMflowSplitsInBatches: two elephants, interleaved frame by frame:
// frames [k*batch, (k+1)*batch) of each form its micro-flow k, on split
// core k % n in the configured order, marked with k; each flow counts its
// own batches. Core 2 has no cpumap entry here (the tests make entries for
// the first two cores): its micro-flows fall back to vanilla, unmarked.
func TestMflowSplitsInBatches(t *testing.T) {
	cpus := []int{0, 1, 2}
	for _, c := range []struct {
		batch uint32
		cores []int
	}{
		{4, []int{0}},
		{4, []int{0, 1}},
		{3, []int{0, 1, 2}},
		{1, []int{1, 0}},
	} {
		t.Run(fmt.Sprintf("batch %d over cores %v", c.batch, c.cores), func(t *testing.T) {
			// A cut starts on the core the program runs on where that
			// is a split core (cut_rotation): 0 here.
			defer pinThread(t, 0)()
			rot := max(slices.Index(c.cores, 0), 0)
			d := mflowDatapath(t, cpus, everyFlow(SplitAtIRQ, c.batch, c.cores...))
			entries, err := d.CPUMap().Entries()
			if err != nil {
				t.Fatal(err)
			}
			flows := []flowSpec{udpFlow(40000), tcpFlow(40001)}
			models := []microModel{{batch: c.batch}, {batch: c.batch}}
			var want Counters
			var perCore [MaxCPUs]uint64
			n := int(c.batch) * len(c.cores) * 3
			for i := range 2 * n {
				k := i % 2
				seq, starts := models[k].add(1)
				core := c.cores[(int(seq)+rot)%len(c.cores)]
				if starts {
					want.MicroFlows++
					perCore[core]++
				}
				frame := vxlanFrame(frameSpec{flow: flows[k]})
				ret, out, meta := runXDPMeta(t, d, frame)
				sameBytes(t, "split frame", frame, out)
				switch {
				case !slices.Contains(entries, core):
					want.Stayed++
					if ret != xdpPass || meta != nil {
						t.Fatalf("frame %d of flow %d (micro-flow %d, core %d without a cpumap entry): verdict %d, metadata %x; want XDP_PASS, none", i/2, k, seq, core, ret, meta)
					}
				case ret != xdpRedirect:
					t.Fatalf("frame %d of flow %d (micro-flow %d, core %d): verdict %d, want XDP_REDIRECT", i/2, k, seq, core, ret)
				default:
					want.MicroFrames++
					if got := microSeq(t, meta); got != seq {
						t.Fatalf("frame %d of flow %d: sequence %d in the metadata, want %d", i/2, k, got, seq)
					}
				}
				mf := microState(t, d, flows[k], StageSplit)
				if !mf.Elephant || mf.Started != seq+1 || mf.CPUIndex != uint32(slices.Index(cpus, core)) {
					t.Fatalf("frame %d of flow %d: state %+v, want elephant, %d started, core index %d", i/2, k, mf, seq+1, slices.Index(cpus, core))
				}
			}
			want.Elephants = 2
			if st := stats(t, d)[StageSplit]; st != want {
				t.Errorf("counters %+v, want %+v", st, want)
			}
			if got, err := d.Micro().PerCore(); err != nil || got != perCore {
				t.Errorf("micro-flows per core %v (%v), want %v", got[:3], err, perCore[:3])
			}
		})
	}
}

// TestMflowMice: below the threshold a flow keeps the table's placement:
// vanilla under MFLOW alone, Falcon's split core (marked and counted in
// flight) when composed. The frame that brings its window to the threshold
// is the first one split; it is marked as a micro-flow's and not counted
// in flight, and a second flow below the threshold stays a mouse.
func TestMflowMice(t *testing.T) {
	const thresh = 5
	cores := testCores(t)
	m := MFlow{At: SplitAtIRQ, Batch: 4, Cores: cores, Threshold: thresh, Window: time.Hour}
	for _, composed := range []bool{false, true} {
		t.Run(fmt.Sprintf("with falcon's split %v", composed), func(t *testing.T) {
			d := mflowDatapath(t, cores, m)
			wantMouse := uint32(xdpPass)
			if composed {
				c := mflowConfig(cores, m)
				c.CountSplit = true
				setConfig(t, d, c)
				setAll(t, d, StageSplit, uint32(len(cores)-1))
				wantMouse = xdpRedirect
			}
			mouse := func(f flowSpec) {
				t.Helper()
				frame := vxlanFrame(frameSpec{flow: f})
				ret, out, meta := runXDPMeta(t, d, frame)
				sameBytes(t, "mouse", frame, out)
				queued := len(meta) == metaLen && binary.NativeEndian.Uint32(meta[4:])&metaFlagMask == metaQueued
				if ret != wantMouse || queued != composed || (!composed && meta != nil) {
					t.Fatalf("mouse %+v: verdict %d, metadata %x; want verdict %d, marked queued %v", f, ret, meta, wantMouse, composed)
				}
				if mf := microState(t, d, f, StageSplit); mf.Elephant || mf.Started != 0 {
					t.Fatalf("mouse %+v: state %+v", f, mf)
				}
			}
			f, other := udpFlow(40000), udpFlow(40001)
			for i := range thresh - 1 {
				mouse(f)
				if i > 0 {
					mouse(other) // thresh-2 frames now, one more below
				}
			}
			before := mustFlow(t, d, f, StageSplit)
			ret, _, meta := runXDPMeta(t, d, vxlanFrame(frameSpec{flow: f}))
			if ret != xdpRedirect || microSeq(t, meta) != 0 {
				t.Fatalf("frame %d: verdict %d, metadata %x; want the first micro-flow's", thresh, ret, meta)
			}
			after := mustFlow(t, d, f, StageSplit)
			if !after.MicroFlow.Elephant || after.MicroFlow.Started != 1 || after.InFlight != before.InFlight {
				t.Errorf("elephant %+v (in flight before: %d): want split, not counted in flight", after, before.InFlight)
			}
			mouse(other)
			st := stats(t, d)[StageSplit]
			if st.Elephants != 1 || st.MicroFrames != 1 || st.MicroFlows != 1 || st.ElephantsEnd != 0 {
				t.Errorf("counters %+v, want 1 elephant, 1 micro-flow of 1 frame", st)
			}
		})
	}
}

// TestMflowElephantEnds: an elephant whose rate falls below the threshold
// (here: a window without frames) is a mouse again, and a new micro-flow
// starts when it turns into an elephant once more.
func TestMflowElephantEnds(t *testing.T) {
	const window = 200 * time.Millisecond
	cores := testCores(t)
	d := mflowDatapath(t, cores, MFlow{At: SplitAtIRQ, Batch: 64, Cores: cores, Threshold: 3, Window: window})
	f := tcpFlow(40000)
	frame := vxlanFrame(frameSpec{flow: f})
	send := func(want uint32) {
		t.Helper()
		if ret, _ := runXDP(t, d, frame); ret != want {
			t.Fatalf("verdict %d, want %d (state %+v)", ret, want, microState(t, d, f, StageSplit))
		}
	}
	send(xdpPass)
	send(xdpPass)
	send(xdpRedirect)
	time.Sleep(5 * window / 2)
	send(xdpPass) // this window so far: 1 frame
	if st := stats(t, d)[StageSplit]; st.Elephants != 1 || st.ElephantsEnd != 1 {
		t.Errorf("after the gap: counters %+v, want 1 elephant, ended", st)
	}
	send(xdpPass)
	send(xdpRedirect)
	mf := microState(t, d, f, StageSplit)
	if !mf.Elephant || mf.Started != 2 || mf.Frames != 2 {
		t.Errorf("state %+v, want an elephant again in its second micro-flow, 2 frames split", mf)
	}
}

// TestMflowElephantQuiet: with a reassembler (MFlow.Quiet), an elephant
// whose rate drops stays split, so no untagged frame of it can pass what
// the reassembler still holds; it falls back only at a frame that comes
// after a pause of Quiet, and becomes one again by the rate test.
func TestMflowElephantQuiet(t *testing.T) {
	const window, quiet = 50 * time.Millisecond, time.Second
	cores := testCores(t)
	d := mflowDatapath(t, cores, MFlow{At: SplitAtIRQ, Batch: 64, Cores: cores, Threshold: 3, Window: window, Quiet: quiet})
	if got, _ := d.Config(); got.MFlow.Quiet != quiet {
		t.Fatalf("config %+v does not read back the quiet time", got.MFlow)
	}
	f := tcpFlow(40000)
	frame := vxlanFrame(frameSpec{flow: f})
	send := func(what string, want uint32) {
		t.Helper()
		if ret, _ := runXDP(t, d, frame); ret != want {
			t.Fatalf("%s: verdict %d, want %d (state %+v)", what, ret, want, microState(t, d, f, StageSplit))
		}
	}
	send("mouse", xdpPass)
	send("mouse", xdpPass)
	send("elephant", xdpRedirect)
	// Windows closed short, shorter than the quiet time: still split.
	time.Sleep(3 * window)
	send("after a short window", xdpRedirect)
	if st := stats(t, d)[StageSplit]; st.ElephantsEnd != 0 {
		t.Errorf("after a pause under the quiet time: counters %+v, want the elephant split still", st)
	}
	time.Sleep(quiet + window)
	send("after the quiet time", xdpPass)
	if st := stats(t, d)[StageSplit]; st.Elephants != 1 || st.ElephantsEnd != 1 {
		t.Errorf("after the quiet time: counters %+v, want 1 elephant, ended", st)
	}
	send("mouse again", xdpPass)
	send("elephant again", xdpRedirect)
	if mf := microState(t, d, f, StageSplit); !mf.Elephant || mf.Started != 2 {
		t.Errorf("state %+v, want an elephant again in its second micro-flow", mf)
	}
}

// TestMflowCutStarts: a cut starts where nothing of the flow can be left
// behind for its first micro-flow to pass: after a frame that ended a GRO
// segment (a TCP segment with payload and no PSH does not), and on the
// core the program runs on (here 1, the second split core), so micro-flow
// k goes to split core (k + 1) % 2.
func TestMflowCutStarts(t *testing.T) {
	cores := testCores(t)
	if len(cores) < 2 {
		t.Skip("needs two cores")
	}
	defer pinThread(t, 1)()
	d := mflowDatapath(t, cores, MFlow{At: SplitAtIRQ, Batch: 2, Cores: cores, Threshold: 3, Window: time.Hour})
	f := tcpFlow(40000)
	step := func(name string, psh bool, want uint32, core int) {
		t.Helper()
		ret, _, meta := runXDPMeta(t, d, tcpSegment(f, psh))
		mf := microState(t, d, f, StageSplit)
		if ret != want || (meta != nil) != (want == xdpRedirect) || (want == xdpRedirect && int(mf.CPUIndex) != slices.Index(cores, core)) {
			t.Errorf("%s: verdict %d, marked %v, state %+v; want %d on core %d", name, ret, meta != nil, mf, want, core)
		}
	}
	step("mouse", false, xdpPass, 0)
	step("mouse", false, xdpPass, 0)
	step("at the threshold, the last frame mid-segment: not yet", false, xdpPass, 0)
	step("segment end (PSH), the last frame mid-segment: not yet", true, xdpPass, 0)
	step("after a segment end: micro-flow 0 on this core", false, xdpRedirect, 1)
	step("micro-flow 0", false, xdpRedirect, 1)
	step("micro-flow 1 on the other core", false, xdpRedirect, 0)
	step("micro-flow 1", true, xdpRedirect, 0)
	step("micro-flow 2 on this core", false, xdpRedirect, 1)
	if st := stats(t, d)[StageSplit]; st.Elephants != 1 || st.MicroFlows != 3 {
		t.Errorf("counters %+v, want 1 elephant, 3 micro-flows", st)
	}
}

// TestMflowNeverSplitsHighPriority: PRISM's high-priority flows keep their
// queue when MFLOW composes; bulk flows are split.
func TestMflowNeverSplitsHighPriority(t *testing.T) {
	d := prioDatapath(t, true, 0)
	c, err := d.Config()
	if err != nil {
		t.Fatal(err)
	}
	c.MFlow = everyFlow(SplitAtIRQ, 1, 0)
	setConfig(t, d, c)
	hi := udpFlow(40000)
	addRule(t, d, "dst "+innerDst.String()+" port 9999 udp")
	bulk := tcpFlow(40001)
	for range 3 {
		if ret, _, meta := runXDPMeta(t, d, vxlanFrame(frameSpec{flow: hi})); ret != xdpRedirect || len(meta) != metaLen {
			t.Fatalf("high-priority frame: verdict %d, metadata %x; want its queue's, marked queued", ret, meta)
		}
		if ret, _, meta := runXDPMeta(t, d, vxlanFrame(frameSpec{flow: bulk})); ret != xdpRedirect || len(meta) != metaMFLen {
			t.Fatalf("bulk frame: verdict %d, metadata %x; want a micro-flow's", ret, meta)
		}
	}
	if mf := microState(t, d, hi, StageSplit); mf.Elephant || mf.Started != 0 {
		t.Errorf("high-priority flow split: %+v", mf)
	}
	if mf := microState(t, d, bulk, StageSplit); mf.Started != 3 {
		t.Errorf("bulk flow: %+v, want 3 micro-flows", mf)
	}
}

// TestMflowMalformedPassUntouched: with every flow an elephant, frames
// lanes does not understand still pass untouched, and the whole frames of
// the truncation test are split instead of steered.
func TestMflowMalformedPassUntouched(t *testing.T) {
	cores := testCores(t)
	t.Run("irq", func(t *testing.T) {
		xdpMalformedPassUntouched(t, mflowDatapath(t, cores, everyFlow(SplitAtIRQ, 1, cores...)))
	})
	t.Run("irq truncated", func(t *testing.T) {
		xdpTruncated(t, mflowDatapath(t, cores, everyFlow(SplitAtIRQ, 1, cores...)),
			Counters{MicroFrames: 3, MicroFlows: 3, Elephants: 3})
	})
	t.Run("bridge", func(t *testing.T) {
		c := mflowConfig(cores, everyFlow(SplitAtBridge, 1, cores...))
		c.NoBridgeCount = true
		d, _ := newDatapath(t)
		setConfig(t, d, c)
		tcMalformedPassUntouched(t, d, tcCases[0])
	})
}

// TestMflowBridgeSplitsByFrames: at the bridge stage micro-flows are
// counted in frames (a GRO skb counts gso_segs and stays whole) and each
// gets the hash of its core (the placement shows it: BPF_PROG_RUN does not
// return the skb hash; TestRPSHashSelectsCore holds the hash to the core).
// Micro-flows and, with NoBridgeCount, mice are not counted in flight.
func TestMflowBridgeSplitsByFrames(t *testing.T) {
	defer pinThread(t, 0)() // the cut starts on core 0, index 0: no rotation
	cores := testCores(t)
	d, _ := newDatapath(t)
	c := mflowConfig(cores, everyFlow(SplitAtBridge, 4, cores...))
	c.NoBridgeCount = true
	setConfig(t, d, c)
	f := tcpFlow(40000)
	outer := vxlanFrame(frameSpec{flow: f})
	model := microModel{batch: 4}
	var want Counters
	for _, segs := range []uint32{0, 1, 1, 1, 5, 2, 2, 1, 3, 8, 1} {
		frames := max(segs, 1)
		seq, starts := model.add(frames)
		if starts {
			want.MicroFlows++
		}
		want.MicroFrames += uint64(frames)
		if ret := runTCSegs(t, d.TCIngress(), outer, segs); ret != tcUnspec {
			t.Fatalf("verdict %d", int32(ret))
		}
		fl := mustFlow(t, d, f, StageBridge)
		wantIdx := uint32(seq) % uint32(len(cores))
		if !fl.MicroFlow.Elephant || fl.MicroFlow.Started != seq+1 || fl.MicroFlow.CPUIndex != wantIdx || fl.InFlight != 0 {
			t.Fatalf("after an skb of %d frames: %+v, want micro-flow %d on index %d, nothing in flight", frames, fl, seq, wantIdx)
		}
	}
	want.Elephants = 1
	if st := stats(t, d)[StageBridge]; st != want {
		t.Errorf("counters %+v, want %+v", st, want)
	}
	if _, ok := flowState(t, d, f, StageSplit); ok {
		t.Error("the bridge split created split-stage state")
	}

	// A mouse keeps the table's placement (Stay: the core tc runs on),
	// uncounted with NoBridgeCount and counted without, as before MFLOW.
	c.MFlow.Threshold = 1000
	for _, count := range []bool{false, true} {
		c.NoBridgeCount = !count
		setConfig(t, d, c)
		m := udpFlow(41000)
		if count {
			m = udpFlow(41001)
		}
		runTCSegs(t, d.TCIngress(), vxlanFrame(frameSpec{flow: m}), 3)
		fl := mustFlow(t, d, m, StageBridge)
		if fl.MicroFlow.Elephant || fl.CPUIndex != Stay || (fl.InFlight == 3) != count {
			t.Errorf("mouse with NoBridgeCount %v: %+v", !count, fl)
		}
	}
}

// TestMflowConfigRoundTrip: the split setting reads back from the maps and
// through a knob value; settings without it encode as before.
func TestMflowConfigRoundTrip(t *testing.T) {
	d, _ := newDatapath(t)
	for _, m := range []MFlow{
		{At: SplitAtIRQ, Batch: 256, Cores: []int{1, 0}, Threshold: 100, Window: 10 * time.Millisecond, Quiet: 20 * time.Millisecond},
		{At: SplitAtBridge, Batch: MaxBatch, Cores: []int{5}, Window: time.Second},
		{},
	} {
		in := mflowConfig([]int{0, 1, 5}, m)
		in.NoBridgeCount = m.At == SplitAtBridge
		setConfig(t, d, in)
		got, err := d.Config()
		if err != nil {
			t.Fatal(err)
		}
		if got.MFlow.At != m.At || got.MFlow.Batch != m.Batch || !slices.Equal(got.MFlow.Cores, m.Cores) ||
			got.MFlow.Threshold != m.Threshold || got.MFlow.Window != m.Window || got.MFlow.Quiet != m.Quiet || got.NoBridgeCount != in.NoBridgeCount {
			t.Errorf("config with %+v read back %+v", m, got)
		}
		v, s := knobRoundTrip(t, in)
		if s.Config.MFlow.At != m.At || !slices.Equal(s.Config.MFlow.Cores, m.Cores) || s.Config.MFlow.Window != m.Window || s.Config.MFlow.Quiet != m.Quiet {
			t.Errorf("knob value %s decodes to %+v", v, s.Config.MFlow)
		}
		if hasKey := containsKey(v, "mflow"); hasKey != (m.At != SplitOff) {
			t.Errorf("knob value %s: mflow key present %v", v, hasKey)
		}
	}
	if _, err := DecodeSetup(`{"mflow":{"at":"nic"}}`); err == nil {
		t.Error("a knob value with an unknown split point decoded")
	}
}

// containsKey says whether the JSON object v has key at its top level.
func containsKey(v, key string) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal([]byte(v), &m) == nil && m[key] != nil
}
