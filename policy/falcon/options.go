// Package falcon is the Falcon policy (EuroSys'21) on stock kernels: it
// plans where each receive stage of an overlay flow runs (pipelining by
// hash(flow, device)), splits the NIC's first stage in two (XDP on the IRQ
// core, everything after skb allocation on a split core) and runs the
// balancer that moves (flow, stage) pairs off busy cores.
//
// The mechanism lives in datapath/steer (BPF programs and their maps); this
// package only decides. Its planners never touch the kernel: they return a
// plan.Plan the engine journals and applies.
package falcon

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/policy/falcon/balancer"
	"github.com/lanesnet/lanes/policy/fast"
	"github.com/lanesnet/lanes/policy/prism"
)

// Options are Falcon's settings; each mechanism can be switched alone so
// each can be measured alone.
type Options struct {
	// IRQCPUs are the underlay NIC's IRQ cores as the user gave them
	// (plan.IRQKey); nil: read from the NIC (plan.IRQCPUs).
	IRQCPUs []int
	// Pipeline places the bridge and container stages of every flow on
	// cpus[hash(flow, device) % n] (Falcon's softirq pipelining).
	Pipeline bool
	// Split moves skb allocation, GRO and decapsulation off the IRQ core
	// onto a split core (Falcon's softirq splitting).
	Split bool
	// SplitAuto (split=auto, the default) leaves splitting off where its
	// XDP hook costs more than splitting gains: on a veth underlay. There
	// the kernel runs XDP on skbs, copying every frame into a fresh page
	// first (veth lacks the headroom XDP needs): on the testbed the hook
	// costs single-flow TCP part of its rate, while UDP gains the same
	// either way. A real NIC
	// runs XDP on its own buffers, before any skb exists. With Prio the
	// hook classifies anyway, so auto keeps splitting on.
	SplitAuto bool
	// SplitRPS (split=rps) splits at the skb instead: RPS on the
	// underlay's receive queues hands every frame, once the NIC poll has
	// allocated its skb (and run the underlay's GRO), to a split core's
	// backlog, which runs decapsulation, the VXLAN GRO cell and everything
	// after. That is where Falcon's own GRO split hands the skb over
	// (netif_rx from the driver), less the underlay's GRO, and it needs no
	// XDP hook: for NICs whose XDP copies (veth, generic XDP). The core
	// is the kernel's pick by the outer headers' hash over the split
	// cores, fixed per flow; the map is static (changing it could reorder
	// frames in the backlogs), so the balancer neither moves this stage
	// nor switches it off. Split is false with it.
	SplitRPS bool
	// Balance runs the balancer: stages move off cores whose load is over
	// Threshold, and all steering stops while the set's average is over it.
	Balance bool
	// Fast runs the fast path (policy/fast) beside Falcon: a flow the
	// kernel's path delivered goes from the underlay straight into its
	// container, on the core its first stage runs on; Falcon spreads the
	// frames the fast path leaves to the kernel's path.
	Fast bool
	// SplitCPUs are the cores the split stage may use; empty = the set
	// minus the IRQ cores.
	SplitCPUs []int
	// Threshold is the load (percent) above which a core takes no more
	// work (Falcon: 80).
	Threshold float64
	// Fallback is what sends the whole set back to vanilla placement:
	// "average" (Falcon's rule: the set's average load reaches Threshold)
	// or "all" (every core of the set is at Threshold: nowhere left to
	// dispatch to). On a few cores the average counts the receive work
	// Falcon itself spread: see Damp, and docs/falcon.md, Balancing.
	Fallback string
	// Damp keeps the set spread when it climbs back to the fallback level
	// within balancer.CycleRounds of resuming: its own spread work, not
	// other load (balancer.Config.Damp).
	Damp bool
	// HomeRoom is the load another core of the set must be under for
	// stages at home to leave it (spread=busy); 0 means Threshold, Falcon's
	// own dispatch rule. Lower asks for headroom for the stages; it made
	// stages leave home less often without a measurable gain, so the
	// default is the threshold.
	HomeRoom float64
	// Mice (packets/s; 0 = off, Falcon's rule) keeps a (flow, stage)
	// bucket carrying fewer packets per second than this at home when its
	// stage leaves the IRQ core (spread=busy): moving a light flow frees
	// nothing of the busy core and gives each of its packets a cross-core
	// hop. The rate is measured between the agent's rounds; until it is
	// known a bucket counts as heavy.
	Mice float64
	// Hysteresis is how far below Threshold the set's average load must
	// fall before steering resumes after a fallback.
	Hysteresis float64
	// Interval is the balancer's sampling period (Falcon: 10 jiffies, 40 ms
	// at HZ=250).
	Interval time.Duration
	// Flowlet is the idle gap after which a (flow, stage) may move to
	// another core: longer than the old core's queue needs to drain, so a
	// move never reorders.
	Flowlet time.Duration
	// Drain is how long a (flow, stage) whose old queue the datapath still
	// counts as non-empty must be idle before it moves anyway (the frames
	// it misses were dropped on the way). See steer.Config.Drain.
	Drain time.Duration
	// Load is what counts as a core's load: "rx" (softirq time plus
	// receive kthreads: NAPI, cpumap; what the receive path itself costs)
	// or "busy" (all non-idle time, Falcon's own figure, less the time of
	// SCHED_IDLE threads, which give the core up to anything).
	Load string
	// Sampler is where the agent reads that load: "sched" (BPF programs
	// on the scheduler's task switches and softirqs: one map read per
	// sample, nanosecond figures), "proc" (/proc/stat and the threads'
	// /proc files, with a walk of all of /proc once a second: a burst on
	// one core, often the IRQ core, whose NIC poll waits behind it) or
	// "auto" (sched where the kernel can, else proc).
	Sampler string
	// AgentSched is the scheduling policy of the agent's rounds (sample,
	// decide, write the tables): "normal", or "batch" (SCHED_BATCH: a
	// round that wakes up never preempts the task running on its core,
	// the NIC poll's thread on the IRQ core among them; it waits for the
	// next scheduling point, well under a millisecond on a busy core, and
	// gets its fair share as before). Batch against normal made no
	// difference beyond the noise; batch is the default because it takes
	// the rounds out of the NIC poll's way by construction, which matters:
	// rounds at the default interval on the IRQ core cost bulk TCP
	// throughput that rounds ten times rarer did not.
	AgentSched string
	// QueueSize is the cpumap queue length per split core (frames).
	QueueSize uint32
	// RTPriority > 0 runs the split stage's cpumap kthreads SCHED_FIFO.
	RTPriority int
	// Prio composes PRISM-batch with Falcon: flows marked with `lanes
	// prio` get a second cpumap queue on the core their first stage runs
	// on, whose kthread runs SCHED_FIFO (Classes.HighRT), so they preempt
	// bulk work there at batch boundaries; their later stages are placed
	// by the same hash as every flow's.
	Prio bool
	// Classes are PRISM's own class settings (high, high-rt,
	// high-auto-pps, bulk-quiet, bulk), parsed and planned by PRISM's
	// code (prism.Classes): where each class runs at the first stage's
	// home, and the high queues' priority.
	Classes prism.Classes
	// Spread says when the pipelined and split stages leave the core the
	// kernel runs them on (the IRQ core): "always" places every stage by
	// hash from the first packet (Falcon as published); "busy" (with
	// Balance) keeps them there until that core passes the threshold and
	// only then dispatches them to their hashed core, or the least-loaded
	// one. Pipelining costs a cross-core hop per stage, which only pays
	// when the IRQ core is the bottleneck: where it is not, "always" costs
	// ping-pong latency and single-flow TCP throughput.
	Spread string
	// Stay (x-stay) is how a flow that stays at the bridge stage stays:
	// "direct" (the GRO cell's poll runs the stage on, as in vanilla, once
	// none of the flow's frames can be queued;
	// datapath/steer/bpf/place.h's stay_direct) or "queued" (through its
	// own core's RPS backlog, one pass more than vanilla: for measuring
	// what direct saves).
	Stay string
	// Bare (x-bare): at home the bridge stage's program may skip the flow
	// lookup once no flow there would queue (steer.Placement.SetHomeBare);
	// off, for measuring what that saves.
	Bare bool
	// Park (x-park): once every stage has rested at home for a while, the
	// agent takes lanes' programs and RPS maps off the path, so Falcon at
	// home costs what vanilla costs (park.go); off, for measuring that.
	Park bool
	// BulkInline (x-bulk-inline): with Prio, bulk flows whose first stage
	// is at home run it in the IRQ core's NIC poll while no flow is marked
	// (planner.go's bulkInline); off, they take the home bulk queue, for
	// measuring what the hop costs.
	BulkInline bool
}

