package falcon

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/policy/fast"
	"github.com/lanesnet/lanes/topology"
)

// AgentName is the plan.Plan.Agent of modes that balance.
const AgentName = "falcon-balancer"

// Modes: falcon runs all three mechanisms; the others run one each, so
// each can be benchmarked alone.
// falcon-prism composes PRISM-batch with all of Falcon (Options.Prio).
var presets = []struct {
	mode, summary                string
	pipeline, split, balan, prio bool
}{
	{"falcon", "Falcon: pipelining + splitting + balancing (balancing needs `lanes agent`)", true, true, true, false},
	{"falcon-pipeline", "Falcon's pipelining alone: stages placed by hash(flow, device)", true, false, false, false},
	{"falcon-split", "Falcon's splitting alone: skb allocation, GRO and decap on a split core", false, true, false, false},
	{"falcon-balance", "Falcon's balancing alone: stages start where the kernel runs them and move off busy cores", false, false, true, false},
	{"falcon-prism", "Falcon with PRISM-batch on top: flows marked with `lanes prio` get their own real-time queue wherever their first stage runs", true, true, true, true},
}

func init() {
	for _, p := range presets {
		o := Defaults()
		o.Pipeline, o.Split, o.Balance, o.Prio = p.pipeline, p.split, p.balan, p.prio
		// Splitting alone is what falcon-split measures: never auto there.
		o.SplitAuto = o.Split && p.mode != "falcon-split"
		plan.Register(&planner{mode: p.mode, summary: p.summary, base: o})
	}
}

type planner struct {
	mode, summary string
	base          Options
}

func (p *planner) Mode() string         { return p.mode }
func (p *planner) Summary() string      { return p.summary }
func (p *planner) Params() []plan.Param { return params }

// Prioritizes: falcon-prism, or any falcon mode with prio=true.
func (p *planner) Prioritizes(m map[string]string) bool {
	o, err := Parse(p.base, m)
	return err == nil && o.Prio
}

// OptionsFor parses a falcon mode's params as the planner does, for the
// agent and the benchmark.
func OptionsFor(mode string, m map[string]string) (Options, error) {
	pl, err := plan.Lookup(mode)
	if err != nil {
		return Options{}, err
	}
	fp, ok := pl.(*planner)
	if !ok {
		return Options{}, fmt.Errorf("mode %s is not a falcon mode", mode)
	}
	return Parse(fp.base, m)
}

// Layout is what a plan steers, kept so the agent and status can name
// stages and cores without rediscovering the topology.
type Layout struct {
	CPUs      []int // the datapath's core list (set plus split cores), ascending
	Set       []int // cores the pipelined stages may use
	SplitCPUs []int
	IRQCPUs   []int
	// FirstCPUs, without splitting, are the cores the whole first stage
	// is queued to (prio: both classes' queues on the IRQ core); empty =
	// it stays in the NIC's poll.
	FirstCPUs []int
}

