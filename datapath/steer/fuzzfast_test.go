//go:build linux

package steer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The fast path's differential fuzzer: steer_tc_fast (the underlay's tc
// ingress), steer_tc_fast_vx (the VXLAN device's, on the inner frame) and
// steer_tc_fast_learn (the host-side veth's tc egress) run
// through BPF_PROG_RUN on arbitrary frames, in the setups the planners
// build with the fast path on, each run checked against the reference
// (refFastEntry, reference_test.go). An input is the setup, the fast
// path's state (fastState), whether the checksums are made right first
// (the outer ones as fuzzInput does, and the inner IPv4 header's, which
// the fast path checks too) and the frame.
//
// steer_tc_fast meets the frame with an entry for the reference's flow
// whose outer facts are the frame's (unless the state says otherwise), so
// that its whole way to the container is taken where the reference says
// the kernel's path delivers: then the verdict is TC_ACT_REDIRECT and the
// bytes are the reference's, else TC_ACT_UNSPEC and the frame untouched.
// bpf_redirect_peer's verdict does not depend on its device under
// BPF_PROG_RUN (the redirect is done after the program, by the hook), so
// the entries name a veth that does not exist.
//
// steer_tc_fast_learn meets the frame (and its inner frame, at a VXLAN
// frame's offset) with a note for the reference's flow, or none: it never
// changes a byte, always hands the frame on, and makes the entry the
// reference says, only from a note that describes the same packet.

// fuzzVeth is the ifindex of the host-side veth the fast fuzzer's entries
// deliver to: no device's.
const fuzzVeth = 0x7ffffff0

// fastState is the fast path's state for one input.
type fastState struct {
	life     int  // lifeLive, or what ends the lease or the entry
	gso      bool // the skb stands for GSO segments
	none     bool // no entry (for the learner: no note)
	other    int  // 0: the entry has the frame's outer facts; 1-6 one of them another (fastEntryFor, noteFor)
	routed   bool // the entry's path is routed: the router's MACs, one hop off the TTL
	mtu      int  // the path's MTU: 0 1500, 2 the frame's inner length, 3 one less (at least 68)
	rawInner bool // the inner IPv4 checksum is left as the frame has it
}

// fastState.life's values.
const (
	lifeLive       = iota
	lifeNoLease    // no lease
	lifeOtherLease // a lease under another change count
	lifeMoved      // a change counted since the entry was made (the note taken)
	lifeIdle       // the entry unused past the idle timeout
)

// fastStateOf decodes an input's state so that most inputs meet a live
// entry with their outer facts: bits 0-3 the life (9-12 lifeNoLease to
// lifeIdle, 13 GSO, 14-15 none; the rest live), 4-7 the other fact (1-6;
// the rest none), 8 routed, 9-10 the MTU (0 and 1 1500, 2 the frame's
// inner length, 3 one less), 11-12 both set: the inner checksum raw.
func fastStateOf(b uint16) fastState {
	s := fastState{routed: b&0x100 != 0, mtu: int(b>>9) & 3, rawInner: b&0x1800 == 0x1800}
	switch end := int(b & 15); {
	case end >= 9 && end <= 12:
		s.life = end - 8
	case end == 13:
		s.gso = true
	case end >= 14:
		s.none = true
	}
	if o := int(b>>4) & 15; o <= 6 {
		s.other = o
	}
	if s.mtu == 1 {
		s.mtu = 0
	}
	return s
}

// fastCases are the planned setups with the fast path on.
func fastCases(t *testing.T) []*fuzzCase {
	t.Helper()
	var out []*fuzzCase
	for _, c := range plannedCases(t) {
		if c.Setup.Config.Fast {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		t.Fatal("premise: no planner builds a datapath with the fast path on")
	}
	return out
}

// fixInner makes the inner IPv4 header checksum of a VXLAN frame right
// (before fixChecksums makes the outer UDP checksum cover it).
func fixInner(frame []byte) []byte {
	const off = fastOuterLen + ethHeaderLen
	if len(frame) < off+20 || binary.BigEndian.Uint16(frame[fastOuterLen+12:]) != ethIPv4 {
		return frame
	}
	frame = bytes.Clone(frame)
	ip := frame[off:]
	if hlen := int(ip[0]&0x0f) * 4; hlen >= 20 && hlen <= len(ip) {
		binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip[:hlen]))
	}
	return frame
}

