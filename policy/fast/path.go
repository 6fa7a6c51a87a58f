package fast

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/policy/onpath"
	"github.com/lanesnet/lanes/topology"
)

// Where the fast path may run: the VXLAN devices and host-side veths
// between which nothing the fast path skips (outer IP/UDP and the VXLAN
// device unless it starts at the VXLAN device (FromVXLAN), the bridge or
// the routing, the veth's transmit) can change the kernel's verdict on a
// flow. lanes does not judge what a rule or a
// program does: any netfilter table that can see the overlay's frames,
// IPsec, legacy ebtables, or a tc or XDP program lanes did not install on
// what is skipped keeps the fast path off there (onpath). The datapath
// checks the rest per frame (bpf/fast.h).

// Path is what the agent may vouch for on t, and for people why the rest
// is left to the kernel's path.
type Path struct {
	steer.FastPath
	// Veths names the veths of FastPath.Veths, for status.
	Veths []string
	// Out is where the fast path out of the container may run (pathout.go),
	// OutVeths the names of its veths.
	Out      steer.FastOutPath
	OutVeths []string
	Notes    []string
}

// PathOf reads where the fast path may run on t, with the packet filters
// of the namespaces on the way (onpath.ReadFilters).
func PathOf(t *topology.Topology, filters map[string]topology.Filters) Path {
	var p Path
	note := func(format string, args ...any) { p.Notes = append(p.Notes, fmt.Sprintf(format, args...)) }
	f, read := filters[t.NetNS]
	if !read {
		note("fast path off: the packet filters of %s were not read", onpath.Label(t.NetNS))
		return p
	}
	if why := onpath.FiltersMayAct(t.Netfilter, f, t.NetNS); why != "" {
		note("fast path off: %s; every flow takes the kernel's path", why)
		return p
	}
	p.addOut(t, note)
	for i := range t.VXLANs {
		v := &t.VXLANs[i]
		if why := vxlanOff(t, v); why != "" {
			note("fast path off for %s: %s", v.Name, why)
			continue
		}
		p.FastPath.VXLANs = append(p.FastPath.VXLANs, steer.FastVXLAN{Ifindex: uint32(v.Index), VNI: uint32(v.VNI)})
	}
	if len(p.FastPath.VXLANs) == 0 {
		return p
	}
	for i := range t.Veths {
		vt := &t.Veths[i]
		fv, why := vethOn(t, vt)
		if why != "" {
			note("fast path off to %s: %s", vt.Name, why)
			continue
		}
		p.FastPath.Veths = append(p.FastPath.Veths, fv)
		p.Veths = append(p.Veths, vt.Name)
	}
	return p
}

// FromVXLAN says whether the fast path for v's frames starts at v's own tc
// ingress (bpf/fast.h's fast_vx) rather than at its underlay's: where the
// underlay lives in another namespace than the containers' veths
// (dockerd's overlay namespace), bpf_redirect_peer from it cannot reach
// them, so the kernel's path keeps the outer stack and the VXLAN device,
// and the fast path skips the bridge, the veth and the backlog.
func FromVXLAN(t *topology.Topology, v *topology.VXLAN) bool {
	return v.UnderlayNetNS != t.NetNS
}

// vxlanOff says why the fast path cannot take v's frames ("" when it can).
func vxlanOff(t *topology.Topology, v *topology.VXLAN) string {
	switch {
	case v.External:
		return "an external (collect metadata) device: its VNI is not the device's"
	case v.GBP:
		return "it carries group policy ids that filters may match"
	case !v.Up:
		return "it is down (vxlan_rcv drops what it receives)"
	}
	if h := allHooks(v.Hooks); len(h) > 0 {
		return "it has programs or filters (" + strings.Join(h, ", ") + ")"
	}
	if FromVXLAN(t, v) {
		// The kernel's path runs the underlay, its hooks and its
		// namespace's filters; the fast path starts after them.
		return bridgedOff(t, v)
	}
	u := t.UnderlayOf(v)
	if u == nil {
		return "its underlay was not found"
	}
	if h := onpath.IngressHooks(u.Hooks); len(h) > 0 {
		return fmt.Sprintf("underlay %s has receive programs or filters (%s) the fast path would skip", u.Name, strings.Join(h, ", "))
	}
	return bridgedOff(t, v)
}

