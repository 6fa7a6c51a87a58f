package topology

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// writeTree writes files (path -> content) under a temporary root and
// points irqRoot there for the test.
func writeTree(t *testing.T, files map[string]string) {
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
	old := irqRoot
	irqRoot = root
	t.Cleanup(func() { irqRoot = old })
}

const fakeInterrupts = `           CPU0       CPU1       CPU2       CPU3
 37:          0          0          0          0 PCI-MSIX-0000:00:03.0   0-edge      virtio2-config
 38:          0       2106          0          0 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0
 39:       1860          0          0          0 PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0
 40:          0          0     900000          0 PCI-MSIX-0000:00:03.0   3-edge      virtio2-input.1
 41:          0          0          0          7 PCI-MSIX-0000:00:03.0   4-edge      virtio2-output.1
 60:          0          0          0          0 IR-PCI-MSIX-0000:08:00.0   0-edge      eth1
 61:     100000          0          0          0 IR-PCI-MSIX-0000:08:00.0   1-edge      eth1-TxRx-0
 62:          0     100000          0          0 IR-PCI-MSIX-0000:08:00.0   2-edge      eth1-TxRx-1
 63:          0          0          0          0 IR-PCI-MSIX-0000:08:00.0   3-edge      eth1-misc
NMI:          0          0          0          0   Non-maskable interrupts
`

// A virtio NIC (its vectors on the PCI function above the virtio device)
// and a PCI NIC with combined queues: the receive vectors are found by
// name, where they are delivered by effective affinity, else by the
// affinity list.
func TestBusIRQs(t *testing.T) {
	files := map[string]string{
		"proc/interrupts": fakeInterrupts,
		// virtio: /sys/class/net/eth0/device is virtio2, whose parent
		// PCI function holds msi_irqs.
		"sys/class/net/eth0/device/uevent":         "DRIVER=virtio_net\n",
		"sys/class/net/eth0/device/../msi_irqs/37": "msix",
		"sys/class/net/eth0/device/../msi_irqs/38": "msix",
		"sys/class/net/eth0/device/../msi_irqs/39": "msix",
		"sys/class/net/eth0/device/../msi_irqs/40": "msix",
		"sys/class/net/eth0/device/../msi_irqs/41": "msix",
		// A PCI NIC: msi_irqs on the device itself.
		"sys/class/net/eth1/device/msi_irqs/60": "msix",
		"sys/class/net/eth1/device/msi_irqs/61": "msix",
		"sys/class/net/eth1/device/msi_irqs/62": "msix",
		"sys/class/net/eth1/device/msi_irqs/63": "msix",
		// A legacy line.
		"sys/class/net/eth2/device/irq": "11\n",
		// A virtual device has no bus device.
		"sys/class/net/veth0/uevent": "",
	}
	aff := map[int][2]string{ // effective, smp
		37: {"0", "0-3"}, 38: {"1", "0-3"}, 39: {"0", "0-3"}, 40: {"", "2"}, 41: {"3", "0-3"},
		60: {"0", "0"}, 61: {"0", "0-3"}, 62: {"1", "0-3"}, 63: {"0", "0"}, 11: {"3", "3"},
	}
	for n, a := range aff {
		dir := "proc/irq/" + strconv.Itoa(n) + "/"
		if a[0] != "" {
			files[dir+"effective_affinity_list"] = a[0] + "\n"
		}
		files[dir+"smp_affinity_list"] = a[1] + "\n"
	}
	// Paths with ".." are written as the kernel resolves them.
	for p, c := range files {
		if strings.Contains(p, "/../") {
			delete(files, p)
			files[filepath.Clean(p)] = c
		}
	}
	writeTree(t, files)

	for _, tc := range []struct {
		dev      string
		irqs     []int
		rxCPUs   []int
		received []int // the IRQs counted as receive
	}{
		{"eth0", []int{37, 38, 39, 40, 41}, []int{1, 2}, []int{38, 40}},
		{"eth1", []int{60, 61, 62, 63}, []int{0, 1}, []int{61, 62}},
		{"eth2", []int{11}, nil, nil}, // unnamed: not counted
		{"veth0", nil, nil, nil},
	} {
		nums := busIRQs(tc.dev)
		if !slices.Equal(nums, tc.irqs) {
			t.Errorf("%s: IRQs %v, want %v", tc.dev, nums, tc.irqs)
			continue
		}
		names := interruptNames()
		d := Device{Name: tc.dev}
		var rx []int
		for _, n := range nums {
			q := IRQ{IRQ: n, Name: names[n], CPUs: irqCPUs(n), Receive: isReceiveIRQ(names[n])}
			if q.Receive {
				rx = append(rx, n)
			}
			d.IRQs = append(d.IRQs, q)
		}
		if !slices.Equal(rx, tc.received) {
			t.Errorf("%s: receive IRQs %v, want %v (%+v)", tc.dev, rx, tc.received, d.IRQs)
		}
		if got := d.ReceiveIRQCPUs(); !slices.Equal(got, tc.rxCPUs) {
			t.Errorf("%s: receive IRQ cores %v, want %v (%+v)", tc.dev, got, tc.rxCPUs, d.IRQs)
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

func TestIsReceiveIRQ(t *testing.T) {
	for name, want := range map[string]bool{
		"virtio2-input.0":                true,
		"virtio2-output.0":               false,
		"virtio2-config":                 false,
		"eth0-TxRx-3":                    true,
		"i40e-eth0-TxRx-0":               true,
		"eth0-rx-0":                      true,
		"eth0-tx-0":                      false,
		"mlx5_comp5@pci:0000:08:00.0":    true,
		"mlx5_async17@pci:0000:08:00.0":  false,
		"ena-mgmnt@pci:0000:00:05.0":     false,
		"ena-io-0":                       true,
		"ice-eth0-TxRx-0":                true,
		"ice-0000:17:00.0:misc":          false,
		"eth1":                           false,
		"eth0-3":                         true,
		"gve-ntfy-blk0@pci:0000:00:04.0": true,
		"":                               false,
	} {
		if got := isReceiveIRQ(name); got != want {
			t.Errorf("%q: receive %v, want %v", name, got, want)
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
		if _, err := os.Stat(filepath.Join("/sys/class/net", e.Name(), "device")); err != nil {
			continue
		}
		l, err := os.ReadFile(filepath.Join("/sys/class/net", e.Name(), "ifindex"))
		if err != nil {
			continue
		}
		idx, _ := strconv.Atoi(strings.TrimSpace(string(l)))
		irqs := deviceIRQs("", idx, e.Name())
		t.Logf("%s: %+v", e.Name(), irqs)
		for _, q := range irqs {
			found = true
			if q.Name == "" || len(q.CPUs) == 0 {
				t.Errorf("%s: IRQ %+v has no name or no core", e.Name(), q)
			}
		}
	}
	if !found {
		t.Skip("no NIC with interrupts on this machine")
	}
}
