//go:build linux

package steer

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/testenv"
)

// The differential fuzzer: steer_xdp and every tc program run through
// BPF_PROG_RUN on arbitrary bytes, each run checked against the reference
// (reference_test.go). Under plain `go test` each target runs its seed
// corpus: every frame the other tests build, and every input a fuzzing run
// found diverging (testdata/fuzz). Long runs: `go test -run '^$' -fuzz
// FuzzSteerXDP -fuzztime 10m ./datapath/steer/` (root, one at a time).
//
// Properties:
//   - a frame lanes does not handle leaves with its bytes and the pass
//     verdict (XDP_PASS, TC_ACT_UNSPEC), counted passed;
//   - a frame it handles is classified as the reference classifies it:
//     its flow (the reference's 5-tuple) has a state at the program's
//     stage, high priority exactly when a rule matches it;
//   - no program changes a byte, except the shortcut, whose output must be
//     the very inner frame the kernel's path delivers to that port
//     (kernelModel), and only where that path delivers it.

// fuzzRules are the fuzz datapaths' priority rules; fuzzHigh says whether
// a flow matches one.
var fuzzRules = []string{"dst " + innerDst.String() + " udp", "src " + innerSrc.String() + " port 5000"}

func fuzzHigh(t refTuple) bool {
	return t.proto == protoUDP && t.dst == innerDst || t.src == innerSrc && t.sport == 5000
}

// fuzzModel is the receiving host the sync datapath's set describes.
var fuzzModel = kernelModel{
	ifindex: loIfindex, mac: underlayMAC, locals: []netip.Addr{outerDst}, port: testPort, vni: testVNI,
	vxMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x42}, fdb: map[string]uint32{innerMAC.String(): loIfindex}, mtu: 1500,
}

var (
	fuzzOnce        sync.Once
	fuzzSync, fuzzV *Datapath // priority classes with sync; with the veth classes
	fuzzErr         error
)

// fuzzDatapaths loads the two datapaths once per process: loading takes
// far longer than a run, and the state a run leaves is part of what the
// next one meets, as in a real datapath.
func fuzzDatapaths(t *testing.T) (*Datapath, *Datapath) {
	t.Helper()
	testenv.Root(t)
	fuzzOnce.Do(func() {
		base := Config{Enabled: true, Prio: true, CountSplit: true, CPUs: []int{0}, VXLANPort: testPort, VNIs: []uint32{testVNI}}
		c := base
		c.Sync = true
		if fuzzSync, fuzzErr = fuzzDatapath(c); fuzzErr != nil {
			return
		}
		if fuzzErr = fuzzSync.Sync().Set(testSyncSet(1500), 24*time.Hour); fuzzErr != nil {
			return
		}
		c = base
		c.VethClass = true
		fuzzV, fuzzErr = fuzzDatapath(c)
	})
	if fuzzErr != nil {
		t.Fatal(fuzzErr)
	}
	return fuzzSync, fuzzV
}

