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
	HighAuto() (pps uint32, inline bool, err error)
	SetHighInline(on bool) error
	Close() error
}

// highSwitch is high=auto's runtime part, stepped by the guard's loop. It
// opens the pinned datapath at every sample (three maps), and its
// threshold is the applied config's (steer.Config.HighAutoPPS): a
// re-apply with another threshold is followed, and one without high=auto
// (0) stands the switch down.
type highSwitch struct {
	dir  string
	open func(dir string) (highDatapath, error)

	state    highState
	rule     HighRule
	off      bool      // the applied config is not high=auto
	frames   uint64    // the count at the last sample
	at       time.Time // when it was read
	rate     float64   // frames/s over the last sample
	switches uint64
	err      string // the last sample's error, cleared by the next good one
}

func newHighSwitch(dir string) *highSwitch {
	return &highSwitch{dir: dir, open: func(dir string) (highDatapath, error) { return steer.OpenHighAuto(dir) }}
}

// sample reads the class's count at now, steps the decision and makes the
// datapath follow it. It says what changed (for the log); an error is
// kept for the status until the next good sample. The switch is set
// whenever it differs from the decision.
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
		// fallback): nothing to switch; the programs ignore the switch.
		was := !h.off
		h.off, h.state, h.at, h.rate = true, highState{}, time.Time{}, 0
		if was {
			return "high=auto: the applied plan is not high=auto: the switch stands down", nil
		}
		return "", nil
	}
	h.off, h.rule = false, highRule(int(pps))
	n, err := dp.HighFrames()
	if err != nil {
		return "", err
	}
	if n < h.frames {
		// The count went back: a re-apply pinned a new datapath, whose
		// class starts in its queue; so does the decision.
		h.state, h.at = highState{}, time.Time{}
	}
	var changed bool
	if !h.at.IsZero() && now.After(h.at) && n >= h.frames {
		h.rate = float64(n-h.frames) / now.Sub(h.at).Seconds()
		changed = h.state.step(h.rule, h.rate)
	}
	h.frames, h.at = n, now
	if cur != h.state.inline() {
		if err := dp.SetHighInline(h.state.inline()); err != nil {
			return "", err
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

// stop puts the class back in its queue, the plan's state.
func (h *highSwitch) stop() error {
	h.state = highState{}
	dp, err := h.open(h.dir)
	if err != nil {
		return nil // nothing pinned: nothing to put back
	}
	defer dp.Close()
	return dp.SetHighInline(false)
}

// HighStatus is what `lanes status` shows of high=auto.
type HighStatus struct {
	Inline   bool    `json:"inline"`
	Rate     float64 `json:"frames_per_second"`
	InlineAt float64 `json:"inline_at"`
	Switches uint64  `json:"switches"`
	// Off: the applied config is not high=auto (a re-apply without it, or
	// the default's fallback to the queue).
	Off bool   `json:"off,omitempty"`
	Err string `json:"error,omitempty"`
}

func (h *highSwitch) status() *HighStatus {
	return &HighStatus{Inline: h.state.inline(), Rate: h.rate, InlineAt: h.rule.InlineAt, Switches: h.switches, Off: h.off, Err: h.err}
}

// Summary is the status line.
func (s HighStatus) Summary() string {
	if s.Err != "" {
		return s.Err
	}
	if s.Off {
		return "high=auto: off (the applied plan keeps the high-priority class in its queue)"
	}
	where := "in its queue (light)"
	if s.Inline {
		where = "in the NIC poll (busy)"
	}
	return fmt.Sprintf("high=auto: high-priority class %s at %.0f frames/s (inline from %.0f); %d switches", where, s.Rate, s.InlineAt, s.Switches)
}
