package topology

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/napi"
)

// IRQ is one interrupt of a NIC: where the kernel delivers it is where
// the NIC's poll runs when its NAPI is not threaded (the driver schedules
// NAPI from the interrupt handler, as a softirq of that core).
type IRQ struct {
	IRQ int `json:"irq"`
	// Name is the handler's name in /proc/interrupts ("eth0-TxRx-0",
	// "virtio2-input.0", "mlx5_comp0@pci:0000:08:00.0").
	Name string `json:"name"`
	// CPUs is where it is delivered: /proc/irq/N/effective_affinity_list,
	// or smp_affinity_list where the kernel has no effective affinity.
	CPUs []int `json:"cpus"`
	// Receive: the name does not say transmit-only or control
	// (isReceiveIRQ).
	Receive bool `json:"receive"`
}

// irqRoot is where sysfs and procfs are read from; tests point it at a
// fake tree.
var irqRoot = "/"

// deviceIRQs finds the interrupts of device dev, read in its namespace
// ns. ifindex and ns name the device for the netdev family, whose NAPI instances
// carry their IRQ where the driver reports it (netif_napi_set_irq); other
// drivers' interrupts are found from the bus device's MSI vectors, or its
// one legacy line. A device with none (veth, bridge, VXLAN) has none.
func deviceIRQs(ns string, ifindex int, dev string) []IRQ {
	var nums []int
	if inst, err := napi.List(ns, ifindex); err == nil {
		for _, in := range inst {
			if in.IRQ > 0 && !slices.Contains(nums, in.IRQ) {
				nums = append(nums, in.IRQ)
			}
		}
	}
	fromNAPI := len(nums) > 0
	if !fromNAPI {
		// The device's sysfs entry is only visible from its namespace.
		knobs.DoSysfs(ns, func() error {
			nums = busIRQs(dev)
			return nil
		})
	}
	if len(nums) == 0 {
		return nil
	}
	names := interruptNames()
	var out []IRQ
	for _, n := range nums {
		q := IRQ{IRQ: n, Name: names[n], CPUs: irqCPUs(n)}
		// An interrupt a NAPI instance names polls receive queues.
		q.Receive = fromNAPI || isReceiveIRQ(q.Name)
		out = append(out, q)
	}
	slices.SortFunc(out, func(a, b IRQ) int { return a.IRQ - b.IRQ })
	return out
}

// busIRQs lists the MSI vectors of the bus device behind dev, or of its
// parent (a virtio NIC's vectors belong to the PCI function it sits on),
// else its legacy interrupt line.
func busIRQs(dev string) []int {
	// device is a link into the bus's tree; its parent is found there.
	devDir, err := filepath.EvalSymlinks(filepath.Join(irqRoot, "sys/class/net", dev, "device"))
	if err != nil {
		return nil
	}
	for _, dir := range []string{devDir, filepath.Dir(devDir)} {
		ents, err := os.ReadDir(filepath.Join(dir, "msi_irqs"))
		if err != nil || len(ents) == 0 {
			continue
		}
		var out []int
		for _, e := range ents {
			if n, err := strconv.Atoi(e.Name()); err == nil {
				out = append(out, n)
			}
		}
		slices.Sort(out)
		return out
	}
	if b, err := os.ReadFile(filepath.Join(devDir, "irq")); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			return []int{n}
		}
	}
	return nil
}

// interruptNames maps each interrupt number to its handlers' name, the
// last column of /proc/interrupts.
func interruptNames() map[int]string {
	f, err := os.Open(filepath.Join(irqRoot, "proc/interrupts"))
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[int]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		num, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(num))
		if err != nil {
			continue // NMI, LOC, ...
		}
		if fs := strings.Fields(rest); len(fs) > 0 {
			out[n] = fs[len(fs)-1]
		}
	}
	return out
}

// irqCPUs reads where interrupt n is delivered.
func irqCPUs(n int) []int {
	dir := filepath.Join(irqRoot, "proc/irq", strconv.Itoa(n))
	for _, f := range []string{"effective_affinity_list", "smp_affinity_list"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		if cpus, err := knobs.ParseCPUList(strings.TrimSpace(string(b))); err == nil && len(cpus) > 0 {
			return cpus
		}
	}
	return nil
}

// notReceive matches the handler names of interrupts that serve no
// receive queue: configuration and control vectors (virtio's "-config",
// mlx5's "_async", ena's "mgmnt", ice's "-misc"), and transmit-only
// ones (virtio's "-output.N", "eth0-tx-0").
var notReceive = regexp.MustCompile(`(?i)(config|output|async|ctrl|cmd|mbx|mgmt|mgmnt|misc|event|adminq|fw|inflate|deflate|stats|reporting)`)

var (
	mentionsTx = regexp.MustCompile(`(?i)tx`)
	mentionsRx = regexp.MustCompile(`(?i)rx|input`)
	// queueVector names a vector that serves queues: receive or combined
	// by name, or numbered ("eth0-3", tg3's and sfc's channels). A
	// driver's vector named after the device alone ("eth1": ixgbe's
	// link and mailbox causes) serves none.
	queueVector = regexp.MustCompile(`(?i)rx|input|comp|ntfy|-io-|-fp-|-\d+(@|$)`)
)

// isReceiveIRQ says whether an interrupt's name may belong to a receive
// queue: a combined one ("TxRx", mlx5's "comp", "ena-io-0") or a
// receive-only one ("rx", virtio's "input"), not a control, transmit-only
// or unnamed one.
func isReceiveIRQ(name string) bool {
	switch {
	case name == "", notReceive.MatchString(name):
		return false
	case mentionsTx.MatchString(name) && !mentionsRx.MatchString(name):
		return false
	}
	return queueVector.MatchString(name)
}

// ReceiveIRQCPUs is where d's receive interrupts are delivered, when
// each is delivered to one core; nil when d has none or one may go to
// several cores.
func (d *Device) ReceiveIRQCPUs() []int {
	var out []int
	for _, q := range d.IRQs {
		if !q.Receive {
			continue
		}
		if len(q.CPUs) != 1 {
			return nil
		}
		if !slices.Contains(out, q.CPUs[0]) {
			out = append(out, q.CPUs[0])
		}
	}
	slices.Sort(out)
	return out
}
