package falcon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/stats"
	"github.com/lanesnet/lanes/policy/falcon/balancer"
	"github.com/lanesnet/lanes/topology"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

func init() { plan.RegisterAgent(AgentName, newAgent) }

// settleRounds is how many balancing rounds the moving average needs to
// show most of a move's effect ((4/5)^8 < 0.17 of the old load left).
const settleRounds = 8

// activeWindow is how recently a (flow, stage) must have seen a packet to
// count as load-bearing when the balancer places buckets.
const activeWindow = time.Second

// agent is Falcon's balancer on stock kernels: every interval it samples
// per-core load, feeds Falcon's moving average, and rewrites the buckets of
// the steering tables whose flows are active. The datapath applies a new
// bucket value to a running flow only after an idle gap (flowlet), so no
// decision here can reorder packets.
type agent struct {
	env        plan.AgentEnv
	failStreak int // rounds failed in a row (roundDone); under mu
	o          Options
	dir        string
	dp         *steer.Datapath
	cfg        steer.Config
	static     [steer.NumStages][steer.Buckets]uint32 // Falcon's hashed placement
	// initial is what apply wrote and where idle buckets rest: static, or
	// with spread=busy "stay" for the stages in homeFirst.
	initial   [steer.NumStages][steer.Buckets]uint32
	homeFirst map[int]bool
	stages    []int // stages the agent balances, in pipeline order
	round     int
	// lastSpread is the round in which a pipelined stage last moved:
	// spread=busy moves the split stage off the IRQ core only once the
	// later stages' moves have settled and the core is still busy.
	lastSpread int
	// atHome: the stage's programs are on their at-home fast path
	// (steer.Placement.SetHome), which spread=busy uses while nothing of
	// the stage leaves the IRQ core.
	atHome [steer.NumStages]bool
	// bare: the bridge stage at home is on its bare path (no flow
	// lookup, steer.Placement.SetHomeBare); bareNext is the first round
	// to check again after a flow there was found queuing.
	bare     bool
	bareNext int
	// pk parks the path while every stage rests at home (park.go); calm
	// counts the rounds they have rested there on the bare path.
	pk   *parker
	calm int
	home int // core of "stay" (the IRQ core), -1 unknown
	// homeQueued: home has cpumap queues (prio), so the split stage's way
	// home is its queue there, not "stay" (which would drop the classes).
	homeQueued bool
	bal        *balancer.Balancer
	split      *balancer.Balancer // over the split cores only; nil when there is one or none
	// With mice: per stage, the buckets' packet sums at the last round
	// and when they were read (zero: not yet), and the buckets kept home
	// as mice in the last round.
	prevPkts [steer.NumStages][steer.Buckets]uint64
	prevAt   [steer.NumStages]time.Time
	prevMice [steer.NumStages][steer.Buckets]bool
	miceHome int

	mu     sync.Mutex
	status AgentStatus
	m      *agentMetrics
}

// AgentStatus is what `lanes status` and the benchmark show of a running
// balancer.
type AgentStatus struct {
	At         time.Time       `json:"at"`
	Load       map[int]float64 `json:"load"` // moving average per core, percent
	StdDev     float64         `json:"load_stddev"`
	FallenBack bool            `json:"fallen_back"`
	Moves      uint64          `json:"moves"`
	Fallbacks  uint64          `json:"fallbacks"`
	// Damped counts fallbacks not taken because the set climbed back to
	// the fallback level right after resuming (its own spread work);
	// FallbackBar is the figure the set falls back at now.
	Damped      uint64  `json:"fallbacks_damped"`
	FallbackBar float64 `json:"fallback_bar"`
	// Active are the (flow, stage) pairs seen in the last window; not
	// read (0) while every stage is at home, where nothing is placed.
	Active int `json:"active_flow_stages"`
	// MiceHome counts the active (stage, bucket) pairs kept at home in
	// the last round because they carried under the mice rate.
	MiceHome int `json:"mice_home,omitempty"`
	// Home lists the stages at home until the IRQ core gets busy: on their
	// at-home fast path (vanilla placement without per-flow work), or, the
	// split stage with prio, in the IRQ core's queues.
	Home []string `json:"home,omitempty"`
	// Bare: the bridge stage at home looks no flow up
	// (steer.Placement.SetHomeBare).
	Bare bool `json:"bare,omitempty"`
	// Sampler is where the load comes from: "sched" or "proc".
	Sampler string `json:"sampler,omitempty"`
	// Parked: lanes' programs and RPS maps are off the path while every
	// stage rests at home (park.go); ParkOff says why this agent never
	// parks.
	Parked  bool   `json:"parked,omitempty"`
	ParkOff string `json:"park_off,omitempty"`
	// FailedRounds counts rounds skipped for an error (LastError, the
	// latest); Degraded is set after degradeAfter in a row, while every
	// stage is held at home.
	FailedRounds uint64 `json:"failed_rounds,omitempty"`
	LastError    string `json:"last_error,omitempty"`
	Degraded     bool   `json:"degraded,omitempty"`
}

