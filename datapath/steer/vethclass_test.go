//go:build linux

package steer

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// vethDatapath: priority classes and the per-class container queues on.
func vethDatapath(t *testing.T, drain time.Duration) *Datapath {
	t.Helper()
	d, _ := newDatapath(t)
	cfg := Config{Enabled: true, Prio: true, CountSplit: true, CPUs: []int{0}, Drain: drain, VXLANPort: testPort, VNIs: []uint32{testVNI}, VethClass: true}
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Config(); !got.VethClass {
		t.Fatalf("config %+v does not read back VethClass", got)
	}
	return d
}

// vethFlow returns the container-queue state of f.
func vethFlow(t *testing.T, d *Datapath, f flowSpec) (VethFlow, bool) {
	t.Helper()
	flows, err := d.Prio().VethFlows()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range flows {
		if v.Src == f.src && v.Dst == f.dst && v.SrcPort == f.sport && v.DstPort == f.dport && v.Proto == f.proto {
			return v, true
		}
	}
	return VethFlow{}, false
}

func mustVethFlow(t *testing.T, d *Datapath, f flowSpec) VethFlow {
	t.Helper()
	v, ok := vethFlow(t, d, f)
	if !ok {
		t.Fatalf("no container-queue state for %+v", f)
	}
	return v
}

