//go:build linux

package steer

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// pinThread keeps the calling goroutine on its thread and the thread on
// cpu until the returned function runs (deferred by the caller, on the
// same goroutine): BPF_PROG_RUN runs the program on the caller's core, and
// a flow runs on only on one core (stay_direct).
func pinThread(t testing.TB, cpu int) func() {
	t.Helper()
	runtime.LockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	return func() {
		unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}
}

// skbIngressIfindexOff is struct __sk_buff's ingress_ifindex in the UAPI.
const skbIngressIfindexOff = 36

// runTCFromDevice runs a tc program on frame as an skb a device (lo)
// received: BPF_PROG_RUN leaves skb->hash 0, which from a device means a
// frame the bridge stage ran on (stay_direct).
func runTCFromDevice(t *testing.T, p *ebpf.Program, frame []byte) {
	t.Helper()
	var ctx skbCtx
	binary.NativeEndian.PutUint32(ctx[skbIngressIfindexOff:], loIfindex)
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx}
	if _, err := p.Run(&opts); err != nil {
		t.Fatalf("running %s: %v", p, err)
	}
}

// A flow staying at the bridge stage first queues through the RPS backlog,
// counted; once every counted frame is seen it runs on without the
// backlog (Direct), still counted in flight, and a zero hash from a device
// counts out only then. A move starts over; at home, a flow whose state
// still queues keeps queuing, and one without state runs on.
func TestBridgeStaysDirect(t *testing.T) {
	// Core 0 is in drainDatapath's core set: a queued frame gets a hash
	// for it, counted.
	defer pinThread(t, 0)()
	d := drainDatapath(t, time.Hour)
	f := udpFlow(40000)
	outer, inner := vxlanFrame(frameSpec{flow: f}), innerFrame(frameSpec{flow: f})
	direct := func() uint64 { return stats(t, d)[StageBridge].Direct }
	away := func() bool {
		t.Helper()
		a, err := d.Placement().Activity(time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return a.Away[StageBridge]
	}

	// Fresh: queued and counted, twice.
	for i := 1; i <= 2; i++ {
		runTC(t, d.TCIngress(), outer)
		if fl := mustFlow(t, d, f, StageBridge); fl.Direct || fl.InFlight != int64(i) {
			t.Fatalf("frame %d: %+v, want queued with %d in flight", i, fl, i)
		}
	}
	if direct() != 0 {
		t.Error("a fresh flow ran on")
	}
	if !away() {
		t.Error("a flow staying through the backlog is not Away: home would overtake it")
	}
	// A zero hash from a device is not one of its queued frames.
	runTCFromDevice(t, d.TCEgress(), inner)
	if n := inFlight(t, d, f, StageBridge); n != 2 {
		t.Errorf("a zero-hash frame from a device counted out a queued flow: %d in flight, want 2", n)
	}
	// Its queued frames seen (no device: BPF_PROG_RUN's own frames count).
	runTC(t, d.TCEgress(), inner)
	runTC(t, d.TCEgress(), inner)
	if n := inFlight(t, d, f, StageBridge); n != 0 {
		t.Fatalf("after both seen: %d in flight", n)
	}

	// Now it runs on, counted in flight, and seen with a zero hash.
	runTC(t, d.TCIngress(), outer)
	if fl := mustFlow(t, d, f, StageBridge); !fl.Direct || fl.InFlight != 1 {
		t.Fatalf("after the queue emptied: %+v, want direct with 1 in flight", fl)
	}
	if s := stats(t, d)[StageBridge]; s.Direct != 1 || s.Stayed != 3 {
		t.Errorf("counters %+v, want 3 stayed, 1 direct", s)
	}
	if away() {
		t.Error("a flow running on counts as Away")
	}
	runTCFromDevice(t, d.TCEgress(), inner)
	if n := inFlight(t, d, f, StageBridge); n != 0 {
		t.Errorf("the frame run on was not counted out: %d in flight", n)
	}

	// A move away and back starts over from queued.
	b := Bucket(f.hash(), loIfindex, StageBridge)
	if err := d.Placement().SetBucket(StageBridge, b, 1); err != nil {
		t.Fatal(err)
	}
	runTC(t, d.TCIngress(), outer)
	if fl := mustFlow(t, d, f, StageBridge); fl.CPUIndex != 1 || fl.Direct {
		t.Fatalf("after the move: %+v", fl)
	}
	runTC(t, d.TCEgress(), inner)
	if err := d.Placement().SetBucket(StageBridge, b, Stay); err != nil {
		t.Fatal(err)
	}
	runTC(t, d.TCIngress(), outer)
	if fl := mustFlow(t, d, f, StageBridge); fl.CPUIndex != Stay || fl.Direct || fl.InFlight != 1 {
		t.Fatalf("back to stay: %+v, want queued with 1 in flight", fl)
	}
	before := direct()

	// At home: the queuing flow keeps queuing; a flow without state runs on.
	if err := d.Placement().SetHome(StageBridge, true); err != nil {
		t.Fatal(err)
	}
	runTC(t, d.TCIngress(), outer)
	if got := direct(); got != before {
		t.Errorf("at home, a flow whose state queues ran on (%d -> %d direct)", before, got)
	}
	g := udpFlow(40001)
	runTC(t, d.TCIngress(), vxlanFrame(frameSpec{flow: g}))
	if got := direct(); got != before+1 {
		t.Errorf("at home, a flow without state: %d -> %d direct, want one more; %+v", before, got, stats(t, d)[StageBridge])
	}
	if _, ok := flowState(t, d, g, StageBridge); ok {
		t.Error("the home path made a flow state")
	}
}

// With MFLOW's later split a staying mouse keeps queuing: the micro-flows
// queue uncounted, so no count proves the backlog free of the flow.
func TestBridgeDirectNotWithMFlowBridge(t *testing.T) {
	cores := testCores(t)
	defer pinThread(t, cores[0])()
	// A threshold no test flow reaches: every flow is a mouse.
	d := mflowDatapath(t, cores, MFlow{At: SplitAtBridge, Batch: 256, Cores: cores, Threshold: 1 << 30, Window: time.Hour})
	f := udpFlow(40000)
	outer, inner := vxlanFrame(frameSpec{flow: f}), innerFrame(frameSpec{flow: f})
	for range 3 {
		runTC(t, d.TCIngress(), outer)
		runTC(t, d.TCEgress(), inner)
	}
	if s := stats(t, d)[StageBridge]; s.Direct != 0 {
		t.Errorf("counters %+v: ran on under MFLOW's later split", s)
	}
}

// Leaving home restarts the bridge stage's states instead of deleting
// them: one that queued at home (its frames went to the backlog,
// uncounted) must queue a counted frame again before it runs on, and so
// must one that ran on (what it ran on at home was not counted, and must
// not be counted out of the fresh count).
func TestBridgeLeavingHomeRestarts(t *testing.T) {
	defer pinThread(t, 0)()
	d := drainDatapath(t, time.Hour)
	q, r := udpFlow(40000), udpFlow(40001)
	qOuter, rOuter, rInner := vxlanFrame(frameSpec{flow: q}), vxlanFrame(frameSpec{flow: r}), innerFrame(frameSpec{flow: r})
	runTC(t, d.TCIngress(), qOuter) // q: queued, 1 in flight
	runTC(t, d.TCIngress(), rOuter) // r: queued ...
	runTC(t, d.TCEgress(), rInner)  // ... seen ...
	runTC(t, d.TCIngress(), rOuter) // ... and running on, 1 in flight
	if !mustFlow(t, d, r, StageBridge).Direct || mustFlow(t, d, q, StageBridge).Direct {
		t.Fatal("setup: want r direct, q queued")
	}
	if err := d.Placement().SetHome(StageBridge, true); err != nil {
		t.Fatal(err)
	}
	before := stats(t, d)[StageBridge].Direct
	runTC(t, d.TCIngress(), qOuter) // queues, uncounted
	runTC(t, d.TCIngress(), rOuter) // runs on, uncounted
	if got := stats(t, d)[StageBridge].Direct - before; got != 1 {
		t.Errorf("at home: %d frames ran on, want 1 (r's)", got)
	}
	if err := d.Placement().SetHome(StageBridge, false); err != nil {
		t.Fatal(err)
	}
	fq, fr := mustFlow(t, d, q, StageBridge), mustFlow(t, d, r, StageBridge)
	if fq.Direct || fq.InFlight != 0 || fr.Direct || fr.InFlight != 0 {
		t.Fatalf("after leaving home: q %+v, r %+v; want both fresh, with nothing in flight", fq, fr)
	}
	// Each one's next frame queues (counted), although nothing is in flight;
	// a zero hash from a device (r's frame run on at home) does not count out.
	before = stats(t, d)[StageBridge].Direct
	runTC(t, d.TCIngress(), qOuter)
	runTC(t, d.TCIngress(), rOuter)
	runTCFromDevice(t, d.TCEgress(), rInner)
	for _, f := range []flowSpec{q, r} {
		if fl := mustFlow(t, d, f, StageBridge); fl.Direct || fl.InFlight != 1 {
			t.Errorf("first frame after home: %+v, want queued with 1 in flight", fl)
		}
	}
	if got := stats(t, d)[StageBridge].Direct; got != before {
		t.Errorf("%d frames ran on right after leaving home", got-before)
	}
}

// A flow running on that the split stage moves to another core queues
// there until its count is out, frames run on on the first core included,
// then runs on there.
func TestBridgeDirectCoreChange(t *testing.T) {
	if n, err := ebpf.PossibleCPU(); err != nil || n < 2 {
		t.Skip("needs two cores")
	}
	d := drainDatapath(t, time.Hour)
	f := udpFlow(40000)
	outer, inner := vxlanFrame(frameSpec{flow: f}), innerFrame(frameSpec{flow: f})
	unpin := pinThread(t, 0)
	runTC(t, d.TCIngress(), outer)
	runTC(t, d.TCEgress(), inner)
	runTC(t, d.TCIngress(), outer) // runs on core 0, 1 in flight
	unpin()
	if fl := mustFlow(t, d, f, StageBridge); !fl.Direct || fl.InFlight != 1 {
		t.Fatalf("on core 0: %+v, want direct with 1 in flight", fl)
	}
	defer pinThread(t, 1)()
	runTC(t, d.TCIngress(), outer)
	if fl := mustFlow(t, d, f, StageBridge); fl.Direct || fl.InFlight != 2 {
		t.Fatalf("first frame on core 1: %+v, want queued with 2 in flight", fl)
	}
	// The frame run on core 0 comes out with its zero hash and counts.
	runTCFromDevice(t, d.TCEgress(), inner)
	if n := inFlight(t, d, f, StageBridge); n != 1 {
		t.Errorf("after the frame run on: %d in flight, want 1", n)
	}
	runTC(t, d.TCEgress(), inner)
	runTC(t, d.TCIngress(), outer)
	if fl := mustFlow(t, d, f, StageBridge); !fl.Direct || fl.InFlight != 1 {
		t.Errorf("once both were seen: %+v, want direct on core 1", fl)
	}
}

// With x-stay=queued nothing runs on, and a queued flow does not keep the
// stage from home: at home it queues too.
func TestBridgeStayQueued(t *testing.T) {
	defer pinThread(t, 0)()
	d, _ := newDatapath(t)
	c := Config{Enabled: true, CountSplit: true, CPUs: []int{0, 1}, Drain: time.Hour, VXLANPort: testPort, VNIs: []uint32{testVNI}, StayQueued: true}
	if err := d.SetConfig(c); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Config(); err != nil || !got.StayQueued {
		t.Fatalf("config read back %+v, %v: StayQueued lost", got, err)
	}
	f := udpFlow(40000)
	outer, inner := vxlanFrame(frameSpec{flow: f}), innerFrame(frameSpec{flow: f})
	for range 3 {
		runTC(t, d.TCIngress(), outer)
		runTC(t, d.TCEgress(), inner)
	}
	runTC(t, d.TCIngress(), outer)
	if s := stats(t, d)[StageBridge]; s.Direct != 0 || s.Stayed != 4 {
		t.Errorf("counters %+v, want 4 stayed, none run on", s)
	}
	if a, err := d.Placement().Activity(time.Hour); err != nil || a.Away[StageBridge] {
		t.Errorf("away %v, %v: a queued flow keeps the stage from home although nothing runs on", a.Away, err)
	}
	if err := d.Placement().SetHome(StageBridge, true); err != nil {
		t.Fatal(err)
	}
	runTC(t, d.TCIngress(), vxlanFrame(frameSpec{flow: udpFlow(40001)}))
	if s := stats(t, d)[StageBridge]; s.Direct != 0 {
		t.Errorf("at home with x-stay=queued a frame ran on: %+v", s)
	}
}

// A flow staying queued with frames counted in flight that never come
// (lost where nothing reports it) starts counting afresh after the drain
// time idle, and runs on once a fresh one is seen.
func TestBridgeQueuedDrainRestarts(t *testing.T) {
	defer pinThread(t, 0)()
	d := drainDatapath(t, 5*time.Millisecond)
	f := udpFlow(40000)
	outer, inner := vxlanFrame(frameSpec{flow: f}), innerFrame(frameSpec{flow: f})
	runTC(t, d.TCIngress(), outer)
	runTC(t, d.TCIngress(), outer)
	if fl := mustFlow(t, d, f, StageBridge); fl.Direct || fl.InFlight != 2 {
		t.Fatalf("%+v, want queued with 2 in flight", fl)
	}
	time.Sleep(20 * time.Millisecond)
	// Counted afresh, and queued first: a frame starved in the backlog
	// past the drain time must not be overtaken.
	runTC(t, d.TCIngress(), outer)
	if fl := mustFlow(t, d, f, StageBridge); fl.Direct || fl.InFlight != 1 {
		t.Errorf("after the drain time: %+v, want queued with 1 in flight", fl)
	}
	runTC(t, d.TCEgress(), inner)
	runTC(t, d.TCIngress(), outer)
	if fl := mustFlow(t, d, f, StageBridge); !fl.Direct || fl.InFlight != 1 {
		t.Errorf("once that one was seen: %+v, want direct with 1 in flight", fl)
	}
	if s := stats(t, d)[StageBridge]; s.Undrained != 1 || s.Direct != 1 {
		t.Errorf("counters %+v, want 1 undrained, 1 direct", s)
	}
}

// At home, a flow whose state would queue queues only while it keeps
// sending: idle for the drain time, its frames queued before are presumed
// out and it runs on like a flow without state. HomeQueues says whether
// any such flow queued within the drain time; once none did, the bare path
// runs every frame on without a lookup, and leaving home ends it.
func TestBridgeHomeBare(t *testing.T) {
	defer pinThread(t, 0)()
	const drain = 20 * time.Millisecond
	d := drainDatapath(t, drain)
	q, r := udpFlow(40000), udpFlow(40001)
	qOuter, rOuter := vxlanFrame(frameSpec{flow: q}), vxlanFrame(frameSpec{flow: r})
	runTC(t, d.TCIngress(), qOuter) // q: queued, 1 in flight
	if err := d.Placement().SetHomeBare(); err == nil {
		t.Error("the bare path was switched on with the stage away")
	}
	if err := d.Placement().SetHome(StageBridge, true); err != nil {
		t.Fatal(err)
	}
	direct := func() uint64 { return stats(t, d)[StageBridge].Direct }
	before := direct()
	runTC(t, d.TCIngress(), qOuter) // queues, uncounted, stamped
	if got := direct() - before; got != 0 {
		t.Errorf("at home, a queued flow's frame ran on (%d)", got)
	}
	if busy, err := d.Placement().HomeQueues(0); err != nil || !busy {
		t.Errorf("HomeQueues %v, %v; want a flow queuing", busy, err)
	}
	time.Sleep(2 * drain)
	if busy, err := d.Placement().HomeQueues(0); err != nil || busy {
		t.Errorf("HomeQueues %v, %v after the drain time; want none queuing", busy, err)
	}
	runTC(t, d.TCIngress(), qOuter) // idle for the drain time: runs on
	if got := direct() - before; got != 1 {
		t.Errorf("after the drain time idle: %d ran on, want 1", got)
	}
	if err := d.Placement().SetHomeBare(); err != nil {
		t.Fatal(err)
	}
	if bare, err := d.Placement().HomeBare(); err != nil || !bare {
		t.Fatalf("HomeBare %v, %v", bare, err)
	}
	flows, _ := d.Flows()
	runTC(t, d.TCIngress(), rOuter) // a new flow: runs on, no state
	runTC(t, d.TCIngress(), qOuter)
	if got := direct() - before; got != 3 {
		t.Errorf("on the bare path: %d ran on, want 3", got)
	}
	if after, _ := d.Flows(); len(after) != len(flows) {
		t.Errorf("the bare path made flow states: %d before, %d after", len(flows), len(after))
	}
	// Frames it does not understand pass untouched there too.
	for name, frame := range outerMalformedForBare() {
		ret, out := runTC(t, d.TCIngress(), frame)
		if ret != tcUnspec {
			t.Errorf("%s: verdict %d", name, int32(ret))
		}
		sameBytes(t, name, frame, out)
	}
	if got := direct() - before; got != 3 {
		t.Errorf("malformed frames counted as run on: %d, want 3", got)
	}
	if err := d.Placement().SetHome(StageBridge, false); err != nil {
		t.Fatal(err)
	}
	if bare, err := d.Placement().HomeBare(); err != nil || bare {
		t.Errorf("HomeBare %v, %v after leaving home; want off", bare, err)
	}
}

// outerMalformedForBare: a few frames steer_tc_ingress must not treat as
// overlay frames (the full table is TestTCMalformedPassUntouched's).
func outerMalformedForBare() map[string][]byte {
	f := udpFlow(40000)
	return map[string][]byte{
		"other VNI":  vxlanFrame(frameSpec{flow: f, vni: testVNI + 1}),
		"inner IPv6": vxlanFrame(frameSpec{flow: f, innerEthType: ethIPv6}),
		"fragment":   vxlanFrame(frameSpec{flow: f, outerIP: ipSpec{frag: 0x2000}}),
	}
}
