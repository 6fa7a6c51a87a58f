package prism

import (
	"context"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/heartbeat"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/topology"
	"golang.org/x/sys/unix"
)

// The overload guard. Streamlined order puts the NIC poll's NAPI thread on
// the real-time ladder, above the bulk queue's kthread, so a high-priority
// frame is classified without waiting behind bulk work. Under overload
// (more frames than the receive core can process) that thread never runs
// out of work, and a real-time thread that never sleeps keeps the core:
// the bulk kthread gets what real-time throttling leaves (5%), and bulk
// throughput collapses to a small fraction of vanilla's. The kernel's own
// softirq path degrades gracefully there because polling and processing
// share one budget.
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

// The same guard, with another target, watches bulk-sched=idle's bulk
// queue (bulkTarget below): SCHED_IDLE lets every normal task take the
// receive core from bulk receive work, which is what a light high-priority
// service wants (its server gets the core the moment it wakes), but a
// CPU-bound service on that core would then starve bulk traffic (a marked
// memcached under background does). The symptom is
// the bulk kthread waiting, runnable, for most of the interval while the
// core's other tasks (applications) take a share of it (guard-tasks); the
// guard then gives it normal scheduling (fair shares, as
// bulk-sched=normal) until the receive core has idle time again or those
// tasks are gone.

// GuardAgentName is the plan.Plan.Agent of prism's batch mode with
// streamlined order or with bulk-sched=idle.
const GuardAgentName = "prism-guard"

func init() {
	plan.RegisterAgent(GuardAgentName, func(env plan.AgentEnv) (plan.Agent, error) {
		o, err := Parse(Defaults(), env.Params)
		if err != nil {
			return nil, plan.ConfigError{Err: err}
		}
		g, err := newGuard(env, o)
		if err != nil {
			return nil, err
		}
		if env.Metrics != nil {
			env.Metrics.MustRegister(steer.NewCollector(plan.PinDir(env.NetNS)))
		}
		return guardAgent{g}, nil
	})
}

// GuardRule is when the guard acts.
type GuardRule struct {
	// Demote: the target's signal (the NIC poll threads' run time, the
	// bulk kthread's wait) was at least this percent of the interval for
	// DemoteAfter samples in a row.
	Demote      float64
	DemoteAfter int
	// Promote: the receive core was idle at least this percent of the
	// interval for PromoteAfter samples in a row; with Tasks, also when
	// the other tasks ran under half of Tasks for PromoteAfter samples in
	// a row.
	Promote      float64
	PromoteAfter int
	Interval     time.Duration
	// Tasks (bulk-sched=idle's guard, guard-tasks): demote only while
	// the receive core's other tasks (Core.Tasks: applications and
	// kernel threads that are not receive work) also ran at least this
	// percent of the interval. 0: the signal alone decides.
	//
	// The application that made the guard act is also what ends it:
	// once it is gone (under half of Tasks, hysteresis against a busy
	// service whose share falls when bulk gets its own), bulk waits only
	// for receive work again, and normal scheduling would only let it
	// take the core from a light marked service. Idle time alone would
	// never come on a core that receive work keeps busy.
	Tasks float64
	// Starved (bulk-sched=idle's guard): demote also when the signal
	// (the bulk kthread's wait) reached this percent of the interval,
	// whatever the other tasks ran. Waiting that long, the kthread runs
	// almost never: what holds the core then is receive work that never
	// runs out, the NIC poll under overload (its NAPI thread or
	// ksoftirqd, both normal tasks that SCHED_IDLE yields to for good),
	// which polls frames into a queue nobody drains: bulk would fall to a
	// small fraction of vanilla's. Bulk that keeps up at any load below the
	// core's capacity runs a large share of the core and cannot wait
	// this long. Only slack ends such a demotion: the applications were
	// not what caused it. 0: off.
	Starved float64
	// Doze: while PRISM stands aside by the NIC's poll depth (samples
	// without the scheduler accounting, dozeAfter of them in a row), the
	// guard samples every Doze instead of every Interval, and the kernel
	// wakes it (cpuload.SchedSampler.ArmWake) as soon as a window of
	// Interval finds the NIC's polls on the receive core at the depth
	// that brings the queues back: then it samples every Interval again.
	// Standing aside, there is no queue to guard and the depth is all
	// the switch needs; the agent's rounds on the cores it shares with
	// the applications are what vanilla does not pay. 0: never dozes.
	Doze time.Duration
}

// DefaultGuardRule: 0.3 s of a saturated NIC poll to step in, 1 s of
// slack to step back.
var DefaultGuardRule = GuardRule{Demote: 85, DemoteAfter: 3, Promote: 10, PromoteAfter: 10, Interval: 100 * time.Millisecond, Doze: time.Second}

// DefaultBulkGuardRule: 0.3 s of the bulk kthread waiting for the core
// more than half the time to step in, 1 s of slack to step back. Its Tasks
// is the plan's guard-tasks (default DefaultGuardTasks), set by
// newTargetGuard whatever the rule says: the other tasks must also take
// that share of the core.
//
// The wait alone does not tell who took the core. A CPU-bound marked
// service on the receive core (memcached) takes it from bulk work for good:
// without the guard bulk starves. But the NIC poll and the high-priority
// queue take it too, and under a light marked service they are most of
// what bulk waits for: with the NIC polled in softirq the bulk kthread
// waited for the core more than half the time under a light ping-pong as
// well as beside memcached, while the core's other tasks took well under
// DefaultGuardTasks under the ping-pong and well over it beside memcached;
// a guard acting on the wait alone cost the ping-pong its p99. Giving bulk
// normal scheduling takes the core back from applications only; from
// softirq and the real-time queue it takes nothing. So the guard acts
// only while applications hold a share of the core.
var DefaultBulkGuardRule = GuardRule{Demote: 50, DemoteAfter: 3, Promote: 10, PromoteAfter: 10, Starved: 90, Interval: 100 * time.Millisecond, Doze: time.Second}

