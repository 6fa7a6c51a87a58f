package prism

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/policy/onpath"
	"github.com/lanesnet/lanes/topology"
)

// SyncAgentName is the plan.Plan.Agent of prism's sync mode.
const SyncAgentName = "prism-sync"

func init() { plan.RegisterAgent(SyncAgentName, newSyncAgent) }

// syncAgent keeps PRISM-sync's destinations true while the host changes:
// containers come and go, the bridge learns and forgets MACs, someone adds
// a filter. A change on the path that may make a destination unsafe
// (netlink notifications: onpath.Watch) withdraws every destination at once;
// the agent then rediscovers the topology and writes the destinations
// that still hold. It does so every Interval in any case (legacy iptables
// sends no notification), and every write gives the destinations a
// deadline a few intervals on (syncTTL): an agent that dies leaves the
// shortcut to close by itself. nftables and IPsec changes void the
// destinations in the datapath already as the kernel announces them,
// before the command that made one returns (steer.Datapath.CountChanges on
// the watch's sockets): a firewall rule does not wait for the agent to read
// of it. It refreshes the bridge's forwarding entries of the remote MACs
// whose frames took the shortcut, as the bridge's own learning would have
// (refreshFDB). It never turns a container's GRO on (agents change maps,
// not knobs): a container that came after the apply and lacks it is left
// to batch mode until the next apply.
type syncAgent struct {
	env      plan.AgentEnv
	interval time.Duration
	dp       *steer.Datapath
	guard    *guard // the overload guard (guard.go); nil without one

	// lastFDB is when refreshFDB last ran (CLOCK_MONOTONIC, as the
	// datapath's seen stamps); bridge and vxlan name the bridge port of
	// each VNI's VXLAN device, for the refresh.
	lastFDB time.Duration
	ports   map[uint32]string
	// idleFailed: a round could not run at SCHED_IDLE (said once).
	idleFailed bool

	mu     sync.Mutex
	status SyncStatus
	// gen counts withdrawals: a round whose reading began before one
	// does not write what it read.
	gen uint64
	m   *syncMetrics
	// applyGen is the generation of the apply the agent works for
	// (knobs.Generation of its journal when it was built): a reset or a
	// newer apply ends it (stale).
	applyGen string
}

// syncTTL is how long the destinations an agent writes hold without it:
// a few of its rounds, and never less than a second.
func syncTTL(interval time.Duration) time.Duration {
	return 3*interval + time.Second
}

