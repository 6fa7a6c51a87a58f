// Package testbed builds two container hosts on one machine: network
// namespaces joined by an underlay veth pair that behaves like a NIC (MTU
// frames, complete checksums, NAPI + GRO polled on a chosen "IRQ core"), each
// host with a VXLAN overlay and containers behind veth pairs, in Docker's or
// Flannel's layout. Everything lives in namespaces whose names start with the
// testbed's prefix, so `down` can find and remove all of it from any state.
//
// Three layouts, the three ways container hosts wire a VXLAN overlay:
// Docker's (L2: VXLAN in a bridge), Flannel's (L3 VXLAN routing into a
// pod bridge) and Calico's (L3 VXLAN routing straight into each pod's
// veth, no bridge).
package testbed

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// Topology is the way a host wires containers to its VXLAN device.
type Topology string

const (
	// Docker: VXLAN enslaved to a Linux bridge together with the host-side
	// veths; all containers share one L2 segment across hosts.
	Docker Topology = "docker"
	// Flannel: an L3 VXLAN device (flannel.1) routing between per-host pod
	// subnets; containers sit on a per-host bridge (cni0).
	Flannel Topology = "flannel"
	// Calico: Calico's VXLAN mode: an L3 VXLAN device (vxlan.calico)
	// routing between per-host pod blocks, and each pod's host-side veth
	// (cali...) a routed point-to-point link with a /32 route to the pod,
	// no bridge.
	Calico Topology = "calico"
)

// Topologies lists the layouts Up builds.
var Topologies = []Topology{Docker, Flannel, Calico}

// Config says what to build.
type Config struct {
	Prefix     string   // namespace and state prefix, default "lanes"
	Topology   Topology // Docker (default), Flannel or Calico
	Containers int      // containers per host, default 2
	IRQCPU     int      // core that polls each host's underlay NIC, default 1 (last core)
	// SenderApart polls the sending host's underlay NIC on the first
	// core other than IRQCPU (its poller at SCHED_FIFO, PollFIFO), as if
	// the sender were another machine; by default both hosts' NICs are
	// polled on IRQCPU, so the sender's receive work (ACKs, responses)
	// shares the receiving host's IRQ core.
	SenderApart bool
	// NIC is how each host's underlay NIC is polled on its IRQ core:
	// NICThreaded (default) or NICSoftirq; NICVeth: on no chosen core.
	NIC string
	MTU int    // underlay MTU, default 1500
	VNI uint32 // VXLAN network identifier of lanes' own overlays, default 42
	// Overlay names the daemons that build the overlay on the two hosts:
	// "" (lanes builds it, in the layout Topology names), OverlayFlanneld
	// or OverlayDockerd (overlay.go). With a daemon, Topology is its
	// layout and the daemon chooses VNI, port, addresses and MACs; Host
	// records what it chose.
	Overlay string
	// NoForwardRules runs flanneld with --iptables-forward-rules=false, as
	// an operator does where the host's FORWARD policy accepts: flanneld
	// then installs no iptables table at all (--ip-masq=false too).
	NoForwardRules bool
}

// Testbed is what Up built (and what Load reads back).
type Testbed struct {
	Config Config
	// Hosts[0] is the sender ("client host"), Hosts[1] the receiver
	// ("server host"); traffic works both ways.
	Hosts [2]Host
}

// Host is one simulated machine.
type Host struct {
	Name         string       // e.g. "h1"
	NetNS        string       // namespace holding the host's devices, e.g. "lanes-h1"
	Underlay     string       // underlay "NIC" (veth) name inside NetNS
	UnderlayAddr netip.Prefix // e.g. 198.18.0.1/24: the native path's address
	UnderlayMAC  net.HardwareAddr
	VXLAN        string // VXLAN device name inside NetNS
	VXLANMAC     net.HardwareAddr
	VTEPAddr     netip.Prefix // flannel, calico: the VXLAN device's own address; docker: invalid
	Bridge       string       // bridge name inside NetNS; calico: none
	PodSubnet    netip.Prefix // flannel, calico: this host's pod subnet (block); docker: the shared overlay subnet
	VNI          uint32       // the VXLAN device's network identifier
	Port         int          // the VXLAN device's UDP port
	// OverlayNetNS holds the VXLAN device, the bridge and the host-side
	// veths when they are not in NetNS: dockerd keeps each overlay
	// network in a namespace of its own (a bound file under its
	// exec-root), the underlay staying in NetNS. "" = NetNS.
	OverlayNetNS string `json:",omitempty"`
	Containers   []Container
}

