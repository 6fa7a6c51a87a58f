// Package balancer is Falcon's softirq balancing as pure logic: it turns
// per-core busy samples into placement decisions and never touches the
// system itself, so every rule can be tested from synthetic traces.
//
// Falcon (EuroSys'21) keeps, per CPU, a moving average of its busy percent
// updated every 10 jiffies. When the CPU a (flow, stage) hashes to is at or
// over a threshold (80%) Falcon rehashes once, blindly; when the average of
// all CPUs reaches the threshold Falcon switches itself off and lets the
// kernel place receive processing as it would without it. This package keeps
// the moving average and the threshold but improves two rules:
//
//   - a stage leaving an overloaded core goes to the least-loaded core under
//     the threshold, not to wherever a second hash lands (which may be just
//     as busy);
//   - after falling back, placement resumes once the average has dropped a
//     hysteresis margin below the threshold, instead of oscillating on and
//     off around it;
//   - a set that climbs back to the fallback level soon after resuming is
//     carrying its own spread work, not someone else's: it stays spread
//     and falls back only a hysteresis margin above the level of the last
//     fallback (see Observe). On two cores the work Falcon moves off a
//     saturated IRQ core is half the set's average, so Falcon's rule alone
//     falls back, resumes and falls back again, over and over, for as long
//     as the load lasts.
package balancer

import (
	"fmt"
	"math"
	"slices"
	"sync"
)

const (
	// DefaultThreshold is Falcon's load threshold, in percent.
	DefaultThreshold = 80
	// DefaultHysteresis keeps a fallen-back set off until its average is
	// this many points under the threshold: one sample's noise should not
	// flip the whole datapath between Falcon and vanilla placement.
	DefaultHysteresis = 10

	// HistoryWeight is Falcon's moving average: load = (HistoryWeight*old +
	// busy) / (HistoryWeight+1), i.e. (4*old+busy)/5. With Falcon's 10-jiffy
	// period this forgets a burst within a few tens of milliseconds while
	// ignoring one-period spikes; it is a constant, not a knob, so lanes'
	// numbers stay comparable with the paper's.
	HistoryWeight = 4

	// CycleRounds is how soon, in samples, a fallback after a resume counts
	// as a cycle of the set's own making: 50 samples, 2 s at the default
	// 40 ms interval. The moving average takes about 5 samples to follow a
	// step (HistoryWeight), and the cycles damping is for take well under
	// this from a resume to the next fallback.
	CycleRounds = 50

	// maxBar caps the damped fallback bar: a chain of damped cycles, each
	// falling back a little past the last, can raise it past 100%, which a
	// set can never reach.
	maxBar = 99
)

// Config is what a Balancer balances over. It is taken literally: a zero
// Threshold is an error, not a default (use DefaultConfig).
type Config struct {
	// CPUs is the core set placement may use.
	CPUs []int
	// Threshold is the load, in percent, at or above which a core takes no
	// more stages and at or above which the set's average falls back to
	// vanilla placement.
	Threshold float64
	// Hysteresis is how far, in percent points, the set average must fall
	// under Threshold before a fallen-back set resumes, and how far a
	// bucket's hashed core must fall under it before the bucket moves back.
	Hysteresis float64
	// Avoid lists cores to pick last among equally loaded ones, e.g. the
	// core taking the NIC's interrupts. It only breaks ties: an avoided
	// core that is clearly less loaded is still chosen.
	Avoid []int
	// Fallback is the figure the fallback to vanilla placement watches:
	// FallbackAverage (Falcon's: the set's average load) or FallbackAll
	// (the least-loaded core's: every core is at the threshold, so there is
	// nowhere left to dispatch to). "" is FallbackAverage.
	Fallback string
	// Damp turns on cycle damping: a fallback within CycleRounds of a
	// resume is not taken (see Observe). Off, the set falls back every
	// time the figure reaches the threshold, as Falcon does.
	Damp bool
}

// Fallback rules.
const (
	FallbackAverage = "average"
	FallbackAll     = "all"
)

