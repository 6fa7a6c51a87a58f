//go:build linux

package steer

import (
	"encoding/binary"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// The fast path under BPF_PROG_RUN: the underlay's tc ingress
// (steer_tc_fast) sees the VXLAN frame, the host-side veth's tc egress
// (steer_tc_fast_learn) the inner frame the kernel's path delivered; lo
// (the test namespace's only device) stands for that veth, and the
// underlay and the VXLAN device are the ifindexes the skb says it came in
// on (ulIfindex, vxIfindex), which need no device.

const (
	tcRedirect = 7 // TC_ACT_REDIRECT: bpf_redirect_peer's verdict
	tcShot     = 2

	ulIfindex = 7
	vxIfindex = 100

	skbIfindexOff  = 40
	skbGSOSizeOff  = 176
	fastTestMTU    = 1500
	routedTTLTaken = 1
	// fastOuterLen is bpf/outer.h's OUTER_LEN: outer Ethernet, IPv4, UDP,
	// VXLAN (TestConstsMatchC).
	fastOuterLen = 50
)

var (
	// bridgeMAC is the source MAC a routed path (Flannel's cni0) writes.
	bridgeMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xb}
	// otherMAC is a container's MAC the test frames are not for.
	otherMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x9}
)

// fastDatapath loads the fast path with lanes agent's word for the test
// frames' path: VXLAN device vxIfindex (VNI testVNI) to lo, whose
// container has innerMAC, within mtu, for an hour.
func fastDatapath(t *testing.T, idle time.Duration, mtu uint32) *Datapath {
	t.Helper()
	d, cores := newDatapath(t)
	if err := d.SetConfig(Config{Enabled: true, CPUs: cores, Flowlet: time.Hour, VXLANPort: testPort, VNIs: []uint32{testVNI, testVNI + 1}, Fast: true, FastIdle: idle}); err != nil {
		t.Fatal(err)
	}
	path := FastPath{VXLANs: []FastVXLAN{{Ifindex: vxIfindex, VNI: testVNI}}, Veths: []FastVeth{{Ifindex: loIfindex, MTU: mtu, MAC: innerMAC}}}
	if changed, err := d.Fast().SetPath(path); err != nil || !changed {
		t.Fatalf("SetPath: changed %v, %v", changed, err)
	}
	if err := d.Fast().Renew(time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	return d
}

// fastDatapathNoDrain is fastDatapath's with a drain time of an hour: a
// count of frames in flight never lapses within a test.
func fastDatapathNoDrain(t *testing.T) *Datapath {
	t.Helper()
	d := fastDatapath(t, time.Hour, fastTestMTU)
	cfg, err := d.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Drain = time.Hour
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return d
}

// fastRun runs p on frame as an skb received on in (skb->ingress_ifindex)
// and, with gsoSize, standing for two segments.
func fastRun(t *testing.T, p *ebpf.Program, frame []byte, in uint32, gsoSize uint32) (uint32, []byte) {
	t.Helper()
	var ctx skbCtx
	binary.NativeEndian.PutUint32(ctx[skbIngressIfindexOff:], in)
	binary.NativeEndian.PutUint32(ctx[skbIfindexOff:], loIfindex)
	if gsoSize > 0 {
		binary.NativeEndian.PutUint32(ctx[skbGSOSegsOff:], 2)
		binary.NativeEndian.PutUint32(ctx[skbGSOSizeOff:], gsoSize)
	}
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx}
	ret, err := p.Run(&opts)
	if err != nil {
		t.Fatalf("running %s on %d bytes: %v", p, len(frame), err)
	}
	return ret, opts.DataOut
}

// delivered is the inner frame of s as the kernel's path leaves it: with
// the MACs dst and src and ttlDec taken off its TTL (checksum updated).
func delivered(s frameSpec, dst, src net.HardwareAddr, ttlDec uint8) []byte {
	b := innerFrame(s)
	copy(b[0:], dst)
	copy(b[6:], src)
	ip := b[ethHeaderLen:]
	ip[8] -= ttlDec
	binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip[:20]))
	return b
}

// learn runs one frame of s the kernel's path takes, as the fast path
// sees it at the underlay's ingress (noted) and at the veth's egress
// (admitted), with the MACs and TTL the path gave it there.
func learn(t *testing.T, d *Datapath, s frameSpec, dst, src net.HardwareAddr, ttlDec uint8) {
	t.Helper()
	learnVia(t, d, d.TCFast(), fastFrame(s), ulIfindex, delivered(s, dst, src, ttlDec))
}

