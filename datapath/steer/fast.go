//go:build linux

package steer

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
)

// Fast is the fast path into the container (bpf/fast.h): what lanes agent
// vouches for (the path, the lease) and the entries the programs learned.
type Fast struct{ *core }

func (d *Datapath) Fast() Fast { return Fast{d.core} }

// FastVXLAN is a VXLAN device whose frames the fast path may learn from:
// its ifindex (as a frame it received carries it: skb->ingress_ifindex)
// and its VNI.
type FastVXLAN struct {
	Ifindex uint32
	VNI     uint32
}

// FastVeth is a host-side veth the fast path may deliver to: the longest
// inner IP packet the kernel's path forwards to its container (MTU) and
// the container interface's MAC.
type FastVeth struct {
	Ifindex uint32
	MTU     uint32
	MAC     net.HardwareAddr
}

// FastPath is what the agent vouches for: nothing on the way from these
// VXLAN devices to these veths can change the kernel's verdict on a flow.
type FastPath struct {
	VXLANs []FastVXLAN
	Veths  []FastVeth
}

// maxFastVXLANs and maxFastVeths are steer_fast_vxlan's and steer_fast_dev's
// sizes, and steer_fastout_vxlan's and steer_fastout_dev's: TestConstsMatchC
// checks them in the object.
const (
	maxFastVXLANs = 64
	maxFastVeths  = 4096
)

func (p FastPath) check() error {
	if len(p.VXLANs) > maxFastVXLANs || len(p.Veths) > maxFastVeths {
		return fmt.Errorf("fast path of %d VXLAN devices and %d veths: at most %d and %d", len(p.VXLANs), len(p.Veths), maxFastVXLANs, maxFastVeths)
	}
	for _, v := range p.VXLANs {
		if v.Ifindex == 0 || v.VNI >= 1<<24 {
			return fmt.Errorf("fast path VXLAN device %d (VNI %d): needs a device and a 24-bit VNI", v.Ifindex, v.VNI)
		}
	}
	for _, v := range p.Veths {
		if v.Ifindex == 0 || v.MTU < 68 || len(v.MAC) != 6 || v.MAC[0]&1 != 0 {
			return fmt.Errorf("fast path veth %d (MTU %d, MAC %s): needs a device, an MTU of at least 68 and a unicast MAC", v.Ifindex, v.MTU, v.MAC)
		}
	}
	return nil
}

func (p *FastPath) sort() {
	slices.SortFunc(p.VXLANs, func(a, b FastVXLAN) int { return cmp.Compare(a.Ifindex, b.Ifindex) })
	slices.SortFunc(p.Veths, func(a, b FastVeth) int { return cmp.Compare(a.Ifindex, b.Ifindex) })
}

// SetPath makes p the path the programs learn on, replacing the previous
// one; changed says whether it differs. It must run in the namespace of
// p's devices (their ifindexes are that namespace's). Entries made on a
// path that changed may deliver where the new one would not: the caller
// flushes them (Flush).
func (f Fast) SetPath(p FastPath) (changed bool, err error) {
	if err := p.check(); err != nil {
		return false, err
	}
	old, err := f.Path()
	if err != nil {
		return false, err
	}
	p.sort()
	vx := map[uint32]uint32{}
	for _, v := range p.VXLANs {
		vx[v.Ifindex] = v.VNI
	}
	devs := map[uint32]steerFastDev{}
	for _, v := range p.Veths {
		d := steerFastDev{Mtu: v.MTU}
		copy(d.Mac[:], v.MAC)
		devs[v.Ifindex] = d
	}
	if err := replaceMap(f.objs.SteerFastVxlan, vx, nil); err != nil {
		return false, fmt.Errorf("fast path VXLAN devices: %w", err)
	}
	if err := replaceMap(f.objs.SteerFastDev, devs, nil); err != nil {
		return false, fmt.Errorf("fast path veths: %w", err)
	}
	return fmt.Sprint(old) != fmt.Sprint(p), nil
}

// Path reads the path the programs learn on, sorted by ifindex.
func (f Fast) Path() (FastPath, error) {
	var p FastPath
	var ifi, vni uint32
	it := f.objs.SteerFastVxlan.Iterate()
	for it.Next(&ifi, &vni) {
		p.VXLANs = append(p.VXLANs, FastVXLAN{Ifindex: ifi, VNI: vni})
	}
	if err := it.Err(); err != nil {
		return p, fmt.Errorf("reading the fast path's VXLAN devices: %w", err)
	}
	var d steerFastDev
	it = f.objs.SteerFastDev.Iterate()
	for it.Next(&ifi, &d) {
		p.Veths = append(p.Veths, FastVeth{Ifindex: ifi, MTU: d.Mtu, MAC: net.HardwareAddr(append([]byte(nil), d.Mac[:]...))})
	}
	if err := it.Err(); err != nil {
		return p, fmt.Errorf("reading the fast path's veths: %w", err)
	}
	p.sort()
	return p, nil
}