// guardOff is the NIC poll's scheduling while the guard holds it off the
// ladder: normal, at the lowest weight. The poll is work-conserving there:
// it runs whenever the bulk kthread has drained its queue and sleeps, and
// otherwise yields the core to it instead of polling frames the full
// queue would drop. At full rate nice 19 leaves bulk more of the core's
// throughput than nice 0 does.
const guardOff = "policy=other prio=0 nice=19"

// guardRule and bulkGuardRule are the rules new guards use (tests
// replace them).
var guardRule, bulkGuardRule = DefaultGuardRule, DefaultBulkGuardRule

// latch is a two-state decision with hysteresis, apart from the kernel so
// it can be tested on synthetic traces: it turns on after onAfter samples
// in a row that call for on, and off after offAfter in a row that call for
// off. The guard's demotion and high=auto's switch are both one.
type latch struct {
	on          bool
	over, under int
}

// step takes one sample's verdicts and says whether the state changed.
func (l *latch) step(toOn bool, onAfter int, toOff bool, offAfter int) bool {
	if !l.on {
		l.under = 0
		l.over = runLength(l.over, toOn)
		if l.over >= onAfter {
			l.on, l.over = true, 0
			return true
		}
		return false
	}
	l.over = 0
	l.under = runLength(l.under, toOff)
	if l.under >= offAfter {
		l.on, l.under = false, 0
		return true
	}
	return false
}

// runLength is a run length: one more while yes, back to 0 otherwise.
func runLength(n int, yes bool) int {
	if yes {
		return n + 1
	}
	return 0
}

// guardState is the guard's decision: on is demoted; starved: demoted
// by the Starved rule while the other tasks were under Tasks, so their
// going does not end it.
type guardState struct {
	latch
	starved bool
}

// guardSample is what one sample says, in percent of its interval: the
// target's signal (for the NIC poll its threads' run time, for the bulk
// queue its kthread's wait), and the receive core's idle time and other
// tasks' run time.
type guardSample struct{ signal, idle, tasks float64 }

// step takes one sample and says whether the state changed.
func (s *guardState) step(r GuardRule, m guardSample) bool {
	starved := r.Starved > 0 && m.signal >= r.Starved
	gone := r.Tasks > 0 && m.tasks < r.Tasks/2 && !s.starved
	changed := s.latch.step(m.signal >= r.Demote && (m.tasks >= r.Tasks || starved), r.DemoteAfter, m.idle >= r.Promote || gone, r.PromoteAfter)
	if changed {
		s.starved = s.on && m.tasks < r.Tasks
	}
	return changed
}

// demoted: the guard holds its target at the demoted value now.
func (s *guardState) demoted() bool { return s.on }

// GuardStatus is what `lanes status` shows of the guard.
type GuardStatus struct {
	At      time.Time `json:"at"`
	Core    int       `json:"core"`
	Watch   string    `json:"watch"` // what the guard switches
	Threads []string  `json:"threads"`
	Demoted bool      `json:"demoted"` // NIC poll off the ladder, or bulk queue at normal scheduling, now
	// NICPercent is the NIC poll threads' run time (the ladder's guard),
	// BulkWait the bulk kthread's time waiting for the core (bulk-sched's).
	NICPercent float64 `json:"nic_percent,omitempty"`
	BulkWait   float64 `json:"bulk_wait_percent,omitempty"`
	Idle       float64 `json:"idle_percent"`
	// Tasks is the receive core's other tasks' run time (applications,
	// kernel threads that are not receive work); TasksMin the share from
	// which the guard acts (guard-tasks; 0: not a condition).
	Tasks    float64 `json:"tasks_percent"`
	TasksMin float64 `json:"tasks_min_percent,omitempty"`
	// StarvedWait is the bulk kthread's wait from which the guard acts
	// whatever the other tasks ran (GuardRule.Starved; 0: off).
	StarvedWait float64 `json:"starved_wait_percent,omitempty"`
	Demotions   uint64  `json:"demotions"`
	Err         string  `json:"error,omitempty"`
	// SampleErrors counts the rounds skipped because the load could not
	// be sampled; Fallback says why the guard holds the safe placement
	// (demoted) regardless of the load, "" while it follows it.
	SampleErrors uint64 `json:"sample_errors,omitempty"`
	Fallback     string `json:"fallback,omitempty"`
	// Stopped says why the guard no longer acts (the apply it worked
	// for was reset or replaced).
	Stopped string `json:"stopped,omitempty"`
	// Sampler is where the load comes from: "sched" (the scheduler's
	// events) or "proc"; LoadPaused: it counts the NIC's polls alone
	// while PRISM stands aside, and the guard waits.
	Sampler    string `json:"sampler,omitempty"`
	LoadPaused bool   `json:"load_paused,omitempty"`
	// High is high=auto's switch, which runs in the guard's loop.
	High *HighStatus `json:"high_auto,omitempty"`
}

// guardTarget is what a guard watches and switches.
type guardTarget interface {
	// signal is the demotion signal over the sample just taken, in
	// percent of its interval; threads are the receive kthreads that
	// sample measured (nil unless needsThreads).
	signal(threads []cpuload.Thread, interval time.Duration) (float64, error)
	// needsThreads: the signal is receive kthreads' run time, which only
	// the /proc sampler lists by thread.
	needsThreads() bool
	// set switches the target: demoted or the plan's value.
	set(demoted bool) error
	// current reads where the target is: demoted or not, and whether
	// all of it is at one of the two values (known).
	current() (demoted, known bool)
	names() []string
	// watch names the target; demote and promote are log lines, demote
	// with the signal, the core and the other tasks' share as arguments,
	// promote with the core's idle time, the core and that share.
	watch() string
	demote() string
	promote() string
}

