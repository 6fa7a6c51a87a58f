package prism

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/policy/fast"
	"github.com/lanesnet/lanes/topology"
)

func init() {
	plan.Register(&planner{mode: "prism", summary: "PRISM: flows marked with `lanes prio` preempt bulk traffic on the receive core (--set prio-mode=batch|sync)", base: Defaults()})
	plan.Register(&planner{mode: "prism-batch", summary: "PRISM-batch: high-priority flows get their own real-time queue and kthread, preempting bulk work at its batch boundary", base: Defaults()})
	syncBase := Defaults()
	syncBase.PrioMode = "sync"
	plan.Register(&planner{mode: "prism-sync", summary: "PRISM-sync: as batch, and high-priority frames for plainly bridged containers run to completion from XDP (needs `lanes agent` to follow container changes)", base: syncBase})
}

type planner struct {
	mode, summary string
	base          Options
}

func (p *planner) Mode() string         { return p.mode }
func (p *planner) Summary() string      { return p.summary }
func (p *planner) Params() []plan.Param { return params }

// RetiredParams are the settings prism no longer takes (plan.Retired).
func (p *planner) RetiredParams() map[string]string { return retiredParams }

// Prioritizes: every prism mode has the two classes.
func (p *planner) Prioritizes(map[string]string) bool { return true }