// fuzzDatapath loads a datapath specialized for c, as an apply does
// (LoadFor), configured with c, a queue of each class on core 0, every
// table bucket on core index 0, and, with priority classes, fuzzRules.
func fuzzDatapath(c Config) (*Datapath, error) {
	d, err := LoadFor(c)
	if err != nil {
		return nil, err
	}
	if err = d.SetConfig(c); err == nil {
		err = d.CPUMap().Set(0, 64)
	}
	if err == nil {
		err = d.HiCPUMap().Set(0, 64)
	}
	for s := 0; err == nil && s < NumStages; s++ {
		var tab [Buckets]uint32
		err = d.Placement().SetTable(s, tab) // every bucket core index 0
	}
	for _, r := range fuzzRules {
		if err != nil || !c.Prio {
			break
		}
		var rule Rule
		if rule, err = ParseRule(r); err == nil {
			err = d.Prio().AddRule(rule)
		}
	}
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// flowKeyOf is the steer_flows key of t at stage.
func flowKeyOf(t refTuple, stage int) steerSteerFlowKey {
	return steerSteerFlowKey{Saddr: be32(t.src), Daddr: be32(t.dst), Sport: htons(t.sport), Dport: htons(t.dport), Proto: t.proto, Stage: uint8(stage)}
}

// flowPackets is the packets count of t's state at stage (-1: none).
func flowPackets(d *Datapath, t refTuple, stage int) int64 {
	var st steerSteerFlowState
	if err := d.objs.SteerFlows.Lookup(flowKeyOf(t, stage), &st); err != nil {
		return -1
	}
	return int64(st.Packets)
}

// seedFrames are every frame the package's tests build.
func seedFrames() [][]byte {
	var out [][]byte
	for _, f := range outerMalformed() {
		out = append(out, f)
	}
	for _, f := range innerMalformed() {
		out = append(out, f)
	}
	for _, f := range outerMalformedForBare() {
		out = append(out, f)
	}
	flows := []flowSpec{tcpFlow(40000), udpFlow(40000), udpFlow(5000), {src: innerSrc, dst: innerDst, sport: 1, dport: 2, proto: protoICMP}}
	specs := []frameSpec{{}, {payload: 64}, {payload: 200}, {payload: 1400},
		{outerIP: ipSpec{ihl: 6}}, {innerIP: ipSpec{ihl: 15}}, {outerIP: ipSpec{frag: 0x4000}},
		{outerIP: ipSpec{badCsum: true}}, {outerIP: ipSpec{lenAdj: 4}}, {outerIP: ipSpec{lenAdj: -4}}, {trailer: 4},
		{udpLenAdj: 4}, {udpLenAdj: -4}, {udpCsumRight: true, payload: 100}, {udpCsumRight: true, udpCsum: 1},
		{vxFlags: 0x00000100}, {vxFlags: 0x80000000}, {vniLow: 1}, {innerSrcMAC: []byte{2, 0, 0, 0, 0, 0x77}},
		{outerDstMAC: []byte{2, 0, 0, 0, 0, 0x77}}, {innerIP: ipSpec{lenAdj: 2}}, {innerIP: ipSpec{tos: 2}},
		{innerEthType: ethIPv6}, {innerEthType: ethARP}, {innerVLAN: true}, {vlan: true}, {outerEthType: ethIPv6}}
	for _, f := range flows {
		for _, s := range specs {
			s.flow = f
			out = append(out, vxlanFrame(s), innerFrame(s))
			for _, ecn := range []uint8{ecnNotECT, ecnECT1, ecnECT0, ecnCE} {
				e := s
				e.outerIP.tos, e.innerIP.tos = ecnCE, ecn
				out = append(out, vxlanFrame(e))
				e.outerIP.tos = ecnECT1
				out = append(out, vxlanFrame(e))
			}
		}
	}
	for _, f := range [][]byte{vxlanFrame(frameSpec{flow: tcpFlow(40000)}), innerFrame(frameSpec{flow: udpFlow(40000)})} {
		for n := ethHeaderLen; n < len(f); n += 7 {
			out = append(out, f[:n]) // truncated
		}
	}
	return out
}

// FuzzSteerXDP checks steer_xdp against the reference on arbitrary frames.
func FuzzSteerXDP(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		// BPF_PROG_RUN takes an Ethernet header at least, and a page at most.
		if len(frame) < ethHeaderLen || len(frame) > 3000 {
			return
		}
		d, _ := fuzzDatapaths(t)
		checkXDP(t, d, frame)
	})
}

// checkXDP runs steer_xdp once on frame and checks the properties.
func checkXDP(t *testing.T, d *Datapath, frame []byte) {
	t.Helper()
	in := bytes.Clone(frame)
	ref := refOuter(frame, testPort, []uint32{testVNI})
	before := int64(-1)
	if ref.inner {
		before = flowPackets(d, ref.tuple, StageSplit)
	}
	st0 := stats(t, d)[StageSplit]
	ret, out := runXDP(t, d, frame)
	st := stats(t, d)[StageSplit].Sub(st0)
	if !ref.inner {
		if ret != xdpPass || !bytes.Equal(out, in) || st.Passed != 1 {
			t.Fatalf("a frame lanes does not handle (reference %+v): verdict %d, counters %+v, bytes changed %v\n in: %x", ref, ret, st, !bytes.Equal(out, in), in)
		}
		return
	}
	if st.Passed != 0 {
		t.Fatalf("a frame the reference parses (%+v) was passed unparsed: counters %+v\n in: %x", ref, st, in)
	}
	// Only a mode with priority classes classifies.
	if hi := fuzzHigh(ref.tuple) && d.mode.Flags&modePrio != 0; (st.High == 1) != hi {
		t.Fatalf("classified high %v, the reference says %v (%+v)\n in: %x", st.High == 1, hi, ref.tuple, in)
	}
	if after := flowPackets(d, ref.tuple, StageSplit); after < 0 || before >= 0 && after != before+1 {
		t.Fatalf("the reference's flow %+v has packets %d after the run, %d before\n in: %x", ref.tuple, after, before, in)
	}
	if st.Sync+st.SyncDropped == 0 {
		if !bytes.Equal(out, in) {
			t.Fatalf("bytes changed off the shortcut (verdict %d, counters %+v)\n in: %x\nout: %x", ret, st, in, out)
		}
		return
	}
	port, inner, ok := fuzzModel.delivers(loIfindex, in)
	switch {
	case !ok:
		t.Fatalf("the shortcut took a frame the kernel's path does not deliver to one port (counters %+v)\n in: %x", st, in)
	case port != loIfindex || ret != xdpRedirect:
		t.Fatalf("the shortcut redirected (verdict %d) where the kernel delivers to %d\n in: %x", ret, port, in)
	case !bytes.Equal(out, inner):
		t.Fatalf("the shortcut delivered other bytes than the kernel's path\n in: %x\nout: %x\nkernel: %x", in, out, inner)
	}
}

