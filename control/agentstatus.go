package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/heartbeat"
	"golang.org/x/sys/unix"
)

// AgentFile is where a running agent publishes what it does, next to the
// target's state file, for `lanes status` (which runs in another process
// and cannot ask the agent). The agent removes it when it stops; `lanes
// reset` removes one a killed agent left.
const AgentFile = "agent.json"

// AgentPublishEvery is how often a running agent rewrites AgentFile.
const AgentPublishEvery = time.Second

// AgentStaleAfter is how old an agent's last status round may be before
// it counts as not running (`lanes status`) and unhealthy (/healthz): a
// round reads the agent's status, so a status that hangs (behind a lock a
// stuck round holds) stops them. A loop that hangs holding no such lock
// is told by its own heartbeat (Health, heartbeat.Board).
const AgentStaleAfter = 5 * AgentPublishEvery

// AgentReport is an agent's last word about itself.
type AgentReport struct {
	PID  int       `json:"pid"`
	Mode string    `json:"mode"`
	At   time.Time `json:"at"`
	// Summary says in a few lines what the agent is doing (from the
	// status's Summary method, when it has one).
	Summary []string `json:"summary,omitempty"`
	// Status is the agent's own status, as its Status method returns it.
	Status json.RawMessage `json:"status,omitempty"`
	// Containers is what the container follower beside the agent did
	// (follow.go).
	Containers *FollowStatus `json:"containers,omitempty"`
	// Running is set by ReadAgentReport: the writer still lives and the
	// report is fresh. A killed agent's report says what it last did.
	Running bool `json:"running"`
}

// Summarizer is what an agent status implements to be shown by `lanes
// status` as lines of text instead of raw JSON.
type Summarizer interface {
	Summary() []string
}

// PublishAgentStatus writes ag's status into dir's AgentFile every
// AgentPublishEvery until ctx ends, then removes the file.
func PublishAgentStatus(ctx context.Context, dir, mode string, ag plan.Agent) {
	PublishAgentHealth(ctx, dir, mode, ag, nil)
}

