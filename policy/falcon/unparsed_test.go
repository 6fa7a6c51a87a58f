package falcon_test

import (
	"encoding/binary"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/testbed"
)

// TestFalconUnparsedFramesStay: overlay frames whose inner frame lanes
// does not parse (here inner IPv6) run their later stages where vanilla
// runs them, on the receiving NIC's core, although the VXLAN device and
// the container veth carry lanes' RPS maps over every core. Left to those
// maps, RPS would spread them by their own hash, a placement no plan made
// and one that changes whenever lanes rewrites the maps (parking), which
// could reorder such a flow at that moment. 32 flows of inner IPv6/UDP:
// by their own hashes they would land on both cores.
func TestFalconUnparsedFramesStay(t *testing.T) {
	online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200) // ARP, FDB

	// spread=always: the later stages' maps on, no agent to park them.
	apply(t, tb, "falcon", map[string]string{"spread": "always"})
	irq := tb.Config.IRQCPU
	for _, dev := range []struct{ ns, name string }{{r.NetNS, r.VXLAN}, {dst.NetNS, dst.Veth}} {
		if got := rpsCPUs(t, dev.ns, dev.name); !slices.ContainsFunc(got, func(c int) bool { return c != irq }) {
			t.Fatalf("rps_cpus of %s = %v: no core but the IRQ core %d, so the test shows nothing", dev.name, got, irq)
		}
	}

	const payload = 101 // an IPv6 length no neighbour discovery has
	frameLen := uint32(14 + 40 + 8 + payload)
	bridgeCtr := countIPv6(t, r.NetNS, r.VXLAN, frameLen)
	contCtr := countIPv6(t, dst.NetNS, dst.Veth, frameLen)

	const flows, per = 32, 30
	sendIPv6UDP(t, src, dst.MAC, flows, per, payload)
	var b, c []uint64
	for range 50 {
		b, c = bridgeCtr.read(t), contCtr.read(t)
		if sum(b) >= flows*per && sum(c) >= flows*per {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("inner IPv6 frames per core: bridge stage %v, container stage %v (IRQ core %d)", b, c, irq)
	for _, st := range []struct {
		name string
		per  []uint64
	}{{"bridge", b}, {"container", c}} {
		if sum(st.per) < flows*per*9/10 {
			t.Errorf("%s stage saw %d of %d inner IPv6 frames", st.name, sum(st.per), flows*per)
		}
		for core, n := range st.per {
			if core != irq && n != 0 {
				t.Errorf("%s stage ran %d inner IPv6 frames on core %d, want all on the IRQ core %d", st.name, n, core, irq)
			}
		}
	}
}

func sum(v []uint64) uint64 {
	var n uint64
	for _, x := range v {
		n += x
	}
	return n
}

// countIPv6 counts, per core, the IPv6 frames of length frameLen
// (Ethernet header included, as tc programs see it at ingress too) that
// dev in ns receives (tcx ingress: the core that runs dev's stage).
func countIPv6(t *testing.T, ns, dev string, frameLen uint32) *packetCounter {
	t.Helper()
	m := modetest.PerCPUCounter(t)
	var proto [2]byte
	binary.BigEndian.PutUint16(proto[:], unix.ETH_P_IPV6)
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // __sk_buff.len
		asm.JNE.Imm(asm.R2, int32(frameLen), "out"),
		asm.LoadMem(asm.R2, asm.R1, 16, asm.Word), // __sk_buff.protocol, network order
		asm.JNE.Imm(asm.R2, int32(binary.NativeEndian.Uint16(proto[:])), "out"),
	}
	insns = append(insns, modetest.IncCounter(m, "out")...)
	insns = append(insns,
		asm.Mov.Imm(asm.R0, -1).WithSymbol("out"), // TCX_NEXT
		asm.Return(),
	)
	modetest.AttachTCX(t, ns, dev, "count_ipv6", insns, ebpf.AttachTCXIngress, nil)
	return &packetCounter{m: m}
}

// sendIPv6UDP sends, from the container's interface, per frames of each
// of flows inner IPv6/UDP flows (source ports apart) to dstMAC, through a
// packet socket that receives nothing (protocol 0: no tap on the path).
func sendIPv6UDP(t *testing.T, c testbed.Container, dstMAC net.HardwareAddr, flows, per, payload int) {
	t.Helper()
	err := nsx.Do(c.NetNS, func() error {
		ifi, err := net.InterfaceByName(c.Veth)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Protocol: htons(unix.ETH_P_IPV6), Halen: 6}
		copy(to.Addr[:], dstMAC)
		for range per {
			for f := range flows {
				frame := ipv6UDPFrame(c.MAC, dstMAC, uint16(40000+f), payload)
				if err := unix.Sendto(fd, frame, 0, to); err != nil {
					return err
				}
			}
			// A round of flows at a time, then a pause: a burst of
			// hundreds overflows the veths' 256-frame rings.
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("sending inner IPv6 frames from %s: %v", c.NetNS, err)
	}
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// ipv6UDPFrame: Ethernet, IPv6 fe80::1 -> fe80::2, UDP sport -> 9.
func ipv6UDPFrame(src, dst net.HardwareAddr, sport uint16, payload int) []byte {
	f := make([]byte, 14+40+8+payload)
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IPV6)
	ip := f[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(8+payload))
	ip[6] = unix.IPPROTO_UDP
	ip[7] = 64
	ip[8], ip[9], ip[23] = 0xfe, 0x80, 1
	ip[24], ip[25], ip[39] = 0xfe, 0x80, 2
	udp := ip[40:]
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+payload))
	return f
}
