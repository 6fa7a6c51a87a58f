package steer

import (
	"encoding/binary"
	"net/netip"
	"slices"
)

// Test frames: a VXLAN frame (outer Ethernet/IPv4/UDP/VXLAN + inner
// Ethernet/IPv4/L4) or the inner frame alone, with knobs for every way a
// frame can be foreign or malformed. IPv4 header checksums are right
// unless badCsum says otherwise (PRISM-sync checks the outer one, as
// ip_rcv does); L4 checksums are left 0 (none, for the outer UDP).

const (
	ethHeaderLen = 14 // also the least BPF_PROG_RUN accepts

	ethIPv4 = 0x0800
	ethIPv6 = 0x86dd
	ethARP  = 0x0806
	ethVLAN = 0x8100

	protoICMP = 1
	protoTCP  = 6
	protoUDP  = 17

	testVNI  = 42
	testPort = 4789
)

var (
	outerSrc = netip.MustParseAddr("192.0.2.1")
	outerDst = netip.MustParseAddr("192.0.2.2")
	innerSrc = netip.MustParseAddr("10.0.0.1")
	innerDst = netip.MustParseAddr("10.0.0.2")
)

// ipSpec is one IPv4 header; zero fields take the defaults.
type ipSpec struct {
	ihl     int    // header length in 32-bit words; 0 = 5. Above 5, NOP options fill the rest
	version int    // 0 = 4
	frag    uint16 // flags and fragment offset field (DF is fine; MF or an offset is a fragment)
	tos     uint8  // DSCP and ECN
	badCsum bool   // a header checksum one off
	lenAdj  int    // added to the total length field (the frame keeps its bytes)
}

// flowSpec is the inner flow.
type flowSpec struct {
	src, dst     netip.Addr
	sport, dport uint16
	proto        uint8
}

// frameSpec describes a test frame. The zero value with a flow is a valid
// VXLAN frame of testVNI to testPort.
type frameSpec struct {
	flow flowSpec

	// Outer headers.
	outerEthType uint16 // 0 = IPv4; ethIPv6 builds a real IPv6 outer header
	vlan         bool   // an 802.1Q tag before the outer ethertype
	outerIP      ipSpec
	udpPort      uint16 // 0 = testPort
	udpCsum      uint16 // the outer UDP checksum field (0: none) ...
	udpCsumRight bool   // ... or the right checksum, plus udpCsum
	udpLenAdj    int    // added to the outer UDP length field
	noIFlag      bool   // VXLAN flags without the I bit
	vxFlags      uint32 // more VXLAN flag bits (reserved ones, GBP's)
	vniLow       uint8  // the VNI field's reserved low byte
	vni          uint32 // 0 = testVNI
	outerDstMAC  []byte // nil: 02:00:00:00:00:02
	trailer      int    // bytes after the outer IP packet (tot_len excludes them)

	// Inner headers.
	innerVLAN    bool   // an 802.1Q tag before the inner ethertype
	innerEthType uint16 // 0 = IPv4; ethIPv6 and ethARP build real headers
	innerIP      ipSpec
	innerSrcMAC  []byte // nil: 02:00:00:00:00:01
	payload      int
}

func (s frameSpec) withDefaults() frameSpec {
	if s.outerEthType == 0 {
		s.outerEthType = ethIPv4
	}
	if s.udpPort == 0 {
		s.udpPort = testPort
	}
	if s.vni == 0 {
		s.vni = testVNI
	}
	if s.innerEthType == 0 {
		s.innerEthType = ethIPv4
	}
	return s
}

// vxlanFrame is the whole encapsulated frame.
func vxlanFrame(s frameSpec) []byte {
	s = s.withDefaults()
	inner := innerFrame(s)

	udp := make([]byte, 8+8)
	binary.BigEndian.PutUint16(udp[0:], 49152)
	binary.BigEndian.PutUint16(udp[2:], s.udpPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)+len(inner)+s.udpLenAdj))
	binary.BigEndian.PutUint16(udp[6:], s.udpCsum)
	flags := s.vxFlags
	if !s.noIFlag {
		flags |= 0x08000000
	}
	binary.BigEndian.PutUint32(udp[8:], flags)
	binary.BigEndian.PutUint32(udp[12:], s.vni<<8|uint32(s.vniLow))
	l4 := append(udp, inner...)

	var b []byte
	b = appendEthMAC(b, s.outerDstMAC, nil, s.vlan, s.outerEthType)
	if s.outerEthType == ethIPv6 {
		b = appendIPv6(b, protoUDP, len(l4))
	} else {
		b = appendIPv4(b, s.outerIP, protoUDP, outerSrc, outerDst, len(l4))
	}
	if s.udpCsumRight && s.outerEthType == ethIPv4 {
		binary.BigEndian.PutUint16(l4[6:], udpChecksum(outerSrc, outerDst, l4)+s.udpCsum)
	}
	b = append(b, l4...)
	for range s.trailer {
		b = append(b, 0)
	}
	return b
}