// SyncStatus is what `lanes status` shows of a running sync agent.
type SyncStatus struct {
	At        time.Time `json:"at"`
	Targets   []string  `json:"targets"` // "VNI/MAC -> veth (container)"
	Notes     []string  `json:"notes,omitempty"`
	Refreshes uint64    `json:"refreshes"`
	Changes   uint64    `json:"changes"`
	// Withdrawals counts the times a change on the path withdrew every
	// destination at once; Withdrawn says why the last time.
	Withdrawals uint64 `json:"withdrawals,omitempty"`
	Withdrawn   string `json:"withdrawn,omitempty"`
	// Watch says why the agent follows changes by its interval alone
	// ("" while netlink notifications arrive).
	Watch string `json:"watch,omitempty"`
	// Aside: rounds wait while PRISM stands aside (the shortcut unused).
	Aside bool   `json:"aside,omitempty"`
	Err   string `json:"error,omitempty"`
	// Errors counts the rounds that failed; each left the shortcut
	// withdrawn (batch mode for every high-priority flow) until a round
	// could vouch for its destinations again.
	Errors uint64 `json:"errors,omitempty"`
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
	out := []string{fmt.Sprintf("sync destinations (%d refreshes, %d changes, %d failed): %s", s.Refreshes, s.Changes, s.Errors, t)}
	if s.Withdrawals > 0 {
		out = append(out, fmt.Sprintf("withdrawn at once %d times, last: %s", s.Withdrawals, s.Withdrawn))
	}
	if s.Aside {
		out = append(out, "rounds paused: PRISM stands aside, marked frames take the NIC poll, not the shortcut; its destinations lapse and are read again when the queues come back")
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
	if s.Guard != nil {
		out = append(out, s.Guard.Summary()...)
	}
	return out
}

type syncMetrics struct {
	targets     prometheus.Gauge
	changes     prometheus.Counter
	withdrawals prometheus.Counter
	errors      prometheus.Counter
}

// syncAgentOptions are the options of the plan a sync agent serves: the
// journaled settings over prism-sync's base, whatever mode name applied
// it (prism-sync, or prism with prio-mode=sync), since only a sync plan
// names this agent.
func syncAgentOptions(env plan.AgentEnv) (Options, error) {
	base := Defaults()
	base.PrioMode = "sync"
	return Parse(base, env.Params)
}

func newSyncAgent(env plan.AgentEnv) (plan.Agent, error) {
	o, err := syncAgentOptions(env)
	if err != nil {
		return nil, plan.ConfigError{Err: err}
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
	a := &syncAgent{env: env, interval: o.SyncInterval, dp: dp, guard: g}
	a.applyGen = journalGeneration(env.StateDir)
	if env.Metrics != nil {
		a.m = &syncMetrics{
			targets:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_prism_sync_targets", Help: "Destinations PRISM-sync hands high-priority frames to directly."}),
			changes:     prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_prism_sync_changes_total", Help: "Times the sync destinations were rewritten."}),
			withdrawals: prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_prism_sync_withdrawals_total", Help: "Times a change on the shortcut's path withdrew every sync destination at once."}),
			errors:      prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_prism_sync_errors_total", Help: "Rounds of the PRISM-sync agent that failed (the destinations were withdrawn until one succeeded)."}),
		}
		env.Metrics.MustRegister(a.m.targets, a.m.changes, a.m.withdrawals, a.m.errors, steer.NewCollector(plan.PinDir(env.NetNS)))
	}
	return a, nil
}

// Close lets go of the datapath of an agent that is not to run
// (plan.Discard); Run does otherwise. Its guard holds nothing until it
// runs.
func (a *syncAgent) Close() error { return a.dp.Close() }

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

// Run refreshes until ctx ends. The destinations it leaves behind hold
// until their deadline; reset removes them with the datapath.
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
	// Changes are followed beside a round in progress (follow): a
	// withdrawal never waits for a round, which at SCHED_IDLE a busy host
	// may hold back, and a round that read the path before it does not
	// write (gen). changed asks for a round.
	changed := make(chan struct{}, 1)
	if a.guard != nil {
		// The queues are back: read the path at once, the
		// destinations may have lapsed.
		a.guard.whenAsideEnds(func() { askRound(changed) })
	}
	var w *onpath.Watcher
	// watched are the namespaces the path ran through at the last round
	// that read it; w's, where w is set.
	var watched []string
	// Run returns once its followers did: no withdrawal comes from an
	// agent that stopped (its last round's destinations lapse by their
	// deadline, untouched).
	var following sync.WaitGroup
	defer func() {
		if w != nil {
			w.Close()
		}
		following.Wait()
	}()
	tick := time.NewTicker(a.interval)
	defer tick.Stop()
	beat := a.env.Beats.Loop("prism-sync rounds", a.interval)
	defer beat.Stop()
	for skipped := 0; ; {
		if (w == nil || w.Broken() != nil) && watched != nil {
			// None subscribed, or a subscription failed (follow
			// withdrew on it): subscribe again before the round reads
			// the path, which it vouches for only under a live watch.
			w = a.rewatch(ctx, w, watched, changed, &following)
		}
		// A round waits for the CPU at SCHED_IDLE as long as the host
		// is busy: starved, it is not hung (the destinations' deadline
		// closes the shortcut meanwhile), so the loop dozes for it.
		beat.Doze(idleRoundDoze)
		namespaces := a.refreshIdle(w, watched)
		beat.Doze(0)
		// The path runs through other namespaces (the first round, an
		// underlay found late): the round wrote nothing; subscribe
		// there and read the path again at once.
		if len(namespaces) > 0 && !slices.Equal(namespaces, watched) {
			watched = namespaces
			if w = a.rewatch(ctx, w, watched, changed, &following); w != nil {
				askRound(changed)
			}
		}
		// A tick skipped for idleRounds waits for the next event or tick.
		for skip := true; skip; {
			skip = false
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
				aside := a.guard != nil && a.guard.standsAside()
				switch {
				case aside:
					skip = true
				case skipped+1 < idleRounds && a.vouchesForNothing():
					skipped++
					skip = true
				}
				a.setAside(aside)
			case <-changed:
				// Let a burst of changes (a container starting) settle.
				time.Sleep(20 * time.Millisecond)
				select {
				case <-changed:
				default:
				}
			}
			beat.Beat()
			if err := a.stale(); err != nil {
				return err
			}
		}
		skipped = 0
		if w != nil {
			w.SetMACs(a.macs())
		}
	}
}