// FuzzSteerFast checks the fast path's programs against the reference on
// arbitrary frames.
func FuzzSteerFast(f *testing.F) {
	addFastSeeds(f)
	f.Fuzz(func(t *testing.T, setup uint8, state uint16, fix bool, frame []byte) {
		s := fastStateOf(state)
		if fix && !s.rawInner {
			frame = fixInner(frame)
		}
		if frame = fuzzInput(fix, frame); frame == nil {
			return
		}
		cases := fastCases(t)
		c, _, done := cases[int(setup)%len(cases)].use(t, fuzzState{})
		defer done()
		checkFast(t, c, s, frame)
		checkFastLearn(t, c, s, frame)
		if len(frame) >= fastOuterLen+ethHeaderLen {
			checkFastLearn(t, c, s, frame[fastOuterLen:])
			checkFastVX(t, c, s, frame[fastOuterLen:])
		}
	})
}

// addFastSeeds adds every seed frame, with its checksums made right,
// over the setups, in turn bridged and routed with a live entry of its
// outer facts (where the way to the container is longest) and in one of
// the other states.
func addFastSeeds(f *testing.F) {
	for i, frame := range seedFrames() {
		state := uint16(i * 7)
		if i%3 != 2 {
			state = uint16(i%2) << 8
		}
		f.Add(uint8(i), state, true, frame)
	}
}

// runFast runs p on frame as an skb that came in on in and goes out on
// lo (for the learner, the veth), with gso standing for GSO segments. It
// says false for an input BPF_PROG_RUN refuses: one whose ethertype
// promises a network header it does not hold, which no device hands on.
func runFast(t *testing.T, p *ebpf.Program, frame []byte, in uint32, gso bool) (uint32, []byte, bool) {
	t.Helper()
	var ctx skbCtx
	binary.NativeEndian.PutUint32(ctx[skbIngressIfindexOff:], in)
	binary.NativeEndian.PutUint32(ctx[skbIfindexOff:], loIfindex)
	if gso {
		binary.NativeEndian.PutUint32(ctx[skbGSOSegsOff:], 2)
		binary.NativeEndian.PutUint32(ctx[skbGSOSizeOff:], 1400)
	}
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx}
	ret, err := p.Run(&opts)
	if errors.Is(err, unix.EINVAL) {
		return 0, nil, false
	}
	if err != nil {
		t.Fatalf("running %s on %d bytes: %v", p, len(frame), err)
	}
	return ret, opts.DataOut, true
}

// fastReset puts d's fast path in state s with no entry and no note: the
// test frames' path (the VXLAN device vxIfindex to lo, within mtu, lo
// left out when s.other says the veth is not vouched for), the change
// count 0, the lease s.life says.
func fastReset(t *testing.T, d *Datapath, s fastState, mtu uint32, vouched bool) {
	t.Helper()
	path := FastPath{VXLANs: []FastVXLAN{{Ifindex: vxIfindex, VNI: testVNI}}}
	if vouched {
		path.Veths = []FastVeth{{Ifindex: loIfindex, MTU: mtu, MAC: innerMAC}}
	}
	lease := steerFastLease{Deadline: uint64(Now() + time.Hour)}
	switch s.life {
	case lifeNoLease:
		lease.Deadline = 0
	case lifeOtherLease:
		lease.Changes = 1
	}
	if _, err := d.Fast().SetPath(path); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Fast().Flush(); err != nil {
		t.Fatal(err)
	}
	// No frame of an earlier input in flight: each input's frame is the
	// first of its flow since the container saw the last.
	if _, err := clearMap[steerFastKey, steerFastFlight](d.objs.SteerFastFlight); err != nil {
		t.Fatal(err)
	}
	if err := d.objs.SteerChanges.Put(uint32(0), uint64(0)); err != nil {
		t.Fatal(err)
	}
	if err := d.objs.SteerFastLease.Put(uint32(0), lease); err != nil {
		t.Fatal(err)
	}
}

// fastEntryFor is the entry s gives the reference's flow (r) of frame:
// the frame's outer facts, one of them another if s.other says so, the
// path's MACs, TTL and MTU as s says.
func fastEntryFor(r refFrame, frame []byte, s fastState) refFastEntry {
	e := refFastEntry{
		vni: r.vni, tuple: r.tuple, underlay: ulIfindex,
		vtepSrc: netip.AddrFrom4([4]byte(frame[ethHeaderLen+12:])), vtepDst: netip.AddrFrom4([4]byte(frame[ethHeaderLen+16:])),
		outerDMAC: bytes.Clone(frame[0:6]), inDMAC: bytes.Clone(frame[50:56]), inSMAC: bytes.Clone(frame[56:62]),
		ifindex: fuzzVeth, mtu: fastMTU(s, frame[fastOuterLen:]),
	}
	return e.in(s)
}

