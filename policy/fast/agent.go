package fast

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/policy/onpath"
	"github.com/lanesnet/lanes/topology"
)

// agent vouches for the fast path while the host changes. Every round
// (each Interval, and at once after a change it is told of) it reads the
// change count, then the path (PathOf), and writes where the fast path may
// run with a lease a few rounds long under that count: the datapath admits
// and uses entries only until the lease's deadline and while no other
// change was counted, so an agent that died, or a change the agent has not
// read yet, leaves every flow to the kernel's path. It watches every
// namespace on the path (onpath.Watch: links, addresses, routes,
// neighbours and forwarding entries, tc, nftables, IPsec); any change it
// is told of ends the lease and flushes every entry at once, before it
// reads the path again. nftables and IPsec changes void the lease in the
// datapath already as the kernel announces them, before the command that
// made one returns (steer.Datapath.CountChanges on the watch's sockets).
type agent struct {
	env      plan.AgentEnv
	o        Options
	dp       *steer.Datapath
	applyGen string // knobs.Generation of the journal it works for
	m        *metrics
	// asked asks the loop for a round (askRound): a change it was told
	// of, or a path that must be vouched for anew.
	asked chan struct{}

	mu     sync.Mutex
	status Status
	// gen counts withdrawals: a round whose reading began before one
	// does not write what it read.
	gen uint64
}

// Status is what `lanes status` shows of a running fast agent.
type Status struct {
	At      time.Time `json:"at"`
	Veths   []string  `json:"veths"`   // where the fast path may deliver
	Entries int       `json:"entries"` // flows on the fast path at the last round
	// OutVeths are where the fast path out may take frames from, and
	// OutEntries its flows at the last round.
	OutVeths   []string `json:"out_veths,omitempty"`
	OutEntries int      `json:"out_entries,omitempty"`
	Rounds     uint64   `json:"rounds"`
	Notes      []string `json:"notes,omitempty"`
	// Withdrawals counts the changes that ended the lease and flushed
	// every entry at once; Withdrawn says why the last time.
	Withdrawals uint64 `json:"withdrawals,omitempty"`
	Withdrawn   string `json:"withdrawn,omitempty"`
	// Watch says why the agent vouches for nothing ("" while the netlink
	// watch is live).
	Watch  string `json:"watch,omitempty"`
	Err    string `json:"error,omitempty"`
	Errors uint64 `json:"errors,omitempty"`
}

// Summary is what `lanes status` shows of the agent.
func (s Status) Summary() []string {
	to := "nowhere"
	if len(s.Veths) > 0 {
		to = strings.Join(s.Veths, ", ")
	}
	from := "nowhere"
	if len(s.OutVeths) > 0 {
		from = strings.Join(s.OutVeths, ", ")
	}
	out := []string{fmt.Sprintf("fast path (%d rounds, %d failed) to %s: %d flows; out from %s: %d flows", s.Rounds, s.Errors, to, s.Entries, from, s.OutEntries)}
	if s.Withdrawals > 0 {
		out = append(out, fmt.Sprintf("withdrawn at once %d times, last: %s", s.Withdrawals, s.Withdrawn))
	}
	if s.Watch != "" {
		out = append(out, "watch: "+s.Watch)
	}
	for _, n := range s.Notes {
		out = append(out, "note: "+n)
	}
	if s.Err != "" {
		out = append(out, "error: "+s.Err)
	}
	return out
}

type metrics struct {
	entries     prometheus.Gauge
	withdrawals prometheus.Counter
	errors      prometheus.Counter
}

func newAgent(env plan.AgentEnv) (plan.Agent, error) {
	// Beside another mode (Steps), the settings are that mode's and the
	// fast path's are its defaults.
	o := Defaults()
	if env.Mode == Mode {
		var err error
		if o, err = Parse(env.Params); err != nil {
			return nil, plan.ConfigError{Err: err}
		}
	}
	dp, err := steer.Open(plan.PinDir(env.NetNS))
	if err != nil {
		return nil, fmt.Errorf("fast agent: %w (is the fast mode applied? `lanes status` tells)", err)
	}
	a := &agent{env: env, o: o, dp: dp, applyGen: generation(env.StateDir), asked: make(chan struct{}, 1)}
	if env.Metrics != nil {
		a.m = &metrics{
			entries:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_fast_entries", Help: "Flows on the fast path into the container at the fast agent's last round."}),
			withdrawals: prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_fast_withdrawals_total", Help: "Changes on the path that ended the fast path's lease and flushed every entry at once."}),
			errors:      prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_fast_errors_total", Help: "Rounds of the fast agent that failed (the fast path was withdrawn until one succeeded)."}),
		}
		env.Metrics.MustRegister(a.m.entries, a.m.withdrawals, a.m.errors)
		// The datapath's counters, unless the agent of the mode beside
		// it collects them already.
		var dup prometheus.AlreadyRegisteredError
		if err := env.Metrics.Register(steer.NewCollector(plan.PinDir(env.NetNS))); err != nil && !errors.As(err, &dup) {
			dp.Close()
			return nil, err
		}
	}
	return a, nil
}

