package falcon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"golang.org/x/sys/unix"
)

// Parking: Falcon at home costs what vanilla costs.
//
// With spread=busy every stage stays on the IRQ core ("home") until that
// core is busy, and in a fallback it comes back there. At home lanes'
// programs still run on every frame: tc ingress on the underlay (the
// bridge stage), tc egress on every host-side veth (the container stage)
// and tc ingress on every container-side veth (its end), and RPS maps on
// the VXLAN device and the container veths make the kernel look each
// frame's hash up. That is a cost on every frame (TestSteerCost measures
// it) on a core that, under bulk traffic, is the bottleneck: it raises the
// core's utilization, and queueing delay grows much faster than
// utilization near saturation: with every stage at home, a ping-pong's
// p99 under background was above vanilla's.
//
// So once every stage has been at home for parkAfter rounds, with the
// bridge stage on its bare path (no flow there has a frame queued where
// vanilla would not queue it), the agent parks: it writes the journal's
// original RPS maps back (no RPS) and detaches those programs, and the
// path is vanilla's, exactly. Before any stage leaves home it unparks in
// two steps: the programs first (still on their at-home paths), then,
// after the drain time, the RPS maps, and only then may stages leave
// home. The wait lets out the frames that passed the hooks while the
// programs were off: they carry a hash of their own (the NIC's, or the
// inner flow's), which RPS would act on and a counting program could
// misread.
//
// Order, for the frames lanes parses: no step sends one to another core.
// At home the bridge stage runs every frame on in the GRO cell's poll (a
// zero L4 hash, which RPS skips) and the container stage hashes every
// frame to the core it runs on, whose backlog is where netif_rx queues it
// without RPS as well. So parking takes the RPS maps off first (frames
// keep their core), then the programs (frames keep their core: no map);
// unparking attaches the programs first (their hashes name the core the
// frame is on), then the maps. Leaving home afterwards is what it always
// was (fresh flow states, counted frames first). Overlay frames lanes
// does not parse (inner IPv6, ARP) get a zero L4 hash from the programs,
// which RPS skips, so they keep their core with the maps on or off.
//
// Crash safety: the plan's values, with the apply they belong to, are
// written to the state directory (plan.AgentStateFile) before the first
// knob is parked and removed after the last is unparked, so an agent
// started after a crash knows it is parked and what to put back; `lanes
// apply` and `lanes reset` remove the file, and an agent ignores one of
// another apply. Park and unpark run under the state directory's lock and
// only while the journal is still their apply's: an agent left running
// across a reset or a new apply never writes the new plan's knobs.
//
// Not parked: modes whose first stage has an XDP hook (split, prio: taking
// XDP off a veth changes how it receives), split=rps (its static map on
// the underlay is placement, not home), RPS maps that were set before
// lanes (writing them back would move flows), and options under which the
// bridge stage never takes its bare path.

// parkAfter is how many rounds every stage must have been at home, on
// the bare path, before the agent parks (1 s at the default 40 ms): a
// core near the threshold would otherwise attach and detach programs
// every few rounds.
const parkAfter = 25

// parkedProgs are the programs parking detaches (pin base names).
var parkedProgs = map[string]bool{steer.PinTCIngress: true, steer.PinTCEgress: true, steer.PinTCSeen: true}

// parkKnob is one knob parking switches between the plan's value and Off.
type parkKnob struct {
	Kind string          `json:"kind"`
	Knob json.RawMessage `json:"knob"`
	Plan []byte          `json:"plan"` // the applied plan's value
	Off  []byte          `json:"off"`  // the value while parked
	k    knobs.Knob
}

// parkFile is plan.AgentStateFile while parked.
type parkFile struct {
	// Gen is the apply the values belong to (knobs.Generation): a file of
	// another apply is stale.
	Gen   string     `json:"gen"`
	Knobs []parkKnob `json:"knobs"`
}

// parker parks and unparks one target's path.
type parker struct {
	path  string // StateDir/plan.AgentStateFile
	dir   string // StateDir
	gen   string // the apply this agent works for (knobs.Generation)
	knobs []parkKnob
	// parked: the maps are off the path (and the file says so);
	// progsBack: unparking has put the programs back at progsAt, and the
	// maps follow once frames that passed while they were off are out.
	parked    bool
	progsBack bool
	progsAt   time.Time
	drain     time.Duration
	off       string // why this agent does not park ("" = it may)
	// pick chooses the knobs to park from the journal at each park
	// (parkable; nil in unit tests, which give knobs of their own).
	pick func([]knobs.Entry) ([]parkKnob, string)
}

