package topology

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nlraw"
)

// What lies on a frame's path through a namespace besides the devices
// themselves: bridge forwarding state, tc and XDP programs, netfilter. A
// policy that lets frames skip part of the path (PRISM-sync: decapsulate in
// XDP and hand the frame straight to the container's veth) reads this to
// know what it would skip. Everything here is read inside the scanned
// namespace (scanNetNS), and what cannot be read is reported as such, so
// the reader can treat it as "something is there".

// pathScan is the path-related part of a namespace scan.
type pathScan struct {
	hooks     map[int]*Hooks
	gro       map[string]bool
	udpGRO    map[string]udpGRO
	txq       map[string]int
	maxq      map[string][2]int // ethtool -l maxima: rx, tx
	xps       map[string]bool
	xdpTarget map[int]bool
	brports   map[string]BridgePort
	bridges   map[string]bridgeFacts
	fdb       map[int][]FDBEntry // bridge ifindex -> its entries
	netfilter Netfilter
}

type bridgeFacts struct {
	vlanFiltering, nfCall, stp bool
}

// udpGROFeatures are the device features that let GRO merge inner UDP
// datagrams.
var udpGROFeatures = []string{"rx-gro-list", "rx-udp-gro-forwarding"}

type udpGRO struct {
	on     []string
	unread string
}

// readUDPGRO reads which of udpGROFeatures dev has on.
func readUDPGRO(dev string) udpGRO {
	got, err := ethtool.GetNamed("", dev, udpGROFeatures...)
	if err != nil {
		return udpGRO{unread: err.Error()}
	}
	var g udpGRO
	for _, f := range udpGROFeatures {
		if got[f] {
			g.on = append(g.on, f)
		}
	}
	return g
}

// readPath fills s.path; it runs in the namespace, sys showing its sysfs.
// Where not full (DiscoverPath) it leaves out what only placement reads:
// UDP GRO features, XPS, channel maxima, XDP redirect targets.
func (s *nsScan) readPath(sys string, full bool) {
	p := pathScan{
		hooks: map[int]*Hooks{}, gro: map[string]bool{}, udpGRO: map[string]udpGRO{}, txq: map[string]int{}, maxq: map[string][2]int{}, xps: map[string]bool{}, xdpTarget: map[int]bool{},
		brports: map[string]BridgePort{}, bridges: map[string]bridgeFacts{}, fdb: map[int][]FDBEntry{},
	}
	nsCall := readBool("/proc/sys/net/bridge/bridge-nf-call-iptables")
	roots := rootQdiscs()
	for _, l := range s.links {
		a := l.Attrs()
		p.hooks[a.Index] = readHooks(l, roots)
		if on, err := ethtool.Get("", a.Name, ethtool.GRO); err == nil {
			p.gro[a.Name] = on
		}
		p.txq[a.Name] = countQueues(sys, a.Name, "tx-")
		if full {
			p.udpGRO[a.Name] = readUDPGRO(a.Name)
			p.xps[a.Name] = hasXPS(sys, a.Name)
			if c, err := ethtool.GetChannels("", a.Name); err == nil {
				p.maxq[a.Name] = [2]int{int(c.MaxRX), int(c.MaxTX)}
			}
		}
		if a.MasterIndex != 0 {
			if bp, ok := readBridgePort(sys, a.Name); ok {
				p.brports[a.Name] = bp
			}
		}
		if l.Type() == "bridge" {
			dir := sys + "/class/net/" + a.Name + "/bridge/"
			p.bridges[a.Name] = bridgeFacts{
				vlanFiltering: readBool(dir + "vlan_filtering"),
				nfCall:        nsCall || readBool(dir+"nf_call_iptables"),
				stp:           readNonZero(dir + "stp_state"),
			}
			p.fdb[a.Index] = s.readFDB(a.Index)
		}
	}
	if full {
		p.xdpTarget = xdpTargets()
	}
	p.netfilter = readNetfilter()
	s.path = p
}

// readNonZero reports whether a number file holds something other than 0.
func readNonZero(path string) bool {
	b, err := os.ReadFile(path)
	v := strings.TrimSpace(string(b))
	return err == nil && v != "" && v != "0"
}

func readBool(path string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

// hasXPS reports whether any transmit queue of dev has an XPS map (by CPU
// or by receive queue): the kernel then picks transmit queues by it.
func hasXPS(sys, dev string) bool {
	qs, _ := filepath.Glob(sys + "/class/net/" + dev + "/queues/tx-*")
	for _, q := range qs {
		for _, f := range []string{"xps_cpus", "xps_rxqs"} {
			b, err := os.ReadFile(filepath.Join(q, f))
			if err != nil {
				continue
			}
			if strings.Trim(strings.TrimSpace(string(b)), "0,") != "" {
				return true
			}
		}
	}
	return false
}

func countQueues(sys, dev, prefix string) int {
	ents, err := os.ReadDir(sys + "/class/net/" + dev + "/queues")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			n++
		}
	}
	return n
}

var stpStates = []string{"disabled", "listening", "learning", "forwarding", "blocking"}

func readBridgePort(sys, dev string) (BridgePort, bool) {
	dir := sys + "/class/net/" + dev + "/brport/"
	b, err := os.ReadFile(dir + "state")
	if err != nil {
		return BridgePort{}, false
	}
	bp := BridgePort{Name: dev, State: "unknown"}
	var st int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &st); err == nil && st >= 0 && st < len(stpStates) {
		bp.State = stpStates[st]
	}
	bp.Isolated = readBool(dir + "isolated")
	bp.Locked = readBool(dir + "locked")
	return bp, true
}

