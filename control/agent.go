package control

import (
	"fmt"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/prometheus/client_golang/prometheus"
)

// AgentOptions say which target's agent to build.
type AgentOptions struct {
	NetNS    string
	StateDir string
	Metrics  prometheus.Registerer
	Logf     func(string, ...any)
}

// NewAgent builds the run-time part of the mode applied to a namespace,
// from its state file. It fails with a clear message when nothing is
// applied, the apply did not finish, or the mode is static.
func NewAgent(o AgentOptions) (plan.Agent, *State, error) {
	dir := Dir(o.StateDir, o.NetNS)
	st, err := ReadState(dir)
	if err != nil {
		return nil, nil, err
	}
	if st == nil {
		return nil, nil, fmt.Errorf("no mode applied to netns %s: run `lanes apply --mode falcon` first (or pass --mode to lanes agent)", label(o.NetNS))
	}
	if st.Phase != Applied {
		return nil, st, fmt.Errorf("the apply of %s to netns %s did not finish: run `lanes reset` and apply again", st.Mode, label(o.NetNS))
	}
	if st.Plan.Agent == "" {
		// A static mode with a steering datapath still has the queue
		// reconciler to run.
		if dir := plan.PinDir(st.NetNS); steer.Pinned(dir) {
			return withReconciler{Agent: reconcilerOnly{st.Mode}, r: steer.NewReconciler(dir, o.Logf)}, st, nil
		}
		return nil, st, fmt.Errorf("mode %s is static: it has nothing to run at run time (falcon modes with balance=true do)", st.Mode)
	}
	cpus, err := knobs.ParseCPUList(st.CPUs)
	if err != nil {
		return nil, st, fmt.Errorf("state file %s: cpus: %w", dir, err)
	}
	a, err := plan.NewAgent(st.Plan.Agent, plan.AgentEnv{
		NetNS: st.NetNS, Mode: st.Mode, Params: st.Params, CPUs: cpus, StateDir: dir, Metrics: o.Metrics, Logf: o.Logf,
	})
	if err != nil {
		return nil, st, err
	}
	// Every mode with a steering datapath gets the queue reconciler
	// beside its own agent (mechanism, not policy: datapath/steer/reconcile.go).
	return withReconciler{Agent: a, r: steer.NewReconciler(plan.PinDir(st.NetNS), o.Logf)}, st, nil
}
