package prism

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"

	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/topology"
)

// PRISM-sync runs a high-priority frame to completion: XDP on the underlay
// decapsulates it and redirects it straight to the host-side veth of the
// container it is for, skipping the cpumap queue, the VXLAN device's GRO
// cell, the bridge and the host veth's transmit. That is only the same as
// the normal path when the normal path would take the frame to that veth
// and do nothing else to it on the way. SyncTargets says where that holds,
// from what discovery read; everything else keeps batch handling.

// SyncTarget is one destination the shortcut may take: frames of overlay
// VNI whose inner destination MAC is MAC go to the host-side veth Veth
// (ifindex Ifindex), if no longer than MTU (the container interface's MTU).
type SyncTarget struct {
	VNI       uint32
	MAC       net.HardwareAddr
	Veth      string
	Ifindex   int
	MTU       int
	Container string // the container interface's namespace and name, for people
}

// ContainerGRO names a container interface whose GRO (and with it NAPI)
// must be on for its host-side veth to take XDP-redirected frames.
type ContainerGRO struct {
	NetNS, Device, HostVeth string
}

// SyncPlan is what sync mode can do on a topology.
type SyncPlan struct {
	Targets []SyncTarget
	// GRO are the container interfaces whose GRO the plan turns on.
	GRO []ContainerGRO
	// Notes say, for people, why destinations were left to batch mode.
	Notes []string

	trustNetfilter bool
}

// netfilterMayAct says why netfilter in namespace ns may act on an IPv4
// frame of the overlay ("" when nothing can).
func netfilterMayAct(nf topology.Netfilter, ns string) string {
	if nf.Err != "" {
		return fmt.Sprintf("netfilter in %s could not be read (%s), so rules may filter the path", label(ns), nf.Err)
	}
	if len(nf.IPTables) > 0 {
		return fmt.Sprintf("iptables tables %s exist in %s and may filter the overlay's frames", strings.Join(nf.IPTables, ", "), label(ns))
	}
	var tabs []string
	for _, tab := range nf.NFTables {
		fam, _, _ := strings.Cut(tab, " ")
		if slices.Contains(nfFamiliesSeeIPv4, fam) {
			tabs = append(tabs, fmt.Sprintf("%q", tab))
		}
	}
	if len(tabs) > 0 {
		return fmt.Sprintf("nftables tables %s exist in %s and may filter the overlay's frames", strings.Join(tabs, ", "), label(ns))
	}
	return ""
}

// nfFamiliesSeeIPv4 are the nftables families whose tables can act on an
// IPv4 frame on its way from the underlay to a container (ip6 and arp
// tables never see it).
var nfFamiliesSeeIPv4 = []string{"ip", "inet", "bridge", "netdev"}

// ownHook says whether a hook is one of lanes' steering programs, which
// the shortcut may skip: they only place later stages and count frames,
// they never filter. (The kernel keeps 15 characters of a program's name;
// every steering program's name starts with steer_.)
func ownHook(entry string) bool {
	_, name, _ := strings.Cut(entry, ":")
	return (strings.HasPrefix(entry, "tcx:") || strings.HasPrefix(entry, "xdp:")) && strings.HasPrefix(name, "steer_")
}

// Sync computes the shortcut's targets on t. It is conservative: whatever
// it cannot show to be a plain L2 forward to a container's veth (a filter
// that might act, state it could not read, a routed overlay) is left out.
// trustNetfilter (sync-netfilter=trust) is the operator's word that no
// netfilter rule on the path acts on the overlay's frames: netfilter tables
// then no longer turn the shortcut off, and the plan says which it skips.
func Sync(t *topology.Topology, trustNetfilter bool) SyncPlan {
	sp := SyncPlan{trustNetfilter: trustNetfilter}
	note := func(format string, args ...any) { sp.Notes = append(sp.Notes, fmt.Sprintf(format, args...)) }
	if t.Netfilter.Err != "" {
		// Trust is for rules the operator knows; not for what nobody read.
		note("sync off: %s; high-priority flows use batch mode", netfilterMayAct(t.Netfilter, t.NetNS))
		return sp
	}
	if why := netfilterMayAct(t.Netfilter, t.NetNS); why != "" {
		if !trustNetfilter {
			note("sync off: %s; high-priority flows use batch mode (sync-netfilter=trust overrides this if no rule acts on the overlay's frames)", why)
			return sp
		}
		note("sync: %s; trusted (sync-netfilter=trust): high-priority frames for the destinations below skip them", why)
	}
	for i := range t.VXLANs {
		sp.vxlan(t, &t.VXLANs[i])
	}
	if len(sp.Targets) == 0 && len(sp.Notes) == 0 {
		note("sync: no container reachable through a bridge's forwarding table yet; high-priority flows use batch mode until one is")
	}
	sort.Slice(sp.Targets, func(i, j int) bool {
		a, b := sp.Targets[i], sp.Targets[j]
		if a.VNI != b.VNI {
			return a.VNI < b.VNI
		}
		return a.MAC.String() < b.MAC.String()
	})
	return sp
}