// stale says (knobs.ErrStale) when the apply the agent works for is gone:
// reset, or applied again. The agent then ends, as the guard and the
// container follower do: what it would write is for a plan that is gone,
// and a restarted agent works for the one there now.
func (a *syncAgent) stale() error {
	if a.env.StateDir == "" {
		return nil
	}
	if g := journalGeneration(a.env.StateDir); g != a.applyGen {
		return fmt.Errorf("prism-sync: %w (journal generation %q, not %q: reset or applied again)", knobs.ErrStale, g, a.applyGen)
	}
	return nil
}

// rewatch ends w (nil: none) and subscribes in namespaces, followed by
// follow; nil where it cannot, which the status says: with no watch
// counting the path's changes, no round writes a destination (refresh),
// and the agent tries again before each round.
func (a *syncAgent) rewatch(ctx context.Context, w *onpath.Watcher, namespaces []string, changed chan<- struct{}, following *sync.WaitGroup) *onpath.Watcher {
	if w != nil {
		w.Close()
	}
	w, err := onpath.Watch(ctx, namespaces, a.dp.CountChanges)
	if err != nil {
		a.setWatch(fmt.Sprintf("%v: no destination until a subscription holds (tried again every %v)", err, a.interval))
		return nil
	}
	a.setWatch("")
	w.SetMACs(a.macs())
	following.Go(func() { a.follow(w, changed) })
	return w
}

// follow handles w's events until it closes: a change that may make a
// destination unsafe withdraws every destination at once, and any change
// asks for a round. A subscription that failed withdraws too, and the
// status says so until the agent's loop has subscribed again.
func (a *syncAgent) follow(w *onpath.Watcher, changed chan<- struct{}) {
	for {
		select {
		case <-w.Done():
			return
		case ev := <-w.Events():
			if ev.Withdraw {
				a.withdraw(ev.Why)
			}
			if err := w.Broken(); err != nil {
				a.setWatch(fmt.Sprintf("%v: subscribing again", err))
			}
			askRound(changed)
		}
	}
}

// askRound asks the agent's loop for a round without waiting: one asked
// and not yet taken covers any number more.
func askRound(changed chan<- struct{}) {
	select {
	case changed <- struct{}{}:
	default:
	}
}

// A round is skipped while the datapath stands PRISM aside: marked
// frames then take the NIC poll, not the shortcut, so there is nothing to
// vouch for, and a round each second is CPU taken, beside the
// applications, on a host too lightly loaded for PRISM to act. The
// destinations lapse by their own deadline meanwhile (the datapath never
// uses one longer than syncTTL after the round that read it), and the
// guard asks for a round as soon as the queues are back (onAsideEnd);
// until it wrote them, marked frames take their queue. A change the
// watcher reports still withdraws them and runs a round.
//
// idleRounds: while the last round succeeded and listed no destination
// (the path allows no shortcut: a netfilter table, an L3 overlay), the
// agent reads the path again every idleRounds intervals, and at once on
// any change it is notified of. Facts read late there can only open the
// shortcut late, never keep it open on a path that changed; and each
// round is CPU taken from the cores the receive path runs on.
const idleRounds = 10

// vouchesForNothing says the last round succeeded and listed no
// destination, with the watch live (without one, the agent subscribes
// again before every round).
func (a *syncAgent) vouchesForNothing() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status.Err == "" && a.status.Watch == "" && len(a.status.Targets) == 0
}

// idleRoundDoze is how long the loop's beat lets a round wait at
// SCHED_IDLE (heartbeat.Beat.Doze): a round still waiting after five of
// them is hung, not starved by a busy host.
const idleRoundDoze = time.Minute

// setAside records in the status whether rounds wait for PRISM to stop
// standing aside.
func (a *syncAgent) setAside(on bool) {
	a.mu.Lock()
	a.status.Aside = on
	a.mu.Unlock()
}