// readFDB lists the bridge's own (master) unicast entries.
func (s *nsScan) readFDB(bridge int) []FDBEntry {
	neighs, err := netlink.NeighList(0, unix.AF_BRIDGE)
	if err != nil {
		return nil
	}
	var out []FDBEntry
	for _, n := range neighs {
		if n.MasterIndex != bridge || len(n.HardwareAddr) != 6 || n.HardwareAddr[0]&1 != 0 {
			continue
		}
		port := s.byIndex[n.LinkIndex]
		if port == nil || n.LinkIndex == bridge {
			continue
		}
		out = append(out, FDBEntry{
			MAC:  n.HardwareAddr.String(),
			Port: port.Attrs().Name,
			VLAN: n.Vlan,
			// NUD_PERMANENT is how the bridge reports local entries (its
			// own and its ports' addresses, and `bridge fdb add ...
			// permanent`); NUD_NOARP is a static forwarding entry.
			Local:  n.State&unix.NUD_PERMANENT != 0,
			Static: n.State&unix.NUD_NOARP != 0,
		})
	}
	return out
}

// rootQdiscs maps ifindex to the kind of its root qdisc.
func rootQdiscs() map[int]string {
	qs, err := netlink.QdiscList(nil)
	if err != nil {
		return nil
	}
	out := map[int]string{}
	for _, q := range qs {
		if a := q.Attrs(); a.Parent == netlink.HANDLE_ROOT {
			out[a.LinkIndex] = q.Type()
		}
	}
	return out
}

// readHooks lists what acts on l's packets: its XDP program, tc filters
// under clsact/ingress, tcx programs, and a root qdisc other than the
// defaults a device comes up with (noqueue on virtual devices; the
// kernel's default qdiscs on real ones only schedule, they do not filter).
func readHooks(l netlink.Link, roots map[int]string) *Hooks {
	a := l.Attrs()
	h := &Hooks{}
	var errs []string
	if a.Xdp != nil && a.Xdp.Attached {
		h.XDP = progName(a.Xdp.ProgId)
	}
	if roots == nil {
		errs = append(errs, "qdiscs unread")
	} else if k, ok := roots[a.Index]; ok && !slices.Contains([]string{"noqueue", "mq", "pfifo_fast", "fq_codel", "fq"}, k) {
		h.Egress = append(h.Egress, "qdisc:"+k)
	}
	for _, dir := range []struct {
		parent uint32
		at     ebpf.AttachType
		out    *[]string
	}{
		{netlink.HANDLE_MIN_INGRESS, ebpf.AttachTCXIngress, &h.Ingress},
		{netlink.HANDLE_MIN_EGRESS, ebpf.AttachTCXEgress, &h.Egress},
	} {
		fs, err := netlink.FilterList(l, dir.parent)
		switch {
		case err == nil:
			for _, f := range fs {
				*dir.out = append(*dir.out, "tc:"+filterName(f))
			}
		case !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT):
			// EINVAL/ENOENT: no clsact or ingress qdisc, so no filters.
			errs = append(errs, "tc filters: "+err.Error())
		}
		q, err := link.QueryPrograms(link.QueryOptions{Target: a.Index, Attach: dir.at})
		switch {
		case err == nil:
			for _, p := range q.Programs {
				*dir.out = append(*dir.out, "tcx:"+progName(uint32(p.ID)))
			}
		case !errors.Is(err, ebpf.ErrNotSupported):
			errs = append(errs, "tcx: "+err.Error())
		}
	}
	if len(errs) > 0 {
		h.Err = strings.Join(errs, "; ")
	}
	if h.XDP == "" && len(h.Ingress) == 0 && len(h.Egress) == 0 && h.Err == "" {
		return nil
	}
	return h
}

func filterName(f netlink.Filter) string {
	if b, ok := f.(*netlink.BpfFilter); ok && b.Name != "" {
		return "bpf:" + b.Name
	}
	return f.Type()
}

// progName is a loaded program's name, or its id if it cannot be read.
func progName(id uint32) string {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return fmt.Sprintf("id%d", id)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil || info.Name == "" {
		return fmt.Sprintf("id%d", id)
	}
	return info.Name
}

// From include/uapi/linux/netdev.h.
const (
	netdevCmdDevGet         = 1
	netdevAttrIfindex       = 1
	netdevAttrXDPFeatures   = 3
	netdevXDPActNDOXmit     = 4
	nfnlSubsysNFTables      = 10
	nftMsgGetTable          = 1
	nftaTableName           = 1
	nfnetlinkV0             = 0
	iptablesNamesInThisNetN = "/proc/thread-self/net/ip_tables_names"
)

// xdpTargets reads which devices accept XDP-redirected frames (ndo_xdp_xmit)
// from the netdev family; nil when the kernel has no such query (< 6.3).
func xdpTargets() map[int]bool {
	fam, err := netlink.GenlFamilyGet("netdev")
	if err != nil {
		return nil
	}
	msgs, err := nlraw.Dump(unix.NETLINK_GENERIC, fam.ID, [4]byte{netdevCmdDevGet, 1})
	if err != nil {
		return nil
	}
	out := map[int]bool{}
	for _, m := range msgs {
		attrs, err := nl.ParseRouteAttr(m[4:])
		if err != nil {
			continue
		}
		var idx int
		var feat uint64
		for _, a := range attrs {
			switch {
			case a.Attr.Type == netdevAttrIfindex && len(a.Value) >= 4:
				idx = int(nlraw.Native.Uint32(a.Value))
			case a.Attr.Type == netdevAttrXDPFeatures && len(a.Value) >= 8:
				feat = nlraw.Native.Uint64(a.Value)
			}
		}
		out[idx] = feat&netdevXDPActNDOXmit != 0
	}
	return out
}

// nfFamily names an nftables family as nft(8) does.
func nfFamily(f byte) string {
	switch f {
	case unix.NFPROTO_INET:
		return "inet"
	case unix.NFPROTO_IPV4:
		return "ip"
	case unix.NFPROTO_ARP:
		return "arp"
	case unix.NFPROTO_NETDEV:
		return "netdev"
	case unix.NFPROTO_BRIDGE:
		return "bridge"
	case unix.NFPROTO_IPV6:
		return "ip6"
	}
	return fmt.Sprintf("family%d", f)
}

