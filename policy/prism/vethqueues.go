package prism

import (
	"fmt"
	"strings"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/topology"
)

// Receive queues of a container veth under veth-queues=class.
const (
	vethBulkQueue = 0
	vethHighQueue = 1
)

// vethPair is a container's veth and its host-side peer.
type vethPair struct {
	ctr  *topology.Device // in the container
	host *topology.Device // in t.NetNS, on the bridge
}

// vethPairs returns every container veth whose host side lanes found, or
// an error naming one that cannot take per-class queues.
func vethPairs(t *topology.Topology) ([]vethPair, error) {
	var out []vethPair
	for i := range t.Containers {
		for j := range t.Containers[i].Interfaces {
			ifc := &t.Containers[i].Interfaces[j]
			if ifc.HostVeth == "" {
				continue
			}
			var host *topology.Device
			for k := range t.Veths {
				if t.Veths[k].Name == ifc.HostVeth {
					host = &t.Veths[k].Device
				}
			}
			if host == nil {
				return nil, fmt.Errorf("prism veth-queues=class: the host side %s of %s was not found", ifc.HostVeth, plan.DevLabel(ifc.NetNS, ifc.Name))
			}
			out = append(out, vethPair{ctr: &ifc.Device, host: host})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("prism veth-queues=class: no container veth found to give per-class queues: drop veth-queues")
	}
	for _, p := range out {
		// The class rides on the queue the skb says it was received on
		// (steer_tc_veth_class), which only the kernel's transmit hash
		// honours: XPS would pick the queue by CPU instead.
		switch {
		case p.ctr.MaxRxQueues < 2:
			return nil, fmt.Errorf("prism veth-queues=class: %s can use %d receive queue(s) (the count is fixed when the veth pair is made): drop veth-queues", plan.DevLabel(p.ctr.NetNS, p.ctr.Name), p.ctr.MaxRxQueues)
		case p.host.MaxTxQueues < 2:
			return nil, fmt.Errorf("prism veth-queues=class: %s can use %d transmit queue(s) (the count is fixed when the veth pair is made): drop veth-queues", plan.DevLabel(p.host.NetNS, p.host.Name), p.host.MaxTxQueues)
		case p.host.XPS:
			return nil, fmt.Errorf("prism veth-queues=class: %s has an XPS map, which would choose its transmit queue instead of the class: clear its queues' xps_cpus and xps_rxqs, or drop veth-queues", plan.DevLabel(p.host.NetNS, p.host.Name))
		case len(p.ctr.RxQueues) > 2 || p.host.TxQueues > 2:
			return nil, fmt.Errorf("prism veth-queues=class: %s already uses %d receive queues and its peer %d transmit queues; per-class queues need exactly two: drop veth-queues", plan.DevLabel(p.ctr.NetNS, p.ctr.Name), len(p.ctr.RxQueues), p.host.TxQueues)
		}
	}
	return out, nil
}

// schedOf renders the scheduling of a thread that does one class's work.
func schedOf(rt int, fair string) string {
	if rt > 0 {
		return fmt.Sprintf("policy=fifo prio=%d nice=0", rt)
	}
	switch fair {
	case SchedIdle:
		return "policy=idle prio=0 nice=0"
	case SchedBatch:
		return "policy=batch prio=0 nice=0"
	}
	return "policy=other prio=0 nice=0"
}

// addVethQueues adds veth-queues=class's knobs: a second receive queue on
// each container veth, NAPI on (GRO) and threaded, a poller per class
// pinned to the receive core (the high one at the high-priority queue's
// real-time priority, the bulk one at normal scheduling), and TSO off on the host side (a veth hands forwarded
// frames to its peer's NAPI only then: veth_skb_is_eligible_for_gro).
// The programs that pick the queues come later (attachVethQueues), once
// the datapath is loaded.
func addVethQueues(pl *plan.Plan, pairs []vethPair, o Options, lad Ladder, core int) {
	high := lad.High
	if o.High == HighInline {
		high = lad.NIC // the high class's first stage runs in the NIC poll
		if !o.Streamline {
			high = 0
		}
	}
	// The bulk poller is not SCHED_IDLE even under bulk-sched=idle: a
	// veth's receive queue is a 256-frame ring that drops when full, and
	// a starved idle poller let one TCP stream lose 64399 frames in 2 s
	// (testbed, 2026-11-23); the shared default's backlog holds 1000 and
	// is drained in softirq.
	bulk := schedOf(o.BulkRT, SchedNormal)
	cpus := knobs.FormatCPUList([]int{core})
	for _, p := range pairs {
		c, h := p.ctr, p.host
		cl, hl := plan.DevLabel(c.NetNS, c.Name), plan.DevLabel(h.NetNS, h.Name)
		pl.Add(knobs.Channels(c.NetNS, c.Name), knobs.FormatChannels(2, max(c.TxQueues, 1)), cl+" queues", "veth-queues=class: a receive queue per class (bulk 0, high priority 1)")
		pl.Add(knobs.Channels(h.NetNS, h.Name), knobs.FormatChannels(max(len(h.RxQueues), 1), 2), hl+" queues", "veth-queues=class: a transmit queue per class, feeding the peer's receive queue of the same number")
		pl.Add(knobs.Feature(h.NetNS, h.Name, ethtool.TSO), "off", hl+" tso",
			"veth-queues=class: a veth hands forwarded frames to its peer's NAPI (and so to a queue of the peer's) only with TSO off; merged TCP is then segmented here in software")
		pl.Add(knobs.Feature(c.NetNS, c.Name, ethtool.GRO), "on", cl+" gro", "veth-queues=class: GRO gives each receive queue of the veth a NAPI poller")
		pl.Add(knobs.Sysfs(c.NetNS, "/sys/class/net/"+c.Name+"/threaded"), "1", cl+" threaded", "veth-queues=class: each receive queue polled by its own kernel thread")
		for _, q := range []struct {
			n     int
			sched string
			what  string
		}{{vethBulkQueue, bulk, "bulk"}, {vethHighQueue, schedOf(high, SchedNormal), "high-priority"}} {
			label := fmt.Sprintf("%s rx-%d poller", cl, q.n)
			if o.Pin {
				pl.Add(knobs.QueueAffinity(c.NetNS, c.Name, q.n), cpus, label, fmt.Sprintf("veth-queues=class: the %s class's container stage on the receive core", q.what))
			}
			pl.Add(knobs.QueueSched(c.NetNS, c.Name, q.n), q.sched, label, fmt.Sprintf("veth-queues=class: the %s class's container stage", q.what))
		}
	}
}

// attachVethQueues attaches the programs that count a class's frames out
// of the container veth and, last, the one that sends each class to its
// queue.
func attachVethQueues(pl *plan.Plan, pairs []vethPair, dir string) {
	for _, p := range pairs {
		c, h := p.ctr, p.host
		pl.Add(&attach.TCX{NetNS: c.NetNS, Device: c.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCVethSeen, Link: plan.LinkPin(dir, "tcx-in", c.NetNS, c.Name)},
			"attached", plan.DevLabel(c.NetNS, c.Name)+" tc ingress", "veth-queues=class: count each flow's frames out of its container queue, so a class change waits for them")
		pl.Add(&attach.TCX{NetNS: h.NetNS, Device: h.Name, Direction: "egress", Prog: dir + "/" + steer.PinTCVethClass, Link: plan.LinkPin(dir, "tcx-out", h.NetNS, h.Name)},
			"attached", plan.DevLabel(h.NetNS, h.Name)+" tc egress", "veth-queues=class: each class to its receive queue of the container veth")
	}
}

// vethNote says what veth-queues=class does and costs.
func vethNote(pairs []vethPair) string {
	var names []string
	for _, p := range pairs {
		names = append(names, plan.DevLabel(p.ctr.NetNS, p.ctr.Name))
	}
	return fmt.Sprintf("veth-queues=class: %s take high-priority frames on receive queue 1, polled by its own real-time thread, and bulk on queue 0; TSO is off on their host-side veths, so bulk TCP into these containers is segmented before the veth (measured: a single stream at about half of its rate)", strings.Join(names, ", "))
}