type guard struct {
	env    plan.AgentEnv
	rule   GuardRule
	core   int
	target guardTarget // nil: only high=auto's switch runs
	high   *highSwitch // nil unless high=auto
	// newSource opens the load sampler (openSampler; a test's fake).
	newSource func() (cpuload.Source, error)
	metrics   *guardMetrics // nil without a registry
	// asideMetrics: stepping aside's (nil without a registry or aside).
	asideMetrics *asideMetrics
	// nics has the sampler count the NIC's polls for aside-depth (with
	// high); underlays are the devices newTargetGuard's discovery found,
	// which it starts from.
	nics      *nicWatch
	underlays []topology.Device
	// failed counts the samples failed in a row; set is what the
	// target was last switched to (demoted), which a write that failed
	// (another lanes process held the journal) leaves for the next round.
	failed int
	set    *bool
	// accountOff: the sampler's scheduler accounting was last asked off
	// (account); accountAt when it was last asked back on and failed
	// (zero: it did not), accountErr whether that was said.
	accountOff bool
	accountAt  time.Time
	accountErr bool
	// quiet counts the samples in a row that could doze (doze),
	// dozeErr whether a wake that could not be armed was said. Whether
	// the guard dozes is the switch's (highSwitch.doze, dozing).
	quiet   int
	dozeErr bool
	armed   armed // what the wake was armed for
	// beat is the loop's heartbeat (env.Beats), from run's start.
	beat *heartbeat.Beat

	mu     sync.Mutex
	state  guardState
	status GuardStatus
	// aside: the datapath stands PRISM aside now (the switch decided so
	// and its deadline write succeeded); onAsideEnd is called (outside
	// mu) when that ends, and when the guard stops while it held.
	aside      bool
	onAsideEnd func()
}

// standsAside says whether the datapath stands PRISM aside by the last
// sample: both classes in the NIC poll, PRISM-sync's shortcut unused.
func (g *guard) standsAside() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.aside
}

// whenAsideEnds has f called when the datapath no longer stands aside.
func (g *guard) whenAsideEnds(f func()) {
	g.mu.Lock()
	g.onAsideEnd = f
	g.mu.Unlock()
}

// setAside records whether the datapath stands aside, and calls
// onAsideEnd when it no longer does.
func (g *guard) setAside(on bool) {
	g.mu.Lock()
	was, end := g.aside, g.onAsideEnd
	g.aside = on
	g.mu.Unlock()
	if was && !on && end != nil {
		end()
	}
}

// newGuard makes the guard o's plan needs: the ladder's (streamline=true,
// a threaded underlay), bulk-sched=idle's, or none (nil, no error); with
// high=auto's switch in its loop, with or without either.
func newGuard(env plan.AgentEnv, o Options) (*guard, error) {
	g, err := newTargetGuard(env, o)
	if err != nil || o.High != HighAuto {
		return g, err
	}
	// The switch follows the applied config (highSwitch): where the
	// default fell back to the queue, it stands down.
	if g == nil {
		g = &guard{env: env, rule: guardRule, core: o.CPU}
	}
	g.high = newHighSwitch(plan.PinDir(env.NetNS))
	g.nics = &nicWatch{netns: env.NetNS, logf: env.Logf, devs: g.underlays, found: g.underlays != nil}
	if env.Metrics != nil {
		g.asideMetrics = newAsideMetrics(env.Metrics)
	}
	g.status.High = g.high.status()
	return g, nil
}

// asideMetrics are stepping aside's metrics.
type asideMetrics struct {
	aside  prometheus.Gauge
	asides prometheus.Counter
	rx     prometheus.Gauge
	depth  prometheus.Gauge
	doze   prometheus.Gauge
	seen   uint64
}

func newAsideMetrics(reg prometheus.Registerer) *asideMetrics {
	m := &asideMetrics{
		aside:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_prism_aside", Help: "1 while PRISM steps aside (aside-depth, aside-below): the NIC's polls on the receive core find too few frames waiting (or, where they are not counted, its receive work is too light) for its queues to pay, and every flow runs in the NIC poll as in vanilla."}),
		asides: prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_prism_asides_total", Help: "Times PRISM stepped aside for a receive core whose NIC queued too little for its queues to pay, or to read the depth vanilla's path has (a probe, after 10 s in the queues under twice aside-depth)."}),
		depth:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_prism_nic_frames_per_poll", Help: "Frames the underlay NIC's polls on the receive core found waiting, on average, in PRISM's last load sample (-1: not counted)."}),
		rx:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_prism_receive_work_percent", Help: "The receive core's receive work (softirq and receive kthreads) in PRISM's last load sample, percent of the core (-1: not sampled)."}),
	}
	m.doze = prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_prism_dozing", Help: "1 while lanes agent, PRISM standing aside by the NIC's poll depth, samples once a doze (a second) instead of every 100 ms, until the kernel wakes it as the NIC's polls deepen."})
	reg.MustRegister(m.aside, m.asides, m.rx, m.depth, m.doze)
	return m
}

func (m *asideMetrics) set(s *HighStatus) {
	a := s.Aside
	if a == nil {
		a = &AsideStatus{RxPercent: -1, FramesPerPoll: -1, Asides: m.seen}
	}
	v := 0.0
	if a.On {
		v = 1
	}
	m.aside.Set(v)
	if a.Asides > m.seen {
		m.asides.Add(float64(a.Asides - m.seen))
	}
	m.seen = a.Asides
	m.rx.Set(a.RxPercent)
	m.depth.Set(a.FramesPerPoll)
	doze := 0.0
	if a.Doze > 0 {
		doze = 1
	}
	m.doze.Set(doze)
}