// readNetfilter lists the namespace's legacy iptables and nftables tables.
// /proc/thread-self, not /proc/self: the scan's thread, not the process's
// main thread, is in the namespace.
func readNetfilter() Netfilter {
	var n Netfilter
	var errs []string
	switch b, err := os.ReadFile(iptablesNamesInThisNetN); {
	case err == nil:
		n.IPTables = strings.Fields(string(b))
	case !errors.Is(err, os.ErrNotExist): // no legacy iptables in this kernel
		errs = append(errs, "iptables: "+err.Error())
	}
	msgs, err := nlraw.Dump(unix.NETLINK_NETFILTER, nfnlSubsysNFTables<<8|nftMsgGetTable, [4]byte{unix.NFPROTO_UNSPEC, nfnetlinkV0})
	switch {
	case err == nil:
		for _, m := range msgs {
			attrs, err := nl.ParseRouteAttr(m[4:])
			if err != nil {
				continue
			}
			for _, a := range attrs {
				if a.Attr.Type == nftaTableName {
					n.NFTables = append(n.NFTables, nfFamily(m[0])+" "+strings.TrimRight(string(a.Value), "\x00"))
				}
			}
		}
	case errors.Is(err, unix.EPROTONOSUPPORT):
		// No nftables in this kernel: nothing to find.
	default:
		errs = append(errs, "nftables: "+err.Error())
	}
	if len(errs) > 0 {
		n.Err = strings.Join(errs, "; ")
	}
	return n
}

// PRISM-sync decapsulates high-priority frames in XDP and hands them to a
// container's veth, skipping the kernel's receive path from ip_rcv to the
// bridge. What follows reads, beyond the snapshot, what it must check on
// that path: the packet filters rule by rule (so a policy can tell which
// rules may act on the overlay's datagrams), IPsec policies, legacy
// ebtables, and the VXLAN device's static forwarding entries and the
// underlay's local addresses (what the kernel accepts a datagram from and
// to).

// Filters are the packet filters of one namespace.
type Filters struct {
	// Chains are the nftables chains and the legacy iptables chains
	// (translated into the same expressions), each with its rules.
	Chains []FilterChain `json:"chains,omitempty"`
	// XFRM lists the IPsec policies and states ("policy in src ... dst
	// ... proto 17 dport 4789"): an encrypted overlay's.
	XFRM []string `json:"xfrm,omitempty"`
	// Ebtables are the legacy ebtables tables with rules or a policy
	// other than ACCEPT.
	Ebtables []string `json:"ebtables,omitempty"`
	// Err is what could not be read; a reader must assume rules then.
	Err string `json:"err,omitempty"`
}

// FilterChain is one chain of rules.
type FilterChain struct {
	Source string `json:"source"` // "nftables" or "iptables"
	Family string `json:"family"` // ip, inet, netdev, bridge, arp, ip6
	Table  string `json:"table"`
	Name   string `json:"name"`
	// Hook is where a base chain sees packets (prerouting, input,
	// forward, output, postrouting, ingress, egress); "" for a chain
	// reached only by jumps.
	Hook    string   `json:"hook,omitempty"`
	Devices []string `json:"devices,omitempty"` // a netdev base chain's devices
	// Policy is a base chain's verdict for what no rule decides: accept
	// or drop.
	Policy string       `json:"policy,omitempty"`
	Rules  []FilterRule `json:"rules,omitempty"`
}

// FilterRule is one rule: its expressions in order, as the kernel runs
// them.
type FilterRule struct {
	Handle uint64       `json:"handle,omitempty"`
	Exprs  []FilterExpr `json:"exprs"`
}

// FilterExpr is one nftables expression (the kernel's name: meta,
// payload, cmp, bitwise, range, immediate, lookup, match, target, ...)
// with the attributes a reader needs; legacy iptables rules are given as
// the expressions iptables-nft would use for them. Registers are the
// kernel's numbers (NFT_REG_1..4 = 1..4, NFT_REG32_00..15 = 8..23).
type FilterExpr struct {
	Name   string `json:"name"`
	DReg   uint32 `json:"dreg,omitempty"`
	SReg   uint32 `json:"sreg,omitempty"`
	Key    uint32 `json:"key,omitempty"`    // meta, ct: the key
	Base   uint32 `json:"base,omitempty"`   // payload: NFT_PAYLOAD_*_HEADER
	Offset uint32 `json:"offset,omitempty"` // payload
	Len    uint32 `json:"len,omitempty"`    // payload, bitwise
	Op     uint32 `json:"op,omitempty"`     // cmp, range: NFT_CMP_*, NFT_RANGE_*; bitwise: NFT_BITWISE_*
	// Data is cmp's value, range's lower bound, bitwise's mask; Data2
	// range's upper bound, bitwise's xor.
	Data  []byte `json:"data,omitempty"`
	Data2 []byte `json:"data2,omitempty"`
	// Immediate verdicts: Verdict is NF_DROP (0), NF_ACCEPT (1), NF_QUEUE
	// (3), NFT_CONTINUE (-1), NFT_BREAK (-2), NFT_JUMP (-3), NFT_GOTO
	// (-4), NFT_RETURN (-5); Chain the chain a jump or goto names.
	HasVerdict bool   `json:"has_verdict,omitempty"`
	Verdict    int32  `json:"verdict,omitempty"`
	Chain      string `json:"chain,omitempty"`
	// Flags: lookup's NFT_LOOKUP_F_INV.
	Flags uint32 `json:"flags,omitempty"`
	// XName, XRev and Info are an xtables match's or target's (match,
	// target).
	XName string `json:"xname,omitempty"`
	XRev  uint32 `json:"xrev,omitempty"`
	Info  []byte `json:"info,omitempty"`
}