// DefaultConfig is Falcon's threshold with lanes' default hysteresis and
// cycle damping.
func DefaultConfig(cpus []int) Config {
	return Config{CPUs: slices.Clone(cpus), Threshold: DefaultThreshold, Hysteresis: DefaultHysteresis, Damp: true}
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	if len(c.CPUs) == 0 {
		return fmt.Errorf("balancer: empty core set: list at least one core in CPUs")
	}
	seen := make(map[int]bool, len(c.CPUs))
	for _, cpu := range c.CPUs {
		if cpu < 0 {
			return fmt.Errorf("balancer: core %d is negative: list core numbers as the kernel counts them, from 0", cpu)
		}
		if seen[cpu] {
			return fmt.Errorf("balancer: core %d listed twice in CPUs: list each core once", cpu)
		}
		seen[cpu] = true
	}
	// The negated comparisons also reject NaN.
	if !(c.Threshold > 0 && c.Threshold <= 100) {
		return fmt.Errorf("balancer: threshold %g%% is outside (0,100]: use a percentage such as %d (Falcon's default)", c.Threshold, DefaultThreshold)
	}
	if !(c.Hysteresis >= 0 && c.Hysteresis < c.Threshold) {
		return fmt.Errorf("balancer: hysteresis %g is outside [0,threshold %g): use a smaller margin such as %d", c.Hysteresis, c.Threshold, DefaultHysteresis)
	}
	if c.Fallback != "" && c.Fallback != FallbackAverage && c.Fallback != FallbackAll {
		return fmt.Errorf("balancer: fallback rule %q: use %s or %s", c.Fallback, FallbackAverage, FallbackAll)
	}
	return nil
}

// Decision is where one (flow, stage) should run now.
type Decision struct {
	// Core is the core to steer to; -1 when Vanilla, so that a caller that
	// forgets to check Vanilla fails loudly instead of steering somewhere.
	Core int
	// Vanilla means the set has fallen back: do not steer, let the stage
	// run where the kernel would run it.
	Vanilla bool
	// Reason explains the decision for logs and `lanes status`, e.g.
	// "hashed", "rehashed: core 3 at 93%", "fallback: set average 85%".
	Reason string
}

// Stats are event counters, for metrics.
type Stats struct {
	Fallbacks uint64 // times the set switched to vanilla placement
	Resumes   uint64 // times it switched back
	Damped    uint64 // fallbacks not taken: a cycle of the set's own load (see Observe)
	Rehashes  uint64 // Place decisions that left the hashed core
	Moves     uint64 // table entries Assign changed
}

// Balancer holds the per-core moving averages of one core set. It is safe
// for concurrent use: a sampler may Observe while a controller places.
type Balancer struct {
	mu       sync.Mutex
	cfg      Config
	cpus     []int // sorted, so that ties resolve to the lowest core
	load     map[int]float64
	work     map[int]float64 // nil until ObserveWork: a bucket's share is then of load
	avoid    map[int]bool
	fallenBk bool
	stats    Stats

	// Cycle damping (see Observe): samples seen, the sample of the last
	// resume, the fallback figure at the last fallback, and the figure
	// the set must reach to fall back (0: the threshold).
	rounds    uint64
	resumedAt uint64
	resumed   bool
	fellAt    float64
	bar       float64
	// spreadArmed: resumed was set by Spreading, not by a resume, so the
	// damped bar starts from the threshold (a fallback long before says
	// nothing about this climb).
	spreadArmed bool
}

// New returns a Balancer whose loads all start at 0, as Falcon's do: until
// samples accumulate, the hash is trusted.
func New(c Config) (*Balancer, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c.CPUs = slices.Clone(c.CPUs)
	b := &Balancer{cfg: c, cpus: slices.Sorted(slices.Values(c.CPUs)), load: make(map[int]float64, len(c.CPUs))}
	for _, cpu := range b.cpus {
		b.load[cpu] = 0
	}
	b.setAvoid(c.Avoid)
	return b, nil
}

