package steer

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// The differential fuzzer's reference: what the programs should make of a
// frame, decided apart from their C. gopacket decodes the layers; the
// rules on top are lanes' documented ones (bpf/parse.h's parsers: an overlay
// frame is Ethernet, IPv4 that is not a fragment, UDP to the VXLAN port,
// VXLAN with the I flag and a known VNI, then an inner Ethernet, IPv4, TCP
// or UDP frame, every header within the lengths the headers before it
// give, as the kernel trims them). Where gopacket is more lenient than
// the kernel, the reference follows the kernel, and says so:
//
//   - an IPv4 total length of 0 (gopacket: TSO, the rest of the data) is
//     dropped by ip_rcv unless the skb is a BIG TCP GSO one, which XDP
//     never sees; a UDP length of 0 (gopacket: a jumbogram) by udp_rcv;
//   - a length beyond the data (gopacket: truncated, decoded as far as
//     it goes) is dropped by ip_rcv and udp_rcv.
//
// And where lanes deliberately reads less than gopacket, the reference
// reads as lanes does:
//
//   - IPv4 and TCP options are not parsed (gopacket rejects some
//     malformed ones): the headers are skipped by their length; steering
//     only places a frame (the kernel drops one whose options are bad),
//     and the shortcut takes no frame with outer options.
//
// kernelDelivers is a model of the kernel's receive path for the
// shortcut's property: where a VXLAN frame the kernel receives ends up.

// refTuple is an inner flow.
type refTuple struct {
	src, dst     netip.Addr
	sport, dport uint16
	proto        uint8
}

// refFrame is what the reference makes of a frame on the underlay.
type refFrame struct {
	overlay bool // an overlay frame of a known VNI on the VXLAN port (parse_outer's first part)
	inner   bool // whose inner frame is IPv4 TCP or UDP (lanes steers it)
	tuple   refTuple
	vni     uint32
}

// nopOptions returns a copy of an IPv4 or TCP header run whose options
// (bytes from fixed to hlen) are NOPs, so gopacket does not judge them.
func nopOptions(b []byte, fixed, hlen int) []byte {
	c := slices.Clone(b)
	for i := fixed; i < hlen && i < len(c); i++ {
		c[i] = 1
	}
	return c
}

// refIPv4 decodes an IPv4 packet lanes parses: version 4, not a
// fragment, a total length within the data and not 0. It returns the
// header and the payload, trimmed to the total length.
func refIPv4(b []byte) (*layers.IPv4, []byte, bool) {
	if len(b) < 20 {
		return nil, nil, false
	}
	ihl := int(b[0]&0x0f) * 4
	var ip layers.IPv4
	if err := ip.DecodeFromBytes(nopOptions(b, 20, ihl), gopacket.NilDecodeFeedback); err != nil {
		return nil, nil, false
	}
	if ip.Version != 4 || ip.Flags&layers.IPv4MoreFragments != 0 || ip.FragOffset != 0 ||
		binary.BigEndian.Uint16(b[2:]) == 0 || int(ip.Length) > len(b) {
		return nil, nil, false
	}
	return &ip, b[ip.IHL*4 : ip.Length], true
}

// refUDP decodes a UDP datagram within its length (not 0, not beyond the
// data); the payload is trimmed to it.
func refUDP(b []byte) (*layers.UDP, []byte, bool) {
	var u layers.UDP
	if err := u.DecodeFromBytes(b, gopacket.NilDecodeFeedback); err != nil {
		return nil, nil, false
	}
	if u.Length == 0 || int(u.Length) > len(b) {
		return nil, nil, false
	}
	return &u, b[8:u.Length], true
}