// Plan steers the receive path of every VXLAN device of t:
//
//	stage      runs                                  lever (where the choice is made)
//	split      skb alloc, GRO, outer IP/UDP, decap   XDP on the underlay NIC -> cpumap
//	bridge     bridge/routing, veth transmit         tc ingress on the underlay sets the skb hash,
//	                                                 RPS on the VXLAN device follows it
//	container  inner IP, TCP/UDP, socket             tc egress on the host-side veth sets the hash,
//	                                                 RPS on the container's veth follows it
//
// The NIC poll itself (XDP) stays on the IRQ core. Tables start at "stay"
// (vanilla placement) and the placement is switched on by the last change,
// so flows that are running when the plan lands move only at flowlet
// boundaries, like every later move.
func (p *planner) Plan(t *topology.Topology, cfg plan.Config) (*plan.Plan, error) {
	o, err := Parse(p.base, cfg.Params)
	if err != nil {
		return nil, err
	}
	pl := &plan.Plan{Mode: p.mode}
	if o.Balance {
		pl.Agent = AgentName
	}
	if len(t.Underlays) == 0 {
		return nil, fmt.Errorf("no underlay device found under %s: falcon steers at the underlay NIC and cannot run without it", vxNames(t))
	}
	if o.Fast {
		if err := fastBeside(t); err != nil {
			return nil, err
		}
	}

	lay := Layout{Set: cfg.CPUs, IRQCPUs: plan.IRQCPUsOr(t, o.IRQCPUs)}
	split := o.SplitCPUs
	if len(split) == 0 {
		for _, c := range cfg.CPUs {
			if !slices.Contains(lay.IRQCPUs, c) {
				split = append(split, c)
			}
		}
	}
	if o.Split || o.SplitRPS {
		for _, c := range split {
			if !slices.Contains(cfg.Online, c) {
				return nil, fmt.Errorf("split core %d is not online: this machine has cores %s", c, cpuset.FormatList(cfg.Online))
			}
		}
	}
	var rpsSplit []int // split=rps: the underlay's RPS map
	if o.SplitRPS {
		if len(split) == 0 {
			pl.Notes = append(pl.Notes, "split=rps: no core left for it besides the IRQ core; splitting is off (give split-cpus or more cores)")
		} else {
			rpsSplit = split
		}
	}
	if o.Split {
		if v := autoSplitOff(o, t); len(v) > 0 {
			pl.Notes = append(pl.Notes, fmt.Sprintf("split=auto: off, the underlay %s is a veth: XDP there copies every frame before the program runs, which costs more than splitting gains (split=true forces it)", strings.Join(v, ", ")))
			o.Split = false
			if !o.Pipeline && !o.Balance {
				return nil, fmt.Errorf("%s with pipeline and balance off and split=auto does nothing on the veth underlay %s: give split=true", p.mode, strings.Join(v, ", "))
			}
		}
		switch ok, why := steer.KernelSupport(); {
		case !o.Split: // split=auto said no
		case len(split) == 0:
			pl.Notes = append(pl.Notes, "split: no core left for it besides the IRQ core; splitting is off (give split-cpus or more cores)")
			o.Split = false
		case !ok:
			pl.Notes = append(pl.Notes, "split: off, "+why)
			o.Split = false
		default:
			lay.SplitCPUs = split
		}
	}
	if len(lay.IRQCPUs) == 0 {
		if o.spreadBusy() && !o.SplitRPS && !o.Prio && !o.Fast {
			// Stages leave the IRQ core only once it is busy, and no
			// core can be seen to be busy without knowing which it is:
			// the plan would only add lanes' programs and RPS maps to a
			// path that stays vanilla's. So it leaves the path alone.
			return &plan.Plan{Mode: p.mode, Notes: []string{
				plan.IRQUnknown + "; with spread=busy falcon moves stages off the IRQ core only once it is busy, so it leaves the receive path as vanilla's (no programs, no RPS maps, no agent): give irq-cpus=N to balance, or spread=always to place stages by hash from the start",
			}}, nil
		}
		pl.Notes = append(pl.Notes, plan.IRQUnknown+": split cores may include it")
	}
	// PRISM-batch on top: both classes get a queue on every core the
	// first stage may run on (the split cores and the IRQ core, where the
	// balancer puts it back when the split cores are busy), the
	// high-priority one a real-time kthread.
	var queues []int
	if o.Prio {
		queues = slices.Clone(lay.SplitCPUs)
		switch {
		case len(lay.IRQCPUs) > 0:
			queues = union(queues, lay.IRQCPUs)
		case len(queues) == 0:
			c := cfg.CPUs[len(cfg.CPUs)-1]
			queues = []int{c}
			pl.Notes = append(pl.Notes, fmt.Sprintf("prio: %s: both classes' first stage on core %d", plan.IRQUnknown, c))
		}
		if !o.Split {
			// No split: the first stage stays on the IRQ core, now in two
			// queues there.
			lay.FirstCPUs = queues
		}
	}
	// split=rps: tc ingress on the underlay runs on the split cores too,
	// where it must find its own core in the list.
	lay.CPUs = union(union(union(lay.Set, lay.SplitCPUs), queues), rpsSplit)
	if len(lay.CPUs) > steer.MaxCPUs {
		return nil, fmt.Errorf("falcon steers over at most %d cores, %d given: narrow --cpus", steer.MaxCPUs, len(lay.CPUs))
	}

	port, vnis, err := plan.VXLANIDs(t, pl)
	if err != nil {
		return nil, err
	}
	dir := plan.PinDir(t.Target())
	setup := steer.Setup{
		// tc ingress on the underlay (steerStages) counts the split
		// stage's frames seen; without it there is nothing to count for.
		// A class change is a move of the first stage, so with prio
		// the split stage's queue is always counted.
		Config: steer.Config{Enabled: true, CPUs: lay.CPUs, Flowlet: o.Flowlet, Drain: o.Drain, VXLANPort: port, VNIs: vnis,
			CountSplit: (o.Split && (o.Pipeline || o.Balance)) || o.Prio, Prio: o.Prio, StayQueued: o.Stay == StayQueued},
		QueueSize:  o.QueueSize,
		RTPriority: o.RTPriority,
	}
	if o.Fast {
		fast.Configure(&setup.Config)
	}
	if o.Split {
		setup.CPUMap = lay.SplitCPUs
	}
	if o.Prio {
		setup.CPUMap = queues
		setup.HiCPUMap = queues
		setup.HiRTPriority = o.Classes.HighRT()
		home := -1 // the IRQ core, where it is one of the steering cores
		if i, ok := HomeIndex(lay); ok {
			home = lay.CPUs[i]
		}
		if o.BulkInline {
			bulkInline(&setup, lay, t, home, pl)
		}
		// PRISM's own step: high=auto and bulk=auto at home, where
		// bulkInline made a flow's move between the NIC poll and home's
		// queues order-safe; its switch runs beside the balancer.
		high, err := o.Classes.Compose(&setup, t, lay.IRQCPUs, home, pl)
		if err != nil {
			return nil, err
		}
		pl.Agent = plan.Agents(pl.Agent, high)
	}

	// bpffs, the pin directory and the loaded datapath come first and go
	// last, so a reset after any crash still finds and removes every pin.
	pl.Add(&attach.BPFFS{Path: plan.BPFFS}, "mounted", plan.BPFFS, "bpffs for lanes' pinned programs and maps")
	pl.Add(&attach.PinDir{Path: dir}, "present", dir, "pin directory of this namespace's BPF objects")
	val, err := setup.Encode()
	if err != nil {
		return nil, err
	}
	pl.Add(&steer.DatapathKnob{Dir: dir}, val, dir, "steering programs and maps, placement at stay (vanilla)")
	if o.Fast {
		// First on every hook the two share: Falcon's programs see only
		// what the fast path leaves to the kernel's path.
		fast.Beside(pl, t, dir)
	}

	// Programs attach from the end of the path to its start, so each
	// stage's queue is counted seen before anything counts frames into it.
	steerStages := o.Pipeline || o.Balance
	mask := cpuset.FormatMask(lay.CPUs)
	if steerStages {
		// The end of the container stage's queue first, so that every
		// frame tc egress counts in flight is counted seen too.
		for i := range t.Containers {
			for j := range t.Containers[i].Interfaces {
				ifc := &t.Containers[i].Interfaces[j]
				if ifc.HostVeth == "" {
					continue
				}
				pl.Add(&attach.TCX{NetNS: ifc.NetNS, Device: ifc.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCSeen, Link: plan.LinkPin(dir, "tcx-seen", ifc.NetNS, ifc.Name)},
					"attached", plan.DevLabel(ifc.NetNS, ifc.Name)+" tc ingress", "container stage: count its frames seen, so moves wait for its queue to drain")
			}
		}
		nveth := 0
		for i := range t.Veths {
			v := &t.Veths[i]
			if v.PeerNetNS == "" || v.PeerNetNS == "unknown" {
				continue
			}
			nveth++
			pl.Add(&attach.TCX{NetNS: v.NetNS, Device: v.Name, Direction: "egress", Prog: dir + "/" + steer.PinTCEgress, Link: plan.LinkPin(dir, "tcx-out", v.NetNS, v.Name)},
				"attached", plan.DevLabel(v.NetNS, v.Name)+" tc egress", "container stage: choose the core RPS in the container uses")
		}
		if nveth == 0 {
			pl.Notes = append(pl.Notes, "no container veths found: the container stage is not steered")
		}
		for i := range t.VXLANs {
			d := &t.VXLANs[i].Device
			for _, q := range d.RxQueues {
				pl.RPSByHash(d, q, mask, "bridge stage follows the hash tc ingress set")
			}
		}
		for i := range t.Containers {
			for j := range t.Containers[i].Interfaces {
				ifc := &t.Containers[i].Interfaces[j]
				if ifc.HostVeth == "" {
					continue
				}
				for _, q := range ifc.RxQueues {
					pl.RPSByHash(&ifc.Device, q, mask, "container stage follows the hash tc egress set")
				}
			}
		}
	}

	for _, u := range t.Underlays {
		// tc ingress also counts the split stage's frames seen. Split
		// alone never moves a flow (its table is static), so it needs no
		// count.
		switch {
		case steerStages:
			pl.Add(&attach.TCX{NetNS: u.NetNS, Device: u.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCIngress, Link: plan.LinkPin(dir, "tcx-in", u.NetNS, u.Name)},
				"attached", plan.DevLabel(u.NetNS, u.Name)+" tc ingress", "bridge stage: choose the core RPS on the VXLAN device uses; count split frames seen")
		case o.Prio:
			pl.Add(&attach.TCX{NetNS: u.NetNS, Device: u.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCSplitSeen, Link: plan.LinkPin(dir, "tcx-in", u.NetNS, u.Name)},
				"attached", plan.DevLabel(u.NetNS, u.Name)+" tc ingress", "count the first stage's frames out of their queue, so a class change waits for it")
		}
		if o.Split || o.Prio {
			pl.Add(&attach.XDP{NetNS: u.NetNS, Device: u.Name, Prog: dir + "/" + steer.PinXDP, Link: plan.LinkPin(dir, "xdp", u.NetNS, u.Name)},
				"attached", plan.DevLabel(u.NetNS, u.Name)+" xdp", "split (or classify): hand frames to their first stage's queue before skb allocation")
		}
	}

	// split=rps: the underlay's own RPS hands each skb to a split core.
	if len(rpsSplit) > 0 {
		for i := range t.Underlays {
			u := &t.Underlays[i]
			for _, q := range u.RxQueues {
				pl.RPSByHash(u, q, cpuset.FormatMask(rpsSplit), "split=rps: decapsulation and everything after on split cores "+cpuset.FormatList(rpsSplit))
			}
		}
		pl.Notes = append(pl.Notes, fmt.Sprintf("split=rps: the NIC poll allocates each skb (and runs the underlay's GRO) on the IRQ core, then RPS on the underlay hands it to split core(s) %s, picked by the kernel's hash of the outer headers, which run decapsulation, the VXLAN GRO cell and the rest; static: the balancer neither moves this stage nor switches it off",
			cpuset.FormatList(rpsSplit)))
	}

	// Last: switch placement on. Moves from "stay" obey the flowlet rule.
	tables := InitialTables(o, lay)
	for s := 0; s < steer.NumStages; s++ {
		if allStay(tables[s]) {
			continue
		}
		pl.Add(&steer.TableKnob{Dir: dir, Stage: s}, steer.FormatTable(tables[s]), dir+" "+steer.StageName(s), "placement of the "+steer.StageName(s)+" stage")
	}
	pl.Notes = append(pl.Notes, fmt.Sprintf("cores: set %s, split %s, irq %s; flowlet %v, drain %v",
		cpuset.FormatList(lay.Set), orNone(union(lay.SplitCPUs, rpsSplit)), orNone(lay.IRQCPUs), o.Flowlet, o.Drain))
	if o.Prio {
		pl.Notes = append(pl.Notes, fmt.Sprintf("prio: high-priority queues on cores %s at FIFO %d, bulk queues at %s; mark flows with `lanes prio add`", cpuset.FormatList(queues), o.Classes.HighRT(), rtName(o.RTPriority)))
		if i, ok := HomeIndex(lay); ok && o.spreadBusy() && o.Split {
			pl.Notes = append(pl.Notes, fmt.Sprintf("prio: every flow's first stage starts in core %d's queues (its IRQ core) and leaves for the split cores only once that core is busy", lay.CPUs[i]))
		}
	}
	if o.Balance {
		pl.Notes = append(pl.Notes, fmt.Sprintf("balancing: threshold %.0f%%, interval %v; run `lanes agent` to balance", o.Threshold, o.Interval))
	}
	if o.spreadBusy() && (o.Pipeline || o.Split) {
		pl.Notes = append(pl.Notes, "spread=busy: stages stay on the IRQ core until it passes the threshold; `lanes agent` then sends them to their hashed cores (spread=always places them by hash from the start)")
	}
	return pl, nil
}

