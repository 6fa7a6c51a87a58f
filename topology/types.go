// Package topology discovers a host's container overlay network: its VXLAN
// devices, the underlay NICs under them, bridges, veth pairs and the
// container namespaces behind them, with what the receive path's placement
// depends on (rx queues, RPS maps, threaded NAPI and its kernel threads).
//
// Discovery reads netlink, the netdev generic netlink family and sysfs; it
// never changes anything.
package topology

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/lanesnet/lanes/internal/kthread"
)

// Kind is how the overlay is wired.
type Kind string

const (
	// Docker: the VXLAN device is a bridge port next to the containers'
	// veths (L2 overlay: Docker overlay networks).
	Docker Kind = "docker"
	// Flannel: an L3 VXLAN device routes to a bridge of pod veths (Flannel's
	// flannel.1 + cni0).
	Flannel Kind = "flannel"
	// Routed: an L3 VXLAN device routes straight to the pod veths, no bridge
	// (Calico and Cilium in VXLAN mode).
	Routed Kind = "routed"
)

// Topology is one namespace's overlay as discovered.
type Topology struct {
	// NetNS is the namespace that holds the VXLAN device ("" = the one
	// lanes runs in); internal/netnsx lists the forms a name takes.
	NetNS string `json:"netns"`
	// Host is the namespace discovery was asked about, when the overlay
	// lives in another one: a Docker host keeps each overlay network's
	// VXLAN device and bridge in a namespace of its own under dockerd's
	// exec-root, with the underlay in the host's. lanes acts for Host:
	// its journal and pins carry Host's name (Target). Nil when the
	// overlay is in NetNS itself.
	Host       *string     `json:"host,omitempty"`
	Kind       Kind        `json:"kind"`
	VXLANs     []VXLAN     `json:"vxlans"`
	Underlays  []Device    `json:"underlays"`
	Bridges    []Bridge    `json:"bridges"`
	Veths      []Veth      `json:"veths"` // host-side veths (the underlay excluded)
	Containers []Container `json:"containers"`
	// Netfilter is what netfilter has in NetNS.
	Netfilter Netfilter `json:"netfilter"`
	// Notes are things a reader should know about the discovery (an
	// underlay that could not be resolved, NAPI threads matched by name).
	Notes []string `json:"notes,omitempty"`
}

// Device is a network device and its receive-side settings.
type Device struct {
	Name  string `json:"name"`
	NetNS string `json:"netns"`
	Index int    `json:"index"`
	Type  string `json:"type"`
	Up    bool   `json:"up"`
	MTU   int    `json:"mtu"`
	// RxQueues are the device's receive queues with their RPS settings.
	RxQueues []RxQueue `json:"rx_queues"`
	// Threaded is /sys/class/net/DEV/threaded as read ("0", "1", ...).
	Threaded string `json:"threaded"`
	// NAPIThreads are the kernel threads that poll the device when its
	// NAPI is threaded.
	NAPIThreads []kthread.Info `json:"napi_threads,omitempty"`
	// NAPIByName is set when NAPIThreads were found by name only: VXLAN's
	// GRO cells have no NAPI id, so the netdev family does not list them,
	// and a device of the same name in another namespace would match too.
	NAPIByName bool   `json:"napi_by_name,omitempty"`
	MAC        string `json:"mac,omitempty"`
	TxQueues   int    `json:"tx_queues,omitempty"`
	// MaxRxQueues and MaxTxQueues are the queues the driver could use
	// (ethtool -l's maxima; 0: not reported). A veth is made with one per
	// possible CPU unless its creator said otherwise, and uses one.
	MaxRxQueues int `json:"max_rx_queues,omitempty"`
	MaxTxQueues int `json:"max_tx_queues,omitempty"`
	// XPS: a transmit queue has an XPS map, which then picks the queue.
	XPS bool `json:"xps,omitempty"`
	// GRO is the generic-receive-offload feature. On a veth it also means
	// the veth polls with NAPI, and its peer then takes XDP-redirected
	// frames (XDPTarget).
	GRO bool `json:"gro"`
	// UDPGRO lists the features on the device that let its GRO merge the
	// datagrams of a UDP flow inside the tunnel (rx-gro-list,
	// rx-udp-gro-forwarding; both off by default). PRISM moves a flow out
	// of the NIC poll without an idle gap only where every UDP datagram
	// ends a GRO segment (MergesInnerUDP).
	UDPGRO []string `json:"udp_gro,omitempty"`
	// FeaturesUnread says why UDPGRO could not be read ("" = it was).
	FeaturesUnread string `json:"features_unread,omitempty"`
	// XDPTarget: frames an XDP program redirects to this device are sent
	// (the netdev family's xdp-features include ndo-xmit).
	XDPTarget bool `json:"xdp_target"`
	// IRQs are the interrupts of an underlay NIC (none for a virtual
	// device): where its poll runs when its NAPI is not threaded.
	IRQs []IRQ `json:"irqs,omitempty"`
	// Hooks is what else acts on the device's packets (nil: none found).
	Hooks *Hooks `json:"hooks,omitempty"`
}

