package control

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/reorder"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/heartbeat"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/topology"
	"github.com/vishvananda/netlink"
)

// Following containers. A container host starts and stops containers all
// day, and an applied plan covers the ones that were there when it was
// applied. The follower, which lanes agent runs beside every mode's own
// agent, watches the target namespace's links; when one comes or goes it
// plans the mode again for the host as it is now and brings the applied
// plan up to date, for container devices only:
//
//   - A container that appeared gets the plan's changes for its devices,
//     journaled first like every change, in the plan's order: the programs
//     first, then, once frames that passed the hooks before the programs
//     were there are out (drainWait), the RPS maps. Where a steering
//     datapath places the container stage, the host-side veth gets an
//     adoption window first (datapath/steer/bpf/maps.h, steer_adopt): flows already running
//     start where the kernel runs them, counted, and move to the table's
//     core only through the move rule, as every flow did when the plan was
//     applied. Only devices that are up: a runtime names a container's
//     veth while it is down, and knobs are journaled by device name.
//   - A container that went leaves journal entries on devices that are
//     gone: they are restored (which removes their link pins) and taken
//     out of the journal, whatever their kind, so a later device of the
//     same name is adopted afresh and the journal does not grow for ever.
//     Only knobs on devices discovery did not see are read for this.
//   - A device whose knob is journaled but does not hold the plan's value
//     (a container restarted with the same device names between two
//     rounds) gets the plan's value again; the journal keeps the original.
//     The same device (ifindex and peer's) is read once.
//   - Anything else the new plan wants (another VXLAN device or underlay,
//     changes of other kinds on a container: PRISM's queue counts and
//     threaded NAPI, which take a link down and up under running traffic;
//     a new container while the underlay is polled on other cores than at
//     the first round) is not followed, and nothing of that round is
//     applied: status gives the apply command to run again.
//
// A round runs under the state directory's lock, which apply, reset and
// Falcon's parking hold too, and only while the journal is the apply the
// agent started for. While an agent keeps part of its plan off the path
// (plan.AgentStateFile exists: Falcon parked), the follower waits: what it
// adopts must be what the agent parks and unparks.

// drainWait separates a round's programs from its RPS maps: frames that
// passed a new program's hook before it was attached carry a hash of their
// own, which an RPS map would act on (a veth's NAPI ring holds them until
// its next poll). Longer than Falcon's default drain time (20 ms).
const drainWait = 50 * time.Millisecond

// adoptWindow is how long a host-side veth's adoption window stays open
// after its last change (steer_adopt): every flow that ran across the
// adoption has passed a frame by then, or has been idle for longer than
// any queue holds one.
const adoptWindow = time.Second

// followDebounce is how long the follower waits after a link event for
// the ones that follow it (a runtime creates the veth pair, moves one end,
// names, addresses and ups it in quick steps).
const followDebounce = 500 * time.Millisecond

// followRetry is how soon a round that had to wait (a busy state
// directory, Falcon parked) is tried again.
const followRetry = time.Second

// followMaxWait bounds the debounce: under a steady stream of link
// events (a host starting containers back to back) a round still runs
// this long after the first event it has not served.
const followMaxWait = 5 * time.Second

// followCheckEvery is how often the follower lists the namespace's links
// in case it missed an event (a netlink socket that overflowed).
const followCheckEvery = 30 * time.Second

// FollowStatus is what the follower did last, for `lanes status` and
// agent.json.
type FollowStatus struct {
	// Found is how many container interfaces (veths into a container)
	// the last full round found, Steered how many of them the plan
	// changes something on, Covered how many of those carry all their
	// changes.
	Found   int `json:"found"`
	Steered int `json:"steered"`
	Covered int `json:"covered"`
	// Adopted and Dropped are the last few container devices taken in
	// and let go, with the time ("15:04:05 ns/dev").
	Adopted []string `json:"adopted,omitempty"`
	Dropped []string `json:"dropped,omitempty"`
	// Waiting says why the last round did nothing yet (it tries again).
	Waiting string `json:"waiting,omitempty"`
	// Refused says what of the host the follower does not follow: the
	// mode must be applied again to cover it.
	Refused string `json:"refused,omitempty"`
	// Err is the last round's failure.
	Err    string    `json:"err,omitempty"`
	Rounds int       `json:"rounds"`
	At     time.Time `json:"at,omitzero"`
}

