package topology

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/ethtool"
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

// readPath fills s.path; it runs in the namespace, with its /sys mounted.
func (s *nsScan) readPath() {
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
		p.udpGRO[a.Name] = readUDPGRO(a.Name)
		p.txq[a.Name] = countQueues(a.Name, "tx-")
		p.xps[a.Name] = hasXPS(a.Name)
		if c, err := ethtool.GetChannels("", a.Name); err == nil {
			p.maxq[a.Name] = [2]int{int(c.MaxRX), int(c.MaxTX)}
		}
		if a.MasterIndex != 0 {
			if bp, ok := readBridgePort(a.Name); ok {
				p.brports[a.Name] = bp
			}
		}
		if l.Type() == "bridge" {
			dir := "/sys/class/net/" + a.Name + "/bridge/"
			p.bridges[a.Name] = bridgeFacts{
				vlanFiltering: readBool(dir + "vlan_filtering"),
				nfCall:        nsCall || readBool(dir+"nf_call_iptables"),
				stp:           readNonZero(dir + "stp_state"),
			}
			p.fdb[a.Index] = s.readFDB(a.Index)
		}
	}
	p.xdpTarget = xdpTargets()
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
func hasXPS(dev string) bool {
	qs, _ := filepath.Glob("/sys/class/net/" + dev + "/queues/tx-*")
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

func countQueues(dev, prefix string) int {
	ents, err := os.ReadDir("/sys/class/net/" + dev + "/queues")
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

func readBridgePort(dev string) (BridgePort, bool) {
	dir := "/sys/class/net/" + dev + "/brport/"
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