// Sampler values.
const (
	SamplerAuto  = "auto"
	SamplerSched = "sched"
	SamplerProc  = "proc"
)

// AgentSched values.
const (
	AgentNormal = "normal"
	AgentBatch  = "batch"
)

// Spread values.
const (
	SpreadAlways = "always"
	SpreadBusy   = "busy"
)

// Stay values.
const (
	StayDirect = "direct"
	StayQueued = "queued"
)

// homeRoom is the load under which another core has room for stages
// leaving home.
func (o Options) homeRoom() float64 {
	if o.HomeRoom > 0 {
		return o.HomeRoom
	}
	return o.Threshold
}

// spreadBusy: stages rest at home and move only off a busy core.
func (o Options) spreadBusy() bool { return o.Balance && o.Spread == SpreadBusy }

// Defaults are Falcon's published defaults where it has them.
func Defaults() Options {
	return Options{
		Pipeline:   true,
		Split:      true,
		SplitAuto:  true,
		Balance:    true,
		Threshold:  80,
		Hysteresis: 10,
		Fallback:   balancer.FallbackAverage,
		Damp:       true,
		Interval:   40 * time.Millisecond,
		Flowlet:    steer.DefaultFlowlet,
		Drain:      steer.DefaultDrain,
		Load:       "busy",
		Sampler:    SamplerAuto,
		AgentSched: AgentBatch,
		QueueSize:  2048,
		Classes:    prism.DefaultClasses(),
		Spread:     SpreadBusy,
		Stay:       StayDirect,
		Bare:       true,
		Park:       true,
		BulkInline: true,
	}
}