// learnVia runs frame, received on in, through the fast path's entry p
// (noted, handed on untouched), then leaving, the same packet as the
// kernel's path delivers it, through the veth's egress (admitted).
func learnVia(t *testing.T, d *Datapath, p *ebpf.Program, frame []byte, in uint32, leaving []byte) {
	t.Helper()
	before := stats(t, d)[StageSplit]
	ret, out := fastRun(t, p, frame, in, 0)
	if ret != tcUnspec {
		t.Fatalf("premise: a frame without entry: verdict %d, want the kernel's path", ret)
	}
	sameBytes(t, "noted frame", frame, out)
	if ret, _ := fastRun(t, d.TCFastLearn(), leaving, vxIfindex, 0); ret != tcUnspec {
		t.Fatalf("learning: verdict %d, want the frame to go on", ret)
	}
	if st := stats(t, d)[StageSplit].Sub(before); st.FastNoEntry != 1 || st.FastAdmitted != 1 {
		t.Fatalf("premise: learning gave counters %+v, want one miss for no entry and one entry admitted", st)
	}
}

// fastHit runs s's frame through the ingress and wants it decapsulated,
// byte for byte want, and redirected.
func fastHit(t *testing.T, d *Datapath, s frameSpec, want []byte) {
	t.Helper()
	hitVia(t, d, d.TCFast(), fastFrame(s), ulIfindex, 0, want)
}

// hitVia runs frame, received on in (standing for two segments of gsoSize,
// if given), through the fast path's entry p and wants it redirected, its
// bytes want, counted once.
func hitVia(t *testing.T, d *Datapath, p *ebpf.Program, frame []byte, in, gsoSize uint32, want []byte) {
	t.Helper()
	before := stats(t, d)[StageSplit].Fast
	ret, out := fastRun(t, p, frame, in, gsoSize)
	if ret != tcRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT (counters %+v)", ret, stats(t, d)[StageSplit])
	}
	if !slices.Equal(out, want) {
		t.Errorf("delivered frame\n got: %x\nwant: %x", out, want)
	}
	if n := stats(t, d)[StageSplit].Fast - before; n != 1 {
		t.Errorf("%d hits counted, want 1", n)
	}
}

// A flow's frame that the kernel's path took teaches the fast path where
// it went; the next frame goes there directly, exactly as the path would
// have delivered it: on a bridged path with the MACs and TTL as they
// were, on a routed one with the router's MACs and one hop less (checksum
// updated), ECN as RFC 6040 decapsulates it.
func TestFastLearnsThenHits(t *testing.T) {
	for _, c := range []struct {
		name     string
		dst, src net.HardwareAddr
		ttlDec   uint8
	}{
		{"bridged", innerMAC, remoteMAC, 0},
		{"routed", innerMAC, bridgeMAC, routedTTLTaken},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := fastDatapath(t, time.Hour, fastTestMTU)
			s := frameSpec{flow: udpFlow(40000), payload: 100, udpCsumRight: true}
			learn(t, d, s, c.dst, c.src, c.ttlDec)
			es, err := d.Fast().Entries()
			if err != nil || len(es) != 1 || es[0].Ifindex != loIfindex || es[0].TTLDec != c.ttlDec || es[0].VTEPSrc != outerSrc || es[0].MTU != fastTestMTU {
				t.Fatalf("entries %+v (%v), want the flow's to lo, TTL taken %d", es, err, c.ttlDec)
			}
			fastHit(t, d, s, delivered(s, c.dst, c.src, c.ttlDec))
			// ECN: outer CE onto an ECT(0) inner packet marks it CE.
			ecn := s
			ecn.outerIP.tos, ecn.innerIP.tos = 3, 2
			want := ecn
			want.innerIP.tos = 3
			fastHit(t, d, ecn, delivered(want, c.dst, c.src, c.ttlDec))
			// No outer UDP checksum is none to check.
			none := s
			none.udpCsumRight = false
			fastHit(t, d, none, delivered(none, c.dst, c.src, c.ttlDec))
		})
	}
}

