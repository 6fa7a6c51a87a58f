//go:build linux

package steer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/testenv"
)

// The differential fuzzer: steer_xdp and every tc program run through
// BPF_PROG_RUN on arbitrary bytes, each run checked against the reference
// (reference_test.go), in every datapath setup a mode loads
// (PlannedSetups: what the planners of falcon, mflow and prism build) and
// in the runtime states their agents put it in (fuzzState). An input is
// the setup (an index into the planned ones), the state, whether the
// outer checksums are made right first (most mutations of the outer
// headers would otherwise fail them, and the shortcut's checks behind
// them would never run), and the frame. Under plain `go test` each target
// runs its seed corpus: every frame the other tests build, over the
// setups and states in turn, and the inputs kept in testdata/fuzz (a
// small seed set and every input a fuzzing run found diverging). Long
// runs: `go test -run '^$' -fuzz FuzzSteerXDP -fuzztime 10m
// ./datapath/steer/` (root, one at a time).
//
// Properties:
//   - a frame lanes does not handle leaves with its bytes and the pass
//     verdict (XDP_PASS, TC_ACT_UNSPEC), counted passed, unless the state
//     has the program look at nothing (disabled, at home, PRISM's aside
//     pass), which it counts instead;
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

// maxXDPFrame is the longest frame BPF_PROG_RUN hands steer_xdp in one
// buffer: a page less XDP's headroom and the tail room for
// skb_shared_info. A device whose frames need more (multi-buffer) refuses
// the program (TestXDPSingleBuffer).
const maxXDPFrame = 4096 - 256 - 320

// fuzzState is the runtime state a fuzz input puts its datapath in: what
// lanes agent, lanes prio and a mode's plan switch while the programs run.
type fuzzState struct {
	table    int  // every table: 0 all Stay, 1 all the first core, 2 all the last, 3 a mix of those
	home     bool // every stage at home, the bridge stage's bare path on
	cpu      int  // the programs run on the set's first core (0) or its last (1)
	inline   bool // high=auto: every rule's flows run in the NIC poll
	aside    bool // PRISM stands aside, its receive core's queues empty
	noSync   bool // sync: no destination
	disabled bool // the config is off
}

// stateOf decodes an input's state: bits 0-1 the table, 2 the core, 3
// inline, 4 aside, 5 no sync destination; bits 6-8 6 at home, 7 off (one
// input in eight each: those paths look at nothing).
func stateOf(b uint16) fuzzState {
	return fuzzState{table: int(b & 3), cpu: int(b>>2) & 1, inline: b&8 != 0, aside: b&0x10 != 0,
		noSync: b&0x20 != 0, home: b>>6&7 == 6, disabled: b>>6&7 == 7}
}

// fuzzCase is a planned setup's datapath, loaded on first use and kept for
// the process: loading takes far longer than a run, and the state a run
// leaves is part of what the next one meets, as in a real datapath.
type fuzzCase struct {
	NamedSetup
	once  sync.Once
	d     *Datapath
	err   error
	state *fuzzState // as last applied (nil: none yet)
}

var (
	fuzzCasesOnce sync.Once
	fuzzCases     []*fuzzCase
	fuzzCasesErr  error
)

// fuzzCaseFor is the planned setup an input selects, loaded, with its
// state applied; the caller runs on the core the state names (it is
// pinned there until the returned function is called).
func fuzzCaseFor(t *testing.T, sel uint8, state uint16) (*fuzzCase, fuzzState, func()) {
	t.Helper()
	cases := plannedCases(t)
	return cases[int(sel)%len(cases)].use(t, stateOf(state))
}

