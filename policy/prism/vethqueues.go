package prism

import (
	"fmt"
	"strings"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/policy/onpath"
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
	stp  bool             // the host side's bridge runs spanning tree
}

// bridgeSTP reports whether the bridge host is a port of runs STP.
func bridgeSTP(t *topology.Topology, host *topology.Device) bool {
	for _, v := range t.Veths {
		if v.Name != host.Name || v.Master == "" {
			continue
		}
		for _, b := range t.Bridges {
			if b.Name == v.Master {
				return b.STP
			}
		}
	}
	return false
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
			out = append(out, vethPair{ctr: &ifc.Device, host: host, stp: bridgeSTP(t, host)})
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
		case p.stp:
			return nil, fmt.Errorf("prism veth-queues=class: the bridge of %s runs STP; changing a veth's queue count takes its link down and up, and STP would hold the port for its forwarding delay: turn STP off on the bridge or drop veth-queues", plan.DevLabel(p.host.NetNS, p.host.Name))
		case len(hookedVeth(p)) > 0:
			return nil, fmt.Errorf("prism veth-queues=class: %s; lanes' class programs must be the only hooks there (another could pass frames on before lanes counts them, or pick the queue itself): drop veth-queues", strings.Join(hookedVeth(p), "; "))
		case len(p.ctr.RxQueues) > 2 || p.host.TxQueues > 2:
			return nil, fmt.Errorf("prism veth-queues=class: %s already uses %d receive queues and its peer %d transmit queues; per-class queues need exactly two: drop veth-queues", plan.DevLabel(p.ctr.NetNS, p.ctr.Name), len(p.ctr.RxQueues), p.host.TxQueues)
		}
	}
	return out, nil
}

// hookedVeth lists the hooks not lanes' own where the class programs go or
// where they would be bypassed: the host side's egress (tc, tcx, a qdisc,
// which might set the queue itself through traffic classes) and the
// container side's receive path (XDP, tc, tcx).
func hookedVeth(p vethPair) []string {
	var out []string
	if o := onpath.EgressHooks(p.host.Hooks); len(o) > 0 {
		out = append(out, plan.DevLabel(p.host.NetNS, p.host.Name)+" has "+strings.Join(o, ", ")+" on its egress")
	}
	if o := onpath.IngressHooks(p.ctr.Hooks); len(o) > 0 {
		out = append(out, plan.DevLabel(p.ctr.NetNS, p.ctr.Name)+" has "+strings.Join(o, ", ")+" on its receive side")
	}
	return out
}

// schedOf renders a poller's scheduling: SCHED_FIFO at rt, or normal
// scheduling for 0.
func schedOf(rt int) string {
	if rt > 0 {
		return fmt.Sprintf("policy=fifo prio=%d nice=0", rt)
	}
	return "policy=other prio=0 nice=0"
}

// addVethQueues adds veth-queues=class's first knobs: a second receive
// queue on each container veth and a second transmit queue on its host
// side, and TSO off on the host side (a veth hands forwarded frames to its
// peer's NAPI only then: veth_skb_is_eligible_for_gro). None of them
// changes a frame's path yet: without NAPI on the container side every
// frame still takes the backlog. attachVethQueues follows once the
// datapath is loaded.
func addVethQueues(pl *plan.Plan, pairs []vethPair) {
	for _, p := range pairs {
		c, h := p.ctr, p.host
		cl, hl := plan.DevLabel(c.NetNS, c.Name), plan.DevLabel(h.NetNS, h.Name)
		pl.Add(knobs.Channels(c.NetNS, c.Name), knobs.FormatChannels(2, max(c.TxQueues, 1)), cl+" queues", "veth-queues=class: a receive queue per class (bulk 0, high priority 1)")
		pl.Add(knobs.Channels(h.NetNS, h.Name), knobs.FormatChannels(max(len(h.RxQueues), 1), 2), hl+" queues", "veth-queues=class: a transmit queue per class, feeding the peer's receive queue of the same number")
		tso := knobs.Features(h.NetNS, h.Name, knobs.TSOFeatures...)
		pl.Add(tso, tso.FormatAll(false), hl+" tso",
			"veth-queues=class: a veth hands forwarded frames to its peer's NAPI (and so to a queue of the peer's) only with TSO off; merged TCP is then segmented here in software")
	}
}

// addVethPollers turns the container veths' NAPI on (GRO) and threaded,
// one poller per receive queue, pinned to the receive core and scheduled
// as vethPollerRT says. It comes after attachVethQueues: by the time frames
// leave the backlog for the veth's queues, each flow's frames already name
// its class's queue, so no flow starts on the other class's queue and
// moves at once.
func addVethPollers(pl *plan.Plan, pairs []vethPair, o Options, core int) {
	high, bulk := vethPollerRT(o)
	cpus := cpuset.FormatList([]int{core})
	for _, p := range pairs {
		c := p.ctr
		cl := plan.DevLabel(c.NetNS, c.Name)
		pl.Add(knobs.Feature(c.NetNS, c.Name, ethtool.GRO), "on", cl+" gro", "veth-queues=class: GRO gives each receive queue of the veth a NAPI poller")
		pl.Add(knobs.Sysfs(c.NetNS, "/sys/class/net/"+c.Name+"/threaded"), "1", cl+" threaded", "veth-queues=class: each receive queue polled by its own kernel thread")
		for _, q := range []struct {
			n     int
			sched string
			what  string
		}{{vethBulkQueue, schedOf(bulk), "bulk"}, {vethHighQueue, schedOf(high), "high-priority"}} {
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
	return fmt.Sprintf("veth-queues=class: %s take high-priority frames on receive queue 1, polled by its own real-time thread, and bulk on queue 0. Costs: TSO is off on their host-side veths, so bulk TCP into these containers is segmented before the veth (measured on 2 cores: a single stream at 0.46x of vanilla); changing a veth's queue count takes its link down and up, so apply and reset each interrupt these containers' traffic for a moment and the bridge relearns their MACs; turning their GRO off at reset drops what their queues hold then. Frames the host's own sockets send keep the queue their socket picked. A flow in flight while apply switches the veths' NAPI on can be reordered once. Containers started later keep one queue: lanes apply again to include them", strings.Join(names, ", "))
}

// vethPollerRT returns the SCHED_FIFO priorities (0: normal scheduling) of
// the high-priority and bulk pollers of a container veth. The high one
// runs as the high-priority queue's kthread; with the ladder
// (streamline=true) it and the bulk one take the top rung and the
// container rung, above the stages that feed them. The bulk poller is not
// SCHED_IDLE even under bulk-sched=idle: a veth's receive queue is a
// 256-frame ring that drops when full, and a starved idle poller let one
// TCP stream overflow it (docs/decisions/README.md); the shared default's
// backlog holds 1000 and is drained in softirq.
func vethPollerRT(o Options) (high, bulk int) {
	lad := o.Ladder()
	switch {
	case o.Streamline:
		return lad.High, lad.Container
	case o.High == HighInline:
		return 0, o.BulkRT
	}
	return lad.High, o.BulkRT
}
