package topology

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/lanesnet/lanes/internal/napi"
	"github.com/vishvananda/netlink"
)

// fakeTree builds files (path -> content) and symlinks (path -> target,
// relative to the link's directory) under a temporary root and points
// irqRoot there for the test.
func fakeTree(t *testing.T, files, links map[string]string) {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for p, target := range links {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, full); err != nil {
			t.Fatal(err)
		}
	}
	old := irqRoot
	irqRoot = root
	t.Cleanup(func() { irqRoot = old })
}

const fakeInterrupts = `           CPU0       CPU1       CPU2       CPU3
 11:          0          0          0          5 IO-APIC  11-fasteoi   eth2
 12:          0          0          9          0 IO-APIC  12-fasteoi   eth3, uhci_hcd:usb1
 37:          0          0          0          0 PCI-MSIX-0000:00:03.0   0-edge      virtio2-config
 38:          0       2106          0          0 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0
 39:       1860          0          0          0 PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0
 40:          0          0     900000          0 PCI-MSIX-0000:00:03.0   3-edge      virtio2-input.1
 41:          0          0          0          7 PCI-MSIX-0000:00:03.0   4-edge      virtio2-output.1
 60:          0          0          0          0 IR-PCI-MSIX-0000:08:00.0   0-edge      eth1
 61:     100000          0          0          0 IR-PCI-MSIX-0000:08:00.0   1-edge      eth1-TxRx-0
 62:          0     100000          0          0 IR-PCI-MSIX-0000:08:00.0   2-edge      eth1-TxRx-1
NMI:          0          0          0          0   Non-maskable interrupts
`

// A virtio NIC (its vectors on the PCI function above the virtio device),
// a PCI NIC with combined queues, a legacy line, and a veth: the vectors
// are found on the right bus device, the receive ones by name, and where
// they are delivered by effective affinity, else by the affinity list.
func TestBusIRQs(t *testing.T) {
	files := map[string]string{
		"proc/interrupts": fakeInterrupts,
		"sys/devices/pci0/0000:00:03.0/virtio2/uevent": "DRIVER=virtio_net\n",
		"sys/bus/virtio/uevent":                        "",
		"sys/bus/pci/uevent":                           "",
		"sys/devices/pci0/0000:08:00.0/uevent":         "DRIVER=ixgbe\n",
		"sys/devices/pci0/0000:09:00.0/irq":            "11\n",
		"sys/devices/pci0/0000:0a:00.0/irq":            "12\n",
		"sys/devices/virtual/net/veth0/uevent":         "",
	}
	for _, n := range []int{37, 38, 39, 40, 41} {
		files["sys/devices/pci0/0000:00:03.0/msi_irqs/"+strconv.Itoa(n)] = "msix"
	}
	for _, n := range []int{60, 61, 62} {
		files["sys/devices/pci0/0000:08:00.0/msi_irqs/"+strconv.Itoa(n)] = "msix"
	}
	aff := map[int][2]string{ // effective, smp
		37: {"0", "0-3"}, 38: {"1", "0-3"}, 39: {"0", "0-3"}, 40: {"", "2"}, 41: {"3", "0-3"},
		60: {"0", "0"}, 61: {"0", "0-3"}, 62: {"1", "0-3"}, 11: {"3", "3"}, 12: {"2", "2"},
	}
	for n, a := range aff {
		dir := "proc/irq/" + strconv.Itoa(n) + "/"
		if a[0] != "" {
			files[dir+"effective_affinity_list"] = a[0] + "\n"
		}
		files[dir+"smp_affinity_list"] = a[1] + "\n"
	}
	links := map[string]string{
		"sys/class/net/eth0/device":                       "../../../devices/pci0/0000:00:03.0/virtio2",
		"sys/devices/pci0/0000:00:03.0/virtio2/subsystem": "../../../../bus/virtio",
		"sys/class/net/eth1/device":                       "../../../devices/pci0/0000:08:00.0",
		"sys/devices/pci0/0000:08:00.0/subsystem":         "../../../bus/pci",
		"sys/class/net/eth2/device":                       "../../../devices/pci0/0000:09:00.0",
		"sys/class/net/eth3/device":                       "../../../devices/pci0/0000:0a:00.0",
		"sys/class/net/veth0":                             "../../devices/virtual/net/veth0",
	}
	fakeTree(t, files, links)

	for _, tc := range []struct {
		dev      string
		irqs     []int
		received []int // the IRQs counted as receive
		rxCPUs   []int
	}{
		{"eth0", []int{37, 38, 39, 40, 41}, []int{38, 40}, []int{1, 2}},
		{"eth1", []int{60, 61, 62}, []int{61, 62}, []int{0, 1}},
		{"eth2", []int{11}, []int{11}, []int{3}}, // one vector, named after the device
		// A legacy line shared with a USB controller, named after
		// both handlers: the device's only line, so its receive one
		// (the old parser named it "uhci_hcd:usb1" alone).
		{"eth3", []int{12}, []int{12}, []int{2}},
		{"veth0", nil, nil, nil},
	} {
		nums := busIRQs(filepath.Join(irqRoot, "sys"), tc.dev)
		if !slices.Equal(nums, tc.irqs) {
			t.Errorf("%s: IRQs %v, want %v", tc.dev, nums, tc.irqs)
			continue
		}
		d := Device{Name: tc.dev, IRQs: describeIRQs(irqScan{nums: nums})}
		var rx []int
		for _, q := range d.IRQs {
			if q.Receive {
				rx = append(rx, q.IRQ)
			}
		}
		if !slices.Equal(rx, tc.received) {
			t.Errorf("%s: receive IRQs %v, want %v (%+v)", tc.dev, rx, tc.received, d.IRQs)
		}
		if got := d.ReceiveIRQCPUs(); !slices.Equal(got, tc.rxCPUs) {
			t.Errorf("%s: receive IRQ cores %v, want %v (%+v)", tc.dev, got, tc.rxCPUs, d.IRQs)
		}
	}
	if names := interruptNames(); names[12] != "eth3, uhci_hcd:usb1" {
		t.Errorf("shared line 12 named %q, want both handlers", names[12])
	}
	// IRQs a driver gives its receive NAPI instances are receive ones,
	// whatever their names.
	for _, q := range describeIRQs(irqScan{nums: []int{60}, fromNAPI: true}) {
		if !q.Receive || q.Name != "eth1" {
			t.Errorf("IRQ from a receive NAPI instance: %+v", q)
		}
	}
}