// refInner parses an inner frame (Ethernet, IPv4, TCP or UDP).
func refInner(b []byte) (refTuple, bool) {
	var eth layers.Ethernet
	if err := eth.DecodeFromBytes(b, gopacket.NilDecodeFeedback); err != nil || eth.EthernetType != layers.EthernetTypeIPv4 {
		return refTuple{}, false
	}
	ip, l4, ok := refIPv4(b[14:])
	if !ok {
		return refTuple{}, false
	}
	t := refTuple{src: netip.AddrFrom4([4]byte(ip.SrcIP.To4())), dst: netip.AddrFrom4([4]byte(ip.DstIP.To4())), proto: uint8(ip.Protocol)}
	switch ip.Protocol {
	case layers.IPProtocolTCP:
		if len(l4) < 20 {
			return refTuple{}, false
		}
		var tcp layers.TCP
		if err := tcp.DecodeFromBytes(nopOptions(l4, 20, int(l4[12]>>4)*4), gopacket.NilDecodeFeedback); err != nil {
			return refTuple{}, false
		}
		t.sport, t.dport = uint16(tcp.SrcPort), uint16(tcp.DstPort)
		return t, true
	case layers.IPProtocolUDP:
		u, _, ok := refUDP(l4)
		if !ok {
			return refTuple{}, false
		}
		t.sport, t.dport = uint16(u.SrcPort), uint16(u.DstPort)
		return t, true
	}
	return refTuple{}, false
}

// refOuter parses a frame on the underlay for a datapath with VXLAN port
// port and the VNIs vnis.
func refOuter(b []byte, port uint16, vnis []uint32) refFrame {
	var r refFrame
	var eth layers.Ethernet
	if err := eth.DecodeFromBytes(b, gopacket.NilDecodeFeedback); err != nil || eth.EthernetType != layers.EthernetTypeIPv4 {
		return r
	}
	ip, l4, ok := refIPv4(b[14:])
	if !ok || ip.Protocol != layers.IPProtocolUDP {
		return r
	}
	u, payload, ok := refUDP(l4)
	if !ok || uint16(u.DstPort) != port {
		return r
	}
	var vx layers.VXLAN
	if err := vx.DecodeFromBytes(payload, gopacket.NilDecodeFeedback); err != nil || !vx.ValidIDFlag || !slices.Contains(vnis, vx.VNI) {
		return r
	}
	r.overlay, r.vni = true, vx.VNI
	r.tuple, r.inner = refInner(vx.Payload)
	return r
}

// kernelModel is the receiving host of the shortcut's property: one
// underlay device (ifindex, MAC, local addresses), a VXLAN device (VNI,
// port, MAC; no learning, no GBP or GPE) on a bridge whose forwarding
// table sends fdb's MACs to their ports, every port forwarding, MTU mtu.
type kernelModel struct {
	ifindex uint32
	mac     net.HardwareAddr
	locals  []netip.Addr
	port    uint16
	vni     uint32
	vxMAC   net.HardwareAddr
	fdb     map[string]uint32
	mtu     int
}

