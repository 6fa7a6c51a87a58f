package topology_test

import (
	"errors"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
)

// Discovery reports what lies on the bridged path: forwarding entries,
// port states, root qdiscs and netfilter tables, each as the kernel has
// them, and the state of a fresh namespace as "nothing there".
func TestDiscoverPath(t *testing.T) {
	testenv.Root(t)
	f := topotest.New(t, topotest.Options{Containers: 1})
	h := f.Hosts[1]
	c := h.Containers[0]
	mac := net.HardwareAddr{0x02, 0x1a, 0x4e, 0x77, 0x00, 0x01}
	err := nsx.Do(h.NetNS, func() error {
		l, err := netlink.LinkByName(c.HostVeth)
		if err != nil {
			return err
		}
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE,
			Flags: netlink.NTF_MASTER, State: netlink.NUD_NOARP, HardwareAddr: mac})
	})
	if err != nil {
		t.Fatal(err)
	}

	topo := discover(t, h.NetNS)
	if !topo.Netfilter.None() {
		t.Errorf("netfilter in a fresh namespace: %+v", topo.Netfilter)
	}
	if len(topo.Bridges) != 1 {
		t.Fatalf("bridges %+v", topo.Bridges)
	}
	br := topo.Bridges[0]
	if br.VLANFiltering || len(br.PortInfo) != len(br.Ports) {
		t.Errorf("bridge %s: vlan filtering %v, port info %+v for ports %v", br.Name, br.VLANFiltering, br.PortInfo, br.Ports)
	}
	for _, p := range br.PortInfo {
		if p.State != "forwarding" || p.Isolated || p.Locked {
			t.Errorf("port %+v, want plain forwarding", p)
		}
	}
	if !slices.Contains(br.FDB, topology.FDBEntry{MAC: mac.String(), Port: c.HostVeth, Static: true}) {
		t.Errorf("static entry %s on %s missing from %+v", mac, c.HostVeth, br.FDB)
	}
	for _, e := range br.FDB {
		if e.Port == br.Name {
			t.Errorf("entry for the bridge itself listed as a port's: %+v", e)
		}
	}
	veth := vethOf(t, topo, c.HostVeth)
	if veth.Hooks != nil {
		t.Errorf("hooks on a fresh veth: %+v", veth.Hooks)
	}
	if veth.MAC == "" || veth.TxQueues < 1 {
		t.Errorf("veth %s: MAC %q, %d tx queues", veth.Name, veth.MAC, veth.TxQueues)
	}
	// topotest turns GRO on at both ends: the host-side veth takes
	// redirected frames.
	if !veth.XDPTarget || !topo.Containers[0].Interfaces[0].GRO {
		t.Errorf("veth %s: xdp target %v, container GRO %v; want both", veth.Name, veth.XDPTarget, topo.Containers[0].Interfaces[0].GRO)
	}

	// A shaping qdisc on the veth, an nftables table and a legacy
	// iptables table: each shows.
	if out, err := exec.Command("nsenter", "--net="+nsx.Path(h.NetNS), "nft", "add", "table", "inet", "lanes_test").CombinedOutput(); err != nil {
		if strings.Contains(string(out), "Operation not supported") {
			t.Skipf("this kernel has no nftables inet tables: %s", out)
		}
		t.Fatalf("nft add table: %v: %s", err, out)
	}
	err = nsx.Do(h.NetNS, func() error {
		l, err := netlink.LinkByName(c.HostVeth)
		if err != nil {
			return err
		}
		q := &netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
			Rate: 1 << 30, Limit: 1 << 20, Buffer: 1 << 16}
		if err := netlink.QdiscAdd(q); err != nil {
			return err
		}
		return touchIPTable("filter")
	})
	// A kernel with legacy iptables as a module that nobody loaded (a
	// Debian kernel in a harness guest) has no IPT_SO_GET_INFO: no legacy
	// table can exist there, and the check of one is left out.
	legacy := true
	if errors.Is(err, unix.ENOPROTOOPT) {
		t.Logf("no legacy iptables here (ip_tables not loaded): the legacy table is not checked")
		legacy, err = false, nil
	}
	if err != nil {
		t.Fatal(err)
	}
	topo = discover(t, h.NetNS)
	if got := topo.Netfilter; !slices.Contains(got.NFTables, "inet lanes_test") || legacy && !slices.Contains(got.IPTables, "filter") || got.None() {
		t.Errorf("netfilter %+v, want the inet table and (legacy iptables: %v) the legacy filter table", got, legacy)
	}
	if h := vethOf(t, topo, c.HostVeth).Hooks; h == nil || !slices.Contains(h.Egress, "qdisc:tbf") {
		t.Errorf("hooks %+v, want the tbf qdisc on egress", h)
	}
}

func discover(t *testing.T, ns string) *topology.Topology {
	t.Helper()
	topo, err := topology.Discover(ns)
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

func vethOf(t *testing.T, topo *topology.Topology, name string) topology.Veth {
	t.Helper()
	for _, v := range topo.Veths {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("veth %s not discovered", name)
	return topology.Veth{}
}

// touchIPTable instantiates a legacy iptables table in the calling
// thread's namespace, as any `iptables -t NAME -L` would: asking for its
// info loads it (IPT_SO_GET_INFO).
func touchIPTable(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	const iptSoGetInfo = 64
	var info [84]byte // struct ipt_getinfo: name[32], valid_hooks, hook_entry[5], underflow[5], num_entries, size
	copy(info[:], name)
	l := uint32(len(info))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_IP, iptSoGetInfo, uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}
