package topology_test

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
)

// boundNetNS makes a namespace bound to a file at path, outside /run/netns
// (as dockerd binds its namespaces under its exec-root), removed at cleanup.
func boundNetNS(t *testing.T, path string) netns.NsHandle {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies in the new namespace
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return err
			}
			return unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatalf("binding a namespace at %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", path, err)
		}
		os.Remove(path)
	})
	h, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func nlHandle(t *testing.T, h netns.NsHandle) *netlink.Handle {
	t.Helper()
	nh, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nh.Close)
	return nh
}

// dockerOverlay builds what dockerd builds for one overlay network on a
// host: a VXLAN device made in the host's namespace (its socket and
// underlay stay there) and moved into a namespace of its own, bound under
// dir, with a bridge and a veth to the namespace bound at peerPath.
func dockerOverlay(t *testing.T, host *netlink.Handle, under netlink.Link, dir, name string, vni int, peerPath string) {
	t.Helper()
	ov := boundNetNS(t, filepath.Join(dir, name))
	oh := nlHandle(t, ov)
	vxName := "vx" + name[len(name)-4:]
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: vxName}, VxlanId: vni, VtepDevIndex: under.Attrs().Index, Port: 4789}
	if err := host.LinkAdd(vx); err != nil {
		t.Fatalf("adding %s: %v", vxName, err)
	}
	l, err := host.LinkByName(vxName)
	if err != nil {
		t.Fatal(err)
	}
	if err := host.LinkSetNsFd(l, int(ov)); err != nil {
		t.Fatal(err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := oh.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	if l, err = oh.LinkByName(vxName); err != nil {
		t.Fatal(err)
	}
	if err := oh.LinkSetMaster(l, br); err != nil {
		t.Fatal(err)
	}
	peer := boundNetNS(t, peerPath)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0", MasterIndex: br.Attrs().Index}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(peer))}
	if err := oh.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
}

// A Docker host has no VXLAN device in its own namespace: discovery from
// the host's namespace follows the overlay into the namespace dockerd bound
// under its exec-root (found among the nsfs mounts, wherever they are),
// passes over the swarm's ingress network, and acts for the host.
func TestDiscoverFollowsDockerOverlayNamespace(t *testing.T) {
	f := topotest.New(t, topotest.Options{Containers: 1})
	h := f.Hosts[1]
	hn, err := netns.GetFromName(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer hn.Close()
	hh := nlHandle(t, hn)
	under, err := hh.LinkByName(h.Underlay)
	if err != nil {
		t.Fatal(err)
	}
	// The fixture's own overlay goes: this host is Docker's.
	if vx, err := hh.LinkByName(h.VXLAN); err == nil {
		if err := hh.LinkDel(vx); err != nil {
			t.Fatal(err)
		}
	}
	execRoot := t.TempDir()
	dir := filepath.Join(execRoot, "netns")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	if _, err := topology.Discover(h.NetNS); !errors.Is(err, topology.ErrNoOverlay) {
		t.Fatalf("no overlay anywhere: got %v, want ErrNoOverlay", err)
	}
	// The ingress network alone: it is the host's overlay.
	dockerOverlay(t, hh, under, dir, "1-ingr", 4096, filepath.Join(dir, "ingress_sbox"))
	topo, err := topology.Discover(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "1-ingr"); topo.NetNS != want {
		t.Fatalf("overlay found in %q, want the ingress network's %q", topo.NetNS, want)
	}
	// A network with a container: that one, not the ingress.
	dockerOverlay(t, hh, under, dir, "1-user", 4097, filepath.Join(dir, "0123456789ab"))
	topo, err = topology.Discover(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "1-user"); topo.NetNS != want {
		t.Fatalf("overlay found in %q, want %q", topo.NetNS, want)
	}
	if topo.Target() != h.NetNS || topo.Host == nil {
		t.Errorf("target %q (host %v), want the namespace asked about, %q", topo.Target(), topo.Host, h.NetNS)
	}
	if len(topo.VXLANs) != 1 || topo.VXLANs[0].VNI != 4097 || topo.VXLANs[0].UnderlayNetNS != h.NetNS || topo.VXLANs[0].Underlay != h.Underlay {
		t.Errorf("vxlans %+v, want VNI 4097 over %s in %s", topo.VXLANs, h.Underlay, h.NetNS)
	}
	if len(topo.Containers) != 1 || topo.Containers[0].NetNS != filepath.Join(dir, "0123456789ab") {
		t.Errorf("containers %+v, want the one bound at %s", topo.Containers, filepath.Join(dir, "0123456789ab"))
	}
	if topo.Kind != topology.Docker {
		t.Errorf("kind %s, want docker", topo.Kind)
	}
	// Asked about the overlay's namespace itself, it is its own target.
	if topo, err := topology.Discover(filepath.Join(dir, "1-user")); err != nil || topo.Host != nil || topo.Target() != filepath.Join(dir, "1-user") {
		t.Errorf("discovering the overlay namespace itself: %v, host %v", err, topo.Host)
	}
	// A second network with a container: the operator chooses.
	dockerOverlay(t, hh, under, dir, "1-more", 4098, filepath.Join(dir, "ba9876543210"))
	_, err = topology.Discover(h.NetNS)
	if err == nil || !strings.Contains(err.Error(), "1-user") || !strings.Contains(err.Error(), "1-more") || strings.Contains(err.Error(), "1-ingr") || !strings.Contains(err.Error(), "--netns") {
		t.Errorf("two overlay networks: got %v, want an error naming both (not the ingress) and --netns", err)
	}
}