// delivers says where the kernel's receive path takes a frame that came
// in on ifindex, and what it hands that port: ip_rcv_core, the route
// lookup, udp_rcv, vxlan_rcv (vxlan_set_mac, IP_ECN_decapsulate), the
// bridge's forward to a known unicast MAC. ok is false for a frame it
// drops, or one it would not send to exactly one port.
func (m kernelModel) delivers(ifindex uint32, b []byte) (port uint32, inner []byte, ok bool) {
	if ifindex != m.ifindex || len(b) < 14 || !bytes.Equal(b[0:6], m.mac) || binary.BigEndian.Uint16(b[12:]) != 0x0800 {
		return 0, nil, false // another host's frame (PACKET_OTHERHOST), or not IPv4
	}
	ip := b[14:]
	if len(ip) < 20 || ip[0]>>4 != 4 || ip[0]&0x0f < 5 {
		return 0, nil, false
	}
	hlen := int(ip[0]&0x0f) * 4
	if hlen != 20 {
		return 0, nil, false // options: ip_rcv_options, not modelled: dropped here
	}
	if !ipv4HeaderOK(ip[:hlen]) {
		return 0, nil, false
	}
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	if tot < hlen || tot > len(ip) {
		return 0, nil, false
	}
	ip = ip[:tot] // pskb_trim_rcsum
	if binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
		return 0, nil, false // a fragment: one alone is never delivered
	}
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	if !slices.Contains(m.locals, dst) || src.IsMulticast() || src.IsLoopback() || src.IsUnspecified() || src == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return 0, nil, false
	}
	if ip[9] != 17 {
		return 0, nil, false
	}
	udp := ip[hlen:]
	if len(udp) < 8 {
		return 0, nil, false
	}
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	if ulen < 8 || ulen > len(udp) {
		return 0, nil, false
	}
	udp = udp[:ulen]
	if c := binary.BigEndian.Uint16(udp[6:]); c != 0 && udpChecksum(src, dst, udp) != c {
		return 0, nil, false
	}
	if binary.BigEndian.Uint16(udp[2:]) != m.port || len(udp) < 16 {
		return 0, nil, false
	}
	vx := udp[8:16]
	flags, vniField := binary.BigEndian.Uint32(vx[0:]), binary.BigEndian.Uint32(vx[4:])
	if flags&0x08000000 == 0 || vniField>>8 != m.vni || flags&^0x08000000 != 0 || vniField&0xff != 0 {
		return 0, nil, false
	}
	inner = slices.Clone(udp[16:])
	if len(inner) < 14 {
		return 0, nil, false
	}
	srcMAC := net.HardwareAddr(inner[6:12])
	if bytes.Equal(srcMAC, m.vxMAC) || srcMAC[0]&1 != 0 || bytes.Equal(srcMAC, make([]byte, 6)) {
		return 0, nil, false // vxlan_set_mac
	}
	if binary.BigEndian.Uint16(inner[12:]) == 0x0800 && len(inner) > 15 {
		if !ecnDecap(ip[1], inner[14:]) {
			return 0, nil, false
		}
	}
	dstMAC := net.HardwareAddr(inner[0:6])
	p, known := m.fdb[dstMAC.String()]
	if !known || dstMAC[0]&1 != 0 {
		return 0, nil, false // flooded or local: not one port
	}
	if len(inner) > m.mtu+14+4 {
		return 0, nil, false // is_skb_forwardable
	}
	return p, inner, true
}