// params are the keys `lanes apply --mode falcon*` accepts.
var params = slices.Concat([]plan.Param{
	plan.IRQParam,
	{Key: "pipeline", Default: "true", Help: "place the bridge and container stages by hash(flow, device)"},
	{Key: "split", Default: "auto; true in falcon-split", Help: "run skb allocation, GRO and decap on a split core (XDP + cpumap): true, false, auto (on, except on a veth underlay, where the XDP hook copies every frame), or rps (RPS on the underlay: decap and everything after on a split core, skb allocation and the underlay's GRO left on the IRQ core; static)"},
	{Key: "balance", Default: "true", Help: "move stages off cores over the threshold (needs `lanes agent`)"},
	{Key: "split-cpus", Default: "the set minus the IRQ cores", Help: "cores for the split stage, a list like 2-3"},
	{Key: "threshold", Default: "80", Help: "core load (percent) above which a core takes no more stages"},
	{Key: "home-room", Default: "the threshold", Help: "with spread=busy: stages leave the IRQ core only when another core of the set is under this load (percent, at most the threshold; 0 = the threshold)"},
	{Key: "mice", Default: "0", Help: "with spread=busy: flows (hash buckets) under this many packets/s stay on the IRQ core when their stage leaves it, e.g. 10k (0 = every flow moves, as Falcon)"},
	{Key: "hysteresis", Default: "10", Help: "percent below the threshold the average must fall to resume"},
	{Key: "interval", Default: "40ms", Help: "balancer sampling interval"},
	{Key: "flowlet", Default: "1ms", Help: "idle gap after which a flow's stage may move, once its old queue is empty"},
	{Key: "drain", Default: "20ms", Help: "idle time after which a stage moves although the datapath still counts frames in its old queue (they were dropped); not used where the split stage's cpumap queues are tracked (they tell dropped frames from queued ones); 0 = do not wait for the queue"},
	{Key: "load", Default: "busy", Help: "load figure: rx (softirq + NAPI/cpumap threads) or busy (all non-idle time but SCHED_IDLE threads', which yield to anything)"},
	{Key: "queue-size", Default: "2048", Help: "cpumap queue length per split core"},
	{Key: "rt", Default: "0", Help: "SCHED_FIFO priority of the split stage's cpumap kthreads (0 = normal scheduling)"},
	{Key: "prio", Default: "false; true in falcon-prism", Help: "PRISM-batch on top: flows marked with `lanes prio` get their own queue and real-time kthread wherever their first stage runs"},
}, prism.ClassParams(), []plan.Param{
	{Key: "spread", Default: "busy", Help: "when stages leave the IRQ core: busy (with balance: only once it passes the threshold, then to their hashed core) or always (by hash from the first packet, as Falcon)"},
	// For comparison or diagnosis only (plan.ComparisonPrefix): each
	// switches a mechanism off to measure what it saves, picks Falcon's
	// published rule over lanes' (fallback=all, damp=false), or a way of
	// reading load the agent picks by itself (sampler, agent-sched). The
	// old keys are what state files written with them hold.
	{Key: keyFallback, OldKeys: []string{"fallback"}, Default: "average", Help: "when the whole set goes back to vanilla placement: average (Falcon's: the set's average load reaches the threshold) or all (every core of the set is at the threshold)"},
	{Key: keyDamp, OldKeys: []string{"damp"}, Default: "true", Help: "a set that climbs back to the fallback level within 50 samples of resuming carries its own spread work: stay spread and fall back only at the last fallback's load + hysteresis (false: fall back every time, as Falcon)"},
	{Key: keySampler, OldKeys: []string{"sampler"}, Default: "auto", Help: "where the agent reads core load: sched (BPF on the scheduler's task switches: one map read per sample), proc (/proc files, a walk of /proc once a second), auto (sched if the kernel has BTF and tracing programs, else proc)"},
	{Key: keyAgentSched, OldKeys: []string{"agent-sched"}, Default: "batch", Help: "scheduling policy of the agent's rounds: normal, or batch (a waking round never preempts the task on its core, such as the NIC poll)"},
	{Key: keyStay, OldKeys: []string{"stay"}, Default: "direct", Help: "how a flow staying at the bridge stage stays: direct (the VXLAN GRO cell runs the stage on, as vanilla, once none of the flow's frames is queued) or queued (through its core's RPS backlog, one pass more than vanilla)"},
	{Key: keyBare, OldKeys: []string{"bare"}, Default: "true", Help: "at home, the bridge stage's program skips the flow lookup once no flow there would queue (false: always looks up)"},
	{Key: keyPark, OldKeys: []string{"park"}, Default: "true", Help: "once every stage has rested at home for 1 s, take lanes' programs and RPS maps off the path (vanilla's cost) until the IRQ core gets busy (false: they stay on)"},
	{Key: keyBulkInline, Default: "true", Help: "with prio: while no flow is marked, bulk flows whose first stage is at home run it in the IRQ core's NIC poll, as vanilla (false: in the IRQ core's bulk queue, one hop more)"},
	fast.Param,
})