func (sp *SyncPlan) vxlan(t *topology.Topology, v *topology.VXLAN) {
	note := func(format string, args ...any) {
		sp.Notes = append(sp.Notes, fmt.Sprintf("sync: %s: ", v.Name)+fmt.Sprintf(format, args...))
	}
	switch {
	case v.L3 || v.Master == "":
		note("routed overlay (no bridge): the shortcut needs a bridged (L2) overlay; batch mode")
		return
	case v.External:
		note("external (collect metadata) device: its VNI is not the device's; batch mode")
		return
	case v.GBP:
		note("carries group policy ids that filters may match; batch mode")
		return
	case len(v.Hooks.Others(ownHook)) > 0:
		note("has programs or filters (%s); batch mode", strings.Join(v.Hooks.Others(ownHook), ", "))
		return
	}
	// The outer datagram's own path, which XDP's redirect skips: the
	// underlay's tc ingress, and, when the underlay lives in another
	// namespace (Docker's overlay namespaces), that namespace's
	// prerouting and input hooks on the way to the VXLAN socket.
	u := underlayOf(t, v)
	if u == nil {
		note("underlay not found; batch mode")
		return
	}
	if h := ingressHooks(u.Hooks); len(h) > 0 {
		note("underlay %s has receive programs or filters (%s) the shortcut would skip; batch mode", u.Name, strings.Join(h, ", "))
		return
	}
	if v.UnderlayNetNS != t.NetNS && v.UnderlayNetfilter == nil {
		note("netfilter of the underlay's namespace %s was not read; batch mode", label(v.UnderlayNetNS))
		return
	}
	if v.UnderlayNetfilter != nil {
		if why := netfilterMayAct(*v.UnderlayNetfilter, v.UnderlayNetNS); why != "" {
			switch {
			case v.UnderlayNetfilter.Err != "":
				// Trust is for rules the operator knows; not for what nobody read.
				note("its datagrams arrive through %s: %s; batch mode", label(v.UnderlayNetNS), why)
				return
			case !sp.trustNetfilter:
				note("its datagrams arrive through %s: %s; batch mode (sync-netfilter=trust overrides this if no rule acts on them)", label(v.UnderlayNetNS), why)
				return
			}
			note("its datagrams arrive through %s: %s; trusted (sync-netfilter=trust)", label(v.UnderlayNetNS), why)
		}
	}
	br := bridgeNamed(t, v.Master)
	if br == nil {
		note("bridge %s not found; batch mode", v.Master)
		return
	}
	if br.VLANFiltering {
		note("bridge %s filters VLANs; batch mode", br.Name)
		return
	}
	in, ok := portInfo(br, v.Name)
	if !ok || in.State != "forwarding" || in.Locked {
		note("its bridge port is not forwarding freely (%+v); batch mode", in)
		return
	}
	skipped := map[string]string{}
	for _, e := range br.FDB {
		if e.Local || e.Port == v.Name {
			continue
		}
		why := sp.target(t, v, br, in, e)
		if why != "" {
			skipped[e.Port] = why
		}
	}
	ports := make([]string, 0, len(skipped))
	for p := range skipped {
		ports = append(ports, p)
	}
	sort.Strings(ports)
	for _, p := range ports {
		note("port %s: %s; batch mode", p, skipped[p])
	}
}