// bridgedOff says why frames from v's port of its bridge may not be
// forwarded plainly ("" when they are, or v has no bridge).
func bridgedOff(t *topology.Topology, v *topology.VXLAN) string {
	if br := t.BridgeNamed(v.Master); br != nil {
		return bridgeOff(br, v.Name)
	}
	return ""
}

// vethOn is what the fast path may deliver to v, or why not: a container's
// host-side veth, forwarding freely from the overlay, with nothing on its
// transmit side, and for the MTU the smallest on the way (the bridge's,
// which a routed path forwards through, the veth's ends').
func vethOn(t *topology.Topology, v *topology.Veth) (steer.FastVeth, string) {
	c := t.PeerOf(v)
	switch {
	case c == nil:
		return steer.FastVeth{}, "not a container's veth"
	case !v.Up || !c.Up:
		return steer.FastVeth{}, "down"
	case len(onpath.EgressHooks(v.Hooks)) > 0:
		return steer.FastVeth{}, "its egress has " + strings.Join(onpath.EgressHooks(v.Hooks), ", ")
	case c.Hooks != nil && (c.Hooks.XDP != "" || c.Hooks.Err != ""):
		// The veth runs its peer's XDP program on every frame it
		// transmits; a frame handed into the namespace would skip it.
		return steer.FastVeth{}, fmt.Sprintf("container interface %s has an XDP program or unread hooks (%+v)", c.Name, *c.Hooks)
	}
	mtu := min(v.MTU, c.MTU)
	if v.Master != "" {
		br := t.BridgeNamed(v.Master)
		if br == nil {
			return steer.FastVeth{}, "its bridge " + v.Master + " was not found"
		}
		if why := bridgeOff(br, v.Name); why != "" {
			return steer.FastVeth{}, why
		}
		if h := allHooks(br.Hooks); len(h) > 0 && routedInto(t, br) {
			return steer.FastVeth{}, fmt.Sprintf("bridge %s, which the overlay routes through, has programs or filters (%s)", br.Name, strings.Join(h, ", "))
		}
		mtu = min(mtu, br.MTU)
	}
	mac, err := net.ParseMAC(c.MAC)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
		return steer.FastVeth{}, fmt.Sprintf("container interface %s has no unicast MAC (%q)", c.Name, c.MAC)
	}
	return steer.FastVeth{Ifindex: uint32(v.Index), MTU: uint32(mtu), MAC: mac}, ""
}

// bridgeOff says why frames through port of br may not be forwarded
// plainly ("" when they are).
func bridgeOff(br *topology.Bridge, port string) string {
	if br.VLANFiltering {
		return "bridge " + br.Name + " filters VLANs"
	}
	in, ok := br.Port(port)
	if !ok || in.State != "forwarding" || in.Locked || in.Isolated {
		return fmt.Sprintf("its port of bridge %s is not forwarding freely (%+v)", br.Name, in)
	}
	return ""
}

// routedInto says whether an L3 VXLAN device of t routes into br: its
// frames then leave through br's own transmit, and br's egress hooks see
// them.
func routedInto(t *topology.Topology, br *topology.Bridge) bool {
	return slices.ContainsFunc(t.VXLANs, func(v topology.VXLAN) bool { return v.L3 && v.Master != br.Name })
}

// allHooks are a device's hooks besides lanes' own, on either side.
func allHooks(h *topology.Hooks) []string {
	if h == nil {
		return nil
	}
	return h.Others(onpath.OwnHook)
}
