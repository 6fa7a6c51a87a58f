package testbed

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/napi"
	"github.com/lanesnet/lanes/internal/nsx"
)

// StateDir holds one JSON file per testbed, so other commands (bench,
// status, down) find what up built without rediscovering it.
var StateDir = "/run/lanes/testbed"

// Addressing plan, all inside the benchmarking range 198.18.0.0/15 (but
// for calico's pod gateway, the link-local 169.254.1.1, which exists only
// inside the pods' namespaces, as on a Calico host):
//
//	underlay   198.18.0.<host>/24            (the "physical" network)
//	docker     198.19.0.<10*host+c>/24        (one L2 overlay segment)
//	flannel    198.19.<host>.0/24 per host: VTEP .0/32, bridge .1, pods .<10+c>
//	calico     198.19.<host>.0/26 per host (Calico's block size): VTEP .0/32,
//	           pods .<10+c>/32, each behind its own routed veth
const vxlanPort = 4789

func underlayAddr(host int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(host)}), 24)
}

// mac builds locally administered, unicast addresses that encode the role,
// so a packet capture tells at once where a frame came from.
func mac(role, host, idx byte) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x1a, 0x4e, role, host, idx}
}

const (
	roleUnderlay = 0x01
	roleVTEP     = 0x02
	roleCont     = 0x03
	roleWire     = 0x04 // the wire's ends (wire.go)
)

// overlayMTU leaves room for the VXLAN headers (outer IPv4 20 + UDP 8 +
// VXLAN 8 + inner Ethernet 14).
func (c Config) overlayMTU() int { return c.MTU - 50 }

func (c Config) hostNS(h int) string    { return fmt.Sprintf("%s-h%d", c.Prefix, h) }
func (c Config) contNS(h, k int) string { return fmt.Sprintf("%s-h%d-c%d", c.Prefix, h, k) }

// plan computes every name and address of the testbed from the config alone.
func plan(c Config) *Testbed {
	tb := &Testbed{Config: c}
	for i := range tb.Hosts {
		h := i + 1
		host := Host{
			Name:         fmt.Sprintf("h%d", h),
			NetNS:        c.hostNS(h),
			Underlay:     fmt.Sprintf("ul%d", h),
			UnderlayAddr: underlayAddr(h),
			UnderlayMAC:  mac(roleUnderlay, byte(h), 0),
			VXLANMAC:     mac(roleVTEP, byte(h), 0),
			VNI:          c.VNI,
			Port:         vxlanPort,
		}
		if c.Overlay != "" {
			// The daemons choose the rest (buildOverlay reads it back).
			host.VXLANMAC, host.VNI, host.Port = nil, 0, 0
			tb.Hosts[i] = host
			continue
		}
		switch c.Topology {
		case Docker:
			host.VXLAN = "vxlan0"
			host.Bridge = "br0"
			host.PodSubnet = netip.MustParsePrefix("198.19.0.0/24")
		case Flannel:
			host.VXLAN = "flannel.1"
			host.Bridge = "cni0"
			host.PodSubnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(h), 0}), 24)
			host.VTEPAddr = netip.PrefixFrom(host.PodSubnet.Addr(), 32)
		case Calico:
			host.VXLAN = "vxlan.calico"
			host.PodSubnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(h), 0}), 26)
			host.VTEPAddr = netip.PrefixFrom(host.PodSubnet.Addr(), 32)
		}
		for k := 1; k <= c.Containers; k++ {
			host.Containers = append(host.Containers, c.container(h, k))
		}
		tb.Hosts[i] = host
	}
	return tb
}

// container computes container k of host h (1-based) from the config.
func (c Config) container(h, k int) Container {
	ct := Container{
		Name:     fmt.Sprintf("c%d", k),
		NetNS:    c.contNS(h, k),
		MAC:      mac(roleCont, byte(h), byte(k)),
		Veth:     "eth0",
		HostVeth: fmt.Sprintf("veth%d", k),
	}
	switch c.Topology {
	case Docker:
		ct.Addr = netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, 0, byte(10*h + k)}), 24)
	case Flannel:
		ct.Addr = netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(h), byte(10 + k)}), 24)
	case Calico:
		// A /32 per pod, and Calico's host-side name: "cali" and
		// 11 hex digits (Calico hashes the workload's id).
		ct.Addr = netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(h), byte(10 + k)}), 32)
		ct.HostVeth = fmt.Sprintf("cali%011x", k)
	}
	return ct
}