// Keys of the settings for comparison.
const (
	keyFallback   = plan.ComparisonPrefix + "fallback"
	keyDamp       = plan.ComparisonPrefix + "damp"
	keySampler    = plan.ComparisonPrefix + "sampler"
	keyAgentSched = plan.ComparisonPrefix + "agent-sched"
	keyStay       = plan.ComparisonPrefix + "stay"
	keyBare       = plan.ComparisonPrefix + "bare"
	keyPark       = plan.ComparisonPrefix + "park"
	keyBulkInline = plan.ComparisonPrefix + "bulk-inline"
)

// Parse reads params over base, under their current keys or their old
// ones (plan.Param.OldKeys). Every error is one line saying what to fix.
func Parse(base Options, m map[string]string) (Options, error) {
	o := base
	m, err := plan.CurrentKeys(params, m)
	if err != nil {
		return o, fmt.Errorf("falcon %v", err)
	}
	for k, v := range m {
		if prism.ClassKey(k) {
			continue // PRISM's: parsed below, all together
		}
		var err error
		switch k {
		case plan.IRQKey:
			o.IRQCPUs, err = cpuset.ParseList(v)
		case "pipeline":
			o.Pipeline, err = strconv.ParseBool(v)
		case "split":
			o.SplitAuto, o.SplitRPS = v == "auto", v == "rps"
			switch {
			case o.SplitAuto:
				o.Split = true
			case o.SplitRPS:
				o.Split = false
			default:
				if o.Split, err = strconv.ParseBool(v); err != nil {
					err = fmt.Errorf("want true, false, auto or rps")
				}
			}
		case "balance":
			o.Balance, err = strconv.ParseBool(v)
		case fast.Param.Key:
			o.Fast, err = strconv.ParseBool(v)
		case "split-cpus":
			o.SplitCPUs, err = cpuset.ParseList(v)
		case "threshold":
			o.Threshold, err = parsePercent(v)
		case "hysteresis":
			o.Hysteresis, err = parsePercent(v)
		case "home-room":
			o.HomeRoom, err = parsePercent(v)
		case "mice":
			o.Mice, err = parseRate(v)
		case keyFallback:
			if v != balancer.FallbackAverage && v != balancer.FallbackAll {
				err = fmt.Errorf("want %s or %s", balancer.FallbackAverage, balancer.FallbackAll)
			}
			o.Fallback = v
		case keyDamp:
			o.Damp, err = strconv.ParseBool(v)
		case "interval":
			o.Interval, err = parseDuration(v, time.Millisecond, 10*time.Second)
		case "flowlet":
			o.Flowlet, err = parseDuration(v, 0, time.Second)
		case "drain":
			o.Drain, err = parseDuration(v, 0, 10*time.Second)
		case "load":
			if v != "rx" && v != "busy" {
				err = fmt.Errorf("want rx or busy")
			}
			o.Load = v
		case keySampler:
			if v != SamplerAuto && v != SamplerSched && v != SamplerProc {
				err = fmt.Errorf("want %s, %s or %s", SamplerAuto, SamplerSched, SamplerProc)
			}
			o.Sampler = v
		case keyAgentSched:
			if v != AgentNormal && v != AgentBatch {
				err = fmt.Errorf("want %s or %s", AgentNormal, AgentBatch)
			}
			o.AgentSched = v
		case "queue-size":
			o.QueueSize, err = plan.ParseQueueSize(v)
		case "rt":
			o.RTPriority, err = strconv.Atoi(v)
			if err == nil && (o.RTPriority < 0 || o.RTPriority > 99) {
				err = fmt.Errorf("want 0..99")
			}
		case keyStay:
			if v != StayDirect && v != StayQueued {
				err = fmt.Errorf("want %s or %s", StayDirect, StayQueued)
			}
			o.Stay = v
		case keyBare:
			o.Bare, err = strconv.ParseBool(v)
		case keyPark:
			o.Park, err = strconv.ParseBool(v)
		case keyBulkInline:
			o.BulkInline, err = strconv.ParseBool(v)
		case "spread":
			if v != SpreadAlways && v != SpreadBusy {
				err = fmt.Errorf("want %s or %s", SpreadBusy, SpreadAlways)
			}
			o.Spread = v
		case "prio":
			o.Prio, err = strconv.ParseBool(v)
		default:
			return o, fmt.Errorf("unknown falcon setting %q", k)
		}
		if err != nil {
			return o, fmt.Errorf("bad falcon setting %s=%q: %v", k, v, err)
		}
	}
	if o.HomeRoom > o.Threshold {
		return o, fmt.Errorf("falcon home-room %.0f must be at most the threshold %.0f: a core over the threshold takes no stages", o.HomeRoom, o.Threshold)
	}
	if o.Hysteresis >= o.Threshold {
		return o, fmt.Errorf("falcon hysteresis %.0f must be below the threshold %.0f", o.Hysteresis, o.Threshold)
	}
	if o.Classes, err = prism.ParseClasses(m); err != nil {
		return o, err
	}
	if given := o.Classes.Params(); len(given) > 0 && !o.Prio {
		return o, fmt.Errorf("falcon %s are PRISM's settings for marked flows, and prio is off: use --mode falcon-prism (or prio=true), or drop them", strings.Join(slices.Sorted(maps.Keys(given)), ", "))
	}
	if o.Prio && o.Classes.HighRT() <= o.RTPriority {
		return o, fmt.Errorf("falcon high-rt %d must be above rt %d: high-priority queues must preempt bulk ones", o.Classes.HighRT(), o.RTPriority)
	}
	if o.SplitRPS && o.Spread == SpreadBusy {
		// The kernel runs the later stages where the underlay's RPS
		// put the skb, the split core, not the IRQ core whose load
		// spread=busy watches: place them by hash from the start.
		if v, given := m["spread"]; given && v == SpreadBusy {
			return o, fmt.Errorf("falcon split=rps with spread=busy: the later stages start on the split core, not the IRQ core spread=busy watches: drop spread=busy (split=rps places them by hash from the start)")
		}
		o.Spread = SpreadAlways
	}
	if o.SplitRPS && o.Prio {
		return o, fmt.Errorf("falcon split=rps with prio: the priority classes are told apart in the XDP hook that split=rps does without: use split=true or auto")
	}
	if o.Mice > 0 && (o.Spread != SpreadBusy || !o.Balance) {
		return o, fmt.Errorf("falcon mice=%g keeps light flows at home when their stage leaves the IRQ core, which only spread=busy with balance=true does: drop mice or use spread=busy", o.Mice)
	}
	if !o.Pipeline && !o.Split && !o.SplitRPS && !o.Balance {
		return o, fmt.Errorf("falcon with pipeline, split and balance all off does nothing: use --mode vanilla")
	}
	return o, nil
}