func newAgent(env plan.AgentEnv) (plan.Agent, error) {
	o, err := OptionsFor(env.Mode, env.Params)
	if err != nil {
		return nil, plan.ConfigError{Err: err}
	}
	dir := plan.PinDir(env.NetNS)
	dp, err := steer.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("falcon agent: %w (is the mode applied? `lanes status` tells)", err)
	}
	cfg, err := dp.Config()
	if err != nil {
		dp.Close()
		return nil, err
	}
	a := &agent{env: env, o: o, dir: dir, dp: dp, cfg: cfg, home: -1}
	if t, err := topology.Discover(env.NetNS); err == nil {
		if irq := plan.IRQCPUsOr(t, o.IRQCPUs); len(irq) == 1 {
			a.home = irq[0]
		}
		// The planner's rule, so the agent reads the same cpumap the
		// same way.
		if len(autoSplitOff(o, t)) > 0 {
			o.Split = false
			a.o = o
		}
	}
	cpumap, _ := dp.CPUMap().Entries()
	lay := Layout{CPUs: cfg.CPUs, Set: env.CPUs, SplitCPUs: cpumap, IRQCPUs: homeSet(a.home)}
	if o.Prio {
		// With prio the IRQ core has queues too (the planner's Layout):
		// the split stage's home is then that queue, not the NIC poll.
		a.homeQueued = slices.Contains(cpumap, a.home)
		lay.SplitCPUs = nil
		if o.Split {
			for _, c := range cpumap {
				if c != a.home {
					lay.SplitCPUs = append(lay.SplitCPUs, c)
				}
			}
		} else {
			lay.FirstCPUs = cpumap
		}
	}
	a.static = StaticTables(o, lay)
	a.initial = InitialTables(o, lay)
	a.homeFirst = map[int]bool{}
	for _, st := range HomeFirstStages(o) {
		// With prio the split stage's home is a queue on the IRQ core:
		// without one it has none.
		if st == steer.StageSplit && o.Prio && !a.homeQueued {
			continue
		}
		a.homeFirst[st] = true
	}
	a.lastSpread = -settleRounds
	if a.home >= 0 && len(a.homeFirst) > 0 {
		// A previous agent may have left stages at home.
		if a.atHome, err = dp.Placement().Home(); err != nil {
			dp.Close()
			return nil, err
		}
		if a.queuedHome(steer.StageSplit) {
			// No flag in the datapath for this one (setHome): the next
			// round's maybeHome finds it home again if it is.
			a.atHome[steer.StageSplit] = false
		}
		if a.bare, err = dp.Placement().HomeBare(); err != nil {
			dp.Close()
			return nil, err
		}
	}
	cpumap = union(lay.SplitCPUs, nil)
	if o.Pipeline || o.Balance {
		a.stages = append(a.stages, steer.StageBridge, steer.StageContainer)
	}
	// Among equally loaded cores, the IRQ core is picked last: it already
	// runs the NIC poll of every flow.
	if a.bal, err = balancer.New(balancer.Config{CPUs: env.CPUs, Threshold: o.Threshold, Hysteresis: o.Hysteresis, Avoid: homeSet(a.home), Fallback: o.Fallback, Damp: o.Damp}); err != nil {
		dp.Close()
		return nil, err
	}
	// The split stage may use the split cores, or none: when every split
	// core is busy, the first stage stays whole on the IRQ core ("home"),
	// which is Falcon's rule of dispatching only to cores under the
	// threshold applied to splitting.
	if splitSet := union(cpumap, homeSet(a.home)); o.Split && len(cpumap) > 0 && len(splitSet) > 1 {
		a.stages = append(a.stages, steer.StageSplit)
		if a.split, err = balancer.New(balancer.Config{CPUs: splitSet, Threshold: o.Threshold, Hysteresis: o.Hysteresis, Fallback: o.Fallback, Damp: o.Damp}); err != nil {
			dp.Close()
			return nil, err
		}
	}
	if a.pk, err = newParker(a.o, env.StateDir); err != nil {
		dp.Close()
		return nil, fmt.Errorf("falcon agent: %w", err)
	}
	if env.Metrics != nil {
		a.m = newAgentMetrics(env.Metrics, dir)
	}
	return a, nil
}

// Close lets go of the datapath of an agent that is not to run
// (plan.Discard); Run does otherwise.
func (a *agent) Close() error { return a.dp.Close() }

func (a *agent) Status() any {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.status
	s.Load = maps.Clone(s.Load)
	return s
}

// Run balances until ctx ends, then writes the tables apply wrote back
// (moves back obey the flowlet rule like any other).
func (a *agent) Run(ctx context.Context) error {
	defer a.dp.Close()
	defer a.restore()
	sampler, err := a.openSampler()
	if err != nil {
		return err
	}
	defer sampler.Close()
	if a.o.AgentSched == AgentBatch {
		var err error
		if terr := kthread.OnThread(unix.SCHED_BATCH, func() { err = a.loop(ctx, sampler) }); terr == nil {
			return err
		} else if a.env.Logf != nil {
			a.env.Logf("x-agent-sched=batch: %v; rounds run at normal scheduling", terr)
		}
	}
	return a.loop(ctx, sampler)
}

