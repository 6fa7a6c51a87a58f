package control

import (
	"fmt"
	"net/netip"
	"sort"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/topology"
	"golang.org/x/sys/unix"
)

// recentFlow is how recently a (flow, stage) must have seen a packet to be
// listed on a core.
const recentFlow = 5 * time.Second

// Steering is what the steering datapath of a target shows: which
// (flow, stage) runs on which core, and per stage what the programs did.
type Steering struct {
	PinDir string                    `json:"pin_dir"`
	Stages map[string]steer.Counters `json:"stages"`
	// Home lists the stages on their at-home fast path (Falcon's agent,
	// spread=busy): vanilla placement, no per-flow work.
	Home []string `json:"home,omitempty"`
	// Stay lists (flow, stage) pairs left at vanilla placement: they run
	// where the previous stage ran.
	Stay []FlowStage `json:"stay,omitempty"`
	// Prio is on when the datapath has priority classes (prism), with the
	// rules that mark flows high priority.
	Prio  bool     `json:"prio,omitempty"`
	Rules []string `json:"prio_rules,omitempty"`
	// BulkInlineIdle: bulk flows keep the NIC poll while no rule exists
	// (steer.Config.PrioIdleInline).
	BulkInlineIdle bool `json:"bulk_inline_while_no_rule,omitempty"`
	// HighInline: the rules whose flows run their first stage in the NIC
	// poll now (PRISM's high=auto: their switches are on under a config
	// with high=auto).
	HighInline []string `json:"high_inline_rules,omitempty"`
	// StayQueued: a flow staying at the bridge stage goes through its
	// core's RPS backlog (steer.Config.StayQueued), not run on.
	StayQueued bool `json:"stay_queued,omitempty"`
	// QuietMs is steer.Config.PrioQuiet: bulk also keeps the NIC poll
	// while no high-priority frame came for this long. SinceHighMs is how
	// long ago the last one came (nil: none yet, or quiet off); Quiet says
	// whether the high class is quiet now (steer.QuietAfter).
	QuietMs int64 `json:"quiet_ms,omitempty"`
	// BulkQuietMs is steer.Config.BulkQuiet: high-priority flows also run
	// in the NIC poll while no bulk frame came for this long (high=auto);
	// BulkQuiet says whether that is so now, SinceBulkMs how long ago the
	// last bulk frame came (nil: none yet).
	BulkQuietMs int64  `json:"bulk_quiet_ms,omitempty"`
	BulkQuiet   bool   `json:"bulk_quiet,omitempty"`
	SinceBulkMs *int64 `json:"since_bulk_ms,omitempty"`
	SinceHighMs *int64 `json:"since_high_ms,omitempty"`
	// BulkAutoMs is steer.Config.BulkAuto (PRISM's bulk=auto): bulk flows
	// also run in the NIC poll while every high-priority frame of that
	// window ran there as a busy rule's; BulkBesideBusy says whether that
	// is so now.
	BulkAutoMs     int64 `json:"bulk_auto_ms,omitempty"`
	BulkBesideBusy bool  `json:"bulk_beside_busy,omitempty"`
	Quiet          bool  `json:"quiet,omitempty"`
	// MicroFlows counts the micro-flows (MFLOW) sent to each core, and
	// Elephants lists the flows being split now.
	MicroFlows map[int]uint64 `json:"micro_flows_per_core,omitempty"`
	Elephants  []Elephant     `json:"elephants,omitempty"`
	// Sync is on when high-priority frames may run to completion
	// (PRISM-sync), to the destinations listed; Shortcut lists the flows
	// on it now.
	Sync        bool        `json:"sync,omitempty"`
	SyncTargets []string    `json:"sync_targets,omitempty"` // "VNI/MAC > veth (MTU)"
	Shortcut    []FlowStage `json:"shortcut,omitempty"`
	// Fast is on when the fast path into the container is (the fast
	// mode); FastEntries lists its flows (fastEntries), FastLease says
	// how long lanes agent's word holds from now (0: it holds nothing).
	Fast        bool          `json:"fast,omitempty"`
	FastEntries []string      `json:"fast_entries,omitempty"`
	FastLease   time.Duration `json:"fast_lease_ns,omitempty"`
	// Queues is the split-stage queue accounting of each core that took
	// frames (its cpumap queues of both classes and the NIC poll's marked
	// frames); QueuesTracked whether it can tell a core's queues empty
	// (the kernel's drop tracepoints are attached), so flows counted in
	// flight there move once their frames are out instead of after the
	// drain time.
	Queues        []steer.Queue `json:"split_queues,omitempty"`
	QueuesTracked bool          `json:"split_queues_tracked"`
	// LaterDropsTracked: frames the later stages (RPS backlogs, GRO
	// cells, per-class container queues) counted in flight and the kernel
	// dropped are counted out of their flow's count (skb:kfree_skb), so
	// only frames that leave the path without a drop leave a flow on the
	// drain time.
	LaterDropsTracked bool `json:"later_drops_tracked"`
	// VethClass: each class has its own receive queue of the container
	// veths (prism veth-queues=class); VethFlows are the flows there that
	// sent lately or have frames not yet out of their queue (0 bulk, 1
	// high priority).
	VethClass bool       `json:"veth_class,omitempty"`
	VethFlows []VethFlow `json:"veth_flows,omitempty"`
}

