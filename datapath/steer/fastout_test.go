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

// The fast path out of the container under BPF_PROG_RUN: the host-side
// veth's tc ingress (steer_tc_fastout) sees the frame a container sent,
// the underlay's tc egress (steer_tc_fastout_learn) the VXLAN frame the
// kernel's path wrote for it. lo (the test namespace's only device) stands
// for both: a device may hold both roles.

const (
	// The source port range of a VXLAN device with `srcport 0 0`: its
	// namespace's ip_local_port_range.
	outPortMin = 32768
	outPortMax = 60999
)

var (
	nextHopMAC     = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0e}
	outUnderlayMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0d}
	// vtepMAC and remoteVtepMAC are a routed path's inner MACs (Flannel's
	// flannel.1 and its peer's).
	vtepMAC       = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x1a}
	remoteVtepMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x1b}
)

// fastOutDatapath loads the fast path with lanes agent's word for the way
// out: lo's ingress to lo's transmit through VNI testVNI, within mtu, for
// an hour.
func fastOutDatapath(t *testing.T, idle time.Duration, mtu uint32) *Datapath {
	t.Helper()
	d, cores := newDatapath(t)
	if err := d.SetConfig(Config{Enabled: true, CPUs: cores, Flowlet: time.Hour, VXLANPort: testPort, VNIs: []uint32{testVNI}, Fast: true, FastIdle: idle}); err != nil {
		t.Fatal(err)
	}
	path := FastOutPath{VXLANs: []FastOutVXLAN{{VNI: testVNI, PortMin: outPortMin, PortMax: outPortMax, MTU: mtu}}, Veths: []uint32{loIfindex}, Underlays: []uint32{loIfindex}}
	if changed, err := d.Fast().SetOutPath(path); err != nil || !changed {
		t.Fatalf("SetOutPath: changed %v, %v", changed, err)
	}
	if err := d.Fast().Renew(time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	return d
}

// l4Sum is the ones' complement sum of b's 16-bit words (big-endian, an
// odd last byte padded), unfolded.
func l4Sum(sum uint32, b []byte) uint32 {
	for i := 0; i < len(b); i += 2 {
		w := uint32(b[i]) << 8
		if i+1 < len(b) {
			w |= uint32(b[i+1])
		}
		sum += w
	}
	return sum
}

// sentFrame is the frame a container sends for s: innerFrame with its TCP
// or UDP checksum right.
func sentFrame(s frameSpec) []byte { return sentFrameOf(innerFrame(s)) }

// sentFrameOf fills in the TCP or UDP checksum of the frame fr (IPv4
// header at ethHeaderLen) and returns it.
func sentFrameOf(fr []byte) []byte {
	ip := fr[ethHeaderLen:]
	hl := int(ip[0]&0xf) * 4
	if ip[0]>>4 != 4 || len(ip) < hl {
		return fr
	}
	l4 := ip[hl:binary.BigEndian.Uint16(ip[2:])]
	off := map[uint8]int{protoTCP: 16, protoUDP: 6}[ip[9]]
	if off == 0 {
		return fr
	}
	binary.BigEndian.PutUint16(l4[off:], 0)
	sum := l4Sum(0, ip[12:20]) + uint32(ip[9]) + uint32(len(l4))
	sum = l4Sum(sum, l4)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	c := ^uint16(sum)
	if c == 0 && ip[9] == protoUDP {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(l4[off:], c)
	return fr
}

// wrote is how the kernel's path wrote a sent frame out: the outer IP id,
// DSCP and DF, the UDP source port, whether the device writes an outer UDP
// checksum; for a routed path the inner MACs it writes and the hop it
// takes off the TTL.
type wrote struct {
	id       uint16
	dscp     uint8
	df       bool
	sport    uint16
	csum     bool
	routed   bool
	dst, src net.HardwareAddr
}

// kernelFrame is sent as the VXLAN device encapsulates it (w): outer
// Ethernet to the next hop, IPv4 with TTL 64 and ECN as
// INET_ECN_encapsulate copies it, UDP to testPort, VXLAN testVNI, and the
// inner frame as the path leaves it.
func kernelFrame(sent []byte, w wrote) []byte {
	inner := slices.Clone(sent)
	if w.routed {
		copy(inner[0:], w.dst)
		copy(inner[6:], w.src)
		ip := inner[ethHeaderLen:]
		ip[8]--
		binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip[:20]))
	}
	ecn := inner[ethHeaderLen+1] & 3
	if ecn == 3 {
		ecn = 2
	}
	l4 := make([]byte, 16, 16+len(inner))
	binary.BigEndian.PutUint16(l4[0:], w.sport)
	binary.BigEndian.PutUint16(l4[2:], testPort)
	binary.BigEndian.PutUint16(l4[4:], uint16(16+len(inner)))
	binary.BigEndian.PutUint32(l4[8:], 0x08000000)
	binary.BigEndian.PutUint32(l4[12:], testVNI<<8)
	l4 = append(l4, inner...)
	if w.csum {
		binary.BigEndian.PutUint16(l4[6:], udpChecksum(outerSrc, outerDst, l4))
	}
	b := appendEthMAC(nil, nextHopMAC, outUnderlayMAC, false, ethIPv4)
	var frag uint16
	if w.df {
		frag = 0x4000
	}
	b = appendIPv4(b, ipSpec{tos: w.dscp<<2 | ecn, frag: frag}, protoUDP, outerSrc, outerDst, len(l4))
	binary.BigEndian.PutUint16(b[ethHeaderLen+4:], w.id)
	binary.BigEndian.PutUint16(b[ethHeaderLen+10:], ipv4Checksum(b[ethHeaderLen:ethHeaderLen+20]))
	return append(b, l4...)
}

