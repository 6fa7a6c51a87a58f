package prism

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/topology"
)

// dockerTopo is a receiving host with vxlan0 (VNI 42) and two containers
// behind veth1/veth2 on br0, the bridge having learned both containers'
// MACs, plus the local entries every bridge has.
func dockerTopo() *topology.Topology {
	rx := []topology.RxQueue{{Index: 0}}
	dev := func(name string, idx int) topology.Device {
		return topology.Device{Name: name, NetNS: "h2", Index: idx, Up: true, MTU: 1450, RxQueues: rx, TxQueues: 1}
	}
	t := &topology.Topology{
		NetNS:     "h2",
		Kind:      topology.Docker,
		VXLANs:    []topology.VXLAN{{Device: dev("vxlan0", 2), VNI: 42, Port: 4789, Master: "br0", Underlay: "ul2", UnderlayNetNS: "h2"}},
		Underlays: []topology.Device{dev("ul2", 7)},
		Bridges: []topology.Bridge{{
			Device: dev("br0", 3),
			Ports:  []string{"vxlan0", "veth1", "veth2"},
			PortInfo: []topology.BridgePort{
				{Name: "vxlan0", State: "forwarding"}, {Name: "veth1", State: "forwarding"}, {Name: "veth2", State: "forwarding"},
			},
			FDB: []topology.FDBEntry{
				{MAC: "02:00:00:00:01:01", Port: "vxlan0", Static: true},
				{MAC: "02:00:00:00:02:01", Port: "veth1"},
				{MAC: "06:00:00:00:00:01", Port: "veth1", Local: true},
				{MAC: "02:00:00:00:02:02", Port: "veth2"},
			},
		}},
		Veths: []topology.Veth{
			{Device: dev("veth1", 5), Master: "br0", PeerNetNS: "c1"},
			{Device: dev("veth2", 6), Master: "br0", PeerNetNS: "c2"},
		},
	}
	for i, ns := range []string{"c1", "c2"} {
		ifc := topology.Interface{Device: topology.Device{Name: "eth0", NetNS: ns, Index: 2, Up: true, MTU: 1450, TxQueues: 1}, HostVeth: t.Veths[i].Name}
		t.Containers = append(t.Containers, topology.Container{NetNS: ns, Interfaces: []topology.Interface{ifc}})
	}
	return t
}

// dockerFacts are dockerTopo's facts: vxlan0 has a static forwarding
// entry for the remote container 02:00:00:00:01:01 behind VTEP
// 198.18.0.1, the underlay ul2 (index 7) has 198.18.0.2, and no namespace
// has packet filters.
func dockerFacts(t *topology.Topology) SyncFacts {
	f := SyncFacts{
		Paths: map[string]topology.SyncPath{"vxlan0": {
			Sources:       []topology.VXLANSource{{MAC: "02:00:00:00:01:01", VTEP: netip.MustParseAddr("198.18.0.1")}},
			UnderlayIndex: 7, UnderlayMAC: "02:00:00:00:00:07",
			UnderlayAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.2")},
			VTEPRoutes:    map[netip.Addr]int{netip.MustParseAddr("198.18.0.1"): 7},
		}},
		Filters: map[string]topology.Filters{t.NetNS: {}},
	}
	for _, v := range t.VXLANs {
		f.Filters[v.UnderlayNetNS] = topology.Filters{}
	}
	return f
}

// syncOn is Sync with dockerFacts.
func syncOn(t *topology.Topology, trust bool) SyncPlan { return Sync(t, trust, dockerFacts(t)) }

func macs(sp SyncPlan) string {
	var out []string
	for _, tg := range sp.Targets {
		out = append(out, tg.MAC.String()+">"+tg.Veth)
	}
	return strings.Join(out, " ")
}

func TestSyncTargets(t *testing.T) {
	sp := syncOn(dockerTopo(), false)
	if got, want := macs(sp), "02:00:00:00:02:01>veth1 02:00:00:00:02:02>veth2"; got != want {
		t.Fatalf("targets %q, want %q (notes %v)", got, want, sp.Notes)
	}
	tg := sp.Targets[0]
	if tg.VNI != 42 || tg.Ifindex != 5 || tg.MTU != 1450 || tg.Container != "c1/eth0" {
		t.Errorf("target %+v", tg)
	}
	if len(sp.GRO) != 2 || sp.GRO[0] != (ContainerGRO{NetNS: "c1", Device: "eth0", HostVeth: "veth1"}) {
		t.Errorf("GRO to turn on: %+v", sp.GRO)
	}
	if len(sp.Notes) != 0 {
		t.Errorf("notes on a plain bridge: %v", sp.Notes)
	}
	// GRO already on: nothing to turn on.
	topo := dockerTopo()
	topo.Containers[0].Interfaces[0].GRO = true
	if sp := syncOn(topo, false); len(sp.GRO) != 1 || sp.GRO[0].HostVeth != "veth2" {
		t.Errorf("GRO to turn on with c1's on already: %+v", sp.GRO)
	}
}

