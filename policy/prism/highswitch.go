package prism

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/datapath/steer"
)

// high=auto's switch. Where a high-priority frame should run its first
// stage depends on the marked traffic, as measured under background on
// the 2-core testbed:
//
//   - A light marked flow (PRISM's ping-pong, 1000 messages/s) waits for
//     the core; the class's real-time queue takes it at the bulk kthread's
//     batch boundary. In the NIC poll instead its p99 is worse, most of
//     all under the heaviest background.
//   - A busy marked service (memcached, nginx: thousands of requests/s on
//     the receive core) pays the queue's kthread hop on every request: a
//     scheduler trace showed memcached's worker waiting behind that
//     real-time kthread as often as behind bulk work. In the NIC poll
//     memcached and nginx get most of the rate they lose in the queue
//     back.
//
// So the agent counts each rule's frames (steer_xdp's steer_high_frames)
// and runs the flows a rule marks in the NIC poll while they are busy, in
// their queue while they are light. Rule by rule, as PRISM marks services:
// a light ping-pong keeps its real-time queue while a busy marked cache
// beside it runs inline. The datapath moves each flow between the two as
// soon as none of its frames is left on the old path
// (steer.Prio.SetHighInline), so a switch never reorders a flow. The
// switches are runtime state of the datapath, not host knobs: they go
// with the datapath at reset, a stopped agent puts every rule's flows
// back in their queue (the plan's state), and each carries a deadline the
// agent renews at every sample, so those of an agent killed lapse.

// HighRule is when high=auto switches a rule's flows.
type HighRule struct {
	// Inline: the rule's flows carried at least InlineAt frames/s for
	// InlineAfter samples in a row.
	InlineAt    float64
	InlineAfter int
	// Queue: they carried less than QueueBelow frames/s for QueueAfter
	// samples in a row.
	QueueBelow float64
	QueueAfter int
}

// highRule is high=auto's rule for a threshold of pps, on the guard's
// 100 ms samples: 0.3 s busy to go inline, 1 s under half of it to go back
// (hysteresis, so a rate near the threshold does not flap).
func highRule(pps int) HighRule {
	return HighRule{InlineAt: float64(pps), InlineAfter: 3, QueueBelow: float64(pps) / 2, QueueAfter: 10}
}

// Stepping aside (aside-below, aside-depth). On vanilla's path a marked
// frame waits behind the frames its NIC poll finds ahead of it; the
// queues take that wait away, and charge every marked frame a kthread hop
// and every bulk frame a redirect and a second skb build. Where the
// NIC's polls find about one frame each there is no wait to take, and the
// charge is all the marked flow sees. So while the underlay NIC's polls
// on the receive core find fewer than the applied config's AsideDepth
// frames each, on average (the guard's load samples count them where
// tracing works), or, where they cannot be counted, while the core's
// receive work (softirq and receive kthreads) stays under its AsideBelow
// percent, for AsideAfter samples, the switch stands PRISM aside (steer.Prio.SetAside): steer_xdp runs
// both classes' first stage in the NIC poll, vanilla's path, and once
// nothing is queued on the receive core passes every frame at once,
// unclassified (its aside pass; the rules' rates hold meanwhile), and
// PRISM-sync's marked frames leave the shortcut for it too (they return after an idle gap with none in
// flight, as any move onto it). BackAfter samples at or above the threshold, or
// that could not be taken, put the plan's placement back. Each move is
// the datapath's fast move, in order. One threshold: the queues' hop
// makes the same traffic cost the core more with PRISM on than aside, so
// a load under the threshold with PRISM on is under it aside too (the
// NIC poll waits for the queues' batches, so its polls find more frames,
// not fewer), and the hop's own cost cannot make the switch flap; a load whose samples
// straddle the threshold can, at most once per AsideAfter + BackAfter
// samples. The deadline the switch renews at every sample
// (asideTTL) ends stepping aside when the switch stops renewing it: the
// plan's placement is what it falls back to. The threshold and the core
// are the applied config's (steer.Config.AsideBelow, AsideDepth,
// InlineCPU), followed at every sample like high=auto's threshold.