// loop samples and balances every interval until ctx ends.
func (a *agent) loop(ctx context.Context, sampler cpuload.Source) error {
	tick := time.NewTicker(a.o.Interval)
	defer tick.Stop()
	beat := a.env.Beats.Loop("falcon balancer", a.o.Interval)
	defer beat.Stop()
	for ; ; beat.Beat() {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		s, err := sampler.Sample()
		if err != nil {
			err = fmt.Errorf("sampling load: %w", err)
		} else {
			err = a.step(s)
		}
		a.roundDone(err)
	}
}

// degradeAfter is how many rounds in a row may fail before the agent
// stops trusting its view and puts every stage at home.
const degradeAfter = 25

// roundDone books a round's outcome. A failed round (a sample that could
// not be read, a map that could not be written, a device gone under the
// agent) is skipped: counted in the status and the metrics, logged when
// a streak starts. After degradeAfter failures in a row the agent puts
// every stage's table at "stay", vanilla placement, which is safe at any
// load and needs no sample to stay so, and says so; it keeps trying, and
// the first round that succeeds places again.
func (a *agent) roundDone(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil {
		if a.status.Degraded && a.env.Logf != nil {
			a.env.Logf("recovered after %d failed rounds: balancing again", a.failStreak)
		}
		a.failStreak, a.status.Degraded, a.status.LastError = 0, false, ""
		return
	}
	a.failStreak++
	a.status.FailedRounds++
	a.status.LastError = err.Error()
	if a.m != nil {
		a.m.failed.Inc()
	}
	if a.failStreak == 1 && a.env.Logf != nil {
		a.env.Logf("round failed, skipped: %v", err)
	}
	if a.failStreak < degradeAfter || a.status.Degraded {
		return
	}
	a.status.Degraded = true
	for _, st := range a.stages {
		var stay [steer.Buckets]uint32
		for b := range stay {
			stay[b] = uint32(steer.Stay)
		}
		if werr := a.dp.Placement().SetTable(st, stay); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	if a.m != nil {
		a.m.degraded.Set(1)
	}
	if a.env.Logf != nil {
		a.env.Logf("degraded: %d rounds failed in a row (last: %v): every stage at home, vanilla placement, until a round succeeds", a.failStreak, err)
	}
}

// fallbackName names the fallback rule's figure for the log.
func (a *agent) fallbackName() string {
	if a.o.Fallback == balancer.FallbackAll {
		return "least-loaded core's"
	}
	return "average"
}

// openSampler opens the load source the options name; with auto, the
// scheduler's events where the kernel has them, /proc where not (and
// says so).
func (a *agent) openSampler() (cpuload.Source, error) {
	if a.o.Sampler != SamplerProc {
		s, err := cpuload.NewSchedSampler()
		if err == nil {
			a.setSampler(SamplerSched)
			if a.env.Logf != nil {
				a.env.Logf("load from the scheduler's task switches and softirqs (BPF)")
			}
			return s, nil
		}
		if a.o.Sampler == SamplerSched {
			return nil, fmt.Errorf("falcon agent: x-sampler=sched: %w (x-sampler=proc reads /proc instead)", err)
		}
		if a.env.Logf != nil {
			a.env.Logf("load from /proc: no scheduler accounting on this kernel (%v)", err)
		}
	}
	s, err := cpuload.NewSampler()
	if err != nil {
		return nil, err
	}
	a.setSampler(SamplerProc)
	return s, nil
}

func (a *agent) setSampler(v string) {
	a.mu.Lock()
	a.status.Sampler = v
	a.mu.Unlock()
}

func (a *agent) restore() {
	// The plan's static state has its programs and maps on the path.
	if a.pk.parked {
		if err := a.pk.unparkNow(); err != nil && a.env.Logf != nil {
			a.env.Logf("%v (lanes reset puts every knob back)", err)
		} else if a.env.Logf != nil && !a.pk.parked {
			a.env.Logf("unparked: lanes' programs and RPS maps back on the path")
		}
	}
	for _, st := range a.stages {
		a.dp.Placement().SetTable(st, a.initial[st])
	}
}

// step is one balancing round.
func (a *agent) step(s cpuload.Sample) error {
	loads := map[int]float64{}
	// What moves with a stage: the core's receive work split evenly among
	// the stages lanes steers (the NIC's poll, which stays, is counted in
	// with them, so a stage's share is if anything overstated and a move
	// stays on the safe side of the destination's threshold).
	work := map[int]float64{}
	for _, c := range s.Cores {
		v := c.Rx
		if a.o.Load == "busy" {
			// Falcon's figure, less the time of threads that yield to
			// anything (SCHED_IDLE): receive work would not wait for it.
			v = c.Contended()
		}
		loads[c.CPU] = v
		work[c.CPU] = c.Rx / float64(max(1, len(a.stages)))
	}
	wasFallen, wasDamped := a.bal.FallenBack(), a.bal.Stats().Damped
	a.bal.Observe(loads)
	a.bal.ObserveWork(work)
	if a.split != nil {
		a.split.Observe(loads)
		a.split.ObserveWork(work)
	}
	fallen := a.bal.FallenBack()
	if fallen != wasFallen && a.env.Logf != nil {
		if fallen {
			a.env.Logf("fallback: core set %s load %.0f%% >= %.0f%%: vanilla placement", a.fallbackName(), a.bal.FallbackLoad(), a.o.Threshold)
		} else {
			a.env.Logf("resume: core set %s load %.0f%%", a.fallbackName(), a.bal.FallbackLoad())
		}
	}
	if a.bal.Stats().Damped != wasDamped && a.env.Logf != nil {
		a.env.Logf("fallback damped: core set %s load back at %.0f%% within %d samples of resuming, its own spread work: staying spread, falling back at %.0f%% from now on", a.fallbackName(), a.bal.FallbackLoad(), balancer.CycleRounds, a.bal.FallbackBar())
	}

	moves, nactive, err := a.place(fallen)
	if err != nil {
		return err
	}

	load := make(map[int]float64, len(a.env.CPUs))
	vals := make([]float64, 0, len(a.env.CPUs))
	for _, c := range a.env.CPUs {
		load[c] = a.bal.Load(c)
		vals = append(vals, load[c])
	}
	sd := stats.StdDev(vals)
	bs := a.bal.Stats()
	a.mu.Lock()
	a.status.At = s.At
	a.status.Load = load
	a.status.StdDev = sd
	a.status.FallenBack = fallen
	a.status.Moves += uint64(moves)
	a.status.Fallbacks = bs.Fallbacks
	a.status.Damped = bs.Damped
	a.status.FallbackBar = a.bal.FallbackBar()
	a.status.Active = nactive
	a.status.MiceHome = a.miceHome
	a.status.Home = nil
	for st, h := range a.atHome {
		if h {
			a.status.Home = append(a.status.Home, steer.StageName(st))
		}
	}
	a.status.Bare = a.bare
	a.status.Parked, a.status.ParkOff = a.pk.parked, a.pk.off
	a.mu.Unlock()
	if a.m != nil {
		a.m.observe(load, moves, fallen, a.pk.parked, bs, nactive, sd)
	}
	return nil
}

// place runs one round of placement: every stage's table from the moving
// averages and the active buckets. It returns the moves (active buckets
// whose core changed) and the active flows.
func (a *agent) place(fallen bool) (moves, nactive int, err error) {
	// A round costs a few syscalls whatever the number of flows: one
	// batch walk of the flow map, one read of the tables, one write per
	// stage that changed.
	a.round++
	a.miceHome = 0
	if err := a.maybeBare(); err != nil {
		return 0, 0, err
	}
	if a.stayHome(fallen) {
		// Nothing away and nothing to leave home this round: no flow
		// state to read (the at-home fast path keeps none) and no table
		// to change, so the round ends here. It is the common case, and
		// the agent's time on the IRQ core is time the NIC poll waits.
		return 0, 0, a.maybePark()
	}
	// A stage may leave home: the programs and maps go back on the path
	// first (a round or more: park.go).
	a.calm = 0
	if done, err := a.unpark(); err != nil || !done {
		return 0, 0, err
	}
	// Which stages were at home when the flows were read: a later stage
	// goes home only behind the earlier ones (mayGoHome).
	homeAtRead := a.atHome
	act, err := a.dp.Placement().Activity(activeWindow)
	if err != nil {
		return 0, 0, err
	}
	active, nactive := act.Active, act.Flows
	tables, err := a.dp.Placement().Tables()
	if err != nil {
		return 0, 0, err
	}
	now := time.Now()
	for _, st := range a.stages {
		cur := tables[st]
		var next [steer.Buckets]uint32
		if st == steer.StageSplit && a.homeFirst[st] && !fallen && a.round-a.lastSpread < settleRounds {
			// Splitting is the last resort: wait until the moving
			// averages show what the later stages' moves left on the
			// IRQ core.
			continue
		}
		if a.atHome[st] {
			// Leave home only to spread: when the IRQ core is busy
			// and another core has room.
			if !a.mayLeaveHome(st, fallen) {
				continue
			}
			if err := a.leaveHome(st); err != nil {
				return 0, 0, err
			}
			continue // the next round sees the stage's flows afresh
		}
		if homeAtRead[st] {
			// Left home this round behind an earlier stage
			// (leaveHomeAfter): its flows were read at home.
			continue
		}
		stAct := active[st]
		if mice := a.mice(st, &act, now); mice != nil && !fallen {
			for b := range stAct {
				if stAct[b] && mice[b] {
					// A light flow stays (or goes back) where the
					// kernel runs it: assign rests inactive buckets
					// at home.
					stAct[b] = false
					a.miceHome++
				}
			}
		}
		if fallen {
			// Vanilla placement: everything on the IRQ core, where with
			// prio the first stage keeps its two queues.
			stay := uint32(steer.Stay)
			if st == steer.StageSplit && a.homeQueued {
				stay = uint32(slices.Index(a.cfg.CPUs, a.home))
			}
			for b := range next {
				next[b] = stay
			}
		} else {
			next = a.assign(st, cur, stAct)
		}
		if next == cur {
			if !a.mayGoHome(st, homeAtRead, &act, tables) {
				continue
			}
			if err := a.maybeHome(st, next, a.away(st, &act), fallen); err != nil {
				return 0, 0, err
			}
			continue
		}
		// A stage that starts placing flows away moves the later stages
		// that follow it: those must count their frames first.
		if !a.allHomeValue(st, next) {
			if err := a.leaveHomeAfter(st); err != nil {
				return 0, 0, err
			}
		}
		if err := a.dp.Placement().SetTable(st, next); err != nil {
			return 0, 0, err
		}
		for b := range next {
			if next[b] != cur[b] && active[st][b] {
				moves++
				if st != steer.StageSplit {
					a.lastSpread = a.round
				}
			}
		}
	}
	return moves, nactive, nil
}

// mice marks the active buckets of stage carrying under o.Mice packets/s
// since the rates were last taken, and keeps the sums for the next time.
// nil when mice is off, the stage is not home-first, or there is no
// earlier sum (the first round an agent sees a stage away; leaveHome
// starts one at zero, so every bucket is heavy the first round after). Rates
// are taken over at least half an interval (a ticker catching up runs
// rounds back to back); in between, and for a bucket whose sum fell (a
// flow's state evicted), the last verdict stands.
func (a *agent) mice(stage int, act *steer.Activity, now time.Time) *[steer.Buckets]bool {
	if a.o.Mice <= 0 || !a.homeFirst[stage] {
		return nil
	}
	prev, at := a.prevPkts[stage], a.prevAt[stage]
	if at.IsZero() {
		a.prevPkts[stage], a.prevAt[stage] = act.Packets[stage], now
		return nil
	}
	m := &a.prevMice[stage]
	dt := now.Sub(at)
	if dt < a.o.Interval/2 {
		return m
	}
	for b := range m {
		n := act.Packets[stage][b]
		if n < prev[b] {
			continue
		}
		m[b] = float64(n-prev[b])/dt.Seconds() < a.o.Mice
	}
	a.prevPkts[stage], a.prevAt[stage] = act.Packets[stage], now
	return m
}

// stayHome says whether every stage is at home and stays there this round.
func (a *agent) stayHome(fallen bool) bool {
	for _, st := range a.stages {
		if !a.atHome[st] || a.mayLeaveHome(st, fallen) {
			return false
		}
	}
	return true
}

// mayLeaveHome: the set is not fallen back, the IRQ core is at the
// threshold, and another core of the stage's set has room: it stays under
// home-room (the threshold by default) with the stage's receive work added
// (balancer.Room). Without the room test a damped set whose cores are all
// busy (a TCP sender on the other core) left home and came back every
// round; counting the stage's work keeps it home when the other core's
// own tasks leave no time for the stage, which then only pays the hop.
func (a *agent) mayLeaveHome(stage int, fallen bool) bool {
	bal := a.stageBal(stage)
	return !fallen && bal.Load(a.home) >= a.o.Threshold && bal.Room(a.home, a.o.homeRoom())
}

func (a *agent) stageBal(stage int) *balancer.Balancer {
	if stage == steer.StageSplit && a.split != nil {
		return a.split
	}
	return a.bal
}

// maybeHome puts a home-first stage on its at-home fast path once its
// table (unchanged this round) is all "stay" and no flow's stage is still
// elsewhere (away: flows follow a table only at their next flowlet
// boundary).
func (a *agent) maybeHome(stage int, table [steer.Buckets]uint32, away, fallen bool) error {
	if a.home < 0 || !a.homeFirst[stage] || a.atHome[stage] || away || !a.allHomeValue(stage, table) {
		return nil
	}
	if a.o.Mice > 0 && a.mayLeaveHome(stage, fallen) {
		// Only mice, on a core still busy: home now would leave it
		// again next round (flow states deleted, rates lost), every
		// other round for as long as the core stays busy.
		return nil
	}
	if err := a.setHome(stage, true); err != nil {
		return err
	}
	a.atHome[stage] = true
	if a.env.Logf != nil && a.queuedHome(stage) {
		a.env.Logf("%s stage at home: both classes in the IRQ core's queues", steer.StageName(stage))
	} else if a.env.Logf != nil {
		a.env.Logf("%s stage at home: vanilla placement, per-flow work off", steer.StageName(stage))
	}
	return nil
}

// Stages run in pipeline order (split, bridge, container), and a stage
// that stays runs where the one before it ran: when an earlier stage
// changes a flow's core, the later stages that stay change core with it.
// A stage counts its frames in flight, and so keeps its order across that
// change (datapath/steer/bpf/order.h's followers_out, stay_core), only off its at-home fast
// path. So a later stage goes home only behind the earlier ones, and
// leaves home no later than they do.

// mayGoHome: every earlier stage of the agent's is at home and was when
// the flows were read (homeAtRead), or, for one that is not home-first
// (the split stage with prio where the agent does not keep it home), has
// all its table and every active flow at home; and no staying flow of the stage
// still has frames in flight on a core other than the home core
// (Activity.Held).
func (a *agent) mayGoHome(stage int, homeAtRead [steer.NumStages]bool, act *steer.Activity, tables [steer.NumStages][steer.Buckets]uint32) bool {
	if a.home < 0 || a.home >= 64 {
		return false
	}
	for _, e := range a.stages {
		if e >= stage {
			continue
		}
		if a.homeFirst[e] {
			if !homeAtRead[e] || !a.atHome[e] {
				return false
			}
			continue
		}
		var homeIdx uint64
		if i := slices.Index(a.cfg.CPUs, a.home); e == steer.StageSplit && a.homeQueued && i >= 0 && i < 64 {
			homeIdx = 1 << i
		}
		if act.Cores[e]&^homeIdx != 0 || !a.allHomeValue(e, tables[e]) {
			return false
		}
	}
	return act.Held[stage]&^(1<<a.home) == 0
}

// allHomeValue: every bucket of the stage's table is where the stage runs
// at home: "stay", or with prio the split stage's queue on the IRQ core.
func (a *agent) allHomeValue(stage int, table [steer.Buckets]uint32) bool {
	home := uint32(steer.Stay)
	if a.queuedHome(stage) {
		home = uint32(slices.Index(a.cfg.CPUs, a.home))
	}
	for _, v := range table {
		if v != home {
			return false
		}
	}
	return true
}

// queuedHome: the stage's home is a queue on the IRQ core (the split stage
// with prio), not where the kernel runs it.
func (a *agent) queuedHome(stage int) bool {
	return stage == steer.StageSplit && a.homeQueued
}

// away says whether an active flow's stage runs away from home
// (steer.Activity.Away); for a queued home, placed on another core.
func (a *agent) away(stage int, act *steer.Activity) bool {
	if !a.queuedHome(stage) {
		return act.Away[stage]
	}
	i := slices.Index(a.cfg.CPUs, a.home)
	return i < 0 || i >= 64 || act.Cores[stage]&^(1<<i) != 0
}

// setHome switches a stage's at-home fast path (steer.Placement.SetHome).
// A queued home has none: steer_xdp classifies every frame there, keeps
// each flow's state and counts it in flight, so at home and away differ
// only in the table, and leaving home must not restart those states
// (frames counted in the home queues would no longer hold their flows
// back).
func (a *agent) setHome(stage int, on bool) error {
	if a.queuedHome(stage) {
		return nil
	}
	return a.dp.Placement().SetHome(stage, on)
}

// bareRetry is how many rounds the agent waits before it checks again
// whether the bridge stage at home may take its bare path: a flow found
// queuing there queues until it pauses for the drain time.
const bareRetry = 5

// maybeBare puts the bridge stage at home on its bare path once no flow
// there would queue (steer.Placement.HomeQueues): then no frame needs its
// flow looked up at that stage, which shortens tc ingress's run on every
// packet. Not with prio (steer_xdp classifies every frame anyway) or
// x-stay=queued (nothing runs on), nor with x-bare=false.
func (a *agent) maybeBare() error {
	if !a.o.Bare || a.bare || !a.atHome[steer.StageBridge] || a.o.Prio || a.o.Stay != StayDirect || a.o.Drain <= 0 || a.round < a.bareNext {
		return nil
	}
	q, err := a.dp.Placement().HomeQueues(a.home)
	if err != nil {
		return err
	}
	if q {
		a.bareNext = a.round + bareRetry
		return nil
	}
	if err := a.dp.Placement().SetHomeBare(); err != nil {
		return err
	}
	a.bare = true
	if a.env.Logf != nil {
		a.env.Logf("bridge stage at home on its bare path: no flow lookup")
	}
	return nil
}

// maybePark parks the path once every stage has rested at home, the
// bridge stage on its bare path, for parkAfter rounds (park.go). The
// caller has checked that every stage is at home and stays there.
// Parking is an optimisation: when it fails, the agent unparks, stops
// parking and goes on balancing.
func (a *agent) maybePark() error {
	if a.pk.off != "" {
		// Parked by an agent whose options allowed it.
		_, err := a.unpark()
		return err
	}
	if !a.bare {
		a.calm = 0
		return nil
	}
	if a.calm++; (a.pk.parked && !a.pk.progsBack) || a.calm < parkAfter {
		return nil
	}
	err := a.pk.park()
	switch {
	case errors.Is(err, errBusy):
		return nil
	case err != nil:
		a.pk.off = "parking failed: " + err.Error()
		if a.env.Logf != nil {
			a.env.Logf("%s; unparking and parking no more", a.pk.off)
		}
		return a.pk.unparkNow()
	case a.pk.parked && a.env.Logf != nil:
		a.env.Logf("parked: every stage at home for %d rounds; lanes' programs and RPS maps off the path", a.calm)
	case a.pk.off != "" && a.env.Logf != nil:
		a.env.Logf("parking off: %s", a.pk.off)
	}
	return nil
}

// unpark takes the next step of putting the programs and maps back
// before a stage leaves home, and says whether they are all back.
func (a *agent) unpark() (bool, error) {
	if !a.pk.parked {
		return true, nil
	}
	done, err := a.pk.unpark(time.Now())
	if errors.Is(err, errBusy) {
		return false, nil
	}
	if done && err == nil && a.env.Logf != nil {
		a.env.Logf("unparked: lanes' programs and RPS maps back on the path")
	}
	return done, err
}

// leaveHomeAfter takes every stage after stage off its at-home fast path,
// the last first.
func (a *agent) leaveHomeAfter(stage int) error {
	for l := steer.NumStages - 1; l > stage; l-- {
		if a.atHome[l] {
			if err := a.leaveHome(l); err != nil {
				return err
			}
		}
	}
	return nil
}

// leaveHome puts a stage back on the full path, with fresh flow states:
// the old ones counted nothing while at home (steer.Placement.SetHome
// restarts them). The stages after it leave first (leaveHomeAfter).
func (a *agent) leaveHome(stage int) error {
	if err := a.leaveHomeAfter(stage); err != nil {
		return err
	}
	if stage == steer.StageBridge {
		a.bare = false // SetHome clears it with home
	}
	if err := a.setHome(stage, false); err != nil {
		return err
	}
	a.atHome[stage] = false
	// Rates (mice) count from here: every bucket is taken for heavy
	// until its rate is known (the restarted states' packet sums go on
	// from before home, or from 0 where they were deleted).
	a.prevPkts[stage], a.prevAt[stage] = [steer.Buckets]uint64{}, time.Now()
	a.prevMice[stage] = [steer.Buckets]bool{}
	// The set's average now climbs with the work this stage moves: the
	// balancer damps that climb as it does after a resume.
	a.bal.Spreading()
	if sb := a.stageBal(stage); sb != a.bal {
		sb.Spreading()
	}
	if a.env.Logf != nil {
		a.env.Logf("%s stage leaves home: core %d at %.0f%%", steer.StageName(stage), a.home, a.stageBal(stage).Load(a.home))
	}
	return nil
}

// assign translates between table values (indexes into the datapath's core
// list, or Stay) and cores for the balancer. "Stay" is the core the stage
// would run on anyway: the home (IRQ) core.
func (a *agent) assign(stage int, cur [steer.Buckets]uint32, active [steer.Buckets]bool) [steer.Buckets]uint32 {
	toCore := func(v uint32) int {
		if v == steer.Stay || int(v) >= len(a.cfg.CPUs) {
			return a.home
		}
		return a.cfg.CPUs[v]
	}
	toIdx := func(c int, static uint32) uint32 {
		if c < 0 || (c == a.home && (static == steer.Stay || (stage == steer.StageSplit && !a.homeQueued))) {
			return steer.Stay
		}
		if i := slices.Index(a.cfg.CPUs, c); i >= 0 {
			return uint32(i)
		}
		return steer.Stay
	}
	hashed := make([]int, steer.Buckets)
	home := make([]int, steer.Buckets)
	current := make([]int, steer.Buckets)
	act := make([]bool, steer.Buckets)
	for b := 0; b < steer.Buckets; b++ {
		hashed[b] = toCore(a.static[stage][b])
		home[b] = toCore(a.initial[stage][b])
		current[b] = toCore(cur[b])
		act[b] = active[b] && hashed[b] >= 0
	}
	bal := a.bal
	if stage == steer.StageSplit {
		bal = a.split
	}
	var nextCores []int
	if a.homeFirst[stage] {
		nextCores, _ = bal.AssignHome(hashed, home, current, act)
	} else {
		nextCores, _ = bal.Assign(hashed, current, act)
	}
	var next [steer.Buckets]uint32
	for b := range next {
		if !act[b] {
			// No traffic: nothing to balance, and nothing to reorder.
			next[b] = a.initial[stage][b]
			continue
		}
		ref := a.static[stage][b]
		if a.homeFirst[stage] {
			ref = a.initial[stage][b] // home is "stay": the kernel's core
		}
		next[b] = toIdx(nextCores[b], ref)
	}
	return next
}

func homeSet(home int) []int {
	if home < 0 {
		return nil
	}
	return []int{home}
}

type agentMetrics struct {
	load     *prometheus.GaugeVec
	stddev   prometheus.Gauge
	moves    prometheus.Counter
	fallback prometheus.Gauge
	fallsTot prometheus.Counter
	damped   prometheus.Counter
	active   prometheus.Gauge
	parked   prometheus.Gauge
	failed   prometheus.Counter
	degraded prometheus.Gauge
	lastFall uint64
	lastDamp uint64
}

func newAgentMetrics(r prometheus.Registerer, dir string) *agentMetrics {
	m := &agentMetrics{
		load: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lanes_core_load_percent",
			Help: "Falcon balancer's moving-average load per core (percent)."}, []string{"cpu"}),
		stddev: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_core_load_stddev",
			Help: "Standard deviation of the per-core load over the core set."}),
		moves: prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_falcon_moves_total",
			Help: "Active (flow, stage) buckets the balancer moved to another core."}),
		fallback: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_falcon_fallen_back",
			Help: "1 while the core set is too busy and placement is vanilla."}),
		fallsTot: prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_falcon_fallbacks_total",
			Help: "Times the balancer fell back to vanilla placement."}),
		damped: prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_falcon_fallbacks_damped_total",
			Help: "Fallbacks not taken: the set climbed back to the fallback level right after resuming, carrying its own spread work."}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_falcon_active_flow_stages",
			Help: "(flow, stage) pairs that saw traffic in the last second."}),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_falcon_parked",
			Help: "1 while every stage rests at home and lanes' programs and RPS maps are off the path."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_falcon_failed_rounds_total",
			Help: "Balancing rounds skipped for an error (a sample or a map operation that failed)."}),
		degraded: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_falcon_degraded",
			Help: "1 while rounds keep failing and every stage is held at home (vanilla placement)."}),
	}
	r.MustRegister(m.load, m.stddev, m.moves, m.fallback, m.fallsTot, m.damped, m.active, m.parked, m.failed, m.degraded, steer.NewCollector(dir))
	return m
}