// plannedCases are the planned setups, not loaded yet.
func plannedCases(t *testing.T) []*fuzzCase {
	t.Helper()
	testenv.Root(t)
	fuzzCasesOnce.Do(func() {
		var setups []NamedSetup
		if setups, fuzzCasesErr = PlannedSetups(); fuzzCasesErr == nil && len(setups) == 0 {
			fuzzCasesErr = errors.New("no planner built a steer datapath")
		}
		for _, s := range setups {
			fuzzCases = append(fuzzCases, &fuzzCase{NamedSetup: s})
		}
	})
	if fuzzCasesErr != nil {
		t.Fatal(fuzzCasesErr)
	}
	return fuzzCases
}

// use loads c's datapath if need be, puts it in state s and pins the
// calling thread to the core s names.
func (c *fuzzCase) use(t *testing.T, s fuzzState) (*fuzzCase, fuzzState, func()) {
	t.Helper()
	c.once.Do(func() { c.d, c.err = fuzzDatapath(c.Setup) })
	if c.err != nil {
		t.Fatalf("%s: %v", c.Name, c.err)
	}
	cfg := c.Setup.Config
	if cfg.HighAutoPPS == 0 {
		s.inline = false
	}
	if cfg.AsideBelow == 0 {
		s.aside = false
	}
	if !cfg.Sync {
		s.noSync = false
	}
	cpus := slices.Sorted(slices.Values(cfg.CPUs))
	s.cpu = cpus[s.cpu*(len(cpus)-1)]
	if err := c.apply(s); err != nil {
		t.Fatalf("%s: state %+v: %v", c.Name, s, err)
	}
	return c, s, pinThread(t, s.cpu)
}