// Summary is the status in lines for `lanes status`.
func (s FollowStatus) Summary() []string {
	line := fmt.Sprintf("containers: %d of the %d interfaces the plan steers are covered (%d found)", s.Covered, s.Steered, s.Found)
	if s.Steered == 0 {
		line = fmt.Sprintf("containers: the plan changes nothing on containers (%d interfaces found)", s.Found)
	}
	if len(s.Adopted) > 0 {
		line += "; adopted since apply: " + strings.Join(s.Adopted, ", ")
	}
	if len(s.Dropped) > 0 {
		line += "; let go: " + strings.Join(s.Dropped, ", ")
	}
	out := []string{line}
	if s.Waiting != "" {
		out = append(out, "containers: waiting: "+s.Waiting)
	}
	if s.Refused != "" {
		out = append(out, "containers: NOT FOLLOWED: "+s.Refused)
	}
	if s.Err != "" {
		out = append(out, "containers: error: "+s.Err)
	}
	return out
}

// follower keeps one target's applied plan covering its containers.
type follower struct {
	netns, dir string // target namespace and state directory
	mode       string
	planner    plan.Planner
	cfg        plan.Config
	gen        string // the apply followed (knobs.Generation)
	apply      string // the command that applies the followed plan again
	logf       func(string, ...any)

	// irq is the underlay's NAPI cores (plan.IRQCPUs) at the first round:
	// the running datapath placed stages for them, and what the plan
	// gives a new container is only right while they hold (irqSet).
	irq    []int
	irqSet bool
	// verified are container devices (label -> containerDevs.ident)
	// whose journaled knobs held the plan's values at a round: the same
	// pair of devices is not read again.
	verified map[string]string
	// seen are the container devices' idents (label -> ident) when their
	// journal entries were last settled: a label present with another
	// ident is a device replaced under the same name between two rounds.
	// Kept in the state dir (DevicesFile, written by apply and after each
	// round that changed it), so a replacement while no agent ran is seen
	// by the next one.
	seen map[string]string
	// over: the apply followed is gone (errNotOurs); Run stops.
	over bool
	// beats is where Run beats (nil: nowhere).
	beats *heartbeat.Board

	mu     sync.Mutex
	status FollowStatus
}

// newFollower follows the apply described by st in dir.
func newFollower(st *State, dir string, logf func(string, ...any)) (*follower, error) {
	p, err := plan.Lookup(st.Mode)
	if err != nil {
		return nil, err
	}
	cpus, err := cpuset.ParseList(st.CPUs)
	if err != nil {
		return nil, fmt.Errorf("state file %s: cpus: %w", dir, err)
	}
	online, err := cpuset.Online()
	if err != nil {
		return nil, err
	}
	ents, err := knobs.ReadEntries(dir)
	if err != nil {
		return nil, err
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	f := &follower{netns: st.NetNS, dir: dir, mode: st.Mode, planner: p,
		cfg: plan.Config{CPUs: cpus, Online: online, Params: st.Params}, gen: knobs.Generation(ents),
		apply: applyCommand(st, filepath.Dir(dir)), verified: map[string]string{}, seen: map[string]string{}, logf: logf}
	// The devices as the last apply or round settled them; a state dir
	// from an older build has none, and the first round's view stands in.
	// Only the file of the apply this follower follows: one read while a
	// re-apply was under way may be the previous apply's.
	devs, err := readJSONFile[deviceIdents](filepath.Join(dir, DevicesFile))
	if err != nil {
		return nil, err
	}
	if devs != nil && devs.Generation == f.gen {
		maps.Copy(f.seen, devs.Idents)
	}
	// The IRQ cores the plan was made for; a state file from an older
	// build lacks them, and the first round's view stands in.
	if st.IRQCPUs != nil {
		f.irq, f.irqSet = st.IRQCPUs, true
	}
	return f, nil
}

// applyCommand is the lanes apply command line that applies st's plan
// again (the same mode, namespace, cores and settings).
func applyCommand(st *State, stateDir string) string {
	args := []string{"lanes apply --mode " + shellQuote(st.Mode)}
	if st.NetNS != "" {
		args = append(args, "--netns "+shellQuote(st.NetNS))
	}
	if st.CPUs != "" {
		args = append(args, "--cpus "+shellQuote(st.CPUs))
	}
	keys := make([]string, 0, len(st.Params))
	for k := range st.Params {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		args = append(args, "--set "+shellQuote(k+"="+st.Params[k]))
	}
	if stateDir != DefaultStateDir {
		args = append(args, "--state-dir "+shellQuote(stateDir))
	}
	return strings.Join(args, " ")
}

// shellQuote leaves a word the shell takes as it is alone and single-quotes
// any other, so the command can be pasted as printed (a netns path with a
// space, a value with a quote).
func shellQuote(w string) string {
	safe := w != ""
	for _, r := range w {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./:,=@%+", r)) {
			safe = false
			break
		}
	}
	if safe {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}

// Status is a copy of the follower's status.
func (f *follower) Status() FollowStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.status
	s.Adopted, s.Dropped = slices.Clone(s.Adopted), slices.Clone(s.Dropped)
	return s
}