func (a *syncAgent) setWatch(why string) {
	a.mu.Lock()
	a.status.Watch = why
	a.mu.Unlock()
}

// macs are the destination and source MACs the datapath holds now.
func (a *syncAgent) macs() onpath.MACs {
	out := onpath.MACs{Targets: map[string]bool{}, Sources: map[string]bool{}}
	s, err := a.dp.Sync().Get()
	if err != nil {
		return out
	}
	for _, t := range s.Targets {
		out.Targets[t.MAC.String()] = true
	}
	for _, src := range s.Sources {
		out.Sources[src.MAC.String()] = true
	}
	return out
}

// withdraw voids every destination at once. The status lock is held
// across the map write, so no one reads the old targets from the status
// of a datapath that no longer has them.
func (a *syncAgent) withdraw(why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen++
	err := netnsx.Do(a.env.NetNS, a.dp.Sync().Withdraw)
	a.status.Withdrawals++
	a.status.Withdrawn = why
	a.status.Targets = nil
	if err != nil {
		a.status.Err = err.Error()
	}
	if a.m != nil {
		a.m.withdrawals.Inc()
		a.m.targets.Set(0)
	}
	if a.env.Logf != nil {
		a.env.Logf("prism-sync: %s: every destination withdrawn until the path is read again", why)
	}
}

// refreshIdle runs refresh on a SCHED_IDLE thread (its namespace hops
// too: nsx runs them at the caller's policy). A round reads every
// namespace on the path in bursts of CPU, and at normal policy the
// scheduler lets such a burst finish its slice before a woken task gets
// the core: the high-priority service on the receive core waited behind
// it, once a second (docs/prism.md, Sync mode). At SCHED_IDLE any other
// task takes the core at once (in user space; a kernel built without
// preemption first ends the system call). A round starved past the
// destinations' deadline lets them lapse: the shortcut closes (batch
// mode) until the next round, never open on stale facts. Withdrawals on
// a change run beside it at the agent's normal policy (follow), so
// closing is never the part that waits.
func (a *syncAgent) refreshIdle(w *onpath.Watcher, watched []string) (namespaces []string) {
	round := func() {
		if f := testRound.Load(); f != nil {
			(*f)()
		}
		namespaces = a.refresh(w, watched)
	}
	err := kthread.OnThread(unix.SCHED_IDLE, round)
	if err != nil {
		if !a.idleFailed && a.env.Logf != nil {
			a.env.Logf("prism-sync: rounds run at normal scheduling: %v", err)
		}
		a.idleFailed = true
		round()
	}
	return namespaces
}

// testRound, when set, runs at the start of each round, on its thread.
var testRound atomic.Pointer[func()]