// AsideRule is when the switch steps aside and back.
type AsideRule struct {
	Below      float64 // receive work, percent of the receive core
	Depth      float64 // frames per NIC poll (0: receive work alone)
	AsideAfter int     // samples in a row under Below to step aside
	BackAfter  int     // samples in a row at or above Below (or failed) to come back
	// In the queues the NIC's polls find more frames than vanilla's at
	// the same load (they wait out the kthreads' batches, which run with
	// bottom halves off): a load whose polls find under Depth aside can
	// find over it queued, and stay queued after a burst brought the
	// queues back. So when ProbeAfter samples in a row in the queues,
	// every one with its polls counted, found under ProbeBelow frames on
	// average, the switch steps aside to read the depth vanilla's path
	// has: BackAfter samples at or over Depth bring the queues back, as
	// any time aside (0: never). Where vanilla's polls find about Depth
	// and the queued ones under twice it, every probe hands the marked
	// flow vanilla's wait for BackAfter samples or more; so a probe whose
	// queues come back within AsideAfter samples aside on samples with
	// the polls counted at Depth or over doubles the samples before the
	// next, up to ProbeMax (at or under ProbeAfter: no doubling). A probe
	// that stays aside longer, or stepping aside by the rule, starts
	// again from ProbeAfter.
	ProbeBelow float64
	ProbeAfter int
	ProbeMax   int
}

// asideRule is the rule for aside-below on the guard's samples: 1 s
// quiet to step aside, 0.2 s busy to come back, a probe after 10 s in
// the queues under twice the depth (at 100 ms), after 80 s at most
// once probes keep finding vanilla's polls at the depth (docs/prism.md,
// stepping aside).
func asideRule(below, depth float64) AsideRule {
	return AsideRule{Below: below, Depth: depth, AsideAfter: 10, BackAfter: 2, ProbeBelow: 2 * depth, ProbeAfter: 100, ProbeMax: 800}
}

// asideFor and asideBack say asideRule's times at the default interval,
// for help and plan notes.
var (
	asideFor  = (time.Duration(asideRule(0, 0).AsideAfter) * DefaultGuardRule.Interval).String()
	asideBack = (time.Duration(asideRule(0, 0).BackAfter) * DefaultGuardRule.Interval).String()
)

// asideState is the decision: on is stepped aside; band counts the
// samples in a row in the queues with their polls counted, bandSum adds
// up their depths; probeAfter is the band that probes now (0: the rule's
// ProbeAfter); probing is 1 + the samples aside since a probe stepped
// aside (0: no probe aside).
type asideState struct {
	latch
	band       int
	bandSum    float64
	probeAfter int
	probing    int
}

// asideSample is one load sample of the receive core as stepping aside
// reads it: its receive work (percent) and, where the NIC's polls were
// counted (polled), the frames they found per poll; ok: the sample was
// taken.
type asideSample struct {
	rx, depth float64
	polled    bool
	ok        bool
}

// quiet: the sample says PRISM's queues have nothing to take away, by
// the NIC's poll depth where it was counted and the rule has a depth,
// by the receive work otherwise.
func (r AsideRule) quiet(s asideSample) bool {
	if !s.ok {
		return false
	}
	if r.Depth > 0 && s.polled {
		return s.depth < r.Depth
	}
	return s.rx < r.Below
}