// Run follows until ctx ends: a round at once, then one after each burst
// of link events in the target namespace, and one whenever the list of
// its links changed without an event reaching it.
func (f *follower) Run(ctx context.Context) {
	beat := f.beats.Loop("container follower", followCheckEvery)
	defer beat.Stop()
	events, stop := f.subscribe(ctx)
	defer func() { stop() }()
	check := time.NewTicker(followCheckEvery)
	defer check.Stop()
	var debounce, retry <-chan time.Time
	var since time.Time // the first event not yet served by a round
	wait := func() {
		if since.IsZero() {
			since = time.Now()
		}
		debounce = time.After(min(followDebounce, max(0, followMaxWait-time.Since(since))))
	}
	links := f.linkSet()
	// The first round can find the state dir busy or Falcon parked like
	// any other: then it is tried again too, or containers that were
	// there before the agent started would wait for an unrelated link
	// event.
	if f.round() {
		retry = time.After(followRetry)
	}
	for ; !f.over; beat.Beat() {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-events:
			if !ok {
				// The subscription broke (its socket overflowed):
				// let go of it, subscribe again and look.
				stop()
				events, stop = f.subscribe(ctx)
			}
			wait()
		case <-check.C:
			if now := f.linkSet(); now != links {
				debounce = time.After(0)
			}
		case <-debounce:
			debounce, retry, since = nil, nil, time.Time{}
			links = f.linkSet()
			if f.round() {
				retry = time.After(followRetry)
			}
		case <-retry:
			// While the agent is parked, a look at its file only:
			// the round that waited reported what it found.
			retry = time.After(followRetry)
			if !f.parked() {
				debounce = time.After(0)
			}
		}
	}
}

// subscribe reports link events of the target namespace; nil (never
// ready) when it cannot subscribe, and then the periodic check follows.
// stop ends the subscription (its socket and goroutine); it is also
// ended with ctx.
func (f *follower) subscribe(ctx context.Context) (_ <-chan netlink.LinkUpdate, stop func()) {
	noop := func() {}
	ns, err := netnsx.Open(f.netns)
	if err != nil {
		f.logf("containers: cannot watch links of netns %s (%v): looking every %v instead", label(f.netns), err, followCheckEvery)
		return nil, noop
	}
	defer ns.Close() // the subscription keeps its own socket in the namespace
	ch := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	var once sync.Once
	stop = func() { once.Do(func() { close(done) }) }
	go func() {
		select {
		case <-ctx.Done():
			stop()
		case <-done:
		}
	}()
	if err := netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{Namespace: &ns}); err != nil {
		stop()
		f.logf("containers: cannot watch links of netns %s (%v): looking every %v instead", label(f.netns), err, followCheckEvery)
		return nil, noop
	}
	return ch, stop
}

// linkSet names the target namespace's links ("" if it cannot list them).
func (f *follower) linkSet() string {
	var names []string
	_ = netnsx.Do(f.netns, func() error {
		ls, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range ls {
			names = append(names, fmt.Sprintf("%d:%s", l.Attrs().Index, l.Attrs().Name))
		}
		return nil
	})
	slices.Sort(names)
	return strings.Join(names, " ")
}

// errNotOurs: the journal is no longer the apply this follower works for.
var errNotOurs = errors.New("the target was reset or applied again since this agent started, so its plan is gone: stop this lanes agent (and start one again after the next lanes apply)")

