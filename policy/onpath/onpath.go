// Package onpath says what may act on the part of the kernel's receive
// path a shortcut skips (PRISM-sync's XDP redirect, the fast path into the
// container): the netfilter tables, IPsec and legacy ebtables of each
// namespace on the way, the tc and XDP programs lanes did not install;
// and it watches that path for changes (Watch). lanes does not judge what
// a rule or program does: where one may act, a shortcut stays off, so a
// firewall's verdict stands wherever one could be given.
package onpath

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lanesnet/lanes/topology"
)

// NetfilterMayAct says why netfilter in namespace ns may act on an IPv4
// frame of the overlay ("" when nothing can).
func NetfilterMayAct(nf topology.Netfilter, ns string) string {
	if nf.Err != "" {
		return fmt.Sprintf("netfilter in %s could not be read (%s), so rules may filter the path", Label(ns), nf.Err)
	}
	if len(nf.IPTables) > 0 {
		return fmt.Sprintf("iptables tables %s exist in %s and may filter the overlay's frames", strings.Join(nf.IPTables, ", "), Label(ns))
	}
	var tabs []string
	for _, tab := range nf.NFTables {
		fam, _, _ := strings.Cut(tab, " ")
		if slices.Contains(nfFamiliesSeeIPv4, fam) {
			tabs = append(tabs, fmt.Sprintf("%q", tab))
		}
	}
	if len(tabs) > 0 {
		return fmt.Sprintf("nftables tables %s exist in %s and may filter the overlay's frames", strings.Join(tabs, ", "), Label(ns))
	}
	return ""
}

// FiltersMayAct says why the packet filters of namespace ns may act on a
// frame of the overlay on the path a shortcut skips ("" when nothing
// can): nf its netfilter tables, f the rest (legacy ebtables, IPsec, which
// drops the plaintext datagrams of an encrypted overlay on their way to
// the VXLAN socket).
func FiltersMayAct(nf topology.Netfilter, f topology.Filters, ns string) string {
	if why := NetfilterMayAct(nf, ns); why != "" {
		return why
	}
	switch {
	case f.Err != "":
		return fmt.Sprintf("the packet filters of %s could not be read (%s), so rules may filter the path", Label(ns), f.Err)
	case len(f.Ebtables) > 0:
		return fmt.Sprintf("legacy ebtables tables %s exist in %s and may filter the bridged frames", strings.Join(f.Ebtables, ", "), Label(ns))
	case len(f.XFRM) > 0:
		return fmt.Sprintf("%s has IPsec policies or states (%s), whose checks on the overlay's datagrams the shortcut would skip", Label(ns), strings.Join(f.XFRM, "; "))
	}
	return ""
}

// nfFamiliesSeeIPv4 are the nftables families whose tables can act on an
// IPv4 frame on its way from the underlay to a container (ip6 and arp
// tables never see it).
var nfFamiliesSeeIPv4 = []string{"ip", "inet", "bridge", "netdev"}

// ReadFilters reads the packet filters (topology.ReadFilters) of t's
// namespace and of each namespace its VXLAN devices' underlays live in.
func ReadFilters(t *topology.Topology) map[string]topology.Filters {
	out := map[string]topology.Filters{t.NetNS: topology.ReadFilters(t.NetNS)}
	for _, v := range t.VXLANs {
		if _, ok := out[v.UnderlayNetNS]; !ok && v.Underlay != "" {
			out[v.UnderlayNetNS] = topology.ReadFilters(v.UnderlayNetNS)
		}
	}
	return out
}

// OwnHook says whether a hook is one of lanes' steering programs, which
// a shortcut may skip: they place stages, count frames and take
// shortcuts, they never filter. (The kernel keeps 15 characters of a
// program's name; every steering program's name starts with steer_.)
func OwnHook(entry string) bool {
	_, name, _ := strings.Cut(entry, ":")
	return (strings.HasPrefix(entry, "tcx:") || strings.HasPrefix(entry, "xdp:")) && strings.HasPrefix(name, "steer_")
}

// EgressHooks are the hooks of a device's transmit side besides lanes'
// own.
func EgressHooks(h *topology.Hooks) []string {
	if h == nil {
		return nil
	}
	return (&topology.Hooks{Egress: h.Egress, Err: h.Err}).Others(OwnHook)
}

// IngressHooks are the hooks of a device's receive side (tc and XDP)
// besides lanes' own.
func IngressHooks(h *topology.Hooks) []string {
	if h == nil {
		return nil
	}
	return (&topology.Hooks{Ingress: h.Ingress, XDP: h.XDP, Err: h.Err}).Others(OwnHook)
}

// Label names a namespace for people.
func Label(ns string) string {
	if ns == "" {
		return "the host namespace"
	}
	return ns
}
