package prism

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"

	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/policy/onpath"
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
	// Sources and Locals are what a frame must come from and to for the
	// datapath to take it (steer.SyncSet): the remote MACs of static
	// forwarding entries the bridge forwards from the VXLAN port, each
	// from its VTEP, and this host's VTEP addresses on the underlay.
	Sources []steer.SyncSource
	Locals  []steer.SyncLocal
	// GRO are the container interfaces whose GRO the plan turns on.
	GRO []ContainerGRO
	// Notes say, for people, why destinations were left to batch mode.
	Notes []string

	facts SyncFacts
}

// SyncFacts is what Sync reads beyond the topology: each bridged VXLAN
// device's receive path (by device name) and the packet filters of the
// namespaces on the way (by namespace).
type SyncFacts struct {
	Paths   map[string]topology.SyncPath
	Filters map[string]topology.Filters
}

// ReadSyncFacts reads t's SyncFacts.
func ReadSyncFacts(t *topology.Topology) SyncFacts {
	f := SyncFacts{Paths: map[string]topology.SyncPath{}, Filters: onpath.ReadFilters(t)}
	for i := range t.VXLANs {
		v := &t.VXLANs[i]
		if v.Underlay != "" && v.Master != "" {
			f.Paths[v.Name] = topology.ReadSyncPath(t, v)
		}
	}
	return f
}

// Set is the plan as the datapath takes it.
func (sp SyncPlan) Set() steer.SyncSet {
	return steer.SyncSet{Targets: toSteer(sp.Targets), Sources: sp.Sources, Locals: sp.Locals}
}

// Sync computes the shortcut's targets on t. It is conservative: whatever
// it cannot show to be a plain L2 forward to a container's veth (a filter
// that might act, state it could not read, a routed overlay) is left out.
// In particular the shortcut runs only where no netfilter table that can
// see the overlay's frames exists on its path, in t's namespace or the
// underlay's: lanes does not judge what a rule does, so a firewall's verdict
// always stands (a table added later withdraws the destinations:
// syncAgent, watch.go).
func Sync(t *topology.Topology, facts SyncFacts) SyncPlan {
	sp := SyncPlan{facts: facts}
	note := func(format string, args ...any) { sp.Notes = append(sp.Notes, fmt.Sprintf(format, args...)) }
	if why := onpath.FiltersMayAct(t.Netfilter, facts.Filters[t.NetNS], t.NetNS); why != "" {
		note("sync off: %s; high-priority flows use batch mode", why)
		return sp
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
	case len(v.Hooks.Others(onpath.OwnHook)) > 0:
		note("has programs or filters (%s); batch mode", strings.Join(v.Hooks.Others(onpath.OwnHook), ", "))
		return
	case !v.Up:
		note("is down (vxlan_rcv drops what it receives); batch mode")
		return
	}
	// The outer datagram's own path, which XDP's redirect skips: the
	// underlay's tc ingress, and, when the underlay lives in another
	// namespace (Docker's overlay namespaces), that namespace's
	// prerouting and input hooks on the way to the VXLAN socket.
	u := t.UnderlayOf(v)
	if u == nil {
		note("underlay not found; batch mode")
		return
	}
	if h := onpath.IngressHooks(u.Hooks); len(h) > 0 {
		note("underlay %s has receive programs or filters (%s) the shortcut would skip; batch mode", u.Name, strings.Join(h, ", "))
		return
	}
	if v.UnderlayNetNS != t.NetNS {
		uf, read := sp.facts.Filters[v.UnderlayNetNS]
		if v.UnderlayNetfilter == nil || !read {
			note("the packet filters of the underlay's namespace %s were not read; batch mode", onpath.Label(v.UnderlayNetNS))
			return
		}
		if why := onpath.FiltersMayAct(*v.UnderlayNetfilter, uf, v.UnderlayNetNS); why != "" {
			note("its datagrams arrive through %s: %s; batch mode", onpath.Label(v.UnderlayNetNS), why)
			return
		}
	}
	p, ok := sp.facts.Paths[v.Name]
	switch {
	case !ok:
		note("its receive path was not read; batch mode")
		return
	case p.Err != "":
		note("its receive path could not be read (%s); batch mode", p.Err)
		return
	}
	srcs, locals, why := sp.sourcesAndLocals(t, v, p)
	if why != "" {
		note("%s; batch mode", why)
		return
	}
	br := t.BridgeNamed(v.Master)
	if br == nil {
		note("bridge %s not found; batch mode", v.Master)
		return
	}
	if br.VLANFiltering {
		note("bridge %s filters VLANs; batch mode", br.Name)
		return
	}
	in, ok := br.Port(v.Name)
	if !ok || in.State != "forwarding" || in.Locked {
		note("its bridge port is not forwarding freely (%+v); batch mode", in)
		return
	}
	sp.Sources = append(sp.Sources, srcs...)
	sp.Locals = append(sp.Locals, locals...)
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
	veth := t.VethNamed(e.Port)
	if veth == nil || veth.Master != br.Name {
		return "not a container's veth"
	}
	out, ok := br.Port(veth.Name)
	switch {
	case !ok || out.State != "forwarding" || out.Locked:
		return fmt.Sprintf("not forwarding freely (%+v)", out)
	case in.Isolated && out.Isolated:
		return "isolated from " + v.Name
	case len(onpath.EgressHooks(veth.Hooks)) > 0:
		// Its ingress and XDP hooks see the container's traffic to the
		// host, not the frames the shortcut delivers.
		return "egress has " + strings.Join(onpath.EgressHooks(veth.Hooks), ", ")
	}
	c := t.PeerOf(veth)
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
	// The bridge's transmit checks the host side's MTU, the veth's the
	// container side's: the smaller holds.
	sp.Targets = append(sp.Targets, SyncTarget{VNI: uint32(v.VNI), MAC: mac, Veth: veth.Name, Ifindex: veth.Index, MTU: min(c.MTU, veth.MTU), Container: c.NetNS + "/" + c.Name})
	return ""
}