// bulkInline composes PRISM's bulk placement (prism.Plan's bulk in the NIC
// poll while no flow is marked): a bulk flow whose first stage the table
// puts in the IRQ core's queues, its home, runs in the NIC poll instead,
// where the queue's hop buys nothing. Only where the NIC is polled on the
// IRQ core alone and merges no inner UDP, as for prism
// (plan.FastMoveBlocked): there steer_xdp moves a flow between the NIC
// poll and that core's queues in order at once when the first rule comes.
// A first stage the balancer spread to another core takes that core's
// queue as before.
func bulkInline(setup *steer.Setup, lay Layout, t *topology.Topology, home int, pl *plan.Plan) {
	if why := plan.FastMoveBlocked(t, lay.IRQCPUs, home); why != "" {
		pl.Notes = append(pl.Notes, "prio: bulk flows take their first stage's queue even while no flow is marked: "+why)
		return
	}
	setup.Config.PrioIdleInline, setup.Config.InlineCPU = true, home
	pl.Notes = append(pl.Notes, fmt.Sprintf("prio: while no flow is marked, bulk flows whose first stage is at home run it in core %d's NIC poll, as in vanilla; the first rule (lanes prio add) sends them to that core's bulk queue in order", home))
}

// StaticTables is the placement before any balancing: Falcon's
// cpus[hash % n] for the pipelined stages, the split cores round robin
// over buckets for the split stage, "stay" for what is off.
func StaticTables(o Options, lay Layout) [steer.NumStages][steer.Buckets]uint32 {
	var t [steer.NumStages][steer.Buckets]uint32
	for s := range t {
		for b := range t[s] {
			t[s][b] = steer.Stay
		}
	}
	idx := func(c int) uint32 { return uint32(slices.Index(lay.CPUs, c)) }
	for b := 0; b < steer.Buckets; b++ {
		switch {
		case len(lay.SplitCPUs) > 0:
			t[steer.StageSplit][b] = idx(lay.SplitCPUs[b%len(lay.SplitCPUs)])
		case len(lay.FirstCPUs) > 0:
			t[steer.StageSplit][b] = idx(lay.FirstCPUs[b%len(lay.FirstCPUs)])
		}
		if o.Pipeline {
			c := lay.Set[b%len(lay.Set)]
			t[steer.StageBridge][b] = idx(c)
			t[steer.StageContainer][b] = idx(c)
		}
	}
	return t
}

