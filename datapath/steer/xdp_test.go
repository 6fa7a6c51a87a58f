//go:build linux

package steer

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// spreadTable points bucket b at core index b % n, so that where a flow
// lands depends on its bucket: a wrong mirror shows within a few flows.
func spreadTable(n int) [Buckets]uint32 {
	var tab [Buckets]uint32
	for b := range tab {
		tab[b] = uint32(b % n)
	}
	return tab
}

func TestXDPSteers(t *testing.T) {
	d, cores := newDatapath(t)
	if err := d.Placement().SetTable(StageSplit, spreadTable(len(cores))); err != nil {
		t.Fatal(err)
	}
	var specs []frameSpec
	for i := range 16 {
		specs = append(specs,
			frameSpec{flow: tcpFlow(uint16(40000 + i))},
			frameSpec{flow: udpFlow(uint16(40000 + i)), payload: 32})
	}
	// IPv4 options, outer and inner, must be skipped, not refused.
	specs = append(specs,
		frameSpec{flow: tcpFlow(50001), outerIP: ipSpec{ihl: 6}},
		frameSpec{flow: tcpFlow(50002), innerIP: ipSpec{ihl: 15}},
		frameSpec{flow: udpFlow(50003), outerIP: ipSpec{ihl: 15}, innerIP: ipSpec{ihl: 15}},
		frameSpec{flow: udpFlow(50004), outerIP: ipSpec{frag: 0x4000}, innerIP: ipSpec{frag: 0x4000}}, // DF only
	)
	for _, s := range specs {
		frame := vxlanFrame(s)
		ret, out := runXDP(t, d, frame)
		if ret != xdpRedirect {
			t.Errorf("flow %+v: verdict %d, want XDP_REDIRECT", s.flow, ret)
		}
		sameBytes(t, "steered frame", frame, out)
		fl := mustFlow(t, d, s.flow, StageSplit)
		want := uint32(Bucket(s.flow.hash(), loIfindex, StageSplit) % len(cores))
		if fl.CPUIndex != want || fl.Ifindex != loIfindex || fl.Packets != 1 || fl.Bytes != uint64(len(frame)) {
			t.Errorf("flow %+v: state %+v, want index %d on ifindex %d, 1 packet of %d bytes",
				s.flow, fl, want, loIfindex, len(frame))
		}
		if b := Bucket(s.flow.hash(), loIfindex, StageSplit); fl.Bucket != b {
			t.Errorf("flow %+v: recorded bucket %d, Go mirror says %d", s.flow, fl.Bucket, b)
		}
	}
	st := stats(t, d)[StageSplit]
	if st != (Counters{Steered: uint64(len(specs))}) {
		t.Errorf("counters %+v, want %d steered", st, len(specs))
	}
}

// TestXDPBucketMirror holds Bucket and FlowHash to bpf/flow.h: only the bucket
// the Go mirror predicts points at a core.
func TestXDPBucketMirror(t *testing.T) {
	d, _ := newDatapath(t)
	for i, f := range []flowSpec{tcpFlow(1234), udpFlow(53), tcpFlow(65535)} {
		b := Bucket(f.hash(), loIfindex, StageSplit)
		if err := d.Placement().SetBucket(StageSplit, b, 0); err != nil {
			t.Fatal(err)
		}
		if ret, _ := runXDP(t, d, vxlanFrame(frameSpec{flow: f})); ret != xdpRedirect {
			t.Errorf("flow %d in predicted bucket %d: verdict %d, want XDP_REDIRECT", i, b, ret)
		}
		if err := d.Placement().SetBucket(StageSplit, b, Stay); err != nil {
			t.Fatal(err)
		}
	}
}

func TestXDPStay(t *testing.T) {
	d, _ := newDatapath(t)
	f := tcpFlow(40000)
	frame := vxlanFrame(frameSpec{flow: f})
	ret, out := runXDP(t, d, frame)
	if ret != xdpPass {
		t.Errorf("verdict %d, want XDP_PASS", ret)
	}
	sameBytes(t, "stayed frame", frame, out)
	if fl := mustFlow(t, d, f, StageSplit); fl.CPUIndex != Stay {
		t.Errorf("flow index %d, want Stay", fl.CPUIndex)
	}
	if st := stats(t, d)[StageSplit]; st != (Counters{Stayed: 1}) {
		t.Errorf("counters %+v, want 1 stayed", st)
	}
}

// TestXDPNoCPUMapEntry: a table pointing at a core without a cpumap entry
// must degrade to vanilla placement, not drop.
func TestXDPNoCPUMapEntry(t *testing.T) {
	d, cores := newDatapath(t)
	setAll(t, d, StageSplit, 0)
	if err := d.CPUMap().Del(cores[0]); err != nil {
		t.Fatal(err)
	}
	if ret, _ := runXDP(t, d, vxlanFrame(frameSpec{flow: tcpFlow(1)})); ret != xdpPass {
		t.Errorf("verdict %d, want XDP_PASS", ret)
	}
	if st := stats(t, d)[StageSplit]; st != (Counters{Stayed: 1}) {
		t.Errorf("counters %+v, want 1 stayed", st)
	}
}

