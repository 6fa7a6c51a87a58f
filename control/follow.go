package control

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/topology"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
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
//     adoption window first (steer.c, steer_adopt): flows already running
//     start where the kernel runs them, counted, and move to the table's
//     core only through the move rule, as every flow did when the plan was
//     applied.
//   - A container that went leaves journal entries on devices that are
//     gone: they are restored (which removes their link pins) and taken
//     out of the journal, so a later device of the same name is adopted
//     afresh and the journal does not grow for ever.
//   - A device whose knob is journaled but does not hold the plan's value
//     (a container restarted with the same device names between two
//     rounds) gets the plan's value again; the journal keeps the original.
//   - Anything else the new plan wants (another VXLAN device or underlay,
//     changes of other kinds on a container: PRISM's queue counts and
//     threaded NAPI, which take a link down and up under running traffic)
//     is not followed, and nothing of that round is applied: status says
//     to apply the mode again.
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
	logf       func(string, ...any)

	mu     sync.Mutex
	status FollowStatus
}

// newFollower follows the apply described by st in dir.
func newFollower(st *State, dir string, logf func(string, ...any)) (*follower, error) {
	p, err := plan.Lookup(st.Mode)
	if err != nil {
		return nil, err
	}
	cpus, err := knobs.ParseCPUList(st.CPUs)
	if err != nil {
		return nil, fmt.Errorf("state file %s: cpus: %w", dir, err)
	}
	online, err := knobs.OnlineCPUs()
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
	return &follower{netns: st.NetNS, dir: dir, mode: st.Mode, planner: p,
		cfg: plan.Config{CPUs: cpus, Online: online, Params: st.Params}, gen: knobs.Generation(ents), logf: logf}, nil
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
	events := f.subscribe(ctx)
	check := time.NewTicker(followCheckEvery)
	defer check.Stop()
	var debounce, retry <-chan time.Time
	links := f.linkSet()
	f.round()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-events:
			if !ok {
				// The subscription broke (its socket overflowed):
				// subscribe again and look.
				events = f.subscribe(ctx)
				debounce = time.After(followDebounce)
				continue
			}
			debounce = time.After(followDebounce)
		case <-check.C:
			if now := f.linkSet(); now != links {
				debounce = time.After(0)
			}
		case <-debounce:
			debounce, retry = nil, nil
			links = f.linkSet()
			f.round()
			if f.Status().Waiting != "" {
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
func (f *follower) subscribe(ctx context.Context) <-chan netlink.LinkUpdate {
	var ns netns.NsHandle
	var err error
	if p := knobs.NetNSPath(f.netns); p == "" {
		ns, err = netns.Get()
	} else {
		ns, err = netns.GetFromPath(p)
	}
	if err != nil {
		f.logf("containers: cannot watch links of netns %s (%v): looking every %v instead", label(f.netns), err, followCheckEvery)
		return nil
	}
	defer ns.Close() // the subscription keeps its own socket in the namespace
	ch := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	go func() { <-ctx.Done(); close(done) }()
	if err := netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{Namespace: &ns}); err != nil {
		f.logf("containers: cannot watch links of netns %s (%v): looking every %v instead", label(f.netns), err, followCheckEvery)
		return nil
	}
	return ch
}

// linkSet names the target namespace's links ("" if it cannot list them).
func (f *follower) linkSet() string {
	var names []string
	_ = knobs.Do(f.netns, func() error {
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
var errNotOurs = errors.New("the target was reset or applied again: this agent's plan is gone")

// round brings the applied plan up to date once and records what it did.
func (f *follower) round() {
	res, err := f.once()
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &f.status
	s.Rounds++
	s.At = time.Now()
	s.Waiting, s.Err = res.waiting, ""
	if err != nil {
		if s.Err = err.Error(); !errors.Is(err, errNotOurs) {
			f.logf("containers: %v", err)
		}
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
	for _, d := range res.adopted {
		f.logf("containers: adopted %s", d)
		s.Adopted = lastFew(append(s.Adopted, stamp+" "+d))
	}
	for _, d := range res.dropped {
		f.logf("containers: let go of %s (gone)", d)
		s.Dropped = lastFew(append(s.Dropped, stamp+" "+d))
	}
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
	waiting, refused        string
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
		return res, fmt.Errorf("planning %s for the host as it is now: %w", f.mode, err)
	}
	devs := containerDevices(topo)

	j, err := knobs.Open(f.dir, Target(f.netns))
	if errors.Is(err, knobs.ErrBusy) {
		res.waiting = "the state directory is busy (apply, reset or parking): next round"
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
	// The knobs of container devices that are gone.
	var goneKeys []string
	gone := map[string]bool{}
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
		if err != nil || !followableKnob(k) {
			continue
		}
		if _, err := k.Read(); errors.Is(err, knobs.ErrGone) {
			goneKeys = append(goneKeys, e.Key)
			gone[deviceOfEntry(k)] = true
			journaled[e.Key] = false
		}
	}
	// Parked, the journaled knobs are off the path on purpose: only
	// what the journal lacks is pending then.
	parked := f.parked()
	var todo []plan.Change
	var beyond []string
	newDevs := map[string]bool{}
	steered, pending := map[string]bool{}, map[string]bool{}
	for _, c := range p.Changes {
		dev, onContainer := devs.of(c)
		if onContainer {
			steered[devs.iface[dev]] = true
		}
		if journaled[c.Knob.Key()] {
			if parked || !onContainer || !followableKnob(c.Knob) {
				continue
			}
			cur, err := c.Knob.Read()
			if err != nil || sameValue(c.Knob, cur, c.Value) {
				continue
			}
		} else if !onContainer || !followableKnob(c.Knob) {
			beyond = append(beyond, c.Target)
			if onContainer {
				pending[devs.iface[dev]] = true
			}
			continue
		}
		todo = append(todo, c)
		newDevs[dev] = true
		pending[devs.iface[dev]] = true
	}
	res.found, res.steered, res.covered = len(devs.ifaces), len(steered), len(steered)-len(pending)
	if parked {
		res.waiting = waitParked
		return res, nil
	}
	if len(goneKeys) > 0 {
		if _, err := j.Forget(goneKeys); err != nil {
			return res, fmt.Errorf("letting go of devices that are gone: %w", err)
		}
		for d := range gone {
			res.dropped = append(res.dropped, d)
		}
		slices.Sort(res.dropped)
	}
	if len(beyond) > 0 {
		res.refused = fmt.Sprintf("the plan for the host as it is now changes %s, which lanes does not change under a running plan: lanes apply --mode %s again", strings.Join(beyond, ", "), f.mode)
		return res, nil
	}
	if len(todo) == 0 {
		return res, nil
	}
	if err := f.adopt(j, todo, devs); err != nil {
		return res, err
	}
	res.covered = res.steered
	for d := range newDevs {
		res.adopted = append(res.adopted, d)
	}
	slices.Sort(res.adopted)
	return res, nil
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
		for _, idx := range windows {
			if err := dp.SetAdopting(idx, d); err != nil {
				return err
			}
		}
		return nil
	}
	// Open until the maps are on; closed adoptWindow after.
	if err := open(time.Hour); err != nil {
		return err
	}
	var done []string
	undo := func(err error) error {
		if _, uerr := j.Forget(done); uerr != nil {
			return fmt.Errorf("%w; and restoring this round's changes: %v", err, uerr)
		}
		return err
	}
	journaled := map[string]bool{}
	for _, e := range j.Entries() {
		journaled[e.Key] = true
	}
	set := func(c plan.Change) error {
		// Counted before the write: a Set that journaled the knob and
		// then failed to write it (or wrote part of it) is undone too.
		if !journaled[c.Knob.Key()] {
			done = append(done, c.Knob.Key())
		}
		if err := j.Set(c.Knob, c.Value); err != nil {
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

// followableKnob: the knobs the follower sets and lets go of on
// container devices. TCX programs and RPS maps change no device state a
// running flow depends on beyond its placement, which the datapath's
// counts and the adoption window keep in order.
func followableKnob(k knobs.Knob) bool {
	switch k := k.(type) {
	case *attach.TCX:
		return true
	case *knobs.SysfsFile:
		return strings.HasPrefix(k.Path, "/sys/class/net/") &&
			(strings.HasSuffix(k.Path, "/rps_cpus") || strings.HasSuffix(k.Path, "/rps_flow_cnt"))
	}
	return false
}

// deviceOfEntry names the device a followable knob lives on ("ns/dev").
func deviceOfEntry(k knobs.Knob) string {
	switch k := k.(type) {
	case *attach.TCX:
		return plan.DevLabel(k.NetNS, k.Device)
	case *knobs.SysfsFile:
		rest := strings.TrimPrefix(k.Path, "/sys/class/net/")
		dev, _, _ := strings.Cut(rest, "/")
		return plan.DevLabel(k.NetNS, dev)
	}
	return k.Key()
}

// sameValue compares a knob's value as read with a plan's value: RPS maps
// as CPU sets (sysfs pads them), the rest as trimmed text.
func sameValue(k knobs.Knob, cur, want []byte) bool {
	if s, ok := k.(*knobs.SysfsFile); ok && strings.HasSuffix(s.Path, "/rps_cpus") {
		a, err1 := knobs.ParseCPUMask(string(cur))
		b, err2 := knobs.ParseCPUMask(string(want))
		return err1 == nil && err2 == nil && slices.Equal(a, b)
	}
	return strings.TrimSpace(string(cur)) == strings.TrimSpace(string(want))
}

// containerDevs are the devices of a topology's containers: both ends of
// every veth into a container, by label (plan.DevLabel), with the host
// side's ifindex.
type containerDevs struct {
	labels  []string          // longest first, so a prefix match finds the device itself
	hostIdx map[string]int    // host-side veth label -> ifindex
	ifaces  []string          // container-side interface labels
	iface   map[string]string // either end's label -> the container side's
}

func containerDevices(t *topology.Topology) containerDevs {
	d := containerDevs{hostIdx: map[string]int{}, iface: map[string]string{}}
	for _, v := range t.Veths {
		if v.PeerNetNS == "" || v.PeerNetNS == "unknown" {
			continue
		}
		l := plan.DevLabel(v.NetNS, v.Name)
		d.labels = append(d.labels, l)
		d.hostIdx[l] = v.Index
		d.iface[l] = plan.DevLabel(v.PeerNetNS, v.PeerName)
	}
	for _, c := range t.Containers {
		for _, ifc := range c.Interfaces {
			if ifc.HostVeth == "" {
				continue
			}
			l := plan.DevLabel(ifc.NetNS, ifc.Name)
			d.labels = append(d.labels, l)
			d.ifaces = append(d.ifaces, l)
			d.iface[l] = l
		}
	}
	slices.SortFunc(d.labels, func(a, b string) int { return len(b) - len(a) })
	return d
}

// of finds the container device a change is on (by its Target, see
// plan.Change).
func (d containerDevs) of(c plan.Change) (string, bool) {
	for _, l := range d.labels {
		if c.Target == l || strings.HasPrefix(c.Target, l+" ") {
			return l, true
		}
	}
	return "", false
}

// hostIndex is the ifindex of a host-side veth, 0 if it is not one.
func (d containerDevs) hostIndex(ns, dev string) int { return d.hostIdx[plan.DevLabel(ns, dev)] }