// round brings the applied plan up to date once and records what it did;
// true if it must be tried again soon (it waited for the lock or for
// Falcon to unpark; a device that is down brings a link event when it
// comes up).
func (f *follower) round() (again bool) {
	res, err := f.once()
	again = res.again
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &f.status
	s.Rounds++
	s.At = time.Now()
	s.Waiting, s.Err = res.waiting, ""
	if err != nil {
		s.Err = err.Error()
		if errors.Is(err, errNotOurs) {
			// Nothing left to follow; said once.
			if !f.over {
				f.logf("containers: %v", err)
			}
			f.over = true
			return
		}
		f.logf("containers: %v", err)
		return
	}
	if res.refused != s.Refused && res.refused != "" {
		f.logf("containers: not followed: %s", res.refused)
	}
	s.Refused = res.refused
	if res.found >= 0 {
		s.Found, s.Steered, s.Covered = res.found, res.steered, res.covered
	}
	stamp := time.Now().Format("15:04:05")
	// Let go of first, as the round did: a device replaced under the
	// same name is let go of, then adopted.
	for _, d := range res.dropped {
		why := "gone"
		if res.replaced[d] {
			why = "replaced by another device of that name"
		}
		f.logf("containers: let go of %s (%s)", d, why)
		s.Dropped = lastFew(append(s.Dropped, stamp+" "+d))
	}
	for _, d := range res.adopted {
		f.logf("containers: adopted %s", d)
		s.Adopted = lastFew(append(s.Adopted, stamp+" "+d))
	}
	return again
}

func lastFew(s []string) []string {
	if len(s) > 8 {
		return s[len(s)-8:]
	}
	return s
}

const waitParked = "the agent has part of the plan off the path (Falcon parked): containers are adopted once it is back"

// parked: the agent keeps part of its plan off the path (plan.AgentStateFile).
func (f *follower) parked() bool {
	_, err := os.Stat(filepath.Join(f.dir, plan.AgentStateFile))
	return err == nil
}

// roundResult is what one round found and did.
type roundResult struct {
	// FollowStatus's Found, Steered, Covered; found -1: not known.
	found, steered, covered int
	adopted, dropped        []string
	replaced                map[string]bool // of dropped: replaced under the same name
	waiting, refused        string
	again                   bool // try again in followRetry
}