// An interrupt that may be delivered to several cores gives no single
// poll core: the NIC's IRQ core is then unknown.
func TestReceiveIRQCPUsSpread(t *testing.T) {
	d := Device{IRQs: []IRQ{{IRQ: 1, Name: "eth0-rx-0", CPUs: []int{0}, Receive: true}, {IRQ: 2, Name: "eth0-rx-1", CPUs: []int{0, 1}, Receive: true}}}
	if got := d.ReceiveIRQCPUs(); got != nil {
		t.Errorf("receive IRQ cores %v, want unknown (nil)", got)
	}
}

// The vectors of common drivers, as /proc/interrupts names them, and
// which of them serve receive queues.
func TestClassifyIRQs(t *testing.T) {
	for _, tc := range []struct {
		driver string
		names  []string
		rx     []string
	}{
		{"virtio_net", []string{"virtio2-config", "virtio2-input.0", "virtio2-output.0", "virtio2-input.1", "virtio2-output.1"}, []string{"virtio2-input.0", "virtio2-input.1"}},
		{"virtio_net, one shared vector", []string{"virtio2-config", "virtio2-virtqueues"}, []string{"virtio2-virtqueues"}},
		{"ixgbe", []string{"eth1", "eth1-TxRx-0", "eth1-TxRx-1"}, []string{"eth1-TxRx-0", "eth1-TxRx-1"}},
		{"i40e", []string{"i40e-0000:3b:00.0:misc", "i40e-eth0-TxRx-0"}, []string{"i40e-eth0-TxRx-0"}},
		{"ice", []string{"ice-0000:17:00.0:misc", "ice-eth0-TxRx-0", "ice-eth0-TxRx-1"}, []string{"ice-eth0-TxRx-0", "ice-eth0-TxRx-1"}},
		{"mlx5", []string{"mlx5_async0@pci:0000:08:00.0", "mlx5_comp0@pci:0000:08:00.0", "mlx5_comp1@pci:0000:08:00.0"}, []string{"mlx5_comp0@pci:0000:08:00.0", "mlx5_comp1@pci:0000:08:00.0"}},
		{"ena", []string{"ena-mgmnt@pci:0000:00:05.0", "eth0-Tx-Rx-0", "eth0-Tx-Rx-1"}, []string{"eth0-Tx-Rx-0", "eth0-Tx-Rx-1"}},
		{"e1000e MSI-X", []string{"eth0-rx-0", "eth0-tx-0", "eth0"}, []string{"eth0-rx-0"}},
		{"e1000e MSI, igb single vector", []string{"eno1"}, []string{"eno1"}},
		{"bnxt", []string{"eth0-TxRx-0", "eth0-TxRx-1"}, []string{"eth0-TxRx-0", "eth0-TxRx-1"}},
		{"sfc", []string{"eth0-0", "eth0-1"}, []string{"eth0-0", "eth0-1"}},
		{"unnamed", []string{""}, nil},
		{"a shared line whatever its other handlers", []string{"uhci_hcd:usb1, eth0-tx"}, []string{"uhci_hcd:usb1, eth0-tx"}},
		{"a lone management vector (ena while down)", []string{"ena-mgmnt@pci:0000:00:05.0"}, nil},
	} {
		irqs := make([]IRQ, len(tc.names))
		for i, n := range tc.names {
			irqs[i] = IRQ{IRQ: i, Name: n}
		}
		classifyIRQs(irqs)
		var rx []string
		for _, q := range irqs {
			if q.Receive {
				rx = append(rx, q.Name)
			}
		}
		if !slices.Equal(rx, tc.rx) {
			t.Errorf("%s: receive vectors %q, want %q", tc.driver, rx, tc.rx)
		}
	}
}