// newTargetGuard makes the guard of the ladder or of bulk-sched=idle, or
// none (nil, no error).
func newTargetGuard(env plan.AgentEnv, o Options) (*guard, error) {
	if !o.Streamline && o.BulkSched != SchedIdle {
		return nil, nil
	}
	t, err := topology.Discover(env.NetNS)
	if err != nil {
		return nil, fmt.Errorf("prism guard: %w", err)
	}
	core := o.CPU
	if core < 0 {
		if irq := plan.IRQCPUsOr(t, o.IRQCPUs); len(irq) > 0 {
			core = irq[0]
		} else if len(env.CPUs) > 0 {
			core = env.CPUs[len(env.CPUs)-1]
		}
	}
	g := &guard{env: env, rule: guardRule, core: core, underlays: t.Underlays}
	if o.Streamline {
		nt := &nicTarget{onLadder: fmt.Sprintf("policy=fifo prio=%d nice=0", o.Ladder().NIC), off: guardOff, dir: env.StateDir, gen: journalGeneration(env.StateDir)}
		for _, u := range t.Underlays {
			nt.threads = append(nt.threads, u.NAPIThreads...)
		}
		if len(nt.threads) == 0 {
			return nil, nil
		}
		g.target = nt
	} else {
		bt, err := newBulkTarget(env.NetNS, core)
		if err != nil {
			return nil, err
		}
		bt.stateDir, bt.gen = env.StateDir, journalGeneration(env.StateDir)
		if !bt.idle() {
			// The plan resolved bulk-sched to idle, but the kthread is not
			// SCHED_IDLE: the state was applied by a lanes from before idle
			// was the default (bulk-sched unset then meant normal), or an
			// agent died with it demoted. Guarding would set SCHED_IDLE on
			// a kthread the apply left normal; normal needs no guard.
			if env.Logf != nil {
				env.Logf("prism guard: the bulk queue's kthread on core %d is not SCHED_IDLE (applied by an older lanes, or left demoted): no starvation guard; re-apply for bulk-sched=idle", core)
			}
			return nil, nil
		}
		bt.nice = o.GuardNice
		g.rule, g.target = bulkGuardRule, bt
		g.rule.Tasks = o.GuardTasks
	}
	g.status.Core, g.status.Watch, g.status.Threads = core, g.target.watch(), g.target.names()
	g.status.TasksMin, g.status.StarvedWait = g.rule.Tasks, g.rule.Starved
	if env.Metrics != nil {
		g.metrics = &guardMetrics{sampleErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_prism_guard_sample_errors_total", Help: "Rounds the PRISM guard skipped because the load could not be sampled."})}
		env.Metrics.MustRegister(g.metrics.sampleErrors)
	}
	return g, nil
}

// journalGeneration is the generation of the journal in dir ("" for none).
func journalGeneration(dir string) string {
	ents, err := knobs.ReadEntries(dir)
	if err != nil {
		return ""
	}
	return knobs.Generation(ents)
}

// Summary is what `lanes status` shows of the guard.
func (s GuardStatus) Summary() []string {
	if s.Watch == "" && s.High != nil {
		return []string{s.High.Summary()}
	}
	if s.Watch == "" {
		return []string{"guard: " + s.Err}
	}
	state := "not acting"
	if s.Demoted {
		state = "acting (demoted now)"
	}
	sig := fmt.Sprintf("NIC poll ran %.0f%%", s.NICPercent)
	if s.BulkWait > 0 || s.NICPercent == 0 {
		sig = fmt.Sprintf("bulk kthread waited %.0f%%", s.BulkWait)
	}
	when := ""
	if s.TasksMin > 0 {
		when = fmt.Sprintf(" (acts from %.0f%%", s.TasksMin)
		if s.StarvedWait > 0 {
			when += fmt.Sprintf(", or on a %.0f%% wait alone", s.StarvedWait)
		}
		when += ")"
	}
	last := fmt.Sprintf("last sample (from %s): %s, other tasks %.0f%%%s, core idle %.0f%%", s.Sampler, sig, s.Tasks, when, s.Idle)
	if s.LoadPaused {
		last = fmt.Sprintf("load not sampled while PRISM stands aside (%s counts the NIC's polls alone; no bulk queue to guard)", s.Sampler)
	}
	out := []string{
		fmt.Sprintf("guard on core %d: %s; %s", s.Core, s.Watch, state),
		fmt.Sprintf("%s; demotions %d; threads %s", last, s.Demotions, strings.Join(s.Threads, ", ")),
	}
	if s.High != nil {
		out = append(out, s.High.Summary())
	}
	if s.Err != "" {
		out = append(out, "error: "+s.Err)
	}
	return out
}

func (g *guard) Status() GuardStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.status
	s.Threads = slices.Clone(s.Threads)
	if s.High != nil {
		h := *s.High
		s.High = &h
	}
	return s
}

// guardFailLimit is how many samples in a row may fail before the guard
// stops trusting the load it last saw and holds the safe placement.
const guardFailLimit = 5

// switchTarget switches the target to demoted, unless it is there: a
// write a busy journal refused is tried again at the next round. It
// returns ErrStale when the apply the guard works for is gone.
func (g *guard) switchTarget(demoted bool) error {
	if g.set != nil && *g.set == demoted {
		return nil
	}
	err := g.target.set(demoted)
	if err == nil || errors.Is(err, knobs.ErrGone) {
		// A thread that is gone has nothing left to switch.
		g.set = &demoted
	}
	return err
}

// resume starts the guard from where its target is: a guard that
// stopped while demoted left it demoted (the safe placement under
// overload), and the one started after it holds it there until the load
// says otherwise, rather than putting the NIC poll back on the ladder
// for its first samples. A target not all at one value is written at
// the first sample.
func (g *guard) resume() {
	demoted, known := g.target.current()
	g.state = guardState{latch: latch{on: demoted}}
	g.set = nil
	if known {
		g.set = &demoted
	}
	g.mu.Lock()
	g.status.Demoted = demoted
	g.mu.Unlock()
}