// Every frame the fast path cannot vouch for takes the kernel's path,
// untouched, counted by reason; an entry that can never hold again is
// deleted.
func TestFastMisses(t *testing.T) {
	s := frameSpec{flow: udpFlow(40000), payload: 100, udpCsumRight: true}
	with := func(f func(*frameSpec)) []byte {
		c := s
		f(&c)
		return fastFrame(c)
	}
	otherSrc := fastFrame(s)
	copy(otherSrc[ethHeaderLen+12:], []byte{192, 0, 2, 9})
	binary.BigEndian.PutUint16(otherSrc[ethHeaderLen+10:], ipv4Checksum(otherSrc[ethHeaderLen:ethHeaderLen+20]))
	for _, c := range []struct {
		name  string
		frame []byte
		gso   uint32
		want  func(Counters) uint64
	}{
		{"another flow", with(func(c *frameSpec) { c.flow = udpFlow(40001) }), 0, func(c Counters) uint64 { return c.FastNoEntry }},
		{"another VNI", with(func(c *frameSpec) { c.vni = testVNI + 1 }), 0, func(c Counters) uint64 { return c.FastNoEntry }},
		{"another outer source", otherSrc, 0, func(c Counters) uint64 { return c.FastOther }},
		{"another underlay MAC", with(func(c *frameSpec) { c.outerDstMAC = otherMAC }), 0, func(c Counters) uint64 { return c.FastOther }},
		{"another inner source MAC", with(func(c *frameSpec) { c.innerSrcMAC = otherMAC }), 0, func(c Counters) uint64 { return c.FastOther }},
		{"bad outer IP checksum", with(func(c *frameSpec) { c.outerIP.badCsum = true }), 0, func(c Counters) uint64 { return c.FastRefused }},
		{"bad inner IP checksum", with(func(c *frameSpec) { c.innerIP.badCsum = true }), 0, func(c Counters) uint64 { return c.FastRefused }},
		{"bad outer UDP checksum", with(func(c *frameSpec) { c.udpCsum = 1 }), 0, func(c Counters) uint64 { return c.FastRefused }},
		{"inner IP options", with(func(c *frameSpec) { c.innerIP.ihl = 6 }), 0, func(c Counters) uint64 { return c.FastRefused }},
		{"outer IP options", with(func(c *frameSpec) { c.outerIP.ihl = 6 }), 0, func(c Counters) uint64 { return c.Passed }},
		{"a fragment", with(func(c *frameSpec) { c.innerIP.frag = 0x2000 }), 0, func(c Counters) uint64 { return c.Passed }},
		{"trailing bytes", with(func(c *frameSpec) { c.trailer = 4 }), 0, func(c Counters) uint64 { return c.FastRefused }},
		{"reserved VXLAN flag", with(func(c *frameSpec) { c.vxFlags = 0x1 }), 0, func(c Counters) uint64 { return c.FastRefused }},
		{"outer CE on Not-ECT", with(func(c *frameSpec) { c.outerIP.tos = 3 }), 0, func(c Counters) uint64 { return c.FastRefused }},
		{"longer than the MTU", with(func(c *frameSpec) { c.payload = fastTestMTU }), 0, func(c Counters) uint64 { return c.FastRefused }},
		{"GSO", fastFrame(s), 1400, func(c Counters) uint64 { return c.FastGSO }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := fastDatapath(t, time.Hour, fastTestMTU)
			learn(t, d, s, innerMAC, remoteMAC, 0)
			missVia(t, d, d.TCFast(), c.frame, ulIfindex, c.gso, c.name, c.want)
			// The entry stays for the flow's next good frame.
			fastHit(t, d, s, delivered(s, innerMAC, remoteMAC, 0))
		})
	}
}

// missVia runs frame, received on in (standing for two segments of
// gsoSize, if given), through the fast path's entry p and wants it handed
// to the kernel's path untouched, counted once by want's reason.
func missVia(t *testing.T, d *Datapath, p *ebpf.Program, frame []byte, in, gsoSize uint32, name string, want func(Counters) uint64) {
	t.Helper()
	before := stats(t, d)[StageSplit]
	ret, out := fastRun(t, p, frame, in, gsoSize)
	if ret != tcUnspec {
		t.Errorf("verdict %d, want the kernel's path", ret)
	}
	sameBytes(t, name, frame, out)
	if st := stats(t, d)[StageSplit].Sub(before); want(st) != 1 || st.Fast != 0 {
		t.Errorf("counters %+v: want one miss of this reason, no hit", st)
	}
}