// Up builds the testbed, or leaves it as it is when one with the same
// config is already up and intact. A testbed with another config under the
// same prefix is torn down first: up converges to what was asked.
func Up(cfg Config) (*Testbed, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(runtime.NumCPU()); err != nil {
		return nil, err
	}
	if err := CheckOverlay(cfg.Overlay); err != nil {
		return nil, err
	}
	if old, err := Load(cfg.Prefix); err == nil {
		if old.Config == cfg && old.intact() && old.overlayIntact() {
			return old, nil
		}
	}
	if err := Down(cfg.Prefix); err != nil {
		return nil, err
	}
	tb := plan(cfg)
	if err := tb.build(); err != nil {
		// Never leave half a testbed behind.
		if derr := Down(cfg.Prefix); derr != nil {
			err = fmt.Errorf("%w (and cleaning up: %v)", err, derr)
		}
		return nil, err
	}
	if err := tb.save(); err != nil {
		Down(cfg.Prefix)
		return nil, err
	}
	return tb, nil
}

func (tb *Testbed) intact() bool {
	if tb.Config.NIC == NICSoftirq && !nsx.Exists(tb.Config.WireNS()) {
		return false
	}
	for _, h := range tb.Hosts {
		if !nsx.Exists(h.NetNS) || !nsx.Exists(h.OverlayNS()) {
			return false
		}
		for _, c := range h.Containers {
			if !nsx.Exists(c.NetNS) {
				return false
			}
		}
	}
	return true
}

func (tb *Testbed) build() error {
	if tb.Config.NIC == NICSoftirq {
		if err := nsx.Create(tb.Config.WireNS()); err != nil {
			return err
		}
	}
	for _, h := range tb.Hosts {
		if err := nsx.Create(h.NetNS); err != nil {
			return err
		}
		for _, c := range h.Containers {
			if err := nsx.Create(c.NetNS); err != nil {
				return err
			}
		}
	}
	if err := tb.buildUnderlay(); err != nil {
		return fmt.Errorf("building underlay: %w", err)
	}
	if tb.Config.Overlay != "" {
		if err := tb.buildOverlay(); err != nil {
			return fmt.Errorf("%s building the overlay: %w", tb.Config.Overlay, err)
		}
	}
	for i := range tb.Hosts {
		if tb.Config.Overlay != "" {
			break
		}
		if err := tb.buildHost(i); err != nil {
			return fmt.Errorf("building host %s: %w", tb.Hosts[i].Name, err)
		}
	}
	// Last: a veth re-creates its NAPI contexts as its peer comes up and
	// its features change, so the pollers are threaded and pinned only
	// once the underlay has settled.
	for i, h := range tb.Hosts {
		if tb.Config.NIC == NICVeth {
			break
		}
		ns, dev, cpu := h.NetNS, h.Underlay, tb.Config.PollCPU(i)
		if tb.Config.NIC == NICSoftirq {
			// The wire end that delivers to host i, whose thread raises
			// the host's NIC softirq on the host's IRQ core.
			ns, dev = tb.Config.WireNS(), wireEnd(2-i)
		}
		if err := pinNAPI(ns, dev, cpu, tb.Config.PollFIFO(i)); err != nil {
			return err
		}
	}
	return nil
}

// senderPollFIFO is the real-time priority of the sending host's NIC
// poller under SenderApart. Apart, it polls on the core the benchmark's
// load generator, the background's receiver and the ping-pong's client
// share; at normal scheduling it then waits there, runnable, for seconds
// at a time while those switch in and out (traced with sched_switch),
// holding the replies in its ring, and a ping-pong under background loses
// every message while it waits. It stands for another machine's NIC
// and interrupt, which no task of this host delays: FIFO 1, at or below
// every real-time thread lanes sets.
const senderPollFIFO = 1

// handle opens a netlink handle bound to a named namespace; it works from
// any thread, so no namespace switching is needed for link configuration.
func handle(ns string) (*netlink.Handle, func(), error) {
	nh, err := netns.GetFromPath(nsx.Path(ns))
	if err != nil {
		return nil, nil, fmt.Errorf("opening netns %s: %w", ns, err)
	}
	// Route sockets only: the default also opens XFRM and netfilter
	// ones, and fails on a kernel built without them (a 6.12 kernel
	// without XFRM_USER), though the testbed needs neither.
	h, err := netlink.NewHandleAt(nh, unix.NETLINK_ROUTE)
	if err != nil {
		nh.Close()
		return nil, nil, fmt.Errorf("netlink in %s: %w", ns, err)
	}
	return h, func() { h.Close(); nh.Close() }, nil
}