// once is one round: plan, compare with the journal, change.
func (f *follower) once() (roundResult, error) {
	res := roundResult{found: -1}
	topo, err := topology.Discover(f.netns)
	if err != nil {
		return res, fmt.Errorf("discovering netns %s: %w", label(f.netns), err)
	}
	p, err := f.planner.Plan(topo, f.cfg)
	if err != nil {
		return res, fmt.Errorf("planning %s for the host as it is now: %w (fix the host, or run %s)", f.mode, err, f.apply)
	}
	devs := containerDevices(topo)
	present := deviceLabels(topo)
	irq := plan.IRQCPUsFor(topo, f.cfg.Params)

	// OpenExisting, not Open, whose MkdirAll would bring back the
	// directory a reset removed.
	j, err := knobs.OpenExisting(f.dir, Target(f.netns))
	if errors.Is(err, os.ErrNotExist) {
		return res, errNotOurs
	}
	if errors.Is(err, knobs.ErrBusy) {
		res.waiting = "the state directory is busy (apply, reset or parking): next round"
		res.again = true
		return res, nil
	}
	if err != nil {
		return res, err
	}
	defer j.Close()
	ents := j.Entries()
	if g := knobs.Generation(ents); g == "" || g != f.gen {
		return res, errNotOurs
	}
	if !f.irqSet {
		f.irq, f.irqSet = irq, true
	}
	// The knobs of devices that are gone: any knob on a device discovery
	// no longer sees is read, and let go of if its device is gone (a
	// device discovery sees is not read: a host with hundreds of
	// containers would pay a namespace switch per knob per round).
	var goneKeys, replacedKeys []string
	gone, releaseKeys := map[string]bool{}, map[string]bool{}
	// What the plan wants that the journal does not hold (or holds for a
	// device that is gone), or holds with another value now (a device of
	// the same name, started again).
	journaled := map[string]bool{}
	for i, e := range ents {
		journaled[e.Key] = true
		if i == 0 {
			continue
		}
		k, err := e.Decode()
		if err != nil {
			continue
		}
		dev, ok := entryDevice(k)
		if !ok {
			continue
		}
		if replacedDevice(f.seen, devs.ident, dev) {
			if res.replaced == nil {
				res.replaced = map[string]bool{}
			}
			res.replaced[dev] = true
			// Its entries are the old device's: dropped without writing
			// the old originals onto the new device (only lanes' link
			// pins are released), and the new one is taken in afresh; a
			// knob the follower does not set is then refused, not
			// counted as covered.
			replacedKeys = append(replacedKeys, e.Key)
			switch k.(type) {
			case *attach.TCX, *attach.XDP:
				// A link's restore releases its pin and writes
				// nothing onto the device.
				releaseKeys[e.Key] = true
			}
			gone[dev] = true
			journaled[e.Key] = false
			continue
		}
		if present[dev] {
			continue
		}
		if _, err := k.Read(); errors.Is(err, knobs.ErrGone) {
			goneKeys = append(goneKeys, e.Key)
			gone[dev] = true
			journaled[e.Key] = false
		}
	}
	// Parked, the journaled knobs are off the path on purpose: only
	// what the journal lacks is pending then.
	parked := f.parked()
	var todo []plan.Change
	var beyond, down []string
	downIfaces := map[string]bool{}
	newDevs := map[string]bool{}
	steered, pending, differs, unread := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, c := range p.Changes {
		dev, onContainer := devs.of(c)
		if onContainer {
			steered[devs.iface[dev]] = true
		}
		// A journal written by an older build holds pid:N for pid:N@C,
		// and a tcx hook's key without its link: the same knob (its
		// entries enter unchecked).
		if key := c.Knob.Key(); journaled[key] || (key != knobs.OlderKey(key) && journaled[knobs.OlderKey(key)]) {
			if parked || !onContainer || !followableKnob(c.Knob) {
				continue
			}
			if id := devs.ident[dev]; id != "" && f.verified[dev] == id {
				continue
			}
			cur, err := c.Knob.Read()
			if err != nil {
				unread[dev] = true // not verified: read again next round
				continue
			}
			if sameValue(c.Knob, cur, c.Value) {
				continue
			}
			differs[dev] = true
		} else if !onContainer || !followableKnob(c.Knob) {
			beyond = append(beyond, c.Target)
			if onContainer {
				pending[devs.iface[dev]] = true
			}
			continue
		}
		// Only a device that is up: a runtime names and moves a
		// container's veth while it is down (the kernel renames no
		// device that is up), and lanes keys its knobs by name.
		if !devs.up[dev] {
			if !slices.Contains(down, dev) {
				down = append(down, dev)
			}
			pending[devs.iface[dev]] = true
			downIfaces[devs.iface[dev]] = true
			continue
		}
		todo = append(todo, c)
		newDevs[dev] = true
		pending[devs.iface[dev]] = true
	}
	res.found, res.steered, res.covered = len(devs.ifaces), len(steered), len(steered)-len(pending)
	if parked {
		res.waiting, res.again = waitParked, true
		return res, nil
	}
	if len(replacedKeys) > 0 {
		if _, err := j.Drop(replacedKeys, releaseKeys); err != nil {
			return res, fmt.Errorf("letting go of devices replaced under the same name: %w", err)
		}
	}
	if len(goneKeys) > 0 {
		if _, err := j.Forget(goneKeys); err != nil {
			return res, fmt.Errorf("letting go of devices that are gone: %w", err)
		}
	}
	if len(gone) > 0 {
		for d := range gone {
			res.dropped = append(res.dropped, d)
			delete(f.verified, d)
		}
		slices.Sort(res.dropped)
	}
	// The journal is settled against the devices as they are now.
	if !maps.Equal(f.seen, devs.ident) {
		clear(f.seen)
		maps.Copy(f.seen, devs.ident)
		if err := writeDevices(f.dir, f.gen, f.seen); err != nil {
			return res, err
		}
	}
	if len(beyond) > 0 {
		res.refused = fmt.Sprintf("the plan for the host as it is now changes %s, which lanes does not change under a running plan: run %s, then restart lanes agent", listSome(beyond), f.apply)
		return res, nil
	}
	if len(todo) > 0 && !slices.Equal(irq, f.irq) {
		res.refused = fmt.Sprintf("the underlay's NIC is polled on cpus %s now, on %s when the running plan was made, which placed its stages for those: run %s, then restart lanes agent",
			cpuList(irq), cpuList(f.irq), f.apply)
		return res, nil
	}
	// What is verified now: every container device whose journaled
	// knobs were read and hold the plan's values; devices no longer
	// there are forgotten (container churn must not grow the map).
	for dev := range f.verified {
		if _, ok := devs.ident[dev]; !ok {
			delete(f.verified, dev)
		}
	}
	for dev, id := range devs.ident {
		if !newDevs[dev] && !differs[dev] && !unread[dev] && devs.up[dev] {
			f.verified[dev] = id
		}
	}
	if len(down) > 0 {
		slices.Sort(down)
		res.waiting = "waiting for " + listSome(down) + " to come up (a runtime names a container's device while it is down)"
	}
	if len(todo) == 0 {
		return res, nil
	}
	if err := f.adopt(j, todo, devs); err != nil {
		return res, err
	}
	res.covered = res.steered - len(downIfaces)
	for d := range newDevs {
		res.adopted = append(res.adopted, d)
		f.verified[d] = devs.ident[d]
	}
	slices.Sort(res.adopted)
	return res, nil
}