// A routed path's entry refuses a frame whose TTL the router would expire.
func TestFastRoutedTTLExpires(t *testing.T) {
	d := fastDatapath(t, time.Hour, fastTestMTU)
	s := frameSpec{flow: udpFlow(40000), payload: 100}
	learn(t, d, s, innerMAC, bridgeMAC, routedTTLTaken)
	frame := fastFrame(s)
	ip := frame[fastOuterLen+ethHeaderLen:]
	ip[8] = 1
	binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip[:20]))
	ret, out := fastRun(t, d.TCFast(), frame, ulIfindex, 0)
	sameBytes(t, "TTL 1", frame, out)
	if st := stats(t, d)[StageSplit]; ret != tcUnspec || st.FastRefused != 1 {
		t.Errorf("verdict %d, counters %+v: want the kernel's path, refused", ret, st)
	}
}

// What teaches nothing at the veth's egress: a frame without a note of
// the same packet, one for another container's MAC (flooded), one from
// outside the overlay, one to a veth the agent does not vouch for.
func TestFastLearnsOnlyFromTheSamePacket(t *testing.T) {
	s := frameSpec{flow: udpFlow(40000), payload: 100}
	for _, c := range []struct {
		name      string
		note      bool
		frame     []byte
		in        uint32
		unlearned uint64
		unvouched bool
	}{
		{"no note", false, delivered(s, innerMAC, remoteMAC, 0), vxIfindex, 1, false},
		{"another packet", true, delivered(frameSpec{flow: s.flow, payload: 101}, innerMAC, remoteMAC, 0), vxIfindex, 1, false},
		{"flooded to another container", true, delivered(s, otherMAC, remoteMAC, 0), vxIfindex, 1, false},
		{"two hops", true, delivered(s, innerMAC, remoteMAC, 2), vxIfindex, 1, false},
		{"not from the VXLAN device", true, delivered(s, innerMAC, remoteMAC, 0), vxIfindex + 1, 0, false},
		{"a veth not vouched for", true, delivered(s, innerMAC, remoteMAC, 0), vxIfindex, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := fastDatapath(t, time.Hour, fastTestMTU)
			if c.unvouched {
				if _, err := d.Fast().SetPath(FastPath{VXLANs: []FastVXLAN{{Ifindex: vxIfindex, VNI: testVNI}}}); err != nil {
					t.Fatal(err)
				}
			}
			if c.note {
				fastRun(t, d.TCFast(), fastFrame(s), ulIfindex, 0)
			}
			ret, out := fastRun(t, d.TCFastLearn(), c.frame, c.in, 0)
			sameBytes(t, c.name, c.frame, out)
			st := stats(t, d)[StageSplit]
			if ret != tcUnspec || st.FastAdmitted != 0 || st.FastUnlearned != c.unlearned {
				t.Errorf("verdict %d, counters %+v: want no entry, %d unlearned", ret, st, c.unlearned)
			}
			if es, _ := d.Fast().Entries(); len(es) != 0 {
				t.Errorf("entries %+v, want none", es)
			}
		})
	}
}

// An entry is void, and deleted, once a change on the path was counted
// since it was made, once it was idle past the timeout, and at its flow's
// FIN or RST; past the lease nothing is used or learned, until the agent
// renews it.
func TestFastEntriesEnd(t *testing.T) {
	s := frameSpec{flow: udpFlow(40000), payload: 100}
	tcp := frameSpec{flow: tcpFlow(40000), payload: 100}
	flags := func(f byte) []byte {
		b := fastFrame(tcp)
		b[fastOuterLen+ethHeaderLen+20+13] = f
		return b
	}
	for _, c := range []struct {
		name    string
		spec    frameSpec
		idle    time.Duration
		act     func(*testing.T, *Datapath)
		frame   []byte
		want    func(Counters) uint64
		deleted bool
	}{
		{"a change counted", s, time.Hour, countChange, fastFrame(s), func(c Counters) uint64 { return c.FastStale }, true},
		{"idle", s, time.Millisecond, ageEntries, fastFrame(s), func(c Counters) uint64 { return c.FastIdle }, true},
		{"lease past", s, time.Hour, leasePast, fastFrame(s), func(c Counters) uint64 { return c.FastLease }, false},
		{"FIN", tcp, time.Hour, nil, flags(0x11), func(c Counters) uint64 { return c.FastEnded }, true},
		{"RST", tcp, time.Hour, nil, flags(0x14), func(c Counters) uint64 { return c.FastEnded }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := fastDatapath(t, c.idle, fastTestMTU)
			learn(t, d, c.spec, innerMAC, remoteMAC, 0)
			if c.act != nil {
				c.act(t, d)
			}
			before := stats(t, d)[StageSplit]
			ret, out := fastRun(t, d.TCFast(), c.frame, ulIfindex, 0)
			sameBytes(t, c.name, c.frame, out)
			st := stats(t, d)[StageSplit].Sub(before)
			if ret != tcUnspec || c.want(st) != 1 || st.Fast != 0 {
				t.Errorf("verdict %d, counters %+v: want the kernel's path, one miss of this reason", ret, st)
			}
			es, err := d.Fast().Entries()
			if err != nil || (len(es) == 0) != c.deleted {
				t.Errorf("entries %+v (%v): want deleted %v", es, err, c.deleted)
			}
		})
	}
}