// vxlanPort is the kernel's udp_flow_src_port for hash h over [min, max].
func vxlanPort(h uint32, min, max uint32) uint16 {
	h ^= h << 16
	return uint16(uint64(h)*uint64(max-min)>>32 + uint64(min))
}

// noteHash is the hash the one note of the fast path out recorded.
func noteHash(t *testing.T, d *Datapath) uint32 {
	t.Helper()
	var k steerFastoutKey
	var n steerFastoutNote
	var hashes []uint32
	it := d.objs.SteerFastoutNotes.Iterate()
	for it.Next(&k, &n) {
		hashes = append(hashes, n.Hash)
	}
	if err := it.Err(); err != nil || len(hashes) != 1 || hashes[0] == 0 {
		t.Fatalf("premise: notes' hashes %v (%v), want one", hashes, err)
	}
	return hashes[0]
}

// learnOut runs one sent frame the kernel's path takes, as the fast path
// sees it at the veth's ingress (noted) and at the underlay's egress
// (admitted, as the kernel wrote it: w, with the port the kernel computes
// from the note's hash). It returns w with that port.
func learnOut(t *testing.T, d *Datapath, sent []byte, w wrote) wrote {
	t.Helper()
	before := stats(t, d)[StageSplit]
	ret, out := fastRun(t, d.TCFastOut(), sent, loIfindex, 0)
	if ret != tcUnspec {
		t.Fatalf("premise: a frame without entry: verdict %d, want the kernel's path", ret)
	}
	sameBytes(t, "noted frame", sent, out)
	w.sport = vxlanPort(noteHash(t, d), outPortMin, outPortMax)
	frame := kernelFrame(sent, w)
	ret, out = fastRun(t, d.TCFastOutLearn(), frame, loIfindex, 0)
	if ret != tcUnspec {
		t.Fatalf("learning: verdict %d, want the frame to go on", ret)
	}
	sameBytes(t, "learned frame", frame, out)
	st := stats(t, d)[StageSplit].Sub(before)
	if st.FastOutNoEntry != 1 || st.FastOutAdmitted != 1 {
		t.Fatalf("premise: learning gave counters %+v, want one miss for no entry and one entry admitted", st)
	}
	return w
}