// ecnDecap is INET_ECN_decapsulate on an inner IPv4 packet (RFC 6040),
// in place; false: the kernel drops the frame.
func ecnDecap(outerTOS byte, ip []byte) bool {
	outer, inner := outerTOS&3, ip[1]&3
	if inner == ecnNotECT {
		return outer != ecnCE
	}
	if len(ip) < 20 {
		return true // INET_ECN_set_* need the whole header
	}
	csum := binary.NativeEndian.Uint16(ip[10:]) // as the kernel adds it: the bytes in memory
	add := func(a uint16) {
		r := csum + a
		if r < a {
			r++
		}
		csum = r
	}
	switch {
	case outer == ecnCE && inner != ecnCE: // IP_ECN_set_ce
		e := (uint16(ip[1]) + 1) & 3
		add(uint16(htons(0xfffb) + htons(e)))
		ip[1] |= ecnCE
	case outer == ecnECT1 && inner == ecnECT0: // IP_ECN_set_ect1
		add(htons(1))
		ip[1] ^= ecnCE
	default:
		return true
	}
	binary.NativeEndian.PutUint16(ip[10:], csum)
	return true
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// ipv4HeaderOK is ip_fast_csum's verdict on an IPv4 header: its words,
// the checksum field's included, sum to 0xffff (ones' complement), so
// that either form of a zero sum, 0x0000 or 0xffff, is a right checksum.
func ipv4HeaderOK(h []byte) bool {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return sum == 0xffff
}

// ipDecreaseTTL is the kernel's ip_decrease_ttl, in place: the checksum
// updated as the bytes in memory, carried the kernel's way.
func ipDecreaseTTL(ip []byte) {
	check := uint32(binary.NativeEndian.Uint16(ip[10:])) + uint32(htons(0x0100))
	if check >= 0xffff {
		check++
	}
	binary.NativeEndian.PutUint16(ip[10:], uint16(check))
	ip[8]--
}

// refFastEntry is a fast path entry as the reference sees it (bpf/fast.h's
// fast_key and fast_entry): the flow, the outer facts its frames come
// with, and what the kernel's path did with the frame it was learned from
// (the container's veth ifindex, the MACs it wrote, the TTL it took off,
// the MTU on the way).
type refFastEntry struct {
	vni                       uint32
	tuple                     refTuple
	underlay                  uint32
	vtepSrc, vtepDst          netip.Addr
	outerDMAC, inDMAC, inSMAC net.HardwareAddr
	ifindex                   uint32
	dmac, smac                net.HardwareAddr
	ttlDec                    uint8
	mtu                       int
}

// host is the receiving host e was learned on, as kernelModel models it:
// the underlay device and its MAC, the local VTEP, the VXLAN port and
// VNI, and the inner destination MAC the frame went on to (a container's
// on a bridge, the router's on a routed path) as the one known port.
func (e refFastEntry) host(port uint16) kernelModel {
	return kernelModel{ifindex: e.underlay, mac: e.outerDMAC, locals: []netip.Addr{e.vtepDst}, port: port, vni: e.vni,
		vxMAC: fuzzModel.vxMAC, fdb: map[string]uint32{e.inDMAC.String(): e.ifindex}, mtu: e.mtu}
}

// learnable says whether the kernel's path delivers a frame with e's
// outer facts at all: an entry exists only from a frame it delivered.
func (e refFastEntry) learnable(port uint16) bool {
	f := vxlanFrame(frameSpec{flow: udpFlow(40000), payload: 10, udpPort: port, vni: e.vni, udpCsumRight: true})
	copy(f[0:], e.outerDMAC)
	s, d := e.vtepSrc.As4(), e.vtepDst.As4()
	copy(f[ethHeaderLen+12:], s[:])
	copy(f[ethHeaderLen+16:], d[:])
	copy(f[50:], e.inDMAC)
	copy(f[56:], e.inSMAC)
	fixChecksums(f)
	_, _, ok := e.host(port).delivers(e.underlay, f)
	return ok
}

// delivers is what the fast path must make of frame b, received on
// ifindex, while e is live: the frame the kernel's path hands e's
// container (ok), or none (the kernel's path takes it). The kernel's
// verdict is kernelModel's on the host e was learned on, and the rest of
// the way is the entry's: its MACs, its TTL taken off (ip_forward: a TTL
// it would expire is not forwarded), its MTU. What the fast path leaves to
// the kernel's path although the kernel would deliver it, it must not
// take: bytes the kernel trims (beyond the outer IP total length or UDP
// length, or the inner total length), another VTEP's or container's
// frame, inner IPv4 options or a wrong inner header checksum, a TTL of 0
// on a bridged path, TCP FIN or RST (the entry ends).
func (e refFastEntry) delivers(ifindex uint32, b []byte, port uint16, vnis []uint32) ([]byte, bool) {
	r := refOuter(b, port, vnis)
	if !r.inner || r.vni != e.vni || r.tuple != e.tuple {
		return nil, false
	}
	_, inner, ok := e.host(port).delivers(ifindex, b)
	if !ok {
		return nil, false
	}
	ip := b[ethHeaderLen:] // IPv4 without options, UDP: the kernel model's
	tot, ulen := int(binary.BigEndian.Uint16(ip[2:])), int(binary.BigEndian.Uint16(ip[24:]))
	iip := b[50+ethHeaderLen:] // IPv4 of a TCP or UDP flow: the reference's
	ilen := int(binary.BigEndian.Uint16(iip[2:]))
	fin := iip[9] == protoTCP && len(iip) > 33 && iip[33]&0x05 != 0
	switch {
	case tot != len(ip) || ulen != tot-20 || ilen != len(inner)-ethHeaderLen:
		return nil, false
	case netip.AddrFrom4([4]byte(ip[12:16])) != e.vtepSrc || !bytes.Equal(b[56:62], e.inSMAC):
		return nil, false
	case iip[0]&0x0f != 5 || !ipv4HeaderOK(iip[:20]) || iip[8] <= e.ttlDec || ilen > e.mtu || fin:
		return nil, false
	}
	copy(inner[0:], e.dmac)
	copy(inner[6:], e.smac)
	if e.ttlDec > 0 {
		ipDecreaseTTL(inner[ethHeaderLen:])
	}
	return inner, true
}
