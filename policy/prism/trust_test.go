package prism

import (
	"encoding/binary"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/topology"
)

// nft builds the expressions of one nftables rule from a few statements
// (what `nft list ruleset` would print), as the kernel gives them back.
type nft []topology.FilterExpr

func (r nft) saddr(a string) nft {
	b := netip.MustParseAddr(a).As4()
	return append(r, topology.FilterExpr{Name: "payload", DReg: 1, Base: 1, Offset: 12, Len: 4},
		topology.FilterExpr{Name: "cmp", SReg: 1, Data: b[:]})
}

func (r nft) l4(proto byte) nft {
	return append(r, topology.FilterExpr{Name: "meta", DReg: 1, Key: 16},
		topology.FilterExpr{Name: "cmp", SReg: 1, Data: []byte{proto}})
}

func (r nft) dport(p uint16) nft {
	return append(r, topology.FilterExpr{Name: "payload", DReg: 1, Base: 2, Offset: 2, Len: 2},
		topology.FilterExpr{Name: "cmp", SReg: 1, Data: binary.BigEndian.AppendUint16(nil, p)})
}

func (r nft) iifname(n string) nft {
	b := make([]byte, 16)
	copy(b, n)
	return append(r, topology.FilterExpr{Name: "meta", DReg: 1, Key: 6},
		topology.FilterExpr{Name: "cmp", SReg: 1, Data: b[:len(n)+1]})
}

func (r nft) ctInvalid() nft {
	return append(r, topology.FilterExpr{Name: "ct", DReg: 1, Key: 0},
		topology.FilterExpr{Name: "bitwise", SReg: 1, DReg: 1, Len: 4, Data: []byte{1, 0, 0, 0}, Data2: []byte{0, 0, 0, 0}},
		topology.FilterExpr{Name: "cmp", SReg: 1, Op: 1, Data: []byte{0, 0, 0, 0}})
}

func (r nft) verdict(v int32, chain string) nft {
	return append(r, topology.FilterExpr{Name: "counter"}, topology.FilterExpr{Name: "immediate", HasVerdict: true, Verdict: v, Chain: chain})
}

func (r nft) rule(h uint64) topology.FilterRule { return topology.FilterRule{Handle: h, Exprs: r} }

func inputChain(policy string, rules ...topology.FilterRule) topology.FilterChain {
	return topology.FilterChain{Source: "nftables", Family: "inet", Table: "fw", Name: "input", Hook: "input", Policy: policy, Rules: rules}
}

// sync-netfilter=trust is the operator's word about rules lanes cannot
// read the intent of; it does not hold against a rule lanes can see
// acting on the overlay's datagrams before they reach the VXLAN socket
// (the user's host firewall dropping the other host's VXLAN), nor on an
// encrypted overlay (IPsec), nor where the filters could not be read.
func TestSyncTrustRefused(t *testing.T) {
	peer := "198.18.0.1" // the remote VTEP of dockerFacts
	for _, c := range []struct {
		name    string
		filters topology.Filters
		refused string // "" = trusted
	}{
		{"host firewall drops the other host's VXLAN", topology.Filters{Chains: []topology.FilterChain{
			inputChain("accept", nft{}.saddr(peer).l4(17).dport(4789).verdict(topology.NFDrop, "").rule(3)),
		}}, "tests the VXLAN port"},
		{"a rule accepting the VXLAN port (it names the port)", topology.Filters{Chains: []topology.FilterChain{
			inputChain("accept", nft{}.l4(17).dport(4789).verdict(topology.NFAccept, "").rule(3)),
		}}, "tests the VXLAN port"},
		{"everything from the other host dropped", topology.Filters{Chains: []topology.FilterChain{
			inputChain("accept", nft{}.saddr(peer).verdict(topology.NFDrop, "").rule(4)),
		}}, "drops"},
		{"policy drop", topology.Filters{Chains: []topology.FilterChain{inputChain("drop")}}, "policy drop"},
		{"conntrack state (not modelled) then drop", topology.Filters{Chains: []topology.FilterChain{
			inputChain("accept", nft{}.ctInvalid().verdict(topology.NFDrop, "").rule(5)),
		}}, "drops"},
		{"a jump to a chain that drops", topology.Filters{Chains: []topology.FilterChain{
			inputChain("accept", nft{}.verdict(topology.NFTJump, "guard").rule(6)),
			{Source: "nftables", Family: "inet", Table: "fw", Name: "guard", Rules: []topology.FilterRule{nft{}.saddr(peer).verdict(topology.NFDrop, "").rule(7)}},
		}}, "drops"},
		{"encrypted overlay (IPsec)", topology.Filters{XFRM: []string{"policy out 198.18.0.2/32 -> 198.18.0.1/32 proto 17 dport 4789"}}, "IPsec"},
		{"filters unread", topology.Filters{Err: "EPERM"}, "could not be read"},
		// Trusted: rules that cannot match the datagram, or only count.
		{"ssh only", topology.Filters{Chains: []topology.FilterChain{
			inputChain("accept", nft{}.l4(6).dport(22).verdict(topology.NFDrop, "").rule(8)),
		}}, ""},
		{"another interface", topology.Filters{Chains: []topology.FilterChain{
			inputChain("accept", nft{}.iifname("docker0").verdict(topology.NFDrop, "").rule(9)),
		}}, ""},
		{"another source", topology.Filters{Chains: []topology.FilterChain{
			inputChain("accept", nft{}.saddr("198.19.9.9").verdict(topology.NFDrop, "").rule(10)),
		}}, ""},
		{"forward chain (not on the datagram's way)", topology.Filters{Chains: []topology.FilterChain{
			{Source: "nftables", Family: "inet", Table: "fw", Name: "fwd", Hook: "forward", Policy: "drop"},
		}}, ""},
		{"counting only", topology.Filters{Chains: []topology.FilterChain{
			inputChain("accept", nft{}.saddr(peer).verdict(topology.NFTContinue, "").rule(11)),
		}}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			topo := dockerTopo()
			topo.Netfilter.NFTables = []string{"inet fw"}
			facts := dockerFacts(topo)
			facts.Filters["h2"] = c.filters
			sp := Sync(topo, true, facts)
			notes := strings.Join(sp.Notes, "\n")
			if c.refused == "" {
				if len(sp.Targets) != 2 {
					t.Errorf("trust refused: targets %q, notes %q", macs(sp), sp.Notes)
				}
				return
			}
			if len(sp.Targets) != 0 || !strings.Contains(notes, c.refused) {
				t.Errorf("targets %q, notes %q: want the trust refused, saying %q", macs(sp), sp.Notes, c.refused)
			}
			// Without trust the tables alone keep the shortcut off.
			if sp := Sync(topo, false, facts); len(sp.Targets) != 0 {
				t.Errorf("targets %q without trust", macs(sp))
			}
		})
	}
}

