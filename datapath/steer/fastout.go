//go:build linux

package steer

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
)

// The fast path out of the container (bpf/fastout.h): what lanes agent
// vouches for on the way out, under the same lease as the way in (Renew,
// Withdraw), and the entries the programs learned.

// TCFastOut is the fast path out of the container, for a host-side veth's
// tc ingress (Config.Fast).
func (d *Datapath) TCFastOut() *ebpf.Program { return d.objs.SteerTcOut }

// TCFastOutLearn learns the fast path out's entries, for the underlay's tc
// egress (Config.Fast).
func (d *Datapath) TCFastOutLearn() *ebpf.Program { return d.objs.SteerTcOutLearn }

// FastOutVXLAN is a VXLAN device the fast path may send through, by its
// VNI: the UDP source port range its udp_flow_src_port takes (its srcport
// range, or else its namespace's ip_local_port_range: PortMin and PortMax
// as the kernel passes them), and the longest inner IP packet the path
// sends (MTU: the device's, and the underlay's less the outer headers).
type FastOutVXLAN struct {
	VNI              uint32
	PortMin, PortMax uint16
	MTU              uint32
}

// FastOutPath is what the agent vouches for on the way out: nothing
// between these host-side veths' ingress and these underlays' transmit,
// through these VXLAN devices, can change the kernel's verdict on a flow.
type FastOutPath struct {
	VXLANs    []FastOutVXLAN
	Veths     []uint32
	Underlays []uint32
}

// Roles in steer_fastout_dev (bits): bpf/fastout.h's FASTOUT_VETH and
// FASTOUT_UNDERLAY, as TestConstsMatchC checks.
const (
	fastOutVeth     = 1
	fastOutUnderlay = 2
)

func (p FastOutPath) check() error {
	if len(p.VXLANs) > maxFastVXLANs || len(p.Veths)+len(p.Underlays) > maxFastVeths {
		return fmt.Errorf("fast path out of %d VXLAN devices and %d devices: at most %d and %d", len(p.VXLANs), len(p.Veths)+len(p.Underlays), maxFastVXLANs, maxFastVeths)
	}
	for _, v := range p.VXLANs {
		if v.VNI >= 1<<24 || v.PortMin >= v.PortMax || v.MTU < 68 {
			return fmt.Errorf("fast path out through VNI %d (ports %d..%d, MTU %d): needs a 24-bit VNI, a port range and an MTU of at least 68", v.VNI, v.PortMin, v.PortMax, v.MTU)
		}
	}
	if slices.Contains(p.Veths, 0) || slices.Contains(p.Underlays, 0) {
		return fmt.Errorf("fast path out: a device without an ifindex")
	}
	return nil
}

func (p *FastOutPath) sort() {
	slices.SortFunc(p.VXLANs, func(a, b FastOutVXLAN) int { return cmp.Compare(a.VNI, b.VNI) })
	slices.Sort(p.Veths)
	slices.Sort(p.Underlays)
}

// SetOutPath makes p the path the programs learn on out of the container,
// replacing the previous one; changed says whether it differs. As
// SetPath: in the namespace of p's devices, and the caller flushes the
// entries made on a path that changed.
func (f Fast) SetOutPath(p FastOutPath) (changed bool, err error) {
	if err := p.check(); err != nil {
		return false, err
	}
	old, err := f.OutPath()
	if err != nil {
		return false, err
	}
	p.sort()
	vx := map[uint32]steerFastoutVxlan{}
	for _, v := range p.VXLANs {
		vx[v.VNI] = steerFastoutVxlan{PortMin: uint32(v.PortMin), PortRange: uint32(v.PortMax - v.PortMin), Mtu: v.MTU}
	}
	devs := map[uint32]uint32{}
	for _, i := range p.Veths {
		devs[i] |= fastOutVeth
	}
	for _, i := range p.Underlays {
		devs[i] |= fastOutUnderlay
	}
	if err := replaceMap(f.objs.SteerFastoutVxlan, vx, nil); err != nil {
		return false, fmt.Errorf("fast path out's VXLAN devices: %w", err)
	}
	if err := replaceMap(f.objs.SteerFastoutDev, devs, nil); err != nil {
		return false, fmt.Errorf("fast path out's devices: %w", err)
	}
	return fmt.Sprint(old) != fmt.Sprint(p), nil
}

