// Package topotest builds small overlay topologies in throwaway network
// namespaces for tests: two hosts joined by an underlay veth pair, each with
// a VXLAN device, a bridge and containers behind veth pairs, in Docker's or
// Flannel's layout. Addresses come from 198.18.0.0/15 (RFC 2544 benchmarking
// space) only. Everything is removed by t.Cleanup, also when the build fails
// half way.
package topotest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"testing"

	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Layout is how a host wires containers to its VXLAN device.
type Layout string

const (
	Docker  Layout = "docker"  // VXLAN enslaved to the bridge with the container veths
	Flannel Layout = "flannel" // L3 VXLAN with its own address; containers on a separate bridge
)

// Options say what to build.
type Options struct {
	Layout     Layout // default Docker
	Containers int    // per host, default 2
}

// Fixture is what New built. Device names carry the fixture's random
// prefix so that kernel thread names (napi/DEV-ID) are unique on the machine.
type Fixture struct {
	Prefix string
	Layout Layout
	Hosts  [2]Host
}

// Host is one simulated machine.
type Host struct {
	NetNS      string
	Underlay   string
	UnderIP    net.IP
	VXLAN      string
	Bridge     string
	Containers []Container
}

// Container is a namespace with one veth into its host.
type Container struct {
	NetNS    string
	Veth     string // inside NetNS
	HostVeth string // inside the host's namespace
	IP       net.IP
}

// NewPrefix returns a short random name prefix ("lt" + 4 hex digits).
func NewPrefix() string {
	b := make([]byte, 2)
	rand.Read(b)
	return "lt" + hex.EncodeToString(b)
}

// Namespace creates an empty named namespace removed at cleanup.
func Namespace(t testing.TB, name string) string {
	t.Helper()
	t.Cleanup(func() {
		if err := nsx.Delete(name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := nsx.Create(name); err != nil {
		t.Fatal(err)
	}
	return name
}

// VethNamespace creates an empty namespace, removed at cleanup, holding
// one veth pair a <-> b (both down): for tests of a device's own settings.
func VethNamespace(t testing.TB, suffix, a, b string) string {
	t.Helper()
	ns := Namespace(t, NewPrefix()+suffix)
	if err := nsx.Do(ns, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a}, PeerName: b})
	}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// New builds the fixture.
func New(t testing.TB, opts Options) *Fixture {
	t.Helper()
	testenv.Root(t)
	if opts.Layout == "" {
		opts.Layout = Docker
	}
	if opts.Containers == 0 {
		opts.Containers = 2
	}
	p := NewPrefix()
	f := &Fixture{Prefix: p, Layout: opts.Layout}
	for i := range f.Hosts {
		n := i + 1
		h := &f.Hosts[i]
		h.NetNS = Namespace(t, fmt.Sprintf("%s-h%d", p, n))
		h.Underlay = fmt.Sprintf("%su%d", p, n)
		h.UnderIP = net.IPv4(198, 18, 0, byte(n))
		h.VXLAN = fmt.Sprintf("%svx%d", p, n)
		h.Bridge = fmt.Sprintf("%sbr%d", p, n)
		for j := 1; j <= opts.Containers; j++ {
			c := Container{
				NetNS:    Namespace(t, fmt.Sprintf("%s-h%d-c%d", p, n, j)),
				Veth:     "eth0",
				HostVeth: fmt.Sprintf("%sh%dc%d", p, n, j),
			}
			if opts.Layout == Docker {
				c.IP = net.IPv4(198, 19, 0, byte(10*n+j))
			} else {
				c.IP = net.IPv4(198, 19, byte(n), byte(10+j))
			}
			h.Containers = append(h.Containers, c)
		}
	}
	if err := f.build(); err != nil {
		t.Fatalf("building %s fixture: %v", opts.Layout, err)
	}
	return f
}

func handle(ns string) (*netlink.Handle, error) {
	nh, err := netns.GetFromName(ns)
	if err != nil {
		return nil, err
	}
	defer nh.Close()
	return netlink.NewHandleAt(nh, unix.NETLINK_ROUTE) // as testbed's: no XFRM or netfilter sockets needed
}

func nsFd(ns string) (netlink.NsFd, func(), error) {
	nh, err := netns.GetFromName(ns)
	if err != nil {
		return 0, nil, err
	}
	return netlink.NsFd(nh), func() { nh.Close() }, nil
}

func (f *Fixture) build() error {
	h1, h2 := &f.Hosts[0], &f.Hosts[1]
	// Underlay: one veth pair, an end in each host.
	fd2, done, err := nsFd(h2.NetNS)
	if err != nil {
		return err
	}
	defer done()
	hd1, err := handle(h1.NetNS)
	if err != nil {
		return err
	}
	defer hd1.Close()
	if err := hd1.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: h1.Underlay},
		PeerName:      h2.Underlay,
		PeerNamespace: fd2,
	}); err != nil {
		return fmt.Errorf("adding underlay veth: %w", err)
	}
	for i := range f.Hosts {
		if err := f.buildHost(i); err != nil {
			return fmt.Errorf("host %s: %w", f.Hosts[i].NetNS, err)
		}
	}
	return nil
}