// step takes one sample and says whether the decision changed, and
// whether it stepped aside to probe vanilla's depth.
func (s *asideState) step(r AsideRule, smp asideSample) (changed, probe bool) {
	quiet := r.quiet(smp)
	switch {
	case s.on || r.ProbeAfter <= 0 || r.Depth <= 0 || !smp.ok || !smp.polled:
		s.band, s.bandSum = 0, 0
	default:
		s.band++
		s.bandSum += smp.depth
		if s.band >= s.nextProbe(r) {
			probe := s.bandSum/float64(s.band) < r.ProbeBelow && !quiet
			s.band, s.bandSum = 0, 0
			if probe {
				s.on, s.over, s.under = true, 0, 0
				s.probing = 1
				return true, true
			}
		}
	}
	changed = s.latch.step(quiet, r.AsideAfter, !quiet, r.BackAfter)
	switch {
	case s.probing > 0 && !s.on:
		s.probing = 0
		if smp.ok && smp.polled && r.Depth > 0 {
			// Vanilla's polls found the depth: the queues are where
			// they belong at this load, so look again later. (Back on
			// failed or uncounted samples, the probe read nothing.)
			s.probeAfter = min(2*s.nextProbe(r), max(r.ProbeMax, r.ProbeAfter))
		}
	case s.probing > 0:
		if s.probing++; s.probing > r.AsideAfter {
			s.probing, s.probeAfter = 0, 0 // a probe that found the load light
		}
	case changed && s.on:
		s.probeAfter = 0 // aside by the rule: the load changed
	}
	return changed, false
}

// nextProbe is how long in the queues, in samples, the next probe waits
// for (0: probes are off): the one place the current wait is read.
func (s *asideState) nextProbe(r AsideRule) int {
	if r.ProbeAfter <= 0 || r.Depth <= 0 {
		return 0
	}
	return max(s.probeAfter, r.ProbeAfter)
}

// highState is one rule's decision: on is inline.
type highState struct{ latch }

// step takes one sample of the rule's rate (frames/s) and says whether
// the decision changed.
func (s *highState) step(r HighRule, rate float64) bool {
	return s.latch.step(rate >= r.InlineAt, r.InlineAfter, rate < r.QueueBelow, r.QueueAfter)
}

// inline: the rule's flows run in the NIC poll now.
func (s *highState) inline() bool { return s.on }

// highDatapath is what the switch needs of the datapath (the Prio facet
// of a reopened steer.Datapath, closed with it: openedPrio; or a test's
// fake).
type highDatapath interface {
	Rules() ([]steer.Rule, error)
	HighRuleFrames() (map[steer.Rule]uint64, error)
	HighAuto() (pps uint32, inline []steer.Rule, err error)
	SetHighInline(r steer.Rule, until time.Duration) error
	SetAside(until time.Duration) error
	AsideConfig() (below uint32, core int)
	AsideDepth() uint32
	ForgetHigh(r steer.Rule) error
	BulkQuietNow() (bool, error)
	Close() error
}

// ruleSwitch is one rule's part of the switch.
type ruleSwitch struct {
	state   highState
	applied bool      // what the datapath was last set to (inline)
	frames  uint64    // the count at the last sample
	at      time.Time // when it was read
	rate    float64   // frames/s over the last sample
}

// highSwitch is high=auto's runtime part, stepped by the guard's loop. It
// holds the pinned datapath open between samples and opens it again when
// its pins change (stamp: a stat a pin, where reopening is an object get,
// an info query and a close a map, ten times a second on a normal-policy
// thread that the woken tasks of its core wait behind) or a sample fails.
// Its threshold is the applied config's (steer.Config.HighAutoPPS), read
// at every sample: a re-apply with another threshold is followed, and
// one without high=auto (0) stands the switch down.
type highSwitch struct {
	dir   string
	open  func(dir string) (highDatapath, error)
	stamp func(dir string) (string, error) // steer.HighAutoStamp
	mono  func() time.Duration             // the datapath's clock (steer.Now)
	// held is the datapath open since the sample that read heldStamp.
	held      highDatapath
	heldStamp string

	rule      HighRule
	off       bool // the applied config is not high=auto
	bulkQuiet bool // every flow in the NIC poll for want of bulk (bulk-quiet)
	rules     map[steer.Rule]*ruleSwitch
	switches  uint64
	err       string // the last sample's error, cleared by the next good one

	// Stepping aside: the decision, the applied config's thresholds
	// (below, 0: off; depth, hundredths of a frame per poll) and core, the
	// load sample the guard handed over for the next sample (loaded: one
	// came; load nil: it failed), the receive work and NIC poll depth it
	// read (rx, depth; -1: none), and whether the datapath holds a
	// deadline the last write set (asideSet).
	aside    asideState
	below    uint32
	depth    uint32
	core     int
	loaded   bool
	load     *cpuload.Sample
	rx       float64
	fpp      float64
	asides   uint64
	probes   uint64
	asideSet bool
	// asideSince: the sample (its wall clock) at which asideSet, what the
	// status calls On, last changed.
	asideSince time.Time
	// doze: the guard samples this seldom while aside (guard.doze; 0:
	// every Interval), which the deadline's writes cover (ttl).
	doze time.Duration
}