// Legacy iptables rules (read through ip_tables' getsockopt) are judged
// like nftables': a DROP of the VXLAN port in INPUT refuses the trust;
// Docker's NAT rules for published TCP ports do not.
func TestSyncTrustLegacyIPTables(t *testing.T) {
	b := iptBlob{}
	// filter: INPUT [drop udp dport 4789 from the peer], FORWARD, OUTPUT
	in := b.entry(iptIP{proto: 17, src: "198.18.0.1"}, iptUDP(4789), iptStd(-0-1)) // DROP
	b.entry(iptIP{}, nil, iptStd(-1-1))                                            // INPUT policy ACCEPT
	fwd := b.entry(iptIP{}, nil, iptStd(-1-1))
	out := b.entry(iptIP{}, nil, iptStd(-1-1))
	b.entry(iptIP{}, nil, iptError("ERROR"))
	chains, err := topology.IPTablesChains("filter", 0b1110, [5]uint32{0, in, fwd, out, 0}, [5]uint32{0, in + b.sizes[0], fwd, out, 0}, b.data)
	if err != nil {
		t.Fatal(err)
	}
	topo := dockerTopo()
	topo.Netfilter.IPTables = []string{"filter"}
	facts := dockerFacts(topo)
	facts.Filters["h2"] = topology.Filters{Chains: chains}
	sp := Sync(topo, true, facts)
	if notes := strings.Join(sp.Notes, "\n"); len(sp.Targets) != 0 || !strings.Contains(notes, "iptables filter INPUT") || !strings.Contains(notes, "tests the VXLAN port") {
		t.Errorf("targets %q, notes %q: want the trust refused by iptables filter INPUT", macs(sp), sp.Notes)
	}

	// nat: PREROUTING -m addrtype --dst-type LOCAL -j DOCKER; DOCKER:
	// -i docker0 -j RETURN, -p tcp --dport 8080 -j DNAT.
	b = iptBlob{}
	pre := b.entry(iptIP{}, iptMatch("addrtype", 1, make([]byte, 8)), iptJump(0)) // patched below
	b.entry(iptIP{}, nil, iptStd(-1-1))                                           // PREROUTING policy
	b.entry(iptIP{}, nil, iptError("DOCKER"))
	docker := b.entry(iptIP{iniface: "docker0"}, nil, iptStd(-4-1)) // RETURN
	b.entry(iptIP{proto: 6}, iptMatch("tcp", 0, make([]byte, 12)), iptTarget("DNAT", make([]byte, 16)))
	b.entry(iptIP{}, nil, iptStd(-4-1)) // DOCKER's implicit RETURN
	b.entry(iptIP{}, nil, iptError("ERROR"))
	b.patchJump(pre, docker)
	chains, err = topology.IPTablesChains("nat", 0b1, [5]uint32{pre}, [5]uint32{pre + b.sizes[0]}, b.data)
	if err != nil {
		t.Fatal(err)
	}
	facts.Filters["h2"] = topology.Filters{Chains: chains}
	topo.Netfilter.IPTables = []string{"nat"}
	if sp := Sync(topo, true, facts); len(sp.Targets) != 2 {
		t.Errorf("trust refused by Docker's NAT rules: targets %q, notes %q", macs(sp), sp.Notes)
	}
}

