package stress

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/bench/workload"
	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
)

// Test addresses: 198.18.0.0/15 only (RFC 2544 benchmarking space), so
// nothing generated here can reach a real network.
var (
	sndMAC      = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	rcvMAC      = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	innerSrcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x01, 0x01}
	vxMAC       = net.HardwareAddr{0x02, 0, 0, 0, 0x01, 0x02}
	sndPrefix   = netip.MustParsePrefix("198.18.0.1/24")
	rcvPrefix   = netip.MustParsePrefix("198.18.0.2/24")
	vxPrefix    = netip.MustParsePrefix("198.19.0.2/24")
	innerSrc    = netip.MustParseAddr("198.19.0.1")
)

const testVNI = 42

// testTarget is a Target whose devices need not exist (for tests that
// never send).
func testTarget() Target {
	return Target{
		SenderDev: "u0",
		SrcMAC:    sndMAC, DstMAC: rcvMAC,
		SrcIP: sndPrefix.Addr(), DstIP: rcvPrefix.Addr(),
		VNI:         testVNI,
		InnerSrcMAC: innerSrcMAC, InnerDstMAC: vxMAC,
		InnerSrcIP: innerSrc, InnerDstIP: vxPrefix.Addr(),
	}
}

// pair is two throwaway "hosts": snd's u0 is veth-peered with rcv's u1,
// and rcv has a VXLAN device (VNI 42, port 4789) with address vxPrefix,
// which is where the sink binds.
type pair struct {
	snd, rcv string
	target   Target
}

