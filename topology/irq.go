package topology

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/napi"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/vishvananda/netlink"
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
	// Receive: it serves a receive queue (classifyIRQs).
	Receive bool `json:"receive"`
}

// irqRoot is where sysfs and procfs are read from; tests point it at a
// fake tree.
var irqRoot = "/"

// irqScan is what a namespace scan found of a device's interrupts.
type irqScan struct {
	nums []int
	// fromNAPI: the numbers are the IRQs the netdev family gives the
	// device's receive NAPI instances, not every vector of its bus device.
	fromNAPI bool
}

// deviceIRQs finds the interrupts of the device dev (ifindex) in
// namespace ns: the IRQs the netdev family gave its NAPI instances (inst,
// dumped in ns) where the driver reports them (netif_napi_set_irq), kept
// to the instances that poll a receive queue where the driver names those
// (netif_queue_set_napi); otherwise the vectors of its bus device, read
// from ns's sysfs. A device with neither (veth, bridge, VXLAN) has none.
// Discovery asks it of the underlays that may have interrupts
// (mayHaveIRQs) only: it costs a sysfs mount, and a queue dump where a
// driver reports IRQs.
func deviceIRQs(ns string, inst []napi.Instance, ifindex int, dev string) irqScan {
	var sc irqScan
	netnsx.SysfsAt(ns, func(sys string) error {
		var own []napi.Instance
		for _, in := range inst {
			if in.IfIndex == ifindex && in.IRQ > 0 {
				own = append(own, in)
			}
		}
		if len(own) > 0 {
			rx, named, qerr := napi.RxNAPIs("")
			for _, in := range own {
				if qerr == nil && named[ifindex] && !rx[in.ID] {
					continue // transmit completions only
				}
				if !slices.Contains(sc.nums, in.IRQ) {
					sc.nums = append(sc.nums, in.IRQ)
				}
			}
		}
		if len(sc.nums) > 0 {
			slices.Sort(sc.nums)
			sc.fromNAPI = true
		} else {
			sc.nums = busIRQs(sys, dev)
		}
		return nil
	})
	return sc
}

// mayHaveIRQs says whether a device can have interrupts of its own: a bus
// device behind it (the kernel names its bus, IFLA_PARENT_DEV_BUS_NAME) or
// NAPI instances with an IRQ. A veth, bridge or VXLAN device has neither,
// and discovery, which agents repeat every round, then skips the sysfs
// mount deviceIRQs costs.
func mayHaveIRQs(l netlink.Link, inst []napi.Instance) bool {
	if l.Attrs().ParentDevBus != "" {
		return true
	}
	return slices.ContainsFunc(inst, func(in napi.Instance) bool { return in.IfIndex == l.Attrs().Index && in.IRQ > 0 })
}

// busIRQs lists the MSI vectors of the bus device behind dev, else its
// legacy interrupt line, from sys (dev's namespace's sysfs). A virtio
// NIC's interrupts belong to the PCI function the virtio device sits on:
// for one, the parent's.
func busIRQs(sys, dev string) []int {
	// device is a link into the bus's tree; its parent is found there.
	devDir, err := sysEval(sys, "class/net/"+dev+"/device")
	if err != nil {
		return nil
	}
	if nums := busVectors(filepath.Join(sys, devDir)); len(nums) > 0 {
		return nums
	}
	if sub, err := sysEval(sys, devDir+"/subsystem"); err == nil && path.Base(sub) == "virtio" {
		return busVectors(filepath.Join(sys, path.Dir(devDir)))
	}
	return nil
}

// sysEval resolves the symbolic links of rel inside root, a sysfs (whose
// links are relative), and returns the path it names relative to root:
// filepath.EvalSymlinks would read root itself, which may be a
// /proc/self/fd link to a detached mount (nsx.SysfsAt).
func sysEval(root, rel string) (string, error) {
	parts := strings.Split(rel, "/")
	cur := ""
	for hops := 0; len(parts) > 0; {
		p := parts[0]
		parts = parts[1:]
		switch p {
		case "", ".":
			continue
		case "..":
			if cur = path.Dir(cur); cur == "." {
				cur = ""
			}
			continue
		}
		next := path.Join(cur, p)
		fi, err := os.Lstat(root + "/" + next)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%s: too many links", rel)
		}
		target, err := os.Readlink(root + "/" + next)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			cur = ""
		}
		parts = append(strings.Split(target, "/"), parts...)
	}
	return cur, nil
}

// busVectors reads a bus device's MSI vectors, else its legacy line.
func busVectors(dir string) []int {
	var out []int
	if ents, err := os.ReadDir(filepath.Join(dir, "msi_irqs")); err == nil {
		for _, e := range ents {
			if n, err := strconv.Atoi(e.Name()); err == nil {
				out = append(out, n)
			}
		}
	}
	if len(out) == 0 {
		if b, err := os.ReadFile(filepath.Join(dir, "irq")); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
				out = append(out, n)
			}
		}
	}
	slices.Sort(out)
	return out
}

// describeIRQs names the interrupts a scan found and says where each is
// delivered and which serve receive queues (/proc is the same in every
// namespace).
func describeIRQs(sc irqScan) []IRQ {
	if len(sc.nums) == 0 {
		return nil
	}
	names := interruptNames()
	out := make([]IRQ, 0, len(sc.nums))
	for _, n := range sc.nums {
		out = append(out, IRQ{IRQ: n, Name: names[n], CPUs: irqCPUs(n)})
	}
	if sc.fromNAPI {
		// The driver said these poll receive queues.
		for i := range out {
			out[i].Receive = true
		}
		return out
	}
	classifyIRQs(out)
	return out
}