// Verdict codes (linux/netfilter.h, linux/netfilter/nf_tables.h).
const (
	NFDrop      = 0
	NFAccept    = 1
	NFQueue     = 3
	NFTContinue = -1
	NFTBreak    = -2
	NFTJump     = -3
	NFTGoto     = -4
	NFTReturn   = -5
)

// ReadFilters reads the packet filters of namespace ns.
func ReadFilters(ns string) Filters {
	var f Filters
	err := netnsx.Do(ns, func() error {
		f = readFilters()
		return nil
	})
	if err != nil {
		f.Err = err.Error()
	}
	return f
}

func readFilters() Filters {
	var f Filters
	var errs []string
	if cs, err := readNFTChains(); err != nil {
		if !errors.Is(err, unix.EPROTONOSUPPORT) {
			errs = append(errs, "nftables: "+err.Error())
		}
	} else {
		f.Chains = append(f.Chains, cs...)
	}
	if b, err := os.ReadFile(iptablesNamesInThisNetN); err == nil {
		for _, table := range strings.Fields(string(b)) {
			cs, err := readIPTables(table)
			if err != nil {
				errs = append(errs, fmt.Sprintf("iptables %s: %v", table, err))
				continue
			}
			f.Chains = append(f.Chains, cs...)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, "iptables: "+err.Error())
	}
	if x, err := readXFRM(); err != nil {
		errs = append(errs, "xfrm: "+err.Error())
	} else {
		f.XFRM = x
	}
	if e, err := legacyEbtables(); err != nil {
		errs = append(errs, "ebtables: "+err.Error())
	} else {
		f.Ebtables = e
	}
	if len(errs) > 0 {
		f.Err = strings.Join(errs, "; ")
	}
	return f
}

// From include/uapi/linux/netfilter/nf_tables.h.
const (
	nftMsgGetChain = 4
	nftMsgGetRule  = 7

	nftaChainTable  = 1
	nftaChainName   = 3
	nftaChainHook   = 4
	nftaChainPolicy = 5
	nftaHookHooknum = 1
	nftaHookDev     = 3
	nftaHookDevs    = 4

	nftaRuleTable  = 1
	nftaRuleChain  = 2
	nftaRuleHandle = 3
	nftaRuleExprs  = 4
	nftaListElem   = 1
	nftaExprName   = 1
	nftaExprData   = 2
	nftaDataValue  = 1
	nftaDataVerd   = 2
	nftaVerdCode   = 1
	nftaVerdChain  = 2
)

var nfHooks = map[string][]string{
	"ip":     {"prerouting", "input", "forward", "output", "postrouting", "ingress"},
	"ip6":    {"prerouting", "input", "forward", "output", "postrouting", "ingress"},
	"inet":   {"prerouting", "input", "forward", "output", "postrouting", "ingress"},
	"bridge": {"prerouting", "input", "forward", "output", "postrouting"},
	"netdev": {"ingress", "egress"},
	"arp":    {"input", "output", "forward"},
}

func hookName(family string, n uint32) string {
	if hs := nfHooks[family]; int(n) < len(hs) {
		return hs[n]
	}
	return fmt.Sprintf("hook%d", n)
}

// readNFTChains reads every nftables chain and rule of this namespace.
func readNFTChains() ([]FilterChain, error) {
	msgs, err := nlraw.Dump(unix.NETLINK_NETFILTER, nfnlSubsysNFTables<<8|nftMsgGetChain, [4]byte{unix.NFPROTO_UNSPEC, nfnetlinkV0})
	if err != nil {
		return nil, err
	}
	type key struct{ fam, table, name string }
	var order []key
	chains := map[key]*FilterChain{}
	for _, m := range msgs {
		attrs, err := nl.ParseRouteAttr(m[4:])
		if err != nil {
			return nil, fmt.Errorf("parsing a chain: %w", err)
		}
		c := FilterChain{Source: "nftables", Family: nfFamily(m[0])}
		for _, a := range attrs {
			switch a.Attr.Type {
			case nftaChainTable:
				c.Table = cstr(a.Value)
			case nftaChainName:
				c.Name = cstr(a.Value)
			case nftaChainPolicy:
				if len(a.Value) >= 4 {
					if binary.BigEndian.Uint32(a.Value) == NFAccept {
						c.Policy = "accept"
					} else {
						c.Policy = "drop"
					}
				}
			case nftaChainHook | unix.NLA_F_NESTED, nftaChainHook:
				hs, err := nl.ParseRouteAttr(a.Value)
				if err != nil {
					return nil, fmt.Errorf("parsing chain %s's hook: %w", c.Name, err)
				}
				for _, h := range hs {
					switch h.Attr.Type &^ unix.NLA_F_NESTED {
					case nftaHookHooknum:
						c.Hook = hookName(c.Family, binary.BigEndian.Uint32(h.Value))
					case nftaHookDev:
						c.Devices = append(c.Devices, cstr(h.Value))
					case nftaHookDevs:
						ds, _ := nl.ParseRouteAttr(h.Value)
						for _, d := range ds {
							c.Devices = append(c.Devices, cstr(d.Value))
						}
					}
				}
			}
		}
		if c.Hook != "" && c.Policy == "" {
			c.Policy = "accept"
		}
		k := key{c.Family, c.Table, c.Name}
		chains[k] = &c
		order = append(order, k)
	}
	msgs, err = nlraw.Dump(unix.NETLINK_NETFILTER, nfnlSubsysNFTables<<8|nftMsgGetRule, [4]byte{unix.NFPROTO_UNSPEC, nfnetlinkV0})
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		attrs, err := nl.ParseRouteAttr(m[4:])
		if err != nil {
			return nil, fmt.Errorf("parsing a rule: %w", err)
		}
		k := key{fam: nfFamily(m[0])}
		var r FilterRule
		for _, a := range attrs {
			switch a.Attr.Type &^ unix.NLA_F_NESTED {
			case nftaRuleTable:
				k.table = cstr(a.Value)
			case nftaRuleChain:
				k.name = cstr(a.Value)
			case nftaRuleHandle:
				if len(a.Value) >= 8 {
					r.Handle = binary.BigEndian.Uint64(a.Value)
				}
			case nftaRuleExprs:
				if r.Exprs, err = parseNFTExprs(a.Value); err != nil {
					return nil, fmt.Errorf("parsing a rule's expressions: %w", err)
				}
			}
		}
		c := chains[k]
		if c == nil {
			return nil, fmt.Errorf("rule %d of an unlisted chain %s %s %s", r.Handle, k.fam, k.table, k.name)
		}
		c.Rules = append(c.Rules, r)
	}
	out := make([]FilterChain, 0, len(order))
	for _, k := range order {
		out = append(out, *chains[k])
	}
	return out, nil
}