// Config returns the configuration in force.
func (b *Balancer) Config() Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.cfg
	c.CPUs = slices.Clone(c.CPUs)
	c.Avoid = slices.Clone(c.Avoid)
	return c
}

// SetAvoid replaces the tie-breaking avoid list, e.g. when the NIC's
// interrupt moves, without losing the load history.
func (b *Balancer) SetAvoid(cores []int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setAvoid(cores)
}

func (b *Balancer) setAvoid(cores []int) {
	b.cfg.Avoid = slices.Clone(cores)
	b.avoid = make(map[int]bool, len(cores))
	for _, c := range cores {
		b.avoid[c] = true
	}
}

// Observe feeds one sample: the busy percent of each core of the set over
// the last period. Cores missing from the sample keep their average (not
// measured this time: a core that just came online, a reading that raced
// with the core's own update); cores outside the set are ignored. Values
// are clamped to [0,100] so one bad reading cannot poison the average for
// long.
func (b *Balancer) Observe(sample map[int]float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fold(b.load, sample)
	b.rounds++
	fig := b.fallbackLoad()
	thr, resume := b.cfg.Threshold, b.cfg.Threshold-b.cfg.Hysteresis
	switch {
	case !b.fallenBk && fig >= b.fallbackBar():
		if b.cfg.Damp && b.resumed && b.rounds-b.resumedAt <= CycleRounds {
			// Back at the fallback level within CycleRounds of resuming:
			// what lifted the figure is the work the set itself spread
			// (vanilla placement took it off the other cores, resuming
			// put it back), not other load. Falling back again would
			// only repeat the cycle, each time running a saturated core
			// alone until the average decays. Stay spread; fall back
			// only if the figure climbs a margin past the last fallback's
			// (past the threshold when Spreading armed it), at maxBar at
			// most: with every core saturated the set falls back (a
			// moving average nears 100 without reaching it).
			base := max(thr, b.fellAt)
			if b.spreadArmed {
				base = thr
			}
			b.bar = min(base+b.cfg.Hysteresis, max(maxBar, thr))
			b.resumed, b.spreadArmed = false, false
			if fig < b.bar {
				b.stats.Damped++
				return
			}
		}
		b.fallenBk = true
		b.fellAt = fig
		b.stats.Fallbacks++
	case b.fallenBk && fig < resume:
		b.fallenBk = false
		b.resumed, b.resumedAt, b.spreadArmed = true, b.rounds, false
		b.stats.Resumes++
	case !b.fallenBk && b.bar != 0 && fig < resume && b.rounds-b.resumedAt > CycleRounds:
		// The set has calmed down (past the climb that follows a
		// resume): the next fallback is judged at the threshold again.
		b.bar, b.resumed = 0, false
	}
}

// Spreading tells the balancer that placement just went from vanilla to
// spread without a fallback: stages left the IRQ core because it passed
// the threshold while another core had room (Falcon's spread=busy). Like
// a resume, that puts the set's own receive work on the other cores, so
// a climb to the fallback level within CycleRounds is damped (see
// Observe) rather than taken once before damping learns it: on two cores
// a saturating stream falls back within a second of its stages leaving
// home otherwise.
func (b *Balancer) Spreading() {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Not while fallen back (only a resume spreads then), nor while a
	// damped bar is up (the set is already judged on its own work).
	if b.cfg.Damp && !b.fallenBk && b.bar == 0 {
		b.resumed, b.resumedAt, b.spreadArmed = true, b.rounds, true
	}
}

// ObserveWork feeds one sample of each core's movable work, in percent of
// the core: the receive processing one steering table's buckets on that
// core carry between them, and take along when they move. It is averaged as
// Observe's loads are. Once fed, a bucket's share (see AssignHome) is its
// part of this figure; before, it is its part of the core's whole load,
// which counts the core's applications and other stages as the bucket's
// and so overstates what a move takes away and adds elsewhere.
func (b *Balancer) ObserveWork(work map[int]float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.work == nil {
		b.work = make(map[int]float64, len(b.cpus))
	}
	b.fold(b.work, work)
}