// Renew makes the lease run until ttl from now, under the change count
// changes (Datapath.Changes, read before the facts the path came from):
// until then, and while no other change is counted, the programs admit
// and use entries; past it, nothing (an agent that died leaves every
// frame to the kernel's path).
func (f Fast) Renew(ttl time.Duration, changes uint64) error {
	if ttl <= 0 {
		return fmt.Errorf("fast path lease of %v", ttl)
	}
	l := steerFastLease{Deadline: uint64(Now() + ttl), Changes: changes}
	if err := f.objs.SteerFastLease.Put(uint32(0), l); err != nil {
		return fmt.Errorf("renewing the fast path's lease: %w", err)
	}
	return nil
}

// Lease is the lease's deadline (CLOCK_MONOTONIC, as Now; 0: none) and
// the change count it holds under.
func (f Fast) Lease() (deadline time.Duration, changes uint64, err error) {
	var l steerFastLease
	if err := f.objs.SteerFastLease.Lookup(uint32(0), &l); err != nil {
		return 0, 0, fmt.Errorf("reading the fast path's lease: %w", err)
	}
	return time.Duration(l.Deadline), l.Changes, nil
}

// Withdraw ends what the agent vouched for: the lease first (nothing is
// admitted or used from then on), then it moves the change count on, so
// that every entry and note made before is void whatever a flush racing
// a learning program misses, and flushes them. The path stays for the
// next Renew (SetPath an empty one to clear it).
func (f Fast) Withdraw() error {
	if err := f.objs.SteerFastLease.Put(uint32(0), steerFastLease{}); err != nil {
		return fmt.Errorf("ending the fast path's lease: %w", err)
	}
	if err := f.countChange(); err != nil {
		return err
	}
	_, err := f.Flush()
	return err
}

// Flush deletes every entry and every note, both ways, and says how many
// entries there were: the kernel's path takes each flow's next frame and makes
// its entry anew where the path still allows it.
func (f Fast) Flush() (int, error) {
	n, err := clearMap[steerFastKey, steerFastEntry](f.objs.SteerFast)
	if err != nil {
		return n, fmt.Errorf("flushing the fast path's entries: %w", err)
	}
	if _, err := clearMap[steerFastKey, steerFastNote](f.objs.SteerFastNotes); err != nil {
		return n, fmt.Errorf("flushing the fast path's notes: %w", err)
	}
	out, err := f.flushOut()
	return n + out, err
}

// clearMap deletes every key of m and says how many it deleted.
func clearMap[K comparable, V any](m *ebpf.Map) (int, error) {
	keys, err := mapKeys[K, V](m)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range keys {
		switch err := m.Delete(k); {
		case err == nil:
			n++
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			return n, err
		}
	}
	return n, nil
}

// FastEntry is one flow on the fast path: frames of overlay VNI with the
// inner 5-tuple given go to the host-side veth Ifindex's container.
type FastEntry struct {
	VNI              uint32
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
	Ifindex          uint32
	// VTEPSrc and VTEPDst are the outer addresses the frames must come
	// between, TTLDec what the kernel's path takes off their TTL (0
	// bridged, 1 routed), MTU the longest inner packet delivered.
	VTEPSrc, VTEPDst netip.Addr
	TTLDec           uint8
	MTU              uint32
	// Changes is the change count (Datapath.Changes) the entry was
	// admitted under, LastUsed its last use (CLOCK_MONOTONIC, stamped
	// once a millisecond at most).
	Changes  uint64
	LastUsed time.Duration
}

// Entries lists the fast path's entries, sorted by VNI and flow. Entries
// a change voided since are listed too until their next frame deletes
// them: compare Changes with Datapath.Changes.
func (f Fast) Entries() ([]FastEntry, error) {
	var out []FastEntry
	var k steerFastKey
	var e steerFastEntry
	it := f.objs.SteerFast.Iterate()
	for it.Next(&k, &e) {
		out = append(out, FastEntry{
			VNI: k.Vni, Src: beAddr(k.Saddr), Dst: beAddr(k.Daddr), SrcPort: bePort(k.Sport), DstPort: bePort(k.Dport), Proto: k.Proto,
			Ifindex: e.Ifindex, VTEPSrc: beAddr(e.VtepSrc), VTEPDst: beAddr(e.VtepDst), TTLDec: e.TtlDec, MTU: e.Mtu,
			Changes: e.Changes, LastUsed: time.Duration(e.Last),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the fast path's entries: %w", err)
	}
	slices.SortFunc(out, func(a, b FastEntry) int {
		return cmp.Or(cmp.Compare(a.VNI, b.VNI), a.Src.Compare(b.Src), a.Dst.Compare(b.Dst), cmp.Compare(a.SrcPort, b.SrcPort), cmp.Compare(a.DstPort, b.DstPort), cmp.Compare(a.Proto, b.Proto))
	})
	return out, nil
}