func cstr(b []byte) string { return strings.TrimRight(string(b), "\x00") }

// nftData reads a nested NFTA_DATA_*: the value's bytes, or a verdict.
func nftData(b []byte, e *FilterExpr) ([]byte, error) {
	as, err := nl.ParseRouteAttr(b)
	if err != nil {
		return nil, err
	}
	for _, a := range as {
		switch a.Attr.Type &^ unix.NLA_F_NESTED {
		case nftaDataValue:
			return append([]byte(nil), a.Value...), nil
		case nftaDataVerd:
			vs, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return nil, err
			}
			e.HasVerdict = true
			for _, v := range vs {
				switch v.Attr.Type {
				case nftaVerdCode:
					if len(v.Value) >= 4 {
						e.Verdict = int32(binary.BigEndian.Uint32(v.Value))
					}
				case nftaVerdChain:
					e.Chain = cstr(v.Value)
				}
			}
			return nil, nil
		}
	}
	return nil, nil
}

// parseNFTExprs reads a rule's NFTA_RULE_EXPRESSIONS.
func parseNFTExprs(b []byte) ([]FilterExpr, error) {
	elems, err := nl.ParseRouteAttr(b)
	if err != nil {
		return nil, err
	}
	var out []FilterExpr
	for _, el := range elems {
		if el.Attr.Type&^unix.NLA_F_NESTED != nftaListElem {
			continue
		}
		parts, err := nl.ParseRouteAttr(el.Value)
		if err != nil {
			return nil, err
		}
		var e FilterExpr
		var data []byte
		for _, p := range parts {
			switch p.Attr.Type &^ unix.NLA_F_NESTED {
			case nftaExprName:
				e.Name = cstr(p.Value)
			case nftaExprData:
				data = p.Value
			}
		}
		if data != nil {
			if err := parseNFTExpr(&e, data); err != nil {
				return nil, fmt.Errorf("expression %s: %w", e.Name, err)
			}
		}
		out = append(out, e)
	}
	return out, nil
}