func newPair(t testing.TB) *pair {
	t.Helper()
	testenv.Root(t)
	id := make([]byte, 3)
	rand.Read(id)
	p := &pair{snd: "lst-" + hex.EncodeToString(id) + "-s", rcv: "lst-" + hex.EncodeToString(id) + "-r"}
	// Deleting the namespaces takes every device in them along (the veth
	// pair dies with either end), so this is the whole cleanup.
	t.Cleanup(func() {
		for _, ns := range []string{p.snd, p.rcv} {
			if err := nsx.Delete(ns); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(nsx.Create(p.snd))
	must(nsx.Create(p.rcv))
	must(addVeth(p.snd, "u0", sndMAC, p.rcv, "u1", rcvMAC))
	must(addVXLAN(p.rcv, "vx0", vxMAC, testVNI, DefaultVXLANPort))
	must(upWithAddr(p.snd, "u0", sndPrefix))
	must(upWithAddr(p.rcv, "u1", rcvPrefix))
	must(upWithAddr(p.rcv, "vx0", vxPrefix))
	// The receiving veth must run NAPI or it drops what XDP redirects
	// into its peer.
	must(ethtool.Set(p.rcv, "u1", ethtool.GRO, true))
	if on, err := ethtool.Get(p.rcv, "u1", ethtool.GRO); err != nil || !on {
		t.Fatalf("gro on u1: %v %v", on, err)
	}
	p.target = testTarget()
	p.target.SenderNetNS = p.snd
	return p
}

func TestFrameLayout(t *testing.T) {
	const payload = 100
	b, err := buildFrame(testTarget(), frameSpec{payload: payload, srcPort: 1234, dstPort: 5678, outerSport: 50000})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != headersLen+payload {
		t.Fatalf("frame is %d bytes, want %d", len(b), headersLen+payload)
	}
	be16 := func(off int) int { return int(binary.BigEndian.Uint16(b[off:])) }
	checkEth := func(off int, dst, src net.HardwareAddr) {
		t.Helper()
		if !bytes.Equal(b[off:off+6], dst) || !bytes.Equal(b[off+6:off+12], src) || be16(off+12) != 0x0800 {
			t.Errorf("ethernet at %d: % x", off, b[off:off+14])
		}
	}
	checkIP := func(off int, src, dst netip.Addr) {
		t.Helper()
		h := b[off : off+ipv4Len]
		if h[0] != 0x45 || h[9] != 17 || h[8] == 0 {
			t.Errorf("ipv4 at %d: version/ihl %#x proto %d ttl %d", off, h[0], h[9], h[8])
		}
		if be16(off+2) != len(b)-off {
			t.Errorf("ipv4 at %d: total length %d, want %d", off, be16(off+2), len(b)-off)
		}
		if ipChecksum(h) != 0 {
			t.Errorf("ipv4 at %d: bad header checksum %#04x", off, be16(off+10))
		}
		if be16(off+6)&0x3fff != 0 {
			t.Errorf("ipv4 at %d: fragmented (%#04x)", off, be16(off+6))
		}
		if netip.AddrFrom4([4]byte(h[12:16])) != src || netip.AddrFrom4([4]byte(h[16:20])) != dst {
			t.Errorf("ipv4 at %d: %v -> %v", off, h[12:16], h[16:20])
		}
	}
	checkUDP := func(off, sport, dport int) {
		t.Helper()
		if be16(off) != sport || be16(off+2) != dport || be16(off+4) != len(b)-off || be16(off+6) != 0 {
			t.Errorf("udp at %d: % x (want ports %d->%d, length %d, checksum 0)", off, b[off:off+8], sport, dport, len(b)-off)
		}
	}
	tg := testTarget()
	checkEth(0, rcvMAC, sndMAC)
	checkIP(offOuterIP, tg.SrcIP, tg.DstIP)
	checkUDP(offOuterUDP, 50000, DefaultVXLANPort)
	if got := binary.BigEndian.Uint32(b[offVXLAN:]); got != 0x08000000 {
		t.Errorf("vxlan flags %#x", got)
	}
	if got := binary.BigEndian.Uint32(b[offVXLAN+4:]); got>>8 != testVNI || got&0xff != 0 {
		t.Errorf("vxlan vni word %#x, want VNI %d", got, testVNI)
	}
	checkEth(offInnerEth, vxMAC, innerSrcMAC)
	checkIP(offInnerIP, tg.InnerSrcIP, tg.InnerDstIP)
	checkUDP(offInnerUDP, 1234, 5678)
	if len(b)-offPayload != payload || !bytes.Equal(b[offPayload:], make([]byte, payload)) {
		t.Errorf("payload is not %d zero bytes", payload)
	}

	for _, bad := range []int{MinPayload - 1, MaxPayload + 1} {
		if _, err := buildFrame(testTarget(), frameSpec{payload: bad}); err == nil {
			t.Errorf("payload %d accepted", bad)
		}
	}
	tg.InnerDstIP = netip.MustParseAddr("2001:db8::1")
	if _, err := buildFrame(tg, frameSpec{payload: 64}); err == nil {
		t.Error("IPv6 inner address accepted")
	}
}

func TestPlainFrameLayout(t *testing.T) {
	tg := testTarget()
	tg.Plain = true
	tg.InnerSrcMAC, tg.InnerDstMAC, tg.InnerSrcIP, tg.InnerDstIP = nil, nil, netip.Addr{}, netip.Addr{} // unused
	const payload = 64
	b, err := buildFrame(tg, frameSpec{payload: payload, srcPort: 1234, dstPort: 5678, outerSport: 50000})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != offPlainPayload+payload {
		t.Fatalf("frame is %d bytes, want %d", len(b), offPlainPayload+payload)
	}
	// The same frame, built by hand: Ethernet, IPv4 (DF, TTL 64, UDP),
	// UDP 1234 -> 5678 with checksum 0, 64 zero bytes.
	want := append([]byte(nil), rcvMAC...)
	want = append(want, sndMAC...)
	want = append(want, 0x08, 0x00)
	ip := []byte{0x45, 0, 0, byte(len(b) - ethLen), 0, 0, 0x40, 0, 64, 17, 0, 0}
	ip = append(ip, tg.SrcIP.AsSlice()...)
	ip = append(ip, tg.DstIP.AsSlice()...)
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	want = append(want, ip...)
	want = append(want, 0x04, 0xd2, 0x16, 0x2e, 0, byte(udpLen+payload), 0, 0)
	want = append(want, make([]byte, payload)...)
	if !bytes.Equal(b, want) {
		t.Fatalf("plain frame\n got % x\nwant % x", b, want)
	}
	tg.DstIP = netip.Addr{}
	if _, err := buildFrame(tg, frameSpec{payload: payload}); err == nil {
		t.Error("plain frame without a destination address accepted")
	}
}

// loadTestGen loads the generator (probing live frames) and points its
// devmap at lo, so runs end in XDP_REDIRECT without a real device.
func loadTestGen(t *testing.T, tg Target, cfg GenConfig) *Generator {
	t.Helper()
	testenv.Root(t)
	g, err := NewGenerator(tg, cfg)
	if errors.Is(err, ebpf.ErrNotSupported) {
		if kernelAtLeast(t, 5, 18) {
			t.Fatalf("kernel supports live frames but: %v", err)
		}
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.objs.TxPort.Put(uint32(0), uint32(1)); err != nil {
		t.Fatal(err)
	}
	return g
}

// genMeta is GEN_META of xdp_gen.c: the metadata every generated frame
// carries.
const genMeta = 4

// The program writes the sequence and the source ports at the offsets
// frame.go builds, for both layouts, and nothing else (and 4 zero bytes
// of metadata before them).
func TestXDPGenRewritesOnlySeqAndPorts(t *testing.T) {
	const flows, runLen = 3, 2
	cfg := GenConfig{Flows: flows, RunLen: runLen, SrcPort: 30000, OuterSrcPort: 40000, DstPort: 7000}
	plain := testTarget()
	plain.Plain = true
	for _, c := range []struct {
		name          string
		target        Target
		seq, sport    int // offsets of the sequence and the flow's UDP source port
		outer         int // offset of the outer source port; -1: none
		headers, size int
	}{
		{"vxlan", testTarget(), offPayload, offInnerUDP, offOuterUDP, headersLen, headersLen + DefaultPayload},
		{"plain", plain, offPlainPayload, offPlainUDP, -1, offPlainPayload, offPlainPayload + DefaultPayload},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := loadTestGen(t, c.target, cfg)
			in := g.Frame()
			if len(in) != c.size {
				t.Fatalf("frame of %d bytes, want %d", len(in), c.size)
			}
			next := make([]uint64, flows)
			for k := 0; k < 20; k++ {
				// Every other run gets a page a receiver wrote into, as a
				// routing receiver does (TTL, checksum, a new Ethernet
				// header over the VNI's last byte): the program must put
				// the headers back.
				data := in
				if k%2 == 1 {
					data = append([]byte(nil), in...)
					for i := range c.headers + seqLen {
						data[i] ^= 0x5a
					}
				}
				// The output starts with the metadata every frame
				// carries (GEN_META in xdp_gen.c): 4 zero bytes.
				out := make([]byte, genMeta+len(in))
				ret, err := g.objs.XdpGen.Run(&ebpf.RunOptions{Data: data, DataOut: out})
				if err != nil {
					t.Fatal(err)
				}
				if ret != 4 { // XDP_REDIRECT
					t.Fatalf("packet %d: verdict %d, want XDP_REDIRECT", k, ret)
				}
				flow := (k / runLen) % flows
				want := append([]byte(nil), in...)
				binary.BigEndian.PutUint64(want[c.seq:], next[flow])
				if c.outer >= 0 {
					binary.BigEndian.PutUint16(want[c.outer:], uint16(40000+flow))
				}
				binary.BigEndian.PutUint16(want[c.sport:], uint16(30000+flow))
				next[flow]++
				if !bytes.Equal(out[:genMeta], make([]byte, genMeta)) {
					t.Fatalf("packet %d: metadata % x, want %d zero bytes", k, out[:genMeta], genMeta)
				}
				out = out[genMeta:]
				if !bytes.Equal(out, want) {
					t.Fatalf("packet %d (flow %d):\n got % x\nwant % x", k, flow, out, want)
				}
			}
			st, err := g.readStats()
			if err != nil {
				t.Fatal(err)
			}
			if st.Sent != 20 || st.Held != 0 || st.Error != 0 {
				t.Errorf("stats %+v, want 20 sent", st)
			}
			// A frame too short for its layout is dropped, not written.
			short := in[:c.headers+seqLen-1]
			if ret, err := g.objs.XdpGen.Run(&ebpf.RunOptions{Data: short}); err != nil || ret != 1 {
				t.Errorf("short frame: verdict %d (%v), want XDP_DROP", ret, err)
			}
		})
	}
}

// The pacer at one packet per second: runs right after a sent one are
// held (dropped) without consuming a sequence number. In trains of 4 the
// first four runs leave back to back and the next train is due four
// seconds later; a train's packets are ordinary ones, each taking the next
// sequence number.
func TestXDPGenPacer(t *testing.T) {
	const redirect, drop = 4, 1
	for _, tc := range []struct {
		name     string
		cfg      GenConfig
		verdicts []uint32
		sent     uint64
	}{
		{"evenly spaced", GenConfig{Rate: 1, Burst: 1}, []uint32{redirect, drop, drop}, 1},
		{"trains of 4", GenConfig{Rate: 1, Burst: 4, Train: 4}, []uint32{redirect, redirect, redirect, redirect, drop, drop}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := loadTestGen(t, testTarget(), tc.cfg)
			in := g.Frame()
			for k, want := range tc.verdicts {
				ret, err := g.objs.XdpGen.Run(&ebpf.RunOptions{Data: in})
				if err != nil {
					t.Fatal(err)
				}
				if ret != want {
					t.Fatalf("run %d: verdict %d, want %d", k, ret, want)
				}
			}
			var seq uint64
			if err := g.objs.FlowSeq.Lookup(uint32(0), &seq); err != nil || seq != tc.sent {
				t.Fatalf("flow 0 next sequence %d (%v), want %d", seq, err, tc.sent)
			}
			held := uint64(len(tc.verdicts)) - tc.sent
			if st, _ := g.readStats(); st.Sent != tc.sent || st.Held != held {
				t.Errorf("stats %+v, want %d sent, %d held", st, tc.sent, held)
			}
		})
	}
}

// The pacer's gaps, read from its schedule (state.next_fp) one run at a
// time: evenly spaced, every gap is the interval; Poisson, every gap is
// the interval times an entry of the exponential table, the entries vary,
// and their mean is the interval (a distribution check on the kernel's
// PRNG, not a timing one: each run is made due by setting the schedule
// 1 ms into the past, inside a burst allowance of seconds).
func TestXDPGenArrivalGaps(t *testing.T) {
	const runs = 20000
	for _, arrivals := range []string{ArrivalsEven, ArrivalsPoisson} {
		t.Run(arrivals, func(t *testing.T) {
			g := loadTestGen(t, testTarget(), GenConfig{Rate: 1e6, Burst: 1 << 20, Arrivals: arrivals})
			in := g.Frame()
			const interval = 1000 << 8 // 1 µs at 1 Mpps, in ns << 8
			q := expQuantiles()
			table := map[uint64]bool{}
			for _, v := range q {
				table[uint64(interval)*uint64(v)>>expQShift] = true
			}
			seen := map[uint64]bool{}
			var sum float64
			for k := 0; k < runs; k++ {
				var ts unix.Timespec
				if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
					t.Fatal(err)
				}
				var st xdpGenGenState
				if err := g.objs.State.Lookup(uint32(0), &st); err != nil {
					t.Fatal(err)
				}
				st.NextFp = uint64(ts.Nano()-int64(time.Millisecond)) << 8
				st.Left = 0
				if err := g.objs.State.Put(uint32(0), st); err != nil {
					t.Fatal(err)
				}
				if ret, err := g.objs.XdpGen.Run(&ebpf.RunOptions{Data: in}); err != nil || ret != 4 {
					t.Fatalf("run %d: verdict %d (%v), want XDP_REDIRECT", k, ret, err)
				}
				before := st.NextFp
				if err := g.objs.State.Lookup(uint32(0), &st); err != nil {
					t.Fatal(err)
				}
				gap := st.NextFp - before
				switch {
				case arrivals == ArrivalsEven && gap != interval:
					t.Fatalf("run %d: gap %d, want the interval %d", k, gap, interval)
				case arrivals == ArrivalsPoisson && !table[gap]:
					t.Fatalf("run %d: gap %d is no entry of the exponential table times the interval", k, gap)
				}
				seen[gap] = true
				sum += float64(gap)
			}
			if st, _ := g.readStats(); st.Stall != 0 || st.Sent != runs {
				t.Errorf("stats %+v, want %d sent, no stall", st, runs)
			}
			mean := sum / runs / interval
			t.Logf("%s: %d distinct gaps, mean %.4f intervals", arrivals, len(seen), mean)
			if arrivals == ArrivalsPoisson {
				// 20000 draws of Exp(1): the mean's standard error is 0.7%.
				if mean < 0.95 || mean > 1.05 {
					t.Errorf("mean gap %.4f intervals, want 1", mean)
				}
				if len(seen) < expQSize/2 {
					t.Errorf("%d distinct gaps in %d draws from %d entries", len(seen), runs, expQSize)
				}
			}
		})
	}
}

