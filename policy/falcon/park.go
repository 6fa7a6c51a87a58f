package falcon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
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
// frame's hash up. That is a few hundred nanoseconds a frame (TestSteerCost)
// on a core that, under bulk traffic, is the bottleneck: it raises the
// core's utilization, and queueing delay grows much faster than
// utilization near saturation (a ping-pong's p99 under a 65% background
// was 1.15-1.52x vanilla's with every stage at home, 2026-11-24, docs/falcon.md).
//
// So once every stage has been at home for parkAfter rounds, with the
// bridge stage on its bare path (no flow there has a frame queued where
// vanilla would not queue it), the agent parks: it writes the journal's
// original RPS maps back (no RPS) and detaches those programs, and the
// path is vanilla's, exactly. Before any stage leaves home it unparks:
// attaches the programs again, still on their at-home paths, and only then
// sets the RPS maps again.
//
// Order: no step sends a frame to another core. At home the bridge stage
// runs every frame on in the GRO cell's poll (a zero L4 hash, which RPS
// skips) and the container stage hashes every frame to the core it runs
// on, whose backlog is where netif_rx queues it without RPS as well. So
// parking takes the RPS maps off first (frames keep their core), then the
// programs (frames keep their core: no map); unparking attaches the
// programs first (their hashes name the core the frame is on), then the
// maps. Leaving home afterwards is what it always was (fresh flow states,
// counted frames first).
//
// Crash safety: the plan's values are written to the state directory
// (plan.AgentStateFile) before the first knob is parked and removed after
// the last is unparked, so an agent started after a crash knows it is
// parked and what to put back; `lanes reset` restores the journal's
// originals whatever was parked, and removes the file.
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

// parker parks and unparks one target's path.
type parker struct {
	path   string // StateDir/plan.AgentStateFile; "" = cannot park
	knobs  []parkKnob
	parked bool
	off    string // why this agent never parks ("" = it may)
}

// newParker finds the knobs parking switches, from the journal, or from
// the file a previous agent left parked.
func newParker(o Options, stateDir string) (*parker, error) {
	p := &parker{}
	if stateDir == "" {
		p.off = "no state directory"
		return p, nil
	}
	p.path = filepath.Join(stateDir, plan.AgentStateFile)
	if b, err := os.ReadFile(p.path); err == nil {
		// A previous agent parked and did not unpark (killed): parked,
		// whatever the options say now; the first round unparks if it
		// must.
		if err := json.Unmarshal(b, &p.knobs); err != nil {
			return nil, fmt.Errorf("reading %s: %w (lanes reset puts every knob back)", p.path, err)
		}
		for i := range p.knobs {
			if p.knobs[i].k, err = (knobs.Entry{Kind: p.knobs[i].Kind, Knob: p.knobs[i].Knob}).Decode(); err != nil {
				return nil, fmt.Errorf("reading %s: %w (lanes reset puts every knob back)", p.path, err)
			}
		}
		p.parked = true
		p.off = parkOff(o)
		return p, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if p.off = parkOff(o); p.off != "" {
		return p, nil
	}
	ents, err := knobs.ReadEntries(stateDir)
	if err != nil {
		return nil, err
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
		return "park=false"
	case !o.spreadBusy():
		return "stages never rest at home (spread=always or balance=false)"
	case o.Split:
		return "the first stage has an XDP hook (split)"
	case o.SplitRPS:
		return "split=rps: its RPS map on the underlay is placement"
	case o.Prio:
		return "prio classifies every frame in XDP"
	case !o.Bare || o.Stay != StayDirect || o.Drain <= 0:
		return "the bridge stage never takes its bare path at home (bare, stay or drain)"
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
	// The plan's values are what is in place now: nothing is parked.
	for i := range out {
		v, err := out[i].k.Read()
		if err != nil {
			return nil, fmt.Sprintf("reading %s: %v", out[i].k.Key(), err)
		}
		out[i].Plan = v
	}
	return out, ""
}

// zeroMask: a CPU mask as sysfs shows it ("0", "00000000,00000000") with
// no bit set.
func zeroMask(b []byte) bool {
	s := strings.TrimSpace(string(b))
	return s != "" && strings.Trim(s, "0,") == ""
}

// locked runs fn holding the state directory's lock, which `lanes apply`
// and `lanes reset` hold while they work, so a park or unpark never
// interleaves with a reset: one that comes after a reset finds the journal
// gone and does nothing (reset put every original back, and the plan is
// gone).
func (p *parker) locked(fn func() error) error {
	dir := filepath.Dir(p.path)
	d, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		p.parked = false
		return nil
	}
	if err != nil {
		return err
	}
	defer d.Close() // drops the lock
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", dir, err)
	}
	if !knobs.Exists(dir) {
		p.parked = false
		return nil
	}
	return fn()
}

// park takes the programs and RPS maps off the path: the maps first.
func (p *parker) park() error {
	if p.parked || p.off != "" {
		return nil
	}
	return p.locked(p.parkLocked)
}

func (p *parker) parkLocked() error {
	b, err := json.Marshal(p.knobs)
	if err != nil {
		return err
	}
	if err := knobs.WriteFileAtomic(p.path, b); err != nil {
		return fmt.Errorf("parking: %w", err)
	}
	p.parked = true
	return p.write("parking", false, func(k parkKnob) []byte { return k.Off })
}

// write sets every knob to value(k), the programs first or last; a knob
// whose device is gone is skipped.
func (p *parker) write(what string, progsFirst bool, value func(parkKnob) []byte) error {
	for _, progs := range []bool{progsFirst, !progsFirst} {
		for _, k := range p.knobs {
			if (k.Kind == attach.KindTCX) != progs {
				continue
			}
			if err := k.k.Write(value(k)); err != nil && !errors.Is(err, knobs.ErrGone) {
				return fmt.Errorf("%s %s: %w", what, k.k.Key(), err)
			}
		}
	}
	return nil
}

// unpark puts the plan's programs and RPS maps back: the programs first.
func (p *parker) unpark() error {
	if !p.parked {
		return nil
	}
	return p.locked(p.unparkLocked)
}

func (p *parker) unparkLocked() error {
	if err := p.write("unparking", true, func(k parkKnob) []byte { return k.Plan }); err != nil {
		return err
	}
	if err := os.Remove(p.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unparking: %w", err)
	}
	os.Remove(p.path + ".tmp")
	p.parked = false
	return nil
}
