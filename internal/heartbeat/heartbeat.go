// Package heartbeat tells whether an agent's loops are alive: each loop
// beats at every turn, and a loop whose beat is overdue is stuck. The
// agent's liveness (/healthz) reads the board of its loops: a loop that
// holds no lock across its round (the PRISM guard sampling, a sync round
// reading the path) can hang without stopping anything else the agent
// does, and only its own beat tells.
package heartbeat

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// StaleAfter is the least time a loop may go without a beat; staleBeats
// is how many of its periods it may miss. A loop's beat is overdue after
// whichever is longer: a round that takes longer than its period (a
// busy host) is not a hang.
const (
	StaleAfter = 5 * time.Second
	staleBeats = 5
)

// Board is the heartbeats of one agent's loops.
type Board struct {
	now   func() time.Time
	mu    sync.Mutex
	loops []*Beat
}

// NewBoard is an empty board on the clock now (nil: time.Now).
func NewBoard(now func() time.Time) *Board {
	if now == nil {
		now = time.Now
	}
	return &Board{now: now}
}

// Beat is one loop's heartbeat. A nil Beat (from a nil Board: a loop run
// without an agent's liveness, in a test or the benchmark) does nothing.
type Beat struct {
	b      *Board
	name   string
	period time.Duration
	// last is the last beat; doze the longer period the loop said it
	// sleeps for (0: none).
	last time.Time
	doze time.Duration
}

// Loop registers a loop named name that beats at least every period, from
// now until Stop. A nil board gives a nil Beat.
func (b *Board) Loop(name string, period time.Duration) *Beat {
	if b == nil {
		return nil
	}
	h := &Beat{b: b, name: name, period: period}
	b.mu.Lock()
	defer b.mu.Unlock()
	h.last = b.now()
	b.loops = append(b.loops, h)
	return h
}

// Beat says the loop turned: it woke, or finished a round.
func (h *Beat) Beat() {
	if h == nil {
		return
	}
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	h.last = h.b.now()
}

// Doze says the loop sleeps up to d between beats from now on, longer than
// its period (PRISM's guard standing aside); 0 ends it. It beats too.
func (h *Beat) Doze(d time.Duration) {
	if h == nil {
		return
	}
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	h.last, h.doze = h.b.now(), d
}

// Stop takes the loop off the board: it ended.
func (h *Beat) Stop() {
	if h == nil {
		return
	}
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	h.b.loops = slices.DeleteFunc(h.b.loops, func(o *Beat) bool { return o == h })
}

// Loop is what the board says of one loop.
type Loop struct {
	Name string `json:"name"`
	// Age is the time since its last beat (seconds); Due the longest it
	// may go without one (StaleAfter or staleBeats of its period, the
	// doze's while it dozes).
	Age     float64 `json:"age_seconds"`
	Due     float64 `json:"due_seconds"`
	Dozing  bool    `json:"dozing,omitempty"`
	Overdue bool    `json:"overdue,omitempty"`
}

// Loops lists the loops on the board, in the order they came.
func (b *Board) Loops() []Loop {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	out := make([]Loop, 0, len(b.loops))
	for _, h := range b.loops {
		due := max(StaleAfter, staleBeats*max(h.period, h.doze))
		age := now.Sub(h.last)
		out = append(out, Loop{Name: h.name, Age: age.Seconds(), Due: due.Seconds(), Dozing: h.doze > 0, Overdue: age > due})
	}
	return out
}

// Stuck says which of loops are overdue, a phrase each (none: nil).
func Stuck(loops []Loop) []string {
	var out []string
	for _, l := range loops {
		if l.Overdue {
			out = append(out, fmt.Sprintf("%s: no beat for %.1fs (due within %.0fs)", l.Name, l.Age, l.Due))
		}
	}
	return out
}