// fold takes one sample into the moving averages avg of the set's cores,
// Falcon's (HistoryWeight*old + new) / (HistoryWeight+1); cores missing
// from the sample keep theirs.
func (b *Balancer) fold(avg, sample map[int]float64) {
	for _, cpu := range b.cpus {
		if v, ok := sample[cpu]; ok {
			avg[cpu] = (HistoryWeight*avg[cpu] + clampPct(v)) / (HistoryWeight + 1)
		}
	}
}

// Work is core's averaged movable work (ObserveWork), or its load when no
// work has been observed.
func (b *Balancer) Work(core int) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.workOf(core)
}

func (b *Balancer) workOf(core int) float64 {
	if b.work == nil {
		return b.load[core]
	}
	return min(b.work[core], b.load[core])
}

func clampPct(v float64) float64 {
	switch {
	case v > 100:
		return 100
	case !(v >= 0): // also NaN
		return 0
	}
	return v
}

// fallbackBar is the figure at or above which the set falls back: the
// threshold, or higher after a damped cycle.
func (b *Balancer) fallbackBar() float64 {
	if b.bar != 0 {
		return b.bar
	}
	return b.cfg.Threshold
}

// FallbackBar is the figure at or above which the set falls back now (the
// threshold, unless a cycle of the set's own load raised it; see Observe).
func (b *Balancer) FallbackBar() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fallbackBar()
}

// Load is core's moving average, in percent; 0 for a core outside the set.
func (b *Balancer) Load(core int) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.load[core]
}

// Loads returns the moving averages of the set's cores, in core order.
func (b *Balancer) Loads() []float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]float64, len(b.cpus))
	for i, cpu := range b.cpus {
		out[i] = b.load[cpu]
	}
	return out
}

// Average is the mean moving average over the set.
func (b *Balancer) Average() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.average()
}

// fallbackLoad is the figure the fallback rule compares with the
// threshold: the average, or with FallbackAll the least-loaded core's.
func (b *Balancer) fallbackLoad() float64 {
	if b.cfg.Fallback != FallbackAll {
		return b.average()
	}
	low := math.Inf(1)
	for _, cpu := range b.cpus {
		low = min(low, b.load[cpu])
	}
	return low
}

// FallbackLoad is the figure the fallback rule watches (see Config.Fallback).
func (b *Balancer) FallbackLoad() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fallbackLoad()
}

func (b *Balancer) average() float64 {
	var sum float64
	for _, cpu := range b.cpus {
		sum += b.load[cpu]
	}
	return sum / float64(len(b.cpus))
}

// FallenBack reports whether the set is in vanilla placement: entered when
// the set average (or, with FallbackAll, every core's load) reaches the
// threshold, left when it drops under threshold - hysteresis.
func (b *Balancer) FallenBack() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fallenBk
}

// Stats returns the event counters.
func (b *Balancer) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// Place decides where a (flow, stage) whose hash picked hashed runs now:
// nowhere in particular if the set has fallen back; hashed if its load is
// under the threshold; otherwise the least-loaded core under the threshold,
// or hashed if there is none (every core is busy but the average is not yet
// at the threshold: moving would only trade one hot core for another). A
// hashed core outside the set is kept: its load is not observed, so there
// is no evidence against it, and a table that points outside the set (e.g.
// at the IRQ core, for "stay where the kernel runs it") does so on purpose.
//
// Place judges one stage against the last sample's loads; it cannot know
// what other stages it has just moved. Table-wide rebalancing, which must
// not pile every moved stage on the same idle core, is Assign's job.
func (b *Balancer) Place(hashed int) Decision {
	b.mu.Lock()
	defer b.mu.Unlock()
	thr := b.cfg.Threshold
	if b.fallenBk {
		if b.cfg.Fallback == FallbackAll {
			return Decision{Core: -1, Vanilla: true, Reason: fmt.Sprintf("fallback: every core at %s or more", pct(b.fallbackLoad()))}
		}
		return Decision{Core: -1, Vanilla: true, Reason: fmt.Sprintf("fallback: set average %s", pct(b.average()))}
	}
	l, in := b.load[hashed]
	switch {
	case !in:
		return Decision{Core: hashed, Reason: fmt.Sprintf("hashed: core %d not in the set", hashed)}
	case l < thr:
		return Decision{Core: hashed, Reason: "hashed"}
	}
	best, ok := b.leastLoaded(b.load, thr, -1)
	if !ok {
		return Decision{Core: hashed, Reason: fmt.Sprintf("hashed: no core under %s", pct(thr))}
	}
	b.stats.Rehashes++
	return Decision{Core: best, Reason: fmt.Sprintf("rehashed: core %d at %s", hashed, pct(l))}
}