// VethFlow is a flow at the per-class container queues.
type VethFlow struct {
	Flow     string `json:"flow"`
	Queue    int    `json:"queue"`
	InFlight int64  `json:"in_flight"`
}

// Elephant is a flow MFLOW splits into micro-flows.
type Elephant struct {
	Flow       string `json:"flow"`
	Stage      string `json:"stage"` // where it is split: split (at the NIC poll) or bridge
	MicroFlows uint32 `json:"micro_flows"`
	Frames     uint64 `json:"frames"` // sent as micro-flows
	CPU        int    `json:"cpu"`    // core of the current micro-flow
}

// FlowStage is one stage of one flow, as the datapath placed it.
type FlowStage struct {
	Flow    string `json:"flow"` // "198.19.0.11:40000 > 198.19.0.21:5201 tcp"
	Stage   string `json:"stage"`
	Packets uint64 `json:"packets"`
	IdleMs  int64  `json:"idle_ms"`
	High    bool   `json:"high_priority,omitempty"` // in the core's high-priority queue
	// Marked: a priority rule marks the flow (split stage), wherever it
	// runs: in the high-priority queue (High) or, under high=auto's
	// switch for that rule, in the NIC poll (Inline).
	Marked bool `json:"marked,omitempty"`
	Inline bool `json:"inline,omitempty"`
	// Rule is the rule that marks it (the first steer_xdp finds, whose
	// high=auto switch moves it: steer.MarkingRule).
	Rule string `json:"rule,omitempty"`
	// Direct (bridge stage, staying): runs on in the VXLAN GRO cell's
	// poll, without a pass through the RPS backlog.
	Direct bool `json:"direct,omitempty"`
	// HeldOn (container stage, staying, with frames in flight): the core
	// whose backlog they are queued in, which the stage keeps however the
	// bridge stage's core changes until they are out; -1: none.
	HeldOn int `json:"held_on"`
	// InFlight is the frames the stage queued that the next stage has
	// not seen yet (a move waits for 0); Uncounted: one went unmarked,
	// so only the drain time ends a wait.
	InFlight  int64 `json:"in_flight,omitempty"`
	Uncounted bool  `json:"uncounted,omitempty"`
}