// tcRun is one tc program's run as the fuzzer checks it.
type tcRun struct {
	name  string
	prog  *ebpf.Program
	d     *Datapath
	stage int
	// parse is what the program parses: the frame on the underlay
	// (outer) or an inner frame; nil: it only counts, placing nothing.
	outer, inner bool
	veth         bool // its state lives in steer_veth_class
}

// FuzzSteerTC checks every tc program against the reference on
// arbitrary frames: each leaves the bytes and returns TC_ACT_UNSPEC, and
// those that place a stage keep state for exactly the flows the reference
// parses.
func FuzzSteerTC(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < ethHeaderLen || len(frame) > 3000 {
			return
		}
		d, v := fuzzDatapaths(t)
		for _, r := range []tcRun{
			{name: "steer_tc_ingress", prog: d.TCIngress(), d: d, stage: StageBridge, outer: true},
			{name: "steer_tc_egress", prog: d.TCEgress(), d: d, stage: StageContainer, inner: true},
			{name: "steer_tc_seen", prog: d.TCSeen(), d: d},
			{name: "steer_tc_split_seen", prog: d.TCSplitSeen(), d: d},
			{name: "steer_tc_veth_class", prog: v.TCVethClass(), d: v, stage: StageContainer, inner: true, veth: true},
			{name: "steer_tc_veth_seen", prog: v.TCVethSeen(), d: v},
		} {
			checkTC(t, r, frame)
		}
	})
}

func checkTC(t *testing.T, r tcRun, frame []byte) {
	t.Helper()
	in := bytes.Clone(frame)
	var tuple refTuple
	parsed := false
	switch {
	case r.outer:
		ref := refOuter(frame, testPort, []uint32{testVNI})
		tuple, parsed = ref.tuple, ref.inner
	case r.inner:
		tuple, parsed = refInner(frame)
	}
	st0 := stats(t, r.d)[r.stage]
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)}
	ret, err := r.prog.Run(&opts)
	if errors.Is(err, unix.EINVAL) {
		// BPF_PROG_RUN refuses an skb test input whose ethertype promises
		// a network header it does not hold (bpf_prog_test_run_skb): no
		// program runs on it, as no device would hand it to one.
		return
	}
	if err != nil {
		t.Fatalf("%s: running on %d bytes: %v", r.name, len(frame), err)
	}
	out := opts.DataOut
	st := stats(t, r.d)[r.stage].Sub(st0)
	if ret != tcUnspec || !bytes.Equal(out, in) {
		t.Fatalf("%s: verdict %#x, bytes changed %v: want TC_ACT_UNSPEC and the frame untouched\n in: %x\nout: %x", r.name, ret, !bytes.Equal(out, in), in, out)
	}
	if !r.outer && !r.inner {
		return
	}
	if !parsed {
		if st.Passed != 1 {
			t.Fatalf("%s: a frame the reference does not parse: counters %+v, want one passed\n in: %x", r.name, st, in)
		}
		return
	}
	if st.Passed != 0 {
		t.Fatalf("%s: a frame the reference parses (%+v) was passed: counters %+v\n in: %x", r.name, tuple, st, in)
	}
	if r.veth {
		var vs steerVethClassState
		if err := r.d.objs.SteerVethClass.Lookup(flowKeyOf(tuple, StageContainer), &vs); err != nil {
			t.Fatalf("%s: no class state for the reference's flow %+v\n in: %x", r.name, tuple, in)
		}
		if want := uint32(0); fuzzHigh(tuple) && vs.Queue == want {
			t.Fatalf("%s: high-priority flow %+v in the bulk queue\n in: %x", r.name, tuple, in)
		}
		return
	}
	if flowPackets(r.d, tuple, r.stage) < 0 {
		t.Fatalf("%s: no %s state for the reference's flow %+v\n in: %x", r.name, StageName(r.stage), tuple, in)
	}
}

