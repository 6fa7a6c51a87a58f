package stress

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// Frame layout, mirrored from struct frame in xdp_gen.c: the program writes
// at these offsets, so a change on either side must be made on both
// (TestXDPGenRewritesOnlySeqAndPorts holds them together).
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
	srcPort    uint16 // inner UDP source port (flow 0; the program sets flow i's)
	dstPort    uint16 // inner UDP destination port
	outerSport uint16 // outer UDP source port (flow 0; the program sets flow i's)
}

// buildFrame encodes the VXLAN frame the generator replays: outer
// Ethernet/IPv4/UDP/VXLAN, inner Ethernet/IPv4/UDP, a zero sequence number
// and zero padding. Both UDP checksums are 0 (allowed for IPv4, and what
// Linux VXLAN sends outside), so the program can rewrite ports and sequence
// without fixing checksums; both IPv4 header checksums are complete.
func buildFrame(t Target, s frameSpec) ([]byte, error) {
	if err := t.validate(); err != nil {
		return nil, err
	}
	if s.payload < MinPayload || s.payload > MaxPayload {
		return nil, fmt.Errorf("payload of %d bytes: must be %d..%d", s.payload, MinPayload, MaxPayload)
	}
	vxPort := t.VXLANPort
	if vxPort == 0 {
		vxPort = DefaultVXLANPort
	}
	b := make([]byte, headersLen+s.payload)

	// Outer Ethernet.
	copy(b[0:6], t.DstMAC)
	copy(b[6:12], t.SrcMAC)
	binary.BigEndian.PutUint16(b[12:14], 0x0800)
	// Outer IPv4.
	putIPv4(b[offOuterIP:], len(b)-offOuterIP, t.SrcIP, t.DstIP)
	// Outer UDP: checksum 0, as Linux VXLAN sends by default.
	u := b[offOuterUDP:]
	binary.BigEndian.PutUint16(u[0:2], s.outerSport)
	binary.BigEndian.PutUint16(u[2:4], vxPort)
	binary.BigEndian.PutUint16(u[4:6], uint16(len(b)-offOuterUDP))
	// VXLAN: I flag, VNI in the upper 24 bits.
	binary.BigEndian.PutUint32(b[offVXLAN:], 0x08000000)
	binary.BigEndian.PutUint32(b[offVXLAN+4:], t.VNI<<8)
	// Inner Ethernet.
	copy(b[offInnerEth:], t.InnerDstMAC)
	copy(b[offInnerEth+6:], t.InnerSrcMAC)
	binary.BigEndian.PutUint16(b[offInnerEth+12:], 0x0800)
	// Inner IPv4 and UDP (checksum 0: no checksum, valid for IPv4).
	putIPv4(b[offInnerIP:], len(b)-offInnerIP, t.InnerSrcIP, t.InnerDstIP)
	u = b[offInnerUDP:]
	binary.BigEndian.PutUint16(u[0:2], s.srcPort)
	binary.BigEndian.PutUint16(u[2:4], s.dstPort)
	binary.BigEndian.PutUint16(u[4:6], uint16(len(b)-offInnerUDP))
	return b, nil
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

func (t Target) validate() error {
	for _, m := range []struct {
		name string
		mac  net.HardwareAddr
	}{{"SrcMAC", t.SrcMAC}, {"DstMAC", t.DstMAC}, {"InnerSrcMAC", t.InnerSrcMAC}, {"InnerDstMAC", t.InnerDstMAC}} {
		if len(m.mac) != 6 {
			return fmt.Errorf("target %s %q is not a 6-byte Ethernet address", m.name, m.mac)
		}
	}
	for _, a := range []struct {
		name string
		ip   netip.Addr
	}{{"SrcIP", t.SrcIP}, {"DstIP", t.DstIP}, {"InnerSrcIP", t.InnerSrcIP}, {"InnerDstIP", t.InnerDstIP}} {
		if !a.ip.Is4() {
			return fmt.Errorf("target %s %v is not an IPv4 address (only IPv4 overlays are generated)", a.name, a.ip)
		}
	}
	if t.VNI >= 1<<24 {
		return fmt.Errorf("target VNI %d does not fit in 24 bits", t.VNI)
	}
	return nil
}