// Hooks are the programs and filters on a device besides the kernel's
// defaults: what a shortcut past the device would skip. Each entry names
// its kind and program ("tcx:steer_xdp", "clsact:bpf", "qdisc:htb").
type Hooks struct {
	XDP     string   `json:"xdp,omitempty"`     // attached XDP program's name
	Ingress []string `json:"ingress,omitempty"` // tc ingress filters, tcx ingress programs
	// Egress are tc egress filters, tcx egress programs and a root qdisc
	// other than noqueue (a veth's default).
	Egress []string `json:"egress,omitempty"`
	// Err is what could not be read; a reader must treat the device as
	// hooked when it is set.
	Err string `json:"err,omitempty"`
}

// Others lists every hook of h that own does not claim (by its entry:
// "xdp:NAME", "tcx:NAME", "tc:KIND", "qdisc:KIND"), and "unread: ..."
// when something could not be read: a reader must then assume the worst.
func (h *Hooks) Others(own func(entry string) bool) []string {
	if h == nil {
		return nil
	}
	var out []string
	all := append([]string{}, h.Ingress...)
	all = append(all, h.Egress...)
	if h.XDP != "" {
		all = append(all, "xdp:"+h.XDP)
	}
	for _, e := range all {
		if own == nil || !own(e) {
			out = append(out, e)
		}
	}
	if h.Err != "" {
		out = append(out, "unread: "+h.Err)
	}
	return out
}

// RxQueue is one receive queue.
type RxQueue struct {
	Index int `json:"index"`
	// RPSCPUs is rps_cpus as read (hex mask); RPS lists its CPUs.
	RPSCPUs    string `json:"rps_cpus_mask"`
	RPS        []int  `json:"rps_cpus"`
	RPSFlowCnt int    `json:"rps_flow_cnt"`
}

// QueuePath is the sysfs directory of an rx queue, inside dev's namespace.
func (d *Device) QueuePath(q int) string {
	return "/sys/class/net/" + d.Name + "/queues/rx-" + itoa(q)
}

// VXLAN is a VXLAN device.
type VXLAN struct {
	Device
	VNI      int          `json:"vni"`
	Port     int          `json:"port"`
	Local    netip.Addr   `json:"local,omitzero"`
	Remote   netip.Addr   `json:"remote,omitzero"` // remote or multicast group, if configured
	FDB      []netip.Addr `json:"fdb,omitempty"`   // remote VTEPs from the forwarding database
	Dev      string       `json:"dev,omitempty"`   // the underlay device configured with `dev`
	Learning bool         `json:"learning"`
	// External (collect metadata) devices take their VNI per packet from
	// a tunnel key set by tc or routes, not from the device; GBP devices
	// carry a group policy id that filters may match on.
	External bool `json:"external,omitempty"`
	GBP      bool `json:"gbp,omitempty"`
	// L3 is set when the device carries IP addresses and routes (Flannel,
	// Calico); otherwise it is a bridge port (L2, Docker).
	L3     bool           `json:"l3"`
	Master string         `json:"master,omitempty"`
	Addrs  []netip.Prefix `json:"addrs,omitempty"`
	// Underlay is the device the encapsulated packets arrive on, in
	// UnderlayNetNS (Docker moves the VXLAN device into an overlay
	// namespace while its socket stays in the host's); How says how it was
	// found.
	Underlay      string `json:"underlay,omitempty"`
	UnderlayNetNS string `json:"underlay_netns"`
	How           string `json:"underlay_found_by,omitempty"`
	// UnderlayNetfilter is what netfilter has in UnderlayNetNS when that
	// is not the device's namespace (Docker's overlay namespaces): the
	// encapsulated datagrams pass its prerouting and input hooks on their
	// way to the VXLAN socket. nil when both are the same namespace
	// (Topology.Netfilter) or the underlay namespace was not read.
	UnderlayNetfilter *Netfilter `json:"underlay_netfilter,omitempty"`
	// SrcPorts is the UDP source port range the device picks from
	// (udp_flow_src_port's min and max): its srcport range, or else its
	// namespace's ip_local_port_range; zero if unread.
	SrcPorts [2]int `json:"src_ports,omitzero"`
}

