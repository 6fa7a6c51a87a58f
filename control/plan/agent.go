package plan

import (
	"context"
	"fmt"
	"sort"

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

// NewAgent builds the named agent.
func NewAgent(name string, env AgentEnv) (Agent, error) {
	mu.Lock()
	start := agents[name]
	var names []string
	for n := range agents {
		names = append(names, n)
	}
	mu.Unlock()
	if start == nil {
		sort.Strings(names)
		return nil, fmt.Errorf("no agent %q in this lanes (it has %v): was the state written by another version?", name, names)
	}
	return start(env)
}
