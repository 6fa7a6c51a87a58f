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
// with the datapath at reset, and a stopped agent puts every rule's flows
// back in their queue (the plan's state).

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
	SetHighInline(r steer.Rule, on bool) error
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
// opens the pinned datapath at every sample (four maps), and its
// threshold is the applied config's (steer.Config.HighAutoPPS): a
// re-apply with another threshold is followed, and one without high=auto
// (0) stands the switch down.
type highSwitch struct {
	dir  string
	open func(dir string) (highDatapath, error)

	rule      HighRule
	off       bool // the applied config is not high=auto
	bulkQuiet bool // every flow in the NIC poll for want of bulk (bulk-quiet)
	rules     map[steer.Rule]*ruleSwitch
	switches  uint64
	err       string // the last sample's error, cleared by the next good one
}

func newHighSwitch(dir string) *highSwitch {
	return &highSwitch{dir: dir, open: func(dir string) (highDatapath, error) {
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

func (h *highSwitch) try(now time.Time) (string, error) {
	dp, err := h.open(h.dir)
	if err != nil {
		return "", err
	}
	defer dp.Close()
	pps, cur, err := dp.HighAuto()
	if err != nil {
		return "", err
	}
	if pps == 0 {
		// Applied without high=auto (a re-apply, or the default's
		// fallback): nothing to switch; the programs ignore the switches.
		was := !h.off
		h.off, h.rules, h.bulkQuiet = true, nil, false
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
		if !rs.at.IsZero() && now.After(rs.at) {
			rs.rate = float64(n-rs.frames) / now.Sub(rs.at).Seconds()
			rs.state.step(h.rule, rs.rate)
		}
		rs.frames, rs.at = n, now
		want := rs.state.inline()
		if slices.Contains(cur, r) != want {
			if err := dp.SetHighInline(r, want); err != nil {
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
		errs = append(errs, dp.SetHighInline(r, false))
	}
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
}

// HighRuleStatus is one rule's state.
type HighRuleStatus struct {
	Rule   string  `json:"rule"`
	Inline bool    `json:"inline"`
	Rate   float64 `json:"frames_per_second"`
}

func (h *highSwitch) status() *HighStatus {
	s := &HighStatus{InlineAt: h.rule.InlineAt, Switches: h.switches, BulkQuiet: h.bulkQuiet, Off: h.off, Err: h.err}
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
	if s.BulkQuiet {
		head += "no bulk lately, so every rule's flows run in the NIC poll; by their switches: "
	}
	switch {
	case len(s.Rules) == 0 && s.BulkQuiet:
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