// refresh rediscovers the path and writes the destinations that hold,
// with a new deadline; it returns the namespaces the path runs through.
// It writes only under w, subscribed in exactly those namespaces (watched)
// and live before the change count was read: the count voids the
// destinations on a change w's sockets announce, and only from their
// subscription on. Otherwise it withdraws them (the agent subscribes,
// then reads the path again).
func (a *syncAgent) refresh(w *onpath.Watcher, watched []string) (namespaces []string) {
	st := SyncStatus{At: time.Now()}
	defer func() {
		if st.Err != "" {
			// A round that failed vouches for nothing: the shortcut is
			// withdrawn (fail closed) until one succeeds; the agent goes
			// on (a device or namespace gone, a full map, a netlink
			// error are the host changing, not the end).
			if werr := netnsx.Do(a.env.NetNS, a.dp.Sync().Withdraw); werr != nil {
				st.Err += "; withdrawing: " + werr.Error()
			}
			st.Targets = nil
			if a.m != nil {
				a.m.errors.Inc()
				a.m.targets.Set(0)
			}
		}
		a.mu.Lock()
		st.Refreshes = a.status.Refreshes + 1
		st.Changes += a.status.Changes
		st.Errors = a.status.Errors
		if st.Err != "" {
			st.Errors++
		}
		st.Withdrawals, st.Withdrawn, st.Watch, st.Aside = a.status.Withdrawals, a.status.Withdrawn, a.status.Watch, a.status.Aside
		a.status = st
		a.mu.Unlock()
	}()
	a.mu.Lock()
	gen := a.gen
	a.mu.Unlock()
	live := w != nil && w.Broken() == nil
	// The changes counted so far, before the path is read: the datapath
	// takes the destinations only while no other change came (the watch
	// counts them as the kernel announces them: steer.Sync.CountChanges),
	// so a table added while this round reads voids them even if the
	// round did not see it.
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
	namespaces = append(namespaces, t.NetNS)
	for _, v := range t.VXLANs {
		if v.UnderlayNetNS != "unknown" {
			namespaces = append(namespaces, v.UnderlayNetNS)
		}
	}
	if !live || !slices.Equal(namespaces, watched) {
		// Changes here are not all counted: a table added since the
		// count was read would go unseen until a later round.
		if err := netnsx.Do(a.env.NetNS, a.dp.Sync().Withdraw); err != nil {
			st.Err = "withdrawing: " + err.Error()
		}
		if a.m != nil {
			a.m.targets.Set(0)
		}
		return namespaces
	}
	sp := Sync(t, ReadSyncFacts(t))
	st.Notes = sp.Notes
	targets := runnable(sp)
	have, err := a.dp.Sync().Get()
	if err != nil {
		st.Err = err.Error()
		return namespaces
	}
	set := sp.Set()
	set.Targets = toSteer(targets)
	set.Changes = changes
	changed := steer.FormatSyncSet(have) != steer.FormatSyncSet(set)
	// Written every round, changed or not: the write is the renewal. Not
	// where a withdrawal came since the path was read (what it read may
	// be what changed; the change asked for another round), nor where
	// the watch failed since (its withdrawal is on its way), and under
	// the lock a withdrawal takes, so none comes in between.
	a.mu.Lock()
	stale := a.gen != gen || w.Broken() != nil
	if !stale {
		err = netnsx.Do(a.env.NetNS, func() error { return a.dp.Sync().Set(set, syncTTL(a.interval)) })
	}
	a.mu.Unlock()
	if stale {
		return namespaces
	}
	if err != nil {
		st.Err = err.Error()
		return namespaces
	}
	if changed {
		st.Changes = 1
		if a.m != nil {
			a.m.changes.Inc()
		}
	}
	a.ports = map[uint32]string{}
	for _, v := range t.VXLANs {
		a.ports[uint32(v.VNI)] = v.Name
	}
	if err := a.refreshFDB(t.NetNS); err != nil {
		st.Err = err.Error()
	}
	for _, tg := range targets {
		st.Targets = append(st.Targets, fmt.Sprintf("%d/%s -> %s (%s)", tg.VNI, tg.MAC, tg.Veth, tg.Container))
	}
	if a.m != nil {
		a.m.targets.Set(float64(len(targets)))
	}
	return namespaces
}

// refreshFDB does for the bridge what its learning would have done for
// the frames the shortcut took since the last refresh: for each source
// the datapath stamped, it asks the bridge to refresh its forwarding
// entry on the VXLAN port (NTF_USE: br_fdb_update, as on a received
// frame). Without it, the entry would age out while the shortcut carries
// the source's frames, and the bridge would flood the replies to every
// port. (Limiting the shortcut to sources with a static bridge entry was
// the alternative; no overlay daemon writes such entries, so the
// shortcut would never run.)
func (a *syncAgent) refreshFDB(ns string) error {
	srcs, err := a.dp.Sync().Sources()
	if err != nil {
		return err
	}
	since := a.lastFDB
	a.lastFDB = steer.Now()
	var errs []error
	err = netnsx.Do(ns, func() error {
		for _, s := range srcs {
			if s.Seen == 0 || s.Seen < since {
				continue
			}
			port, ok := a.ports[s.VNI]
			if !ok {
				continue
			}
			l, err := netlink.LinkByName(port)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			n := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_REACHABLE,
				Flags: netlink.NTF_USE | netlink.NTF_MASTER, HardwareAddr: s.MAC}
			if err := netlink.NeighSet(n); err != nil {
				errs = append(errs, fmt.Errorf("refreshing the bridge's entry of %s on %s: %w", s.MAC, port, err))
			}
		}
		return nil
	})
	return errors.Join(err, errors.Join(errs...))
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