// listSome lists up to three items, and how many more there are: a host
// with hundreds of containers gets a line, not a page.
func listSome(items []string) string {
	if len(items) <= 3 {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:3], ", "), len(items)-3)
}

func cpuList(cpus []int) string {
	if len(cpus) == 0 {
		return "(unknown)"
	}
	return cpuset.FormatList(cpus)
}

// adopt applies changes on container devices: programs, then after
// drainWait the rest, the host-side veths' adoption windows open around
// both. A failure restores what this round changed.
func (f *follower) adopt(j *knobs.Journal, todo []plan.Change, devs containerDevs) error {
	var dp *steer.Datapath
	if dir := plan.PinDir(f.netns); steer.Pinned(dir) {
		var err error
		if dp, err = steer.OpenAdopt(dir); err != nil {
			return err
		}
		defer dp.Close()
	}
	var windows []int
	for _, c := range todo {
		if t, ok := c.Knob.(*attach.TCX); ok && dp != nil {
			if idx := devs.hostIndex(t.NetNS, t.Device); idx > 0 {
				windows = append(windows, idx)
			}
		}
	}
	open := func(d time.Duration) error {
		if len(windows) == 0 {
			return nil
		}
		return dp.Order().SetAdopting(d, windows...)
	}
	// Open until the maps are on; closed adoptWindow after.
	if err := open(time.Hour); err != nil {
		return err
	}
	var done []string
	undo := func(err error) error {
		// The windows close soon too: nothing this round attached stays.
		_ = open(adoptWindow)
		if _, uerr := j.Forget(done); uerr != nil {
			return fmt.Errorf("%w; and restoring this round's changes: %v (lanes reset restores what is left)", err, uerr)
		}
		return fmt.Errorf("%w (nothing of this round stays; the next link event tries again, or run %s)", err, f.apply)
	}
	journaled := map[string]bool{}
	entries := j.Entries()
	for _, e := range entries {
		journaled[e.Key] = true
	}
	set := func(c plan.Change) error {
		// Counted before the write: a Set that journaled the knob and
		// then failed to write it (or wrote part of it) is undone too.
		if !journaled[c.Knob.Key()] {
			done = append(done, c.Knob.Key())
		}
		var err error
		if orig := defaultMaskOriginal(entries, c.Knob); orig != nil {
			err = j.SetFrom(c.Knob, c.Value, orig)
		} else {
			err = j.Set(c.Knob, c.Value)
		}
		if err != nil {
			return undo(fmt.Errorf("adopting %s: %w", c.Target, err))
		}
		return nil
	}
	progs := 0
	for _, c := range todo {
		if c.Knob.Kind() == attach.KindTCX {
			if err := set(c); err != nil {
				return err
			}
			progs++
		}
	}
	if progs > 0 && progs < len(todo) {
		time.Sleep(drainWait)
	}
	for _, c := range todo {
		if c.Knob.Kind() != attach.KindTCX {
			if err := set(c); err != nil {
				return err
			}
		}
	}
	return open(adoptWindow)
}