func (f *Fixture) buildHost(i int) error {
	h := &f.Hosts[i]
	peer := f.Hosts[1-i]
	hd, err := handle(h.NetNS)
	if err != nil {
		return err
	}
	defer hd.Close()
	if err := up(hd, "lo", nil); err != nil {
		return err
	}
	if err := up(hd, h.Underlay, &net.IPNet{IP: h.UnderIP, Mask: net.CIDRMask(24, 32)}); err != nil {
		return err
	}
	ul, err := hd.LinkByName(h.Underlay)
	if err != nil {
		return err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: h.Bridge}}
	if err := hd.LinkAdd(br); err != nil {
		return fmt.Errorf("adding bridge: %w", err)
	}
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: h.VXLAN, MTU: 1450},
		VxlanId:   42,
		Port:      4789,
		Learning:  false,
	}
	if f.Layout == Flannel {
		// Flannel names the underlay device and its own address.
		vx.VtepDevIndex = ul.Attrs().Index
		vx.SrcAddr = h.UnderIP
	}
	if err := hd.LinkAdd(vx); err != nil {
		return fmt.Errorf("adding vxlan: %w", err)
	}
	vxl, err := hd.LinkByName(h.VXLAN)
	if err != nil {
		return err
	}
	// Flood to the other host, as Docker's and Flannel's static FDB entries do.
	if err := hd.NeighAppend(&netlink.Neigh{
		LinkIndex:    vxl.Attrs().Index,
		Family:       unix.AF_BRIDGE,
		State:        netlink.NUD_PERMANENT,
		Flags:        netlink.NTF_SELF,
		IP:           peer.UnderIP,
		HardwareAddr: net.HardwareAddr{0, 0, 0, 0, 0, 0},
	}); err != nil {
		return fmt.Errorf("adding vxlan fdb entry: %w", err)
	}
	n := byte(i + 1)
	switch f.Layout {
	case Docker:
		if err := hd.LinkSetMaster(vxl, br); err != nil {
			return err
		}
		if err := up(hd, h.VXLAN, nil); err != nil {
			return err
		}
		if err := up(hd, h.Bridge, nil); err != nil {
			return err
		}
	case Flannel:
		if err := up(hd, h.VXLAN, &net.IPNet{IP: net.IPv4(198, 19, n, 0), Mask: net.CIDRMask(32, 32)}); err != nil {
			return err
		}
		if err := up(hd, h.Bridge, &net.IPNet{IP: net.IPv4(198, 19, n, 1), Mask: net.CIDRMask(24, 32)}); err != nil {
			return err
		}
	}
	for _, c := range h.Containers {
		if err := f.buildContainer(hd, h, br, c); err != nil {
			return fmt.Errorf("container %s: %w", c.NetNS, err)
		}
	}
	return setGRO(h.NetNS, h.Underlay, true)
}

func (f *Fixture) buildContainer(hd *netlink.Handle, h *Host, br *netlink.Bridge, c Container) error {
	fd, done, err := nsFd(c.NetNS)
	if err != nil {
		return err
	}
	defer done()
	if err := hd.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: c.HostVeth},
		PeerName:      c.Veth,
		PeerNamespace: fd,
	}); err != nil {
		return fmt.Errorf("adding veth: %w", err)
	}
	hv, err := hd.LinkByName(c.HostVeth)
	if err != nil {
		return err
	}
	if err := hd.LinkSetMaster(hv, br); err != nil {
		return err
	}
	if err := up(hd, c.HostVeth, nil); err != nil {
		return err
	}
	cd, err := handle(c.NetNS)
	if err != nil {
		return err
	}
	defer cd.Close()
	if err := up(cd, "lo", nil); err != nil {
		return err
	}
	if err := up(cd, c.Veth, &net.IPNet{IP: c.IP, Mask: net.CIDRMask(24, 32)}); err != nil {
		return err
	}
	// GRO on both ends gives each veth a NAPI instance, which threaded NAPI
	// (and so the kthread knobs) needs.
	if err := setGRO(h.NetNS, c.HostVeth, true); err != nil {
		return err
	}
	return setGRO(c.NetNS, c.Veth, true)
}

func up(hd *netlink.Handle, name string, addr *net.IPNet) error {
	l, err := hd.LinkByName(name)
	if err != nil {
		return err
	}
	if addr != nil {
		if err := hd.AddrAdd(l, &netlink.Addr{IPNet: addr}); err != nil {
			return fmt.Errorf("adding %s to %s: %w", addr, name, err)
		}
	}
	if err := hd.LinkSetUp(l); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	return nil
}

func setGRO(ns, dev string, on bool) error {
	return ethtool.Set(ns, dev, ethtool.GRO, on)
}

// Namespaces lists every namespace of the fixture.
func (f *Fixture) Namespaces() []string {
	var out []string
	for _, h := range f.Hosts {
		out = append(out, h.NetNS)
		for _, c := range h.Containers {
			out = append(out, c.NetNS)
		}
	}
	return out
}
