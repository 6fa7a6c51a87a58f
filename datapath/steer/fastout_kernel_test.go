//go:build linux

package steer

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/internal/testenv"
)

// The fast path out against the kernel's own path: a host namespace with
// a container's veth (cv0, its host side hv0) on a bridge with a VXLAN
// device (the docker layout), whose underlay ul0 is a veth to a peer
// namespace (ul1). Frames a test writes onto cv0 (AF_PACKET) take the
// kernel's path out; ul1 captures what leaves ul0, with its checksums
// finished (ul0 checksums in software: tx offload off).

// outbed is that setup.
type outbed struct {
	host, peer   string
	cv, hv, ul   int // ifindexes in host
	cvMAC, ulMAC net.HardwareAddr
	peerMAC      net.HardwareAddr
	portMin      uint16
	portMax      uint16
	inject       int // AF_PACKET socket on cv0
	capture      int // AF_PACKET socket on ul1
}

var (
	outLocal  = netip.MustParseAddr("198.18.0.1")
	outRemote = netip.MustParseAddr("198.18.0.2")
	// outDstMAC is the remote container's MAC: the VXLAN device sends
	// every frame to outRemote.
	outDstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x22}
	// outInnerSrc and outInnerDst are the containers' addresses.
	outInnerSrc = netip.MustParseAddr("198.18.1.1")
	outInnerDst = netip.MustParseAddr("198.18.1.2")
)

func newOutbed(t *testing.T) *outbed {
	t.Helper()
	testenv.Root(t)
	b := &outbed{host: scratchNetNS(t), peer: scratchNetNS(t)}
	var peer *os.File
	err := nsx.Do(b.peer, func() (err error) {
		peer, err = os.Open("/proc/thread-self/ns/net")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if err := nsx.Do(b.host, func() error { return b.build(int(peer.Fd())) }); err != nil {
		t.Fatalf("building the host namespace: %v", err)
	}
	if out, err := exec.Command("nsenter", "--net="+nsx.Path(b.host), "ethtool", "-K", "ul0", "tx", "off").CombinedOutput(); err != nil {
		t.Fatalf("ethtool -K ul0 tx off: %v: %s", err, out)
	}
	if err := nsx.Do(b.peer, b.buildPeer); err != nil {
		t.Fatalf("building the peer namespace: %v", err)
	}
	t.Cleanup(func() { unix.Close(b.inject); unix.Close(b.capture) })
	return b
}

// build makes the host namespace's devices (the calling thread's), ul1 in
// the namespace peerFd, and the socket that writes onto cv0.
func (b *outbed) build(peerFd int) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	steps := []func() error{
		func() error { return netlink.LinkSetUp(lo) },
		func() error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0"}, PeerName: "ul1", PeerNamespace: netlink.NsFd(peerFd)})
		},
		func() error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "hv0"}, PeerName: "cv0"})
		},
		func() error { return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	ul, err := netlink.LinkByName("ul0")
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(ul, &netlink.Addr{IPNet: &net.IPNet{IP: outLocal.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		return err
	}
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan0"}, VxlanId: testVNI, VtepDevIndex: ul.Attrs().Index,
		SrcAddr: outLocal.AsSlice(), Group: outRemote.AsSlice(), Port: testPort, UDPCSum: true, Learning: false}
	if err := netlink.LinkAdd(vx); err != nil {
		return err
	}
	for _, n := range []string{"ul0", "hv0", "cv0", "br0", "vxlan0"} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			return err
		}
		if n == "hv0" || n == "vxlan0" {
			if err := netlink.LinkSetMasterByIndex(l, mustIndex("br0")); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
	}
	b.ul, b.hv, b.cv = mustIndex("ul0"), mustIndex("hv0"), mustIndex("cv0")
	b.ulMAC, b.cvMAC = mustMAC("ul0"), mustMAC("cv0")
	r, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return err
	}
	if _, err := fmt.Sscan(string(r), &b.portMin, &b.portMax); err != nil {
		return fmt.Errorf("ip_local_port_range %q: %w", r, err)
	}
	b.inject, err = packetSocket(b.cv)
	return err
}