// Bridge is a Linux bridge and its ports.
type Bridge struct {
	Device
	Ports []string `json:"ports"`
	// PortInfo says how each port forwards, in Ports' order.
	PortInfo      []BridgePort `json:"port_info,omitempty"`
	VLANFiltering bool         `json:"vlan_filtering"`
	// STP: the bridge runs spanning tree, so a port whose link goes down
	// and up waits its forwarding delay before it forwards again.
	STP bool `json:"stp,omitempty"`
	// NFCallIPTables: IPv4 frames this bridge forwards pass iptables and
	// nftables' ip/inet hooks (br_netfilter: the namespace's
	// bridge-nf-call-iptables or the bridge's own nf_call_iptables).
	NFCallIPTables bool `json:"nf_call_iptables"`
	// FDB is the forwarding database: which port a unicast MAC goes out on.
	FDB []FDBEntry `json:"fdb,omitempty"`
}

// BridgePort is one bridge port's forwarding state.
type BridgePort struct {
	Name  string `json:"name"`
	State string `json:"state"` // STP state: forwarding, blocking, learning, listening, disabled
	// Isolated ports do not forward to each other; Locked ports forward
	// only from hosts they authenticated (802.1X).
	Isolated bool `json:"isolated,omitempty"`
	Locked   bool `json:"locked,omitempty"`
}

// FDBEntry is one forwarding-database entry of a bridge (the bridge's own,
// "master", entries; not a VXLAN device's remote-VTEP entries).
type FDBEntry struct {
	MAC  string `json:"mac"`
	Port string `json:"port"`
	VLAN int    `json:"vlan,omitempty"`
	// Local entries are the bridge's or a port's own address: frames to
	// them are delivered to the host, not forwarded.
	Local bool `json:"local,omitempty"`
	// Static entries never age out (added by a user or a network plugin);
	// the rest were learned from traffic.
	Static bool `json:"static,omitempty"`
}

// Netfilter is what of netfilter may see a namespace's packets.
type Netfilter struct {
	// IPTables are the legacy iptables tables instantiated in the
	// namespace (a table exists once a rule or policy was set in it).
	IPTables []string `json:"iptables,omitempty"`
	// NFTables are the nftables tables, as "family name".
	NFTables []string `json:"nftables,omitempty"`
	// Err is what could not be read; a reader must assume rules then.
	Err string `json:"err,omitempty"`
}

// None says whether no table of either kind exists and both were read.
func (n Netfilter) None() bool {
	return n.Err == "" && len(n.IPTables) == 0 && len(n.NFTables) == 0
}

// Veth is the host side of a veth pair.
type Veth struct {
	Device
	Master string `json:"master,omitempty"`
	// PeerNetNS is the peer's namespace: a name, a path, "pid:N@C" for an
	// unnamed namespace process N holds (C its netns cookie, see
	// netnsx.Pin), or "unknown".
	PeerNetNS string `json:"peer_netns"`
	PeerIndex int    `json:"peer_index"`
	PeerName  string `json:"peer_name,omitempty"`
}

// Container is a namespace behind one of the host's veths.
type Container struct {
	NetNS      string      `json:"netns"`
	Interfaces []Interface `json:"interfaces"`
}

// Interface is a device inside a container.
type Interface struct {
	Device
	Addrs []netip.Prefix `json:"addrs,omitempty"`
	// HostVeth is the host-side peer when the interface is a veth into the
	// host.
	HostVeth string `json:"host_veth,omitempty"`
}

// ErrNoOverlay is matched (errors.Is) by the error Discover returns for a
// namespace without a VXLAN device.
var ErrNoOverlay = errors.New("no VXLAN overlay found")

type noOverlayError struct{ ns string }

