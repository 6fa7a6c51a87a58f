package prism

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/load"
	"github.com/lanesnet/lanes/topology"
)

// The overload guard. Streamlined order puts the NIC poll's NAPI thread on
// the real-time ladder, above the bulk queue's kthread, so a high-priority
// frame is classified without waiting behind bulk work. Under overload
// (more frames than the receive core can process) that thread never runs
// out of work, and a real-time thread that never sleeps keeps the core:
// the bulk kthread gets what real-time throttling leaves (5%), and bulk
// throughput collapses (measured: udp_stress at full rate received 7 Kpps
// under prism-batch against 276 Kpps under vanilla, 2026-11-22, 2 x AMD
// EPYC vCPU VM). The kernel's own softirq path degrades gracefully there
// because polling and processing share one budget.
//
// The guard watches for that state and takes the NIC poll off the ladder
// (normal scheduling, sharing the core fairly with the bulk kthread) while
// it lasts, and puts it back once the core has idle time again: the NIC
// poll thread running nearly all the time is the symptom (it only runs
// XDP, which costs a fraction of what processing a frame does, so it is
// that busy only when frames arrive far faster than they are processed);
// idle time on the receive core is the cure's end (no overload left).
//
// The guard switches one knob the plan already set and journaled (the
// thread's scheduling), between the plan's value and normal scheduling, so
// `lanes reset` restores the original whatever the guard did, and a
// stopped guard puts the plan's value back.

// GuardAgentName is the plan.Plan.Agent of prism's batch mode with
// streamlined order.
const GuardAgentName = "prism-guard"

func init() {
	plan.RegisterAgent(GuardAgentName, func(env plan.AgentEnv) (plan.Agent, error) {
		o, err := Parse(Defaults(), env.Params)
		if err != nil {
			return nil, err
		}
		g, err := newGuard(env, o)
		if err != nil {
			return nil, err
		}
		return guardAgent{g}, nil
	})
}

// GuardRule is when the guard acts.
type GuardRule struct {
	// Demote: the NIC poll threads ran at least this percent of the
	// interval for DemoteAfter samples in a row.
	Demote      float64
	DemoteAfter int
	// Promote: the receive core was idle at least this percent of the
	// interval for PromoteAfter samples in a row.
	Promote      float64
	PromoteAfter int
	Interval     time.Duration
}

// DefaultGuardRule: 0.3 s of a saturated NIC poll to step in, 1 s of
// slack to step back.
var DefaultGuardRule = GuardRule{Demote: 85, DemoteAfter: 3, Promote: 10, PromoteAfter: 10, Interval: 100 * time.Millisecond}

// guardOff is the NIC poll's scheduling while the guard holds it off the
// ladder: normal, at the lowest weight. The poll is work-conserving there:
// it runs whenever the bulk kthread has drained its queue and sleeps, and
// otherwise yields the core to it instead of polling frames the full
// queue would drop. Measured at full rate (quick udp_stress, 2026-11-22,
// 2 x AMD EPYC vCPU VM): nice 0 gave 0.42x vanilla, nice 19 0.55-0.57x.
const guardOff = "policy=other prio=0 nice=19"

// guardRule is the rule new guards use (tests replace it).
var guardRule = DefaultGuardRule

// guardState is the guard's decision, apart from the kernel so it can be
// tested on synthetic traces.
type guardState struct {
	demoted     bool
	over, under int
}

// step takes one sample (the NIC poll threads' run time and the receive
// core's idle time, in percent of the interval) and says whether the
// state changed.
func (s *guardState) step(r GuardRule, nic, idle float64) bool {
	if !s.demoted {
		s.under = 0
		if nic >= r.Demote {
			s.over++
		} else {
			s.over = 0
		}
		if s.over >= r.DemoteAfter {
			s.demoted, s.over = true, 0
			return true
		}
		return false
	}
	s.over = 0
	if idle >= r.Promote {
		s.under++
	} else {
		s.under = 0
	}
	if s.under >= r.PromoteAfter {
		s.demoted, s.under = false, 0
		return true
	}
	return false
}

// GuardStatus is what `lanes status` shows of the guard.
type GuardStatus struct {
	At         time.Time `json:"at"`
	Core       int       `json:"core"`
	Threads    []string  `json:"threads"`
	Demoted    bool      `json:"demoted"` // NIC poll off the ladder now
	NICPercent float64   `json:"nic_percent"`
	Idle       float64   `json:"idle_percent"`
	Demotions  uint64    `json:"demotions"`
	Err        string    `json:"error,omitempty"`
}