// Close lets go of the datapath of an agent that is not to run
// (plan.Discard); Run does otherwise.
func (a *agent) Close() error { return a.dp.Close() }

func (a *agent) Status() any {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.status
	s.Veths, s.OutVeths, s.Notes = slices.Clone(s.Veths), slices.Clone(s.OutVeths), slices.Clone(s.Notes)
	return s
}

// Run vouches for the path until ctx ends; then it withdraws the fast
// path and clears it, as the plan left it.
func (a *agent) Run(ctx context.Context) error {
	defer a.dp.Close()
	changed := a.asked
	var w *onpath.Watcher
	// watched are the namespaces the path ran through at the last round
	// that read it: w's, where w is set.
	var watched []string
	var following sync.WaitGroup
	defer func() {
		if w != nil {
			w.Close()
		}
		following.Wait()
		a.withdraw("lanes agent stopped")
		if _, err := a.dp.Fast().SetPath(steer.FastPath{}); err != nil && a.env.Logf != nil {
			a.env.Logf("fast: clearing the path: %v", err)
		}
		if _, err := a.dp.Fast().SetOutPath(steer.FastOutPath{}); err != nil && a.env.Logf != nil {
			a.env.Logf("fast: clearing the path out: %v", err)
		}
	}()
	tick := time.NewTicker(a.o.Interval)
	defer tick.Stop()
	beat := a.env.Beats.Loop("fast rounds", a.o.Interval)
	defer beat.Stop()
	for {
		if (w == nil || w.Broken() != nil) && watched != nil {
			w = a.rewatch(ctx, w, watched, changed, &following)
		}
		namespaces := a.round(w, watched)
		if len(namespaces) > 0 && !slices.Equal(namespaces, watched) {
			// The path runs through other namespaces (the first round):
			// the round vouched for nothing; subscribe there and read the
			// path again at once.
			watched = namespaces
			if w = a.rewatch(ctx, w, watched, changed, &following); w != nil {
				askRound(changed)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-changed:
		}
		beat.Beat()
		if err := a.stale(); err != nil {
			return err
		}
	}
}

// stale says (knobs.ErrStale) when the apply the agent works for is gone:
// reset, or applied again.
func (a *agent) stale() error {
	if a.env.StateDir == "" {
		return nil
	}
	if g := generation(a.env.StateDir); g != a.applyGen {
		return fmt.Errorf("fast: %w (journal generation %q, not %q: reset or applied again)", knobs.ErrStale, g, a.applyGen)
	}
	return nil
}

// generation is the journal's generation in dir ("" if unreadable).
func generation(dir string) string {
	ents, err := knobs.ReadEntries(dir)
	if err != nil {
		return ""
	}
	return knobs.Generation(ents)
}

// rewatch ends w (nil: none) and subscribes in namespaces, followed by
// follow; nil where it cannot, which the status says: with no watch, no
// round vouches for anything.
func (a *agent) rewatch(ctx context.Context, w *onpath.Watcher, namespaces []string, changed chan<- struct{}, following *sync.WaitGroup) *onpath.Watcher {
	if w != nil {
		w.Close()
	}
	w, err := onpath.Watch(ctx, namespaces, a.dp.CountChanges)
	a.mu.Lock()
	a.status.Watch = ""
	if err != nil {
		a.status.Watch = fmt.Sprintf("%v: the fast path stays off until a subscription holds (tried again every %v)", err, a.o.Interval)
	}
	a.mu.Unlock()
	if err != nil {
		if a.env.Logf != nil {
			a.env.Logf("fast: %v: the fast path stays off until a subscription holds", err)
		}
		return nil
	}
	following.Go(func() { a.follow(w, changed) })
	return w
}

// follow handles w's events until it closes: every change on the path
// withdraws the fast path at once and asks for a round.
func (a *agent) follow(w *onpath.Watcher, changed chan<- struct{}) {
	for {
		select {
		case <-w.Done():
			return
		case ev := <-w.Events():
			a.withdraw(ev.Why)
			askRound(changed)
		}
	}
}

// askRound asks the loop for a round without waiting: one asked and not
// yet taken covers any number more.
func askRound(changed chan<- struct{}) {
	select {
	case changed <- struct{}{}:
	default:
	}
}

// withdraw ends the lease and flushes every entry at once, under the lock
// a round writes under, so no round that read the path before writes
// after it (gen).
func (a *agent) withdraw(why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen++
	err := a.dp.Fast().Withdraw()
	a.status.Withdrawals++
	a.status.Withdrawn = why
	a.status.Entries, a.status.OutEntries = 0, 0
	if err != nil {
		a.status.Err = err.Error()
	}
	if a.m != nil {
		a.m.withdrawals.Inc()
		a.m.entries.Set(0)
	}
}

// round reads the path and vouches for what holds; it returns the
// namespaces the path runs through. It vouches only under w, subscribed
// in exactly those namespaces (watched) and live before the change count
// was read; otherwise it withdraws (the loop subscribes, then reads again).
func (a *agent) round(w *onpath.Watcher, watched []string) (namespaces []string) {
	st := Status{At: time.Now()}
	defer a.finish(&st)
	a.mu.Lock()
	gen := a.gen
	a.mu.Unlock()
	live := w != nil && w.Broken() == nil
	changes, err := a.dp.Changes()
	if err != nil {
		st.Err = err.Error()
		return nil
	}
	t, err := topology.DiscoverPath(a.env.NetNS)
	if err != nil {
		st.Err = err.Error()
		return nil
	}
	namespaces = pathNamespaces(t)
	if !live || !slices.Equal(namespaces, watched) {
		if err := a.dp.Fast().Withdraw(); err != nil {
			st.Err = err.Error()
		}
		return namespaces
	}
	p := PathOf(t, onpath.ReadFilters(t))
	st.Notes, st.Veths, st.OutVeths = p.Notes, p.Veths, p.OutVeths
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gen != gen || w.Broken() != nil {
		// A change came since the path was read: it asked for another
		// round, which reads it.
		return namespaces
	}
	if err := a.vouch(p.FastPath, p.Out, changes); err != nil {
		st.Err = err.Error()
	}
	return namespaces
}

// vouch writes the paths both ways and the lease under changes; paths
// other than the last ones (or with nowhere to deliver or send from)
// withdraw everything made on the last ones instead, and ask for a round
// that vouches for the new.
func (a *agent) vouch(path steer.FastPath, out steer.FastOutPath, changes uint64) error {
	f := a.dp.Fast()
	changed, err := f.SetPath(path)
	if err != nil {
		return err
	}
	outChanged, err := f.SetOutPath(out)
	if err != nil {
		return err
	}
	none := len(path.Veths) == 0 && len(out.Veths) == 0
	if changed || outChanged || none {
		// The withdrawal moves the change count on: the paths are read
		// again under the new count, at once, before a lease is given.
		if err := f.Withdraw(); err != nil {
			return err
		}
		if !none {
			askRound(a.asked)
		}
		return nil
	}
	return f.Renew(leaseTTL(a.o.Interval), changes)
}

// finish records a round's status; a round that failed vouches for
// nothing (the fast path is withdrawn until one succeeds).
func (a *agent) finish(st *Status) {
	if st.Err != "" {
		if err := a.dp.Fast().Withdraw(); err != nil {
			st.Err += "; withdrawing: " + err.Error()
		}
		st.Veths, st.OutVeths = nil, nil
		if a.m != nil {
			a.m.errors.Inc()
		}
	}
	if es, err := a.dp.Fast().Entries(); err == nil {
		st.Entries = len(es)
	}
	if es, err := a.dp.Fast().OutEntries(); err == nil {
		st.OutEntries = len(es)
	}
	a.mu.Lock()
	st.Rounds = a.status.Rounds + 1
	st.Errors = a.status.Errors
	if st.Err != "" {
		st.Errors++
	}
	st.Withdrawals, st.Withdrawn, st.Watch = a.status.Withdrawals, a.status.Withdrawn, a.status.Watch
	a.status = *st
	a.mu.Unlock()
	if a.m != nil {
		a.m.entries.Set(float64(st.Entries))
	}
}

// pathNamespaces are the namespaces t's path runs through: t's, and its
// VXLAN devices' underlays'.
func pathNamespaces(t *topology.Topology) []string {
	out := []string{t.NetNS}
	for _, v := range t.VXLANs {
		if v.UnderlayNetNS != "unknown" && !slices.Contains(out, v.UnderlayNetNS) {
			out = append(out, v.UnderlayNetNS)
		}
	}
	return out
}