// in is e on the path s says: the path's MACs and TTL (routed, or e's
// inner MACs), one of its facts another if s.other says so.
func (e refFastEntry) in(s fastState) refFastEntry {
	e.dmac, e.smac = e.inDMAC, e.inSMAC
	if s.routed {
		e.dmac, e.smac, e.ttlDec = innerMAC, bridgeMAC, routedTTLTaken
	}
	switch s.other {
	case 1:
		e.underlay++
	case 2:
		e.vtepSrc = netip.MustParseAddr("192.0.2.9")
	case 3:
		e.vtepDst = netip.MustParseAddr("192.0.2.10")
	case 4:
		e.outerDMAC = otherMAC
	case 5:
		e.inDMAC = otherMAC
	case 6:
		e.inSMAC = otherMAC
	}
	return e
}

// fastMTU is the path's MTU s gives an inner frame.
func fastMTU(s fastState, inner []byte) int {
	ilen := fastTestMTU
	if len(inner) >= ethHeaderLen+4 {
		ilen = int(binary.BigEndian.Uint16(inner[ethHeaderLen+2:]))
	}
	switch s.mtu {
	case 2:
		return max(ilen, 68)
	case 3:
		return max(ilen-1, 68)
	}
	return fastTestMTU
}

// plant writes e, live unless s.life says otherwise (idle: the datapath's
// idle timeout).
func plant(t *testing.T, d *Datapath, e refFastEntry, s fastState, idle time.Duration) {
	t.Helper()
	k := steerFastKey{Vni: e.vni, Saddr: be32(e.tuple.src), Daddr: be32(e.tuple.dst), Sport: htons(e.tuple.sport), Dport: htons(e.tuple.dport), Proto: e.tuple.proto}
	v := steerFastEntry{Ifindex: e.ifindex, Underlay: e.underlay, VtepSrc: be32(e.vtepSrc), VtepDst: be32(e.vtepDst),
		TtlDec: e.ttlDec, Mtu: uint32(e.mtu), Last: uint64(Now())}
	copy(v.OuterDmac[:], e.outerDMAC)
	copy(v.InDmac[:], e.inDMAC)
	copy(v.InSmac[:], e.inSMAC)
	copy(v.Dmac[:], e.dmac)
	copy(v.Smac[:], e.smac)
	switch s.life {
	case lifeMoved:
		v.Changes = 1
	case lifeIdle:
		if Now() < 2*idle {
			t.Fatalf("premise: the clock (%v) past twice the idle timeout (%v)", Now(), idle)
		}
		v.Last = 1
	}
	if err := d.objs.SteerFast.Put(k, v); err != nil {
		t.Fatal(err)
	}
	// The entry's veth, vouched for as it was at admission.
	dev := steerFastDev{Mtu: uint32(e.mtu)}
	copy(dev.Mac[:], e.dmac)
	if err := d.objs.SteerFastDev.Put(uint32(e.ifindex), dev); err != nil {
		t.Fatal(err)
	}
}

// checkFast runs steer_tc_fast once on frame in state s and checks it
// against the reference.
func checkFast(t *testing.T, c *fuzzCase, s fastState, frame []byte) {
	t.Helper()
	d, cfg := c.d, c.Setup.Config
	in := bytes.Clone(frame)
	fastReset(t, d, s, fastTestMTU, true)
	var want []byte
	deliver := false
	if r := refOuter(frame, uint16(cfg.VXLANPort), cfg.VNIs); r.inner && !s.none {
		e := fastEntryFor(r, frame, s)
		if e.learnable(uint16(cfg.VXLANPort)) {
			plant(t, d, e, s, cfg.FastIdle)
			want, deliver = e.delivers(ulIfindex, frame, uint16(cfg.VXLANPort), cfg.VNIs)
			deliver = deliver && s.life == lifeLive && !s.gso
		}
	}
	checkEntryRun(t, d, d.TCFast(), ulIfindex, s, in, want, deliver)
}