// Each case changes one thing about the plain bridge; the shortcut must
// then leave out everything (want "") or exactly what the change touches.
func TestSyncFallsBack(t *testing.T) {
	for _, c := range []struct {
		name, want, note string
		edit             func(*topology.Topology)
	}{
		{"iptables table", "", "iptables", func(t *topology.Topology) { t.Netfilter.IPTables = []string{"filter"} }},
		{"nft inet table", "", "nftables", func(t *topology.Topology) { t.Netfilter.NFTables = []string{"inet filter"} }},
		{"nft bridge table", "", "nftables", func(t *topology.Topology) { t.Netfilter.NFTables = []string{"bridge x"} }},
		{"netfilter unread", "", "could not be read", func(t *topology.Topology) { t.Netfilter.Err = "EPERM" }},
		{"vlan filtering", "", "VLAN", func(t *topology.Topology) { t.Bridges[0].VLANFiltering = true }},
		{"tc on vxlan", "", "tc:u32", func(t *topology.Topology) { t.VXLANs[0].Hooks = &topology.Hooks{Ingress: []string{"tc:u32"}} }},
		{"unread vxlan hooks", "", "unread", func(t *topology.Topology) { t.VXLANs[0].Hooks = &topology.Hooks{Err: "EPERM"} }},
		{"routed", "", "routed", func(t *topology.Topology) { t.VXLANs[0].L3 = true; t.VXLANs[0].Master = "" }},
		{"external", "", "external", func(t *topology.Topology) { t.VXLANs[0].External = true }},
		{"gbp", "", "group policy", func(t *topology.Topology) { t.VXLANs[0].GBP = true }},
		{"vxlan port blocking", "", "not forwarding", func(t *topology.Topology) { t.Bridges[0].PortInfo[0].State = "blocking" }},
		{"veth1 egress qdisc", "02:00:00:00:02:02>veth2", "qdisc:htb", func(t *topology.Topology) { t.Veths[0].Hooks = &topology.Hooks{Egress: []string{"qdisc:htb"}} }},
		{"veth1 locked", "02:00:00:00:02:02>veth2", "not forwarding", func(t *topology.Topology) { t.Bridges[0].PortInfo[1].Locked = true }},
		{"both isolated", "02:00:00:00:02:02>veth2", "isolated", func(t *topology.Topology) {
			t.Bridges[0].PortInfo[0].Isolated = true
			t.Bridges[0].PortInfo[1].Isolated = true
		}},
		{"veth2 container down", "02:00:00:00:02:01>veth1", "down", func(t *topology.Topology) { t.Containers[1].Interfaces[0].Up = false }},
		{"veth2 too many tx queues", "02:00:00:00:02:01>veth1", "tx queues", func(t *topology.Topology) { t.Containers[1].Interfaces[0].TxQueues = 2 }},
		{"vlan entry", "02:00:00:00:02:02>veth2", "VLAN", func(t *topology.Topology) { t.Bridges[0].FDB[1].VLAN = 10 }},
		{"unknown port", "02:00:00:00:02:01>veth1", "not a container", func(t *topology.Topology) { t.Bridges[0].FDB[3].Port = "tap0" }},
		{"underlay tc ingress", "", "underlay ul2 has receive programs or filters (tc:u32)", func(t *topology.Topology) {
			t.Underlays[0].Hooks = &topology.Hooks{Ingress: []string{"tc:u32"}}
		}},
		{"underlay foreign xdp", "", "xdp:xdp_fw", func(t *topology.Topology) { t.Underlays[0].Hooks = &topology.Hooks{XDP: "xdp_fw"} }},
		{"underlay not found", "", "underlay not found", func(t *topology.Topology) { t.Underlays = nil }},
		{"underlay namespace iptables", "", "arrive through host0: iptables tables nat", func(t *topology.Topology) {
			movedUnderlay(t, topology.Netfilter{IPTables: []string{"nat", "filter"}})
		}},
		{"underlay namespace unread", "", "could not be read", func(t *topology.Topology) { movedUnderlay(t, topology.Netfilter{Err: "EPERM"}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			topo := dockerTopo()
			c.edit(topo)
			sp := syncOn(topo, false)
			if got := macs(sp); got != c.want {
				t.Errorf("targets %q, want %q", got, c.want)
			}
			if !strings.Contains(strings.Join(sp.Notes, "\n"), c.note) {
				t.Errorf("notes %q do not say %q", sp.Notes, c.note)
			}
		})
	}
}

// movedUnderlay puts the underlay in namespace host0, as Docker leaves it
// when it moves the VXLAN device into an overlay namespace, with nf there.
func movedUnderlay(t *topology.Topology, nf topology.Netfilter) {
	t.VXLANs[0].UnderlayNetNS = "host0"
	t.VXLANs[0].UnderlayNetfilter = &nf
	t.Underlays[0].NetNS = "host0"
}

// sync-netfilter=trust: netfilter tables on the path, the device's
// namespace's and the underlay's, no longer turn the shortcut off, and the
// notes say what it skips; everything else still does.
func TestSyncTrustNetfilter(t *testing.T) {
	topo := dockerTopo()
	topo.Netfilter = topology.Netfilter{IPTables: []string{"filter", "nat"}, NFTables: []string{"ip6 filter"}}
	movedUnderlay(topo, topology.Netfilter{NFTables: []string{"inet docker"}})
	if sp := syncOn(topo, false); len(sp.Targets) != 0 {
		t.Errorf("targets %q past iptables tables without trust", macs(sp))
	}
	sp := syncOn(topo, true)
	if got := macs(sp); got != "02:00:00:00:02:01>veth1 02:00:00:00:02:02>veth2" {
		t.Errorf("targets %q with trust (notes %q)", got, sp.Notes)
	}
	notes := strings.Join(sp.Notes, "\n")
	for _, want := range []string{"iptables tables filter, nat exist in h2", `nftables tables "inet docker" exist in host0`, "trusted"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes %q do not say %q", sp.Notes, want)
		}
	}
	if strings.Contains(notes, "ip6 filter") {
		t.Errorf("notes %q name an ip6 table, which never sees the overlay's IPv4 frames", sp.Notes)
	}
	// Trust covers rules the operator knows, not what nobody could read.
	topo.Netfilter = topology.Netfilter{Err: "EPERM"}
	if got := macs(syncOn(topo, true)); got != "" {
		t.Errorf("targets %q with trust when netfilter could not be read", got)
	}
	topo.Netfilter = topology.Netfilter{}
	movedUnderlay(topo, topology.Netfilter{Err: "EPERM"})
	if got := macs(syncOn(topo, true)); got != "" {
		t.Errorf("targets %q with trust when the underlay namespace's netfilter could not be read", got)
	}
	topo.VXLANs[0].UnderlayNetfilter = nil
	if got := macs(syncOn(topo, true)); got != "" {
		t.Errorf("targets %q with the underlay in another namespace whose netfilter was not read", got)
	}
	movedUnderlay(topo, topology.Netfilter{})
	topo.Underlays[0].Hooks = &topology.Hooks{Ingress: []string{"tc:u32"}}
	if got := macs(syncOn(topo, true)); got != "" {
		t.Errorf("targets %q past a tc filter on the underlay: trust covers netfilter only", got)
	}
}

// What cannot act on an IPv4 frame, or is lanes' own, does not stop it.
func TestSyncIgnoresHarmless(t *testing.T) {
	topo := dockerTopo()
	topo.Netfilter.NFTables = []string{"ip6 filter", "arp filter"}
	topo.VXLANs[0].Hooks = &topology.Hooks{Egress: []string{"tcx:steer_tc_egres"}}
	topo.Veths[0].Hooks = &topology.Hooks{XDP: "some_prog", Ingress: []string{"tc:bpf:x"}, Egress: []string{"tcx:steer_tc_egres"}}
	topo.Underlays[0].Hooks = &topology.Hooks{XDP: "steer_xdp", Ingress: []string{"tcx:steer_tc_split"}, Egress: []string{"qdisc:mq"}}
	movedUnderlay(topo, topology.Netfilter{NFTables: []string{"ip6 filter"}})
	if got := macs(syncOn(topo, false)); got != "02:00:00:00:02:01>veth1 02:00:00:00:02:02>veth2" {
		t.Errorf("targets %q", got)
	}
}