// fastOutHit runs a sent frame through the veth's ingress and wants it
// encapsulated as want, the outer IP id (which the device varies per
// packet) aside, and redirected.
func fastOutHit(t *testing.T, d *Datapath, sent []byte, w wrote) {
	t.Helper()
	before := stats(t, d)[StageSplit].FastOut
	ret, out := fastRun(t, d.TCFastOut(), sent, loIfindex, 0)
	if ret != tcRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT (counters %+v)", ret, stats(t, d)[StageSplit])
	}
	if len(out) > ethHeaderLen+6 {
		w.id = binary.BigEndian.Uint16(out[ethHeaderLen+4:])
	}
	if want := kernelFrame(sent, w); !slices.Equal(out, want) {
		t.Errorf("sent frame\n got: %x\nwant: %x", out, want)
	}
	if n := stats(t, d)[StageSplit].FastOut - before; n != 1 {
		t.Errorf("%d hits counted, want 1", n)
	}
}

// A flow's frame that the kernel's path sent out teaches the fast path how
// it went; the next frames are encapsulated exactly as the path would have
// (outer IP id aside): bridged or routed (inner MACs and TTL as the router
// leaves them), with or without the outer UDP checksum, the DSCP and DF
// the device wrote, ECN as INET_ECN_encapsulate copies it, UDP and TCP.
func TestFastOutLearnsThenHits(t *testing.T) {
	for _, c := range []struct {
		name string
		flow flowSpec
		w    wrote
	}{
		{"bridged", udpFlow(40000), wrote{id: 7, csum: true}},
		{"routed", udpFlow(40000), wrote{id: 7, csum: true, routed: true, dst: remoteVtepMAC, src: vtepMAC}},
		{"no checksum", udpFlow(40000), wrote{id: 7}},
		{"DSCP and DF", udpFlow(40000), wrote{id: 7, csum: true, dscp: 10, df: true}},
		{"TCP", tcpFlow(40000), wrote{id: 7, csum: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := fastOutDatapath(t, time.Hour, fastTestMTU)
			s := frameSpec{flow: c.flow, payload: 101}
			if c.w.df {
				s.innerIP.frag = 0x4000
			}
			if c.w.dscp != 0 {
				s.innerIP.tos = c.w.dscp << 2
			}
			w := learnOut(t, d, sentFrame(s), c.w)
			es, err := d.Fast().OutEntries()
			if err != nil || len(es) != 1 || es[0].Veth != loIfindex || es[0].Underlay != loIfindex || es[0].VNI != testVNI || es[0].VTEPDst != outerDst || es[0].UDPCsum != c.w.csum {
				t.Fatalf("entries %+v (%v), want the flow's from lo through VNI %d", es, err, testVNI)
			}
			fastOutHit(t, d, sentFrame(s), w)
			for _, ecn := range []uint8{1, 2, 3} {
				e := s
				e.innerIP.tos |= ecn
				fastOutHit(t, d, sentFrame(e), w)
			}
			longer := s
			longer.payload = 1000
			fastOutHit(t, d, sentFrame(longer), w)
		})
	}
}