// Room reports whether a core of the set other than except would stay under
// limit (at most the threshold) with except's work (Work: one table's
// receive work there) added: somewhere a stage leaving except could go and
// still run. A set that is not fallen back can still have none: damping
// (see Observe) keeps a busy set spread, and a core whose own tasks (a
// sender, an application) keep it busy gains nothing from a stage it has
// no time for, while the stage pays the hop.
func (b *Balancer) Room(except int, limit float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.leastLoaded(b.load, min(limit, b.cfg.Threshold)-b.workOf(except), except)
	return ok
}

// leastLoaded returns the core of the set with the lowest load[] under
// limit, other than skip. Ties go to a core not in Avoid, then to the lowest
// core number. The measured load must be under limit too: a core that was
// hot at the last sample is not a target just because a projection says
// some of its buckets are leaving.
func (b *Balancer) leastLoaded(load map[int]float64, limit float64, skip int) (int, bool) {
	best, found := -1, false
	for _, cpu := range b.cpus { // ascending, so a strict < keeps the lowest
		l := load[cpu]
		if cpu == skip || !(l < limit) || !(b.load[cpu] < limit) {
			continue
		}
		if !found || l < load[best] || (l == load[best] && b.avoid[best] && !b.avoid[cpu]) {
			best, found = cpu, true
		}
	}
	return best, found
}

// under: core is in the set and under limit, measured and projected.
func (b *Balancer) under(core int, proj map[int]float64, limit float64) bool {
	l, in := b.load[core]
	return in && l < limit && proj[core] < limit
}

// Assign rebalances a steering table of buckets (one table per stage).
// hashed[i] is bucket i's static Falcon core, current[i] the core the table
// holds now (nil: the hashed table), active[i] whether the bucket carried
// traffic recently. It returns the table to write and how many entries
// differ from current. The three slices must have the same length
// (current may be nil); anything else is a programming error and panics.
//
// Only active buckets bear load. Per-bucket load is not measured, so a
// core's movable work (ObserveWork; its load until that is fed) is split
// evenly among the active buckets on it, and that share travels with a
// bucket when it moves: successive moves in one call then see each other and
// spread out instead of all landing on the one idlest core.
// Rules, in order:
//
//  1. Return: a bucket away from its hashed core goes back once that core's
//     load plus the bucket's share is under threshold - hysteresis. Counting
//     the share keeps a bucket from returning to a core it would push back
//     over the threshold, to be moved away again at the next sample. An
//     inactive bucket has no share and no packets in flight, so it returns
//     as soon as its hashed core has cooled down.
//  2. Relieve: a core measured at or over the threshold sheds its active
//     buckets, in index order, each to the least-loaded core that stays
//     under the threshold with the bucket's share added (measured and
//     projected), until its projected load is under. If no core has that
//     room, they stay: a core kept busy by its own tasks gains nothing from
//     a stage it has no time for, and the stage pays the hop. Cores that only the moves of this call
//     pushed over are left for the next sample to judge: relieving them now
//     would shuffle buckets on a guess.
//  3. Everything else stays. In particular a bucket already moved away stays
//     where it is while that core is under the threshold, and an inactive
//     bucket is never moved away from its hashed core: moving traffic that
//     is not there relieves nothing.
//
// Cores outside the set have no observed load, so none is relieved, none is
// a target, and a bucket whose hashed core is outside the set is not
// returned there; a bucket on such a core still returns to a hashed core in
// the set by rule 1. While the set is fallen back the table does not matter
// (steering is off), so Assign returns current unchanged: the placement is
// then intact when the set resumes.
//
// A single bucket that saturates any core it lands on still moves between
// cores, at most once per several samples because the moving averages must
// first cross the threshold; no placement can help such a flow.
func (b *Balancer) Assign(hashed []int, current []int, active []bool) (next []int, moves int) {
	return b.AssignHome(hashed, nil, current, active)
}