// checkEntryRun runs the fast path's entry p once on in, received on
// ifindex in state s, and wants it delivered as want where the reference
// delivers (deliver), else handed to the kernel's path untouched.
func checkEntryRun(t *testing.T, d *Datapath, p *ebpf.Program, ifindex uint32, s fastState, in, want []byte, deliver bool) {
	t.Helper()
	hits := stats(t, d)[StageSplit].Fast
	ret, out, ran := runFast(t, p, in, ifindex, s.gso)
	if !ran {
		return
	}
	hits = stats(t, d)[StageSplit].Fast - hits
	switch {
	case deliver && (ret != tcRedirect || !bytes.Equal(out, want) || hits != 1):
		t.Fatalf("%s (state %+v): verdict %#x, %d hits, for a frame the kernel's path delivers\n in: %x\nout: %x\nwant: %x", p, s, ret, hits, in, out, want)
	case !deliver && (ret != tcUnspec || !bytes.Equal(out, in) || hits != 0):
		t.Fatalf("%s (state %+v): verdict %#x, %d hits, bytes changed %v: want the kernel's path, untouched\n in: %x\nout: %x", p, s, ret, hits, !bytes.Equal(out, in), in, out)
	}
}

// vxDelivers is what the kernel's path from the VXLAN device (its bridge,
// or its routing, and the veth) delivers of the inner frame b to entry
// e's container in state s, where the reference parses b's flow: nothing
// unless the lease and the entry live, the frame comes on the entry's
// device with its MACs, has an IPv4 header without options, its checksum
// and total length right, a TTL the path does not expire, no more than
// the MTU unless GSO, and is no TCP FIN or RST; else the frame with the
// path's MACs and TTL (ip_decrease_ttl's checksum).
func vxDelivers(b []byte, e refFastEntry, s fastState) ([]byte, bool) {
	ip := b[ethHeaderLen:]
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	fin := ip[9] == protoTCP && len(ip) > 33 && ip[33]&0x05 != 0
	if s.life != lifeLive || e.underlay != vxIfindex || !bytes.Equal(b[0:6], e.inDMAC) || !bytes.Equal(b[6:12], e.inSMAC) ||
		ip[0]&0x0f != 5 || !ipv4HeaderOK(ip[:20]) || tot != len(b)-ethHeaderLen || ip[8] <= e.ttlDec ||
		(!s.gso && tot > e.mtu) || fin {
		return nil, false
	}
	out := bytes.Clone(b)
	copy(out[0:], e.dmac)
	copy(out[6:], e.smac)
	if e.ttlDec > 0 {
		oip := out[ethHeaderLen:]
		check := uint32(binary.BigEndian.Uint16(oip[10:])) + 0x0100
		if check >= 0xffff {
			check++
		}
		binary.BigEndian.PutUint16(oip[10:], uint16(check))
		oip[8]--
	}
	return out, true
}

// checkFastVX runs steer_tc_fast_vx once on the inner frame b in state s,
// with an entry of the reference's flow whose facts are b's (but for what
// s.other changes: 1 the device, 5 and 6 a MAC; 2-4 are outer facts,
// which the kernel checked before the VXLAN device and the program does
// not), and checks it against the reference.
func checkFastVX(t *testing.T, c *fuzzCase, s fastState, b []byte) {
	t.Helper()
	d := c.d
	in := bytes.Clone(b)
	fastReset(t, d, s, fastTestMTU, true)
	var want []byte
	deliver := false
	if tuple, ok := refInner(b); ok && !s.none {
		// No outer facts: the VTEPs are none (0.0.0.0), the outer MAC
		// zero, as a note at the VXLAN device leaves them.
		e := refFastEntry{vni: testVNI, tuple: tuple, underlay: vxIfindex, vtepSrc: netip.IPv4Unspecified(), vtepDst: netip.IPv4Unspecified(),
			outerDMAC: make([]byte, 6), inDMAC: bytes.Clone(b[0:6]), inSMAC: bytes.Clone(b[6:12]), ifindex: fuzzVeth, mtu: fastMTU(s, b)}.in(s)
		plant(t, d, e, s, c.Setup.Config.FastIdle)
		want, deliver = vxDelivers(b, e, s)
		deliver = deliver && !(s.gso && c.Setup.Config.FastNoGSO)
	}
	checkEntryRun(t, d, d.TCFastVX(), vxIfindex, s, in, want, deliver)
}