// Every frame the fast path out cannot vouch for takes the kernel's path,
// untouched, counted by reason; the entry stays for the flow's next good
// frame.
func TestFastOutMisses(t *testing.T) {
	s := frameSpec{flow: udpFlow(40000), payload: 100}
	with := func(f func(*frameSpec)) []byte {
		c := s
		f(&c)
		return sentFrame(c)
	}
	otherMACs := sentFrame(s)
	copy(otherMACs, otherMAC)
	noCsum := innerFrame(s)
	for _, c := range []struct {
		name  string
		frame []byte
		gso   uint32
		want  func(Counters) uint64
	}{
		{"another flow", with(func(c *frameSpec) { c.flow = udpFlow(40001) }), 0, func(c Counters) uint64 { return c.FastOutNoEntry }},
		{"another destination MAC", otherMACs, 0, func(c Counters) uint64 { return c.FastOutOther }},
		{"another DSCP", with(func(c *frameSpec) { c.innerIP.tos = 4 }), 0, func(c Counters) uint64 { return c.FastOutOther }},
		{"DF", with(func(c *frameSpec) { c.innerIP.frag = 0x4000 }), 0, func(c Counters) uint64 { return c.FastOutOther }},
		{"bad IP checksum", with(func(c *frameSpec) { c.innerIP.badCsum = true }), 0, func(c Counters) uint64 { return c.FastOutRefused }},
		{"IP options", with(func(c *frameSpec) { c.innerIP.ihl = 6 }), 0, func(c Counters) uint64 { return c.FastOutRefused }},
		{"longer than the MTU", with(func(c *frameSpec) { c.payload = fastTestMTU }), 0, func(c Counters) uint64 { return c.FastOutRefused }},
		{"UDP without checksum", noCsum, 0, func(c Counters) uint64 { return c.FastOutRefused }},
		{"UDP GSO", sentFrame(s), 1400, func(c Counters) uint64 { return c.FastOutRefused }},
		{"a fragment", with(func(c *frameSpec) { c.innerIP.frag = 0x2000 }), 0, func(c Counters) uint64 { return c.Passed }},
		{"IPv6", with(func(c *frameSpec) { c.innerEthType = ethIPv6 }), 0, func(c Counters) uint64 { return c.Passed }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := fastOutDatapath(t, time.Hour, fastTestMTU)
			w := learnOut(t, d, sentFrame(s), wrote{id: 7, csum: true})
			before := stats(t, d)[StageSplit]
			ret, out := fastRun(t, d.TCFastOut(), c.frame, loIfindex, c.gso)
			if ret != tcUnspec {
				t.Errorf("verdict %d, want the kernel's path", ret)
			}
			sameBytes(t, c.name, c.frame, out)
			st := stats(t, d)[StageSplit].Sub(before)
			if c.want(st) != 1 || st.FastOut != 0 {
				t.Errorf("counters %+v: want one miss of this reason, no hit", st)
			}
			fastOutHit(t, d, sentFrame(s), w)
		})
	}
}

// A TCP GSO frame is taken only if each segment fits the path's MTU.
func TestFastOutGSOMTU(t *testing.T) {
	d := fastOutDatapath(t, time.Hour, fastTestMTU)
	s := frameSpec{flow: tcpFlow(40000), payload: 2000}
	learnOut(t, d, sentFrame(frameSpec{flow: s.flow, payload: 100}), wrote{id: 7, csum: true})
	frame := sentFrame(s)
	ret, out := fastRun(t, d.TCFastOut(), frame, loIfindex, fastTestMTU-40+1)
	sameBytes(t, "segments too long", frame, out)
	if st := stats(t, d)[StageSplit]; ret != tcUnspec || st.FastOutRefused != 1 || st.FastOut != 0 {
		t.Errorf("verdict %d, counters %+v: want the kernel's path, refused", ret, st)
	}
}