type guard struct {
	env           plan.AgentEnv
	rule          GuardRule
	core          int
	threads       []knobs.KthreadInfo // the underlay's NAPI threads
	onLadder, off string

	mu     sync.Mutex
	state  guardState
	status GuardStatus
}

// newGuard finds the NIC poll threads the plan put on the ladder; nil
// (and no error) when there are none to guard: streamline off, or an
// underlay without threaded NAPI.
func newGuard(env plan.AgentEnv, o Options) (*guard, error) {
	if !o.Streamline {
		return nil, nil
	}
	t, err := topology.Discover(env.NetNS)
	if err != nil {
		return nil, fmt.Errorf("prism guard: %w", err)
	}
	core := o.CPU
	if core < 0 {
		if irq := plan.IRQCPUs(t); len(irq) > 0 {
			core = irq[0]
		} else if len(env.CPUs) > 0 {
			core = env.CPUs[len(env.CPUs)-1]
		}
	}
	g := &guard{env: env, rule: guardRule, core: core,
		onLadder: fmt.Sprintf("policy=fifo prio=%d nice=0", o.Ladder().NIC),
		off:      guardOff}
	for _, u := range t.Underlays {
		g.threads = append(g.threads, u.NAPIThreads...)
	}
	if len(g.threads) == 0 {
		return nil, nil
	}
	g.status.Core = core
	for _, th := range g.threads {
		g.status.Threads = append(g.status.Threads, th.Comm)
	}
	return g, nil
}

func (g *guard) Status() GuardStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.status
	s.Threads = slices.Clone(s.Threads)
	return s
}

// run samples until ctx ends and leaves the plan's scheduling behind.
func (g *guard) run(ctx context.Context) error {
	sampler, err := load.NewSampler()
	if err != nil {
		return fmt.Errorf("prism guard: %w", err)
	}
	defer func() {
		if g.state.demoted {
			g.set(g.onLadder)
		}
	}()
	tick := time.NewTicker(g.rule.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		s, err := sampler.Sample()
		if err != nil {
			return fmt.Errorf("prism guard: sampling load: %w", err)
		}
		var nic float64
		for _, th := range sampler.Threads() {
			if slices.ContainsFunc(g.threads, func(k knobs.KthreadInfo) bool { return k.Comm == th.Comm }) {
				nic += th.Percent
			}
		}
		c, _ := s.Core(g.core)
		var errText string
		if g.state.step(g.rule, nic, c.Idle) {
			v, what := g.onLadder, "overload over (core %d idle %.0f%%): NIC poll back on the ladder (%s)"
			if g.state.demoted {
				v, what = g.off, "overload (NIC poll %.0f%% of core %d): NIC poll off the ladder (%s) so bulk work is not starved"
			}
			if err := g.set(v); err != nil {
				errText = err.Error()
			}
			if g.env.Logf != nil {
				if g.state.demoted {
					g.env.Logf(what, nic, g.core, v)
				} else {
					g.env.Logf(what, g.core, c.Idle, v)
				}
			}
		}
		g.mu.Lock()
		if g.state.demoted && !g.status.Demoted {
			g.status.Demotions++
		}
		g.status.At, g.status.Demoted, g.status.NICPercent, g.status.Idle = s.At, g.state.demoted, nic, c.Idle
		if errText != "" {
			g.status.Err = errText
		}
		g.mu.Unlock()
	}
}

// set writes v to every guarded thread's scheduling. A thread that is
// gone (its device went away) is skipped.
func (g *guard) set(v string) error {
	var first error
	for _, th := range g.threads {
		if err := knobs.Sched(th.Comm, th.Index).Write([]byte(v)); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// guardAgent is the guard alone (batch mode).
type guardAgent struct{ g *guard }

func (a guardAgent) Run(ctx context.Context) error {
	if a.g == nil {
		<-ctx.Done()
		return nil
	}
	return a.g.run(ctx)
}

func (a guardAgent) Status() any {
	if a.g == nil {
		return GuardStatus{Err: "nothing to guard: the NIC poll is not on the ladder"}
	}
	return a.g.Status()
}