// defaultMaskOriginal is what an RPS map would hold without lanes when the
// kernel filled it from lanes' net.core.rps_default_mask: a device made
// while the plan's default mask is set starts with that map, and
// journaling it as the device's original would leave lanes' map behind
// at reset. So when k is an RPS map holding exactly the mask lanes wrote
// as the default, its original is the default's original; nil otherwise.
func defaultMaskOriginal(entries []knobs.Entry, k knobs.Knob) []byte {
	f, ok := k.(*knobs.SysfsFile)
	if !ok || !strings.HasSuffix(f.Path, "/rps_cpus") {
		return nil
	}
	cur, err := f.Read()
	if err != nil {
		return nil
	}
	have, err := cpuset.ParseMask(string(cur))
	if err != nil {
		return nil
	}
	kind := knobs.Sysctl("", defaultMaskSysctl).Kind()
	for _, e := range entries {
		if e.Kind != kind || !strings.HasSuffix(e.Key, "/"+strings.ReplaceAll(defaultMaskSysctl, ".", "/")) || e.Wrote == nil {
			continue
		}
		if wrote, err := cpuset.ParseMask(string(e.Wrote)); err == nil && slices.Equal(wrote, have) {
			return e.Original
		}
	}
	return nil
}

const defaultMaskSysctl = "net.core.rps_default_mask"

// followableKnob: the knobs the follower sets and lets go of on
// container devices. TCX programs and RPS maps change no device state a
// running flow depends on beyond its placement, which the datapath's
// counts and the adoption window keep in order.
func followableKnob(k knobs.Knob) bool {
	switch k := k.(type) {
	case *attach.TCX, *reorder.QdiscKnob:
		return true
	case *knobs.SysfsFile:
		return strings.HasPrefix(k.Path, "/sys/class/net/") &&
			(strings.HasSuffix(k.Path, "/rps_cpus") || strings.HasSuffix(k.Path, "/rps_flow_cnt"))
	}
	return false
}

// sameValue compares a knob's value as read with a plan's value: RPS maps
// as CPU sets (sysfs pads them), the rest as trimmed text.
func sameValue(k knobs.Knob, cur, want []byte) bool {
	if s, ok := k.(*knobs.SysfsFile); ok && strings.HasSuffix(s.Path, "/rps_cpus") {
		a, err1 := cpuset.ParseMask(string(cur))
		b, err2 := cpuset.ParseMask(string(want))
		return err1 == nil && err2 == nil && slices.Equal(a, b)
	}
	return strings.TrimSpace(string(cur)) == strings.TrimSpace(string(want))
}

// containerDevs are the devices of a topology's containers: both ends of
// every veth into a container, by label (plan.DevLabel), with the host
// side's ifindex.
type containerDevs struct {
	hostIdx map[string]int    // host-side veth label -> ifindex
	ifaces  []string          // container-side interface labels
	iface   map[string]string // either end's label -> the container side's
	up      map[string]bool   // either end's label -> administratively up
	// ident tells one instance of a device from a later one of the same
	// name: its ifindex and its peer's. The host-side end is made anew in
	// the host's namespace with every container, so its ifindex changes
	// even where the container side's does not.
	ident map[string]string
}

func containerDevices(t *topology.Topology) containerDevs {
	d := containerDevs{hostIdx: map[string]int{}, iface: map[string]string{}, up: map[string]bool{}, ident: map[string]string{}}
	for _, v := range t.Veths {
		if v.PeerNetNS == "" || v.PeerNetNS == "unknown" {
			continue
		}
		l := plan.DevLabel(v.NetNS, v.Name)
		d.hostIdx[l] = v.Index
		d.iface[l] = plan.DevLabel(v.PeerNetNS, v.PeerName)
		d.up[l] = v.Up
		d.ident[l] = fmt.Sprintf("%d/%d", v.Index, v.PeerIndex)
	}
	for _, c := range t.Containers {
		for _, ifc := range c.Interfaces {
			if ifc.HostVeth == "" {
				continue
			}
			l := plan.DevLabel(ifc.NetNS, ifc.Name)
			d.ifaces = append(d.ifaces, l)
			d.iface[l] = l
			d.up[l] = ifc.Up
			d.ident[l] = fmt.Sprintf("%d/%d", ifc.Index, d.hostIdx[plan.DevLabel(t.NetNS, ifc.HostVeth)])
		}
	}
	return d
}