// Sources are the remote MACs the bridge forwards from the VXLAN port
// whose static VXLAN entry names their VTEP; local addresses the
// underlay's; destinations take the smaller MTU of the two veth ends.
func TestSyncSourcesAndLocals(t *testing.T) {
	topo := dockerTopo()
	topo.Veths[0].MTU = 1400
	sp := syncOn(topo, false)
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
			if sp := Sync(topo, false, facts); len(sp.Targets) != 0 || len(sp.Notes) == 0 {
				t.Errorf("targets %q, notes %q: want none, with a note", macs(sp), sp.Notes)
			}
		})
	}
}

// The agent of an applied prism-sync starts whatever sync settings the
// apply took: a journal with sync-netfilter=trust (and no prio-mode,
// which the mode's name gives) once stopped it with "prio-mode is batch",
// leaving the destinations frozen with no agent watching.
func TestSyncAgentStartsForAppliedSettings(t *testing.T) {
	for _, params := range []map[string]string{
		{"sync-netfilter": "trust"},
		{"sync-netfilter": "trust", "sync-interval": "200ms"},
		{"prio-mode": "sync", "sync-netfilter": "trust"},
	} {
		_, err := plan.NewAgent(SyncAgentName, plan.AgentEnv{NetNS: "lanes-no-such-netns", Mode: "prism-sync", Params: params})
		if err != nil && strings.Contains(err.Error(), "prio-mode") {
			t.Errorf("params %v: %v", params, err)
		}
		o, err := syncAgentOptions(plan.AgentEnv{Mode: "prism-sync", Params: params})
		if err != nil || o.PrioMode != "sync" || o.SyncNetfilter != NetfilterTrust {
			t.Errorf("params %v: options %+v (%v)", params, o, err)
		}
	}
}

// What withdraws the destinations at once, and what only makes the agent
// look again.
func TestSyncWatchClassify(t *testing.T) {
	macs := shortcutMACs{targets: map[string]bool{"02:00:00:00:02:01": true}, sources: map[string]bool{"02:00:00:00:01:01": true}}
	neigh := func(typ uint16, family byte, mac []byte, flags ...byte) syscall.NetlinkMessage {
		d := make([]byte, 12)
		d[0] = family
		if len(flags) > 0 {
			d[10] = flags[0]
		}
		attr := make([]byte, 4+8)
		binary.NativeEndian.PutUint16(attr[0:], 10)
		binary.NativeEndian.PutUint16(attr[2:], unix.NDA_LLADDR)
		copy(attr[4:], mac)
		return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: typ}, Data: append(d, attr...)}
	}
	msg := func(typ uint16) syscall.NetlinkMessage {
		return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: typ}, Data: make([]byte, 16)}
	}
	for _, c := range []struct {
		name     string
		proto    int
		m        syscall.NetlinkMessage
		withdraw bool
	}{
		{"nftables rule added", unix.NETLINK_NETFILTER, msg(0xa06), true},
		{"IPsec policy", unix.NETLINK_XFRM, msg(0x13), true},
		{"route", unix.NETLINK_ROUTE, msg(unix.RTM_NEWROUTE), true},
		{"address gone", unix.NETLINK_ROUTE, msg(unix.RTM_DELADDR), true},
		{"link", unix.NETLINK_ROUTE, msg(unix.RTM_NEWLINK), true},
		{"tc filter", unix.NETLINK_ROUTE, msg(unix.RTM_NEWTFILTER), true},
		{"a destination's forwarding entry deleted", unix.NETLINK_ROUTE, neigh(unix.RTM_DELNEIGH, unix.AF_BRIDGE, []byte{2, 0, 0, 0, 2, 1}), true},
		{"another MAC learned", unix.NETLINK_ROUTE, neigh(unix.RTM_NEWNEIGH, unix.AF_BRIDGE, []byte{2, 0, 0, 0, 9, 9}), false},
		{"a source's VTEP changed", unix.NETLINK_ROUTE, neigh(unix.RTM_NEWNEIGH, unix.AF_BRIDGE, []byte{2, 0, 0, 0, 1, 1}, unix.NTF_SELF), true},
		{"a source's bridge entry aged out", unix.NETLINK_ROUTE, neigh(unix.RTM_DELNEIGH, unix.AF_BRIDGE, []byte{2, 0, 0, 0, 1, 1}, unix.NTF_MASTER), false},
		{"an ARP neighbour", unix.NETLINK_ROUTE, neigh(unix.RTM_NEWNEIGH, unix.AF_INET, []byte{2, 0, 0, 0, 2, 1}), false},
	} {
		if got := classify(c.proto, c.m, macs); got.withdraw != c.withdraw {
			t.Errorf("%s: %+v, want withdraw %v", c.name, got, c.withdraw)
		}
	}
}