// fuzzDatapath loads a datapath for s as an apply does (LoadFor),
// configured with it, its cpumap entries, its queues tracked (as
// TrackQueues leaves them, without the tracepoints, which BPF_PROG_RUN
// never fires), with priority classes fuzzRules, with sync its set.
func fuzzDatapath(s Setup) (*Datapath, error) {
	d, err := LoadFor(s.Config)
	if err != nil {
		return nil, err
	}
	if err = d.SetConfig(s.Config); err == nil {
		err = fuzzQueues(d, s)
	}
	for _, r := range fuzzRules {
		if err != nil || !s.Config.Prio {
			break
		}
		var rule Rule
		if rule, err = ParseRule(r); err == nil {
			err = d.Prio().AddRule(rule)
		}
	}
	if err == nil && s.Config.Sync {
		err = d.Sync().Set(testSyncSet(1500), 24*time.Hour)
	}
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// fuzzQueues gives d the cpumap entries of s and marks its queues
// tracked.
func fuzzQueues(d *Datapath, s Setup) error {
	size := max(s.QueueSize, 64)
	for _, c := range s.CPUMap {
		if err := d.CPUMap().Set(c, size); err != nil {
			return err
		}
	}
	for _, c := range s.HiCPUMap {
		if err := d.HiCPUMap().Set(c, size); err != nil {
			return err
		}
	}
	for i, m := range []*ebpf.Map{d.objs.SteerCpumap, d.objs.SteerCpumapHi} {
		info, err := m.Info()
		if err != nil {
			return err
		}
		if id, ok := info.ID(); ok {
			if err := d.objs.SteerQmaps.Put(uint32(i), uint32(id)); err != nil {
				return err
			}
		}
	}
	return nil
}

// apply writes what of s differs from the state c was last put in; with
// aside, it also empties the receive core's queues (books their frames
// out), which PRISM's aside pass waits for.
func (c *fuzzCase) apply(s fuzzState) error {
	d, old := c.d, c.state
	cfg := c.Setup.Config
	if old == nil || old.disabled != s.disabled {
		on := cfg
		on.Enabled = !s.disabled
		if err := d.SetConfig(on); err != nil {
			return err
		}
		old = nil // SetConfig wrote the runtime flags afresh
	}
	if old == nil || old.table != s.table {
		if err := fuzzTables(d, len(cfg.CPUs), s.table); err != nil {
			return err
		}
	}
	if old == nil || old.home != s.home {
		if err := fuzzHome(d, s.home); err != nil {
			return err
		}
	}
	if cfg.HighAutoPPS != 0 && (old == nil || old.inline != s.inline) {
		var until time.Duration
		if s.inline {
			until = Now() + 24*time.Hour
		}
		for _, r := range fuzzRules {
			if err := d.Prio().SetHighInline(mustRule(r), until); err != nil {
				return err
			}
		}
	}
	if cfg.AsideBelow != 0 && (old == nil || old.aside != s.aside) {
		var until time.Duration
		if s.aside {
			until = Now() + 24*time.Hour
		}
		if err := d.Prio().SetAside(until); err != nil {
			return err
		}
	}
	if s.aside {
		if err := emptyQueue(d, cfg.InlineCPU); err != nil {
			return err
		}
	}
	if cfg.Sync && (old == nil || old.noSync != s.noSync) {
		set := testSyncSet(1500)
		if s.noSync {
			set = SyncSet{}
		}
		if err := d.Sync().Set(set, 24*time.Hour); err != nil {
			return err
		}
	}
	c.state = &s
	return nil
}

func mustRule(s string) Rule {
	r, err := ParseRule(s)
	if err != nil {
		panic(err)
	}
	return r
}

// fuzzTables sets every stage's table as state's table field says.
func fuzzTables(d *Datapath, ncpus, how int) error {
	var tab [Buckets]uint32
	for b := range tab {
		switch how {
		case 0:
			tab[b] = Stay
		case 1:
			tab[b] = 0
		case 2:
			tab[b] = uint32(ncpus - 1)
		default:
			if tab[b] = uint32(b % (ncpus + 1)); tab[b] == uint32(ncpus) {
				tab[b] = Stay
			}
		}
	}
	for s := range NumStages {
		if err := d.Placement().SetTable(s, tab); err != nil {
			return err
		}
	}
	return nil
}

// fuzzHome puts every stage at home (and the bridge stage's bare path on)
// or takes them all away, as lanes agent's flags, without the restart of
// the flow states the agent makes when a stage leaves home: the programs
// must keep frames intact whatever states they meet.
func fuzzHome(d *Datapath, on bool) error {
	var k steerSteerCfg
	if err := d.objs.SteerCfg.Lookup(uint32(0), &k); err != nil {
		return err
	}
	all := uint32(cfgHomeBare)
	for s := range NumStages {
		all |= uint32(cfgHome) << s
	}
	if k.Flags &^= all; on {
		k.Flags |= all
	}
	return d.objs.SteerCfg.Put(uint32(0), k)
}

// emptyQueue books every frame counted into core's queues out, as lanes
// agent's reconciler does once they are gone, and forgets when one was
// last counted in.
func emptyQueue(d *Datapath, core int) error {
	var q steerSteerQueue
	if err := d.objs.SteerQueues.Lookup(uint32(core), &q); err != nil {
		return err
	}
	q.Seen, q.EmptyAt, q.MarkedAt = q.Enq-q.DroppedEnq-q.DroppedKthread, q.Enq, 0
	if err := d.objs.SteerQueueLost.Put(uint32(core), uint64(0)); err != nil {
		return err
	}
	return d.objs.SteerQueues.Put(uint32(core), &q)
}

// fixChecksums makes frame's outer IPv4 header checksum right, and its
// outer UDP checksum where it is not 0, over the lengths the headers give
// (as far as the frame holds them).
func fixChecksums(frame []byte) {
	if len(frame) < ethHeaderLen+20 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
		return
	}
	ip := frame[ethHeaderLen:]
	hlen := int(ip[0]&0x0f) * 4
	if hlen < 20 || hlen > len(ip) {
		return
	}
	binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip[:hlen]))
	tot := min(int(binary.BigEndian.Uint16(ip[2:])), len(ip))
	if ip[9] != protoUDP || tot < hlen+8 {
		return
	}
	udp := ip[hlen:tot]
	ulen := min(int(binary.BigEndian.Uint16(udp[4:])), len(udp))
	if ulen < 8 || binary.BigEndian.Uint16(udp[6:]) == 0 {
		return
	}
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	binary.BigEndian.PutUint16(udp[6:], udpChecksum(src, dst, udp[:ulen]))
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

