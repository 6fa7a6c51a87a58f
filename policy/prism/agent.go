package prism

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/topology"
)

// SyncAgentName is the plan.Plan.Agent of prism's sync mode.
const SyncAgentName = "prism-sync"

func init() { plan.RegisterAgent(SyncAgentName, newSyncAgent) }

// syncAgent keeps PRISM-sync's destinations true while the host changes:
// containers come and go, the bridge learns and forgets MACs, someone adds
// a filter. It rediscovers the topology when the bridge's forwarding
// table or a link changes (netlink events) and every Interval in any case
// (netfilter rules send no events), and rewrites the destinations when
// they differ. It never turns a container's GRO on (agents change maps,
// not knobs): a container that came after the apply and lacks it is left
// to batch mode until the next apply.
type syncAgent struct {
	env      plan.AgentEnv
	interval time.Duration
	// trustNetfilter is sync-netfilter=trust (see Sync).
	trustNetfilter bool
	dp             *steer.Datapath
	guard          *guard // the overload guard (guard.go); nil without one

	mu     sync.Mutex
	status SyncStatus
	m      *syncMetrics
}

// SyncStatus is what `lanes status` shows of a running sync agent.
type SyncStatus struct {
	At        time.Time `json:"at"`
	Targets   []string  `json:"targets"` // "VNI/MAC -> veth (container)"
	Notes     []string  `json:"notes,omitempty"`
	Refreshes uint64    `json:"refreshes"`
	Changes   uint64    `json:"changes"`
	Err       string    `json:"error,omitempty"`
	// Guard is the overload guard's state, when the NIC poll is on the
	// ladder.
	Guard *GuardStatus `json:"guard,omitempty"`
}

// Summary is what `lanes status` shows of the sync agent.
func (s SyncStatus) Summary() []string {
	t := "none"
	if len(s.Targets) > 0 {
		t = strings.Join(s.Targets, "; ")
	}
	out := []string{fmt.Sprintf("sync destinations (%d refreshes, %d changes): %s", s.Refreshes, s.Changes, t)}
	for _, n := range s.Notes {
		out = append(out, "note: "+n)
	}
	if s.Err != "" {
		out = append(out, "error: "+s.Err)
	}
	if s.Guard != nil {
		out = append(out, s.Guard.Summary()...)
	}
	return out
}

type syncMetrics struct {
	targets prometheus.Gauge
	changes prometheus.Counter
}

func newSyncAgent(env plan.AgentEnv) (plan.Agent, error) {
	o, err := Parse(Defaults(), env.Params)
	if err != nil {
		return nil, err
	}
	dp, err := steer.Open(plan.PinDir(env.NetNS))
	if err != nil {
		return nil, fmt.Errorf("prism-sync agent: %w (is prism-sync applied? `lanes status` tells)", err)
	}
	g, err := newGuard(env, o)
	if err != nil {
		dp.Close()
		return nil, err
	}
	a := &syncAgent{env: env, interval: o.SyncInterval, trustNetfilter: o.SyncNetfilter == NetfilterTrust, dp: dp, guard: g}
	if env.Metrics != nil {
		a.m = &syncMetrics{
			targets: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_prism_sync_targets", Help: "Destinations PRISM-sync hands high-priority frames to directly."}),
			changes: prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_prism_sync_changes_total", Help: "Times the sync destinations were rewritten."}),
		}
		env.Metrics.MustRegister(a.m.targets, a.m.changes, steer.NewCollector(plan.PinDir(env.NetNS)))
	}
	return a, nil
}

func (a *syncAgent) Status() any {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.status
	s.Targets = slices.Clone(s.Targets)
	s.Notes = slices.Clone(s.Notes)
	if a.guard != nil {
		gs := a.guard.Status()
		s.Guard = &gs
	}
	return s
}

// Run refreshes until ctx ends. The destinations it leaves behind are the
// last true ones; reset removes them with the datapath.
func (a *syncAgent) Run(ctx context.Context) (err error) {
	defer a.dp.Close()
	if a.guard != nil {
		gctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- a.guard.run(gctx) }()
		defer func() {
			cancel()
			if gerr := <-done; err == nil {
				err = gerr
			}
		}()
	}
	events := a.subscribe(ctx)
	tick := time.NewTicker(a.interval)
	defer tick.Stop()
	for {
		a.refresh()
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-events:
			// Let a burst of changes (a container starting) settle.
			time.Sleep(20 * time.Millisecond)
			drain(events)
		}
	}
}

// subscribe delivers a value whenever the namespace's links or forwarding
// entries change; nil (never ready) if it cannot subscribe, and the ticker
// alone refreshes.
func (a *syncAgent) subscribe(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	ns, err := knobs.OpenNetNS(a.env.NetNS)
	if err != nil {
		return nil
	}
	neigh := make(chan netlink.NeighUpdate, 64)
	link := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer ns.Close() // the subscriptions keep their own sockets in the namespace
	go func() { <-ctx.Done(); close(done) }()
	if err := netlink.NeighSubscribeWithOptions(neigh, done, netlink.NeighSubscribeOptions{Namespace: &ns}); err != nil {
		return nil
	}
	if err := netlink.LinkSubscribeWithOptions(link, done, netlink.LinkSubscribeOptions{Namespace: &ns}); err != nil {
		return nil
	}
	go func() {
		for {
			select {
			case _, ok := <-neigh:
				if !ok {
					return
				}
			case _, ok := <-link:
				if !ok {
					return
				}
			}
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}()
	return out
}

func drain(c <-chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

func (a *syncAgent) refresh() {
	st := SyncStatus{At: time.Now()}
	defer func() {
		a.mu.Lock()
		st.Refreshes = a.status.Refreshes + 1
		st.Changes += a.status.Changes
		a.status = st
		a.mu.Unlock()
	}()
	t, err := topology.Discover(a.env.NetNS)
	if err != nil {
		st.Err = err.Error()
		return
	}
	sp := Sync(t, a.trustNetfilter)
	st.Notes = sp.Notes
	targets := runnable(sp)
	have, err := a.dp.Sync()
	if err != nil {
		st.Err = err.Error()
		return
	}
	want := toSteer(targets)
	if steer.FormatSync(have) != steer.FormatSync(want) {
		err := knobs.Do(a.env.NetNS, func() error { return a.dp.SetSync(want) })
		if err != nil {
			st.Err = err.Error()
			return
		}
		st.Changes = 1
		if a.m != nil {
			a.m.changes.Inc()
		}
	}
	for _, tg := range targets {
		st.Targets = append(st.Targets, fmt.Sprintf("%d/%s -> %s (%s)", tg.VNI, tg.MAC, tg.Veth, tg.Container))
	}
	if a.m != nil {
		a.m.targets.Set(float64(len(targets)))
	}
}

// runnable are the targets the datapath can use now: those whose container
// already polls with NAPI (an agent does not change knobs, so a container
// that came after the apply without GRO waits for the next apply).
func runnable(sp SyncPlan) []SyncTarget {
	var out []SyncTarget
	for _, tg := range sp.Targets {
		if !slices.ContainsFunc(sp.GRO, func(g ContainerGRO) bool { return g.HostVeth == tg.Veth }) {
			out = append(out, tg)
		}
	}
	return out
}