// Plan puts both classes' first stage on the receive core through XDP and
// two cpumaps (the steer datapath with priority classes on) and orders
// every receive kthread there by real-time priority (Options.Ladder).
//
//	stage            runs                                 lanes' lever
//	NIC poll         XDP: parse, classify                 underlay NAPI thread at RT
//	first (high)     skb alloc, GRO, outer IP/UDP, decap   high-priority cpumap kthread at RT+3 (or high-rt)
//	first (bulk)     the same for bulk flows               normal cpumap kthread (normal scheduling)
//	bridge           GRO cell, bridge, veth transmit       VXLAN GRO cell threads at RT+1
//	container        inner IP, TCP/UDP, socket            container veth NAPI threads at RT+2
//
// The bridge and container stages share one queue per device between the
// classes (a stock kernel has one). With threaded NAPI their higher rungs
// keep that queue to about one batch; without it (the testbed's VXLAN and
// container veths) they run in softirq as soon as the cpumap kthread that
// fed them ends its batch, so each batch runs to completion before the
// next is taken either way, and a high-priority frame waits behind at most
// the bulk batch in progress. With Options.Bulk inline there is no bulk
// queue: bulk frames run their first stage in the NIC poll, and the
// high-priority kthread preempts that poll instead.
func (p *planner) Plan(t *topology.Topology, cfg plan.Config) (*plan.Plan, error) {
	o, err := Parse(p.base, cfg.Params)
	if err != nil {
		return nil, err
	}
	if len(t.Underlays) == 0 {
		return nil, fmt.Errorf("no underlay device found: prism classifies at the underlay NIC and cannot run without it")
	}
	pl := &plan.Plan{Mode: p.mode}
	// irqCPUs poll the underlay NIC (nil: unknown).
	irqCPUs := plan.IRQCPUsOr(t, o.IRQCPUs)
	core := o.CPU
	if core < 0 {
		if len(irqCPUs) > 0 {
			core = irqCPUs[0]
		} else {
			core = cfg.CPUs[len(cfg.CPUs)-1]
			pl.Notes = append(pl.Notes, fmt.Sprintf("%s: receive core %d (or give --set cpu=N)", plan.IRQUnknown, core))
		}
	}
	if !slices.Contains(cfg.CPUs, core) {
		return nil, fmt.Errorf("receive core %d is not among the cores lanes may use (%s): give --set cpu=N or widen --cpus", core, cpuset.FormatList(cfg.CPUs))
	}
	if ok, why := steer.KernelSupport(); !ok {
		pl.Notes = append(pl.Notes, "no GRO in the cpumap kthreads ("+why+"): TCP bulk flows are received unmerged, which costs throughput")
	}
	port, vnis, err := plan.VXLANIDs(t, pl)
	if err != nil {
		return nil, err
	}
	lad := o.Ladder()
	inline := o.High == HighInline
	var pairs []vethPair
	if o.VethQueues == VethClass {
		if pairs, err = vethPairs(t); err != nil {
			return nil, err
		}
	}
	dir := plan.PinDir(t.Target())
	setup := steer.Setup{
		// CountSplit: a flow that changes class moves between the two
		// queues (or onto sync's shortcut), so it waits for the old one to
		// drain like any move; steer_tc_split_seen below counts the frames
		// out.
		Config: steer.Config{Enabled: true, Prio: true, CountSplit: true, CPUs: []int{core},
			Flowlet: steer.DefaultFlowlet, Drain: steer.DefaultDrain, VXLANPort: port, VNIs: vnis,
			Sync: o.PrioMode == "sync", VethClass: len(pairs) > 0},
		CPUMap: []int{core}, QueueSize: o.QueueSize, RTPriority: lad.Low,
	}
	if o.Fast {
		fast.Configure(&setup.Config)
	}
	if o.BulkSched != SchedNormal {
		setup.BulkPolicy = o.BulkSched
	}
	// Inline: no high-priority queue. steer_xdp's redirect of a
	// high-priority frame to the core's missing entry then falls back to
	// XDP_PASS, so the frame runs on in the NIC poll that classified it
	// (tested in datapath/steer's TestPrioClassifies).
	if !inline {
		setup.HiCPUMap, setup.HiRTPriority = []int{core}, lad.High
	}
	// Bulk inline: no bulk queue, the same fallback keeps bulk frames in
	// the NIC poll.
	bulkInline := o.Bulk == BulkInline
	if bulkInline {
		setup.CPUMap, setup.RTPriority = nil, 0
	} else if !inline && slices.Equal(irqCPUs, []int{core}) && t.MergesInnerUDP() != "" {
		// GRO that merges inner UDP datagrams leaves the move out of the
		// NIC poll no frame it knows ends a segment (see topology's MergesInnerUDP).
		if o.Quiet != 0 {
			return nil, fmt.Errorf("prism quiet=%v keeps bulk in the NIC poll while marked flows pause, which this host does not allow: %s (a UDP datagram need not end a GRO segment): drop quiet or turn those features off", o.Quiet, t.MergesInnerUDP())
		}
		pl.Notes = append(pl.Notes, "bulk flows take the bulk queue even while no flow is marked: "+t.MergesInnerUDP()+
			", so a UDP datagram need not end a GRO segment and a flow could not leave the NIC poll in order without an idle gap")
	} else if !inline && slices.Equal(irqCPUs, []int{core}) {
		// While no flow is marked, bulk keeps vanilla's path: the queue's
		// hop buys nothing then, and it costs a bulk TCP stream a large part
		// of its rate. steer_xdp moves a flow between
		// the NIC poll and the queues without an idle gap, which is
		// order-safe only where the NIC is polled on the receive core
		// alone: elsewhere a busy flow would wait for an idle gap to
		// reach the queue once a rule exists. Not with high=inline: a
		// flow moved to the missing high queue would run on in the NIC
		// poll with its marking changed.
		setup.Config.PrioIdleInline, setup.Config.InlineCPU = true, core
		setup.Config.PrioQuiet = o.Quiet
		if o.Quiet != 0 {
			pl.Notes = append(pl.Notes, fmt.Sprintf("quiet=%v: bulk flows also run in the NIC poll once no high-priority frame came for %v; the first one after such a pause ends it, and it and those right behind it find bulk still in the NIC poll, as vanilla serves them", o.Quiet, o.Quiet))
		}
		pl.Notes = append(pl.Notes, "no flow marked yet: bulk flows run in the NIC poll as in vanilla until the first rule (lanes prio add) sends them to the bulk queue; moving a flow there without an idle gap needs the NIC to merge no inner UDP: rx-gro-list and rx-udp-gro-forwarding were off at apply; turning either on later needs lanes apply again")
	}
	switchHigh, err := o.autoClasses(&setup, t, irqCPUs, core, pl)
	if err != nil {
		return nil, err
	}
	if o.Quiet != 0 && !setup.Config.PrioIdleInline {
		irq := "unknown (give --set " + plan.IRQKey + "=N)"
		if len(irqCPUs) > 0 {
			irq = cpuset.FormatList(irqCPUs)
		}
		return nil, fmt.Errorf("prism quiet=%v moves bulk between the NIC poll and the bulk queue, which is order-safe only where the NIC is polled on the receive core (%d) alone, and the underlay's IRQ core is %s: drop quiet, or receive on the one IRQ core (--set cpu=N)", o.Quiet, core, irq)
	}
	val, err := setup.Encode()
	if err != nil {
		return nil, err
	}
	pl.Add(&attach.BPFFS{Path: plan.BPFFS}, "mounted", plan.BPFFS, "bpffs for lanes' pinned programs and maps")
	pl.Add(&attach.PinDir{Path: dir}, "present", dir, "pin directory of this namespace's BPF objects")
	var sp SyncPlan
	if setup.Config.Sync {
		sp = Sync(t, ReadSyncFacts(t))
		// GRO gives a container's veth its NAPI, without which its host
		// side drops every redirected frame; before anything redirects.
		for _, g := range sp.GRO {
			pl.Add(knobs.Feature(g.NetNS, g.Device, ethtool.GRO), "on", plan.DevLabel(g.NetNS, g.Device)+" gro",
				"sync: "+g.HostVeth+" takes redirected frames only while its peer polls with NAPI")
		}
	}
	what := fmt.Sprintf("steering with priority classes: bulk queue at %s, high-priority queue at %s, on core %d", fifo(lad.Low), fifo(lad.High), core)
	if inline {
		what = fmt.Sprintf("steering with priority classes: bulk queue at %s on core %d, high-priority frames inline in the NIC poll", fifo(lad.Low), core)
	}
	if bulkInline {
		what = fmt.Sprintf("steering with priority classes: bulk frames inline in the NIC poll, high-priority queue at %s, on core %d", fifo(lad.High), core)
	}
	if o.High == HighAuto {
		what = fmt.Sprintf("steering with priority classes: bulk queue at %s, high-priority queue at %s for the flows of a light rule and the NIC poll for those of a busy one (high=auto), on core %d", fifo(lad.Low), fifo(lad.High), core)
	}
	if o.NetdevBudget > 0 {
		// net.core.netdev_budget is global and only the initial network
		// namespace shows it; an empty namespace is lanes' own, so lanes
		// must run there.
		budget := knobs.Sysctl("", "net.core.netdev_budget")
		if _, err := budget.Read(); err != nil {
			return nil, fmt.Errorf("prism netdev-budget=%d sets net.core.netdev_budget, which only the host's initial network namespace has, and lanes cannot read it here (%v): run lanes in the host's namespace or drop netdev-budget", o.NetdevBudget, err)
		}
		pl.Add(budget, strconv.Itoa(o.NetdevBudget), "host net.core.netdev_budget",
			fmt.Sprintf("NET_RX softirq rounds of at most %d frames, so the high-priority queue's kthread takes the core sooner", o.NetdevBudget))
		pl.Notes = append(pl.Notes, fmt.Sprintf("netdev-budget=%d: net.core.netdev_budget changes for the whole host (every NIC's softirq rounds), not only for this namespace; lanes reset puts back the value it had", o.NetdevBudget))
	}
	addVethQueues(pl, pairs)
	pl.Add(&steer.DatapathKnob{Dir: dir}, val, dir, what)
	if o.Streamline && len(guarded(t)) > 0 {
		// The NIC poll goes on the ladder, above bulk work: the guard
		// takes it off under overload (guard.go).
		pl.Agent = GuardAgentName
		pl.Notes = append(pl.Notes, "the NIC poll runs real-time above bulk processing: run `lanes agent` so that under overload it is taken off the ladder before bulk throughput collapses")
	}
	if switchHigh {
		pl.Agent = GuardAgentName
	}
	if o.BulkSched == SchedIdle {
		pl.Agent = GuardAgentName
		pl.Notes = append(pl.Notes, "bulk-sched=idle: run `lanes agent`, whose guard gives the bulk queue normal scheduling while a busy application on the receive core starves it")
	}
	if setup.Config.Sync {
		pl.Agent = SyncAgentName
		pl.Add(&steer.SyncKnob{Dir: dir, NetNS: t.NetNS, TTL: syncTTL(o.SyncInterval)}, steer.FormatSyncSet(sp.Set()), dir+" sync",
			fmt.Sprintf("sync: %d destinations the bridge forwards to plainly", len(sp.Targets)))
		pl.Notes = append(pl.Notes, sp.Notes...)
		pl.Notes = append(pl.Notes, fmt.Sprintf("sync: %d destinations now, which lapse %v after the apply unless `lanes agent` runs: it renews them, and follows containers and filters as they change (every %v and on each change)", len(sp.Targets), syncTTL(o.SyncInterval), o.SyncInterval))
	}
	if o.Fast {
		// Before the classes' programs on the hooks the two share.
		fast.Beside(pl, t, dir)
	}

	// The ladder, from the end of the path to its start.
	rung := func(d *topology.Device, prio int, pin bool, stage string) {
		if len(d.NAPIThreads) == 0 {
			pl.Notes = append(pl.Notes, fmt.Sprintf("%s: threaded NAPI off, so the %s stage runs in softirq right after the batch that fed it, in the feeding kthread (already in path order); it gets no priority of its own", plan.DevLabel(d.NetNS, d.Name), stage))
			return
		}
		for _, th := range d.NAPIThreads {
			if pin {
				pl.Add(knobs.Affinity(th.Comm, th.Index), cpuset.FormatList([]int{core}), plan.DevLabel(d.NetNS, d.Name)+" "+th.Comm, stage+" stage on the receive core")
			}
			if !o.Streamline {
				continue
			}
			pl.Add(knobs.Sched(th.Comm, th.Index), fmt.Sprintf("policy=fifo prio=%d nice=0", prio), plan.DevLabel(d.NetNS, d.Name)+" "+th.Comm, stage+" stage above the earlier ones")
		}
	}
	for i := range t.Containers {
		for j := range t.Containers[i].Interfaces {
			// veth-queues=class schedules these per queue (addVethPollers).
			if ifc := &t.Containers[i].Interfaces[j]; ifc.HostVeth != "" && len(pairs) == 0 {
				rung(&ifc.Device, lad.Container, o.Pin, "container")
			}
		}
	}
	// A GRO cell's thread may only run on the core that decapsulates into
	// its cell (plan.GROCellNotes): pin the cells' threads to the receive
	// core only when every frame is decapsulated there, that is when the
	// underlay's NIC poll (bulk inline, quiet, no flow marked) runs there
	// too.
	pinCells := o.Pin && slices.Equal(irqCPUs, []int{core})
	for i := range t.VXLANs {
		v := &t.VXLANs[i]
		if len(v.NAPIThreads) > 0 && !pinCells {
			// Unpinned, the cells' threads are left as they are: a
			// real-time one would be pushed off a core running a
			// higher rung, away from its cell.
			pl.Notes = append(pl.Notes, fmt.Sprintf("%s: GRO cell threads left alone (not pinned, not on the ladder): frames are decapsulated off the receive core %d too (in the NIC poll), or pin=false, and a cell's thread must run where its cell is filled",
				plan.DevLabel(v.NetNS, v.Name), core))
			continue
		}
		rung(&v.Device, lad.GRO, pinCells, "bridge")
	}
	for i := range t.Underlays {
		// The NIC poll stays where its IRQ is.
		rung(&t.Underlays[i], lad.NIC, false, "NIC poll")
	}
	for _, u := range t.Underlays {
		pl.Add(&attach.TCX{NetNS: u.NetNS, Device: u.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCSplitSeen, Link: plan.LinkPin(dir, "tcx-in", u.NetNS, u.Name)},
			"attached", plan.DevLabel(u.NetNS, u.Name)+" tc ingress", "count the first stage's frames out of their queue, so a class change waits for it")
		pl.Add(&attach.XDP{NetNS: u.NetNS, Device: u.Name, Prog: dir + "/" + steer.PinXDP, Link: plan.LinkPin(dir, "xdp", u.NetNS, u.Name)},
			"attached", plan.DevLabel(u.NetNS, u.Name)+" xdp", "classify at the NIC poll, hand each class to its queue")
	}
	attachVethQueues(pl, pairs, dir)
	addVethPollers(pl, pairs, o, core)
	if len(pairs) > 0 {
		pl.Notes = append(pl.Notes, vethNote(pairs))
	}
	// Last: every bucket to the receive core, which switches the queues on.
	var tab [steer.Buckets]uint32
	pl.Add(&steer.TableKnob{Dir: dir, Stage: steer.StageSplit}, steer.FormatTable(tab), dir+" split", "both classes' first stage on the receive core")
	if inline {
		// Inline without the ladder nothing is real-time: high-priority
		// frames still run ahead of bulk work, which waits in its queue.
		nic := 0 // normal scheduling
		if o.Streamline {
			nic = lad.NIC
		}
		pl.Notes = append(pl.Notes, fmt.Sprintf("receive core %d; mark flows with `lanes prio add`; high=inline: high-priority frames run in the NIC poll (%s), bulk frames in the queue at %s",
			core, fifo(nic), fifo(lad.Low)))
	} else if bulkInline {
		pl.Notes = append(pl.Notes, fmt.Sprintf("receive core %d; mark flows with `lanes prio add`; bulk=inline: bulk frames run in the NIC poll (normal scheduling), high-priority frames in their queue at %s, which takes the core at the poll's batch boundary",
			core, fifo(lad.High)))
	} else if o.Streamline {
		pl.Notes = append(pl.Notes, fmt.Sprintf("receive core %d; mark flows with `lanes prio add`; ladder: bulk queue %s < NIC poll FIFO %d < GRO cells %d < container veths %d < high-priority queue %d",
			core, fifo(lad.Low), lad.NIC, lad.GRO, lad.Container, lad.High))
	} else {
		bulk := fifo(lad.Low)
		if o.BulkSched != SchedNormal {
			bulk = "SCHED_" + strings.ToUpper(o.BulkSched)
		}
		pl.Notes = append(pl.Notes, fmt.Sprintf("receive core %d; mark flows with `lanes prio add`; bulk queue at %s, NIC poll and later stages as the kernel runs them, high-priority queue at %s",
			core, bulk, fifo(lad.High)))
	}
	if o.BulkSched != SchedNormal {
		pl.Notes = append(pl.Notes, fmt.Sprintf("bulk-sched=%s: the bulk queue's kthread runs SCHED_%s, so applications on core %d (the high-priority service's among them) %s",
			o.BulkSched, strings.ToUpper(o.BulkSched), core, map[string]string{SchedBatch: "are never preempted by a woken receive kthread", SchedIdle: "take the core from bulk receive work at once; bulk gets what they leave"}[o.BulkSched]))
	}
	return pl, nil
}

