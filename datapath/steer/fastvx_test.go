//go:build linux

package steer

import (
	"testing"
	"time"
)

// The fast path from the VXLAN device under BPF_PROG_RUN: its tc ingress
// (steer_tc_fast_vx) sees the inner frame the kernel's path decapsulated,
// as received on vxIfindex; learning and the order keeping are the
// underlay's (fast_test.go).

// vxLearn runs one frame of s the kernel's path takes, as the fast path
// sees it at the VXLAN device's ingress (noted) and at the veth's egress
// (admitted), bridged.
func vxLearn(t *testing.T, d *Datapath, s frameSpec) {
	t.Helper()
	learnVia(t, d, d.TCFastVX(), innerFrame(s), vxIfindex, innerFrame(s))
	seen(t, d, s) // the learned packet reaches the container
}

// vxHit runs s's inner frame (standing for two segments of gsoSize, if
// given) through the VXLAN device's ingress and wants it redirected
// unchanged: the bridge and the veth change no byte.
func vxHit(t *testing.T, d *Datapath, s frameSpec, gsoSize uint32) {
	t.Helper()
	hitVia(t, d, d.TCFastVX(), innerFrame(s), vxIfindex, gsoSize, innerFrame(s))
	seen(t, d, s)
}

// A flow's frame that the kernel's path took from the VXLAN device to the
// container teaches the fast path; the next frame goes there directly,
// GSO frames (GRO'd TCP, plain TCP GSO after decapsulation) too, which
// the bridge and the veth forward at any length.
func TestFastVXLearnsThenHits(t *testing.T) {
	for _, s := range []frameSpec{
		{flow: udpFlow(40000), payload: 100},
		{flow: tcpFlow(40000), payload: 100},
	} {
		d := fastDatapath(t, time.Hour, fastTestMTU)
		vxLearn(t, d, s)
		es, err := d.Fast().Entries()
		if err != nil || len(es) != 1 || es[0].Ifindex != loIfindex || es[0].TTLDec != 0 || es[0].VTEPSrc.IsValid() && !es[0].VTEPSrc.IsUnspecified() {
			t.Fatalf("entries %+v (%v), want the flow's to lo, bridged, without outer facts", es, err)
		}
		vxHit(t, d, s, 0)
		if s.flow.proto == protoTCP {
			long := s
			long.payload = 2 * fastTestMTU // BPF_PROG_RUN takes at most a page
			vxHit(t, d, long, fastTestMTU-52)
		}
	}
}

// Every inner frame the fast path from the VXLAN device cannot vouch for
// takes the kernel's path, untouched, counted by reason; the entry stays
// for the flow's next good frame.
func TestFastVXMisses(t *testing.T) {
	s := frameSpec{flow: udpFlow(40000), payload: 100}
	with := func(f func(*frameSpec)) []byte {
		c := s
		f(&c)
		return innerFrame(c)
	}
	for _, c := range []struct {
		name  string
		frame []byte
		in    uint32
		want  func(Counters) uint64
	}{
		{"another flow", with(func(c *frameSpec) { c.flow = udpFlow(40001) }), vxIfindex, func(c Counters) uint64 { return c.FastNoEntry }},
		{"another device", innerFrame(s), ulIfindex, func(c Counters) uint64 { return c.Passed }},
		{"another inner source MAC", with(func(c *frameSpec) { c.innerSrcMAC = otherMAC }), vxIfindex, func(c Counters) uint64 { return c.FastOther }},
		{"bad inner IP checksum", with(func(c *frameSpec) { c.innerIP.badCsum = true }), vxIfindex, func(c Counters) uint64 { return c.FastRefused }},
		{"inner IP options", with(func(c *frameSpec) { c.innerIP.ihl = 6 }), vxIfindex, func(c Counters) uint64 { return c.FastRefused }},
		{"trailing bytes", append(innerFrame(s), 0, 0, 0, 0), vxIfindex, func(c Counters) uint64 { return c.FastRefused }},
		{"a fragment", with(func(c *frameSpec) { c.innerIP.frag = 0x2000 }), vxIfindex, func(c Counters) uint64 { return c.Passed }},
		{"a VLAN tag", with(func(c *frameSpec) { c.innerVLAN = true }), vxIfindex, func(c Counters) uint64 { return c.Passed }},
		{"longer than the MTU", with(func(c *frameSpec) { c.payload = fastTestMTU }), vxIfindex, func(c Counters) uint64 { return c.FastRefused }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := fastDatapath(t, time.Hour, fastTestMTU)
			vxLearn(t, d, s)
			missVia(t, d, d.TCFastVX(), c.frame, c.in, 0, c.name, c.want)
			vxHit(t, d, s, 0)
		})
	}
}

// A frame of the flow on the kernel's path from the VXLAN device (no
// entry yet, or one a change voided) holds the flow's next frames there
// until its container's ingress saw it; FIN ends the entry.
func TestFastVXKeepsOrderAndEnds(t *testing.T) {
	d := fastDatapathNoDrain(t)
	s := frameSpec{flow: tcpFlow(40000), payload: 100}
	vxLearn(t, d, s)
	bad := s
	bad.innerIP.badCsum = true
	if ret, _ := fastRun(t, d.TCFastVX(), innerFrame(bad), vxIfindex, 0); ret != tcUnspec {
		t.Fatalf("a refused frame: verdict %d", ret)
	}
	c0 := stats(t, d)[StageSplit]
	if ret, _ := fastRun(t, d.TCFastVX(), innerFrame(s), vxIfindex, 0); ret != tcUnspec {
		t.Fatalf("a frame behind one on the kernel's path: verdict %d, want the kernel's path too", ret)
	}
	if c := stats(t, d)[StageSplit].Sub(c0); c.FastBehind != 1 || c.Fast != 0 {
		t.Fatalf("counters %+v, want one frame behind", c)
	}
	seen(t, d, s)
	seen(t, d, s)
	vxHit(t, d, s, 0)

	fin := innerFrame(s)
	fin[ethHeaderLen+20+13] |= 0x01
	c0 = stats(t, d)[StageSplit]
	if ret, _ := fastRun(t, d.TCFastVX(), fin, vxIfindex, 0); ret != tcUnspec {
		t.Fatalf("FIN: verdict %d, want the kernel's path", ret)
	}
	if c := stats(t, d)[StageSplit].Sub(c0); c.FastEnded != 1 {
		t.Fatalf("FIN: counters %+v, want the entry ended", c)
	}
	if es, err := d.Fast().Entries(); err != nil || len(es) != 0 {
		t.Fatalf("entries after FIN: %+v, %v", es, err)
	}
}

// With FastNoGSO a GSO frame at the VXLAN device takes the kernel's path,
// counted as GSO, as at the underlay; the flow's next single frame waits
// behind it, then takes the fast path.
func TestFastVXNoGSO(t *testing.T) {
	d := fastDatapathNoDrain(t)
	cfg, err := d.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.FastNoGSO = true
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	s := frameSpec{flow: tcpFlow(40000), payload: 100}
	vxLearn(t, d, s)
	long := s
	long.payload = 2 * fastTestMTU
	missVia(t, d, d.TCFastVX(), innerFrame(long), vxIfindex, fastTestMTU-52, "a GSO frame", func(c Counters) uint64 { return c.FastGSO })
	missVia(t, d, d.TCFastVX(), innerFrame(s), vxIfindex, 0, "a frame behind it", func(c Counters) uint64 { return c.FastBehind })
	seen(t, d, s)
	seen(t, d, s)
	vxHit(t, d, s, 0)
}