// iptBlob builds a legacy iptables entry table as IPT_SO_GET_ENTRIES
// returns it (struct ipt_entry, its matches, its target; native order).
type iptBlob struct {
	data  []byte
	sizes []uint32
}

type iptIP struct {
	proto   uint16
	src     string
	iniface string
}

func (b *iptBlob) entry(ip iptIP, matches []byte, target []byte) uint32 {
	ne := binary.NativeEndian
	e := make([]byte, 112)
	if ip.src != "" {
		a := netip.MustParseAddr(ip.src).As4()
		copy(e[0:], a[:])
		copy(e[8:], []byte{255, 255, 255, 255})
	}
	if ip.iniface != "" {
		copy(e[16:], ip.iniface)
		for i := 0; i <= len(ip.iniface); i++ {
			e[48+i] = 0xff
		}
	}
	ne.PutUint16(e[80:], ip.proto)
	ne.PutUint16(e[88:], uint16(112+len(matches)))
	ne.PutUint16(e[90:], uint16(112+len(matches)+len(target)))
	e = append(e, matches...)
	e = append(e, target...)
	off := uint32(len(b.data))
	b.data = append(b.data, e...)
	b.sizes = append(b.sizes, uint32(len(e)))
	return off
}

// patchJump points the standard target of the entry at off to the entry
// at to.
func (b *iptBlob) patchJump(off, to uint32) {
	ne := binary.NativeEndian
	toff := ne.Uint16(b.data[off+88:])
	ne.PutUint32(b.data[off+uint32(toff)+32:], to)
}

func xtHeader(name string, rev byte, size int) []byte {
	h := make([]byte, 32)
	binary.NativeEndian.PutUint16(h, uint16(size))
	copy(h[2:31], name)
	h[31] = rev
	return h
}

func iptMatch(name string, rev byte, info []byte) []byte {
	return append(xtHeader(name, rev, 32+len(info)), info...)
}

func iptUDP(dport uint16) []byte {
	info := make([]byte, 12) // xt_udp, padded to 8
	ne := binary.NativeEndian
	ne.PutUint16(info[0:], 0)
	ne.PutUint16(info[2:], 0xffff)
	ne.PutUint16(info[4:], dport)
	ne.PutUint16(info[6:], dport)
	return iptMatch("udp", 0, info)
}

// iptStd is a standard target (struct xt_standard_target, XT_ALIGNed).
func iptStd(verdict int32) []byte {
	t := binary.NativeEndian.AppendUint32(xtHeader("", 0, 40), uint32(verdict))
	return append(t, 0, 0, 0, 0)
}

func iptJump(to uint32) []byte { return iptStd(int32(to)) }

func iptError(name string) []byte {
	data := make([]byte, 32)
	copy(data, name)
	return append(xtHeader("ERROR", 0, 64), data...)
}

func iptTarget(name string, info []byte) []byte {
	return append(xtHeader(name, 0, 32+len(info)), info...)
}

// Legacy ebtables: where its table code is in the kernel, its tables
// cannot be listed without creating them, so discovery reports them
// unread; with ebtables tables on the bridge the shortcut is off unless
// trusted, and unread ones keep it off.
func TestSyncLegacyEbtables(t *testing.T) {
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
	topo := dockerTopo()
	facts := dockerFacts(topo)
	facts.Filters["h2"] = topology.Filters{Ebtables: []string{"filter"}}
	if sp := Sync(topo, false, facts); len(sp.Targets) != 0 || !strings.Contains(strings.Join(sp.Notes, " "), "legacy ebtables") {
		t.Errorf("ebtables tables, no trust: targets %q, notes %q", macs(sp), sp.Notes)
	}
	if sp := Sync(topo, true, facts); len(sp.Targets) != 2 {
		t.Errorf("ebtables tables, trust: targets %q, notes %q", macs(sp), sp.Notes)
	}
	facts.Filters["h2"] = topology.Filters{Err: "ebtables: legacy ebtables is loaded, and its tables cannot be listed without creating them"}
	if sp := Sync(topo, true, facts); len(sp.Targets) != 0 {
		t.Errorf("ebtables unread, trust: targets %q", macs(sp))
	}
}