// setVethFlowLast backdates a flow's last frame: an idle gap without
// waiting for it.
func setVethFlowLast(t *testing.T, d *Datapath, f VethFlow, last time.Duration) {
	t.Helper()
	k := steerSteerFlowKey{Saddr: nativeAddr(f.Src), Daddr: nativeAddr(f.Dst), Sport: nativePort(f.SrcPort), Dport: nativePort(f.DstPort), Proto: f.Proto, Stage: StageContainer}
	var v steerVethClassState
	if err := d.objs.SteerVethClass.Lookup(&k, &v); err != nil {
		t.Fatal(err)
	}
	v.LastNs = uint64(last)
	if err := d.objs.SteerVethClass.Update(&k, &v, ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
}

// TestVethClassQueues: steer_tc_veth_class sends a flow a rule matches to
// the container veth's queue 1 and others to queue 0, counting frames in
// (a GRO skb as its segments); steer_tc_veth_seen counts them out. The
// queue itself is skb->queue_mapping, which BPF_PROG_RUN does not hand
// back: TestPrismVethQueues checks it with real frames.
func TestVethClassQueues(t *testing.T) {
	d := vethDatapath(t, time.Hour)
	addRule(t, d, "dst "+innerDst.String()+" udp")
	hi, bulk := udpFlow(40000), tcpFlow(40001)
	hiFrame, bulkFrame := innerFrame(frameSpec{flow: hi}), innerFrame(frameSpec{flow: bulk})
	for _, f := range [][]byte{hiFrame, hiFrame, bulkFrame} {
		if ret, out := runTC(t, d.TCVethClass(), f); ret != tcUnspec {
			t.Fatalf("verdict %d, want TC_ACT_UNSPEC", int32(ret))
		} else {
			sameBytes(t, "class", f, out)
		}
	}
	if v := mustVethFlow(t, d, hi); v.Queue != 1 || v.InFlight != 2 {
		t.Errorf("high-priority flow %+v, want queue 1 with 2 frames in flight", v)
	}
	if v := mustVethFlow(t, d, bulk); v.Queue != 0 || v.InFlight != 1 {
		t.Errorf("bulk flow %+v, want queue 0 with 1 frame in flight", v)
	}
	if st := stats(t, d)[StageContainer]; st.High != 2 || st.Stayed != 1 {
		t.Errorf("container counters %+v, want 2 high, 1 stayed (bulk)", st)
	}
	for _, f := range [][]byte{hiFrame, bulkFrame} {
		if ret, out := runTC(t, d.TCVethSeen(), f); ret != tcUnspec {
			t.Fatalf("seen: verdict %d, want TC_ACT_UNSPEC", int32(ret))
		} else {
			sameBytes(t, "seen", f, out)
		}
	}
	if v := mustVethFlow(t, d, hi); v.InFlight != 1 {
		t.Errorf("high-priority flow %+v, want 1 frame left in flight", v)
	}
	if v := mustVethFlow(t, d, bulk); v.InFlight != 0 {
		t.Errorf("bulk flow %+v, want none in flight", v)
	}

	// A GRO skb counts its segments both ways.
	runTCSegs(t, d.TCVethClass(), bulkFrame, 5)
	if v := mustVethFlow(t, d, bulk); v.InFlight != 5 {
		t.Errorf("bulk flow %+v after a 5-segment skb, want 5 in flight", v)
	}
	runTCSegs(t, d.TCVethSeen(), bulkFrame, 5)
	if v := mustVethFlow(t, d, bulk); v.InFlight != 0 {
		t.Errorf("bulk flow %+v after its 5 segments were seen, want none in flight", v)
	}
}

// TestVethClassChangeWaits: a flow whose class changes keeps its queue
// while frames of it are in the old one (they would be overtaken), moves
// once they were seen, and moves after the drain time when they never
// are (the veth dropped them).
func TestVethClassChangeWaits(t *testing.T) {
	d := vethDatapath(t, time.Hour)
	f := udpFlow(40000)
	frame := innerFrame(frameSpec{flow: f})
	runTC(t, d.TCVethClass(), frame)
	if v := mustVethFlow(t, d, f); v.Queue != 0 || v.InFlight != 1 {
		t.Fatalf("flow %+v, want queue 0 with 1 frame in flight", v)
	}
	r := addRule(t, d, "dst "+innerDst.String())
	runTC(t, d.TCVethClass(), frame)
	if v := mustVethFlow(t, d, f); v.Queue != 0 || v.InFlight != 2 {
		t.Errorf("changed queue with frames in the old one: %+v", v)
	}
	if st := stats(t, d)[StageContainer]; st.Held != 1 {
		t.Errorf("counters %+v, want 1 held", st)
	}
	runTC(t, d.TCVethSeen(), frame)
	runTC(t, d.TCVethSeen(), frame)
	runTC(t, d.TCVethClass(), frame)
	if v := mustVethFlow(t, d, f); v.Queue != 1 || v.InFlight != 1 {
		t.Errorf("flow %+v once its frames were seen, want queue 1 with 1 in flight", v)
	}
	if st := stats(t, d)[StageContainer]; st.Settled != 1 || st.Undrained != 0 {
		t.Errorf("counters %+v, want 1 settled, none undrained", st)
	}

	// Back to bulk with a frame never seen: held until the drain time.
	if err := d.Prio().DelRule(r); err != nil {
		t.Fatal(err)
	}
	runTC(t, d.TCVethClass(), frame)
	if v := mustVethFlow(t, d, f); v.Queue != 1 {
		t.Errorf("flow %+v left queue 1 with a frame in it", v)
	}
	v := mustVethFlow(t, d, f)
	setVethFlowLast(t, d, v, v.LastSeen-2*time.Hour)
	runTC(t, d.TCVethClass(), frame)
	// Moved, and the frames presumed dropped no longer count.
	if v := mustVethFlow(t, d, f); v.Queue != 0 || v.InFlight != 1 {
		t.Errorf("flow %+v after the drain time idle, want queue 0 with only the new frame in flight", v)
	}
	if st := stats(t, d)[StageContainer]; st.Undrained != 1 {
		t.Errorf("counters %+v, want 1 undrained move", st)
	}
	// More frames seen than counted (counted before an eviction, say)
	// leave the count at zero, not below.
	for range 3 {
		runTC(t, d.TCVethSeen(), frame)
	}
	if v := mustVethFlow(t, d, f); v.InFlight != 0 {
		t.Errorf("flow %+v after three frames seen for one counted, want 0 in flight", v)
	}
}

// TestVethClassMalformed: frames the parser does not understand pass
// untouched, take the bulk queue and keep no state; with the setting off
// (or the datapath disabled) nothing is counted at all.
func TestVethClassMalformed(t *testing.T) {
	d := vethDatapath(t, time.Hour)
	addRule(t, d, "dst "+innerDst.String())
	frames := innerMalformed()
	for name, frame := range frames {
		for _, p := range []*ebpf.Program{d.TCVethClass(), d.TCVethSeen()} {
			ret, out := runTC(t, p, frame)
			if ret != tcUnspec {
				t.Errorf("%s: %s verdict %d, want TC_ACT_UNSPEC", name, p, int32(ret))
			}
			sameBytes(t, name, frame, out)
		}
	}
	if st := stats(t, d)[StageContainer]; st != (Counters{Passed: uint64(len(frames))}) {
		t.Errorf("counters %+v, want %d passed", st, len(frames))
	}
	if flows, _ := d.Prio().VethFlows(); len(flows) != 0 {
		t.Errorf("malformed frames created state: %+v", flows)
	}

	cfg, _ := d.Config()
	cfg.VethClass = false
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	frame := innerFrame(frameSpec{flow: udpFlow(40000)})
	before := stats(t, d)[StageContainer]
	runTC(t, d.TCVethClass(), frame)
	if st := stats(t, d)[StageContainer]; st != before {
		t.Errorf("counters %+v with the setting off, want %+v", st, before)
	}
	if flows, _ := d.Prio().VethFlows(); len(flows) != 0 {
		t.Errorf("state kept with the setting off: %+v", flows)
	}
}

// TestVethClassConfig: the setting needs priority classes and excludes
// sync.
func TestVethClassConfig(t *testing.T) {
	d, _ := newDatapath(t)
	for name, c := range map[string]Config{
		"no prio": {Enabled: true, CPUs: []int{0}, VethClass: true},
		"sync":    {Enabled: true, Prio: true, Sync: true, CPUs: []int{0}, VethClass: true},
	} {
		if err := d.SetConfig(c); err == nil {
			t.Errorf("%s: SetConfig accepted VethClass", name)
		}
	}
}