// sampleFailed skips a round whose load could not be sampled; after
// guardFailLimit in a row the guard holds the safe placement, demoted
// (under overload the ladder starves bulk work, off it nothing
// collapses), until sampling works again.
func (g *guard) sampleFailed(err error) {
	g.failed++
	g.mu.Lock()
	g.status.SampleErrors++
	g.status.Err = "sampling load: " + err.Error()
	fallback := g.failed >= guardFailLimit && g.status.Fallback == ""
	if fallback {
		g.status.Fallback = fmt.Sprintf("the load could not be sampled %d times in a row (%v): holding the safe placement (demoted) until it can", g.failed, err)
		g.status.Demoted = true
	}
	g.mu.Unlock()
	if m := g.metrics; m != nil {
		m.sampleErrors.Inc()
	}
	if fallback {
		g.state = guardState{latch: latch{on: true}}
		if serr := g.switchTarget(true); serr != nil && g.env.Logf != nil {
			g.env.Logf("prism guard: falling back to the safe placement: %v", serr)
		}
		if g.env.Logf != nil {
			g.env.Logf("prism guard: %s", g.status.Fallback)
		}
	}
}

// run samples until ctx ends (or the apply it works for is gone). It
// leaves the target as the load last said: demoted under overload (the
// plan's value there is what collapses: the NIC poll above bulk work,
// bulk at SCHED_IDLE under a busy service), the plan's value otherwise;
// and every rule's flows in the high-priority queue, high=auto's start.
// A round whose load cannot be sampled is skipped, not the end.
func (g *guard) run(ctx context.Context) error {
	if g.high != nil {
		defer func() {
			if err := g.high.stop(); err != nil && g.env.Logf != nil {
				g.env.Logf("high=auto: putting the high-priority flows back in their queue: %v", err)
			}
			g.setAside(false)
		}()
	}
	open := g.openSampler
	if g.newSource != nil {
		open = g.newSource
	}
	var src cpuload.Source
	defer func() {
		if src != nil {
			src.Close()
		}
	}()
	if g.target != nil {
		var err error
		if src, err = open(); err != nil {
			return fmt.Errorf("prism guard: %w", err)
		}
		g.resume()
		defer func() {
			if g.state.demoted() && g.env.Logf != nil && g.status.Stopped == "" {
				g.env.Logf("prism guard: stopping while demoted: left demoted, the safe placement under overload (lanes reset restores the original)")
			}
		}()
	}
	tick := time.NewTicker(g.rule.Interval)
	defer tick.Stop()
	g.beat = g.env.Beats.Loop("prism guard", g.rule.Interval)
	defer g.beat.Stop()
	loadTried := false
	for ; ; g.beat.Beat() {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case w := <-g.wakes(src):
			// Sampled at once: the sample spans the doze, and the ones
			// after it an Interval each.
			g.wakeUp(src.(waker), tick)
			if g.env.Logf != nil {
				g.env.Logf("high=auto: the NIC's polls on core %d found %.2f frames each over %v or more: the agent samples every %v again", w.CPU, float64(w.Frames)/float64(max(w.Polls, 1)), g.rule.Interval, g.rule.Interval)
			}
		}
		if src == nil && g.high != nil && g.high.wantsLoad() && !loadTried {
			// The applied config steps aside: the switch needs the
			// receive core's load, opened once.
			loadTried = true
			var err error
			if src, err = open(); err != nil {
				src = nil
				if g.env.Logf != nil {
					g.env.Logf("high=auto: no load samples (%v): PRISM does not step aside", err)
				}
			}
		}
		var s cpuload.Sample
		var err error
		if src != nil && g.nics != nil && g.high.wantsDepth() {
			g.nics.keep(src, time.Now())
		}
		if src != nil {
			s, err = src.Sample()
		}
		if g.high != nil {
			if src != nil {
				g.high.takeLoad(s, err == nil)
			}
			g.sampleHigh()
		}
		// Whether s was taken with the accounting asked off; then ask
		// for what the switch's decision needs next.
		paused := g.accountOff
		if src != nil && g.high != nil {
			g.account(src)
			g.doze(src, tick)
		}
		if src == nil || g.target == nil {
			continue
		}
		if err != nil {
			g.sampleFailed(err)
			continue
		}
		if s.NICOnly && !paused {
			// Asked back on, the accounting did not come: no load to
			// judge by, counted as a failed sample (the safe placement
			// after guardFailLimit).
			g.sampleFailed(errors.New("the scheduler accounting could not be turned back on"))
			continue
		}
		if s.NICOnly {
			// Stood aside: nothing in the bulk queue to guard, and no
			// load to judge by; the target stays as it was.
			g.mu.Lock()
			g.status.LoadPaused = true
			g.mu.Unlock()
			continue
		}
		if g.failed > 0 {
			g.failed = 0
			g.mu.Lock()
			if g.status.Fallback != "" && g.env.Logf != nil {
				g.env.Logf("prism guard: sampling works again: following the load")
			}
			g.status.Fallback = ""
			g.mu.Unlock()
		}
		var errText string
		var threads []cpuload.Thread
		if p, ok := src.(*cpuload.Sampler); ok {
			threads = p.Threads()
		}
		sig, err := g.target.signal(threads, s.Interval)
		if err != nil {
			errText = err.Error()
		}
		c, _ := s.Core(g.core)
		changed := g.state.step(g.rule, guardSample{signal: sig, idle: c.Idle, tasks: c.Tasks})
		if err := g.switchTarget(g.state.demoted()); err != nil {
			errText = err.Error()
			if errors.Is(err, knobs.ErrStale) {
				g.mu.Lock()
				g.status.Stopped = err.Error()
				g.mu.Unlock()
				if g.env.Logf != nil {
					g.env.Logf("prism guard: %v: the guard stops, leaving what the reset or the new apply set", err)
				}
				return nil
			}
		}
		if changed {
			if g.env.Logf != nil {
				if g.state.demoted() {
					g.env.Logf(g.target.demote(), sig, g.core, c.Tasks)
				} else {
					g.env.Logf(g.target.promote(), c.Idle, g.core, c.Tasks)
				}
			}
		}
		g.mu.Lock()
		if g.state.demoted() && !g.status.Demoted {
			g.status.Demotions++
		}
		g.status.At, g.status.Demoted, g.status.Idle, g.status.Tasks, g.status.LoadPaused = s.At, g.state.demoted(), c.Idle, c.Tasks, false
		if _, ok := g.target.(*nicTarget); ok {
			g.status.NICPercent = sig
		} else {
			g.status.BulkWait = sig
		}
		if errText != "" {
			g.status.Err = errText
		}
		g.mu.Unlock()
	}
}

