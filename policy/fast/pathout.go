package fast

import (
	"fmt"
	"strings"

	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/policy/onpath"
	"github.com/lanesnet/lanes/topology"
)

// Where the fast path out of the container may run: the host-side veths
// whose frames it may take and the VXLAN devices and underlays it may
// send them through, where nothing it skips (the veth's receive after its
// own program, the bridge or the routing, the VXLAN device's transmit,
// outer IP/UDP) can change the kernel's verdict on a flow. The netfilter,
// IPsec and ebtables checks are PathOf's, for both ways; here the tc and
// XDP programs on what is skipped, and what the datapath must know to
// write what the VXLAN device writes (its source port range, the MTU).

// outerLen is what VXLAN encapsulation adds to an inner IP packet: the
// inner Ethernet header, VXLAN, UDP and IPv4.
const outerLen = 14 + 8 + 8 + 20

// addOut adds to p where the fast path out may run on t, noting why not
// elsewhere.
func (p *Path) addOut(t *topology.Topology, note func(string, ...any)) {
	underlays := map[int]bool{}
	for i := range t.VXLANs {
		v := &t.VXLANs[i]
		u, why := vxlanOutOn(t, v)
		if why != "" {
			note("fast path out off through %s: %s", v.Name, why)
			continue
		}
		p.Out.VXLANs = append(p.Out.VXLANs, steer.FastOutVXLAN{VNI: uint32(v.VNI), PortMin: uint16(v.SrcPorts[0]), PortMax: uint16(v.SrcPorts[1]),
			MTU: uint32(min(v.MTU, u.MTU-outerLen))})
		if !underlays[u.Index] {
			underlays[u.Index] = true
			p.Out.Underlays = append(p.Out.Underlays, uint32(u.Index))
		}
	}
	if len(p.Out.VXLANs) == 0 {
		return
	}
	for i := range t.Veths {
		vt := &t.Veths[i]
		if why := vethOutOff(t, vt); why != "" {
			note("fast path out off from %s: %s", vt.Name, why)
			continue
		}
		p.Out.Veths = append(p.Out.Veths, uint32(vt.Index))
		p.OutVeths = append(p.OutVeths, vt.Name)
	}
}

// vxlanOutOn is the underlay the fast path may send v's frames out of, or
// why it may not.
func vxlanOutOn(t *topology.Topology, v *topology.VXLAN) (*topology.Device, string) {
	switch {
	case v.External:
		return nil, "an external (collect metadata) device: its VNI and VTEPs are a route's or a program's, per packet"
	case v.GBP:
		return nil, "it carries group policy ids that filters may match"
	case !v.Up:
		return nil, "it is down"
	case v.UnderlayNetNS != t.NetNS:
		return nil, fmt.Sprintf("its underlay lives in %s, to which bpf_redirect cannot send from the containers' veths", onpath.Label(v.UnderlayNetNS))
	case v.SrcPorts[0] <= 0 || v.SrcPorts[0] >= v.SrcPorts[1] || v.SrcPorts[1] > 0xffff:
		return nil, fmt.Sprintf("its UDP source port range (%d..%d) was not read", v.SrcPorts[0], v.SrcPorts[1])
	}
	if h := allHooks(v.Hooks); len(h) > 0 {
		return nil, "it has programs or filters (" + strings.Join(h, ", ") + ")"
	}
	u := t.UnderlayOf(v)
	if u == nil {
		return nil, "its underlay was not found"
	}
	if h := onpath.EgressHooks(u.Hooks); len(h) > 0 {
		return nil, fmt.Sprintf("underlay %s has transmit programs or filters (%s)", u.Name, strings.Join(h, ", "))
	}
	if u.MTU-outerLen < 68 {
		return nil, fmt.Sprintf("underlay %s's MTU %d leaves no room for an inner packet", u.Name, u.MTU)
	}
	if br := t.BridgeNamed(v.Master); br != nil {
		if why := bridgeOff(br, v.Name); why != "" {
			return nil, why
		}
	}
	return u, ""
}

// vethOutOff says why the fast path out may not take v's frames ("" when
// it may): a container's host-side veth, up, with nothing else on its
// receive side, forwarding freely on its bridge, whose own receive side a
// routed path passes.
func vethOutOff(t *topology.Topology, v *topology.Veth) string {
	c := t.PeerOf(v)
	switch {
	case c == nil:
		return "not a container's veth"
	case !v.Up || !c.Up:
		return "down"
	case len(onpath.IngressHooks(v.Hooks)) > 0:
		return "its ingress has " + strings.Join(onpath.IngressHooks(v.Hooks), ", ")
	case v.Master == "":
		return ""
	}
	br := t.BridgeNamed(v.Master)
	if br == nil {
		return "its bridge " + v.Master + " was not found"
	}
	if why := bridgeOff(br, v.Name); why != "" {
		return why
	}
	if h := allHooks(br.Hooks); len(h) > 0 && routedInto(t, br) {
		return fmt.Sprintf("bridge %s, which the overlay routes through, has programs or filters (%s)", br.Name, strings.Join(h, ", "))
	}
	return ""
}