func (e *noOverlayError) Error() string {
	return "no VXLAN overlay found in netns " + label(e.ns) +
		": lanes needs a VXLAN device (Docker overlay, Flannel or Calico/Cilium in VXLAN mode)"
}

func (e *noOverlayError) Is(target error) bool { return target == ErrNoOverlay }

// Target is the namespace lanes acts for, which names its journal, state
// and pins: Host when discovery followed the overlay into a namespace of
// its own, else NetNS.
func (t *Topology) Target() string {
	if t.Host != nil {
		return *t.Host
	}
	return t.NetNS
}

// severalOverlaysError says that several overlay namespaces use ns as their
// underlay's namespace (one per Docker overlay network), so which one lanes
// should act on is the operator's choice.
type severalOverlaysError struct {
	ns  string
	nss []string
}

func (e *severalOverlaysError) Error() string {
	return fmt.Sprintf("netns %s has no VXLAN device of its own, and %d overlay namespaces use it as their underlay (%s): lanes acts on one overlay per host; name it with --netns PATH",
		label(e.ns), len(e.nss), strings.Join(e.nss, ", "))
}

func label(ns string) string {
	if ns == "" {
		return "host"
	}
	return ns
}

// AllDevices returns every device of the topology with a pointer into t, in
// a fixed order: VXLANs, underlays, bridges, veths, container interfaces.
func (t *Topology) AllDevices() []*Device {
	var out []*Device
	for i := range t.VXLANs {
		out = append(out, &t.VXLANs[i].Device)
	}
	for i := range t.Underlays {
		out = append(out, &t.Underlays[i])
	}
	for i := range t.Bridges {
		out = append(out, &t.Bridges[i].Device)
	}
	for i := range t.Veths {
		out = append(out, &t.Veths[i].Device)
	}
	for i := range t.Containers {
		for j := range t.Containers[i].Interfaces {
			out = append(out, &t.Containers[i].Interfaces[j].Device)
		}
	}
	return out
}

// MergesInnerUDP says which underlay's GRO may merge the UDP datagrams
// inside the tunnel, or could not be read ("" = none): steer_xdp's move of
// a flow out of the NIC poll without an idle gap (place()'s PLACE_LOCAL)
// takes every UDP datagram for the end of a GRO segment.
func (t *Topology) MergesInnerUDP() string {
	var why []string
	for _, u := range t.Underlays {
		switch {
		case u.FeaturesUnread != "":
			why = append(why, fmt.Sprintf("the features of %s could not be read (%s)", u.Name, u.FeaturesUnread))
		case len(u.UDPGRO) > 0:
			why = append(why, fmt.Sprintf("%s has %s on", u.Name, strings.Join(u.UDPGRO, " and ")))
		}
	}
	return strings.Join(why, "; ")
}

// UnderlayOf is v's underlay device, or nil if discovery found none.
func (t *Topology) UnderlayOf(v *VXLAN) *Device {
	for i := range t.Underlays {
		if u := &t.Underlays[i]; v.Underlay != "" && u.Name == v.Underlay && u.NetNS == v.UnderlayNetNS {
			return u
		}
	}
	return nil
}

// BridgeNamed is the bridge of that name, or nil.
func (t *Topology) BridgeNamed(name string) *Bridge {
	for i := range t.Bridges {
		if name != "" && t.Bridges[i].Name == name {
			return &t.Bridges[i]
		}
	}
	return nil
}

// VethNamed is the host-side veth of that name, or nil.
func (t *Topology) VethNamed(name string) *Veth {
	for i := range t.Veths {
		if t.Veths[i].Name == name {
			return &t.Veths[i]
		}
	}
	return nil
}

// PeerOf is the container interface behind a host-side veth, or nil.
func (t *Topology) PeerOf(v *Veth) *Interface {
	for i := range t.Containers {
		for j := range t.Containers[i].Interfaces {
			if ifc := &t.Containers[i].Interfaces[j]; ifc.HostVeth == v.Name {
				return ifc
			}
		}
	}
	return nil
}

// Port is how port forwards on b; a port b does not list reads as state
// "unknown", not found.
func (b *Bridge) Port(port string) (BridgePort, bool) {
	for _, p := range b.PortInfo {
		if p.Name == port {
			return p, true
		}
	}
	return BridgePort{Name: port, State: "unknown"}, false
}