// outerMalformed are VXLAN frames steer_xdp and steer_tc_ingress must not
// touch.
func outerMalformed() map[string][]byte {
	tcp := tcpFlow(40000)
	icmp := tcp
	icmp.proto = protoICMP
	cases := map[string]frameSpec{
		"non-IPv4 ethertype": {flow: tcp, outerEthType: 0x88b5},
		"VLAN tag":           {flow: tcp, vlan: true},
		"outer IPv6":         {flow: tcp, outerEthType: ethIPv6},
		"outer version 6":    {flow: tcp, outerIP: ipSpec{version: 6}},
		"outer MF":           {flow: tcp, outerIP: ipSpec{frag: 0x2000}},
		"outer offset":       {flow: tcp, outerIP: ipSpec{frag: 0x0001}},
		"outer IHL 4":        {flow: tcp, outerIP: ipSpec{ihl: 4}},
		"other UDP port":     {flow: tcp, udpPort: 4790},
		"VXLAN without I":    {flow: tcp, noIFlag: true},
		"unknown VNI":        {flow: tcp, vni: testVNI + 1},
		"inner VLAN tag":     {flow: tcp, innerVLAN: true},
		"inner IPv6":         {flow: tcp, innerEthType: ethIPv6},
		"inner ARP":          {flow: tcp, innerEthType: ethARP},
		"inner MF":           {flow: tcp, innerIP: ipSpec{frag: 0x2000}},
		"inner offset":       {flow: tcp, innerIP: ipSpec{frag: 0x1fff}},
		"inner IHL 4":        {flow: tcp, innerIP: ipSpec{ihl: 4}},
		"inner ICMP":         {flow: icmp},
	}
	frames := map[string][]byte{}
	for name, s := range cases {
		frames[name] = vxlanFrame(s)
	}
	return frames
}

func TestXDPMalformedPassUntouched(t *testing.T) {
	d, _ := newDatapath(t)
	xdpMalformedPassUntouched(t, d)
}

// xdpMalformedPassUntouched runs every malformed frame through steer_xdp
// with every bucket steering: each must pass untouched and create no flow.
func xdpMalformedPassUntouched(t *testing.T, d *Datapath) {
	t.Helper()
	// Every bucket steers: a frame parsed by mistake would be redirected.
	setAll(t, d, StageSplit, 0)
	frames := outerMalformed()
	for name, frame := range frames {
		ret, out := runXDP(t, d, frame)
		if ret != xdpPass {
			t.Errorf("%s: verdict %d, want XDP_PASS", name, ret)
		}
		sameBytes(t, name, frame, out)
	}
	if st := stats(t, d)[StageSplit]; st != (Counters{Passed: uint64(len(frames))}) {
		t.Errorf("counters %+v, want %d passed", st, len(frames))
	}
	if flows, _ := d.Flows(); len(flows) != 0 {
		t.Errorf("malformed frames created flows: %+v", flows)
	}
}

func TestXDPTruncated(t *testing.T) {
	d, _ := newDatapath(t)
	xdpTruncated(t, d, Counters{Steered: 3})
}

// xdpTruncated cuts three frames at every offset: each cut passes
// untouched, and the three whole frames are redirected, adding full to the
// counters.
func xdpTruncated(t *testing.T, d *Datapath, full Counters) {
	t.Helper()
	setAll(t, d, StageSplit, 0)
	passed := 0
	for _, s := range []frameSpec{
		{flow: tcpFlow(40000)},
		{flow: udpFlow(40000)},
		{flow: tcpFlow(40001), outerIP: ipSpec{ihl: 15}, innerIP: ipSpec{ihl: 15}},
	} {
		full := vxlanFrame(s) // no payload: every shorter frame cuts a header
		for n := range len(full) {
			frame := full[:n:n]
			if n < ethHeaderLen {
				// BPF_PROG_RUN refuses less than an Ethernet header.
				if _, _, err := d.XDP().Test(frame); !errors.Is(err, unix.EINVAL) {
					t.Errorf("%d bytes: %v, want EINVAL", n, err)
				}
				continue
			}
			ret, out := runXDP(t, d, frame)
			if ret != xdpPass {
				t.Errorf("%+v cut to %d of %d bytes: verdict %d, want XDP_PASS", s.flow, n, len(full), ret)
			}
			sameBytes(t, "truncated", frame, out)
			passed++
		}
		if ret, _ := runXDP(t, d, full); ret != xdpRedirect {
			t.Errorf("%+v full frame: verdict %d, want XDP_REDIRECT", s.flow, ret)
		}
	}
	full.Passed = uint64(passed)
	if st := stats(t, d)[StageSplit]; st != full {
		t.Errorf("counters %+v, want %d passed, 3 steered (%+v)", st, passed, full)
	}
}