// addSeeds adds every seed frame, over the planned setups and the states
// in turn, half of them with their checksums made right.
func addSeeds(f *testing.F) {
	for i, frame := range seedFrames() {
		f.Add(uint8(i), uint16(i*7), i%2 == 0, frame)
	}
}

// fuzzInput is an input's frame as the run takes it, or nil if
// BPF_PROG_RUN would not take it.
func fuzzInput(fix bool, frame []byte) []byte {
	// An Ethernet header at least, one buffer at most.
	if len(frame) < ethHeaderLen || len(frame) > maxXDPFrame {
		return nil
	}
	if fix {
		frame = bytes.Clone(frame)
		fixChecksums(frame)
	}
	return frame
}

// FuzzSteerXDP checks steer_xdp against the reference on arbitrary frames.
func FuzzSteerXDP(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, setup uint8, state uint16, fix bool, frame []byte) {
		if frame = fuzzInput(fix, frame); frame == nil {
			return
		}
		c, s, done := fuzzCaseFor(t, setup, state)
		defer done()
		checkXDP(t, c.d, s, frame)
	})
}

// checkXDP runs steer_xdp once on frame in a datapath in state s and
// checks the properties.
func checkXDP(t *testing.T, d *Datapath, s fuzzState, frame []byte) {
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
	if ret != xdpPass && ret != xdpRedirect {
		t.Fatalf("verdict %d, want XDP_PASS or XDP_REDIRECT (counters %+v)\n in: %x", ret, st, in)
	}
	if looked := st.Disabled + st.Aside + st.Home; looked != 0 {
		checkUnlooked(t, "steer_xdp", s, st, ret == xdpPass && bytes.Equal(out, in), in)
		return
	}
	if s.disabled {
		t.Fatalf("the config is off, and steer_xdp looked at the frame: counters %+v\n in: %x", st, in)
	}
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
	case s.noSync:
		t.Fatalf("the shortcut took a frame with no destination set (counters %+v)\n in: %x", st, in)
	case !ok:
		t.Fatalf("the shortcut took a frame the kernel's path does not deliver to one port (counters %+v)\n in: %x", st, in)
	case port != loIfindex || ret != xdpRedirect:
		t.Fatalf("the shortcut redirected (verdict %d) where the kernel delivers to %d\n in: %x", ret, port, in)
	case !bytes.Equal(out, inner):
		t.Fatalf("the shortcut delivered other bytes than the kernel's path\n in: %x\nout: %x\nkernel: %x", in, out, inner)
	}
}

