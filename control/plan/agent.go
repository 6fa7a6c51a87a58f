package plan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/lanesnet/lanes/internal/heartbeat"
	"github.com/prometheus/client_golang/prometheus"
)

// An Agent is the long-running part of a mode (Falcon's balancer): it
// adjusts an applied plan at run time through what the plan set up (BPF
// maps), and at most switches a knob the plan itself set (so the journal
// already holds its original) between the plan's value and another; it
// never touches a knob the plan did not. Stopping it, or killing it,
// leaves a plan that `lanes reset` undoes like any other.
type Agent interface {
	// Run works until ctx ends; it returns nil then. Before returning it
	// puts the plan's static placement back.
	Run(ctx context.Context) error
	// Status describes what the agent is doing now, for `lanes status`
	// and the benchmark's notes.
	Status() any
}

// Discard lets go of what an agent that is not to run holds since it was
// built (a pinned datapath it opened): its Close method, where it has one.
// Run lets go of it otherwise.
func Discard(a Agent) {
	if c, ok := a.(interface{ Close() error }); ok {
		c.Close()
	}
}

// AgentEnv is what an agent gets: the applied state, as journaled.
type AgentEnv struct {
	NetNS  string
	Mode   string
	Params map[string]string
	CPUs   []int // the applied core set
	// StateDir is the target's state directory (its journal, whose
	// originals an agent may write back to a knob the plan set). An
	// agent that must remember something across a crash keeps it there
	// in AgentStateFile, which `lanes reset` removes.
	StateDir string
	// Metrics is where the agent registers its Prometheus metrics; nil =
	// none.
	Metrics prometheus.Registerer
	// Logf reports decisions worth a line (fallback, resume); nil = quiet.
	Logf func(format string, args ...any)
	// Beats is where each of the agent's loops beats at every turn
	// (heartbeat.Board.Loop, from the loop's start to its end), for the
	// agent's liveness; nil = nowhere (a nil Board's beats do nothing).
	Beats *heartbeat.Board
}

// ConfigError is an agent's failure to start that its settings cause (a
// setting it cannot take, an agent this lanes does not have): another
// start with the same settings fails the same way, so lanes agent does
// not ask to be restarted into it. Any other failure (a busy journal, a
// device that went away) may pass.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }
func (e ConfigError) Unwrap() error { return e.Err }

// IsConfigError says whether err is, or wraps, a ConfigError.
func IsConfigError(err error) bool {
	var c ConfigError
	return errors.As(err, &c)
}

// AgentStateFile is the one file an agent may keep in its StateDir.
const AgentStateFile = "agent-state.json"

var agents = map[string]func(AgentEnv) (Agent, error){}

// RegisterAgent makes an agent available under the name a plan gives in
// Plan.Agent; call it from the policy package's init.
func RegisterAgent(name string, start func(AgentEnv) (Agent, error)) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := agents[name]; dup {
		panic("plan: agent registered twice: " + name)
	}
	agents[name] = start
}

// agentSep joins the agents of a plan composed from several policies
// (falcon-prism: Falcon's balancer and PRISM's high=auto switch) into one
// Plan.Agent, so a state file written before composition reads the same.
const agentSep = "+"

// Agents is the Plan.Agent that runs each named agent (empty names
// skipped) side by side: the first is the mode's own, whose status the
// others' join under their names.
func Agents(names ...string) string {
	var out []string
	for _, n := range names {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return strings.Join(out, agentSep)
}

// NewAgent builds the agent a Plan.Agent names: one agent, or those
// Agents joined, run together.
func NewAgent(name string, env AgentEnv) (Agent, error) {
	names := strings.Split(name, agentSep)
	if len(names) == 1 {
		return newAgent(name, env)
	}
	c := &composed{names: names}
	for _, n := range names {
		a, err := newAgent(n, env)
		if err != nil {
			// Those built already will not run.
			c.Close()
			return nil, err
		}
		c.agents = append(c.agents, a)
	}
	return c, nil
}

// Close discards the agents of a composed agent that is not to run.
func (c *composed) Close() error {
	for _, a := range c.agents {
		Discard(a)
	}
	return nil
}

// composed runs the agents of a composed plan together: each works on
// its own runtime state (one writer each), and the first to fail stops
// the others, as a single agent's failure stops it.
type composed struct {
	names  []string
	agents []Agent
}

func (c *composed) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(c.agents))
	var wg sync.WaitGroup
	for i, a := range c.agents {
		wg.Go(func() {
			if errs[i] = a.Run(ctx); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("%s: %w", c.names[i], err)
		}
	}
	return nil
}

// Status is the first agent's status with each other agent's under its
// name: readers of the mode's own status (its round's "at") find it where
// they would without composition.
func (c *composed) Status() any {
	s := composedStatus{names: c.names}
	for _, a := range c.agents {
		s.statuses = append(s.statuses, a.Status())
	}
	return s
}

// OwnStatus is the mode's own agent's status in an agent's status: the
// first agent's of a composed one, st itself otherwise.
func OwnStatus(st any) any {
	if c, ok := st.(composedStatus); ok {
		return c.statuses[0]
	}
	return st
}

// composedStatus is each agent's status, in the plan's order.
type composedStatus struct {
	names    []string
	statuses []any
}

func (s composedStatus) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(s.statuses[0])
	if err != nil {
		return nil, err
	}
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &m); err != nil {
		// Not an object: keep it whole.
		m = map[string]json.RawMessage{"status": b}
	}
	for i, n := range s.names[1:] {
		if m[n], err = json.Marshal(s.statuses[i+1]); err != nil {
			return nil, err
		}
	}
	return json.Marshal(m)
}

// Summary is every agent's summary lines, in order (those of agents whose
// status has them).
func (s composedStatus) Summary() []string {
	var out []string
	for _, st := range s.statuses {
		if sum, ok := st.(interface{ Summary() []string }); ok {
			out = append(out, sum.Summary()...)
		}
	}
	return out
}

func newAgent(name string, env AgentEnv) (Agent, error) {
	mu.Lock()
	start := agents[name]
	var names []string
	for n := range agents {
		names = append(names, n)
	}
	mu.Unlock()
	if start == nil {
		sort.Strings(names)
		return nil, ConfigError{fmt.Errorf("no agent %q in this lanes (it has %v): was the state written by another version?", name, names)}
	}
	return start(env)
}