func nsFd(ns string) (netns.NsHandle, error) {
	nh, err := netns.GetFromPath(nsx.Path(ns))
	if err != nil {
		return 0, fmt.Errorf("opening netns %s: %w", ns, err)
	}
	return nh, nil
}

func (tb *Testbed) buildUnderlay() error {
	if tb.Config.NIC == NICSoftirq {
		if err := tb.buildWire(); err != nil {
			return err
		}
		for _, h := range tb.Hosts {
			if err := tb.setupNIC(h); err != nil {
				return err
			}
		}
		if err := tb.enableGRO(); err != nil {
			return err
		}
		return tb.attachWire()
	}
	a, b := &tb.Hosts[0], &tb.Hosts[1]
	ha, closeA, err := handle(a.NetNS)
	if err != nil {
		return err
	}
	defer closeA()
	bfd, err := nsFd(b.NetNS)
	if err != nil {
		return err
	}
	defer bfd.Close()
	veth := nicVeth(a.Underlay, a.UnderlayMAC, b.Underlay, b.UnderlayMAC, tb.Config.MTU, bfd)
	if err := ha.LinkAdd(veth); err != nil {
		return fmt.Errorf("adding underlay veth %s<->%s: %w", a.Underlay, b.Underlay, err)
	}
	for _, h := range tb.Hosts {
		if err := tb.setupNIC(h); err != nil {
			return err
		}
	}
	return tb.enableGRO()
}

// setupNIC makes a host's end of the underlay veth behave like a NIC.
func (tb *Testbed) setupNIC(h Host) error {
	nh, closeH, err := handle(h.NetNS)
	if err != nil {
		return err
	}
	defer closeH()
	lo, err := nh.LinkByName("lo")
	if err == nil {
		err = nh.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("bringing up lo: %w", err)
	}
	link, err := nh.LinkByName(h.Underlay)
	if err != nil {
		return err
	}
	if err := nh.LinkSetMTU(link, tb.Config.MTU); err != nil {
		return fmt.Errorf("setting MTU of %s: %w", h.Underlay, err)
	}
	if err := nh.AddrAdd(link, &netlink.Addr{IPNet: prefixNet(h.UnderlayAddr)}); err != nil {
		return fmt.Errorf("addressing %s: %w", h.Underlay, err)
	}
	// What a real NIC puts on the wire: MTU frames with finished checksums.
	for _, f := range []ethtool.Feature{ethtool.TSO, ethtool.GSO, ethtool.TxChecksum} {
		if err := ethtool.Set(h.NetNS, h.Underlay, f, false); err != nil {
			return err
		}
	}
	if err := nh.LinkSetUp(link); err != nil {
		return fmt.Errorf("bringing up %s: %w", h.Underlay, err)
	}
	return nil
}

// enableGRO turns on GRO, which switches a veth's receive side to NAPI like
// a NIC driver. Only once both ends are up: veth marks its peer as an XDP
// redirect target (ndo_xdp_xmit) when GRO changes on a device that is up,
// and a GRO set while down leaves every frame redirected into the peer
// silently dropped.
func (tb *Testbed) enableGRO() error {
	for _, h := range tb.Hosts {
		if err := ethtool.Set(h.NetNS, h.Underlay, ethtool.GRO, true); err != nil {
			return err
		}
	}
	return nil
}