// interruptNames maps each interrupt number to its handlers' names, the
// last column of /proc/interrupts: a legacy line shared by several
// devices lists each handler, comma-separated ("uhci_hcd:usb1, eth2"),
// and is named by the list, not by its last handler only (a handler's
// name with a space in it, "PCIe PME", keeps only its last word: a
// label, nothing is decided on it).
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
			i := len(fs) - 1
			for i > 0 && strings.HasSuffix(fs[i-1], ",") {
				i--
			}
			out[n] = strings.Join(fs[i:], " ")
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
		if cpus, err := cpuset.ParseList(strings.TrimSpace(string(b))); err == nil && len(cpus) > 0 {
			return cpus
		}
	}
	return nil
}

var (
	// control matches the handler names of vectors that serve no queue:
	// configuration and control (virtio's "-config", mlx5's "_async",
	// ena's "mgmnt", ice's "misc", mailboxes, admin queues).
	control = regexp.MustCompile(`(?i)(config|async|ctrl|cmd|mbx|mgmt|mgmnt|misc|event|adminq|fw|inflate|deflate|stats|reporting)`)
	// mentionsTx without mentionsRx is a transmit-only queue vector:
	// "eth0-tx-0", virtio's "-output.N" ("TxRx" is combined).
	mentionsTx = regexp.MustCompile(`(?i)tx|output`)
	mentionsRx = regexp.MustCompile(`(?i)rx|input`)
	// namedQueue names a vector that serves receive queues by its name:
	// receive or combined ("rx", "TxRx", ena's "Tx-Rx", virtio's "input"
	// and its one shared "virtqueues" vector, mlx5's "comp", gve's
	// "ntfy-blk" (which may be a transmit block: gve names its queues'
	// NAPI instances, and those are preferred), bnx2x's "fp").
	namedQueue = regexp.MustCompile(`(?i)rx|input|virtqueues|comp|ntfy|-fp-`)
	// numbered is a vector known only by its number ("eth0-3": tg3's and
	// sfc's channels).
	numbered = regexp.MustCompile(`-\d+(@|$)`)
)

// classifyIRQs marks the vectors of one device that serve receive
// queues. A device whose one interrupt is a line shared with other
// devices receives on it, whatever the other handlers' names say.
// Otherwise from their names: those named as receive or combined queues;
// failing any, the numbered ones (sfc's and tg3's channels; tg3's vector
// 0 carries only link events under RSS and is counted too, so its core
// may be one more IRQ core than polls); failing those too, the one vector
// that is neither control nor transmit-only (e1000e, igb and tg3 with a
// single vector name it after the device, "eno1").
func classifyIRQs(irqs []IRQ) {
	if len(irqs) == 1 && strings.Contains(irqs[0].Name, ", ") {
		irqs[0].Receive = true
		return
	}
	isControl := func(name string) bool {
		return name == "" || control.MatchString(name) || (mentionsTx.MatchString(name) && !mentionsRx.MatchString(name))
	}
	mark := func(match func(string) bool) bool {
		any := false
		for i := range irqs {
			if !isControl(irqs[i].Name) && match(irqs[i].Name) {
				irqs[i].Receive, any = true, true
			}
		}
		return any
	}
	if mark(namedQueue.MatchString) || mark(numbered.MatchString) {
		return
	}
	var rest []int
	for i := range irqs {
		if !isControl(irqs[i].Name) {
			rest = append(rest, i)
		}
	}
	if len(rest) == 1 {
		irqs[rest[0]].Receive = true
	}
}

// ThreadedNAPI says whether d's NAPI instances are polled by kthreads
// (its "threaded" sysfs knob is set), not in softirq.
func (d *Device) ThreadedNAPI() bool { return d.Threaded != "" && d.Threaded != "0" }

// PollCPUs are the cores that poll d, when each poll runs on one known
// core: its NAPI kthreads' where they are pinned, else (softirq) where its
// receive interrupts are delivered; nil when unknown (a threaded device
// whose threads were not found or are not pinned to one core each, a
// virtual device with no interrupts, an interrupt delivered to several
// cores).
func (d *Device) PollCPUs() []int {
	if len(d.NAPIThreads) > 0 {
		var each [][]int
		for _, th := range d.NAPIThreads {
			each = append(each, th.CPUs)
		}
		return singleCores(each)
	}
	if d.ThreadedNAPI() {
		return nil
	}
	return d.ReceiveIRQCPUs()
}

// ReceiveIRQCPUs is where d's receive interrupts are delivered, when
// each is delivered to one core; nil when d has none or one may go to
// several cores.
func (d *Device) ReceiveIRQCPUs() []int {
	var each [][]int
	for _, q := range d.IRQs {
		if q.Receive {
			each = append(each, q.CPUs)
		}
	}
	return singleCores(each)
}

// singleCores are the cores of pollers that each run on one core, sorted
// and once each; nil if any may run on several (or on none).
func singleCores(each [][]int) []int {
	var out []int
	for _, cpus := range each {
		if len(cpus) != 1 {
			return nil
		}
		if !slices.Contains(out, cpus[0]) {
			out = append(out, cpus[0])
		}
	}
	slices.Sort(out)
	return out
}