// takeLoad hands the switch a load sample (ok: taken) for its next
// sample.
func (h *highSwitch) takeLoad(s cpuload.Sample, ok bool) {
	h.loaded, h.load = true, nil
	if ok {
		h.load = &s
	}
}

// asideRule is the rule for the applied config's thresholds.
func (h *highSwitch) asideRule() AsideRule {
	return asideRule(float64(h.below), float64(h.depth)/100)
}

// wantsLoad: the applied config steps aside, so the switch needs the
// guard's load samples.
func (h *highSwitch) wantsLoad() bool { return h.below != 0 }

// wantsDepth: the applied config steps aside by the NIC's poll depth, so
// the guard's sampler should count the NIC's polls.
func (h *highSwitch) wantsDepth() bool { return h.below != 0 && h.depth != 0 }

// stepAside follows the applied config's threshold and core and steps
// the decision with the load handed over since the last sample; it says
// what changed (for the log).
func (h *highSwitch) stepAside(below, depth uint32, core int) string {
	if below == 0 {
		was := h.below != 0
		h.below, h.depth, h.aside, h.rx, h.fpp, h.loaded, h.load = 0, 0, asideState{}, -1, -1, false, nil
		if was {
			return "high=auto: the applied plan does not step aside (aside-below=0): PRISM's queues"
		}
		return ""
	}
	if h.below == 0 {
		h.rx, h.fpp = -1, -1
	}
	if depth != h.depth || core != h.core {
		// The probes' wait was learned against the old threshold.
		h.aside.probeAfter = 0
	}
	h.below, h.depth, h.core = below, depth, core
	if !h.loaded {
		return ""
	}
	h.loaded = false
	smp := asideSample{rx: -1, depth: -1}
	r := h.asideRule()
	if h.load != nil {
		if c, found := h.load.Core(core); found {
			if h.load.NICWatched {
				smp.depth, smp.polled = c.NIC.FramesPerPoll(), true
			}
			// A sample without the scheduler accounting (the guard
			// turns it off while the depth keeps PRISM aside) has no
			// receive work: it decides only by the depth.
			smp.ok = !h.load.NICOnly || (smp.polled && r.Depth > 0)
			if !h.load.NICOnly {
				smp.rx = c.Rx
			}
		}
	}
	h.load, h.rx, h.fpp = nil, smp.rx, smp.depth
	band := time.Duration(h.aside.nextProbe(r)) * guardRule.Interval
	wasProbing := h.aside.probing > 0
	changed, probe := h.aside.step(r, smp)
	if !changed {
		return ""
	}
	next := ""
	if wasProbing && !h.aside.on {
		next = fmt.Sprintf("; the next probe after %v in the queues", time.Duration(h.aside.nextProbe(r))*guardRule.Interval)
	}
	byDepth := r.Depth > 0 && smp.polled
	switch {
	case probe:
		h.asides++
		h.probes++
		return fmt.Sprintf("high=auto: the NIC's polls on core %d found under %.2f frames each in PRISM's queues over %v (%.2f now), where the queues' own batches can hold the depth over %.2f: PRISM steps aside to read vanilla's depth", core, r.ProbeBelow, band, smp.depth, r.Depth)
	case h.aside.on && byDepth:
		h.asides++
		return fmt.Sprintf("high=auto: the NIC's polls on core %d found under %.2f frames each for %v (%.2f now): PRISM steps aside, both classes in the NIC poll as vanilla runs them", core, r.Depth, time.Duration(r.AsideAfter)*guardRule.Interval, smp.depth)
	case h.aside.on:
		h.asides++
		return fmt.Sprintf("high=auto: receive work on core %d under %d%% of it for %v (%.0f%% now): PRISM steps aside, both classes in the NIC poll as vanilla runs them", core, below, time.Duration(r.AsideAfter)*guardRule.Interval, smp.rx)
	case smp.ok && byDepth:
		return fmt.Sprintf("high=auto: the NIC's polls on core %d find %.2f frames each (from %.2f): PRISM's queues again%s", core, smp.depth, r.Depth, next)
	case smp.ok:
		return fmt.Sprintf("high=auto: receive work on core %d at %.0f%% (from %d%%): PRISM's queues again", core, smp.rx, below)
	default:
		return fmt.Sprintf("high=auto: the load of core %d could not be sampled: PRISM's queues again until it can", core)
	}
}