func be32at(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

// parseNFTExpr reads the attributes of the expressions a policy reasons
// about; the others keep their name only.
func parseNFTExpr(e *FilterExpr, b []byte) error {
	as, err := nl.ParseRouteAttr(b)
	if err != nil {
		return err
	}
	for _, a := range as {
		t, v := a.Attr.Type&^unix.NLA_F_NESTED, a.Value
		switch e.Name {
		case "meta": // DREG 1, KEY 2, SREG 3
			switch t {
			case 1:
				e.DReg = be32at(v)
			case 2:
				e.Key = be32at(v)
			case 3:
				e.SReg = be32at(v)
			}
		case "payload": // DREG 1, BASE 2, OFFSET 3, LEN 4, SREG 5
			switch t {
			case 1:
				e.DReg = be32at(v)
			case 2:
				e.Base = be32at(v)
			case 3:
				e.Offset = be32at(v)
			case 4:
				e.Len = be32at(v)
			case 5:
				e.SReg = be32at(v)
			}
		case "cmp": // SREG 1, OP 2, DATA 3
			switch t {
			case 1:
				e.SReg = be32at(v)
			case 2:
				e.Op = be32at(v)
			case 3:
				if e.Data, err = nftData(v, e); err != nil {
					return err
				}
			}
		case "bitwise": // SREG 1, DREG 2, LEN 3, MASK 4, XOR 5, OP 6, DATA 7
			switch t {
			case 1:
				e.SReg = be32at(v)
			case 2:
				e.DReg = be32at(v)
			case 3:
				e.Len = be32at(v)
			case 4:
				if e.Data, err = nftData(v, e); err != nil {
					return err
				}
			case 5:
				if e.Data2, err = nftData(v, e); err != nil {
					return err
				}
			case 6:
				e.Op = be32at(v)
			}
		case "range": // SREG 1, OP 2, FROM 3, TO 4
			switch t {
			case 1:
				e.SReg = be32at(v)
			case 2:
				e.Op = be32at(v)
			case 3:
				if e.Data, err = nftData(v, e); err != nil {
					return err
				}
			case 4:
				if e.Data2, err = nftData(v, e); err != nil {
					return err
				}
			}
		case "immediate": // DREG 1, DATA 2
			switch t {
			case 1:
				e.DReg = be32at(v)
			case 2:
				if e.Data, err = nftData(v, e); err != nil {
					return err
				}
			}
		case "lookup": // SET 1, SREG 2, DREG 3, SET_ID 4, FLAGS 5
			switch t {
			case 2:
				e.SReg = be32at(v)
			case 3:
				e.DReg = be32at(v)
			case 5:
				e.Flags = be32at(v)
			}
		case "ct": // DREG 1, KEY 2, DIRECTION 3, SREG 4
			switch t {
			case 1:
				e.DReg = be32at(v)
			case 2:
				e.Key = be32at(v)
			case 4:
				e.SReg = be32at(v)
			}
		case "match", "target": // NAME 1, REV 2, INFO 3
			switch t {
			case 1:
				e.XName = cstr(v)
			case 2:
				e.XRev = be32at(v)
			case 3:
				e.Info = append([]byte(nil), v...)
			}
		default:
			// Any other expression that loads a register: its DREG is
			// attribute 1 in most (numgen, hash, fib, rt, socket,
			// osf, exthdr, xfrm, tunnel, jhash...). Not relied on: a
			// policy treats the register as unknown either way.
		}
	}
	return nil
}

// Legacy iptables (ip_tables' getsockopt interface, linux/netfilter_ipv4/
// ip_tables.h): the tables /proc/net/ip_tables_names lists exist already,
// so reading them creates nothing.
const (
	iptSoGetInfo    = 64
	iptSoGetEntries = 65
	iptInfoLen      = 84  // struct ipt_getinfo
	iptEntriesHdr   = 40  // struct ipt_get_entries, up to its entry table
	iptEntryLen     = 112 // struct ipt_entry, up to its matches
)

// readIPTables reads one legacy iptables table as chains.
func readIPTables(table string) ([]FilterChain, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	info := make([]byte, iptInfoLen)
	copy(info, table)
	if err := getsockopt(fd, unix.SOL_IP, iptSoGetInfo, info); err != nil {
		return nil, fmt.Errorf("table info: %w", err)
	}
	ne := nlraw.Native
	valid := ne.Uint32(info[32:])
	var hooks, under [5]uint32
	for i := range 5 {
		hooks[i] = ne.Uint32(info[36+4*i:])
		under[i] = ne.Uint32(info[56+4*i:])
	}
	size := ne.Uint32(info[80:])
	buf := make([]byte, iptEntriesHdr+int(size))
	copy(buf, table)
	ne.PutUint32(buf[32:], size)
	if err := getsockopt(fd, unix.SOL_IP, iptSoGetEntries, buf); err != nil {
		return nil, fmt.Errorf("table entries: %w", err)
	}
	return IPTablesChains(table, valid, hooks, under, buf[iptEntriesHdr:])
}

func getsockopt(fd, level, opt int, buf []byte) error {
	l := uint32(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

var iptHooks = []string{"prerouting", "input", "forward", "output", "postrouting"}

type iptEntry struct {
	off    uint32
	exprs  []FilterExpr // the ip part and the matches
	target string       // "" standard, "ERROR", or a target's name
	verd   int32        // standard target's verdict
	tinfo  []byte
	goTo   bool
}

// IPTablesChains turns a legacy iptables table (its valid hooks, hook
// entry and underflow offsets, and entry table, as IPT_SO_GET_INFO and
// IPT_SO_GET_ENTRIES give them) into chains of nftables expressions.
func IPTablesChains(table string, valid uint32, hooks, under [5]uint32, b []byte) ([]FilterChain, error) {
	ne := nlraw.Native
	var es []iptEntry
	byOff := map[uint32]int{}
	for off := 0; off < len(b); {
		if off+iptEntryLen > len(b) {
			return nil, fmt.Errorf("entry at %d runs past the table", off)
		}
		e := b[off:]
		toff, next := int(ne.Uint16(e[88:])), int(ne.Uint16(e[90:]))
		if toff < iptEntryLen || next < toff+32 || off+next > len(b) {
			return nil, fmt.Errorf("entry at %d has bad offsets (%d, %d)", off, toff, next)
		}
		ent := iptEntry{off: uint32(off), exprs: iptIPExprs(e[:84])}
		for m := iptEntryLen; m < toff; {
			msize := int(ne.Uint16(e[m:]))
			if msize < 32 || m+msize > toff {
				return nil, fmt.Errorf("entry at %d: a match runs past its entry", off)
			}
			ent.exprs = append(ent.exprs, FilterExpr{Name: "match", XName: cstr(e[m+2 : m+31]), XRev: uint32(e[m+31]), Info: append([]byte(nil), e[m+32:m+msize]...)})
			m += msize
		}
		t := e[toff:next]
		ent.target = cstr(t[2:31])
		ent.tinfo = append([]byte(nil), t[32:]...)
		if ent.target == "" && len(t) >= 36 {
			ent.verd = int32(ne.Uint32(t[32:]))
		}
		ent.goTo = e[82]&0x02 != 0 // IPT_F_GOTO
		byOff[uint32(off)] = len(es)
		es = append(es, ent)
		off += next
	}
	// User chains: an ERROR entry names the chain that starts after it.
	chainAt := map[uint32]string{}
	for i, e := range es {
		if e.target == "ERROR" && i+1 < len(es) {
			chainAt[es[i+1].off] = cstr(e.tinfo)
		}
	}
	verdict := func(e iptEntry) (FilterExpr, error) {
		switch {
		case e.target == "" && e.verd >= 0:
			name, ok := chainAt[uint32(e.verd)]
			if !ok {
				return FilterExpr{}, fmt.Errorf("a jump to offset %d, where no chain starts", e.verd)
			}
			v := int32(NFTJump)
			if e.goTo {
				v = NFTGoto
			}
			return FilterExpr{Name: "immediate", HasVerdict: true, Verdict: v, Chain: name}, nil
		case e.target == "":
			// -NF_x - 1; XT_RETURN is -NF_REPEAT - 1.
			v := -e.verd - 1
			if v == 4 { // NF_REPEAT
				return FilterExpr{Name: "immediate", HasVerdict: true, Verdict: NFTReturn}, nil
			}
			return FilterExpr{Name: "immediate", HasVerdict: true, Verdict: v}, nil
		}
		return FilterExpr{Name: "target", XName: e.target, Info: e.tinfo}, nil
	}
	var out []FilterChain
	addRules := func(c *FilterChain, from, to int) error {
		for i := from; i < to; i++ {
			v, err := verdict(es[i])
			if err != nil {
				return err
			}
			c.Rules = append(c.Rules, FilterRule{Handle: uint64(es[i].off), Exprs: append(slices.Clone(es[i].exprs), v)})
		}
		return nil
	}
	for h := range 5 {
		if valid&(1<<h) == 0 {
			continue
		}
		start, okS := byOff[hooks[h]]
		end, okE := byOff[under[h]]
		if !okS || !okE || end < start {
			return nil, fmt.Errorf("hook %s's entries at %d..%d are not entries", iptHooks[h], hooks[h], under[h])
		}
		c := FilterChain{Source: "iptables", Family: "ip", Table: table, Name: strings.ToUpper(iptHooks[h]), Hook: iptHooks[h], Policy: "accept"}
		if pol := es[end]; pol.target != "" || pol.verd != -NFAccept-1 {
			c.Policy = "drop"
		}
		if err := addRules(&c, start, end); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	for i, e := range es {
		if e.target != "ERROR" || i+1 >= len(es) {
			continue
		}
		end := i + 1
		for end < len(es) && es[end].target != "ERROR" {
			end++
		}
		c := FilterChain{Source: "iptables", Family: "ip", Table: table, Name: cstr(e.tinfo)}
		// The last entry of a user chain is its implicit RETURN.
		if err := addRules(&c, i+1, max(i+1, end-1)); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// iptIPExprs is an entry's struct ipt_ip as nftables expressions (what
// iptables-nft writes for it): protocol, addresses, interfaces, fragments.
func iptIPExprs(ip []byte) []FilterExpr {
	const reg = 1
	flags, inv := ip[82], ip[83]
	op := func(bit byte) uint32 {
		if inv&bit != 0 {
			return 1 // NFT_CMP_NEQ
		}
		return 0
	}
	var out []FilterExpr
	if proto := nlraw.Native.Uint16(ip[80:]); proto != 0 {
		out = append(out, FilterExpr{Name: "meta", DReg: reg, Key: metaL4Proto},
			FilterExpr{Name: "cmp", SReg: reg, Op: op(0x40), Data: []byte{byte(proto)}}) // IPT_INV_PROTO
	}
	for _, a := range []struct {
		addr, mask, off int
		bit             byte
	}{{0, 8, 12, 0x08}, {4, 12, 16, 0x10}} { // IPT_INV_SRCIP, IPT_INV_DSTIP
		mask := ip[a.mask : a.mask+4]
		if bytes.Equal(mask, []byte{0, 0, 0, 0}) {
			continue
		}
		out = append(out, FilterExpr{Name: "payload", DReg: reg, Base: 1, Offset: uint32(a.off), Len: 4},
			FilterExpr{Name: "bitwise", SReg: reg, DReg: reg, Len: 4, Data: slices.Clone(mask), Data2: []byte{0, 0, 0, 0}},
			FilterExpr{Name: "cmp", SReg: reg, Op: op(a.bit), Data: slices.Clone(ip[a.addr : a.addr+4])})
	}
	for _, d := range []struct {
		name, mask int
		key        uint32
		bit        byte
	}{{16, 48, metaIIFName, 0x01}, {32, 64, metaOIFName, 0x02}} { // IPT_INV_VIA_IN, _OUT
		mask := ip[d.mask : d.mask+16]
		if bytes.Equal(mask, make([]byte, 16)) {
			continue
		}
		name := make([]byte, 16)
		for i := range name {
			name[i] = ip[d.name+i] & mask[i]
		}
		out = append(out, FilterExpr{Name: "meta", DReg: reg, Key: d.key},
			FilterExpr{Name: "bitwise", SReg: reg, DReg: reg, Len: 16, Data: slices.Clone(mask), Data2: make([]byte, 16)},
			FilterExpr{Name: "cmp", SReg: reg, Op: op(d.bit), Data: name})
	}
	if flags&0x01 != 0 { // IPT_F_FRAG: non-first fragments only
		o := uint32(1)     // NFT_CMP_NEQ 0: an offset
		if inv&0x20 != 0 { // IPT_INV_FRAG
			o = 0
		}
		out = append(out, FilterExpr{Name: "payload", DReg: reg, Base: 1, Offset: 6, Len: 2},
			FilterExpr{Name: "bitwise", SReg: reg, DReg: reg, Len: 2, Data: []byte{0x1f, 0xff}, Data2: []byte{0, 0}},
			FilterExpr{Name: "cmp", SReg: reg, Op: o, Data: []byte{0, 0}})
	}
	return out
}

// nftables meta keys (enum nft_meta_keys).
const (
	metaProtocol = 1
	metaIIF      = 4
	metaIIFName  = 6
	metaOIFName  = 7
	metaIIFType  = 8
	metaNFProto  = 15
	metaL4Proto  = 16
	metaPktType  = 19
)

// readXFRM lists the namespace's IPsec policies and states.
func readXFRM() ([]string, error) {
	var out []string
	ps, err := netlink.XfrmPolicyList(netlink.FAMILY_ALL)
	if err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) {
			return nil, nil // no XFRM in this kernel: no policies
		}
		return nil, err
	}
	for _, p := range ps {
		out = append(out, fmt.Sprintf("policy %s %v -> %v proto %d dport %d", p.Dir, p.Src, p.Dst, p.Proto, p.DstPort))
	}
	ss, err := netlink.XfrmStateList(netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	for _, s := range ss {
		out = append(out, fmt.Sprintf("state %v -> %v proto %s spi %#x", s.Src, s.Dst, s.Proto, s.Spi))
	}
	return out, nil
}

// LegacyEbtables says whether legacy ebtables may hold tables here. Its
// getsockopt interface cannot tell: asking for a table creates it (the
// kernel instantiates a table from its template on first use), and no
// file lists the tables that exist. So: without ebtables' table code in
// the kernel (kallsyms, the file given, lists ebt_do_table when ebtables
// is built in or its module loaded) there is none; with it, the tables
// cannot be read without creating them, which is an error.
func LegacyEbtables(kallsyms string) ([]string, error) {
	f, err := os.Open(kallsyms)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 3 && fs[2] == "ebt_do_table" {
			return nil, errors.New("legacy ebtables is loaded, and its tables cannot be listed without creating them")
		}
	}
	return nil, sc.Err()
}

// ebtablesCache keeps LegacyEbtables' answer for /proc/kallsyms. Reading
// kallsyms formats every kernel symbol, tens of milliseconds of CPU, and
// lanes agent reads the filters of every namespace on the path each round,
// on the cores the receive path runs on. The answer changes only when a
// module is loaded or unloaded, so it is kept while the list of loaded
// modules stays the same (a kernel without modules has no list: the answer
// holds for the boot).
var ebtablesCache struct {
	sync.Mutex
	modules string // module names, "" before the first read
	tables  []string
	err     error
}

// legacyEbtables is LegacyEbtables("/proc/kallsyms"), read again only
// when the loaded modules changed.
func legacyEbtables() ([]string, error) {
	mods, err := loadedModules("/proc/modules")
	if err != nil {
		return LegacyEbtables("/proc/kallsyms")
	}
	c := &ebtablesCache
	c.Lock()
	defer c.Unlock()
	if c.modules != mods {
		c.tables, c.err = LegacyEbtables("/proc/kallsyms")
		c.modules = mods
	}
	return c.tables, c.err
}

// loadedModules is "+" and the names of the modules the file
// (/proc/modules) lists, in its order, or "-" where the kernel has no
// module support (so neither is the "" of a cache not read yet). The other
// fields (use counts, dependents) change without a load and are left out.
func loadedModules(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "-", nil
	}
	if err != nil {
		return "", err
	}
	var names strings.Builder
	names.WriteString("+")
	for line := range strings.Lines(string(b)) {
		name, _, _ := strings.Cut(line, " ")
		names.WriteString(name)
		names.WriteByte(' ')
	}
	return names.String(), nil
}

// SyncPath is what PRISM-sync must know of one VXLAN device's receive
// path beyond the snapshot: where the kernel takes its datagrams from and
// to.
type SyncPath struct {
	// Sources are the VXLAN device's static forwarding entries: a remote
	// MAC and the VTEP (the entry's first remote) it sends to.
	Sources []VXLANSource `json:"sources,omitempty"`
	// UnderlayIndex and UnderlayMAC are the underlay device's, in its
	// namespace; UnderlayAddrs its IPv4 addresses.
	UnderlayIndex int          `json:"underlay_index"`
	UnderlayMAC   string       `json:"underlay_mac"`
	UnderlayAddrs []netip.Addr `json:"underlay_addrs,omitempty"`
	// RPFilter is the underlay's effective rp_filter (the higher of all's
	// and the device's): 1 strict, 2 loose, 0 off.
	RPFilter int `json:"rp_filter"`
	// VTEPRoutes is, for each source VTEP, the device index the route
	// back to it leaves by in the underlay's namespace (absent: no route).
	VTEPRoutes map[netip.Addr]int `json:"vtep_routes,omitempty"`
	Err        string             `json:"err,omitempty"`
}

// VXLANSource is one static forwarding entry of a VXLAN device.
type VXLANSource struct {
	MAC  string     `json:"mac"`
	VTEP netip.Addr `json:"vtep"`
}

// ReadSyncPath reads v's SyncPath; t is the topology v belongs to.
func ReadSyncPath(t *Topology, v *VXLAN) SyncPath {
	var p SyncPath
	var errs []string
	err := netnsx.Do(t.NetNS, func() error {
		l, err := netlink.LinkByName(v.Name)
		if err != nil {
			return err
		}
		own := l.Attrs().HardwareAddr.String()
		ns, err := netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, n := range ns {
			mac := n.HardwareAddr.String()
			if n.Flags&netlink.NTF_SELF == 0 || len(n.HardwareAddr) != 6 || seen[mac] {
				continue
			}
			// Only the first remote of a MAC is the one vxlan_snoop
			// compares; a dynamic first remote disqualifies the MAC.
			seen[mac] = true
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok || n.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) == 0 || n.HardwareAddr[0]&1 != 0 ||
				mac == "00:00:00:00:00:00" || mac == own {
				continue
			}
			p.Sources = append(p.Sources, VXLANSource{MAC: mac, VTEP: ip.Unmap()})
		}
		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Sprintf("%s's forwarding entries: %v", v.Name, err))
	}
	err = netnsx.Do(v.UnderlayNetNS, func() error {
		l, err := netlink.LinkByName(v.Underlay)
		if err != nil {
			return err
		}
		p.UnderlayIndex, p.UnderlayMAC = l.Attrs().Index, l.Attrs().HardwareAddr.String()
		as, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range as {
			if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
				p.UnderlayAddrs = append(p.UnderlayAddrs, ip)
			}
		}
		for _, f := range []string{"all", v.Underlay} {
			b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + f + "/rp_filter")
			if err != nil {
				return err
			}
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > p.RPFilter {
				p.RPFilter = n
			}
		}
		p.VTEPRoutes = map[netip.Addr]int{}
		for _, s := range p.Sources {
			if rs, err := netlink.RouteGet(s.VTEP.AsSlice()); err == nil && len(rs) > 0 {
				p.VTEPRoutes[s.VTEP] = rs[0].LinkIndex
			}
		}
		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Sprintf("underlay %s: %v", v.Underlay, err))
	}
	if len(errs) > 0 {
		p.Err = strings.Join(errs, "; ")
	}
	return p
}