// sourcesAndLocals are what v's frames must come from and to for the
// datapath to take them, or why there is nothing (datapath/steer/bpf/sync.h's sync_accept).
//
// Sources: the VXLAN device's static forwarding entries (their remote MAC
// and VTEP), which the kernel takes a frame from only from that VTEP; the
// bridge must have the MAC on the VXLAN port, so it forwards replies there
// rather than flooding them. Frames the shortcut takes skip the bridge's
// learning, which would refresh that entry: lanes agent refreshes it for
// every source the shortcut took a frame from (syncAgent.refreshFDB), and
// a source whose entry aged out anyway leaves the set until the kernel's
// path learns it again. With rp_filter on, a VTEP whose route back does
// not leave by the underlay (strict) or does not exist (loose) is left
// out: the kernel drops its datagrams.
//
// Locals: the device's local address (else the underlay's IPv4
// addresses), each only if the underlay has it, with the underlay's MAC.
func (sp *SyncPlan) sourcesAndLocals(t *topology.Topology, v *topology.VXLAN, p topology.SyncPath) ([]steer.SyncSource, []steer.SyncLocal, string) {
	mac, err := net.ParseMAC(p.UnderlayMAC)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
		return nil, nil, fmt.Sprintf("underlay %s has no unicast MAC (%q)", v.Underlay, p.UnderlayMAC)
	}
	var locals []steer.SyncLocal
	for _, a := range p.UnderlayAddrs {
		if !v.Local.IsValid() || a == v.Local {
			locals = append(locals, steer.SyncLocal{Ifindex: uint32(p.UnderlayIndex), Addr: a, MAC: mac})
		}
	}
	if len(locals) == 0 {
		return nil, nil, fmt.Sprintf("underlay %s has no IPv4 address the device receives on (local %v)", v.Underlay, v.Local)
	}
	br := t.BridgeNamed(v.Master)
	var srcs []steer.SyncSource
	for _, s := range p.Sources {
		hw, err := net.ParseMAC(s.MAC)
		if err != nil || !s.VTEP.Is4() {
			continue
		}
		onPort := br != nil && slices.ContainsFunc(br.FDB, func(e topology.FDBEntry) bool {
			return e.MAC == s.MAC && e.Port == v.Name && !e.Local && e.VLAN == 0
		})
		dev, routed := p.VTEPRoutes[s.VTEP]
		switch {
		case !onPort:
			continue
		case p.RPFilter == 1 && (!routed || dev != p.UnderlayIndex), p.RPFilter == 2 && !routed:
			continue
		}
		srcs = append(srcs, steer.SyncSource{VNI: uint32(v.VNI), MAC: hw, VTEP: s.VTEP})
	}
	if len(srcs) == 0 {
		return nil, nil, "no remote MAC has a static forwarding entry the bridge forwards from its port (the shortcut takes frames only from those)"
	}
	return srcs, locals, ""
}

// toSteer is targets as the datapath takes them.
func toSteer(targets []SyncTarget) []steer.SyncTarget {
	out := make([]steer.SyncTarget, len(targets))
	for i, tg := range targets {
		out[i] = steer.SyncTarget{VNI: tg.VNI, MAC: tg.MAC, Ifindex: uint32(tg.Ifindex), MTU: uint32(tg.MTU)}
	}
	return out
}