// asideTTL is how long a write of a deadline (the aside deadline, a
// rule's switch into the NIC poll) holds: the switch renews them at every
// sample, so an agent that dies or hangs leaves the plan's placement back
// within it. While the guard dozes, a write holds three of its samples
// (ttl).
const asideTTL = time.Second

func (h *highSwitch) ttl() time.Duration { return max(asideTTL, 3*h.doze) }

// setDoze says how seldom the guard samples from now on (0: every
// Interval); standing aside, the deadlines are written again to cover it,
// or the guard's next sample would find them lapsed. An error leaves the
// switch as it was.
func (h *highSwitch) setDoze(d time.Duration) error {
	was := h.doze
	h.doze = d
	if d == 0 || !h.standsAside() || h.held == nil {
		return nil
	}
	until := h.mono() + h.ttl()
	errs := []error{h.held.SetAside(until)}
	for r, rs := range h.rules {
		if rs.applied {
			errs = append(errs, h.held.SetHighInline(r, until))
		}
	}
	if err := errors.Join(errs...); err != nil {
		h.doze = was
		return err
	}
	return nil
}

func newHighSwitch(dir string) *highSwitch {
	return &highSwitch{dir: dir, mono: steer.Now, stamp: steer.HighAutoStamp, open: func(dir string) (highDatapath, error) {
		dp, err := steer.OpenHighAuto(dir)
		if err != nil {
			return nil, err
		}
		return openedPrio{dp.Prio(), dp}, nil
	}}
}

// openedPrio is a reopened datapath's Prio facet, closed with the datapath.
type openedPrio struct {
	steer.Prio
	io.Closer
}

// sample reads the rules' counts at now, steps their decisions and makes
// the datapath follow them. It says what changed (for the log); an error
// is kept for the status until the next good sample. A rule's switch is
// set whenever it differs from its decision.
func (h *highSwitch) sample(now time.Time) string {
	msg, err := h.try(now)
	h.err = ""
	if err != nil {
		h.err = "high=auto: " + err.Error()
	}
	return msg
}

// datapath is the datapath pinned now: the one held, unless its pins
// changed since.
func (h *highSwitch) datapath() (highDatapath, error) {
	st, err := h.stamp(h.dir)
	if err != nil {
		h.release()
		return nil, err
	}
	if h.held != nil && st == h.heldStamp {
		return h.held, nil
	}
	h.release()
	dp, err := h.open(h.dir)
	if err != nil {
		return nil, err
	}
	h.held, h.heldStamp = dp, st
	return dp, nil
}

// standsAside: the datapath holds the aside deadline the last sample
// wrote (a write that failed leaves the plan's placement).
func (h *highSwitch) standsAside() bool { return h.aside.on && h.asideSet }

// asideByDepth: PRISM stands aside and the last sample decided by the
// NIC's poll depth, which is all that coming back needs.
func (h *highSwitch) asideByDepth() bool { return h.standsAside() && h.depth != 0 && h.fpp >= 0 }

// release closes the datapath held, if any.
func (h *highSwitch) release() {
	if h.held != nil {
		h.held.Close()
		h.held, h.heldStamp = nil, ""
	}
}