// deviceLabels are the labels (plan.DevLabel) of every device discovery
// saw.
func deviceLabels(t *topology.Topology) map[string]bool {
	out := map[string]bool{}
	add := func(d topology.Device) { out[plan.DevLabel(d.NetNS, d.Name)] = true }
	for _, d := range t.Underlays {
		add(d)
	}
	for _, v := range t.VXLANs {
		add(v.Device)
	}
	for _, b := range t.Bridges {
		add(b.Device)
	}
	for _, v := range t.Veths {
		add(v.Device)
	}
	for _, c := range t.Containers {
		for _, ifc := range c.Interfaces {
			add(ifc.Device)
		}
	}
	return out
}

// entryDevice names the device a journaled knob lives on ("ns/dev"); false
// for knobs that live on no device (sysctls, kernel threads of no device).
func entryDevice(k knobs.Knob) (string, bool) {
	switch k := k.(type) {
	case *attach.TCX:
		return plan.DevLabel(k.NetNS, k.Device), true
	case *attach.XDP:
		return plan.DevLabel(k.NetNS, k.Device), true
	case *reorder.QdiscKnob:
		return plan.DevLabel(k.NetNS, k.Device), true
	case *knobs.SysfsFile:
		rest, ok := strings.CutPrefix(k.Path, "/sys/class/net/")
		if !ok {
			return "", false
		}
		dev, _, _ := strings.Cut(rest, "/")
		return plan.DevLabel(k.NetNS, dev), true
	case *knobs.DeviceFeature:
		return plan.DevLabel(k.NetNS, k.Device), true
	case *knobs.DeviceFeatures:
		return plan.DevLabel(k.NetNS, k.Device), true
	case *knobs.DeviceChannels:
		return plan.DevLabel(k.NetNS, k.Device), true
	case *knobs.KthreadAffinity:
		if k.NAPI != nil {
			return plan.DevLabel(k.NAPI.NetNS, k.NAPI.Device), true
		}
	case *knobs.KthreadSched:
		if k.NAPI != nil {
			return plan.DevLabel(k.NAPI.NetNS, k.NAPI.Device), true
		}
	}
	return "", false
}

// of finds the container device a change is on by its Target (see
// plan.Change): the device's label, alone or followed by a space and what
// on it. One map lookup per word boundary, longest first, so veth1 is not
// veth10 and a round costs no more than the changes it plans.
func (d containerDevs) of(c plan.Change) (string, bool) {
	t := c.Target
	for {
		if _, ok := d.iface[t]; ok {
			return t, true
		}
		i := strings.LastIndexByte(t, ' ')
		if i < 0 {
			return "", false
		}
		t = t[:i]
	}
}

// hostIndex is the ifindex of a host-side veth, 0 if it is not one.
func (d containerDevs) hostIndex(ns, dev string) int { return d.hostIdx[plan.DevLabel(ns, dev)] }

// DevicesFile keeps, in a target's state dir, the idents of the container
// devices (label -> "ifindex/peer ifindex") whose journal entries the last
// apply or follower round settled, so that a follower started later tells
// a device replaced under the same name meanwhile from the one journaled.
const DevicesFile = "devices.json"

// deviceIdents is the devices file: the idents, and the journal
// generation (knobs.Generation) of the apply they belong to.
type deviceIdents struct {
	Generation string            `json:"generation"`
	Idents     map[string]string `json:"idents"`
}

// writeDevices replaces the devices file atomically.
func writeDevices(dir, gen string, idents map[string]string) error {
	return writeJSONFile(filepath.Join(dir, DevicesFile), deviceIdents{Generation: gen, Idents: idents}, "the container devices' idents")
}

// replacedDevice: dev was seen with one ident when its journal entries
// were settled and is there now with another, so it is another device
// under the same name (a container removed and started again between
// two rounds).
func replacedDevice(seen, now map[string]string, dev string) bool {
	was, cur := seen[dev], now[dev]
	return was != "" && cur != "" && was != cur
}