// target adds e's destination if the bridge forwards there plainly, and
// otherwise says why not.
func (sp *SyncPlan) target(t *topology.Topology, v *topology.VXLAN, br *topology.Bridge, in topology.BridgePort, e topology.FDBEntry) string {
	if e.VLAN != 0 {
		return fmt.Sprintf("entry %s is for VLAN %d", e.MAC, e.VLAN)
	}
	veth := vethNamed(t, e.Port)
	if veth == nil || veth.Master != br.Name {
		return "not a container's veth"
	}
	out, ok := portInfo(br, veth.Name)
	switch {
	case !ok || out.State != "forwarding" || out.Locked:
		return fmt.Sprintf("not forwarding freely (%+v)", out)
	case in.Isolated && out.Isolated:
		return "isolated from " + v.Name
	case len(egressHooks(veth.Hooks)) > 0:
		// Its ingress and XDP hooks see the container's traffic to the
		// host, not the frames the shortcut delivers.
		return "egress has " + strings.Join(egressHooks(veth.Hooks), ", ")
	}
	c := peerOf(t, veth)
	if c == nil {
		return "its container interface was not found"
	}
	if !c.Up {
		return "container interface " + c.Name + " is down"
	}
	// veth offers ndo_xdp_xmit only while its peer's tx queues fit its rx
	// queues (drivers/net/veth.c, veth_set_xdp_features).
	if c.TxQueues > len(veth.RxQueues) {
		return fmt.Sprintf("container interface has %d tx queues for %d rx queues of the veth: the veth takes no redirected frames", c.TxQueues, len(veth.RxQueues))
	}
	if !c.GRO && !slices.ContainsFunc(sp.GRO, func(g ContainerGRO) bool { return g.HostVeth == veth.Name }) {
		sp.GRO = append(sp.GRO, ContainerGRO{NetNS: c.NetNS, Device: c.Name, HostVeth: veth.Name})
	}
	mac, err := net.ParseMAC(e.MAC)
	if err != nil {
		return "bad MAC " + e.MAC
	}
	sp.Targets = append(sp.Targets, SyncTarget{VNI: uint32(v.VNI), MAC: mac, Veth: veth.Name, Ifindex: veth.Index, MTU: c.MTU, Container: c.NetNS + "/" + c.Name})
	return ""
}

// egressHooks are the hooks of a veth's transmit side the shortcut skips.
func egressHooks(h *topology.Hooks) []string {
	if h == nil {
		return nil
	}
	return (&topology.Hooks{Egress: h.Egress, Err: h.Err}).Others(ownHook)
}

// ingressHooks are the hooks of an underlay's receive side besides lanes'
// own: XDP's redirect skips its tc ingress.
func ingressHooks(h *topology.Hooks) []string {
	if h == nil {
		return nil
	}
	return (&topology.Hooks{Ingress: h.Ingress, XDP: h.XDP, Err: h.Err}).Others(ownHook)
}

func underlayOf(t *topology.Topology, v *topology.VXLAN) *topology.Device {
	for i := range t.Underlays {
		if u := &t.Underlays[i]; v.Underlay != "" && u.Name == v.Underlay && u.NetNS == v.UnderlayNetNS {
			return u
		}
	}
	return nil
}

func bridgeNamed(t *topology.Topology, name string) *topology.Bridge {
	for i := range t.Bridges {
		if t.Bridges[i].Name == name {
			return &t.Bridges[i]
		}
	}
	return nil
}

func vethNamed(t *topology.Topology, name string) *topology.Veth {
	for i := range t.Veths {
		if t.Veths[i].Name == name {
			return &t.Veths[i]
		}
	}
	return nil
}

func portInfo(br *topology.Bridge, port string) (topology.BridgePort, bool) {
	for _, p := range br.PortInfo {
		if p.Name == port {
			return p, true
		}
	}
	return topology.BridgePort{Name: port, State: "unknown"}, false
}

// peerOf is the container interface behind a host-side veth.
func peerOf(t *topology.Topology, v *topology.Veth) *topology.Interface {
	for i := range t.Containers {
		for j := range t.Containers[i].Interfaces {
			if ifc := &t.Containers[i].Interfaces[j]; ifc.HostVeth == v.Name {
				return ifc
			}
		}
	}
	return nil
}

// toSteer is targets as the datapath takes them.
func toSteer(targets []SyncTarget) []steer.SyncTarget {
	out := make([]steer.SyncTarget, len(targets))
	for i, tg := range targets {
		out[i] = steer.SyncTarget{VNI: tg.VNI, MAC: tg.MAC, Ifindex: uint32(tg.Ifindex), MTU: uint32(tg.MTU)}
	}
	return out
}

func label(ns string) string {
	if ns == "" {
		return "the host namespace"
	}
	return ns
}