// openSampler picks the load source: the scheduler's events (one map read
// a sample) unless the target needs the receive kthreads one by one, or
// the kernel lacks the tracing programs; then /proc, whose sampler also
// walks all of /proc once a second, often on the very core it guards.
func (g *guard) openSampler() (cpuload.Source, error) {
	if g.target == nil || !g.target.needsThreads() {
		if s, err := cpuload.NewSchedSampler(); err == nil {
			g.setSampler("sched")
			return s, nil
		} else if g.env.Logf != nil {
			g.env.Logf("guard reads /proc: no scheduler accounting on this kernel (%v)", err)
		}
	}
	p, err := cpuload.NewSampler()
	if err != nil {
		return nil, err
	}
	g.setSampler("proc")
	if g.target != nil && g.rule.Tasks > 0 && !g.target.needsThreads() {
		// /proc/stat counts 10 ms ticks (10 in a 100 ms sample) and, on
		// kernels without IRQ time accounting, books softirq on top of a
		// receive kthread differently from its schedstat: the other
		// tasks' share is not good to a few percent there. Guarding on
		// the wait alone keeps bulk from starving; it may cost a light
		// marked service its tail, as before guard-tasks.
		if g.env.Logf != nil {
			g.env.Logf("guard reads /proc, whose other-tasks share is too coarse for guard-tasks=%v: acting on the bulk kthread's wait alone", g.rule.Tasks)
		}
		g.rule.Tasks = 0
		g.mu.Lock()
		g.status.TasksMin = 0
		g.mu.Unlock()
	}
	return p, nil
}

// accounter is a sampler whose scheduler accounting can be turned off
// (cpuload.SchedSampler).
type accounter interface{ SetAccounting(on bool) error }

// account keeps the sampler's scheduler accounting off while PRISM stands
// aside by the NIC's poll depth: coming back needs the NIC poll counter
// alone, while the accounting's programs run on every task switch and
// softirq of every core. On again in the round the queues come back, so
// the guard's next sample judges them by load. Turning it back on visits
// every core; where that fails it is tried again once a second (samples
// meanwhile count as failed: run) and said once.
func (g *guard) account(src cpuload.Source) {
	a, ok := src.(accounter)
	if !ok {
		return
	}
	off := g.high.asideByDepth()
	if !off && !g.accountAt.IsZero() && time.Since(g.accountAt) < time.Second {
		return
	}
	g.accountOff = off
	if err := a.SetAccounting(!off); err != nil {
		g.accountAt = time.Now()
		if !g.accountErr && g.env.Logf != nil {
			g.env.Logf("high=auto: the scheduler accounting did not come back after PRISM stood aside (trying again each second): %v", err)
		}
		g.accountErr = true
		return
	}
	g.accountAt = time.Time{}
}

// waker is a sampler the kernel can wake (cpuload.SchedSampler).
type waker interface {
	ArmWake(core int, depth float64, window time.Duration, minPolls int) error
	DisarmWake() error
	Wakes() <-chan cpuload.Wake
}

// armed is the receive core and depth (hundredths) a wake was armed for.
type armed struct {
	core  int
	depth uint32
}

// dozeAfter is how many samples in a row PRISM stands aside by the depth
// before the guard dozes: a second at the default interval, so a wake
// that found a burst the samples after it do not confirm samples that
// long before it dozes again. dozeMinPolls: the polls a window needs to
// wake it, so that a lone poll of a burst does not.
const (
	dozeAfter    = 10
	dozeMinPolls = 8
)

// dozing: the guard samples every rule.Doze, the kernel's wake armed
// (the switch's deadline written to cover it: highSwitch.setDoze).
func (g *guard) dozing() bool { return g.high != nil && g.high.doze > 0 }

// wakes is the sampler's wakes while the guard dozes (nil otherwise:
// never ready).
func (g *guard) wakes(src cpuload.Source) <-chan cpuload.Wake {
	if !g.dozing() {
		return nil
	}
	return src.(waker).Wakes()
}