// buildPeer brings ul1 up with outRemote, makes it ul0's static neighbour
// and opens the capture on it.
func (b *outbed) buildPeer() error {
	l, err := netlink.LinkByName("ul1")
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: outRemote.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return err
	}
	b.peerMAC = l.Attrs().HardwareAddr
	b.capture, err = packetSocket(l.Attrs().Index)
	if err != nil {
		return err
	}
	tv := unix.NsecToTimeval(int64(time.Second))
	if err := unix.SetsockoptTimeval(b.capture, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	return nsx.Do(b.host, func() error {
		return netlink.NeighSet(&netlink.Neigh{LinkIndex: b.ul, IP: outRemote.AsSlice(), HardwareAddr: b.peerMAC, State: netlink.NUD_PERMANENT, Family: unix.AF_INET})
	})
}

func mustIndex(name string) int {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0
	}
	return l.Attrs().Index
}

func mustMAC(name string) net.HardwareAddr {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil
	}
	return l.Attrs().HardwareAddr
}

// packetSocket is an AF_PACKET socket bound to ifindex, in the calling
// thread's namespace.
func packetSocket(ifindex int) (int, error) {
	all := int(htons(unix.ETH_P_ALL))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, all)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(all), Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// send writes frame onto cv0 and returns the VXLAN frame ul1 captured for