// pinNAPI threads dev's NAPI and pins its kthread on cpu: veth_xmit
// schedules the peer's NAPI on the sending CPU, so without this the "IRQ
// core" would be wherever the sender runs. dev is the receiving underlay
// device (NIC threaded) or the wire end that feeds it (NIC softirq). fifo
// > 0 also gives the kthread that real-time priority.
func pinNAPI(ns, dev string, cpu, fifo int) error {
	err := nsx.DoSysfs(ns, func() error {
		return os.WriteFile(filepath.Join("/sys/class/net", dev, "threaded"), []byte("1"), 0)
	})
	if err != nil {
		return fmt.Errorf("threading NAPI of %s: %w", dev, err)
	}
	// The poller kthread is created with the device's NAPI context, which
	// veth sets up asynchronously as it comes up: poll for it, bounded.
	var threads []kthread.Thread
	deadline := time.Now().Add(3 * time.Second)
	for {
		threads, err = NAPIThreads(ns, dev)
		if err == nil && len(threads) > 0 {
			break
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("no NAPI kthread appeared for %s after enabling threaded NAPI", dev)
			}
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, t := range threads {
		if err := t.Pin(cpu); err != nil {
			return err
		}
		if fifo > 0 {
			if err := t.SetFIFO(fifo); err != nil {
				return err
			}
		}
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}

func (tb *Testbed) buildHost(i int) error {
	h := tb.Hosts[i]
	peer := tb.Hosts[1-i]
	nh, closeH, err := handle(h.NetNS)
	if err != nil {
		return err
	}
	defer closeH()
	ul, err := nh.LinkByName(h.Underlay)
	if err != nil {
		return err
	}
	omtu := tb.Config.overlayMTU()

	if h.Bridge != "" {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: h.Bridge, MTU: omtu}}
		if err := nh.LinkAdd(br); err != nil {
			return fmt.Errorf("adding bridge %s: %w", h.Bridge, err)
		}
	}
	vx := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: h.VXLAN, MTU: omtu, HardwareAddr: h.VXLANMAC},
		VxlanId:      int(tb.Config.VNI),
		VtepDevIndex: ul.Attrs().Index,
		SrcAddr:      h.UnderlayAddr.Addr().AsSlice(),
		Port:         vxlanPort,
		Learning:     false, // Docker, Flannel and Calico program the FDB themselves
	}
	if err := nh.LinkAdd(vx); err != nil {
		return fmt.Errorf("adding vxlan %s: %w", h.VXLAN, err)
	}
	vxl, err := nh.LinkByName(h.VXLAN)
	if err != nil {
		return err
	}
	var brl netlink.Link // nil on calico
	if h.Bridge != "" {
		if brl, err = nh.LinkByName(h.Bridge); err != nil {
			return err
		}
	}
	remote := peer.UnderlayAddr.Addr().AsSlice()

	switch tb.Config.Topology {
	case Docker:
		// Docker's overlay driver: the VXLAN device is a bridge port; the
		// FDB sends every remote container MAC, and flooded ARP, to the
		// peer's VTEP.
		if err := nh.LinkSetMaster(vxl, brl); err != nil {
			return fmt.Errorf("enslaving %s: %w", h.VXLAN, err)
		}
		fdb := []net.HardwareAddr{{0, 0, 0, 0, 0, 0}}
		for _, c := range peer.Containers {
			fdb = append(fdb, c.MAC)
		}
		for _, m := range fdb {
			if err := nh.NeighAppend(fdbEntry(vxl.Attrs().Index, remote, m)); err != nil {
				return fmt.Errorf("adding fdb %s -> %s: %w", m, peer.UnderlayAddr.Addr(), err)
			}
		}
	case Flannel, Calico:
		// flanneld's layout, and calico-node's in VXLAN mode: the L3 VXLAN
		// device owns this host's VTEP address; for each remote subnet a
		// route via the remote VTEP address (onlink), a permanent
		// neighbour giving its MAC, and an FDB entry sending that MAC to
		// the remote underlay address.
		if err := nh.AddrAdd(vxl, &netlink.Addr{IPNet: prefixNet(h.VTEPAddr)}); err != nil {
			return fmt.Errorf("addressing %s: %w", h.VXLAN, err)
		}
		if brl != nil {
			if err := nh.AddrAdd(brl, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(h.PodSubnet.Addr().Next(), 24))}); err != nil {
				return fmt.Errorf("addressing %s: %w", h.Bridge, err)
			}
		}
		peerMAC := peer.VXLANMAC
		if err := nh.NeighAdd(&netlink.Neigh{
			LinkIndex: vxl.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: peer.VTEPAddr.Addr().AsSlice(), HardwareAddr: peerMAC,
		}); err != nil {
			return fmt.Errorf("adding neighbour for peer VTEP: %w", err)
		}
		if err := nh.NeighAppend(fdbEntry(vxl.Attrs().Index, remote, peerMAC)); err != nil {
			return fmt.Errorf("adding fdb for peer VTEP: %w", err)
		}
		if err := nsx.Do(h.NetNS, func() error {
			return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0)
		}); err != nil {
			return fmt.Errorf("enabling forwarding: %w", err)
		}
	}
	if err := nh.LinkSetUp(vxl); err != nil {
		return err
	}
	if brl != nil {
		if err := nh.LinkSetUp(brl); err != nil {
			return err
		}
	}
	if tb.Config.Routed() {
		if err := nh.RouteAdd(&netlink.Route{
			LinkIndex: vxl.Attrs().Index, Dst: prefixNet(peer.PodSubnet),
			Gw: peer.VTEPAddr.Addr().AsSlice(), Flags: int(netlink.FLAG_ONLINK),
		}); err != nil {
			return fmt.Errorf("routing to %s: %w", peer.PodSubnet, err)
		}
	}
	for _, c := range h.Containers {
		if err := tb.buildContainer(nh, brl, h, c); err != nil {
			return fmt.Errorf("container %s: %w", c.Name, err)
		}
	}
	return nil
}