// steering reads the pinned datapath of netns, if there is one, and lists
// its recent flows on the cores of s.
func steering(s *StatusReport, netns string) error {
	dir := plan.PinDir(netns)
	if !steer.Pinned(dir) {
		return nil
	}
	d, err := steer.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	cfg, err := d.Config()
	if err != nil {
		return err
	}
	st, err := d.Stats()
	if err != nil {
		return err
	}
	flows, err := d.Flows()
	if err != nil {
		return err
	}
	out := &Steering{PinDir: dir, Stages: map[string]steer.Counters{}, Prio: cfg.Prio, StayQueued: cfg.StayQueued}
	if home, err := d.Placement().Home(); err == nil {
		for st, h := range home {
			if h {
				out.Home = append(out.Home, steer.StageName(st))
			}
		}
	}
	var rules, inline []steer.Rule // the priority rules, for the flows they mark; those high=auto runs inline
	if cfg.Prio {
		out.BulkInlineIdle = cfg.PrioIdleInline
		if inline, err = d.Prio().HighInline(); err != nil {
			return err
		}
		for _, r := range inline {
			out.HighInline = append(out.HighInline, r.String())
		}
		if cfg.BulkQuiet > 0 && cfg.HighAutoPPS > 0 {
			if out.BulkQuietMs, out.BulkQuiet, out.SinceBulkMs, err = quietState(cfg.BulkQuiet, d.Prio().BulkQuiet); err != nil {
				return err
			}
		}
		if cfg.BulkAuto > 0 && cfg.HighAutoPPS > 0 {
			out.BulkAutoMs = cfg.BulkAuto.Milliseconds()
			if out.BulkBesideBusy, err = d.Prio().BulkBesideBusy(cfg.BulkAuto); err != nil {
				return err
			}
		}
		if cfg.PrioQuiet > 0 {
			if out.QuietMs, out.Quiet, out.SinceHighMs, err = quietState(cfg.PrioQuiet, d.Prio().HighQuiet); err != nil {
				return err
			}
		}
		rules, err = d.Prio().Rules()
		if err != nil {
			return err
		}
		for _, r := range rules {
			out.Rules = append(out.Rules, r.String())
		}
	}
	for i, c := range st {
		out.Stages[steer.StageName(i)] = c
	}
	if out.Queues, out.QueuesTracked, err = d.Order().Queues(); err != nil {
		return err
	}
	out.LaterDropsTracked = steer.LaterDropsTracked(dir)
	if out.VethClass = cfg.VethClass; cfg.VethClass {
		vf, err := d.Prio().VethFlows()
		if err != nil {
			return err
		}
		now := steer.Now()
		for _, f := range vf {
			if now-f.LastSeen > recentFlow && f.InFlight == 0 {
				continue
			}
			out.VethFlows = append(out.VethFlows, VethFlow{Flow: flowString(f.Src, f.SrcPort, f.Dst, f.DstPort, f.Proto), Queue: f.Queue, InFlight: f.InFlight})
		}
	}
	if out.Sync = cfg.Sync; cfg.Sync {
		ts, err := d.Sync().Targets()
		if err != nil {
			return err
		}
		for _, tg := range ts {
			out.SyncTargets = append(out.SyncTargets, fmt.Sprintf("%d/%s > %s (MTU %d)", tg.VNI, tg.MAC, devName(s.Topology, int(tg.Ifindex)), tg.MTU))
		}
	}
	if out.Fast = cfg.Fast; cfg.Fast {
		if err := fastStatus(out, d, s.Topology); err != nil {
			return err
		}
	}
	if cfg.MFlow.At != steer.SplitOff {
		if out.MicroFlows, err = microFlowsPerCore(d, cfg.CPUs); err != nil {
			return err
		}
	}
	now := steer.Now()
	idx := map[int]*Core{}
	for i := range s.Cores {
		idx[s.Cores[i].CPU] = &s.Cores[i]
	}
	sort.Slice(flows, func(i, j int) bool { return flows[i].Packets > flows[j].Packets })
	for _, f := range flows {
		idle := now - f.LastSeen
		if idle > recentFlow {
			continue
		}
		fs := FlowStage{
			Flow:    flowString(f.Src, f.SrcPort, f.Dst, f.DstPort, f.Proto),
			Stage:   steer.StageName(f.Stage),
			Packets: f.Packets,
			IdleMs:  idle.Milliseconds(),
			High:    f.High,
			Direct:  f.Direct,
			HeldOn:  -1,
		}
		if f.Stage == steer.StageSplit {
			r, marked := steer.MarkingRule(rules, f.Src, f.Dst, f.SrcPort, f.DstPort, f.Proto)
			// Where the datapath has the flow now (not where the
			// switches will send its next frame): in the NIC poll.
			fs.Marked, fs.Inline = marked, marked && !f.High && !f.Sync && f.CPUIndex == steer.Stay
			if marked {
				fs.Rule = r.String()
			}
		}
		if f.StayCore >= 0 && f.InFlight > 0 {
			fs.HeldOn = f.StayCore
		}
		if fs.InFlight = f.InFlight; fs.InFlight >= steer.Uncounted {
			fs.InFlight, fs.Uncounted = fs.InFlight-steer.Uncounted, true
		}
		if m := f.MicroFlow; m.Elephant && int(m.CPUIndex) < len(cfg.CPUs) {
			out.Elephants = append(out.Elephants, Elephant{Flow: fs.Flow, Stage: fs.Stage, MicroFlows: m.Started, Frames: m.Frames, CPU: cfg.CPUs[m.CPUIndex]})
		}
		if f.Sync {
			out.Shortcut = append(out.Shortcut, fs)
			continue
		}
		if f.CPUIndex == steer.Stay || int(f.CPUIndex) >= len(cfg.CPUs) {
			out.Stay = append(out.Stay, fs)
			continue
		}
		if c := idx[cfg.CPUs[f.CPUIndex]]; c != nil {
			c.Stages = append(c.Stages, fs)
		}
	}
	s.Steering = out
	return nil
}