// PublishAgentHealth is PublishAgentStatus that also tells h of every
// round (nil: nobody).
func PublishAgentHealth(ctx context.Context, dir, mode string, ag plan.Agent, h *Health) {
	path := filepath.Join(dir, AgentFile)
	defer os.Remove(path)
	defer os.Remove(path + ".tmp")
	tick := time.NewTicker(AgentPublishEvery)
	defer tick.Stop()
	for {
		r := writeAgentReport(path, mode, ag)
		if h != nil {
			h.round(r)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func writeAgentReport(path, mode string, ag plan.Agent) AgentReport {
	st := ag.Status()
	r := AgentReport{PID: os.Getpid(), Mode: mode, At: time.Now()}
	if s, ok := st.(Summarizer); ok {
		r.Summary = s.Summary()
	}
	if b, err := json.Marshal(st); err == nil {
		r.Status = b
	}
	if f, ok := ag.(interface{ FollowStatus() FollowStatus }); ok {
		fs := f.FollowStatus()
		r.Containers = &fs
		r.Summary = append(r.Summary, fs.Summary()...)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return r
	}
	// Best effort: a status file that cannot be written costs `lanes
	// status` a section, not the agent its work.
	// Not synced: a report that a crash loses the next agent rewrites.
	_ = knobs.PublishFile(path, append(b, '\n'))
	return r
}

// ReadAgentReport reads dir's AgentFile; nil, nil when there is none.
func ReadAgentReport(dir string) (*AgentReport, error) {
	r, err := readJSONFile[AgentReport](filepath.Join(dir, AgentFile))
	if r == nil || err != nil {
		return r, err
	}
	// EPERM: the process exists, and is someone else's (a reader without
	// root looking at a root agent).
	err = unix.Kill(r.PID, 0)
	alive := r.PID > 0 && (err == nil || errors.Is(err, unix.EPERM))
	r.Running = alive && time.Since(r.At) < AgentStaleAfter
	return r, nil
}

func removeAgentReport(dir string) {
	os.Remove(filepath.Join(dir, AgentFile))
	os.Remove(filepath.Join(dir, AgentFile+".tmp"))
}

// Health is what a running agent's /healthz and /readyz answer from: its
// status rounds (PublishAgentHealth), its loops' heartbeats and the
// target's applied state.
type Health struct {
	dir, mode, gen string
	started        time.Time
	beats          *heartbeat.Board
	// now is the clock (tests move it).
	now func() time.Time

	mu        sync.Mutex
	last      time.Time // the last status round
	agentAt   time.Time // the agent's own last round, where its status says
	ready     Readiness
	readyAt   time.Time
	readyBusy bool
}

// readyCache bounds how often /readyz reads the target's programs: each
// read enters every namespace with a program of lanes' in it.
const readyCache = time.Second

// NewHealth is the health of the agent that works for dir's apply of mode
// now (its journal's generation: a reset or another apply makes it not
// ready), whose loops beat on beats (AgentOptions.Beats; nil: none).
func NewHealth(dir, mode string, beats *heartbeat.Board) *Health {
	ents, _ := knobs.ReadEntries(dir)
	return &Health{dir: dir, mode: mode, gen: knobs.Generation(ents), started: time.Now(), now: time.Now, beats: beats}
}

func (h *Health) round(r AgentReport) {
	var own struct {
		At time.Time `json:"at"`
	}
	_ = json.Unmarshal(r.Status, &own)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = r.At
	h.agentAt = own.At
}

// Liveness is /healthz's answer.
type Liveness struct {
	OK bool `json:"ok"`
	// LastRoundAge is the age of the last status round (seconds); the
	// agent is unhealthy once it passes AgentStaleAfter.
	LastRoundAge float64 `json:"last_round_age_seconds"`
	// AgentRoundAge is the age of the agent's own last round (Falcon's
	// balancer, PRISM's guard), when its status tells; for people and
	// alerts: each agent's rounds have their own interval.
	AgentRoundAge *float64 `json:"agent_round_age_seconds,omitempty"`
	// Loops are the agent's loops (the guard, the sync rounds, Falcon's
	// balancer, the container follower, the queue reconciler) with the
	// age of their last beat; one overdue makes the agent unhealthy.
	Loops  []heartbeat.Loop `json:"loops,omitempty"`
	Uptime float64          `json:"uptime_seconds"`
	Reason string           `json:"reason,omitempty"`
}

// Live says whether the agent's loops are alive: its status rounds, and
// every loop's heartbeat.
func (h *Health) Live() Liveness {
	l := h.rounds()
	l.Loops = h.beats.Loops()
	if stuck := heartbeat.Stuck(l.Loops); len(stuck) > 0 {
		l.OK = false
		l.Reason = strings.TrimPrefix(l.Reason+"; ", "; ") + "a loop is stuck: " + strings.Join(stuck, "; ")
	}
	return l
}

// rounds is Live as the status rounds tell it.
func (h *Health) rounds() Liveness {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	l := Liveness{Uptime: now.Sub(h.started).Seconds()}
	last := h.last
	if last.IsZero() {
		last = h.started // the first round is due at once
	}
	l.LastRoundAge = now.Sub(last).Seconds()
	if !h.agentAt.IsZero() {
		a := now.Sub(h.agentAt).Seconds()
		l.AgentRoundAge = &a
	}
	l.OK = now.Sub(last) < AgentStaleAfter
	if !l.OK {
		l.Reason = fmt.Sprintf("no status round for %s (stale after %s): the agent's loop is stuck", now.Sub(last).Round(time.Millisecond), AgentStaleAfter)
		if h.last.IsZero() {
			l.Reason = fmt.Sprintf("no status round in the %s since the start: the agent's loop is stuck", now.Sub(last).Round(time.Millisecond))
		}
	}
	return l
}

// Ready checks the target (at most once per readyCache; callers in
// between get the last answer).
func (h *Health) Ready() Readiness {
	h.mu.Lock()
	if h.readyBusy || (!h.readyAt.IsZero() && h.now().Sub(h.readyAt) < readyCache) {
		r := h.ready
		h.mu.Unlock()
		if !r.checked {
			return Readiness{Reason: "the first check is under way"}
		}
		return r
	}
	h.readyBusy = true
	h.mu.Unlock()
	r := CheckReady(h.dir)
	if r.Ready && r.Mode != h.mode {
		r.Ready, r.Reason = false, fmt.Sprintf("mode %s is applied, this agent runs %s: restart the agent", r.Mode, h.mode)
	}
	if r.Ready && r.gen != h.gen {
		r.Ready, r.Reason = false, "the target was applied again after this agent started: restart the agent"
	}
	h.mu.Lock()
	h.ready, h.readyAt, h.readyBusy = r, h.now(), false
	h.mu.Unlock()
	return r
}

// ServeHealthz answers /healthz: 200 while the agent's loops are alive,
// 503 once its status rounds are stale or a loop's beat is overdue; JSON
// either way.
func (h *Health) ServeHealthz(w http.ResponseWriter, _ *http.Request) {
	l := h.Live()
	writeHealth(w, l.OK, l)
}

// ServeReadyz answers /readyz: 200 while the mode is applied and what it
// attached is attached, 503 otherwise; JSON either way.
func (h *Health) ServeReadyz(w http.ResponseWriter, _ *http.Request) {
	r := h.Ready()
	writeHealth(w, r.Ready, r)
}

func writeHealth(w http.ResponseWriter, ok bool, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	b, _ := json.Marshal(v)
	w.Write(append(b, '\n'))
}

// Readiness is /readyz's answer: whether a target's mode is applied and
// the programs it attached are attached.
type Readiness struct {
	Ready bool   `json:"ready"`
	Mode  string `json:"mode,omitempty"`
	Phase string `json:"phase,omitempty"`
	// Programs counts the XDP and tcx attachments the journal holds;
	// Attached those attached now, Parked those an agent took off the
	// path on purpose (Falcon parks while every stage rests at home),
	// Gone those whose device went (a container that stopped, until the
	// agent's follower lets go of it).
	Programs int    `json:"programs"`
	Attached int    `json:"attached"`
	Parked   int    `json:"parked,omitempty"`
	Gone     int    `json:"gone,omitempty"`
	Reason   string `json:"reason,omitempty"`

	gen     string
	checked bool
}

// CheckReady reads a target's state and the programs its journal holds.
func CheckReady(dir string) Readiness {
	r := Readiness{checked: true}
	st, err := ReadState(dir)
	if err != nil {
		r.Reason = err.Error()
		return r
	}
	if st == nil {
		r.Reason = "no mode applied"
		return r
	}
	r.Mode, r.Phase = st.Mode, st.Phase
	if st.Phase != Applied {
		r.Reason = "the apply of " + st.Mode + " has not finished"
		return r
	}
	ents, err := knobs.ReadEntries(dir)
	if err != nil {
		r.Reason = err.Error()
		return r
	}
	r.gen = knobs.Generation(ents)
	_, perr := os.Stat(filepath.Join(dir, plan.AgentStateFile))
	parked := perr == nil
	var missing []string
	for _, e := range ents {
		if e.Kind != attach.KindXDP && e.Kind != attach.KindTCX {
			continue
		}
		r.Programs++
		k, err := e.Decode()
		if err != nil {
			missing = append(missing, e.Key)
			continue
		}
		v, err := k.Read()
		switch {
		case errors.Is(err, knobs.ErrGone):
			r.Gone++
		case err == nil && string(v) == attach.ValueAttached:
			r.Attached++
		case err == nil && parked && e.Kind == attach.KindTCX:
			r.Parked++
		default:
			missing = append(missing, e.Key)
		}
	}
	if len(missing) > 0 {
		r.Reason = fmt.Sprintf("%d of %d programs not attached (%s): lanes reset, then apply again", len(missing), r.Programs, listSome(missing))
		return r
	}
	r.Ready = true
	return r
}