// noteFor is the note the learner meets: for the reference's flow t, of
// the packet whose IPv4 header is ip (its id, total length, TTL with the
// path's hop added), but for what s.other changes (1 the id, 2 the total
// length, 3 two hops more, 4 too old), under another change count when
// s.life says one was counted.
func noteFor(t refTuple, ip []byte, s fastState) (steerFastKey, steerFastNote) {
	k := steerFastKey{Vni: testVNI, Saddr: be32(t.src), Daddr: be32(t.dst), Sport: htons(t.sport), Dport: htons(t.dport), Proto: t.proto}
	n := steerFastNote{VtepSrc: be32(outerSrc), VtepDst: be32(outerDst), Ttl: ip[8], Underlay: ulIfindex,
		Id: binary.NativeEndian.Uint16(ip[4:]), TotLen: binary.NativeEndian.Uint16(ip[2:]), At: uint64(Now())}
	copy(n.OuterDmac[:], underlayMAC)
	copy(n.InDmac[:], innerMAC)
	copy(n.InSmac[:], remoteMAC)
	if s.routed {
		n.Ttl += routedTTLTaken
	}
	switch s.other {
	case 1:
		n.Id++
	case 2:
		n.TotLen++
	case 3:
		n.Ttl += 2
	case 4:
		n.At = uint64(Now() - 2*time.Second)
	}
	if s.life == lifeMoved {
		n.Changes = 1
	}
	return k, n
}

// learnIn is the device the learner's frame came in on in state s: the
// VXLAN device, or (s.other 5) another; learnVouched says whether lanes
// agent vouches for the veth (not with s.other 6).
func learnIn(s fastState) uint32 {
	if s.other == 5 {
		return vxIfindex + 1
	}
	return vxIfindex
}

func learnVouched(s fastState) bool { return s.other != 6 }

// learns is the entry the learner must make from frame (an inner frame
// at the veth's egress, whose flow the reference parses, with IPv4 at
// ip) and note n: one only where the lease holds, the frame came from a
// VXLAN device to a veth lanes vouches for, for its container's MAC, is
// the packet the note describes (id, total length, a TTL the path took 0
// or 1 off, within a second, under the same change count), has no IPv4
// options and is no TCP FIN or RST.
func learns(frame, ip []byte, n steerFastNote, s fastState, mtu uint32) (steerFastEntry, bool) {
	fin := ip[9] == protoTCP && len(ip) > 33 && ip[33]&0x05 != 0
	ttl := ip[8]
	if s.life == lifeNoLease || s.life == lifeOtherLease || learnIn(s) != vxIfindex || !learnVouched(s) || s.other == 4 ||
		n.Changes != 0 || ip[0]&0x0f != 5 || fin || !bytes.Equal(frame[0:6], innerMAC) ||
		n.Id != binary.NativeEndian.Uint16(ip[4:]) || n.TotLen != binary.NativeEndian.Uint16(ip[2:]) || n.Ttl < ttl || n.Ttl-ttl > 1 {
		return steerFastEntry{}, false
	}
	e := steerFastEntry{Ifindex: loIfindex, Underlay: n.Underlay, VtepSrc: n.VtepSrc, VtepDst: n.VtepDst,
		OuterDmac: n.OuterDmac, InDmac: n.InDmac, InSmac: n.InSmac, TtlDec: n.Ttl - ttl, Mtu: mtu, Changes: n.Changes}
	copy(e.Dmac[:], frame[0:6])
	copy(e.Smac[:], frame[6:12])
	return e, true
}

