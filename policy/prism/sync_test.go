package prism

import (
	"net/netip"
	"os"
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
func syncOn(t *topology.Topology) SyncPlan { return Sync(t, dockerFacts(t)) }

func macs(sp SyncPlan) string {
	var out []string
	for _, tg := range sp.Targets {
		out = append(out, tg.MAC.String()+">"+tg.Veth)
	}
	return strings.Join(out, " ")
}

func TestSyncTargets(t *testing.T) {
	sp := syncOn(dockerTopo())
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
	if sp := syncOn(topo); len(sp.GRO) != 1 || sp.GRO[0].HostVeth != "veth2" {
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
		{"underlay namespace nft table", "", `nftables tables "inet docker" exist in host0`, func(t *topology.Topology) {
			movedUnderlay(t, topology.Netfilter{NFTables: []string{"inet docker"}})
		}},
		{"underlay namespace not read", "", "host0 were not read", func(t *topology.Topology) {
			movedUnderlay(t, topology.Netfilter{})
			t.VXLANs[0].UnderlayNetfilter = nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			topo := dockerTopo()
			c.edit(topo)
			sp := syncOn(topo)
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

// What cannot act on an IPv4 frame, or is lanes' own, does not stop it.
func TestSyncIgnoresHarmless(t *testing.T) {
	topo := dockerTopo()
	topo.Netfilter.NFTables = []string{"ip6 filter", "arp filter"}
	topo.VXLANs[0].Hooks = &topology.Hooks{Egress: []string{"tcx:steer_tc_egres"}}
	topo.Veths[0].Hooks = &topology.Hooks{XDP: "some_prog", Ingress: []string{"tc:bpf:x"}, Egress: []string{"tcx:steer_tc_egres"}}
	topo.Underlays[0].Hooks = &topology.Hooks{XDP: "steer_xdp", Ingress: []string{"tcx:steer_tc_split"}, Egress: []string{"qdisc:mq"}}
	movedUnderlay(topo, topology.Netfilter{NFTables: []string{"ip6 filter"}})
	if got := macs(syncOn(topo)); got != "02:00:00:00:02:01>veth1 02:00:00:00:02:02>veth2" {
		t.Errorf("targets %q", got)
	}
}

// Sources are the remote MACs the bridge forwards from the VXLAN port
// whose static VXLAN entry names their VTEP; local addresses the
// underlay's; destinations take the smaller MTU of the two veth ends.
func TestSyncSourcesAndLocals(t *testing.T) {
	topo := dockerTopo()
	topo.Veths[0].MTU = 1400
	sp := syncOn(topo)
	set := sp.Set()
	if len(set.Sources) != 1 || set.Sources[0].MAC.String() != "02:00:00:00:01:01" || set.Sources[0].VTEP.String() != "198.18.0.1" || set.Sources[0].VNI != 42 {
		t.Errorf("sources %v", set.Sources)
	}
	if len(set.Locals) != 1 || set.Locals[0].Ifindex != 7 || set.Locals[0].Addr.String() != "198.18.0.2" || set.Locals[0].MAC.String() != "02:00:00:00:00:07" {
		t.Errorf("locals %v", set.Locals)
	}
	if set.Targets[0].MTU != 1400 {
		t.Errorf("target %v: want the host side's smaller MTU", set.Targets[0])
	}
	for _, c := range []struct {
		name string
		edit func(*topology.Topology, *SyncFacts)
	}{
		{"bridge does not forward the source from the VXLAN port", func(t *topology.Topology, f *SyncFacts) { t.Bridges[0].FDB[0].Port = "veth1" }},
		{"no static VXLAN entry", func(t *topology.Topology, f *SyncFacts) {
			p := f.Paths["vxlan0"]
			p.Sources = nil
			f.Paths["vxlan0"] = p
		}},
		{"strict rp_filter, VTEP routed elsewhere", func(t *topology.Topology, f *SyncFacts) {
			p := f.Paths["vxlan0"]
			p.RPFilter, p.VTEPRoutes = 1, map[netip.Addr]int{netip.MustParseAddr("198.18.0.1"): 99}
			f.Paths["vxlan0"] = p
		}},
		{"local address not on the underlay", func(t *topology.Topology, f *SyncFacts) {
			t.VXLANs[0].Local = netip.MustParseAddr("198.18.9.9")
		}},
		{"path unread", func(t *topology.Topology, f *SyncFacts) {
			f.Paths["vxlan0"] = topology.SyncPath{Err: "EPERM"}
		}},
		{"VXLAN device down", func(t *topology.Topology, f *SyncFacts) { t.VXLANs[0].Up = false }},
	} {
		t.Run(c.name, func(t *testing.T) {
			topo := dockerTopo()
			facts := dockerFacts(topo)
			c.edit(topo, &facts)
			if sp := Sync(topo, facts); len(sp.Targets) != 0 || len(sp.Notes) == 0 {
				t.Errorf("targets %q, notes %q: want none, with a note", macs(sp), sp.Notes)
			}
		})
	}
}

// The packet filters besides netfilter's tables, in the host's namespace
// or the underlay's: legacy ebtables tables (where its table code is in
// the kernel, its tables cannot be listed without creating them, so
// discovery reports them unread), IPsec (an encrypted overlay, whose
// plaintext datagrams the kernel drops), and filters that could not be
// read each keep the shortcut off.
func TestSyncPacketFilters(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		syms string
		err  bool
	}{
		{"ffffffffa0000000 T ipt_do_table\nffffffffa0001000 t br_handle_frame\n", false},
		{"ffffffffa0000000 T ebt_do_table\t[ebtables]\n", true},
	} {
		p := dir + "/kallsyms"
		if err := os.WriteFile(p, []byte(c.syms), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := topology.LegacyEbtables(p); (err != nil) != c.err {
			t.Errorf("kallsyms %q: error %v, want one: %v", c.syms, err, c.err)
		}
	}
	for _, c := range []struct {
		name, note string
		filters    topology.Filters
	}{
		{"legacy ebtables", "legacy ebtables tables filter", topology.Filters{Ebtables: []string{"filter"}}},
		{"ebtables unread", "could not be read", topology.Filters{Err: "ebtables: legacy ebtables is loaded, and its tables cannot be listed without creating them"}},
		{"IPsec", "IPsec", topology.Filters{XFRM: []string{"policy in 198.18.0.1/32 -> 198.18.0.2/32 proto 17 dport 4789"}}},
	} {
		for _, moved := range []bool{false, true} {
			topo := dockerTopo()
			if moved {
				movedUnderlay(topo, topology.Netfilter{})
			}
			facts := dockerFacts(topo)
			facts.Filters[topo.VXLANs[0].UnderlayNetNS] = c.filters
			sp := Sync(topo, facts)
			if notes := strings.Join(sp.Notes, "\n"); len(sp.Targets) != 0 || !strings.Contains(notes, c.note) {
				t.Errorf("%s in %s: targets %q, notes %q: want none, saying %q", c.name, topo.VXLANs[0].UnderlayNetNS, macs(sp), sp.Notes, c.note)
			}
		}
	}
}