// OverlayNS is the namespace that holds the host's VXLAN device, bridge
// and host-side veths.
func (h *Host) OverlayNS() string {
	if h.OverlayNetNS != "" {
		return h.OverlayNetNS
	}
	return h.NetNS
}

// Container is one container: a namespace with one veth into its host.
type Container struct {
	Name string // e.g. "c1"
	// NetNS is a name under /run/netns ("lanes-h1-c1"), or the absolute
	// path of the namespace file a container runtime bound (dockerd).
	NetNS    string
	Addr     netip.Prefix
	MAC      net.HardwareAddr
	Veth     string // device name inside the container ("eth0")
	HostVeth string // peer name inside the host namespace
}

// WithDefaults is c with every setting left zero at its default.
func (c Config) WithDefaults() Config { return c.withDefaults() }

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "lanes"
	}
	if c.Containers == 0 {
		c.Containers = 2
	}
	if c.NIC == "" {
		c.NIC = NICThreaded
	}
	if c.MTU == 0 {
		c.MTU = 1500
	}
	if c.VNI == 0 {
		c.VNI = 42
	}
	switch {
	case c.Overlay == OverlayFlanneld && c.Topology == "":
		c.Topology = Flannel
	case c.Overlay == OverlayDockerd && c.Topology == "":
		c.Topology = Docker
	}
	if c.Topology == "" {
		c.Topology = Docker
	}
	return c
}

// Validate reports the first thing wrong with c, as a one-line fix-it.
func (c Config) Validate(ncpu int) error {
	if err := c.validateOverlay(); err != nil {
		return err
	}
	switch c.Topology {
	case Docker, Flannel, Calico:
	default:
		return fmt.Errorf("unknown topology %q: use docker, flannel or calico", c.Topology)
	}
	if c.Containers < 1 || c.Containers > c.maxContainer() {
		return fmt.Errorf("containers per host must be 1..%d on the %s layout, got %d", c.maxContainer(), c.Topology, c.Containers)
	}
	if !slices.Contains(NICModes, c.NIC) {
		return fmt.Errorf("unknown NIC polling %q: use %s", c.NIC, strings.Join(NICModes, " or "))
	}
	if c.IRQCPU < 0 || c.IRQCPU >= ncpu {
		return fmt.Errorf("irq core %d does not exist: this machine has cores 0..%d", c.IRQCPU, ncpu-1)
	}
	if c.SenderApart && c.NIC == NICVeth {
		return fmt.Errorf("--sender-apart polls the sender's NIC on a core of its own, and --nic %s polls no NIC anywhere but where each sender runs: drop one", NICVeth)
	}
	if c.SenderApart && ncpu < 2 {
		return fmt.Errorf("sender apart needs a second core besides the IRQ core; this machine has %d", ncpu)
	}
	if c.MTU < 1280 || c.MTU > 9000 {
		return fmt.Errorf("underlay MTU must be 1280..9000, got %d", c.MTU)
	}
	if c.NIC == NICSoftirq && c.MTU > wireMaxMTU {
		return fmt.Errorf("underlay MTU %d with the NIC polled in softirq: the wire's XDP program takes frames of one page only, MTU at most %d (or use --nic %s)", c.MTU, wireMaxMTU, NICThreaded)
	}
	if c.VNI > 1<<24-1 {
		return fmt.Errorf("VNI must fit in 24 bits, got %d", c.VNI)
	}
	if len(c.Prefix) > 8 {
		return fmt.Errorf("prefix %q is too long: at most 8 characters (device names are limited to 15)", c.Prefix)
	}
	return nil
}

// Routed says whether the VXLAN device routes (L3: Flannel, Calico), so
// an inner frame is addressed to the receiving VXLAN device's MAC, not to
// a container's.
func (c Config) Routed() bool { return c.Topology != Docker }

// Receiver is the host the benchmarks measure.
func (tb *Testbed) Receiver() *Host { return &tb.Hosts[1] }

// Sender is the host that generates traffic.
func (tb *Testbed) Sender() *Host { return &tb.Hosts[0] }

// PollFIFO is the SCHED_FIFO priority of host h's NIC poller, 0 for
// normal scheduling: senderPollFIFO for the sender with SenderApart,
// whose poller shares the core of the benchmark's load (build.go says why).
func (c Config) PollFIFO(h int) int {
	if h == 0 && c.SenderApart {
		return senderPollFIFO
	}
	return 0
}

// PollCPU is the core that polls host h's underlay NIC (h: index into
// Hosts): IRQCPU, or with SenderApart the first other core for the sender.
func (c Config) PollCPU(h int) int {
	if h == 0 && c.SenderApart {
		if c.IRQCPU == 0 {
			return 1
		}
		return 0
	}
	return c.IRQCPU
}