// What teaches nothing at the underlay's egress: a frame without a note
// of the same packet, one whose source port is not the one the device's
// range gives the packet's hash, one two hops on, one for a broadcast
// inner MAC (never noted), one on an underlay or from a veth the agent does
// not vouch for, anything past the lease.
func TestFastOutLearnsOnlyFromTheSamePacket(t *testing.T) {
	s := frameSpec{flow: udpFlow(40000), payload: 100}
	sent := sentFrame(s)
	bcast := sentFrame(s)
	copy(bcast, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	for _, c := range []struct {
		name      string
		sent      []byte
		noNote    bool
		wrote     func(port uint16) []byte
		path      *FastOutPath
		lease     bool
		unlearned uint64
	}{
		{name: "no note", sent: sent, noNote: true, wrote: func(p uint16) []byte { return kernelFrame(sent, wrote{sport: p, csum: true}) }},
		{name: "another packet", sent: sent, wrote: func(p uint16) []byte {
			return kernelFrame(sentFrame(frameSpec{flow: s.flow, payload: 99}), wrote{sport: p, csum: true})
		}, unlearned: 1},
		{name: "another source port", sent: sent, wrote: func(p uint16) []byte { return kernelFrame(sent, wrote{sport: p + 1, csum: true}) }, unlearned: 1},
		{name: "VXLAN header with more bits", sent: sent, wrote: func(p uint16) []byte {
			f := kernelFrame(sent, wrote{sport: p})
			f[fastOuterLen-8+3] = 0x81 // remote checksum offload's start and offset in the VNI field's low byte
			return f
		}, unlearned: 1},
		{name: "two hops", sent: sent, wrote: func(p uint16) []byte {
			f := kernelFrame(sent, wrote{sport: p, csum: true, routed: true, dst: remoteVtepMAC, src: vtepMAC})
			ip := f[fastOuterLen+ethHeaderLen:]
			ip[8]--
			binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip[:20]))
			return f
		}, unlearned: 1},
		{name: "broadcast", sent: bcast, noNote: true, wrote: func(p uint16) []byte { return kernelFrame(bcast, wrote{sport: p, csum: true}) }},
		{name: "underlay not vouched for", sent: sent, wrote: func(p uint16) []byte { return kernelFrame(sent, wrote{sport: p, csum: true}) },
			path: &FastOutPath{VXLANs: []FastOutVXLAN{{VNI: testVNI, PortMin: outPortMin, PortMax: outPortMax, MTU: fastTestMTU}}, Veths: []uint32{loIfindex}}},
		{name: "veth not vouched for", sent: sent, noNote: true, wrote: func(p uint16) []byte { return kernelFrame(sent, wrote{sport: p, csum: true}) },
			path: &FastOutPath{VXLANs: []FastOutVXLAN{{VNI: testVNI, PortMin: outPortMin, PortMax: outPortMax, MTU: fastTestMTU}}, Underlays: []uint32{loIfindex}}},
		{name: "lease past", sent: sent, noNote: true, wrote: func(p uint16) []byte { return kernelFrame(sent, wrote{sport: p, csum: true}) }, lease: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := fastOutDatapath(t, time.Hour, fastTestMTU)
			var port uint16
			if !c.noNote {
				fastRun(t, d.TCFastOut(), c.sent, loIfindex, 0)
				port = vxlanPort(noteHash(t, d), outPortMin, outPortMax)
			} else if c.sent[0]&1 == 0 && c.path == nil && !c.lease {
				// The port the kernel would pick all the same.
				fastRun(t, d.TCFastOut(), c.sent, loIfindex, 0)
				port = vxlanPort(noteHash(t, d), outPortMin, outPortMax)
				if _, err := d.Fast().Flush(); err != nil {
					t.Fatal(err)
				}
			}
			if c.path != nil {
				if _, err := d.Fast().SetOutPath(*c.path); err != nil {
					t.Fatal(err)
				}
				fastRun(t, d.TCFastOut(), c.sent, loIfindex, 0)
			}
			if c.lease {
				if err := d.objs.SteerFastLease.Put(uint32(0), steerFastLease{}); err != nil {
					t.Fatal(err)
				}
				fastRun(t, d.TCFastOut(), c.sent, loIfindex, 0)
			}
			frame := c.wrote(port)
			before := stats(t, d)[StageSplit]
			ret, out := fastRun(t, d.TCFastOutLearn(), frame, loIfindex, 0)
			sameBytes(t, c.name, frame, out)
			st := stats(t, d)[StageSplit].Sub(before)
			if ret != tcUnspec || st.FastOutAdmitted != 0 || st.FastOutUnlearned != c.unlearned {
				t.Errorf("verdict %d, counters %+v: want no entry, %d unlearned", ret, st, c.unlearned)
			}
			if es, _ := d.Fast().OutEntries(); len(es) != 0 {
				t.Errorf("entries %+v, want none", es)
			}
		})
	}
}