// InitialTables is the placement apply writes: StaticTables, except that
// with spread=busy the stages the balancer spreads start at home and leave
// only once the IRQ core is busy. Home is where the kernel runs a stage
// (Stay), but for the split stage with prio: there it is the IRQ core's
// two queues (HomeIndex), since "stay" would run both classes in the NIC
// poll alike. Without a known IRQ core that stage keeps its static table.
func InitialTables(o Options, lay Layout) [steer.NumStages][steer.Buckets]uint32 {
	t := StaticTables(o, lay)
	for _, s := range HomeFirstStages(o) {
		home := uint32(steer.Stay)
		if s == steer.StageSplit && o.Prio {
			i, ok := HomeIndex(lay)
			if !ok {
				continue
			}
			home = i
		}
		for b := range t[s] {
			t[s][b] = home
		}
	}
	return t
}

// HomeIndex is the IRQ core's index in the datapath's core list: the
// table value of its queues.
func HomeIndex(lay Layout) (uint32, bool) {
	if len(lay.IRQCPUs) != 1 {
		return 0, false
	}
	i := slices.Index(lay.CPUs, lay.IRQCPUs[0])
	return uint32(i), i >= 0
}

// HomeFirstStages are the stages spread=busy keeps home until the IRQ core
// is busy: all three, with prio too (Falcon's rule, whichever class a
// flow is in: a first stage spread from the first packet pays the hop to
// another core where nothing needs it, and on a host whose other cores
// are busy, loses what their queues cannot take).
func HomeFirstStages(o Options) []int {
	if !o.spreadBusy() {
		return nil
	}
	return []int{steer.StageBridge, steer.StageContainer, steer.StageSplit}
}