// The reference and the seed corpus agree with the package's own tests on
// what they build: a sanity check that runs without root.
func TestReferenceParsesTestFrames(t *testing.T) {
	s := frameSpec{flow: udpFlow(40000), payload: 10}
	r := refOuter(vxlanFrame(s), testPort, []uint32{testVNI})
	want := refTuple{src: innerSrc, dst: innerDst, sport: 40000, dport: 9999, proto: protoUDP}
	if !r.overlay || !r.inner || r.tuple != want || r.vni != testVNI {
		t.Errorf("reference %+v, want the test flow %+v", r, want)
	}
	for name, f := range outerMalformed() {
		if r := refOuter(f, testPort, []uint32{testVNI}); r.inner {
			t.Errorf("%s: the reference parses it: %+v", name, r)
		}
	}
	s.udpCsumRight = true
	port, inner, ok := fuzzModel.delivers(loIfindex, vxlanFrame(s))
	if !ok || port != loIfindex || !bytes.Equal(inner, innerFrame(s)) {
		t.Errorf("kernel model: port %d, ok %v, inner %x", port, ok, inner)
	}
	bad := s
	bad.udpCsum = 1
	if _, _, ok := fuzzModel.delivers(loIfindex, vxlanFrame(bad)); ok {
		t.Error("kernel model delivers a datagram with a wrong UDP checksum")
	}
	if len(seedFrames()) < 100 {
		t.Errorf("only %d seeds", len(seedFrames()))
	}
}

// The divergences the fuzzer found, kept: before the parsers took the
// kernel's lengths, steer_xdp and the tc programs steered frames whose
// IPv4 total length, UDP length or TCP data offset reach past the frame
// (or, for the total length, fall short of the header): frames the kernel
// trims or drops before any overlay sees them, which filled the flow
// table with flows that do not exist.
func TestFuzzDivergences(t *testing.T) {
	d, v := fuzzDatapaths(t)
	tcpf, udpf := tcpFlow(40000), udpFlow(40000)
	doff := func(s frameSpec, off byte) []byte { // inner TCP data offset
		f := vxlanFrame(s)
		f[50+14+20+12] = off << 4
		return f
	}
	frames := map[string][]byte{
		"outer total length past the frame":    vxlanFrame(frameSpec{flow: udpf, outerIP: ipSpec{lenAdj: 4}}),
		"outer total length short of header":   vxlanFrame(frameSpec{flow: udpf, outerIP: ipSpec{lenAdj: -1000}}),
		"outer total length 0":                 vxlanFrame(frameSpec{flow: udpf, outerIP: ipSpec{lenAdj: -(20 + 8 + 8 + 14 + 20 + 8)}}),
		"UDP length past the datagram":         vxlanFrame(frameSpec{flow: tcpf, udpLenAdj: 4}),
		"UDP length short (cuts the inner)":    vxlanFrame(frameSpec{flow: tcpf, udpLenAdj: -4}),
		"inner total length past the frame":    vxlanFrame(frameSpec{flow: udpf, innerIP: ipSpec{lenAdj: 2}}),
		"inner TCP data offset past the frame": doff(frameSpec{flow: tcpf}, 15),
		"inner TCP data offset below 5":        doff(frameSpec{flow: tcpf}, 4),
	}
	for name, f := range frames {
		t.Run(name, func(t *testing.T) {
			if r := refOuter(f, testPort, []uint32{testVNI}); r.inner {
				t.Fatalf("the reference parses it: %+v", r)
			}
			checkXDP(t, d, f)
			for _, r := range []tcRun{
				{name: "steer_tc_ingress", prog: d.TCIngress(), d: d, stage: StageBridge, outer: true},
				{name: "steer_tc_egress", prog: d.TCEgress(), d: d, stage: StageContainer, inner: true},
				{name: "steer_tc_veth_class", prog: v.TCVethClass(), d: v, stage: StageContainer, inner: true, veth: true},
			} {
				checkTC(t, r, f)
				checkTC(t, r, f[50:]) // the inner frame, at the veths
			}
		})
	}
}