// guarded are the NAPI threads of t's underlays: the NIC poll the ladder
// raises and the overload guard watches.
func guarded(t *topology.Topology) []string {
	var out []string
	for _, u := range t.Underlays {
		for _, th := range u.NAPIThreads {
			out = append(out, th.Comm)
		}
	}
	return out
}

func fifo(prio int) string {
	if prio == 0 {
		return "normal scheduling"
	}
	return fmt.Sprintf("FIFO %d", prio)
}

// bulkQuietNote is what the plan says of high=auto's bulk quiet.
func bulkQuietNote(o Options) string {
	if o.BulkQuiet == 0 {
		return ""
	}
	return fmt.Sprintf("; and steer_xdp runs every high-priority flow in the NIC poll while no bulk frame came for %v (bulk-quiet), agent or not", o.BulkQuiet)
}

// asideNote is what the plan says of stepping aside (aside-below).
func asideNote(o Options) string {
	if o.AsideBelow == 0 {
		return ""
	}
	if o.AsideDepth == 0 {
		return fmt.Sprintf("; the agent also steps PRISM aside (every flow in the NIC poll, as vanilla runs it) while the receive core's receive work stays under %d%% of it for %s (aside-below), and puts the queues back after %s at or above it", o.AsideBelow, asideFor, asideBack)
	}
	return fmt.Sprintf("; the agent also steps PRISM aside (every flow in the NIC poll, as vanilla runs it) while the underlay NIC's polls on the receive core find fewer than %g frames each for %s (aside-depth; where it cannot count them, while the core's receive work stays under %d%%, aside-below), and puts the queues back after %s at or above it", o.AsideDepth, asideFor, o.AsideBelow, asideBack)
}
