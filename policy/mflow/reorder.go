package mflow

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/reorder"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/topology"
)

// reorderSupported is reorder.Supported, replaceable by tests.
var reorderSupported = reorder.Supported

// ReorderDir is where the reassembler of host-side veth dev of target
// namespace netns is pinned: under the target's pin directory, from which a
// reset removes whatever a crash left.
func ReorderDir(netns, dev string) string {
	return reorderRoot(netns) + "/" + dev
}

func reorderRoot(netns string) string { return plan.PinDir(netns) + "/reorder" }

// DeviceReorder is one container veth's reassembler.
type DeviceReorder struct {
	Device string `json:"device"`
	reorder.Stats
}

// ReorderStatus reads the counters of every reassembler lanes pinned for
// target namespace netns (none: nil), by device name: what `lanes status`
// and the metrics show.
func ReorderStatus(netns string) ([]DeviceReorder, error) {
	ents, err := os.ReadDir(reorderRoot(netns))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []DeviceReorder
	for _, e := range ents {
		dir := ReorderDir(netns, e.Name())
		if !e.IsDir() || !reorder.Present(dir) {
			continue
		}
		p, err := reorder.Open(dir)
		if err != nil {
			return nil, err
		}
		st, err := p.Stats()
		p.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, DeviceReorder{Device: e.Name(), Stats: st})
	}
	return out, nil
}

// reassembly is where MFLOW's in-order merge goes under o on t, decided
// once for the plan (the datapath's quiet time and the qdiscs follow it):
// the reassembler's config and its value, the veths that get it, those
// left out and why; or off, the order note saying why it runs nowhere.
type reassembly struct {
	cfg     reorder.Config
	val     string
	veths   []*topology.Veth
	skipped []string
	off     string
}

func planReassembly(o Options, t *topology.Topology, split []int) reassembly {
	if !o.Reorder {
		return reassembly{off: "order: reassembly off (reorder=off): micro-flows of one flow run in parallel and reach the container in whatever order their cores finish"}
	}
	if err := reorderSupported(); err != nil {
		return reassembly{off: fmt.Sprintf("order: reassembly is unavailable: %v; micro-flows reach the container in whatever order their cores finish, so mflow reorders (opt-in only)", err)}
	}
	r := reassembly{cfg: reorder.DefaultConfig(o.Batch, len(split))}
	r.cfg.Timeout = o.ReorderTimeout
	r.cfg.SelfCheck = o.ReorderCheck
	val, err := reorder.EncodeConfig(r.cfg)
	if err != nil {
		return reassembly{off: "order: reassembly not set up: " + err.Error()}
	}
	r.val = val
	for i := range t.Veths {
		v := &t.Veths[i]
		if other := qdiscHook(v.Hooks); other != "" {
			r.skipped = append(r.skipped, fmt.Sprintf("%s (root qdisc %s)", v.Name, other))
			continue
		}
		if v.TxQueues > 1 {
			// Past the root qdisc the veth picks a transmit queue, and
			// with it a receive queue of the container, by skb->hash:
			// a micro-flow's, so the merged flow would split again.
			r.skipped = append(r.skipped, fmt.Sprintf("%s (%d transmit queues)", v.Name, v.TxQueues))
			continue
		}
		r.veths = append(r.veths, v)
	}
	return r
}

// elephantQuiet is steer.MFlow.Quiet: where the reassembler runs, an
// elephant stays split until it has paused for twice the reassembler's
// timeout (datapath/steer/bpf/mflow.h's elephant); else 0, and it falls
// back as soon as its rate drops.
func (r reassembly) elephantQuiet() time.Duration {
	if len(r.veths) == 0 {
		return 0
	}
	return 2 * r.cfg.Timeout
}