// calicoGateway is the address every Calico pod routes through: a
// link-local address nobody owns, which the host-side veth answers for by
// proxy ARP, with Calico's fixed MAC.
var (
	calicoGateway    = netip.MustParseAddr("169.254.1.1")
	calicoGatewayMAC = net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}
)

// buildContainer wires container c to its host: a veth into the bridge br
// (docker, flannel), or on calico (br nil) a routed veth with a /32 route
// to the pod on the host side.
func (tb *Testbed) buildContainer(nh *netlink.Handle, br netlink.Link, h Host, c Container) error {
	cfd, err := nsFd(c.NetNS)
	if err != nil {
		return err
	}
	defer cfd.Close()
	omtu := tb.Config.overlayMTU()
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: c.HostVeth, MTU: omtu},
		PeerName:         c.Veth,
		PeerHardwareAddr: c.MAC,
		PeerNamespace:    netlink.NsFd(int(cfd)),
	}
	if br != nil {
		veth.LinkAttrs.MasterIndex = br.Attrs().Index
	} else {
		veth.LinkAttrs.HardwareAddr = calicoGatewayMAC
	}
	if err := nh.LinkAdd(veth); err != nil {
		return fmt.Errorf("adding veth %s: %w", c.HostVeth, err)
	}
	hv, err := nh.LinkByName(c.HostVeth)
	if err != nil {
		return err
	}
	if br == nil {
		// What Calico's CNI plugin sets on the host side: proxy ARP (it
		// answers the pod's ARP for the gateway) and a /32 route.
		if err := nsx.Do(h.NetNS, func() error {
			return os.WriteFile("/proc/sys/net/ipv4/conf/"+c.HostVeth+"/proxy_arp", []byte("1"), 0)
		}); err != nil {
			return fmt.Errorf("proxy ARP on %s: %w", c.HostVeth, err)
		}
	}
	if err := nh.LinkSetUp(hv); err != nil {
		return err
	}
	if br == nil {
		if err := nh.RouteAdd(&netlink.Route{
			LinkIndex: hv.Attrs().Index, Dst: prefixNet(c.Addr), Scope: netlink.SCOPE_LINK,
		}); err != nil {
			return fmt.Errorf("routing to %s: %w", c.Addr, err)
		}
	}
	ch, closeC, err := handle(c.NetNS)
	if err != nil {
		return err
	}
	defer closeC()
	for _, name := range []string{"lo", c.Veth} {
		l, err := ch.LinkByName(name)
		if err != nil {
			return err
		}
		if name == c.Veth {
			if err := ch.LinkSetMTU(l, omtu); err != nil {
				return err
			}
			if err := ch.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(c.Addr)}); err != nil {
				return fmt.Errorf("addressing %s: %w", c.Veth, err)
			}
		}
		if err := ch.LinkSetUp(l); err != nil {
			return err
		}
		if name != c.Veth {
			continue
		}
		switch tb.Config.Topology {
		case Flannel:
			if err := ch.RouteAdd(&netlink.Route{Gw: h.PodSubnet.Addr().Next().AsSlice(), LinkIndex: l.Attrs().Index}); err != nil {
				return fmt.Errorf("default route: %w", err)
			}
		case Calico:
			// Calico's pod routes: the gateway on the link, the default
			// through it. Its neighbour entry is permanent here: proxy ARP
			// answers only for addresses the host routes elsewhere, and
			// the testbed's hosts have no default route to cover
			// 169.254.1.1 (a Calico host has one).
			gw := calicoGateway.AsSlice()
			if err := ch.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(calicoGateway, 32)), Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("route to the gateway: %w", err)
			}
			if err := ch.RouteAdd(&netlink.Route{Gw: gw, LinkIndex: l.Attrs().Index}); err != nil {
				return fmt.Errorf("default route: %w", err)
			}
			if err := ch.NeighAdd(&netlink.Neigh{
				LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4,
				State: netlink.NUD_PERMANENT, IP: gw, HardwareAddr: calicoGatewayMAC,
			}); err != nil {
				return fmt.Errorf("gateway neighbour: %w", err)
			}
		}
	}
	return nil
}