// OutPath reads the path the programs learn on out of the container.
func (f Fast) OutPath() (FastOutPath, error) {
	var p FastOutPath
	var vni, ifi, role uint32
	var v steerFastoutVxlan
	it := f.objs.SteerFastoutVxlan.Iterate()
	for it.Next(&vni, &v) {
		p.VXLANs = append(p.VXLANs, FastOutVXLAN{VNI: vni, PortMin: uint16(v.PortMin), PortMax: uint16(v.PortMin + v.PortRange), MTU: v.Mtu})
	}
	if err := it.Err(); err != nil {
		return p, fmt.Errorf("reading the fast path out's VXLAN devices: %w", err)
	}
	it = f.objs.SteerFastoutDev.Iterate()
	for it.Next(&ifi, &role) {
		if role&fastOutVeth != 0 {
			p.Veths = append(p.Veths, ifi)
		}
		if role&fastOutUnderlay != 0 {
			p.Underlays = append(p.Underlays, ifi)
		}
	}
	if err := it.Err(); err != nil {
		return p, fmt.Errorf("reading the fast path out's devices: %w", err)
	}
	p.sort()
	return p, nil
}

// flushOut deletes every entry and note of the way out and says how many
// entries there were.
func (f Fast) flushOut() (int, error) {
	n, err := clearMap[steerFastoutKey, steerFastoutEntry](f.objs.SteerFastout)
	if err != nil {
		return n, fmt.Errorf("flushing the fast path out's entries: %w", err)
	}
	if _, err := clearMap[steerFastoutKey, steerFastoutNote](f.objs.SteerFastoutNotes); err != nil {
		return n, fmt.Errorf("flushing the fast path out's notes: %w", err)
	}
	return n, nil
}

// FastOutEntry is one flow on the fast path out: frames with the inner
// 5-tuple given that come in on the host-side veth Veth are encapsulated
// for VNI between VTEPSrc and VTEPDst and sent out Underlay.
type FastOutEntry struct {
	Veth             uint32
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
	VNI              uint32
	Underlay         uint32
	VTEPSrc, VTEPDst netip.Addr
	// TTLDec is what the kernel's path takes off the inner TTL (0
	// bridged, 1 routed), MTU the longest inner packet sent, UDPCsum
	// whether the device writes an outer UDP checksum.
	TTLDec  uint8
	MTU     uint32
	UDPCsum bool
	// Changes and LastUsed are as FastEntry's.
	Changes  uint64
	LastUsed time.Duration
}

// OutEntries lists the fast path out's entries, sorted by veth and flow.
func (f Fast) OutEntries() ([]FastOutEntry, error) {
	var out []FastOutEntry
	var k steerFastoutKey
	var e steerFastoutEntry
	it := f.objs.SteerFastout.Iterate()
	for it.Next(&k, &e) {
		ip := e.Hdr[ethHLen:]
		out = append(out, FastOutEntry{
			Veth: k.Veth, Src: beAddr(k.Saddr), Dst: beAddr(k.Daddr), SrcPort: bePort(k.Sport), DstPort: bePort(k.Dport), Proto: k.Proto,
			VNI: binary.BigEndian.Uint32(ip[32:]) >> 8, Underlay: e.Underlay,
			VTEPSrc: netip.AddrFrom4([4]byte(ip[12:16])), VTEPDst: netip.AddrFrom4([4]byte(ip[16:20])),
			TTLDec: e.TtlDec, MTU: e.Mtu, UDPCsum: e.Csum != 0, Changes: e.Changes, LastUsed: time.Duration(e.Last),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the fast path out's entries: %w", err)
	}
	slices.SortFunc(out, func(a, b FastOutEntry) int {
		return cmp.Or(cmp.Compare(a.Veth, b.Veth), a.Src.Compare(b.Src), a.Dst.Compare(b.Dst), cmp.Compare(a.SrcPort, b.SrcPort), cmp.Compare(a.DstPort, b.DstPort), cmp.Compare(a.Proto, b.Proto))
	})
	return out, nil
}

// ethHLen is an Ethernet header's length.
const ethHLen = 14
