package topology_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/lanesnet/lanes/testbed"
	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func TestDiscoverDocker(t *testing.T) {
	f := topotest.New(t, topotest.Options{Layout: topotest.Docker})
	h := f.Hosts[1]
	// Threaded NAPI on a container veth and the VXLAN device, so the
	// discovery has kernel threads to find.
	c0 := h.Containers[0]
	for _, d := range []struct{ ns, dev string }{{c0.NetNS, "eth0"}, {h.NetNS, h.VXLAN}} {
		err := netnsx.DoSysfs(d.ns, func() error {
			return os.WriteFile("/sys/class/net/"+d.dev+"/threaded", []byte("1"), 0)
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	// A port range of the namespace's own, which the VXLAN device (with
	// no srcport range) picks its UDP source ports from.
	if err := nsx.Do(h.NetNS, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("40000 50000"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Discover(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(topo, "", "  ")
	t.Logf("%s", b)

	if topo.Kind != topology.Docker {
		t.Errorf("kind %q, want docker", topo.Kind)
	}
	if len(topo.VXLANs) != 1 {
		t.Fatalf("found %d vxlans, want 1", len(topo.VXLANs))
	}
	vx := topo.VXLANs[0]
	if vx.Name != h.VXLAN || vx.VNI != 42 || vx.Port != 4789 || vx.L3 || vx.Master != h.Bridge || vx.Learning {
		t.Errorf("vxlan %+v: want %s vni 42 port 4789 l2 on %s without learning", vx, h.VXLAN, h.Bridge)
	}
	if vx.SrcPorts != [2]int{40000, 50000} {
		t.Errorf("vxlan source ports %v, want its namespace's ip_local_port_range 40000..50000", vx.SrcPorts)
	}
	if vx.Underlay != h.Underlay || vx.UnderlayNetNS != h.NetNS {
		t.Errorf("vxlan underlay %q in %q (found by %q), want %q in %q", vx.Underlay, vx.UnderlayNetNS, vx.How, h.Underlay, h.NetNS)
	}
	if vx.UnderlayNetfilter != nil {
		t.Errorf("underlay netfilter %+v for an underlay in the device's own namespace, want nil (Topology.Netfilter)", vx.UnderlayNetfilter)
	}
	if len(topo.Underlays) != 1 || topo.Underlays[0].Name != h.Underlay {
		t.Errorf("underlays %+v, want [%s]", topo.Underlays, h.Underlay)
	}
	if len(topo.Bridges) != 1 || topo.Bridges[0].Name != h.Bridge {
		t.Fatalf("bridges %+v, want [%s]", topo.Bridges, h.Bridge)
	}
	ports := topo.Bridges[0].Ports
	want := []string{h.VXLAN}
	for _, c := range h.Containers {
		want = append(want, c.HostVeth)
	}
	slices.Sort(ports)
	slices.Sort(want)
	if !slices.Equal(ports, want) {
		t.Errorf("bridge ports %v, want %v", ports, want)
	}
	checkContainers(t, topo, h)
	if len(vx.NAPIThreads) == 0 || !vx.NAPIByName {
		t.Errorf("vxlan NAPI threads %+v (by name %v), want its GRO cell threads by name", vx.NAPIThreads, vx.NAPIByName)
	}
	eth0 := topo.Containers[0].Interfaces[0]
	if eth0.Threaded != "1" || len(eth0.NAPIThreads) != 1 || eth0.NAPIByName {
		t.Errorf("container eth0 threaded %q threads %+v (by name %v), want one thread by pid", eth0.Threaded, eth0.NAPIThreads, eth0.NAPIByName)
	}
	for _, d := range topo.AllDevices() {
		if len(d.RxQueues) == 0 {
			t.Errorf("device %s in %s: no rx queues", d.Name, d.NetNS)
		}
	}
	// The netdev NAPI query must work every time (a malformed request
	// once failed it at random, silently degrading to name matching).
	for range 20 {
		again, err := topology.Discover(h.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range again.Notes {
			if strings.Contains(n, "NAPI threads matched by name:") {
				t.Fatalf("NAPI query failed: %s", n)
			}
		}
	}

	// DiscoverPath reads the same path, and leaves out only what it says.
	// An RPS mask on a queue, so that setting has something to leave out.
	err = netnsx.DoSysfs(h.NetNS, func() error {
		return os.WriteFile("/sys/class/net/"+h.VXLAN+"/queues/rx-0/rps_cpus", []byte("1"), 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	full, err := topology.Discover(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	path, err := topology.DiscoverPath(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range full.AllDevices() {
		d.Threaded, d.NAPIThreads, d.NAPIByName, d.IRQs = "", nil, false, nil
		d.MaxRxQueues, d.MaxTxQueues, d.XPS, d.UDPGRO, d.FeaturesUnread, d.XDPTarget = 0, 0, false, nil, "", false
		for i := range d.RxQueues {
			d.RxQueues[i] = topology.RxQueue{Index: d.RxQueues[i].Index, RPS: []int{}}
		}
	}
	full.Notes = slices.DeleteFunc(full.Notes, func(n string) bool { return strings.Contains(n, "NAPI threads") })
	fb, _ := json.MarshalIndent(full, "", "  ")
	pb, _ := json.MarshalIndent(path, "", "  ")
	if string(fb) != string(pb) {
		t.Errorf("DiscoverPath:\n%s\nwant Discover without the placement fields:\n%s", pb, fb)
	}
}

func TestDiscoverFlannel(t *testing.T) {
	f := topotest.New(t, topotest.Options{Layout: topotest.Flannel, Containers: 1})
	h := f.Hosts[0]
	topo, err := topology.Discover(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	if topo.Kind != topology.Flannel {
		t.Errorf("kind %q, want flannel", topo.Kind)
	}
	vx := topo.VXLANs[0]
	if !vx.L3 || vx.Dev != h.Underlay || vx.How != "dev" || vx.Local.String() != h.UnderIP.String() {
		t.Errorf("vxlan %+v: want l3 with dev %s local %s", vx, h.Underlay, h.UnderIP)
	}
	checkContainers(t, topo, h)
}

func checkContainers(t *testing.T, topo *topology.Topology, h topotest.Host) {
	t.Helper()
	if len(topo.Veths) != len(h.Containers) {
		t.Errorf("found %d veths, want %d", len(topo.Veths), len(h.Containers))
	}
	if len(topo.Containers) != len(h.Containers) {
		t.Fatalf("found %d containers, want %d", len(topo.Containers), len(h.Containers))
	}
	for i, c := range h.Containers {
		v := topo.Veths[i]
		if v.Name != c.HostVeth || v.PeerNetNS != c.NetNS || v.PeerName != c.Veth || v.Master != h.Bridge {
			t.Errorf("veth %+v: want %s on %s, peer %s in %s", v, c.HostVeth, h.Bridge, c.Veth, c.NetNS)
		}
		tc := topo.Containers[i]
		if tc.NetNS != c.NetNS || len(tc.Interfaces) != 1 {
			t.Errorf("container %+v: want %s with one interface", tc, c.NetNS)
			continue
		}
		ifc := tc.Interfaces[0]
		if ifc.Name != c.Veth || ifc.HostVeth != c.HostVeth || len(ifc.Addrs) == 0 || ifc.Addrs[0].Addr().String() != c.IP.String() {
			t.Errorf("container interface %+v: want %s (%s) peered with %s", ifc, c.Veth, c.IP, c.HostVeth)
		}
	}
}

func TestDiscoverNoOverlay(t *testing.T) {
	testenv.Root(t)
	ns := topotest.Namespace(t, topotest.NewPrefix()+"-empty")
	_, err := topology.Discover(ns)
	if !errors.Is(err, topology.ErrNoOverlay) {
		t.Fatalf("got %v, want ErrNoOverlay", err)
	}
	if !strings.Contains(err.Error(), "no VXLAN overlay found in netns "+ns+": lanes needs a VXLAN device") {
		t.Errorf("message %q", err)
	}
}

func TestDiscoverMissingNetNS(t *testing.T) {
	testenv.Root(t)
	if _, err := topology.Discover("lanes-does-not-exist"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("got %v, want a does-not-exist error", err)
	}
}

// A container namespace that has no name (only a process holds it, as with
// many runtimes) is found through /proc and reported as pid:N@COOKIE.
func TestDiscoverUnnamedPeer(t *testing.T) {
	f := topotest.New(t, topotest.Options{Containers: 1})
	h := f.Hosts[0]
	c := h.Containers[0]
	cmd := exec.Command("sleep", "600")
	if err := nsx.Start(c.NetNS, cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := nsx.Delete(c.NetNS); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Discover(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	// With its namespace's cookie, so a reused PID is told apart.
	want, err := netnsx.Pin("pid:" + strconv.Itoa(cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(want, "@") {
		t.Fatalf("Pin gave %q, want pid:N@COOKIE", want)
	}
	if len(topo.Veths) != 1 || topo.Veths[0].PeerNetNS != want {
		t.Fatalf("veths %+v, want one with peer in %s", topo.Veths, want)
	}
	if len(topo.Containers) != 1 || topo.Containers[0].NetNS != want ||
		len(topo.Containers[0].Interfaces) != 1 || topo.Containers[0].Interfaces[0].HostVeth != c.HostVeth {
		t.Errorf("containers %+v, want %s with eth0 peered with %s", topo.Containers, want, c.HostVeth)
	}
}

// Docker creates the VXLAN device in the host namespace and moves it into an
// overlay namespace with the bridge; its socket and underlay stay behind.
func TestDiscoverMovedVXLAN(t *testing.T) {
	f := topotest.New(t, topotest.Options{Containers: 1})
	h := f.Hosts[1]
	ov := topotest.Namespace(t, f.Prefix+"-ov")
	hn, err := netns.GetFromName(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer hn.Close()
	on, err := netns.GetFromName(ov)
	if err != nil {
		t.Fatal(err)
	}
	defer on.Close()
	hh, err := netlink.NewHandleAt(hn, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	oh, err := netlink.NewHandleAt(on, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer oh.Close()
	vx, err := hh.LinkByName(h.VXLAN)
	if err != nil {
		t.Fatal(err)
	}
	if err := hh.LinkSetNsFd(vx, int(on)); err != nil {
		t.Fatal(err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := oh.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	vx, err = oh.LinkByName(h.VXLAN)
	if err != nil {
		t.Fatal(err)
	}
	if err := oh.LinkSetMaster(vx, br); err != nil {
		t.Fatal(err)
	}

	// The encapsulated datagrams pass the underlay namespace's netfilter,
	// not the overlay namespace's: discovery reports both. (The table
	// goes with the namespace.)
	if out, err := exec.Command("nsenter", "--net="+nsx.Path(h.NetNS), "nft", "add", "table", "inet", "lanes_moved_test").CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}

	topo, err := topology.Discover(ov)
	if err != nil {
		t.Fatal(err)
	}
	v := topo.VXLANs[0]
	if v.UnderlayNetNS != h.NetNS || v.Underlay != h.Underlay {
		t.Errorf("underlay %q in %q (%s), want %q in %q", v.Underlay, v.UnderlayNetNS, v.How, h.Underlay, h.NetNS)
	}
	if nf := v.UnderlayNetfilter; nf == nil || !slices.Contains(nf.NFTables, "inet lanes_moved_test") {
		t.Errorf("underlay netfilter %+v, want the underlay namespace's table inet lanes_moved_test", nf)
	}
	if slices.Contains(topo.Netfilter.NFTables, "inet lanes_moved_test") {
		t.Errorf("overlay namespace's netfilter %+v has the underlay namespace's table", topo.Netfilter)
	}
	if topo.Kind != topology.Docker || len(topo.Underlays) != 1 || topo.Underlays[0].NetNS != h.NetNS {
		t.Errorf("kind %s underlays %+v", topo.Kind, topo.Underlays)
	}
}

// TestDiscoverCalico discovers the receiver of the testbed's Calico layout:
// a routed VXLAN device and a routed veth per pod, no bridge.
func TestDiscoverCalico(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Calico)
	h := tb.Receiver()
	topo, err := topology.Discover(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	if topo.Kind != topology.Routed {
		t.Errorf("kind %q, want routed", topo.Kind)
	}
	if len(topo.Bridges) != 0 {
		t.Errorf("bridges %+v, want none", topo.Bridges)
	}
	if len(topo.VXLANs) != 1 {
		t.Fatalf("vxlans %+v, want one", topo.VXLANs)
	}
	vx := topo.VXLANs[0]
	if vx.Name != h.VXLAN || !vx.L3 || vx.Master != "" || vx.Underlay != h.Underlay || !slices.Contains(vx.Addrs, h.VTEPAddr) {
		t.Errorf("vxlan %+v: want l3 %s on %s with %s", vx, h.VXLAN, h.Underlay, h.VTEPAddr)
	}
	if len(topo.Veths) != len(h.Containers) || len(topo.Containers) != len(h.Containers) {
		t.Fatalf("veths %+v, containers %+v: want %d of each", topo.Veths, topo.Containers, len(h.Containers))
	}
	for i, c := range h.Containers {
		v := topo.Veths[i]
		if v.Name != c.HostVeth || v.Master != "" || v.PeerNetNS != c.NetNS || v.PeerName != c.Veth {
			t.Errorf("veth %+v: want %s, no master, peer %s in %s", v, c.HostVeth, c.Veth, c.NetNS)
		}
		ifc := topo.Containers[i].Interfaces
		if len(ifc) != 1 || ifc[0].HostVeth != c.HostVeth || !slices.Contains(ifc[0].Addrs, c.Addr) {
			t.Errorf("container %s: interfaces %+v, want %s with %s", c.NetNS, ifc, c.Veth, c.Addr)
		}
	}
}