// it (nil if none came within a second).
func (b *outbed) send(t *testing.T, frame []byte) []byte {
	t.Helper()
	if err := unix.Sendto(b.inject, frame, 0, &unix.SockaddrLinklayer{Ifindex: b.cv}); err != nil {
		t.Fatalf("writing onto cv0: %v", err)
	}
	buf := make([]byte, 65536)
	for {
		n, from, err := unix.Recvfrom(b.capture, buf, 0)
		if err != nil {
			return nil
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		f := buf[:n]
		// The VXLAN frame of an inner IPv4 packet to the remote
		// container (not the IPv6 the host's devices send).
		if len(f) > fastOuterLen+ethHeaderLen+20 && binary.BigEndian.Uint16(f[12:]) == ethIPv4 && f[ethHeaderLen+9] == protoUDP &&
			binary.BigEndian.Uint16(f[ethHeaderLen+22:]) == testPort && binary.BigEndian.Uint16(f[fastOuterLen+12:]) == ethIPv4 &&
			netip.AddrFrom4([4]byte(f[fastOuterLen+ethHeaderLen+16:])) == outInnerDst {
			return slices.Clone(f)
		}
	}
}

// attach loads the fast path with lanes agent's word for the bed's way
// out and attaches it to hv0's ingress and ul0's egress.
func (b *outbed) attach(t *testing.T) *Datapath {
	t.Helper()
	d, cores := newDatapath(t)
	if err := d.SetConfig(Config{Enabled: true, CPUs: cores, Flowlet: time.Hour, VXLANPort: testPort, VNIs: []uint32{testVNI}, Fast: true, FastIdle: time.Hour}); err != nil {
		t.Fatal(err)
	}
	path := FastOutPath{VXLANs: []FastOutVXLAN{{VNI: testVNI, PortMin: b.portMin, PortMax: b.portMax, MTU: 1450}}, Veths: []uint32{uint32(b.hv)}, Underlays: []uint32{uint32(b.ul)}}
	if _, err := d.Fast().SetOutPath(path); err != nil {
		t.Fatal(err)
	}
	if err := d.Fast().Renew(time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	err := nsx.Do(b.host, func() error {
		for _, a := range []struct {
			p   *ebpf.Program
			dev int
			at  ebpf.AttachType
		}{{d.TCFastOutLearn(), b.ul, ebpf.AttachTCXEgress}, {d.TCFastOut(), b.hv, ebpf.AttachTCXIngress}} {
			l, err := link.AttachTCX(link.TCXOptions{Interface: a.dev, Program: a.p, Attach: a.at})
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
		}
		return nil
	})
	if err != nil {
		t.Fatalf("attaching: %v", err)
	}
	return d
}

// runOut runs steer_tc_out on frame as an skb received on hv0.
func (b *outbed) runOut(t *testing.T, d *Datapath, frame []byte) (uint32, []byte) {
	t.Helper()
	var ret uint32
	var out []byte
	err := nsx.Do(b.host, func() error {
		var ctx skbCtx
		binary.NativeEndian.PutUint32(ctx[skbIfindexOff:], uint32(b.hv))
		opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx}
		var err error
		ret, err = d.TCFastOut().Run(&opts)
		out = opts.DataOut
		return err
	})
	if err != nil {
		t.Fatalf("running steer_tc_out: %v", err)
	}
	return ret, out
}

// sameButID compares two VXLAN frames with their outer IP ids (which the
// device varies per packet) taken as equal.
func sameButID(got, want []byte) bool {
	if len(got) != len(want) || len(got) < fastOuterLen {
		return false
	}
	g := slices.Clone(got)
	copy(g[ethHeaderLen+4:ethHeaderLen+6], want[ethHeaderLen+4:])
	binary.BigEndian.PutUint16(g[ethHeaderLen+10:], ipv4Checksum(g[ethHeaderLen:ethHeaderLen+20]))
	return slices.Equal(g, want)
}

// frame is a frame cv0 sends: UDP or TCP (final checksums) from the
// container to the remote one, with IP id id and TOS tos.
func (b *outbed) frame(proto uint8, id uint16, tos uint8, payload int) []byte {
	f := flowSpec{src: outInnerSrc, dst: outInnerDst, sport: 40000, dport: 9999, proto: proto}
	s := frameSpec{flow: f, payload: payload, innerIP: ipSpec{tos: tos}}
	fr := innerFrame(s)
	copy(fr[0:], outDstMAC)
	copy(fr[6:], b.cvMAC)
	binary.BigEndian.PutUint16(fr[ethHeaderLen+4:], id)
	binary.BigEndian.PutUint16(fr[ethHeaderLen+10:], ipv4Checksum(fr[ethHeaderLen:ethHeaderLen+20]))
	return sentFrameOf(fr)
}

// A flow's first packet out, taken by the kernel's path, teaches the fast
// path; the next packet, run through steer_tc_out, comes out exactly as
// the kernel's path writes it when it takes that packet (its outer IP id
// aside): the outer Ethernet header to the next hop, the VTEPs, TTL, TOS
// with ECN, DF, the UDP source port the device picks from the packet's
// hash, the outer UDP checksum, the VNI. Sent for real, the packet takes
// the fast path (no frame through the VXLAN device) and leaves the host
// the same.
func TestFastOutAsTheKernelWrites(t *testing.T) {
	for _, c := range []struct {
		name  string
		proto uint8
		tos   uint8
	}{{"UDP", protoUDP, 0}, {"TCP", protoTCP, 0}, {"UDP ECT(0) DSCP", protoUDP, 0x28 | 2}, {"UDP CE", protoUDP, 3}} {
		t.Run(c.name, func(t *testing.T) {
			b := newOutbed(t)
			d := b.attach(t)
			if k := b.send(t, b.frame(c.proto, 1, c.tos, 100)); k == nil {
				t.Fatal("premise: the kernel's path sent nothing out")
			}
			es, err := d.Fast().OutEntries()
			if err != nil || len(es) != 1 || es[0].Veth != uint32(b.hv) || es[0].Underlay != uint32(b.ul) {
				t.Fatalf("premise: entries %+v (%v), counters %+v: want the flow's, learned from its first packet", es, err, stats(t, d)[StageSplit])
			}
			next := b.frame(c.proto, 2, c.tos, 300)
			ret, ran := b.runOut(t, d, next)
			if ret != tcRedirect {
				t.Fatalf("BPF_PROG_RUN: verdict %d, want TC_ACT_REDIRECT (counters %+v)", ret, stats(t, d)[StageSplit])
			}
			vx0 := vxlanTx(t, b.host)
			fast := b.send(t, next)
			if st := stats(t, d)[StageSplit]; st.FastOut != 2 || vxlanTx(t, b.host) != vx0 {
				t.Errorf("sent for real: counters %+v, vxlan0 sent %d: want the fast path to take it", st, vxlanTx(t, b.host)-vx0)
			}
			if err := d.Fast().Withdraw(); err != nil {
				t.Fatal(err)
			}
			kernel := b.send(t, next)
			if kernel == nil || vxlanTx(t, b.host) != vx0+1 {
				t.Fatalf("premise: the kernel's path sent %x (vxlan0 %d frames)", kernel, vxlanTx(t, b.host)-vx0)
			}
			if !sameButID(ran, kernel) {
				t.Errorf("BPF_PROG_RUN's frame is not the kernel's\n got: %x\nwant: %x", ran, kernel)
			}
			if !sameButID(fast, kernel) {
				t.Errorf("the fast path's frame on the wire is not the kernel's\n got: %x\nwant: %x", fast, kernel)
			}
		})
	}
}

// vxlanTx is how many packets vxlan0 in ns sent.
func vxlanTx(t *testing.T, ns string) uint64 { return overlaytest.LinkStats(t, ns, "vxlan0").TxPackets }
