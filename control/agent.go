package control

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/heartbeat"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// AgentOptions say which target's agent to build.
type AgentOptions struct {
	NetNS    string
	StateDir string
	Metrics  prometheus.Registerer
	Logf     func(string, ...any)
	// Beats is where the agent's loops beat, for its liveness (nil:
	// nowhere).
	Beats *heartbeat.Board
}

// NewAgent builds the run-time part of the mode applied to a namespace,
// from its state file, with the container follower beside it. It fails
// with a clear message when nothing is applied, the apply did not finish,
// or the mode changes nothing (vanilla).
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
	// The agent switches journaled knobs (the follower's adoptions,
	// Falcon's parking): only from the namespace that journaled them.
	if err := knobs.CheckHostNetNS(dir); err != nil {
		return nil, st, err
	}
	f, err := newFollower(st, dir, o.Logf)
	if err != nil {
		return nil, st, err
	}
	f.beats = o.Beats
	if src, ok := plan.StatusOf(st.Mode); ok && src.Collector != nil && o.Metrics != nil {
		if err := o.Metrics.Register(src.Collector(st.NetNS)); err != nil {
			return nil, st, fmt.Errorf("%s's metrics: %w", st.Mode, err)
		}
	}
	pins := plan.PinDir(st.NetNS)
	var r *steer.Reconciler
	if steer.Pinned(pins) {
		r = steer.NewReconciler(pins, o.Logf)
		r.Beats = o.Beats
	}
	if st.Plan.Agent == "" {
		// A static mode still has its containers to follow, and
		// with a steering datapath the queue reconciler to run.
		if st.Plan.Changes == 0 {
			return nil, st, plan.ConfigError{Err: fmt.Errorf("mode %s changes nothing: lanes agent has nothing to run for it", st.Mode)}
		}
		return running{Agent: static{st.Mode, r != nil}, r: r, f: f}, st, nil
	}
	cpus, err := cpuset.ParseList(st.CPUs)
	if err != nil {
		return nil, st, fmt.Errorf("state file %s: cpus: %w", dir, err)
	}
	a, err := plan.NewAgent(st.Plan.Agent, plan.AgentEnv{
		NetNS: st.NetNS, Mode: st.Mode, Params: st.Params, CPUs: cpus, StateDir: dir, Metrics: o.Metrics, Logf: o.Logf, Beats: o.Beats,
	})
	if err != nil {
		return nil, st, err
	}
	return running{Agent: a, r: r, f: f}, st, nil
}

// running is a mode's agent with what runs beside every agent of a
// target: the container follower (follow.go) and, where a steering
// datapath is pinned, its queue reconciler (mechanism, not policy:
// datapath/steer/order_reconcile.go): a frame lost where nothing reports it
// would otherwise hold the flows waiting on its core's queues for good.
type running struct {
	plan.Agent
	r *steer.Reconciler // nil: no steering datapath
	f *follower
}

func (w running) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if w.r != nil {
		wg.Go(func() { w.r.Run(ctx) })
	}
	wg.Go(func() { w.f.Run(ctx) })
	err := w.Agent.Run(ctx)
	cancel()
	wg.Wait()
	return err
}

// FollowStatus is what the container follower did last.
func (w running) FollowStatus() FollowStatus { return w.f.Status() }

// static is the agent of a static mode: nothing of its own; the follower
// (and the reconciler, with a steering datapath) beside it.
type static struct {
	mode      string
	reconcile bool
}

func (a static) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func (a static) Status() any {
	what := "container follower only"
	if a.reconcile {
		what = "queue reconciler and container follower only"
	}
	return staticStatus{Agent: what + ": " + a.mode + " has no run-time part of its own"}
}

type staticStatus struct {
	Agent string `json:"agent"`
}

func (s staticStatus) Summary() []string { return []string{s.Agent} }

// Ensure brings a target to what o asks for, as a restarted `lanes agent
// --config` must: when the target's state says o's mode is applied with
// o's settings and cores, and CheckReady finds everything it attached
// still attached, the apply is picked up as it is (nothing is applied
// again, so nothing is stacked); otherwise o is applied, which first
// restores whatever the journal holds (a crashed apply, another mode).
// picked says which. A namespace applied under another target name (the
// same namespace by another path) is refused: two journals of one
// namespace would each stack programs on its devices.
func Ensure(o Options) (st *State, picked bool, err error) {
	if other, err := OtherTarget(o.StateDir, o.NetNS); err != nil {
		return nil, false, err
	} else if other != "" {
		return nil, false, fmt.Errorf("netns %s is already applied as target %s (the same namespace by another name): reset that target first (lanes reset --all resets every target)", label(o.NetNS), other)
	}
	dir := Dir(o.StateDir, o.NetNS)
	cur, err := ReadState(dir)
	if err != nil {
		return nil, false, err
	}
	if cur != nil && cur.Phase == Applied && cur.Mode == o.Mode && maps.Equal(cur.Params, o.Params) && sameCPUs(cur.CPUs, o.CPUs) {
		if r := CheckReady(dir); r.Ready {
			return cur, true, nil
		}
	}
	st, err = Apply(o)
	return st, false, err
}

// sameCPUs compares an applied core list (as the state file keeps it)
// with one as given ("" = all online).
func sameCPUs(applied, given string) bool {
	var cpus []int
	var err error
	if given == "" {
		cpus, err = cpuset.Online()
	} else {
		cpus, err = cpuset.ParseList(given)
	}
	return err == nil && cpuset.FormatList(cpus) == applied
}

// OtherTarget names a target under stateDir, other than netns's own, whose
// applied namespace is netns's namespace ("" if none): one namespace
// reached by two names (a name under /run/netns and its path, a pid form).
func OtherTarget(stateDir, netns string) (string, error) {
	if stateDir == "" {
		stateDir = DefaultStateDir
	}
	self := Dir(stateDir, netns)
	ents, err := os.ReadDir(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("listing state dir: %w", err)
	}
	want, ok := netnsID(netns)
	if !ok {
		return "", nil
	}
	for _, e := range ents {
		dir := filepath.Join(stateDir, e.Name())
		if !e.IsDir() || dir == self {
			continue
		}
		st, err := ReadState(dir)
		if err != nil || st == nil {
			continue
		}
		if id, ok := netnsID(st.NetNS); ok && id == want {
			return e.Name(), nil
		}
	}
	return "", nil
}

// netnsID identifies a namespace by its file's device and inode; false
// when it cannot be reached.
func netnsID(ns string) ([2]uint64, bool) {
	p := netnsx.Path(ns)
	if p == "" {
		p = "/proc/self/ns/net"
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return [2]uint64{}, false
	}
	return [2]uint64{st.Dev, st.Ino}, true
}