// AssignHome is Assign for a table whose buckets rest somewhere other than
// their hashed core: home[i] is where bucket i runs while its core is not
// overloaded (lanes' "spread when busy": the core the kernel runs the stage
// on), hashed[i] where Falcon's hash sends it once that core is. The rules
// become:
//
//  1. Return: a bucket away from home goes back once home's load plus the
//     bucket's share is under threshold - hysteresis.
//  2. Relieve: a core at or over the threshold sheds its active buckets,
//     each to its hashed core if that is another core of the set with room
//     for the bucket's share under the threshold (measured and projected),
//     else to the least-loaded core with that room: Falcon's dispatch to
//     the hashed core under the threshold, with the least-loaded core
//     instead of a blind rehash, and counting what the move adds.
//  3. Everything else stays.
//
// A nil home is hashed, which is Assign.
func (b *Balancer) AssignHome(hashed, home, current []int, active []bool) (next []int, moves int) {
	if home == nil {
		home = hashed
	}
	if current == nil {
		current = home
	}
	if len(current) != len(hashed) || len(active) != len(hashed) || len(home) != len(hashed) {
		panic(fmt.Sprintf("balancer.Assign: %d hashed, %d home, %d current, %d active buckets", len(hashed), len(home), len(current), len(active)))
	}
	preferHashed := !slices.Equal(home, hashed)
	b.mu.Lock()
	defer b.mu.Unlock()
	next = slices.Clone(current)
	if b.fallenBk {
		return next, 0
	}
	thr, resume := b.cfg.Threshold, b.cfg.Threshold-b.cfg.Hysteresis

	proj := make(map[int]float64, len(b.cpus))
	for _, cpu := range b.cpus {
		proj[cpu] = b.load[cpu]
	}
	nActive := make(map[int]int, len(b.cpus))
	for i, c := range current {
		if active[i] {
			nActive[c]++
		}
	}
	share := func(i int) float64 {
		c := current[i]
		if !active[i] || nActive[c] == 0 {
			return 0
		}
		return b.workOf(c) / float64(nActive[c])
	}
	move := func(i, to int) {
		s := share(i)
		if _, in := proj[next[i]]; in {
			proj[next[i]] -= s
		}
		proj[to] += s
		next[i] = to
	}

	// 1. Return, before relieving, so that relief sees the returned load.
	for i, h := range home {
		if next[i] == h {
			continue
		}
		if l, in := proj[h]; in && l+share(i) < resume {
			move(i, h)
		}
	}
	// 2. Relieve overloaded cores.
	for i, c := range next {
		measured, in := b.load[c]
		if !active[i] || !in || measured < thr || proj[c] < thr {
			continue
		}
		// The destination must stay under the threshold with the
		// bucket's share added, not just be under it now.
		room := thr - share(i)
		if h := hashed[i]; preferHashed && h != c && b.under(h, proj, room) {
			move(i, h)
			continue
		}
		if to, ok := b.leastLoaded(proj, room, c); ok {
			move(i, to)
		}
	}

	for i := range next {
		if next[i] != current[i] {
			moves++
		}
	}
	b.stats.Moves += uint64(moves)
	return next, moves
}

// pct formats a percentage for Reason strings.
func pct(v float64) string { return fmt.Sprintf("%.0f%%", v) }
