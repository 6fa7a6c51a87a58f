//go:build linux

package steer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/nsx"
)

// innerMAC is the inner destination MAC of the test frames (appendEth),
// and underlayMAC the outer one: the same bytes, one per header.
var (
	innerMAC    = net.HardwareAddr{0x02, 0, 0, 0, 0, 2}
	underlayMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 2}
	// remoteMAC is the inner source MAC of the test frames: a remote
	// container behind the VTEP outerSrc.
	remoteMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
)

// testSyncSet is the shortcut's set for the test frames: the destination
// given (none if mtu is 0), their inner source as a static VXLAN
// forwarding entry of the VTEP outerSrc, and outerDst as the address of
// lo, whose MAC is underlayMAC.
func testSyncSet(mtu uint32) SyncSet {
	s := SyncSet{
		Sources: []SyncSource{{VNI: testVNI, MAC: remoteMAC, VTEP: outerSrc}},
		Locals:  []SyncLocal{{Ifindex: loIfindex, Addr: outerDst, MAC: underlayMAC}},
	}
	if mtu > 0 {
		s.Targets = []SyncTarget{{VNI: testVNI, MAC: innerMAC, Ifindex: loIfindex, MTU: mtu}}
	}
	return s
}

// syncDatapath is prioDatapath with PRISM-sync on and, with target, one
// destination for the test frames' inner MAC on lo (the test namespace's
// only device), with the container MTU given.
func syncDatapath(t *testing.T, drain time.Duration, mtu uint32) *Datapath {
	t.Helper()
	d := prioDatapath(t, true, drain)
	cfg, _ := d.Config()
	cfg.Sync = true
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Config(); !got.Sync {
		t.Fatalf("config %+v does not read back Sync", got)
	}
	if mtu > 0 {
		if err := d.Sync().Set(testSyncSet(mtu), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// A high-priority frame with a destination leaves decapsulated, byte for
// byte the frame the container would get, redirected; a bulk frame of the
// same container and a high-priority one for an unknown MAC or VNI keep
// the queues, untouched.
func TestSyncShortcut(t *testing.T) {
	d := syncDatapath(t, 0, 1500)
	addRule(t, d, "dst "+innerDst.String()+" udp")
	hi := frameSpec{flow: udpFlow(40000), payload: 100}
	ret, out := runXDP(t, d, vxlanFrame(hi))
	if ret != xdpRedirect {
		t.Fatalf("verdict %d, want XDP_REDIRECT", ret)
	}
	sameBytes(t, "decapsulated frame", innerFrame(hi), out)
	if fl := mustFlow(t, d, hi.flow, StageSplit); !fl.Sync || !fl.High || fl.InFlight != 0 || fl.CPUIndex != Stay {
		t.Errorf("flow %+v, want on the shortcut, high, nothing in flight", fl)
	}

	bulk := frameSpec{flow: tcpFlow(40001)}
	otherVNI := frameSpec{flow: udpFlow(40002), vni: 43}
	for name, s := range map[string]frameSpec{"bulk": bulk, "other VNI": otherVNI} {
		frame := vxlanFrame(s)
		ret, out := runXDP(t, d, frame)
		sameBytes(t, name, frame, out)
		if fl, ok := flowState(t, d, s.flow, StageSplit); ok && fl.Sync {
			t.Errorf("%s: on the shortcut: %+v (verdict %d)", name, fl, ret)
		}
	}
	st := stats(t, d)[StageSplit]
	if st.Sync != 1 || st.SyncMiss != 0 {
		t.Errorf("counters %+v, want 1 sync, no miss (the other VNI is not steered at all)", st)
	}
}

// What the shortcut cannot vouch for takes the batch path, whole: a frame
// longer than the container's MTU, a target whose device left the
// devmap, sync switched off, and every malformed frame.
func TestSyncFallsBack(t *testing.T) {
	hi := frameSpec{flow: udpFlow(40000), payload: 200}
	t.Run("too long", func(t *testing.T) {
		d := syncDatapath(t, 0, 200) // inner IP packet: 20 + 8 + 200 bytes
		addRule(t, d, "dst "+innerDst.String())
		frame := vxlanFrame(hi)
		ret, out := runXDP(t, d, frame)
		sameBytes(t, "too long", frame, out)
		if st := stats(t, d)[StageSplit]; ret == xdpRedirect && st.Sync != 0 || st.SyncMiss != 1 {
			t.Errorf("verdict %d, counters %+v: want the batch path and a miss", ret, st)
		}
	})
	t.Run("device gone", func(t *testing.T) {
		d := syncDatapath(t, 0, 1500)
		addRule(t, d, "dst "+innerDst.String())
		if err := d.objs.SteerSyncDev.Delete(uint32(loIfindex)); err != nil {
			t.Fatal(err)
		}
		frame := vxlanFrame(hi)
		ret, out := runXDP(t, d, frame)
		if ret != xdpPass {
			t.Errorf("verdict %d, want XDP_PASS", ret)
		}
		sameBytes(t, "device gone", frame, out)
		if ts, _ := d.Sync().Targets(); len(ts) != 0 {
			t.Errorf("Sync lists %v, whose device left the devmap", ts)
		}
	})
	t.Run("sync off", func(t *testing.T) {
		d := syncDatapath(t, 0, 1500)
		addRule(t, d, "dst "+innerDst.String())
		cfg, _ := d.Config()
		cfg.Sync = false
		if err := d.SetConfig(cfg); err != nil {
			t.Fatal(err)
		}
		frame := vxlanFrame(hi)
		_, out := runXDP(t, d, frame)
		sameBytes(t, "sync off", frame, out)
		if st := stats(t, d)[StageSplit]; st.Sync != 0 || st.SyncMiss != 0 || st.High != 1 {
			t.Errorf("counters %+v, want one high-priority frame and no sync lookup", st)
		}
	})
	t.Run("malformed", func(t *testing.T) {
		d := syncDatapath(t, 0, 1500)
		addRule(t, d, "dst "+innerDst.String())
		for name, frame := range outerMalformed() {
			ret, out := runXDP(t, d, frame)
			if ret != xdpPass {
				t.Errorf("%s: verdict %d, want XDP_PASS", name, ret)
			}
			sameBytes(t, name, frame, out)
		}
		if st := stats(t, d)[StageSplit]; st.Sync != 0 || st.High != 0 {
			t.Errorf("counters %+v: a malformed frame was classified or shortcut", st)
		}
	})
}

// Taking the shortcut is a move: it waits until the flow's high-priority
// queue has drained, so a shortcut frame never overtakes one still queued.
// Leaving it does not wait: what it delivered is ahead already.
func TestSyncWaitsForQueue(t *testing.T) {
	d, f, frame := queuedBeforeSync(t)
	ret, out := runXDP(t, d, frame)
	sameBytes(t, "held", frame, out)
	if fl := mustFlow(t, d, f, StageSplit); fl.Sync || ret == xdpRedirect && fl.InFlight != 2 {
		t.Errorf("took the shortcut with a frame queued: %+v", fl)
	}
	// Once the queue may count as drained (metadata cannot be fed to a tc
	// test run, so the drain wait is switched off instead of counting the
	// frames seen; the integration test sees real frames through), the
	// flow moves.
	cfg, _ := d.Config()
	cfg.Drain = 0
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if ret, _ := runXDP(t, d, frame); ret != xdpRedirect {
		t.Errorf("verdict %d after the queue drained, want the shortcut", ret)
	}
	if fl := mustFlow(t, d, f, StageSplit); !fl.Sync {
		t.Errorf("flow %+v not on the shortcut after its queue drained", fl)
	}
	// No destination any more: back to the queue at once.
	if err := d.Sync().Set(SyncSet{}, time.Hour); err != nil {
		t.Fatal(err)
	}
	runXDP(t, d, frame)
	if fl := mustFlow(t, d, f, StageSplit); fl.Sync || !fl.High {
		t.Errorf("flow %+v, want back in the high-priority queue", fl)
	}
}

// queuedBeforeSync is a sync datapath with a high-priority flow that has a
// frame in its queue from before its destination was set, and its frame.
func queuedBeforeSync(t *testing.T) (*Datapath, flowSpec, []byte) {
	t.Helper()
	d := syncDatapath(t, time.Hour, 0)
	addRule(t, d, "dst "+innerDst.String())
	f := udpFlow(40000)
	frame := vxlanFrame(frameSpec{flow: f})
	runXDP(t, d, frame)
	if fl := mustFlow(t, d, f, StageSplit); fl.Sync || !fl.High || fl.InFlight != 1 {
		t.Fatalf("premise: flow %+v, want the high-priority queue with 1 frame in flight", fl)
	}
	if err := d.Sync().Set(testSyncSet(1500), time.Hour); err != nil {
		t.Fatal(err)
	}
	return d, f, frame
}

func TestSyncTargetsAPI(t *testing.T) {
	d, _ := newDatapath(t)
	a := SyncTarget{VNI: 42, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 9}, Ifindex: loIfindex, MTU: 1450}
	b := SyncTarget{VNI: 7, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, Ifindex: loIfindex, MTU: 9000}
	if err := d.Sync().Set(SyncSet{Targets: []SyncTarget{a, b}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err := d.Sync().Targets()
	if err != nil || FormatSync(got) != "7/02:00:00:00:00:01>1@9000,42/02:00:00:00:00:09>1@1450" {
		t.Fatalf("Sync() = %s (%v)", FormatSync(got), err)
	}
	back, err := ParseSync(FormatSync(got))
	if err != nil || FormatSync(back) != FormatSync(got) {
		t.Errorf("ParseSync round trip: %v (%v)", back, err)
	}
	if err := d.Sync().Set(SyncSet{Targets: []SyncTarget{b}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Sync().Targets(); FormatSync(got) != b.String() {
		t.Errorf("after replacing: %s, want %s", FormatSync(got), b)
	}
	for _, c := range []struct {
		ts   []SyncTarget
		want string
	}{
		{[]SyncTarget{{VNI: 1, MAC: net.HardwareAddr{1, 0, 0, 0, 0, 1}, Ifindex: 1, MTU: 1500}}, "group address"},
		{[]SyncTarget{{VNI: 1 << 24, MAC: innerMAC, Ifindex: 1, MTU: 1500}}, "24 bits"},
		{[]SyncTarget{{VNI: 1, MAC: innerMAC, Ifindex: 1, MTU: 1500}, {VNI: 1, MAC: innerMAC, Ifindex: 1, MTU: 1400}}, "twice"},
		{[]SyncTarget{{VNI: 1, MAC: innerMAC, Ifindex: 9999, MTU: 1500}}, "namespace"},
	} {
		if err := d.Sync().Set(SyncSet{Targets: c.ts}, time.Hour); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SetSync(%v) = %v, want an error saying %q", c.ts, err, c.want)
		}
	}
	for _, s := range []string{"42/02:00:00:00:00:01", "x/02:00:00:00:00:01>1@1500", "1/zz>1@1500"} {
		if _, err := ParseSync(s); err == nil {
			t.Errorf("ParseSync(%q) accepted", s)
		}
	}
}

// The ECN field of an IPv4 TOS byte: bpf/outer.h's ECN_* (TestConstsMatchC).
const (
	ecnNotECT = 0
	ecnECT1   = 1
	ecnECT0   = 2
	ecnCE     = 3
)

// PRISM-sync delivers only what the kernel's own path would deliver to
// that container: every frame the kernel drops on the way (ip_rcv,
// the route lookup, udp_rcv, vxlan_rcv, the bridge) takes the normal
// path untouched, where the kernel drops it, and is counted refused.
func TestSyncRefusesWhatTheKernelDrops(t *testing.T) {
	hi := frameSpec{flow: udpFlow(40000), payload: 64}
	other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x77}
	cases := map[string]frameSpec{}
	add := func(name string, mod func(s *frameSpec)) {
		s := hi
		mod(&s)
		cases[name] = s
	}
	add("outer destination MAC another host's (PACKET_OTHERHOST)", func(s *frameSpec) { s.outerDstMAC = other })
	add("outer header checksum wrong", func(s *frameSpec) { s.outerIP.badCsum = true })
	add("outer total length beyond the frame", func(s *frameSpec) { s.outerIP.lenAdj = 4 })
	add("outer total length short of the frame (trailing bytes the kernel trims)", func(s *frameSpec) { s.trailer = 4 })
	add("outer IPv4 options", func(s *frameSpec) { s.outerIP.ihl = 6 })
	add("UDP length beyond the datagram", func(s *frameSpec) { s.udpLenAdj = 4 })
	add("UDP length short of the datagram", func(s *frameSpec) { s.udpLenAdj = -4 })
	add("UDP checksum wrong (udp_rcv verifies it)", func(s *frameSpec) { s.udpCsumRight, s.udpCsum = true, 1 })
	add("UDP checksum wrong on a long datagram", func(s *frameSpec) { s.udpCsumRight, s.udpCsum, s.payload = true, 1, 1001 })
	add("reserved VXLAN flag", func(s *frameSpec) { s.vxFlags = 0x00000100 })
	add("GBP flag on a device without GBP", func(s *frameSpec) { s.vxFlags = 0x80000000 })
	add("reserved VNI byte", func(s *frameSpec) { s.vniLow = 1 })
	add("inner source not a known remote MAC", func(s *frameSpec) { s.innerSrcMAC = other })
	add("outer CE on a Not-ECT inner packet (RFC 6040: drop)", func(s *frameSpec) { s.outerIP.tos = ecnCE })
	cases["outer source not the source MAC's VTEP"] = hi // with another VTEP below

	d := syncDatapath(t, 0, 1500)
	addRule(t, d, "dst "+innerDst.String()+" udp")
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			set := testSyncSet(1500)
			if strings.HasPrefix(name, "outer source") {
				set.Sources[0].VTEP = netip.MustParseAddr("192.0.2.9")
			}
			if err := d.Sync().Set(set, time.Hour); err != nil {
				t.Fatal(err)
			}
			st0 := stats(t, d)[StageSplit]
			// The normal path's redirect (the high-priority queue) keeps
			// the frame whole; the shortcut's strips the outer headers.
			frame := vxlanFrame(s)
			_, out := runXDP(t, d, frame)
			sameBytes(t, name, frame, out)
			// Refused by the shortcut, or not even parsed as the
			// overlay's (lengths the kernel trims to, or drops for).
			st := stats(t, d)[StageSplit].Sub(st0)
			if st.Sync != 0 || st.SyncRefused+st.Passed != 1 {
				t.Errorf("counters %+v: want one refused or passed, no sync", st)
			}
		})
	}
	// The same frame, well formed, takes the shortcut: the cases above
	// differ from it in their one defect only. So does one with a right
	// UDP checksum, of any length a frame has.
	if err := d.Sync().Set(testSyncSet(1500), time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{64, 0, 1, 2, 3, 255, 256, 257, 1001, 1400} {
		ok := hi
		ok.payload = n
		ok.udpCsumRight = n != 64
		if ret, out := runXDP(t, d, vxlanFrame(ok)); ret != xdpRedirect || !bytes.Equal(out, innerFrame(ok)) {
			t.Errorf("a well-formed frame (payload %d, UDP checksum %v): verdict %d, %x: want it decapsulated and redirected", n, ok.udpCsumRight, ret, out)
		}
	}
}

// The shortcut decapsulates as vxlan_rcv does, ECN included (RFC 6040,
// the kernel's INET_ECN_decapsulate): an outer CE marks an ECN-capable
// inner packet CE, an outer ECT(1) turns an inner ECT(0) into ECT(1), and
// the inner header checksum follows.
func TestSyncECN(t *testing.T) {
	d := syncDatapath(t, 0, 1500)
	addRule(t, d, "dst "+innerDst.String()+" udp")
	for _, c := range []struct {
		outer, inner, want uint8
	}{
		{ecnNotECT, ecnNotECT, ecnNotECT},
		{ecnECT0, ecnNotECT, ecnNotECT}, // the kernel logs it and delivers
		{ecnECT1, ecnNotECT, ecnNotECT},
		{ecnCE, ecnECT0, ecnCE},
		{ecnCE, ecnECT1, ecnCE},
		{ecnCE, ecnCE, ecnCE},
		{ecnECT1, ecnECT0, ecnECT1},
		{ecnECT1, ecnECT1, ecnECT1},
		{ecnECT0, ecnECT1, ecnECT1},
		{ecnNotECT, ecnCE, ecnCE},
	} {
		t.Run(fmt.Sprintf("outer %d inner %d", c.outer, c.inner), func(t *testing.T) {
			s := frameSpec{flow: udpFlow(40000), payload: 32}
			s.outerIP.tos = 0xb8 | c.outer // DSCP bits stay the inner's business
			s.innerIP.tos = 0x20 | c.inner
			ret, out := runXDP(t, d, vxlanFrame(s))
			if ret != xdpRedirect {
				t.Fatalf("verdict %d, want XDP_REDIRECT", ret)
			}
			w := s
			w.innerIP.tos = 0x20 | c.want
			want := innerFrame(w)
			sameBytes(t, "decapsulated frame", want, out)
			if got := ipv4Checksum(out[14:34]); got != binary.BigEndian.Uint16(out[24:]) {
				t.Errorf("inner header checksum %#04x, want %#04x", binary.BigEndian.Uint16(out[24:]), got)
			}
		})
	}
}

// wantVoid runs frame, whose destination must be void (why says why), and
// checks it took the batch path whole, counted once as void (expired), and
// that Sync lists no destination.
func wantVoid(t *testing.T, d *Datapath, frame []byte, why string) {
	t.Helper()
	st0 := stats(t, d)[StageSplit]
	_, out := runXDP(t, d, frame)
	sameBytes(t, why, frame, out) // whole: the batch path
	if st := stats(t, d)[StageSplit].Sub(st0); st.Sync != 0 || st.SyncExpired != 1 {
		t.Errorf("%s: counters %+v: want the batch path and one void destination", why, st)
	}
	if ts, _ := d.Sync().Targets(); len(ts) != 0 {
		t.Errorf("%s: Sync lists %v", why, ts)
	}
}

// A destination the agent stops renewing lapses: a dead agent leaves
// the shortcut closed, and its frames take the batch path.
func TestSyncDestinationsExpire(t *testing.T) {
	d := syncDatapath(t, 0, 0)
	addRule(t, d, "dst "+innerDst.String()+" udp")
	if err := d.Sync().Set(testSyncSet(1500), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	frame := vxlanFrame(frameSpec{flow: udpFlow(40000)})
	if ret, _ := runXDP(t, d, frame); ret != xdpRedirect {
		t.Fatalf("verdict %d while the destination is fresh, want XDP_REDIRECT", ret)
	}
	time.Sleep(100 * time.Millisecond)
	wantVoid(t, d, frame, "past its deadline")
	// Renewed, it opens again.
	if err := d.Sync().Set(testSyncSet(1500), time.Hour); err != nil {
		t.Fatal(err)
	}
	if ret, _ := runXDP(t, d, frame); ret != xdpRedirect {
		t.Errorf("verdict %d after renewal, want XDP_REDIRECT", ret)
	}
}

// Frames the shortcut redirected that the veth then dropped (its peer
// polls without NAPI here, as a full ring would) are counted.
func TestSyncDevmapDropsCounted(t *testing.T) {
	d := syncDatapath(t, 0, 0)
	addRule(t, d, "dst "+innerDst.String()+" udp")
	name := scratchNetNS(t)
	dir := t.TempDir()
	var links []link.Link
	t.Cleanup(func() {
		for _, l := range links {
			l.Close()
		}
	})
	for _, tp := range []struct {
		name string
		p    *ebpf.Program
	}{{"xdp_devmap_xmit", d.objs.SteerSyncXmit}, {"xdp_redirect_err", d.objs.SteerSyncRedirectErr}} {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp.name, Program: tp.p})
		if err != nil {
			t.Fatalf("attaching %s: %v", tp.name, err)
		}
		links = append(links, l)
	}
	_ = dir
	const n = 8
	err := nsx.Do(name, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vsync0"}, PeerName: "vsync1"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		for _, n := range []string{"vsync0", "vsync1"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		host, err := netlink.LinkByName("vsync0")
		if err != nil {
			return err
		}
		set := testSyncSet(1500)
		set.Targets[0].Ifindex = uint32(host.Attrs().Index)
		if err := d.Sync().Set(set, time.Hour); err != nil {
			return err
		}
		frame := vxlanFrame(frameSpec{flow: udpFlow(40000)})
		for range n {
			if _, err := d.XDP().Run(&ebpf.RunOptions{Data: frame, Repeat: 1, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES,
				Context: xdpMd{DataEnd: uint32(len(frame)), IngressIfindex: uint32(lo.Attrs().Index)}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st := stats(t, d)[StageSplit]
	if st.Sync != n || st.SyncDropped != n {
		t.Errorf("counters %+v: want %d redirected and %d dropped (the peer takes no redirected frames)", st, n, n)
	}
}

// A set larger than the maps is refused before anything is written: the
// shortcut keeps the set it had (the agent then withdraws it, as for any
// failed round), never half of a new one.
func TestSyncSetTooLarge(t *testing.T) {
	d, _ := newDatapath(t)
	if err := d.Sync().Set(testSyncSet(1500), time.Hour); err != nil {
		t.Fatal(err)
	}
	var big SyncSet
	for i := range maxSync + 1 {
		big.Targets = append(big.Targets, SyncTarget{VNI: testVNI, MAC: net.HardwareAddr{2, 0, 0, 1, byte(i >> 8), byte(i)}, Ifindex: loIfindex, MTU: 1500})
	}
	if err := d.Sync().Set(big, time.Hour); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("a set of %d targets: %v", len(big.Targets), err)
	}
	if got, _ := d.Sync().Get(); FormatSyncSet(got) != FormatSyncSet(testSyncSet(1500)) {
		t.Errorf("after the refused set: %s", FormatSyncSet(got))
	}
}

// The sync set is lanes agent's to rewrite after the apply, and lapsed
// destinations no longer read back: reset reports neither as someone
// else's change (knobs.Same), but text that is no set at all is.
func TestSyncKnobSame(t *testing.T) {
	k := &SyncKnob{Dir: "/sys/fs/bpf/lanes/x"}
	wrote := "42/02:1a:4e:03:02:01>5@1450;42/02:1a:4e:03:01:01<198.18.0.1;2/198.18.0.2=02:1a:4e:01:02:00"
	for _, c := range []struct {
		read string
		same bool
	}{
		{wrote, true},
		{";42/02:1a:4e:03:01:01<198.18.0.1;2/198.18.0.2=02:1a:4e:01:02:00", true}, // lapsed
		{"42/02:1a:4e:03:02:09>7@1450;;", true},                                   // rewritten by the agent
		{"", true},
		{"not a set", false},
	} {
		if got := knobs.Same(k, []byte(c.read), []byte(wrote)); got != c.same {
			t.Errorf("Same(%q) = %v, want %v", c.read, got, c.same)
		}
	}
}

// Stepped aside (Prio.SetAside), a marked frame for a destination takes
// vanilla's path, the NIC poll, as bulk does, at once; once the deadline
// passed it takes the shortcut again, but as any move onto the shortcut,
// only after the flow's idle gap with none of its frames in flight on the
// longer path.
func TestSyncStepsAside(t *testing.T) {
	defer pinThread(t, 0)() // PLACE_LOCAL: BPF_PROG_RUN on the config's one core
	d := syncDatapath(t, time.Hour, 1500)
	addRule(t, d, "dst "+innerDst.String()+" udp")
	cfg := highAutoConfig(t, d, "bulk auto", func(c *Config) *time.Duration { return &c.BulkAuto })
	cfg.AsideBelow = 50
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	hi := frameSpec{flow: udpFlow(40000), payload: 100}
	step := func(name string, verdict uint32, sync bool) {
		t.Helper()
		ret, _ := runXDP(t, d, vxlanFrame(hi))
		fl := mustFlow(t, d, hi.flow, StageSplit)
		if ret != verdict || fl.Sync != sync || (!sync && fl.CPUIndex != Stay) {
			t.Errorf("%s: verdict %d, flow %+v; want verdict %d, on the shortcut %v, else in the NIC poll", name, ret, fl, verdict, sync)
		}
	}
	step("not aside", xdpRedirect, true)
	if err := d.Prio().SetAside(Now() + time.Hour); err != nil {
		t.Fatal(err)
	}
	step("aside", xdpPass, false)
	step("aside, again", xdpPass, false)
	if err := d.Prio().SetAside(Now() - time.Second); err != nil {
		t.Fatal(err)
	}
	step("deadline passed, frames in flight on the NIC poll's path", xdpPass, false)
	drainFlows(t, d)
	step("deadline passed, none in flight, no idle gap", xdpPass, false)
	cfg.Flowlet = time.Nanosecond
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	drainFlows(t, d)
	step("deadline passed, none in flight, after the idle gap", xdpRedirect, true)
}