// Past the lease, or under another change count than its own, the veth's
// egress learns nothing; renewed, flows are learned and taken again.
// Withdraw ends the lease and every entry at once.
func TestFastLease(t *testing.T) {
	d := fastDatapath(t, time.Hour, fastTestMTU)
	s := frameSpec{flow: udpFlow(40000), payload: 100}
	if err := d.objs.SteerFastLease.Put(uint32(0), steerFastLease{}); err != nil {
		t.Fatal(err)
	}
	fastRun(t, d.TCFast(), fastFrame(s), ulIfindex, 0)
	fastRun(t, d.TCFastLearn(), delivered(s, innerMAC, remoteMAC, 0), vxIfindex, 0)
	if es, _ := d.Fast().Entries(); len(es) != 0 {
		t.Fatalf("entries %+v learned without a lease", es)
	}
	if err := d.Fast().Renew(time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	learn(t, d, s, innerMAC, remoteMAC, 0)
	fastHit(t, d, s, delivered(s, innerMAC, remoteMAC, 0))
	// A change counted voids the lease too: another flow is not learned
	// until the agent renews it under the new count.
	if err := d.objs.SteerChanges.Put(uint32(0), uint64(1)); err != nil {
		t.Fatal(err)
	}
	other := frameSpec{flow: udpFlow(40001), payload: 100}
	fastRun(t, d.TCFast(), fastFrame(other), ulIfindex, 0)
	fastRun(t, d.TCFastLearn(), delivered(other, innerMAC, remoteMAC, 0), vxIfindex, 0)
	if es, _ := d.Fast().Entries(); len(es) != 1 {
		t.Fatalf("entries %+v: want only the first flow's, learned before the change", es)
	}
	if err := d.Fast().Renew(time.Hour, 1); err != nil {
		t.Fatal(err)
	}
	learn(t, d, other, innerMAC, remoteMAC, 0)
	if err := d.Fast().Withdraw(); err != nil {
		t.Fatal(err)
	}
	es, err := d.Fast().Entries()
	lease, _, _ := d.Fast().Lease()
	if err != nil || len(es) != 0 || lease != 0 {
		t.Errorf("after Withdraw: entries %+v (%v), lease %v: want none", es, err, lease)
	}
	frame := fastFrame(s)
	if ret, out := fastRun(t, d.TCFast(), frame, ulIfindex, 0); ret != tcUnspec || !slices.Equal(out, frame) {
		t.Errorf("after Withdraw: verdict %d, want the kernel's path, untouched", ret)
	}
}

// ageEntries makes every entry's last use the boot's first nanosecond.
func ageEntries(t *testing.T, d *Datapath) {
	ageMap[steerFastKey](t, d.objs.SteerFast, func(e *steerFastEntry) { e.Last = 1 })
}

// seen runs steer_tc_fast_seen on the inner frame of s as it reaches its
// container (either path).
func seen(t *testing.T, d *Datapath, s frameSpec) {
	t.Helper()
	if ret, _ := fastRun(t, d.TCFastSeen(), delivered(s, innerMAC, remoteMAC, 0), loIfindex, 0); ret != tcUnspec {
		t.Fatalf("seen: verdict %d, want the frame to go on", ret)
	}
}

// A frame of a learned flow takes the fast path only while none of its
// flow is on the kernel's path: after a GRO'd frame went that way, the
// next waits behind it (kernel's path) until the container's ingress saw
// both; then the fast path takes the flow again. With a drain time of an
// hour, a frame the kernel's path never delivers holds the flow there.
func TestFastKeepsOrder(t *testing.T) {
	d := fastDatapathNoDrain(t)
	s := frameSpec{flow: udpFlow(40000), payload: 100, udpCsumRight: true}
	learn(t, d, s, innerMAC, remoteMAC, 0)
	seen(t, d, s) // the learned packet reaches the container
	want := delivered(s, innerMAC, remoteMAC, 0)
	fastHit(t, d, s, want)
	seen(t, d, s)

	c0 := stats(t, d)[StageSplit]
	if ret, _ := fastRun(t, d.TCFast(), fastFrame(s), ulIfindex, 1400); ret != tcUnspec {
		t.Fatalf("a GSO frame: verdict %d, want the kernel's path", ret)
	}
	if ret, _ := fastRun(t, d.TCFast(), fastFrame(s), ulIfindex, 0); ret != tcUnspec {
		t.Fatalf("a frame behind a GSO one still on the kernel's path: verdict %d, want the kernel's path too", ret)
	}
	if c := stats(t, d)[StageSplit].Sub(c0); c.FastGSO != 1 || c.FastBehind != 1 || c.Fast != 0 {
		t.Fatalf("counters %+v, want one GSO frame and one behind it", c)
	}
	seen(t, d, s)
	if ret, _ := fastRun(t, d.TCFast(), fastFrame(s), ulIfindex, 0); ret != tcUnspec {
		t.Fatalf("with one of two frames on the kernel's path still in flight: verdict %d, want the kernel's path", ret)
	}
	seen(t, d, s)
	seen(t, d, s)
	fastHit(t, d, s, want)
}

// fastFrame is s's VXLAN frame addressed, unless s says otherwise, to lo's
// MAC: BPF_PROG_RUN gives an skb the pkt_type lo would (eth_type_trans on
// lo), and only a frame for this host (PACKET_HOST) is noted.
func fastFrame(s frameSpec) []byte {
	if s.outerDstMAC == nil {
		s.outerDstMAC = make([]byte, 6)
	}
	return vxlanFrame(s)
}

// Only what the kernel's path may deliver teaches the fast path: a frame
// of the flow that the kernel drops (for another host's MAC, with a bad
// outer IP checksum and another TTL), arriving between a delivered
// packet's ingress and its egress, leaves no note, so the entry carries
// the delivered packet's facts; a frame the kernel may deliver but with
// other facts (from another inner MAC) makes the note teach nothing for a
// while, since the packet leaving could be either.
func TestFastLearnsOnlyWhatTheKernelDelivers(t *testing.T) {
	s := frameSpec{flow: udpFlow(40000), payload: 100, udpCsumRight: true}
	for _, c := range []struct {
		name  string
		frame func() []byte
		entry bool // the delivered packet still makes its entry
	}{
		{"another host's MAC", func() []byte {
			o := s
			o.outerDstMAC = otherMAC
			return fastFrame(o)
		}, true},
		{"a bad outer IP checksum, TTL 65", func() []byte {
			b := fastFrame(s)
			b[ethHeaderLen+10]++
			in := b[fastOuterLen+ethHeaderLen:]
			in[8]++
			binary.BigEndian.PutUint16(in[10:], 0)
			binary.BigEndian.PutUint16(in[10:], ipv4Checksum(in[:20]))
			return b
		}, true},
		{"another inner source MAC", func() []byte {
			o := s
			o.innerSrcMAC = otherMAC
			return fastFrame(o)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := fastDatapath(t, time.Hour, fastTestMTU)
			fastRun(t, d.TCFast(), fastFrame(s), ulIfindex, 0)
			fastRun(t, d.TCFast(), c.frame(), ulIfindex, 0)
			fastRun(t, d.TCFastLearn(), delivered(s, innerMAC, remoteMAC, 0), vxIfindex, 0)
			es, err := d.Fast().Entries()
			if err != nil {
				t.Fatal(err)
			}
			if !c.entry {
				if len(es) != 0 {
					t.Fatalf("entries %+v: want none while the note is unsure", es)
				}
				return
			}
			if len(es) != 1 || es[0].TTLDec != 0 {
				t.Fatalf("entries %+v: want the delivered packet's, bridged (TTL untouched)", es)
			}
			seen(t, d, s)
			seen(t, d, s)
			fastHit(t, d, s, delivered(s, innerMAC, remoteMAC, 0))
			if ret, _ := fastRun(t, d.TCFast(), c.frame(), ulIfindex, 0); ret == tcRedirect {
				t.Errorf("a frame the kernel drops took the fast path")
			}
		})
	}
}
