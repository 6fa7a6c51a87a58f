package fast_test

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/policy/fast"
	"github.com/lanesnet/lanes/testbed"
)

// What must never take the fast path, on every layout lanes' testbed
// builds, while a flow between the hosts runs on it:
//   - a datagram larger than the overlay's MTU, whose inner IP fragments
//     carry no ports (only the first does) and so take the kernel's path:
//     the flow's datagrams still arrive in the order they were sent, the
//     later small ones on the fast path never overtaking a fragmented one
//     still on the kernel's path, as vanilla delivers them;
//   - ICMP (no ports to key a flow by): echo requests between the
//     hosts' containers are answered, every one, on the kernel's path;
//   - a flow between two containers of the same host, which the bridge or
//     the host's routing carries without the overlay: nothing of it is
//     counted at the fast path's entry.
func TestFastNeverTakes(t *testing.T) {
	for _, topo := range []testbed.Topology{testbed.Docker, testbed.Flannel, testbed.Calico} {
		t.Run(string(topo), func(t *testing.T) { testNeverTakes(t, modetest.UpTestbed(t, topo)) })
	}
}

func testNeverTakes(t *testing.T, tb *testbed.Testbed) {
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	// Small datagrams with one larger than the MTU every fifth.
	var sizes []int
	for i := range 100 {
		n := 200
		if i%5 == 2 {
			n = 3000
		}
		sizes = append(sizes, n)
	}
	f, _, before := vanillaFlow(t, tb, src, dst, 10)
	inOrder(t, "vanilla", f.sendSizes(t, sizes), sizes)
	local := newUDPFlow(t, r.Containers[1], dst)
	if got := local.send(t, 10); len(got) != 10 {
		t.Fatalf("premise: vanilla delivered %d of 10 datagrams between the receiver's containers", len(got))
	}

	a := modetest.Apply(t, tb, fast.Mode, map[string]string{"x-interval": "100ms"})
	dp := a.Open(t)
	startAgentProcess(t, a)
	waitVouched(t, dp, f, "the flow's entry", func() (int, error) { es, err := dp.Fast().Entries(); return len(es), err })
	c0 := counters(t, dp)
	inOrder(t, "with fragmented datagrams on the kernel's path", f.sendSizes(t, sizes), sizes)
	if c := counters(t, dp).Sub(c0); c.Fast == 0 || c.Passed == 0 {
		t.Errorf("counters %+v: want the small datagrams on the fast path and the fragments passed to the kernel's path", c)
	}

	c0 = counters(t, dp)
	if got := echo(t, src.NetNS, dst.Addr.Addr(), 20); got != 20 {
		t.Errorf("ICMP echo: %d of 20 answered", got)
	}
	if c := counters(t, dp).Sub(c0); c.Fast != 0 || c.FastOut != 0 {
		t.Errorf("ICMP took the fast path: counters %+v", c)
	}

	c0 = counters(t, dp)
	if got := local.send(t, 200); len(got) != 200 {
		t.Errorf("between the receiver's containers: %d of 200 datagrams delivered", len(got))
	}
	if c := counters(t, dp).Sub(c0); c.Fast != 0 || c.FastNoEntry != 0 || c.FastAdmitted != 0 {
		t.Errorf("a flow between containers of one host reached the fast path: counters %+v", c)
	}
	ft, err := control.OpenFast(a.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer ft.Close()
	es, err := ft.List()
	if err != nil || strings.Contains(strings.Join(es, "\n"), r.Containers[1].Addr.Addr().String()+":") {
		t.Errorf("lanes fast list: %q, %v: want no entry of the local flow", es, err)
	}
	a.ResetAndCheck(t, before)
}

// inOrder checks that got is every datagram sent, in the order sent, each
// of its size and with its own payload.
func inOrder(t *testing.T, what string, got []dgram, sizes []int) {
	t.Helper()
	if len(got) != len(sizes) {
		t.Fatalf("%s: %d of %d datagrams delivered", what, len(got), len(sizes))
	}
	for i, d := range got {
		if i > 0 && d.seq != got[i-1].seq+1 {
			t.Fatalf("%s: datagram %d (%d bytes) after %d", what, d.seq, len(d.payload), got[i-1].seq)
		}
		if len(d.payload) != sizes[i] || !bytes.Equal(d.payload, payloadOf(d.seq, sizes[i])) {
			t.Fatalf("%s: datagram %d: %d bytes, not the %d sent", what, d.seq, len(d.payload), sizes[i])
		}
	}
}

// echo sends n ICMP echo requests from namespace ns to dst, one at a
// time, and returns how many were answered within a second each.
func echo(t *testing.T, ns string, dst netip.Addr, n int) int {
	t.Helper()
	var c *net.IPConn
	if err := nsx.Do(ns, func() (err error) {
		c, err = net.ListenIP("ip4:icmp", nil)
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const id = 0x4c4e
	answered := 0
	buf := make([]byte, 1500)
	for seq := range n {
		req := []byte{8, 0, 0, 0, id >> 8, id & 0xff, byte(seq >> 8), byte(seq), 'l', 'a', 'n', 'e', 's'}
		sum := ipv4Checksum(req)
		req[2], req[3] = byte(sum>>8), byte(sum)
		if _, err := c.WriteToIP(req, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			t.Fatalf("ICMP echo: %v", err)
		}
		for deadline := time.Now().Add(time.Second); ; {
			c.SetReadDeadline(deadline)
			m, from, err := c.ReadFromIP(buf)
			if err != nil {
				break
			}
			// The raw socket gets the ICMP message without its IP header.
			if m >= 8 && buf[0] == 0 && from.IP.Equal(dst.AsSlice()) && int(buf[4])<<8|int(buf[5]) == id && int(buf[6])<<8|int(buf[7]) == seq&0xffff {
				answered++
				break
			}
		}
	}
	return answered
}

// ipv4Checksum is the Internet checksum of b.
func ipv4Checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}