// The exponential table has mean exactly 1 (in its fixed point), rises
// with its index and ends near the Exp(1) quantile of its last midpoint.
func TestExpQuantiles(t *testing.T) {
	q := expQuantiles()
	sum := 0
	for i, v := range q {
		sum += int(v)
		if i > 0 && v < q[i-1] {
			t.Fatalf("entry %d (%d) below entry %d (%d)", i, v, i-1, q[i-1])
		}
	}
	if sum != expQSize<<expQShift {
		t.Errorf("sum %d, want %d (mean 1)", sum, expQSize<<expQShift)
	}
	last := float64(q[expQSize-1]) / (1 << expQShift)
	if want := math.Log(2 * expQSize); math.Abs(last-want) > 0.01 {
		t.Errorf("longest gap %.3f means, want %.3f", last, want)
	}
	if first := float64(q[0]) / (1 << expQShift); first > 0.001 {
		t.Errorf("shortest gap %.4f means, want about 0.0005", first)
	}
}

func TestGenConfigTrain(t *testing.T) {
	for _, tc := range []struct {
		train int
		ok    bool
	}{{0, true}, {1, true}, {64, true}, {MaxTrain, true}, {MaxTrain + 1, false}, {-1, false}} {
		err := GenConfig{Rate: 1000, Train: tc.train}.withDefaults().validate()
		if (err == nil) != tc.ok {
			t.Errorf("train %d: error %v, want ok=%v", tc.train, err, tc.ok)
		}
	}
	if err := (GenConfig{Rate: 1000, Burst: 16, Train: 32}).withDefaults().validate(); err == nil {
		t.Error("a train longer than the burst accepted")
	}
	if err := (GenConfig{Rate: 1000, Arrivals: "bursty"}).withDefaults().validate(); err == nil || !strings.Contains(err.Error(), "poisson") {
		t.Errorf("unknown arrivals: error %v, want one naming the choices", err)
	}
}

