package plan

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/topology"
)

// Helpers the planners of BPF-based modes share.

// IRQCPUs are the cores that poll the underlay NICs, when each poll runs
// on one known core; nil when unknown. A NIC with threaded NAPI is polled
// where its threads are pinned; one without, in softirq on the cores its
// receive interrupts are delivered to (topology.Device.IRQs). A virtual
// NIC has neither: its IRQ core is unknown unless the mode is told
// (IRQParam, IRQCPUsOr).
func IRQCPUs(t *topology.Topology) []int {
	var out []int
	for _, u := range t.Underlays {
		cpus := u.PollCPUs()
		if len(cpus) == 0 {
			return nil
		}
		for _, c := range cpus {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	slices.Sort(out)
	return out
}

// IRQKey is the setting that tells a steering mode the underlay NIC's IRQ
// cores where lanes cannot read them: a virtual NIC whose interrupts are
// another machine's (a veth, the testbed's NIC polled in softirq), or
// interrupts spread over several cores.
const IRQKey = "irq-cpus"

// IRQParam is IRQKey's entry in a mode's settings.
var IRQParam = Param{Key: IRQKey, Default: "read from the NIC", Help: "cores that poll the underlay NIC, a list like 1 or 2-3 (default: where its threaded NAPI kthreads are pinned, else where its receive interrupts are delivered); give it where lanes cannot read them, and give it right: the modes that keep order by polling on the receive core alone count on it"}

// WithIRQ is a mode's settings with IRQKey set to cpu, for a host whose
// NIC's IRQ core the modes cannot read: unchanged when the mode takes no
// such setting or params already gives it. params itself is not changed.
func WithIRQ(mode string, params map[string]string, cpu int) map[string]string {
	if params[IRQKey] != "" || !Takes(mode, IRQKey) {
		return params
	}
	out := maps.Clone(params)
	if out == nil {
		out = map[string]string{}
	}
	out[IRQKey] = strconv.Itoa(cpu)
	return out
}

// IRQCPUsOr is given when a mode was told its IRQ cores, else IRQCPUs(t).
func IRQCPUsOr(t *topology.Topology, given []int) []int {
	if len(given) > 0 {
		return slices.Clone(given)
	}
	return IRQCPUs(t)
}

// IRQCPUsFor is IRQCPUsOr with the IRQKey setting of params (checked
// by the planner: an unreadable value counts as not given).
func IRQCPUsFor(t *topology.Topology, params map[string]string) []int {
	given, _ := cpuset.ParseList(params[IRQKey])
	return IRQCPUsOr(t, given)
}

// IRQUnknown is what a plan notes when it does not know the IRQ core.
const IRQUnknown = "the underlay's IRQ core is unknown (it is not polled on known single cores: no NAPI thread pinned to one, no receive interrupt delivered to one; give --set " + IRQKey + "=N)"

// GROCellNotes warn about VXLAN devices whose NAPI is threaded. A VXLAN
// device hands decapsulated frames to a GRO cell of the core that
// decapsulated them, a per-core queue the kernel fills and empties without
// a lock, counting on both running on that core (softirq). Threaded NAPI
// gives each cell a kernel thread, by default free to run on any core:
// once one empties its cell from another core while the cell's own core
// fills it, the queue is corrupted: on Linux 6.18 the overlay then
// delivers a few datagrams and then nothing, until the device is
// recreated. With the threads on the decapsulating core it delivers
// everything.
func GROCellNotes(t *topology.Topology) []string {
	var out []string
	for _, v := range t.VXLANs {
		if !v.ThreadedNAPI() {
			continue
		}
		out = append(out, fmt.Sprintf("%s: threaded NAPI is on (threaded=%s), which is unsafe for a VXLAN device: its GRO cells are per-core queues without a lock, and a cell's thread running on another core than the one decapsulating into it corrupts the queue (on Linux 6.18 the overlay stopped receiving); write 0 to /sys/class/net/%s/threaded in its namespace",
			DevLabel(v.NetNS, v.Name), v.Threaded, v.Name))
	}
	return out
}

// VXLANIDs are the UDP port and VNIs of t's VXLAN devices, for programs
// that must recognise their frames; devices on another port are noted in
// pl and left out.
func VXLANIDs(t *topology.Topology, pl *Plan) (uint16, []uint32, error) {
	var port uint16
	var vnis []uint32
	for _, v := range t.VXLANs {
		p := uint16(v.Port)
		if p == 0 {
			p = 4789
		}
		if port == 0 {
			port = p
		} else if p != port {
			pl.Notes = append(pl.Notes, fmt.Sprintf("vxlan %s uses port %d, not %d: its frames pass unsteered", v.Name, p, port))
			continue
		}
		if !slices.Contains(vnis, uint32(v.VNI)) {
			vnis = append(vnis, uint32(v.VNI))
		}
	}
	if port == 0 {
		return 0, nil, fmt.Errorf("no VXLAN device to steer")
	}
	return port, vnis, nil
}

// LinkPin names a link's pin by kind, namespace and device, so every
// attachment of a target has its own: link_KIND_TARGET_DEV, where KIND
// holds no '_' and TARGET is Target(ns). DEV is the device's name where
// that holds none of '_', '.' (which bpffs refuses) and '%'; otherwise
// "%" and the name in Target's escaped form, which holds no '_' either.
// The last '_' therefore ends the target, and distinct devices and
// namespaces have distinct pins (eth0.100 and eth0_100; a device "b_c"
// of namespace "a" and a device "c" of namespace "a_b").
func LinkPin(dir, kind, ns, dev string) string {
	if strings.ContainsAny(dev, "_.%") {
		dev = "%" + targetEscape.Replace(dev)
	}
	return dir + "/link_" + kind + "_" + Target(ns) + "_" + dev
}

// DevLabel names a device for people, as DeviceTarget does.
func DevLabel(ns, dev string) string { return Target(ns) + "/" + dev }

// FastMoveBlocked says why steer_xdp's fast move between the NIC poll and
// a core's queues (steer.Config.PrioIdleInline) is not order-safe on core,
// given the underlay's IRQ cores, or "" where it is: the NIC must be
// polled on core alone, and no underlay may merge inner UDP datagrams
// (the move takes every datagram for the end of a GRO segment).
func FastMoveBlocked(t *topology.Topology, irq []int, core int) string {
	switch {
	case len(irq) == 0:
		return IRQUnknown
	case !slices.Equal(irq, []int{core}):
		return "the underlay's IRQ core is " + cpuset.FormatList(irq)
	}
	if why := t.MergesInnerUDP(); why != "" {
		return why + " (a UDP datagram need not end a GRO segment)"
	}
	return ""
}
