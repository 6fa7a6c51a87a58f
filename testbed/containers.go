package testbed

import (
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
)

// Containers come and go on a real host while lanes runs; these add one
// to a testbed that is up and remove it again, as a container runtime and
// its network plugin would: a namespace, a veth pair into the host's
// bridge (or, on Calico, a routed veth), and on Docker's layout the peer
// host's forwarding entry for the new MAC, as Docker's overlay driver
// programs it.

// maxContainer is the highest container number a layout can address
// (Docker's 198.19.0.<10*host+k> segment: host 1's k=10 would be host 2's
// first container).
func (c Config) maxContainer() int {
	if c.Topology == Docker {
		return 9
	}
	return 50
}

// AddContainer adds a container to host h (1: sender, 2: receiver) of the
// testbed under prefix, numbered with the lowest free number, and returns
// it.
func AddContainer(prefix string, h int) (Container, error) {
	tb, err := Load(prefix)
	if err != nil {
		return Container{}, err
	}
	if h < 1 || h > len(tb.Hosts) {
		return Container{}, fmt.Errorf("host %d does not exist: the testbed has hosts 1 (sender) and 2 (receiver)", h)
	}
	host := &tb.Hosts[h-1]
	// The lowest free number: a container started again after one was
	// removed gets its names back, as a restarted pod on Calico does.
	used := map[string]bool{}
	for _, c := range host.Containers {
		used[c.Name] = true
	}
	k := 1
	for used[fmt.Sprintf("c%d", k)] {
		k++
	}
	if k > tb.Config.maxContainer() {
		return Container{}, fmt.Errorf("host %d has %d containers: the %s layout addresses at most %d per host", h, len(host.Containers), tb.Config.Topology, tb.Config.maxContainer())
	}
	if tb.Config.Overlay != "" {
		ct, err := tb.overlayAdd(h, k)
		if err != nil {
			return Container{}, fmt.Errorf("adding container c%d to %s: %w", k, host.NetNS, err)
		}
		host.Containers = append(host.Containers, ct)
		return ct, tb.save()
	}
	ct := tb.Config.container(h, k)
	if err := nsx.Create(ct.NetNS); err != nil {
		return Container{}, err
	}
	fail := func(err error) (Container, error) {
		nsx.Delete(ct.NetNS)
		return Container{}, fmt.Errorf("adding container %s to %s: %w", ct.Name, host.NetNS, err)
	}
	nh, closeH, err := handle(host.NetNS)
	if err != nil {
		return fail(err)
	}
	defer closeH()
	var br netlink.Link
	if host.Bridge != "" {
		if br, err = nh.LinkByName(host.Bridge); err != nil {
			return fail(err)
		}
	}
	if err := tb.buildContainer(nh, br, *host, ct); err != nil {
		return fail(err)
	}
	if tb.Config.Topology == Docker {
		if err := fdb(&tb.Hosts[2-h], host, ct.MAC, true); err != nil {
			return fail(err)
		}
	}
	host.Containers = append(host.Containers, ct)
	if err := tb.save(); err != nil {
		return fail(err)
	}
	return ct, nil
}

// RemoveContainer removes container name ("c3") from host h: its veth
// pair, its namespace and, on Docker's layout, the peer host's forwarding
// entry for it.
func RemoveContainer(prefix string, h int, name string) error {
	tb, err := Load(prefix)
	if err != nil {
		return err
	}
	if h < 1 || h > len(tb.Hosts) {
		return fmt.Errorf("host %d does not exist: the testbed has hosts 1 (sender) and 2 (receiver)", h)
	}
	host := &tb.Hosts[h-1]
	i := slices.IndexFunc(host.Containers, func(c Container) bool { return c.Name == name })
	if i < 0 {
		return fmt.Errorf("host %d has no container %q", h, name)
	}
	ct := host.Containers[i]
	if tb.Config.Overlay != "" {
		if err := tb.overlayRemove(h, ct); err != nil {
			return fmt.Errorf("removing container %s from %s: %w", name, host.NetNS, err)
		}
		host.Containers = slices.Delete(host.Containers, i, i+1)
		return tb.save()
	}
	if tb.Config.Topology == Docker {
		if err := fdb(&tb.Hosts[2-h], host, ct.MAC, false); err != nil {
			return err
		}
	}
	// The veth pair first, from the host's side: a namespace's devices
	// go with it only once the kernel's cleanup work gets to it, later.
	nh, closeH, err := handle(host.NetNS)
	if err != nil {
		return err
	}
	defer closeH()
	if l, err := nh.LinkByName(ct.HostVeth); err == nil {
		if err := nh.LinkDel(l); err != nil {
			return fmt.Errorf("removing %s from %s: %w", ct.HostVeth, host.NetNS, err)
		}
	}
	killInside(ct.NetNS)
	if err := nsx.Delete(ct.NetNS); err != nil {
		return err
	}
	host.Containers = slices.Delete(host.Containers, i, i+1)
	return tb.save()
}

// fdb adds (or deletes) on peer's VXLAN device the forwarding entry that
// sends mac, a container of host, to host's underlay address.
func fdb(peer, host *Host, mac net.HardwareAddr, add bool) error {
	nh, closeH, err := handle(peer.NetNS)
	if err != nil {
		return err
	}
	defer closeH()
	vx, err := nh.LinkByName(peer.VXLAN)
	if err != nil {
		return err
	}
	n := fdbEntry(vx.Attrs().Index, host.UnderlayAddr.Addr().AsSlice(), mac)
	if add {
		err = nh.NeighAppend(n)
	} else {
		err = nh.NeighDel(n)
	}
	if err != nil {
		return fmt.Errorf("forwarding entry %s -> %s on %s: %w", mac, host.UnderlayAddr.Addr(), peer.NetNS, err)
	}
	return nil
}

// fdbEntry is a VXLAN device's static forwarding entry sending mac to the
// remote underlay address, as Docker's overlay driver and flanneld write
// them.
func fdbEntry(vxIndex int, remote net.IP, mac net.HardwareAddr) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex: vxIndex, Family: unix.AF_BRIDGE,
		State: netlink.NUD_PERMANENT | netlink.NUD_NOARP, Flags: netlink.NTF_SELF,
		IP: remote, HardwareAddr: mac,
	}
}