func TestXDPDisabled(t *testing.T) {
	d, cores := newDatapath(t)
	setAll(t, d, StageSplit, 0)
	if err := d.SetConfig(Config{CPUs: cores, VXLANPort: testPort, VNIs: []uint32{testVNI}}); err != nil {
		t.Fatal(err)
	}
	frame := vxlanFrame(frameSpec{flow: tcpFlow(1)})
	ret, out := runXDP(t, d, frame)
	if ret != xdpPass {
		t.Errorf("verdict %d, want XDP_PASS", ret)
	}
	sameBytes(t, "disabled", frame, out)
	if st := stats(t, d)[StageSplit]; st != (Counters{Disabled: 1}) {
		t.Errorf("counters %+v, want 1 disabled", st)
	}
	if flows, _ := d.Flows(); len(flows) != 0 {
		t.Errorf("disabled datapath created flows: %+v", flows)
	}
}

// TestFlowlet: a table change reaches a busy flow only after it has been
// idle for the flowlet gap, so its packets never overtake each other.
func TestFlowlet(t *testing.T) {
	d, _ := newDatapath(t)
	cfg := Config{Enabled: true, CPUs: []int{0, 1}, Flowlet: time.Hour, VXLANPort: testPort, VNIs: []uint32{testVNI}}
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	f := tcpFlow(40000)
	frame := vxlanFrame(frameSpec{flow: f})
	b := Bucket(f.hash(), loIfindex, StageSplit)
	send := func(wantIdx uint32) {
		t.Helper()
		runXDP(t, d, frame)
		if fl := mustFlow(t, d, f, StageSplit); fl.CPUIndex != wantIdx {
			t.Fatalf("flow on index %d, want %d", fl.CPUIndex, wantIdx)
		}
	}

	if err := d.Placement().SetBucket(StageSplit, b, 0); err != nil {
		t.Fatal(err)
	}
	send(0)
	if err := d.Placement().SetBucket(StageSplit, b, 1); err != nil {
		t.Fatal(err)
	}
	send(0) // not idle for an hour: held
	if st := stats(t, d)[StageSplit]; st.Held != 1 || st.Moved != 0 {
		t.Errorf("after a held move: counters %+v, want 1 held", st)
	}

	cfg.Flowlet = 0
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	send(1)
	if st := stats(t, d)[StageSplit]; st.Held != 1 || st.Moved != 1 {
		t.Errorf("after the move: counters %+v, want 1 held, 1 moved", st)
	}
	if fl := mustFlow(t, d, f, StageSplit); fl.Packets != 3 {
		t.Errorf("flow counted %d packets, want 3", fl.Packets)
	}

	// And on the clock: after an idle gap longer than the flowlet.
	cfg.Flowlet = 20 * time.Millisecond
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := d.Placement().SetBucket(StageSplit, b, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * cfg.Flowlet)
	send(0)
}

// TestFlowsAreSeparate: each 5-tuple and stage has its own state.
func TestFlowsAreSeparate(t *testing.T) {
	d, _ := newDatapath(t)
	a, b := tcpFlow(40000), tcpFlow(40001)
	fa, fb := vxlanFrame(frameSpec{flow: a}), vxlanFrame(frameSpec{flow: b, payload: 100})
	runXDP(t, d, fa)
	runXDP(t, d, fa)
	runXDP(t, d, fb)
	runTC(t, d.TCIngress(), fa)
	if fl := mustFlow(t, d, a, StageSplit); fl.Packets != 2 || fl.Bytes != 2*uint64(len(fa)) {
		t.Errorf("flow a: %+v, want 2 packets", fl)
	}
	if fl := mustFlow(t, d, b, StageSplit); fl.Packets != 1 || fl.Bytes != uint64(len(fb)) {
		t.Errorf("flow b: %+v, want 1 packet", fl)
	}
	if fl := mustFlow(t, d, a, StageBridge); fl.Packets != 1 {
		t.Errorf("flow a at the bridge stage: %+v, want 1 packet", fl)
	}
	if flows, _ := d.Flows(); len(flows) != 3 {
		t.Errorf("%d flow entries, want 3: %+v", len(flows), flows)
	}
}