func TestProbeErrors(t *testing.T) {
	for _, errno := range []unix.Errno{unix.EINVAL, 524} {
		err := probeError(errno)
		var ue *UnsupportedError
		if !errors.As(err, &ue) || !errors.Is(err, ebpf.ErrNotSupported) || !errors.Is(err, errno) {
			t.Fatalf("%v: got %v, want an UnsupportedError matching ErrNotSupported", errno, err)
		}
		if got := err.Error(); got != "live frames not supported (needs Linux >= 5.18)" {
			t.Fatalf("message %q", got)
		}
	}
	if err := probeError(unix.EPERM); errors.Is(err, ebpf.ErrNotSupported) || !errors.Is(err, unix.EPERM) {
		t.Fatalf("EPERM became %v", err)
	}
	if probeError(nil) != nil {
		t.Fatal("success became an error")
	}
}

func kernelAtLeast(t *testing.T, major, minor int) bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var maj, min int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &maj, &min)
	return maj > major || maj == major && min >= minor
}

// Frames reach a sink through the receiving host's stack: VXLAN frames
// the container-like VXLAN address, plain ones the underlay address.
func TestEndToEnd(t *testing.T) {
	p := newPair(t)
	for _, c := range []struct {
		name  string
		plain bool
		sink  netip.Addr
	}{
		{"vxlan", false, vxPrefix.Addr()},
		{"plain", true, rcvPrefix.Addr()},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tg := p.target
			tg.Plain = c.plain
			w := NewUDPStress(tg, GenConfig{CPU: -1})
			if w.Name() != "udp_stress" {
				t.Fatalf("name %q", w.Name())
			}
			// A modest rate that one core absorbs without loss or reordering.
			res, err := w.Run(ctx,
				workload.Endpoint{NetNS: p.rcv, Addr: c.sink},
				workload.Endpoint{Addr: innerSrc},
				workload.Point{Proto: "udp", MsgSize: 64, Flows: 4, Rate: 20000, Duration: time.Second, Port: 9000})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", res)
			if res.Extra["udp_received"] == 0 || res.PPS <= 0 || res.SentPPS <= 0 {
				t.Fatalf("nothing received: %+v", res)
			}
			if res.Extra["udp_flows"] != 4 {
				t.Errorf("sink saw %v flows, want 4", res.Extra["udp_flows"])
			}
			if res.UDPReorder != 0 {
				t.Errorf("%d datagrams reordered", res.UDPReorder)
			}
			if res.Extra["udp_received"] > res.Extra["udp_sent"] {
				t.Errorf("received %v > sent %v", res.Extra["udp_received"], res.Extra["udp_sent"])
			}
		})
	}
}