// checkFastLearn runs steer_tc_fast_learn once on frame, at the veth's
// egress, in state s and checks it against the reference.
func checkFastLearn(t *testing.T, c *fuzzCase, s fastState, frame []byte) {
	t.Helper()
	d := c.d
	in := bytes.Clone(frame)
	mtu := uint32(fastMTU(s, frame))
	fastReset(t, d, s, mtu, learnVouched(s))
	var key steerFastKey
	var want steerFastEntry
	learn := false
	tuple, ok := refInner(frame)
	if ok && !s.none {
		ip := frame[ethHeaderLen:]
		var n steerFastNote
		key, n = noteFor(tuple, ip, s)
		if err := d.objs.SteerFastNotes.Put(key, n); err != nil {
			t.Fatal(err)
		}
		want, learn = learns(frame, ip, n, s, mtu)
	}
	ret, out, ran := runFast(t, d.TCFastLearn(), frame, learnIn(s), false)
	if !ran {
		return
	}
	if ret != tcUnspec || !bytes.Equal(out, in) {
		t.Fatalf("steer_tc_fast_learn (state %+v): verdict %#x, bytes changed %v: want the frame handed on untouched\n in: %x\nout: %x", s, ret, !bytes.Equal(out, in), in, out)
	}
	var k steerFastKey
	var got steerFastEntry
	entries := 0
	for it := d.objs.SteerFast.Iterate(); it.Next(&k, &got); {
		entries++
	}
	switch {
	case !learn && entries != 0:
		t.Fatalf("steer_tc_fast_learn (state %+v, note %v): made an entry %+v of a frame the reference learns nothing from\n in: %x", s, ok && !s.none, got, in)
	case learn && (entries != 1 || k != key):
		t.Fatalf("steer_tc_fast_learn (state %+v): %d entries (%+v), want the reference's flow's %+v\n in: %x", s, entries, k, key, in)
	case learn:
		got.Last = 0
		if got != want {
			t.Fatalf("steer_tc_fast_learn (state %+v): entry %+v, want %+v\n in: %x", s, got, want, in)
		}
		var note steerFastNote
		if err := d.objs.SteerFastNotes.Lookup(key, &note); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatalf("steer_tc_fast_learn (state %+v): the note outlived its entry (%v)\n in: %x", s, err, in)
		}
	}
}

// The fast path's reference agrees with the fast path's own tests
// (fast_test.go) on the frames they build: a sanity check that runs
// without root.
func TestFastReference(t *testing.T) {
	s := frameSpec{flow: udpFlow(40000), payload: 100, udpCsumRight: true}
	frame := vxlanFrame(s)
	r := refOuter(frame, testPort, []uint32{testVNI})
	for _, routed := range []bool{false, true} {
		e := fastEntryFor(r, frame, fastState{routed: routed})
		got, ok := e.delivers(ulIfindex, frame, testPort, []uint32{testVNI})
		if want := delivered(s, e.dmac, e.smac, e.ttlDec); !e.learnable(testPort) || !ok || !bytes.Equal(got, want) {
			t.Errorf("routed %v: learnable %v, delivers %v\n got: %x\nwant: %x", routed, e.learnable(testPort), ok, got, want)
		}
	}
	e := fastEntryFor(r, frame, fastState{})
	with := func(f func(*frameSpec)) []byte {
		c := s
		f(&c)
		return vxlanFrame(c)
	}
	ttl0 := bytes.Clone(frame)
	ttl0[fastOuterLen+ethHeaderLen+8] = 0
	ttl0 = fixInner(ttl0)
	fixChecksums(ttl0)
	for name, f := range map[string][]byte{
		"another flow":           with(func(c *frameSpec) { c.flow = udpFlow(40001) }),
		"another inner MAC":      with(func(c *frameSpec) { c.innerSrcMAC = otherMAC }),
		"bad inner IP checksum":  with(func(c *frameSpec) { c.innerIP.badCsum = true }),
		"bad outer UDP checksum": with(func(c *frameSpec) { c.udpCsum = 1 }),
		"inner IP options":       with(func(c *frameSpec) { c.innerIP.ihl = 6 }),
		"trailing bytes":         with(func(c *frameSpec) { c.trailer = 4 }),
		"reserved VXLAN flag":    with(func(c *frameSpec) { c.vxFlags = 0x1 }),
		"outer CE on Not-ECT":    with(func(c *frameSpec) { c.outerIP.tos = 3 }),
		"longer than the MTU":    with(func(c *frameSpec) { c.payload = fastTestMTU }),
		"TTL 0 bridged":          ttl0,
	} {
		if _, ok := e.delivers(ulIfindex, f, testPort, []uint32{testVNI}); ok {
			t.Errorf("%s: the reference delivers it", name)
		}
	}
	if other := fastEntryFor(r, frame, fastState{other: 6}); !other.learnable(testPort) {
		t.Error("an entry with another container's MAC is not learnable")
	}
	if bad := fastEntryFor(r, vxlanFrame(frameSpec{flow: s.flow, innerSrcMAC: []byte{1, 0, 0, 0, 0, 1}}), fastState{}); bad.learnable(testPort) {
		t.Error("an entry with a multicast inner source MAC is learnable: vxlan_set_mac drops its frames")
	}
}