// splitFlowAt returns a datapath on cores 0 and 1 with the given flowlet
// gap, f's frame, and f's split-stage bucket, which points at index idx.
func splitFlowAt(t *testing.T, flowlet time.Duration, f flowSpec, idx uint32) (*Datapath, Config, []byte, int) {
	t.Helper()
	d, _ := newDatapath(t)
	cfg := Config{Enabled: true, CPUs: []int{0, 1}, Flowlet: flowlet, VXLANPort: testPort, VNIs: []uint32{testVNI}}
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	b := Bucket(f.hash(), loIfindex, StageSplit)
	if err := d.Placement().SetBucket(StageSplit, b, idx); err != nil {
		t.Fatal(err)
	}
	return d, cfg, vxlanFrame(frameSpec{flow: f}), b
}

// TestFlowOnRemovedCoreMoves: when the core set shrinks under a flow, its
// index names no core any more, so it follows the table at once, flowlet
// or not.
func TestFlowOnRemovedCoreMoves(t *testing.T) {
	f := udpFlow(40000)
	d, cfg, frame, b := splitFlowAt(t, time.Hour, f, 1)
	runXDP(t, d, frame)
	cfg.CPUs = []int{0}
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := d.Placement().SetBucket(StageSplit, b, 0); err != nil {
		t.Fatal(err)
	}
	if ret, _ := runXDP(t, d, frame); ret != xdpRedirect {
		t.Errorf("verdict %d, want XDP_REDIRECT to core 0", ret)
	}
	if fl := mustFlow(t, d, f, StageSplit); fl.CPUIndex != 0 {
		t.Errorf("flow on index %d, want 0", fl.CPUIndex)
	}
	if st := stats(t, d)[StageSplit]; st.Moved != 1 || st.Held != 0 {
		t.Errorf("counters %+v, want 1 moved", st)
	}
}

// TestFlowletClockSkew: a flow whose last packet was stamped after this
// program read the clock (by another core, a moment later) has had no idle
// gap at all, so a table change is held: the unsigned gap once wrapped
// around to "idle for ages" and let the move through.
func TestFlowletClockSkew(t *testing.T) {
	f := tcpFlow(40003)
	d, _, frame, b := splitFlowAt(t, time.Millisecond, f, 0)
	runXDP(t, d, frame)
	stampFlows(t, d, Now()+time.Hour)
	if err := d.Placement().SetBucket(StageSplit, b, 1); err != nil {
		t.Fatal(err)
	}
	runXDP(t, d, frame)
	if fl := mustFlow(t, d, f, StageSplit); fl.CPUIndex != 0 {
		t.Errorf("flow stamped in the future moved to index %d, want held on 0", fl.CPUIndex)
	}
	if s := stats(t, d)[StageSplit]; s.Held != 1 || s.Moved != 0 {
		t.Errorf("counters %+v, want 1 held, none moved", s)
	}
}

// TestFlowletCoarseStamp: packets with no move pending stamp the coarse
// clock, which may trail the packet by a tick, so a gap measured from a
// coarse stamp is taken as coarse_lag_ns shorter; a packet that finds a
// move pending stamps the precise clock (low bit set) for the next test.
// A 5 ms gap from a coarse stamp holds a 1 ms flowlet (the lag is two
// ticks, 8 ms at HZ=250); the same gap from a precise stamp lets it move.
func TestFlowletCoarseStamp(t *testing.T) {
	lag := time.Duration(coarseLag())
	if lag == 0 || lag < 4*time.Millisecond {
		t.Skipf("coarse clock lag %v: the 5 ms gap below would not be inside it", lag)
	}
	f := tcpFlow(40004)
	d, _, frame, b := splitFlowAt(t, time.Millisecond, f, 0)
	runXDP(t, d, frame)
	if fl := mustFlow(t, d, f, StageSplit); fl.LastSeen&1 != 0 {
		t.Fatalf("steady-state stamp %d is precise (low bit set), want coarse", fl.LastSeen)
	}
	if err := d.Placement().SetBucket(StageSplit, b, 1); err != nil {
		t.Fatal(err)
	}
	stampFlows(t, d, (Now()-5*time.Millisecond)&^1) // coarse, 5 ms ago
	runXDP(t, d, frame)
	fl := mustFlow(t, d, f, StageSplit)
	if fl.CPUIndex != 0 {
		t.Fatalf("moved 5 ms after a coarse stamp (lag %v): index %d, want held on 0", lag, fl.CPUIndex)
	}
	if fl.LastSeen&1 == 0 {
		t.Errorf("held packet's stamp %d is coarse, want precise (low bit set)", fl.LastSeen)
	}
	stampFlows(t, d, (Now()-5*time.Millisecond)|1) // precise, 5 ms ago
	runXDP(t, d, frame)
	if fl := mustFlow(t, d, f, StageSplit); fl.CPUIndex != 1 {
		t.Errorf("5 ms after a precise stamp: index %d, want moved to 1", fl.CPUIndex)
	}
	if s := stats(t, d)[StageSplit]; s.Held != 1 || s.Moved != 1 {
		t.Errorf("counters %+v, want 1 held, 1 moved", s)
	}
}