// checkUnlooked checks a run that took a path on which a program looks at
// no frame (the config off, PRISM's aside pass, a stage at home): one
// such count, nothing else counted, only in a state that has that path,
// and the frame passed untouched (pass).
func checkUnlooked(t *testing.T, prog string, s fuzzState, st Counters, pass bool, in []byte) {
	t.Helper()
	switch {
	case st.Disabled+st.Aside+st.Home != 1 || st.Passed+st.Stayed+st.Steered+st.High+st.Sync+st.MicroFrames != 0:
		t.Fatalf("%s: counters %+v: one of disabled, aside and home, and nothing else\n in: %x", prog, st, in)
	case st.Disabled == 1 && !s.disabled, st.Aside == 1 && !s.aside, st.Home == 1 && !s.home:
		t.Fatalf("%s: counters %+v in state %+v, which has no such path\n in: %x", prog, st, s, in)
	case !pass:
		t.Fatalf("%s: counters %+v: the frame did not pass untouched\n in: %x", prog, st, in)
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

// tcRuns are d's tc programs as the fuzzer runs them.
func tcRuns(d *Datapath) []tcRun {
	return []tcRun{
		{name: "steer_tc_ingress", prog: d.TCIngress(), d: d, stage: StageBridge, outer: true},
		{name: "steer_tc_egress", prog: d.TCEgress(), d: d, stage: StageContainer, inner: true},
		{name: "steer_tc_seen", prog: d.TCSeen(), d: d},
		{name: "steer_tc_split_seen", prog: d.TCSplitSeen(), d: d},
		{name: "steer_tc_veth_class", prog: d.TCVethClass(), d: d, stage: StageContainer, inner: true, veth: true},
		{name: "steer_tc_veth_seen", prog: d.TCVethSeen(), d: d},
	}
}

// FuzzSteerTC checks every tc program against the reference on
// arbitrary frames: each leaves the bytes and returns TC_ACT_UNSPEC, and
// those that place a stage keep state for exactly the flows the reference
// parses.
func FuzzSteerTC(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, setup uint8, state uint16, fix bool, frame []byte) {
		if frame = fuzzInput(fix, frame); frame == nil {
			return
		}
		c, s, done := fuzzCaseFor(t, setup, state)
		defer done()
		for _, r := range tcRuns(c.d) {
			checkTC(t, r, s, frame)
		}
	})
}

func checkTC(t *testing.T, r tcRun, s fuzzState, frame []byte) {
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
	if !r.outer && !r.inner || r.veth && r.d.mode.Flags&modeVethClass == 0 {
		return // it places nothing, or is not loaded for this mode
	}
	if st.Disabled+st.Home != 0 || s.disabled && !r.veth {
		checkUnlooked(t, r.name, s, st, true, in)
		return
	}
	if s.disabled {
		return // the veth classes count nothing while off
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
			for _, pc := range plannedCases(t) {
				c, s, done := pc.use(t, fuzzState{})
				checkXDP(t, c.d, s, f)
				for _, r := range tcRuns(c.d) {
					checkTC(t, r, s, f)
					checkTC(t, r, s, f[50:]) // the inner frame, at the veths
				}
				done()
			}
		})
	}
}

// NamedSetup is a datapath setup a mode's planner builds, named by the mode
// and its settings.
type NamedSetup struct {
	Name  string
	Setup Setup
}

// PlannedSetups lists the setups the modes' planners build
// (fuzzconfigs_test.go sets it: the planners import this package).
var PlannedSetups func() ([]NamedSetup, error)

// steer_xdp is a single-buffer program (not xdp.frags): a device whose
// frames need several buffers refuses it, so it meets no frame longer than
// one buffer holds: maxXDPFrame under BPF_PROG_RUN, the fuzzers' bound.
// Beyond it the test run would hand it the first buffer alone.
func TestXDPSingleBuffer(t *testing.T) {
	spec, err := loadSteer()
	if err != nil {
		t.Fatal(err)
	}
	if spec.Programs[steerProgSteerXdp].Flags&unix.BPF_F_XDP_HAS_FRAGS != 0 {
		t.Fatal("steer_xdp takes multi-buffer frames: the fuzzers must make them (fuzzInput's bound)")
	}
	d, _ := newDatapath(t)
	for _, n := range []int{maxXDPFrame, maxXDPFrame + 1} {
		frame := vxlanFrame(frameSpec{flow: udpFlow(40000), payload: n - 92})
		if len(frame) != n {
			t.Fatalf("premise: a frame of %d bytes, want %d", len(frame), n)
		}
		before := stats(t, d)[StageSplit]
		runXDP(t, d, frame)
		if whole := stats(t, d)[StageSplit].Sub(before).Passed == 0; whole != (n == maxXDPFrame) {
			t.Errorf("%d bytes: parsed whole %v; want one buffer up to %d bytes, the first of two beyond", n, whole, maxXDPFrame)
		}
	}
}