func (h *highSwitch) try(now time.Time) (msg string, err error) {
	// Not renewed this sample unless the write below says so: the
	// deadline lapses, and the status must not claim it.
	set := h.asideSet
	h.asideSet = false
	defer func() {
		if h.asideSet != set {
			h.asideSince = now
		}
	}()
	// Stood aside at the last sample (written or not: an earlier deadline
	// may hold): the rules' frames may have gone uncounted since.
	uncounted := set || h.aside.on
	dp, err := h.datapath()
	if err != nil {
		return "", err
	}
	// A sample that failed opens the datapath afresh next time.
	defer func() {
		if err != nil {
			h.release()
		}
	}()
	pps, cur, err := dp.HighAuto()
	if err != nil {
		return "", err
	}
	if pps == 0 {
		// Applied without high=auto (a re-apply, or the default's
		// fallback): nothing to switch; the programs ignore the switches
		// and the aside deadline.
		was := !h.off
		h.off, h.rules, h.bulkQuiet = true, nil, false
		h.stepAside(0, 0, 0)
		h.asideSet = false
		if was {
			return "high=auto: the applied plan is not high=auto: the switch stands down", nil
		}
		return "", nil
	}
	h.off, h.rule = false, highRule(int(pps))
	// Status only: an error here must not keep the rules from their
	// sample.
	bq, bqErr := dp.BulkQuietNow()
	h.bulkQuiet = bq && bqErr == nil
	rules, err := dp.Rules()
	if err != nil {
		return "", err
	}
	frames, err := dp.HighRuleFrames()
	if err != nil {
		return "", err
	}
	live := map[steer.Rule]bool{}
	for _, r := range rules {
		live[r] = true
	}
	// What a deleted rule left (lanes prio del drops it too; this covers
	// a delete by an older build or one that failed half way). An error
	// on one rule does not keep the others from their sample.
	errs := []error{bqErr}
	for r := range h.rules {
		if !live[r] {
			delete(h.rules, r)
		}
	}
	for _, r := range append(slices.Collect(maps.Keys(frames)), cur...) {
		if !live[r] {
			errs = append(errs, dp.ForgetHigh(r))
		}
	}
	if h.rules == nil {
		h.rules = map[steer.Rule]*ruleSwitch{}
	}
	var msgs []string
	below, core := dp.AsideConfig()
	if msg := h.stepAside(below, dp.AsideDepth(), core); msg != "" {
		msgs = append(msgs, msg)
	}
	if h.below != 0 || set {
		// Written at every sample: aside, the renewal of its deadline.
		var until time.Duration
		if h.aside.on {
			until = h.mono() + h.ttl()
		}
		err := dp.SetAside(until)
		errs = append(errs, err)
		h.asideSet = err == nil && until != 0
	}
	for _, r := range rules {
		rs := h.rules[r]
		if rs == nil {
			rs = &ruleSwitch{}
			h.rules[r] = rs
		}
		n := frames[r]
		if n < rs.frames {
			// The count went back: a re-apply pinned a new datapath, or
			// the rule was deleted and added again; its flows start in
			// their queue, and so does the decision.
			*rs = ruleSwitch{}
		}
		// Stood aside since the last sample, the datapath may have
		// passed the rule's frames uncounted (its aside pass): no rate
		// over that time, and the rule's decision holds across it.
		if !rs.at.IsZero() && now.After(rs.at) && !uncounted {
			rs.rate = float64(n-rs.frames) / now.Sub(rs.at).Seconds()
			rs.state.step(h.rule, rs.rate)
		}
		rs.frames, rs.at = n, now
		want := rs.state.inline()
		// Written at every sample while inline: the renewal of its
		// deadline.
		if want || slices.Contains(cur, r) {
			var until time.Duration
			if want {
				until = h.mono() + h.ttl()
			}
			if err := dp.SetHighInline(r, until); err != nil {
				errs = append(errs, err)
				continue // tried again at the next sample
			}
		}
		// Logged and counted once the datapath has it: a write that
		// failed is reported by the sample that makes it.
		if rs.applied == want {
			continue
		}
		rs.applied = want
		h.switches++
		if want {
			msgs = append(msgs, fmt.Sprintf("high=auto: %s busy (%.0f frames/s, at least %.0f): its flows run in the NIC poll", r, rs.rate, h.rule.InlineAt))
		} else {
			msgs = append(msgs, fmt.Sprintf("high=auto: %s light (%.0f frames/s, under %.0f): its flows take their queue", r, rs.rate, h.rule.QueueBelow))
		}
	}
	return strings.Join(msgs, "\n"), errors.Join(errs...)
}