// addReassembly puts MFLOW's in-order merge where every split core's path
// to a container meets: a reassembling qdisc at the root of each
// container's host-side veth, where the kernel has the BPF qdisc, and says
// in one line why not where it has not (r). It returns the note on order.
//
// After the merge nothing may spread the container's frames over cores
// again: a frame the qdisc hands on goes to the container-side veth's
// backlog on the core that dequeued it (veth_xmit, netif_rx), and the
// qdisc is dequeued by whichever split core enqueued last, so two cores'
// backlogs would race to the socket. RPS on the container-side veth with
// one core queues every frame, in the order the qdisc let it go, on that
// core's backlog (enqueue_to_backlog appends under the backlog's lock,
// and dequeue-and-transmit runs on one core at a time). Containers take
// the split cores in turn.
func addReassembly(pl *plan.Plan, t *topology.Topology, o Options, split []int, r reassembly) string {
	if r.off != "" {
		return r.off
	}
	if t.Kind == topology.Flannel || t.Kind == topology.Routed {
		// ip_forward overwrites skb->priority, the tag's field, from
		// the TOS unless told not to (mflow_tag.h).
		pl.Add(knobs.Sysctl(t.NetNS, "net.ipv4.ip_forward_update_priority"), "0", plan.Target(t.NetNS)+" net.ipv4.ip_forward_update_priority",
			"IPv4 forwarding keeps skb->priority, which carries the micro-flow tag to the containers' veths")
	}
	for n, v := range r.veths {
		pl.Add(&reorder.QdiscKnob{NetNS: v.NetNS, Device: v.Name, Dir: ReorderDir(t.Target(), v.Name)}, r.val,
			plan.DevLabel(v.NetNS, v.Name)+" root qdisc", "reassemble split flows in order before the container (MFLOW's merge)")
		core := split[n%len(split)]
		for _, c := range t.Containers {
			for i := range c.Interfaces {
				d := &c.Interfaces[i]
				if d.HostVeth != v.Name {
					continue
				}
				for _, q := range d.RxQueues {
					pl.RPSByHash(&d.Device, q, cpuset.FormatMask([]int{core}),
						fmt.Sprintf("one backlog (core %d) after the reassembler, so its order holds to the socket", core))
				}
			}
		}
	}
	groOff := len(r.veths) > 0 && o.At == steer.SplitAtIRQ
	if groOff {
		// The cut's XDP metadata stays on the skb through decapsulation,
		// and GRO tells flows apart also by the metadata's length of
		// bytes in front of the MAC header: after decap the end of the
		// outer headers, which differ from skb to skb. The VXLAN
		// device's GRO cell then takes aggregates of one micro-flow for
		// different flows, and a later one that flushes at once passes
		// an earlier one it still holds: the qdisc, which keeps a
		// micro-flow's frames in arrival order, cannot undo that. With
		// GRO off the cell hands skbs to the backlog in order; cpumap's
		// GRO on the split core has already merged them.
		for i := range t.VXLANs {
			d := &t.VXLANs[i].Device
			pl.Add(knobs.Feature(d.NetNS, d.Name, ethtool.GRO), "off", plan.DevLabel(d.NetNS, d.Name)+" gro",
				"the VXLAN GRO cell hands a micro-flow's skbs on in the order they come (cpumap's GRO on the split core merged them already)")
		}
	}
	note := fmt.Sprintf("order: MFLOW's reassembly at the root of %d container veths (a BPF qdisc): micro-flow k+1 is held until k is complete (%d frames, or its core moved on), a gap is skipped after %v, at most %d frames held per flow; its counters (held, released, gaps skipped, overflows) are pinned per veth in %s",
		len(r.veths), r.cfg.Batch, r.cfg.Timeout, r.cfg.FlowLimit, reorderRoot(t.NetNS))
	if groOff {
		note += "; GRO off on the VXLAN device, whose GRO cell could let a later part of a micro-flow pass an earlier one"
	}
	if len(r.skipped) > 0 {
		note += "; not on " + strings.Join(r.skipped, ", ") + ": their split flows may arrive out of order"
	}
	return note
}

// qdiscHook is the kind of a root qdisc someone set on a veth (discovery
// lists it among the egress hooks), or "".
func qdiscHook(h *topology.Hooks) string {
	if h == nil {
		return ""
	}
	for _, e := range h.Egress {
		// lanes' own (an apply replacing another) is restored before
		// the plan that is applied.
		if k, ok := strings.CutPrefix(e, "qdisc:"); ok && !strings.HasPrefix(k, "lanes_mf_") {
			return k
		}
	}
	return ""
}
