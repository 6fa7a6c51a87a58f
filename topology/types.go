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
	"net/netip"

	"github.com/lanesnet/lanes/datapath/knobs"
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
	// lanes runs in); see knobs.NetNSPath for the forms a name takes.
	NetNS      string      `json:"netns"`
	Kind       Kind        `json:"kind"`
	VXLANs     []VXLAN     `json:"vxlans"`
	Underlays  []Device    `json:"underlays"`
	Bridges    []Bridge    `json:"bridges"`
	Veths      []Veth      `json:"veths"` // host-side veths (the underlay excluded)
	Containers []Container `json:"containers"`
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
	NAPIThreads []knobs.KthreadInfo `json:"napi_threads,omitempty"`
	// NAPIByName is set when NAPIThreads were found by name only: VXLAN's
	// GRO cells have no NAPI id, so the netdev family does not list them,
	// and a device of the same name in another namespace would match too.
	NAPIByName bool `json:"napi_by_name,omitempty"`
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
}

// Bridge is a Linux bridge and its ports.
type Bridge struct {
	Device
	Ports []string `json:"ports"`
}

// Veth is the host side of a veth pair.
type Veth struct {
	Device
	Master string `json:"master,omitempty"`
	// PeerNetNS is the peer's namespace: a name, a path, "pid:N" for an
	// unnamed namespace some process holds, or "unknown".
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
