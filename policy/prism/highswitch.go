package prism

import (
	"fmt"
	"time"

	"github.com/lanesnet/lanes/datapath/steer"
)

// high=auto's switch. Where a high-priority frame should run its first
// stage depends on the marked traffic, measured on 2 cores under a 65%
// background:
//
//   - A light marked flow (PRISM's ping-pong, 1000 messages/s) waits for
//     the core; the class's real-time queue takes it at the bulk kthread's
//     batch boundary. In the NIC poll instead its p99 was worse: 0.94x of
//     vanilla's at 95% background against 0.49x (AMD VM, 2026-11-25), 1.21x
//     and 0.63x against 0.46x at 65% (Intel VM, 2026-11-23).
//   - A busy marked service (memcached, nginx: thousands of requests/s on
//     the receive core) pays the queue's kthread hop on every request: a
//     scheduler trace showed memcached's worker waiting behind that
//     real-time kthread as often as behind bulk work. In the NIC poll it
//     got most of its lost rate back (memcached 0.91-0.92x of vanilla's
//     rate instead of 0.75-0.81x, nginx 0.91-0.97x instead of 0.78-0.82x,
//     AMD VM, two runs).
//
// So the agent counts the class's frames (steer_xdp's CNT_HIGH) and runs
// it in the NIC poll while it is busy, in its queue while it is light.
// The datapath moves each flow between the two as soon as none of its
// frames is left on the old path (steer.Datapath.SetHighInline), so a
// switch never reorders a flow. The flag is runtime state of the
// datapath, not a host knob: it goes with the datapath at reset, and a
// stopped agent puts the class back in its queue (the plan's state).

// HighRule is when high=auto switches.
type HighRule struct {
	// Inline: the class carried at least InlineAt frames/s for
	// InlineAfter samples in a row.
	InlineAt    float64
	InlineAfter int
	// Queue: it carried less than QueueBelow frames/s for QueueAfter
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

// highState is the switch's decision: on is inline.
type highState struct{ latch }

// step takes one sample of the class's rate (frames/s) and says whether
// the decision changed.
func (s *highState) step(r HighRule, rate float64) bool {
	return s.latch.step(rate >= r.InlineAt, r.InlineAfter, rate < r.QueueBelow, r.QueueAfter)
}

// inline: the class runs in the NIC poll now.
func (s *highState) inline() bool { return s.on }

// highDatapath is what the switch needs of the datapath (steer.Datapath,
// or a test's fake).
type highDatapath interface {
	HighFrames() (uint64, error)
	HighInline() (bool, error)
	SetHighInline(on bool) error
	Close() error
}

// highSwitch is high=auto's runtime part, stepped by the guard's loop.
type highSwitch struct {
	dir  string
	rule HighRule
	open func(dir string) (highDatapath, error)
	dp   highDatapath

	state    highState
	frames   uint64    // the count at the last sample
	at       time.Time // when it was read
	rate     float64   // frames/s over the last sample
	switches uint64
}

func newHighSwitch(dir string, pps int) *highSwitch {
	return &highSwitch{dir: dir, rule: highRule(pps), open: func(dir string) (highDatapath, error) { return steer.Open(dir) }}
}

// sample reads the class's count at now, steps the decision and makes the
// datapath follow it. It says what changed (for the log), or an error.
// The datapath is reopened after an error (a re-apply pins a new one), and
// its flag is set whenever it differs from the decision, so a re-apply,
// which clears it, is followed.
func (h *highSwitch) sample(now time.Time) (string, error) {
	if h.dp == nil {
		dp, err := h.open(h.dir)
		if err != nil {
			return "", fmt.Errorf("high=auto: %w", err)
		}
		h.dp, h.at = dp, time.Time{}
	}
	n, err := h.dp.HighFrames()
	if err != nil {
		h.close()
		return "", fmt.Errorf("high=auto: %w", err)
	}
	var changed bool
	if !h.at.IsZero() && now.After(h.at) && n >= h.frames {
		h.rate = float64(n-h.frames) / now.Sub(h.at).Seconds()
		changed = h.state.step(h.rule, h.rate)
	}
	h.frames, h.at = n, now
	cur, err := h.dp.HighInline()
	if err != nil {
		h.close()
		return "", fmt.Errorf("high=auto: %w", err)
	}
	if cur != h.state.inline() {
		if err := h.dp.SetHighInline(h.state.inline()); err != nil {
			h.close()
			return "", fmt.Errorf("high=auto: %w", err)
		}
	}
	if !changed {
		return "", nil
	}
	h.switches++
	if h.state.inline() {
		return fmt.Sprintf("high=auto: high-priority class busy (%.0f frames/s, at least %.0f): it runs in the NIC poll", h.rate, h.rule.InlineAt), nil
	}
	return fmt.Sprintf("high=auto: high-priority class light (%.0f frames/s, under %.0f): it takes its queue", h.rate, h.rule.QueueBelow), nil
}

// stop puts the class back in its queue, the plan's state, and lets go of
// the datapath.
func (h *highSwitch) stop() error {
	if h.dp == nil {
		dp, err := h.open(h.dir)
		if err != nil {
			return nil // nothing pinned: nothing to put back
		}
		h.dp = dp
	}
	err := h.dp.SetHighInline(false)
	h.close()
	h.state = highState{}
	return err
}

func (h *highSwitch) close() {
	if h.dp != nil {
		h.dp.Close()
		h.dp = nil
	}
}

// HighStatus is what `lanes status` shows of high=auto.
type HighStatus struct {
	Inline   bool    `json:"inline"`
	Rate     float64 `json:"frames_per_second"`
	InlineAt float64 `json:"inline_at"`
	Switches uint64  `json:"switches"`
}

func (h *highSwitch) status() *HighStatus {
	return &HighStatus{Inline: h.state.inline(), Rate: h.rate, InlineAt: h.rule.InlineAt, Switches: h.switches}
}

// Summary is the status line.
func (s HighStatus) Summary() string {
	where := "in its queue (light)"
	if s.Inline {
		where = "in the NIC poll (busy)"
	}
	return fmt.Sprintf("high=auto: high-priority class %s at %.0f frames/s (inline from %.0f); %d switches", where, s.Rate, s.InlineAt, s.Switches)
}