// devName names the host device with ifindex for people: its name when the
// topology knows it, else "ifindex N".
func devName(t *topology.Topology, ifindex int) string {
	if t != nil {
		for _, d := range t.AllDevices() {
			if d.Index == ifindex && d.NetNS == t.NetNS {
				return d.Name
			}
		}
	}
	return fmt.Sprintf("ifindex %d", ifindex)
}

// microFlowsPerCore reads the micro-flows sent to each of cpus.
func microFlowsPerCore(d *steer.Datapath, cpus []int) (map[int]uint64, error) {
	per, err := d.Micro().PerCore()
	if err != nil {
		return nil, err
	}
	out := map[int]uint64{}
	for _, c := range cpus {
		out[c] = per[c]
	}
	return out, nil
}

// fastStatus reads the fast path's valid entries and lease into out.
func fastStatus(out *Steering, d *steer.Datapath, t *topology.Topology) error {
	changes, err := d.Changes()
	if err != nil {
		return err
	}
	deadline, leased, err := d.Fast().Lease()
	if err != nil {
		return err
	}
	if now := steer.Now(); deadline > now && leased == changes {
		out.FastLease = deadline - now
	}
	out.FastEntries, err = fastEntries(d, t, false)
	return err
}

// flowString names a flow for people: "198.19.0.11:40000 > 198.19.0.21:5201 tcp".
func flowString(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, proto uint8) string {
	p := fmt.Sprint(proto)
	switch proto {
	case unix.IPPROTO_TCP:
		p = "tcp"
	case unix.IPPROTO_UDP:
		p = "udp"
	}
	return fmt.Sprintf("%s:%d > %s:%d %s", src, sport, dst, dport, p)
}

// quietState reads a quiet setting (prism's quiet or bulk-quiet) of time q
// for status: q in ms, whether it is quiet now, and how long ago its class
// last sent a frame (nil: none yet).
func quietState(q time.Duration, read func(time.Duration) (bool, time.Duration, bool, error)) (ms int64, quiet bool, since *int64, err error) {
	quiet, ago, seen, err := read(q)
	if err != nil {
		return 0, false, nil, err
	}
	if seen {
		a := ago.Milliseconds()
		since = &a
	}
	return q.Milliseconds(), quiet, since, nil
}