func (m *agentMetrics) observe(load map[int]float64, moves int, fallen, parked bool, bs balancer.Stats, active int, sd float64) {
	for c, v := range load {
		m.load.WithLabelValues(fmt.Sprint(c)).Set(v)
	}
	m.stddev.Set(sd)
	m.moves.Add(float64(moves))
	if fallen {
		m.fallback.Set(1)
	} else {
		m.fallback.Set(0)
	}
	if parked {
		m.parked.Set(1)
	} else {
		m.parked.Set(0)
	}
	if bs.Fallbacks > m.lastFall {
		m.fallsTot.Add(float64(bs.Fallbacks - m.lastFall))
		m.lastFall = bs.Fallbacks
	}
	if bs.Damped > m.lastDamp {
		m.damped.Add(float64(bs.Damped - m.lastDamp))
		m.lastDamp = bs.Damped
	}
	m.active.Set(float64(active))
}

// Summary is what `lanes status` shows of the balancer.
func (s AgentStatus) Summary() []string {
	state := "placing stages by hash and load"
	if s.FallenBack {
		state = "fallen back: vanilla placement while the core set is busy"
	}
	if s.Degraded {
		state = "DEGRADED: rounds keep failing (" + s.LastError + "); every stage held at home, vanilla placement"
	}
	out := []string{"balancer: " + state}
	if s.FailedRounds > 0 && !s.Degraded {
		out = append(out, fmt.Sprintf("failed rounds: %d (last: %s)", s.FailedRounds, orDash(s.LastError)))
	}
	var loads []string
	for _, c := range slices.Sorted(maps.Keys(s.Load)) {
		loads = append(loads, fmt.Sprintf("cpu%d %.0f%%", c, s.Load[c]))
	}
	if len(loads) > 0 {
		out = append(out, fmt.Sprintf("load (moving average, from %s): %s; std dev %.1f", orDash(s.Sampler), strings.Join(loads, ", "), s.StdDev))
	}
	line := fmt.Sprintf("moves %d, fallbacks %d", s.Moves, s.Fallbacks)
	if s.Damped > 0 {
		line += fmt.Sprintf(", damped %d (the set's own spread work): falls back at %.0f%% until it calms down", s.Damped, s.FallbackBar)
	}
	out = append(out, line)
	if len(s.Home) > 0 {
		line := "at home (vanilla placement, no per-flow work): " + strings.Join(s.Home, ", ")
		if s.Bare {
			line += "; bridge stage on its bare path (no flow lookup)"
		}
		out = append(out, line)
		if s.Parked {
			out = append(out, "parked: lanes' programs and RPS maps are off the path (vanilla's, exactly) until the IRQ core gets busy")
		}
	} else {
		line := fmt.Sprintf("active (flow, stage) pairs: %d", s.Active)
		if s.MiceHome > 0 {
			line += fmt.Sprintf(", %d kept at home as mice", s.MiceHome)
		}
		out = append(out, line)
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
