package stress

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// Frame layouts, mirrored from struct frame and struct plain_frame in
// xdp_gen.c: the program writes at these offsets, so a change on either
// side must be made on both (TestXDPGenRewritesOnlySeqAndPorts holds them
// together).
const (
	ethLen   = 14
	ipv4Len  = 20
	udpLen   = 8
	vxlanLen = 8

	offOuterIP    = ethLen
	offOuterUDP   = offOuterIP + ipv4Len
	offVXLAN      = offOuterUDP + udpLen
	offInnerEth   = offVXLAN + vxlanLen
	offInnerIP    = offInnerEth + ethLen
	offInnerUDP   = offInnerIP + ipv4Len
	offPayload    = offInnerUDP + udpLen // 92: the 64-bit sequence number
	headersLen    = offPayload
	seqLen        = 8
	vxlanOverhead = offInnerEth // what encapsulation adds to the inner frame (50)

	// A plain frame (Target.Plain) is the outer headers alone: Ethernet,
	// IPv4, UDP, then the sequence number.
	offPlainUDP     = offOuterUDP
	offPlainPayload = offPlainUDP + udpLen // 42

	// DefaultVXLANPort is the IANA VXLAN port, what Linux uses by default.
	DefaultVXLANPort = 4789

	// maxLiveFrame is the largest frame BPF_PROG_RUN accepts in live-frame
	// mode: a page less XDP headroom (256) and skb_shared_info (320).
	maxLiveFrame = 4096 - 256 - 320
	// MaxPayload is the largest UDP payload the generator can carry; the
	// receiving veth additionally drops frames above its MTU + 14 + 4.
	MaxPayload = maxLiveFrame - headersLen
	// MinPayload is the room the sequence number needs.
	MinPayload = seqLen
)

// frameSpec is what varies per generator on top of the Target.
type frameSpec struct {
	payload    int    // UDP payload bytes, >= MinPayload
	srcPort    uint16 // inner (plain: the) UDP source port (flow 0; the program sets flow i's)
	dstPort    uint16 // inner (plain: the) UDP destination port
	outerSport uint16 // outer UDP source port (flow 0; the program sets flow i's); not in a plain frame
}

// buildFrame encodes the frame the generator replays, with a zero sequence
// number and zero padding: a VXLAN frame (outer Ethernet/IPv4/UDP/VXLAN,
// inner Ethernet/IPv4/UDP) or, for a Plain target, Ethernet/IPv4/UDP
// straight to DstIP. UDP checksums are 0 (allowed for IPv4, and what Linux
// VXLAN sends outside), so the program can rewrite ports and sequence
// without fixing checksums; IPv4 header checksums are complete.
func buildFrame(t Target, s frameSpec) ([]byte, error) {
	if err := t.validate(); err != nil {
		return nil, err
	}
	if s.payload < MinPayload || s.payload > MaxPayload {
		return nil, fmt.Errorf("payload of %d bytes: must be %d..%d", s.payload, MinPayload, MaxPayload)
	}
	if t.Plain {
		b := make([]byte, offPlainPayload+s.payload)
		putEthIPv4UDP(b, t.DstMAC, t.SrcMAC, t.SrcIP, t.DstIP, s.srcPort, s.dstPort)
		return b, nil
	}
	vxPort := t.VXLANPort
	if vxPort == 0 {
		vxPort = DefaultVXLANPort
	}
	b := make([]byte, headersLen+s.payload)
	// Outer UDP: checksum 0, as Linux VXLAN sends by default.
	putEthIPv4UDP(b, t.DstMAC, t.SrcMAC, t.SrcIP, t.DstIP, s.outerSport, vxPort)
	// VXLAN: I flag, VNI in the upper 24 bits.
	binary.BigEndian.PutUint32(b[offVXLAN:], 0x08000000)
	binary.BigEndian.PutUint32(b[offVXLAN+4:], t.VNI<<8)
	putEthIPv4UDP(b[offInnerEth:], t.InnerDstMAC, t.InnerSrcMAC, t.InnerSrcIP, t.InnerDstIP, s.srcPort, s.dstPort)
	return b, nil
}

// putEthIPv4UDP writes Ethernet, IPv4 and UDP headers (UDP checksum 0: no
// checksum, valid for IPv4) at the start of b, whose whole length they
// describe.
func putEthIPv4UDP(b []byte, dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16) {
	copy(b[0:6], dstMAC)
	copy(b[6:12], srcMAC)
	binary.BigEndian.PutUint16(b[12:14], 0x0800)
	putIPv4(b[ethLen:], len(b)-ethLen, src, dst)
	u := b[ethLen+ipv4Len:]
	binary.BigEndian.PutUint16(u[0:2], sport)
	binary.BigEndian.PutUint16(u[2:4], dport)
	binary.BigEndian.PutUint16(u[4:6], uint16(len(u)))
}

// putIPv4 writes a 20-byte IPv4 header carrying UDP with DF set and a
// complete header checksum.
func putIPv4(h []byte, totalLen int, src, dst netip.Addr) {
	h[0] = 0x45 // version 4, IHL 5
	binary.BigEndian.PutUint16(h[2:4], uint16(totalLen))
	binary.BigEndian.PutUint16(h[6:8], 0x4000) // DF: never fragmented, so ID 0 is fine
	h[8] = 64                                  // TTL
	h[9] = 17                                  // UDP
	s4, d4 := src.As4(), dst.As4()
	copy(h[12:16], s4[:])
	copy(h[16:20], d4[:])
	binary.BigEndian.PutUint16(h[10:12], ipChecksum(h[:ipv4Len]))
}

// ipChecksum is the Internet checksum (RFC 1071) of b with its checksum
// field taken as whatever b holds (0 when computing, the stored sum when
// verifying: then a valid header yields 0).
func ipChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// validate checks the fields the frame uses: a plain frame has no inner
// headers.
func (t Target) validate() error {
	type mac struct {
		name string
		mac  net.HardwareAddr
	}
	type ip struct {
		name string
		ip   netip.Addr
	}
	macs := []mac{{"SrcMAC", t.SrcMAC}, {"DstMAC", t.DstMAC}}
	ips := []ip{{"SrcIP", t.SrcIP}, {"DstIP", t.DstIP}}
	if !t.Plain {
		macs = append(macs, mac{"InnerSrcMAC", t.InnerSrcMAC}, mac{"InnerDstMAC", t.InnerDstMAC})
		ips = append(ips, ip{"InnerSrcIP", t.InnerSrcIP}, ip{"InnerDstIP", t.InnerDstIP})
	}
	for _, m := range macs {
		if len(m.mac) != 6 {
			return fmt.Errorf("target %s %q is not a 6-byte Ethernet address", m.name, m.mac)
		}
	}
	for _, a := range ips {
		if !a.ip.Is4() {
			return fmt.Errorf("target %s %v is not an IPv4 address (only IPv4 overlays are generated)", a.name, a.ip)
		}
	}
	if t.VNI >= 1<<24 {
		return fmt.Errorf("target VNI %d does not fit in 24 bits", t.VNI)
	}
	return nil
}