// stop puts every rule's flows back in their queue, the plan's state.
func (h *highSwitch) stop() error {
	h.rules = nil
	h.release()
	dp, err := h.open(h.dir)
	if err != nil {
		return nil // nothing pinned: nothing to put back
	}
	defer dp.Close()
	_, cur, err := dp.HighAuto()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range cur {
		errs = append(errs, dp.SetHighInline(r, 0))
	}
	if below, _ := dp.AsideConfig(); below != 0 || h.asideSet {
		errs = append(errs, dp.SetAside(0))
	}
	h.asideSet, h.aside = false, asideState{}
	return errors.Join(errs...)
}

// HighStatus is what `lanes status` shows of high=auto.
type HighStatus struct {
	Rules    []HighRuleStatus `json:"rules,omitempty"`
	InlineAt float64          `json:"inline_at"`
	Switches uint64           `json:"switches"`
	// BulkQuiet: no bulk frame came for the bulk quiet time, so every
	// rule's flows run in the NIC poll whatever their switch.
	BulkQuiet bool `json:"bulk_quiet,omitempty"`
	// Off: the applied config is not high=auto (a re-apply without it, or
	// the default's fallback to the queue).
	Off bool   `json:"off,omitempty"`
	Err string `json:"error,omitempty"`
	// Aside is stepping aside's state, where the applied config has it.
	Aside *AsideStatus `json:"aside,omitempty"`
}

// AsideStatus is stepping aside's state: On while the datapath holds the
// switch's deadline; Below and Depth the applied thresholds (Depth in
// frames per NIC poll, 0: receive work alone) and Core the receive core;
// RxPercent its receive work and FramesPerPoll its NIC's poll depth in
// the last load sample (-1: none); Asides how often it stepped aside,
// Probes how many of those were to read vanilla's depth.
type AsideStatus struct {
	On            bool    `json:"on"`
	Below         uint32  `json:"below"`
	Depth         float64 `json:"depth,omitempty"`
	Core          int     `json:"core"`
	RxPercent     float64 `json:"rx_percent"`
	FramesPerPoll float64 `json:"frames_per_poll"`
	Asides        uint64  `json:"asides"`
	// Probes: how many of the asides were probes (AsideRule.ProbeAfter);
	// NextProbe: how long in the queues the next one waits for (during a
	// probe, the wait before it: doubled if it comes back).
	Probes    uint64        `json:"probes,omitempty"`
	NextProbe time.Duration `json:"next_probe,omitempty"`
	// Doze: lanes agent samples this seldom while it stands aside, until
	// the kernel wakes it (GuardRule.Doze); 0: at its interval.
	Doze time.Duration `json:"doze,omitempty"`
	// Since: the sample at which On last changed (zero: never), so that a
	// report read later says what held at an earlier moment.
	Since time.Time `json:"since,omitzero"`
}

// dozeNote says how seldom the agent samples ("" while it does not doze).
func (a AsideStatus) dozeNote() string {
	if a.Doze == 0 {
		return ""
	}
	return fmt.Sprintf("; the agent samples every %v until the NIC's polls deepen", a.Doze)
}

// probeNote says how many asides were probes ("" for none).
func (a AsideStatus) probeNote() string {
	if a.Probes == 0 {
		return ""
	}
	return fmt.Sprintf(", %d to read vanilla's depth, the next after %v in the queues", a.Probes, a.NextProbe)
}

// byDepth: the last sample decided by the NIC's poll depth.
func (a AsideStatus) byDepth() bool { return a.Depth > 0 && a.FramesPerPoll >= 0 }

// HighRuleStatus is one rule's state.
type HighRuleStatus struct {
	Rule   string  `json:"rule"`
	Inline bool    `json:"inline"`
	Rate   float64 `json:"frames_per_second"`
}

