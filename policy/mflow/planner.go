package mflow

import (
	"fmt"
	"slices"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/topology"
)

// Mode is the name `lanes apply --mode` takes. One mode: the split point
// is a setting (at=irq|bridge), not a mode of its own.
const Mode = "mflow"

func init() { plan.Register(planner{}) }

type planner struct{}

func (planner) Mode() string { return Mode }
func (planner) Summary() string {
	return "MFLOW: elephant flows cut into micro-flows of --batch frames, processed in parallel on --split-cores, reassembled in order before each container where the kernel has the BPF qdisc (>= 6.16)"
}
func (planner) Params() []plan.Param { return params }

// kernelSupport is steer.KernelSupport, replaceable by tests.
var kernelSupport = steer.KernelSupport

// Plan cuts every elephant flow of t's VXLAN overlays into micro-flows
// (datapath/steer with MFlow on; placement tables stay at "stay", so mice
// take the vanilla path):
//
//	at      where the datapath splits           what runs per micro-flow, in parallel
//	irq     XDP on the underlay -> cpumap       skb allocation, GRO, outer IP/UDP, VXLAN decap,
//	                                            GRO cell, bridge, veth, inner IP, TCP/UDP, socket
//	bridge  tc ingress on the underlay sets     bridge, veth, inner IP, TCP/UDP, socket (after
//	        the skb hash; RPS on the VXLAN      VXLAN's GRO cell, which stays on the core that
//	        device follows it                   decapsulated)
//
// A split right in front of VXLAN decapsulation at skb level, MFLOW's
// flow-splitting function on a heavy device, has no stock lever: decap
// runs in the underlay's protocol handler, and the only skb-level hand-off
// before it is RPS on the underlay (get_rps_cpu in
// netif_receive_skb_internal / netif_receive_skb_list_internal /
// netif_rx_internal), which follows skb->hash. The programs that can set
// the hash (tc, bpf_set_hash) run in __netif_receive_skb_core, after that
// decision (as does generic XDP); native XDP runs before it but has no
// helper to set skb->hash (its rx-hash kfunc only reads), and every frame
// of an inner flow carries the same outer 5-tuple, so the flow dissector
// gives them one hash. (Rewriting the outer UDP source port per micro-flow
// would change that hash, but lanes never rewrites packet bytes, and
// at=irq splits at that same point already, earlier.) Checked in Linux
// 6.12 net/core/dev.c and net/core/filter.c (xdp_func_proto has no
// set_hash).
func (planner) Plan(t *topology.Topology, cfg plan.Config) (*plan.Plan, error) {
	o, err := Parse(Defaults(), cfg.Params)
	if err != nil {
		return nil, err
	}
	if len(t.Underlays) == 0 {
		return nil, fmt.Errorf("no underlay device found: mflow splits at the underlay NIC and cannot run without it")
	}
	pl := &plan.Plan{Mode: Mode}
	irq := plan.IRQCPUsOr(t, o.IRQCPUs)
	split, err := splitCores(o, cfg, irq)
	if err != nil {
		return nil, err
	}
	if o.At == steer.SplitAtIRQ {
		if ok, why := kernelSupport(); !ok {
			pl.Notes = append(pl.Notes, "at=irq: "+why+", so TCP would lose GRO on the split cores: splitting at the bridge stage instead (at=bridge)")
			o.At = steer.SplitAtBridge
		}
	}
	// The datapath's cores: the set (mice at the bridge keep the core
	// they are on if it is in it) and the split cores.
	cpus := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(cfg.CPUs), split...))))
	if len(cpus) > steer.MaxCPUs {
		return nil, fmt.Errorf("mflow steers over at most %d cores, %d given: narrow --cpus", steer.MaxCPUs, len(cpus))
	}
	port, vnis, err := plan.VXLANIDs(t, pl)
	if err != nil {
		return nil, err
	}
	w, frames := o.Window()
	reasm := planReassembly(o, t, split)
	setup := steer.Setup{
		Config: steer.Config{Enabled: true, CPUs: cpus, Flowlet: steer.DefaultFlowlet, Drain: steer.DefaultDrain,
			VXLANPort: port, VNIs: vnis,
			// Nothing after tc ingress counts the bridge stage's
			// frames seen; its table never changes here anyway.
			NoBridgeCount: o.At == steer.SplitAtBridge,
			MFlow:         steer.MFlow{At: o.At, Batch: o.Batch, Cores: split, Threshold: frames, Window: w, Quiet: reasm.elephantQuiet()}},
		QueueSize: o.QueueSize,
	}
	if o.At == steer.SplitAtIRQ {
		setup.CPUMap = split
	}
	dir := plan.PinDir(t.Target())
	val, err := setup.Encode()
	if err != nil {
		return nil, err
	}
	// bpffs, the pin directory and the datapath come first and go last,
	// so a reset after any crash still finds and removes every pin.
	pl.Add(&attach.BPFFS{Path: plan.BPFFS}, "mounted", plan.BPFFS, "bpffs for lanes' pinned programs and maps")
	pl.Add(&attach.PinDir{Path: dir}, "present", dir, "pin directory of this namespace's BPF objects")
	pl.Add(&steer.DatapathKnob{Dir: dir}, val, dir, "steering programs and maps: micro-flows for elephants, vanilla placement for mice")
	if o.At == steer.SplitAtIRQ {
		addIRQSplit(pl, t, dir)
	} else {
		addBridgeSplit(pl, t, dir, cpus)
	}
	order := addReassembly(pl, t, o, split, reasm)
	if why := t.MergesInnerUDP(); why != "" && o.At == steer.SplitAtIRQ {
		// A cut starts after a frame that ended a GRO segment, and
		// every UDP datagram is taken for one (bpf/mflow.h's elephant).
		pl.Notes = append(pl.Notes, "order: "+why+", so the underlay's GRO may merge inner UDP datagrams, and a cut may start inside a merged segment that its first micro-flow could pass")
	}
	addNotes(pl, o, split, irq, frames, w, order)
	return pl, nil
}