// On the machine the tests run on: every NIC with a bus device has its
// interrupts found, each with a name and a core, as /proc shows them.
func TestHostNICIRQs(t *testing.T) {
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		t.Skip(err)
	}
	found := false
	for _, e := range ents {
		nums := busIRQs("/sys", e.Name())
		if len(nums) == 0 {
			continue
		}
		irqs := describeIRQs(irqScan{nums: nums})
		t.Logf("%s: %+v", e.Name(), irqs)
		for _, q := range irqs {
			found = true
			// A vector /proc/interrupts does not list (no handler
			// requested it) has no name; a receive one must have a
			// name and a core.
			if q.Receive && (q.Name == "" || len(q.CPUs) == 0) {
				t.Errorf("%s: receive IRQ %+v has no name or no core", e.Name(), q)
			}
		}
		if !slices.ContainsFunc(irqs, func(q IRQ) bool { return q.Receive }) {
			t.Errorf("%s: no receive vector among %+v", e.Name(), irqs)
		}
	}
	if !found {
		t.Skip("no NIC with interrupts on this machine")
	}
}

// Only a device with a bus device or NAPI instances with an IRQ is looked
// at for interrupts: a veth is not.
func TestMayHaveIRQs(t *testing.T) {
	link := func(idx int, bus string) netlink.Link {
		return &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: idx, ParentDevBus: bus}}
	}
	inst := []napi.Instance{{ID: 1, IfIndex: 7, IRQ: 40}, {ID: 2, IfIndex: 8}}
	for _, tc := range []struct {
		name string
		l    netlink.Link
		want bool
	}{
		{"PCI NIC", link(3, "pci"), true},
		{"virtio NIC", link(3, "virtio"), true},
		{"NAPI with an IRQ, no bus named", link(7, ""), true},
		{"NAPI without an IRQ (veth)", link(8, ""), false},
		{"nothing", link(9, ""), false},
	} {
		if got := mayHaveIRQs(tc.l, inst); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