// errBusy: apply or reset holds the state directory; try next round.
var errBusy = errors.New("state directory busy")

// newParker finds the knobs parking switches, from the journal, or from
// the file a previous agent of the same apply left parked.
func newParker(o Options, stateDir string) (*parker, error) {
	p := &parker{drain: o.Drain, pick: parkable}
	if stateDir == "" {
		p.off = "no state directory"
		return p, nil
	}
	p.dir, p.path = stateDir, filepath.Join(stateDir, plan.AgentStateFile)
	ents, err := knobs.ReadEntries(stateDir)
	if err != nil {
		return nil, err
	}
	p.gen = knobs.Generation(ents)
	if b, err := os.ReadFile(p.path); err == nil {
		var f parkFile
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("reading %s: %w (lanes reset puts every knob back)", p.path, err)
		}
		if f.Gen == p.gen && p.gen != "" {
			// A previous agent parked and did not unpark (killed):
			// parked, whatever the options say now; the first round
			// unparks if it must.
			for i := range f.Knobs {
				if f.Knobs[i].k, err = (knobs.Entry{Kind: f.Knobs[i].Kind, Knob: f.Knobs[i].Knob}).Decode(); err != nil {
					return nil, fmt.Errorf("reading %s: %w (lanes reset puts every knob back)", p.path, err)
				}
			}
			p.knobs, p.parked, p.off = f.Knobs, true, parkOff(o)
			return p, nil
		}
		// Left from an earlier apply: its values are not this plan's.
		os.Remove(p.path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if p.off = parkOff(o); p.off != "" {
		return p, nil
	}
	p.knobs, p.off = parkable(ents)
	if p.off != "" {
		p.knobs = nil
	}
	return p, nil
}

// parkOff says why options rule parking out.
func parkOff(o Options) string {
	switch {
	case !o.Park:
		return keyPark + "=false"
	case !o.spreadBusy():
		return "stages never rest at home (spread=always or balance=false)"
	case o.Split:
		return "the first stage has an XDP hook (split)"
	case o.SplitRPS:
		return "split=rps: its RPS map on the underlay is placement"
	case o.Prio:
		return "prio classifies every frame in XDP"
	case !o.Bare || o.Stay != StayDirect || o.Drain <= 0:
		return "the bridge stage never takes its bare path at home (" + keyBare + ", " + keyStay + " or drain)"
	}
	return ""
}

// parkable picks the knobs to park from the journal: the programs of
// parkedProgs and every rps_cpus. Anything else on the per-frame path
// (another program, an RPS map set before lanes) rules parking out.
func parkable(ents []knobs.Entry) ([]parkKnob, string) {
	var out []parkKnob
	for _, e := range ents {
		k, err := e.Decode()
		if err != nil {
			return nil, err.Error()
		}
		switch k := k.(type) {
		case *attach.XDP:
			return nil, "an XDP program is on " + k.Device
		case *attach.TCX:
			if !parkedProgs[filepath.Base(k.Prog)] {
				return nil, fmt.Sprintf("program %s on %s is not one parking takes off", filepath.Base(k.Prog), k.Device)
			}
			out = append(out, parkKnob{Kind: e.Kind, Knob: e.Knob, Off: []byte(""), k: k})
		case *knobs.SysfsFile:
			if !strings.HasSuffix(k.Path, "/rps_cpus") {
				continue
			}
			if !zeroMask(e.Original) {
				return nil, fmt.Sprintf("%s was %q before lanes: putting it back would move flows", k, strings.TrimSpace(string(e.Original)))
			}
			out = append(out, parkKnob{Kind: e.Kind, Knob: e.Knob, Off: e.Original, k: k})
		}
	}
	if len(out) == 0 {
		return nil, "nothing on the path to take off"
	}
	// The plan's values are what is in place now: nothing is parked. A
	// knob whose device is gone (a container that went, which lanes
	// agent's follower has not let go of yet) has nothing to park: it is
	// left out, and parking stays possible for the rest.
	live := out[:0]
	for _, pk := range out {
		v, err := pk.k.Read()
		if errors.Is(err, knobs.ErrGone) {
			continue
		}
		if err != nil {
			return nil, fmt.Sprintf("reading %s: %v", pk.k.Key(), err)
		}
		pk.Plan = v
		live = append(live, pk)
	}
	if len(live) == 0 {
		return nil, "nothing on the path to take off"
	}
	return live, ""
}

// zeroMask: a CPU mask as sysfs shows it ("0", "00000000,00000000") with
// no bit set.
func zeroMask(b []byte) bool {
	cpus, err := cpuset.ParseMask(string(b))
	return err == nil && len(cpus) == 0
}

// locked runs fn holding the state directory's lock, which `lanes apply`
// and `lanes reset` hold while they work, so a park or unpark never
// interleaves with either. It does not wait for them (errBusy: the next
// round tries again). After a reset or another apply the journal is not
// this agent's any more: it stops parking and writes nothing (reset put
// every original back; a new apply owns the knobs).
func (p *parker) locked(fn func(ents []knobs.Entry) error) error {
	d, err := os.Open(p.dir)
	if err == nil {
		defer d.Close() // drops the lock
		if err = unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
			return errBusy
		} else if err != nil {
			return fmt.Errorf("locking %s: %w", p.dir, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ents, err := knobs.ReadEntries(p.dir)
	if err != nil {
		return err
	}
	if g := knobs.Generation(ents); g == "" || g != p.gen {
		p.parked, p.progsBack = false, false
		p.off = "the target was reset or applied again: this agent's plan is gone"
		return nil
	}
	return fn(ents)
}

// park takes the RPS maps, then the programs off the path. Unparking
// half done (programs back, maps still off) parks the programs again.
func (p *parker) park() error {
	if p.off != "" || (p.parked && !p.progsBack) {
		return nil
	}
	return p.locked(func(ents []knobs.Entry) error {
		if !p.parked {
			// The journal may have grown since the agent started:
			// lanes agent's follower adopts containers that came
			// after apply (control/follow.go), and parking must take
			// their programs and maps off too. It adopts only while
			// nothing is parked, under this lock.
			if p.pick != nil {
				var off string
				if p.knobs, off = p.pick(ents); off != "" {
					p.knobs, p.off = nil, off
					return nil
				}
			}
			b, err := json.Marshal(parkFile{Gen: p.gen, Knobs: p.knobs})
			if err != nil {
				return err
			}
			if err := knobs.WriteFileAtomic(p.path, b); err != nil {
				return fmt.Errorf("parking: %w", err)
			}
			p.parked = true
		}
		p.progsBack = false
		off := func(k parkKnob) []byte { return k.Off }
		if err := p.writeSome("parking", false, off); err != nil {
			return err
		}
		return p.writeSome("parking", true, off)
	})
}

// writeSome sets the programs (progs) or the RPS maps to value(k); a knob
// whose device is gone is skipped.
func (p *parker) writeSome(what string, progs bool, value func(parkKnob) []byte) error {
	for _, k := range p.knobs {
		if (k.Kind == attach.KindTCX) != progs {
			continue
		}
		if err := k.k.Write(value(k)); err != nil && !errors.Is(err, knobs.ErrGone) {
			return fmt.Errorf("%s %s: %w", what, k.k.Key(), err)
		}
	}
	return nil
}

// unpark takes one step back to the plan's state and says whether it is
// there. The programs go back first. A frame that passed the hooks
// while they were off carries a hash of its own (the NIC's, or the
// inner flow's), which RPS maps would act on and the counting programs
// could misread; the maps go back only once such frames are out (the
// drain time, as for a move), and stages leave home only after that.
func (p *parker) unpark(now time.Time) (bool, error) {
	if !p.parked {
		return true, nil
	}
	if !p.progsBack {
		err := p.locked(func([]knobs.Entry) error {
			if err := p.writeSome("unparking", true, func(k parkKnob) []byte { return k.Plan }); err != nil {
				return err
			}
			p.progsBack, p.progsAt = true, now
			return nil
		})
		return !p.parked, err
	}
	if now.Sub(p.progsAt) < p.drain {
		return false, nil
	}
	err := p.locked(func([]knobs.Entry) error {
		if err := p.writeSome("unparking", false, func(k parkKnob) []byte { return k.Plan }); err != nil {
			return err
		}
		if err := os.Remove(p.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unparking: %w", err)
		}
		os.Remove(p.path + ".tmp")
		p.parked, p.progsBack = false, false
		return nil
	})
	return !p.parked, err
}

// unparkNow unparks whole, waiting out the drain time between the steps
// and an apply or reset that holds the directory (for an agent that
// stops).
func (p *parker) unparkNow() error {
	for deadline := time.Now().Add(5 * time.Second); ; {
		done, err := p.unpark(time.Now())
		if done || (err != nil && !errors.Is(err, errBusy)) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("unparking: %w for 5 s", errBusy)
		}
		time.Sleep(max(p.drain, 10*time.Millisecond))
	}
}