// addIRQSplit attaches the split (XDP) and, first, the end of its queue on
// tc ingress, where the micro-flows' sequence numbers are read back from
// the skb metadata on the split cores: arrivals and late micro-flow frames
// per core (`lanes status`), what a reassembler would have to undo.
func addIRQSplit(pl *plan.Plan, t *topology.Topology, dir string) {
	for _, u := range t.Underlays {
		pl.Add(&attach.TCX{NetNS: u.NetNS, Device: u.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCSplitSeen, Link: plan.LinkPin(dir, "tcx-in", u.NetNS, u.Name)},
			"attached", plan.DevLabel(u.NetNS, u.Name)+" tc ingress", "read micro-flow sequence numbers back on the split cores: arrivals and reordering per core")
		pl.Add(&attach.XDP{NetNS: u.NetNS, Device: u.Name, Prog: dir + "/" + steer.PinXDP, Link: plan.LinkPin(dir, "xdp", u.NetNS, u.Name)},
			"attached", plan.DevLabel(u.NetNS, u.Name)+" xdp", "cut elephants into micro-flows and hand each to its split core before skb allocation")
	}
}

// addBridgeSplit attaches the split on the underlay's tc ingress, then
// points RPS on the VXLAN devices at the core set: in that order, so no
// skb meets the RPS mask before its hash is chosen (mice get the hash of
// the core they are on, and stay).
func addBridgeSplit(pl *plan.Plan, t *topology.Topology, dir string, cpus []int) {
	for _, u := range t.Underlays {
		pl.Add(&attach.TCX{NetNS: u.NetNS, Device: u.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCIngress, Link: plan.LinkPin(dir, "tcx-in", u.NetNS, u.Name)},
			"attached", plan.DevLabel(u.NetNS, u.Name)+" tc ingress", "cut elephants into micro-flows: each gets the hash RPS on the VXLAN device maps to its split core")
	}
	mask := cpuset.FormatMask(cpus)
	for i := range t.VXLANs {
		d := &t.VXLANs[i].Device
		for _, q := range d.RxQueues {
			pl.RPSByHash(d, q, mask, "micro-flows go where their hash says: bridge, veth and socket per micro-flow")
		}
	}
}

// splitCores are the split cores o asks for, or DefaultSplitCPUs; every
// one must be online.
func splitCores(o Options, cfg plan.Config, irq []int) ([]int, error) {
	split := o.SplitCPUs
	if len(split) == 0 {
		split = DefaultSplitCPUs(cfg.CPUs, irq)
	}
	for _, c := range split {
		if !slices.Contains(cfg.Online, c) {
			return nil, fmt.Errorf("split core %d is not online: this machine has cores %s", c, cpuset.FormatList(cfg.Online))
		}
	}
	return split, nil
}

// DefaultSplitCPUs are two cores of set: the first IRQ core in it, as
// MFLOW's splitting cores include the one that takes the interrupt, and
// the lowest other core (both cores on a 2-core machine). Ascending, the
// dispatch order.
func DefaultSplitCPUs(set, irq []int) []int {
	var out []int
	for _, c := range irq {
		if slices.Contains(set, c) {
			out = append(out, c)
			break
		}
	}
	for _, c := range set {
		if len(out) == 2 {
			break
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

func addNotes(pl *plan.Plan, o Options, split, irq []int, frames uint32, w time.Duration, order string) {
	elephants := fmt.Sprintf("flows from %d packets/s (%d frames within %v)", o.Threshold, frames, w)
	if o.Threshold == 0 {
		elephants = "every flow"
	}
	where := "at the NIC poll (XDP + cpumap): skb allocation, GRO, decap and everything after run on the micro-flow's core"
	if o.At == steer.SplitAtBridge {
		where = "at the bridge stage (RPS on the VXLAN device): bridge, veth and socket delivery run on the micro-flow's core; NIC poll, GRO and decap stay where they were"
	}
	pl.Notes = append(pl.Notes,
		fmt.Sprintf("elephants: %s; each is cut into micro-flows of %d frames, round robin over cores %s, split %s; mice keep the vanilla path",
			elephants, o.Batch, cpuset.FormatList(split), where),
		order)
	if len(split) == 1 {
		pl.Notes = append(pl.Notes, fmt.Sprintf("one split core (%d): elephants move there whole, nothing runs in parallel", split[0]))
	}
	if len(irq) == 0 && len(o.SplitCPUs) == 0 {
		pl.Notes = append(pl.Notes, plan.IRQUnknown+": the split cores are the set's lowest two")
	}
}
