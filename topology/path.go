package topology

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

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
// that path: IPsec policies, legacy ebtables, and the VXLAN device's
// static forwarding entries and the underlay's local addresses (what the
// kernel accepts a datagram from and to). The netfilter tables are the
// snapshot's (Netfilter).

// Filters are the packet filters of one namespace besides its netfilter
// tables.
type Filters struct {
	// XFRM lists the IPsec policies and states ("policy in src ... dst
	// ... proto 17 dport 4789"): an encrypted overlay's.
	XFRM []string `json:"xfrm,omitempty"`
	// Ebtables are the legacy ebtables tables with rules or a policy
	// other than ACCEPT.
	Ebtables []string `json:"ebtables,omitempty"`
	// Err is what could not be read; a reader must assume rules then.
	Err string `json:"err,omitempty"`
}

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
// kallsyms formats every kernel symbol, a burst of CPU, and
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