// doze has the guard sample every rule.Doze while PRISM stands aside by
// the NIC's poll depth (the accounting off: account), after dozeAfter
// such samples in a row, with the kernel's wake armed at the depth that
// brings the queues back, over windows of rule.Interval on the receive
// core. A round that does not stand aside so ends the doze, and so does
// one whose sample found the depth (the wake may not fire: a window with
// too few polls) or whose config names another depth or core than the
// one armed: the guard samples every Interval and, still aside, dozes
// again after dozeAfter samples with the config's. Where the wake cannot
// be armed (or the deadline written for the longer sample), the guard
// samples at its interval, says so once, and tries again after another
// dozeAfter samples.
func (g *guard) doze(src cpuload.Source, tick *time.Ticker) {
	w, ok := src.(waker)
	if !ok || g.rule.Doze <= 0 {
		return
	}
	depth := float64(g.high.depth) / 100
	if !g.high.asideByDepth() || !g.accountOff {
		g.quiet = 0
		if g.dozing() {
			g.wakeUp(w, tick)
		}
		return
	}
	if g.dozing() {
		if g.high.fpp >= depth || g.armed != (armed{g.high.core, g.high.depth}) {
			g.wakeUp(w, tick)
		}
		return
	}
	if g.quiet++; g.quiet < dozeAfter {
		return
	}
	g.quiet = 0
	err := w.ArmWake(g.high.core, depth, g.rule.Interval, dozeMinPolls)
	if err == nil {
		if err = g.high.setDoze(g.rule.Doze); err != nil {
			w.DisarmWake()
		}
	}
	if err != nil {
		if !g.dozeErr && g.env.Logf != nil {
			g.env.Logf("high=auto: the agent samples every %v while PRISM stands aside (no doze: %v)", g.rule.Interval, err)
		}
		g.dozeErr = true
		return
	}
	g.dozeErr, g.armed = false, armed{g.high.core, g.high.depth}
	tick.Reset(g.rule.Doze)
	g.beat.Doze(g.rule.Doze)
	g.publishHigh()
	if g.env.Logf != nil {
		g.env.Logf("high=auto: PRISM stands aside: the agent samples every %v, woken by the kernel when the NIC's polls on core %d find %.2f frames each over %v", g.rule.Doze, g.high.core, depth, g.rule.Interval)
	}
}

// wakeUp ends the doze: the wake disarmed, samples every rule.Interval
// again. A disarm that fails leaves acct_poll judging windows (one more
// lookup and a clock read a counted poll) and sending records nobody
// takes, until the next arming replaces it or the sampler closes.
func (g *guard) wakeUp(w waker, tick *time.Ticker) {
	if err := w.DisarmWake(); err != nil && g.env.Logf != nil {
		g.env.Logf("high=auto: %v", err)
	}
	g.high.setDoze(0)
	g.quiet = 0
	tick.Reset(g.rule.Interval)
	g.beat.Doze(0)
	g.publishHigh()
}

// sampleHigh steps high=auto's switch and records what it did (its
// errors in its own status, cleared by the next good sample).
func (g *guard) sampleHigh() {
	if msg := g.high.sample(time.Now()); msg != "" && g.env.Logf != nil {
		g.env.Logf("%s", msg)
	}
	g.publishHigh()
}

// publishHigh makes the switch's state the status's and the metrics'.
func (g *guard) publishHigh() {
	st := g.high.status()
	if g.asideMetrics != nil {
		g.asideMetrics.set(st)
	}
	g.mu.Lock()
	g.status.High = st
	g.mu.Unlock()
	g.setAside(g.high.standsAside())
}

func (g *guard) setSampler(v string) {
	g.mu.Lock()
	g.status.Sampler = v
	g.mu.Unlock()
}

type guardMetrics struct {
	sampleErrors prometheus.Counter
}

// nicTarget is the NIC poll on the streamlined ladder: its signal is its
// threads' run time; demoted, it runs at guardOff. The threads'
// scheduling is a knob the plan set: the guard writes it through the
// journal of dir, as generation gen's runtime writer (knobs.RuntimeWrite).
type nicTarget struct {
	threads       []kthread.Info // the underlay's NAPI threads
	onLadder, off string
	dir, gen      string
}

func (n *nicTarget) needsThreads() bool { return true }

func (n *nicTarget) signal(threads []cpuload.Thread, _ time.Duration) (float64, error) {
	var nic float64
	for _, th := range threads {
		if slices.ContainsFunc(n.threads, func(k kthread.Info) bool { return k.Comm == th.Comm }) {
			nic += th.Percent
		}
	}
	return nic, nil
}