// An entry out is void, and deleted, once a change on the path was
// counted since it was made, once it was idle past the timeout, and at its
// flow's FIN or RST; past the lease nothing is used. Withdraw ends every
// entry out too.
func TestFastOutEntriesEnd(t *testing.T) {
	s := frameSpec{flow: udpFlow(40000), payload: 100}
	tcp := frameSpec{flow: tcpFlow(40000), payload: 100}
	flags := func(f byte) []byte {
		b := sentFrame(tcp)
		b[ethHeaderLen+20+13] = f
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
		{"a change counted", s, time.Hour, countChange, sentFrame(s), func(c Counters) uint64 { return c.FastOutStale }, true},
		{"idle", s, time.Millisecond, ageOutEntries, sentFrame(s), func(c Counters) uint64 { return c.FastOutIdle }, true},
		{"lease past", s, time.Hour, leasePast, sentFrame(s), func(c Counters) uint64 { return c.FastOutLease }, false},
		{"FIN", tcp, time.Hour, nil, flags(0x11), func(c Counters) uint64 { return c.FastOutEnded }, true},
		{"RST", tcp, time.Hour, nil, flags(0x14), func(c Counters) uint64 { return c.FastOutEnded }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := fastOutDatapath(t, c.idle, fastTestMTU)
			learnOut(t, d, sentFrame(c.spec), wrote{id: 7, csum: true})
			if c.act != nil {
				c.act(t, d)
			}
			before := stats(t, d)[StageSplit]
			ret, out := fastRun(t, d.TCFastOut(), c.frame, loIfindex, 0)
			sameBytes(t, c.name, c.frame, out)
			st := stats(t, d)[StageSplit].Sub(before)
			if ret != tcUnspec || c.want(st) != 1 || st.FastOut != 0 {
				t.Errorf("verdict %d, counters %+v: want the kernel's path, one miss of this reason", ret, st)
			}
			es, err := d.Fast().OutEntries()
			if err != nil || (len(es) == 0) != c.deleted {
				t.Errorf("entries %+v (%v): want deleted %v", es, err, c.deleted)
			}
		})
	}
	t.Run("withdraw", func(t *testing.T) {
		d := fastOutDatapath(t, time.Hour, fastTestMTU)
		learnOut(t, d, sentFrame(s), wrote{id: 7, csum: true})
		if err := d.Fast().Withdraw(); err != nil {
			t.Fatal(err)
		}
		if es, err := d.Fast().OutEntries(); err != nil || len(es) != 0 {
			t.Errorf("after Withdraw: entries %+v (%v), want none", es, err)
		}
	})
}

// ageOutEntries makes every entry out's last use the boot's first
// nanosecond.
func ageOutEntries(t *testing.T, d *Datapath) {
	ageMap[steerFastoutKey](t, d.objs.SteerFastout, func(e *steerFastoutEntry) { e.Last = 1 })
}

// ageMap rewrites every entry of m with set applied (their last use made
// the boot's first nanosecond).
func ageMap[K comparable, V any](t *testing.T, m *ebpf.Map, set func(*V)) {
	t.Helper()
	var k K
	var v V
	var keys []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	for _, k := range keys {
		if err := m.Lookup(k, &v); err != nil {
			t.Fatal(err)
		}
		set(&v)
		if err := m.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
}

// countChange counts a change on the path, as steer_notify does.
func countChange(t *testing.T, d *Datapath) {
	t.Helper()
	if err := d.objs.SteerChanges.Put(uint32(0), uint64(1)); err != nil {
		t.Fatal(err)
	}
}

// leasePast makes the lease's deadline now.
func leasePast(t *testing.T, d *Datapath) {
	t.Helper()
	if err := d.objs.SteerFastLease.Put(uint32(0), steerFastLease{Deadline: uint64(Now())}); err != nil {
		t.Fatal(err)
	}
}