// Params returns o as the params map Parse reads, so the state file holds
// the full setting and `lanes agent` needs nothing else.
func (o Options) Params() map[string]string {
	m := map[string]string{
		"pipeline":     strconv.FormatBool(o.Pipeline),
		"split":        strconv.FormatBool(o.Split),
		"balance":      strconv.FormatBool(o.Balance),
		fast.Param.Key: strconv.FormatBool(o.Fast),
		"threshold":    strconv.FormatFloat(o.Threshold, 'g', -1, 64),
		"hysteresis":   strconv.FormatFloat(o.Hysteresis, 'g', -1, 64),
		"home-room":    strconv.FormatFloat(o.HomeRoom, 'g', -1, 64),
		"mice":         strconv.FormatFloat(o.Mice, 'g', -1, 64),
		keyFallback:    o.Fallback,
		keyDamp:        strconv.FormatBool(o.Damp),
		"interval":     o.Interval.String(),
		"flowlet":      o.Flowlet.String(),
		"drain":        o.Drain.String(),
		"load":         o.Load,
		keySampler:     o.Sampler,
		keyAgentSched:  o.AgentSched,
		"queue-size":   strconv.FormatUint(uint64(o.QueueSize), 10),
		"rt":           strconv.Itoa(o.RTPriority),
		"prio":         strconv.FormatBool(o.Prio),
		"spread":       o.Spread,
		keyStay:        o.Stay,
		keyBare:        strconv.FormatBool(o.Bare),
		keyPark:        strconv.FormatBool(o.Park),
		keyBulkInline:  strconv.FormatBool(o.BulkInline),
	}
	maps.Copy(m, o.Classes.Params())
	if o.SplitAuto {
		m["split"] = "auto"
	}
	if o.SplitRPS {
		m["split"] = "rps"
	}
	if len(o.SplitCPUs) > 0 {
		m["split-cpus"] = cpuset.FormatList(o.SplitCPUs)
	}
	return m
}

func parsePercent(v string) (float64, error) {
	f, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
	if err != nil || f < 0 || f > 100 {
		return 0, fmt.Errorf("want a percentage 0..100")
	}
	return f, nil
}

func parseDuration(v string, min, max time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("want a duration like 40ms")
	}
	if d < min || d > max {
		return 0, fmt.Errorf("want %v..%v", min, max)
	}
	return d, nil
}

// parseRate reads packets per second: a number, optionally with a k or M
// suffix ("10k").
func parseRate(v string) (float64, error) {
	mult := 1.0
	switch {
	case strings.HasSuffix(v, "k"):
		mult, v = 1e3, strings.TrimSuffix(v, "k")
	case strings.HasSuffix(v, "M"):
		mult, v = 1e6, strings.TrimSuffix(v, "M")
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 0) || f*mult > 1e9 {
		return 0, fmt.Errorf("want packets per second like 10k (0 = off)")
	}
	return f * mult, nil
}