// set writes the scheduling to every guarded thread, as the apply
// journaled it (knobs.RuntimeWrite). A thread that is gone (its device
// went away, or another took its name: threaded NAPI switched off and
// on) is skipped, and one of the same name is left as its runtime made
// it: the reset would skip it too.
func (n *nicTarget) set(demoted bool) error {
	v := n.onLadder
	if demoted {
		v = n.off
	}
	var first error
	for _, th := range n.threads {
		err := knobs.RuntimeWrite(n.dir, n.gen, knobs.Sched(th.Comm, th.Index), []byte(v))
		if errors.Is(err, knobs.ErrStale) {
			return err
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// current: demoted when a thread is at the demoted value, known when
// every thread is at the same one of the two.
func (n *nicTarget) current() (demoted, known bool) {
	at := map[string]int{}
	for _, th := range n.threads {
		if b, err := knobs.Sched(th.Comm, th.Index).Read(); err == nil {
			at[strings.TrimSpace(string(b))]++
		}
	}
	return at[n.off] > 0, at[n.off] == len(n.threads) || at[n.onLadder] == len(n.threads)
}

func (n *nicTarget) names() []string { return comms(n.threads) }

func (n *nicTarget) watch() string { return "NIC poll on the real-time ladder (streamline)" }
func (n *nicTarget) demote() string {
	return "overload (NIC poll %.0f%% of core %d, other tasks %.0f%%): NIC poll off the ladder (" + n.off + ") so bulk work is not starved"
}
func (n *nicTarget) promote() string {
	return "overload over (idle %.0f%% of core %d, other tasks %.0f%%): NIC poll back on the ladder (" + n.onLadder + ")"
}

// bulkTarget is bulk-sched=idle's bulk queue kthread on the receive core:
// its signal is the time it waited for the core; demoted, it gets normal
// scheduling. Its threads belong to lanes' cpumap entry (no host setting:
// they die with the datapath), so it is set directly, not as a knob.
type bulkTarget struct {
	dir  string
	core int
	// threads are the bulk queue's kthreads on the receive core; wait
	// is each one's schedstat wait time at the last sample, by pid.
	threads []kthread.Info
	wait    map[int]uint64
	// readAt is when wait was read: the wait is a share of the time
	// between two reads, not of the sampler's interval, which the guard's
	// own goroutine overruns on a busy core (that gave "waited 111%").
	readAt time.Time
	// now and readWait are time.Now and stats.Read's wait (a thread's
	// wait in ns), or a test's clock and trace.
	now      func() time.Time
	readWait func(pid int) (uint64, error)
	stats    kthread.Schedstats
	// nice is the bulk kthread's nice value while demoted (guard-nice).
	nice int
	// stateDir and gen: the journal of the apply the guard works for,
	// under whose lock and generation set writes (the kthread is lanes'
	// own, not a journaled knob, but a reset or a new apply ends the
	// guard's say).
	stateDir, gen string
}

func newBulkTarget(netns string, core int) (*bulkTarget, error) {
	b := &bulkTarget{dir: plan.PinDir(netns), core: core, wait: map[int]uint64{}, now: time.Now}
	b.readWait = func(pid int) (uint64, error) {
		_, wait, err := b.stats.Read(pid)
		return wait, err
	}
	if err := b.find(); err != nil {
		return nil, err
	}
	return b, nil
}

// find lists the bulk queue's kthread on the receive core, again after a
// re-apply made a new one.
func (b *bulkTarget) find() error {
	dp, err := steer.Open(b.dir)
	if err != nil {
		return fmt.Errorf("prism guard: %w (is prism applied with bulk-sched=idle? `lanes status` tells)", err)
	}
	defer dp.Close()
	ths, err := dp.CPUMap().Kthreads()
	if err != nil {
		return fmt.Errorf("prism guard: the bulk queue's kthreads: %w", err)
	}
	b.threads = slices.DeleteFunc(ths, func(th kthread.Info) bool { return !kthread.CPUMapOn(th.Comm, b.core) })
	if len(b.threads) == 0 {
		return fmt.Errorf("prism guard: no bulk queue kthread on core %d", b.core)
	}
	clear(b.wait)
	b.stats.Close()
	b.readAt = time.Time{}
	return nil
}

// idle says whether a bulk kthread runs SCHED_IDLE, as bulk-sched=idle's
// apply left it.
func (b *bulkTarget) idle() bool {
	for _, th := range b.threads {
		if a, err := unix.SchedGetAttr(th.PID, 0); err == nil && a.Policy == unix.SCHED_IDLE {
			return true
		}
	}
	return false
}

// needsThreads: the bulk kthreads' wait is read from their own schedstat.
func (b *bulkTarget) needsThreads() bool { return false }

func (b *bulkTarget) signal(_ []cpuload.Thread, interval time.Duration) (float64, error) {
	at := b.now()
	if !b.readAt.IsZero() && at.After(b.readAt) {
		interval = at.Sub(b.readAt)
	}
	b.readAt = at
	var most float64
	for _, th := range b.threads {
		wait, err := b.readWait(th.PID)
		if err != nil {
			// The kthread is gone: the datapath was re-applied or reset.
			return 0, b.find()
		}
		old, seen := b.wait[th.PID]
		b.wait[th.PID] = wait
		if seen && wait >= old && interval > 0 {
			most = max(most, 100*float64(wait-old)/float64(interval))
		}
	}
	// schedstat's wait can lag or lead the clock by a tick: a share of
	// the time is at most all of it.
	return min(most, 100), nil
}

// set writes the bulk kthreads' scheduling, each to the thread find
// listed (its pid and start time: a pid reused since is not written),
// under the journal's lock while it still is the apply's the guard works
// for (knobs.RuntimeDo): a reset or a newer apply ends the guard's say,
// and none runs between that check and the write.
func (b *bulkTarget) set(demoted bool) error {
	a := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
	if demoted {
		a.Policy, a.Nice = unix.SCHED_NORMAL, int32(b.nice)
	}
	write := func() error {
		var first error
		for _, th := range b.threads {
			if err := (knobs.Thread{PID: th.PID, Started: th.Started}).SetSched(a); err != nil && first == nil {
				first = fmt.Errorf("%s: %w", th.Comm, err)
			}
		}
		return first
	}
	if b.stateDir == "" {
		return write()
	}
	return knobs.RuntimeDo(b.stateDir, b.gen, fmt.Sprintf("bulk queue of core %d", b.core), write)
}

// current: the guard is made only over a bulk kthread at SCHED_IDLE
// (newTargetGuard), the plan's value.
func (b *bulkTarget) current() (demoted, known bool) { return false, true }

func (b *bulkTarget) names() []string { return comms(b.threads) }

func (b *bulkTarget) watch() string { return "bulk queue at SCHED_IDLE (bulk-sched=idle)" }
func (b *bulkTarget) demote() string {
	if b.nice != 0 {
		return fmt.Sprintf("bulk starved (its kthread waited %%.0f%%%% of the time on core %%d, other tasks ran %%.0f%%%%): bulk queue at normal scheduling, nice %d", b.nice)
	}
	return "bulk starved (its kthread waited %.0f%% of the time on core %d, other tasks ran %.0f%%): bulk queue at normal scheduling"
}
func (b *bulkTarget) promote() string {
	return "starvation over (idle %.0f%% of core %d, other tasks %.0f%%): bulk queue back at SCHED_IDLE"
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
		return GuardStatus{Err: "nothing to guard: the NIC poll is not on the ladder, bulk-sched is not idle and high is not auto"}
	}
	return a.g.Status()
}

// comms are the threads' names.
func comms(ths []kthread.Info) []string {
	var out []string
	for _, th := range ths {
		out = append(out, th.Comm)
	}
	return out
}

// DefaultGuardTasks is guard-tasks' default: the share of the receive core
// other tasks must take before bulk-sched=idle's guard acts.
const DefaultGuardTasks = 15