// autoSplitOff names the veth underlays for which split=auto leaves
// splitting off (Options.SplitAuto); none when o splits regardless. With
// prio, XDP runs anyway (it classifies): there is nothing to save.
func autoSplitOff(o Options, t *topology.Topology) []string {
	if !o.Split || !o.SplitAuto || o.Prio {
		return nil
	}
	var out []string
	for _, u := range t.Underlays {
		if u.Type == "veth" {
			out = append(out, u.Name)
		}
	}
	return out
}

func allStay(t [steer.Buckets]uint32) bool {
	for _, v := range t {
		if v != steer.Stay {
			return false
		}
	}
	return true
}

func union(a, b []int) []int {
	out := slices.Clone(a)
	for _, c := range b {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

func rtName(prio int) string {
	if prio == 0 {
		return "normal scheduling"
	}
	return fmt.Sprintf("FIFO %d", prio)
}

func orNone(c []int) string {
	if len(c) == 0 {
		return "none"
	}
	return cpuset.FormatList(c)
}

func vxNames(t *topology.Topology) string {
	var n []string
	for _, v := range t.VXLANs {
		n = append(n, v.Name)
	}
	return strings.Join(n, ", ")
}

// fastBeside says why the fast path cannot run beside Falcon on t, or nil.
// Where it starts at the VXLAN device (dockerd's overlay namespace), the
// frames it takes have passed the underlay's tc ingress, where Falcon
// counts its bridge stage in flight, and would never be counted out.
func fastBeside(t *topology.Topology) error {
	for i := range t.VXLANs {
		if v := &t.VXLANs[i]; fast.FromVXLAN(t, v) {
			return fmt.Errorf("falcon x-fast=true: %s's underlay lives in another namespace, where the fast path starts at the VXLAN device, past Falcon's bridge stage: use --mode fast there", v.Name)
		}
	}
	return nil
}