func TestSeqAccount(t *testing.T) {
	var st SinkStats
	a := newSeqAccount(&st)
	dgram := func(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }
	// Flow 1: 0 1 3 2 4 (one late arrival, nothing lost).
	for _, seq := range []uint64{0, 1, 3, 2, 4} {
		a.add(1, dgram(seq), 64)
	}
	// Flow 2 starts mid-stream: 10 11 15 (12..14 lost).
	for _, seq := range []uint64{10, 11, 15} {
		a.add(2, dgram(seq), 64)
	}
	a.add(3, []byte{1, 2}, 2) // too short for a sequence number
	a.finish()
	want := SinkStats{Datagrams: 9, Bytes: 8*64 + 2, Short: 1, Flows: 2, Reorder: 1, Lost: 3}
	if st != want {
		t.Fatalf("got %+v\nwant %+v", st, want)
	}
}

func TestGeneratorStopsOnCancel(t *testing.T) {
	p := newPair(t)
	g, err := NewGenerator(p.target, GenConfig{CPU: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	st, err := g.Run(ctx, 0) // no duration: only the cancel ends it
	if err != nil {
		t.Fatal(err)
	}
	if st.Sent == 0 || st.Elapsed <= 0 || st.Errors != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Sequence numbers carry on into the next Run.
	var next uint64
	if err := g.objs.FlowSeq.Lookup(uint32(0), &next); err != nil || next != st.Sent {
		t.Fatalf("flow 0 next sequence %d (%v), want %d", next, err, st.Sent)
	}
}

// A yielding generator sends from a SCHED_IDLE thread: while it runs, one
// thread of this process has that policy, and none once it returned.
func TestGeneratorYields(t *testing.T) {
	p := newPair(t)
	g, err := NewGenerator(p.target, GenConfig{CPU: -1, Yield: true})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		st  GenStats
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := g.Run(ctx, 0)
		done <- result{st, err}
	}()
	seen := false
	for deadline := time.Now().Add(5 * time.Second); !seen && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		seen = idleThreads(t) > 0
	}
	cancel()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !seen {
		t.Fatal("no thread of the process ran SCHED_IDLE while the generator sent")
	}
	if r.st.Sent == 0 {
		t.Fatalf("a yielding generator on an idle machine sent nothing: %+v", r.st)
	}
	// The locked thread exits with its goroutine, just after Run saw it
	// finish: give it a moment.
	n := idleThreads(t)
	for deadline := time.Now().Add(2 * time.Second); n != 0 && time.Now().Before(deadline); n = idleThreads(t) {
		time.Sleep(10 * time.Millisecond)
	}
	if n != 0 {
		t.Errorf("%d SCHED_IDLE threads left after Run: the generator's thread must die with its run", n)
	}
}

func idleThreads(t *testing.T) int {
	t.Helper()
	n, err := kthread.ThreadsAt(unix.SCHED_IDLE)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