func statePath(prefix string) string { return filepath.Join(StateDir, prefix+".json") }

func (tb *Testbed) save() error {
	if err := os.MkdirAll(StateDir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(tb, "", "  ")
	if err != nil {
		return err
	}
	tmp := statePath(tb.Config.Prefix) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, statePath(tb.Config.Prefix))
}

// ErrNotUp says no testbed with that prefix is up.
var ErrNotUp = errors.New("testbed is not up")

// Load reads back the testbed that Up built under prefix.
func Load(prefix string) (*Testbed, error) {
	if prefix == "" {
		prefix = "lanes"
	}
	b, err := os.ReadFile(statePath(prefix))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w (prefix %q): run 'lanes testbed up' first", ErrNotUp, prefix)
	}
	if err != nil {
		return nil, err
	}
	var tb Testbed
	if err := json.Unmarshal(b, &tb); err != nil {
		return nil, fmt.Errorf("reading testbed state %s: %w", statePath(prefix), err)
	}
	// A state saved before a setting existed reads as its default, so Up
	// does not rebuild an unchanged testbed.
	tb.Config = tb.Config.withDefaults()
	return &tb, nil
}

// Down removes every namespace of the testbed (and so every device in
// them), kills processes still running inside them, and forgets the state.
// It works from any state, including a half-built testbed and no testbed.
func Down(prefix string) error {
	if prefix == "" {
		prefix = "lanes"
	}
	// The real daemons first, while their namespaces still exist.
	errs := []error{downOverlay(prefix)}
	var pollers []int
	for _, ns := range nsx.List(prefix + "-") {
		if !IsTestbedNS(prefix, ns) {
			continue
		}
		if inst, err := napi.List(ns, 0); err == nil {
			for _, in := range inst {
				if in.PID != 0 {
					pollers = append(pollers, in.PID)
				}
			}
		}
		killInside(ns)
		if err := nsx.Delete(ns); err != nil {
			errs = append(errs, err)
		}
	}
	// Namespace teardown runs asynchronously in the kernel; until it
	// ends the deleted devices' NAPI pollers still exist, and "down leaves
	// nothing behind" and an immediate "up" both need them gone.
	waitGone(pollers, 10*time.Second)
	if err := os.Remove(statePath(prefix)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	// The last testbed gone takes its state directory along, and the
	// directory above it if that is left empty too (/run/lanes): nothing
	// of lanes stays on the host. Remove fails on a non-empty directory,
	// which is the point.
	if os.Remove(StateDir) == nil {
		os.Remove(filepath.Dir(StateDir))
	}
	return errors.Join(errs...)
}

// IsTestbedNS says whether ns is a namespace of the testbed with this
// prefix: <prefix>-h<N>, <prefix>-h<N>-c<M> and <prefix>-wire only, so a
// neighbouring prefix ("lanes2") is never touched.
func IsTestbedNS(prefix, ns string) bool {
	if ns == prefix+"-wire" {
		return true
	}
	rest, ok := strings.CutPrefix(ns, prefix+"-h")
	if !ok {
		return false
	}
	var h, c int
	if n, _ := fmt.Sscanf(rest, "%d-c%d", &h, &c); n == 2 && rest == fmt.Sprintf("%d-c%d", h, c) {
		return true
	}
	n, _ := fmt.Sscanf(rest, "%d", &h)
	return n == 1 && rest == fmt.Sprint(h)
}

// nicVeth is a veth pair that stands for a NIC and what it is wired to:
// name in the namespace it is added in, peer in peerNS. One queue each
// way, like a single-queue NIC with one IRQ. It also matters for XDP: a
// veth offers ndo_xdp_xmit (the target of a devmap redirect) only while
// its peer has no more tx queues than it has rx queues; the kernel's
// default of one tx queue per CPU would silently drop every redirected
// frame.
func nicVeth(name string, hw net.HardwareAddr, peer string, peerHW net.HardwareAddr, mtu int, peerNS netns.NsHandle) *netlink.Veth {
	return &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: name, MTU: mtu, HardwareAddr: hw, NumTxQueues: 1, NumRxQueues: 1},
		PeerName:         peer,
		PeerHardwareAddr: peerHW,
		PeerNamespace:    netlink.NsFd(int(peerNS)),
		PeerNumTxQueues:  1,
		PeerNumRxQueues:  1,
	}
}