func (h *highSwitch) status() *HighStatus {
	s := &HighStatus{InlineAt: h.rule.InlineAt, Switches: h.switches, BulkQuiet: h.bulkQuiet, Off: h.off, Err: h.err}
	if h.below != 0 {
		next := h.aside.nextProbe(h.asideRule())
		s.Aside = &AsideStatus{On: h.asideSet, Below: h.below, Depth: float64(h.depth) / 100, Core: h.core, RxPercent: h.rx, FramesPerPoll: h.fpp, Asides: h.asides, Probes: h.probes, NextProbe: time.Duration(next) * guardRule.Interval, Doze: h.doze, Since: h.asideSince}
	}
	for r, rs := range h.rules {
		s.Rules = append(s.Rules, HighRuleStatus{Rule: r.String(), Inline: rs.applied, Rate: rs.rate})
	}
	slices.SortFunc(s.Rules, func(a, b HighRuleStatus) int { return cmp.Compare(a.Rule, b.Rule) })
	return s
}

// Summary is the status line: the rules whose flows run in the NIC poll
// first, then those in their queue, at most four named.
func (s HighStatus) Summary() string {
	if s.Err != "" {
		return s.Err
	}
	if s.Off {
		return "high=auto: off (the applied plan keeps the high-priority flows in their queue)"
	}
	var in, queued []string
	for _, r := range s.Rules {
		d := fmt.Sprintf("%s at %.0f frames/s", r.Rule, r.Rate)
		if r.Inline {
			in = append(in, d)
		} else {
			queued = append(queued, d)
		}
	}
	named := 0
	list := func(ds []string) string {
		var out []string
		for _, d := range ds {
			if named == 4 {
				out = append(out, fmt.Sprintf("%d more", len(ds)-len(out)))
				break
			}
			named++
			out = append(out, d)
		}
		return strings.Join(out, ", ")
	}
	head := fmt.Sprintf("high=auto (inline from %.0f frames/s a rule; %d switches): ", s.InlineAt, s.Switches)
	aside := s.Aside != nil && s.Aside.On
	if a := s.Aside; a != nil {
		rx := "not sampled"
		if a.RxPercent >= 0 {
			rx = fmt.Sprintf("%.0f%%", a.RxPercent)
		}
		switch {
		case a.On && a.byDepth():
			head += fmt.Sprintf("stepped aside (the NIC's polls on core %d find %.2f frames each, under %.2f; receive work %s; asides %d%s%s): every flow in the NIC poll as vanilla runs it; by their switches: ", a.Core, a.FramesPerPoll, a.Depth, rx, a.Asides, a.probeNote(), a.dozeNote())
		case a.byDepth():
			head += fmt.Sprintf("the NIC's polls on core %d find %.2f frames each (steps aside under %.2f; receive work %s; asides %d%s); ", a.Core, a.FramesPerPoll, a.Depth, rx, a.Asides, a.probeNote())
		case a.On:
			head += fmt.Sprintf("stepped aside (receive work on core %d %s, under %d%%; asides %d): every flow in the NIC poll as vanilla runs it; by their switches: ", a.Core, rx, a.Below, a.Asides)
		default:
			head += fmt.Sprintf("receive work on core %d %s (steps aside under %d%%; asides %d); ", a.Core, rx, a.Below, a.Asides)
		}
	}
	if s.BulkQuiet && !aside {
		head += "no bulk lately, so every rule's flows run in the NIC poll; by their switches: "
	}
	switch {
	case len(s.Rules) == 0 && (s.BulkQuiet || aside):
		return strings.TrimSuffix(head, "by their switches: ") + "no rules yet"
	case len(s.Rules) == 0:
		return head + "no rules yet"
	case len(in) == 0:
		return head + "every rule's flows in their queue (light): " + list(queued)
	case len(queued) == 0:
		return head + "every rule's flows in the NIC poll (busy): " + list(in)
	}
	return head + "in the NIC poll (busy): " + list(in) + "; in their queue (light): " + list(queued)
}