// udpChecksum is the checksum of an IPv4 UDP datagram (its checksum
// field taken as 0), 0xffff for a sum of 0.
func udpChecksum(src, dst netip.Addr, dgram []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i < len(b); i += 2 {
			w := uint32(b[i]) << 8
			if i+1 < len(b) {
				w |= uint32(b[i+1])
			}
			sum += w
		}
	}
	s4, d4 := src.As4(), dst.As4()
	add(s4[:])
	add(d4[:])
	add([]byte{0, protoUDP, byte(len(dgram) >> 8), byte(len(dgram))})
	c := slices.Clone(dgram)
	c[6], c[7] = 0, 0
	add(c)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	if r := ^uint16(sum); r != 0 {
		return r
	}
	return 0xffff
}

// innerFrame is the frame a container receives: Ethernet, IP, L4 header,
// payload.
func innerFrame(s frameSpec) []byte {
	s = s.withDefaults()
	f := s.flow
	var l4 []byte
	switch f.proto {
	case protoTCP:
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint16(l4[0:], f.sport)
		binary.BigEndian.PutUint16(l4[2:], f.dport)
		l4[12] = 5 << 4 // data offset
		l4[13] = 0x10   // ACK
	case protoUDP:
		l4 = make([]byte, 8)
		binary.BigEndian.PutUint16(l4[0:], f.sport)
		binary.BigEndian.PutUint16(l4[2:], f.dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(8+s.payload))
	default: // ICMP echo
		l4 = []byte{8, 0, 0, 0, 0, 1, 0, 1}
	}
	for i := range s.payload {
		l4 = append(l4, byte(i))
	}

	b := appendEthMAC(nil, nil, s.innerSrcMAC, s.innerVLAN, s.innerEthType)
	switch s.innerEthType {
	case ethIPv6:
		b = appendIPv6(b, f.proto, len(l4))
	case ethARP:
		arp := make([]byte, 28)
		copy(arp, []byte{0, 1, 8, 0, 6, 4, 0, 1})
		return append(b, arp...)
	default:
		b = appendIPv4(b, s.innerIP, f.proto, f.src, f.dst, len(l4))
	}
	return append(b, l4...)
}

// appendEthMAC appends an Ethernet header (with a VLAN tag when vlan) from
// src to dst (nil: the defaults).
func appendEthMAC(b, dst, src []byte, vlan bool, ethType uint16) []byte {
	if dst == nil {
		dst = []byte{0x02, 0, 0, 0, 0, 2}
	}
	if src == nil {
		src = []byte{0x02, 0, 0, 0, 0, 1}
	}
	b = append(b, dst...)
	b = append(b, src...)
	if vlan {
		b = binary.BigEndian.AppendUint16(b, ethVLAN)
		b = binary.BigEndian.AppendUint16(b, 100)
	}
	return binary.BigEndian.AppendUint16(b, ethType)
}

func appendIPv4(b []byte, s ipSpec, proto uint8, src, dst netip.Addr, l4Len int) []byte {
	ihl, version := s.ihl, s.version
	if ihl == 0 {
		ihl = 5
	}
	if version == 0 {
		version = 4
	}
	hlen := max(ihl, 5) * 4
	h := make([]byte, hlen)
	h[0] = byte(version<<4 | ihl)
	h[1] = s.tos
	binary.BigEndian.PutUint16(h[2:], uint16(hlen+l4Len+s.lenAdj))
	binary.BigEndian.PutUint16(h[6:], s.frag)
	h[8] = 64
	h[9] = proto
	s4, d4 := src.As4(), dst.As4()
	copy(h[12:], s4[:])
	copy(h[16:], d4[:])
	for i := 20; i < hlen; i++ {
		h[i] = 1 // NOP option
	}
	c := ipv4Checksum(h)
	if s.badCsum {
		c++
	}
	binary.BigEndian.PutUint16(h[10:], c)
	return append(b, h...)
}

// ipv4Checksum is the header checksum of h (its checksum field taken as 0).
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		if i != 10 {
			sum += uint32(binary.BigEndian.Uint16(h[i:]))
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func appendIPv6(b []byte, next uint8, l4Len int) []byte {
	h := make([]byte, 40)
	h[0] = 6 << 4
	binary.BigEndian.PutUint16(h[4:], uint16(l4Len))
	h[6] = next
	h[7] = 64
	h[8], h[23] = 0xfd, 1
	h[24], h[39] = 0xfd, 2
	return append(b, h...)
}

func tcpFlow(sport uint16) flowSpec {
	return flowSpec{src: innerSrc, dst: innerDst, sport: sport, dport: 5201, proto: protoTCP}
}

func udpFlow(sport uint16) flowSpec {
	return flowSpec{src: innerSrc, dst: innerDst, sport: sport, dport: 9999, proto: protoUDP}
}

func (f flowSpec) hash() uint32 {
	return FlowHash(f.src, f.dst, f.sport, f.dport, f.proto)
}
