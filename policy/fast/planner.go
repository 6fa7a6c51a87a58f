// Package fast is the fast path into the container as a mode of its own:
// once the kernel's own path has delivered a flow of the overlay to a
// container, its later frames go from the underlay's tc ingress straight
// into the container's namespace (datapath/steer's bpf/fast.h), where
// nothing on the path skipped can change the kernel's verdict (path.go)
// and while lanes agent vouches for it (agent.go).
package fast

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/policy/onpath"
	"github.com/lanesnet/lanes/topology"
)

// Mode is the name `lanes apply --mode` takes, and AgentName its agent's.
const (
	Mode      = "fast"
	AgentName = "fast"
)

func init() {
	plan.Register(planner{})
	plan.RegisterAgent(AgentName, newAgent)
}

// Options are the mode's settings.
type Options struct {
	// Interval is how often the agent reads the path again besides on
	// every change it is told of, and renews its lease.
	Interval time.Duration
	// Idle is how long an entry may go unused before it is void.
	Idle time.Duration
	// NoGSO leaves GSO frames at a VXLAN device's fast path to the
	// kernel's path (steer.Config.FastNoGSO).
	NoGSO bool
}

// The settings no kept run has shown to matter: for tests and comparison
// only (plan.ComparisonPrefix), out of the default help.
const (
	keyInterval = plan.ComparisonPrefix + "interval"
	keyIdle     = plan.ComparisonPrefix + "idle"
	keyGSO      = plan.ComparisonPrefix + "gso"
)

var params = []plan.Param{
	{Key: keyInterval, Default: "1s", Help: "how often lanes agent reads the path again besides on each change it is told of, and renews the fast path's lease, which lapses 3 intervals + 1s later (10ms..1m)"},
	{Key: keyIdle, Default: steer.DefaultFastIdle.String(), Help: "a flow's entry unused this long is deleted; its next frame takes the kernel's path and teaches it again (1ms..1h, whole ms)"},
	{Key: keyGSO, Default: "true", Help: "where the fast path starts at the VXLAN device (the underlay in another namespace), it takes GSO frames (GRO'd TCP) too: true|false"},
}

// Defaults are the settings of the fast path a mode beside it carries
// (Steps).
func Defaults() Options { return Options{Interval: time.Second, Idle: steer.DefaultFastIdle} }

// Parse reads params over the defaults; every error is one line saying
// what to fix.
func Parse(m map[string]string) (Options, error) {
	o := Defaults()
	for k, v := range m {
		var err error
		switch k {
		case keyInterval:
			o.Interval, err = time.ParseDuration(v)
			if err == nil && (o.Interval < 10*time.Millisecond || o.Interval > time.Minute) {
				err = fmt.Errorf("want 10ms..1m")
			}
		case keyIdle:
			o.Idle, err = time.ParseDuration(v)
			if err == nil && (o.Idle < time.Millisecond || o.Idle > steer.MaxPrioQuiet || o.Idle%time.Millisecond != 0) {
				err = fmt.Errorf("want whole milliseconds, 1ms..1h")
			}
		case keyGSO:
			var gso bool
			gso, err = strconv.ParseBool(v)
			o.NoGSO = !gso
		default:
			err = fmt.Errorf("unknown setting")
		}
		if err != nil {
			return o, fmt.Errorf("fast %s=%q: %v", k, v, err)
		}
	}
	return o, nil
}

// leaseTTL is how long a lease the agent writes holds without it: a few
// of its rounds, and never less than a second.
func leaseTTL(interval time.Duration) time.Duration { return 3*interval + time.Second }

type planner struct{}

func (planner) Mode() string { return Mode }
func (planner) Summary() string {
	return "fast path: once the kernel's path delivered a flow to a container, its later non-GSO frames go from the underlay's tc ingress (or, all of them, from the VXLAN device's where the underlay lives in another namespace) straight into the container; once it sent one out, its later frames go from the container's veth straight out the underlay (needs `lanes agent`)"
}
func (planner) Params() []plan.Param { return params }

// Plan loads the steering datapath with the fast path on, attaches its
// learning programs to every container's host-side veth's tc egress and
// the underlay's tc egress and, last, its fast paths to the underlay's tc
// ingress (into the containers; the VXLAN device's where the underlay
// lives in another namespace, FromVXLAN) and the veths' tc ingress (out
// of them). The plan vouches for nothing: until lanes agent reads the
// path and gives the datapath its lease, every frame takes the kernel's
// path.
func (planner) Plan(t *topology.Topology, cfg plan.Config) (*plan.Plan, error) {
	o, err := Parse(cfg.Params)
	if err != nil {
		return nil, err
	}
	if len(t.Underlays) == 0 {
		return nil, fmt.Errorf("no underlay device found: the fast path starts at the underlay's tc ingress and cannot run without it")
	}
	pl := &plan.Plan{Mode: Mode, Agent: AgentName}
	port, vnis, err := plan.VXLANIDs(t, pl)
	if err != nil {
		return nil, err
	}
	setup := steer.Setup{Config: steer.Config{Enabled: true, CPUs: cfg.CPUs, Flowlet: steer.DefaultFlowlet, Drain: steer.DefaultDrain,
		VXLANPort: port, VNIs: vnis, Fast: true, FastIdle: o.Idle, FastNoGSO: o.NoGSO}}
	val, err := setup.Encode()
	if err != nil {
		return nil, err
	}
	dir := plan.PinDir(t.Target())
	pl.Add(&attach.BPFFS{Path: plan.BPFFS}, "mounted", plan.BPFFS, "bpffs for lanes' pinned programs and maps")
	pl.Add(&attach.PinDir{Path: dir}, "present", dir, "pin directory of this namespace's BPF objects")
	pl.Add(&steer.DatapathKnob{Dir: dir}, val, dir, "steering programs and maps with the fast path on, vouching for nothing until lanes agent does")
	Steps(pl, t, dir)
	pl.Notes = append(pl.Notes, Notes(t, o)...)
	return pl, nil
}

// Param is the setting by which another mode carries the fast path
// beside its own mechanism (Beside). A comparison setting until a kept
// run shows what it does beside each mode.
var Param = plan.Param{Key: plan.ComparisonPrefix + "fast", Default: "false", Help: "the fast path beside this mode: a flow the kernel's path delivered goes from the underlay straight into its container, on the core its first stage runs on; this mode's mechanism serves the frames it leaves to the kernel's path (needs `lanes agent`)"}

// Configure turns the fast path on, with its defaults, in the datapath
// configuration of a mode beside it.
func Configure(c *steer.Config) { c.Fast, c.FastBeside, c.FastIdle = true, true, Defaults().Idle }

// Beside adds the fast path to the plan of a mode beside it, whose
// datapath (pinned in dir, Configure'd) pl has just loaded and whose own
// programs come next: the fast path's programs (Steps), its agent beside
// the mode's, and its notes.
func Beside(pl *plan.Plan, t *topology.Topology, dir string) {
	Steps(pl, t, dir)
	pl.Agent = plan.Agents(pl.Agent, AgentName)
	pl.Notes = append(pl.Notes, Notes(t, Defaults())...)
}

// Steps adds to pl the fast path's programs, from the end of the path to
// its start, for the datapath pinned in dir (loaded with Config.Fast):
// its learning programs on every container's host-side veth's tc egress
// and the underlay's tc egress, then its fast paths on the underlay's tc
// ingress (into the containers; the VXLAN device's where the underlay
// lives in another namespace, FromVXLAN) and the veths' tc ingress (out
// of them). A mode beside it adds them before its own programs on the
// same hooks, so the fast path runs first there and theirs see only the
// frames it leaves to the kernel's path; its links are pinned under names
// of their own.
func Steps(pl *plan.Plan, t *topology.Topology, dir string) {
	// Where each flow's frames reach their container first, so that every
	// frame the fast path counts on its way is counted there too.
	for i := range t.Containers {
		for j := range t.Containers[i].Interfaces {
			ifc := &t.Containers[i].Interfaces[j]
			if ifc.HostVeth == "" {
				continue
			}
			pl.Add(&attach.TCX{NetNS: ifc.NetNS, Device: ifc.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCFastSeen, Link: plan.LinkPin(dir, "tcx-fast-seen", ifc.NetNS, ifc.Name)},
				"attached", plan.DevLabel(ifc.NetNS, ifc.Name)+" tc ingress", "count each flow's frames in, so none takes the fast path past one still on the kernel's path")
		}
	}
	for _, v := range hostVeths(t) {
		pl.Add(&attach.TCX{NetNS: v.NetNS, Device: v.Name, Direction: "egress", Prog: dir + "/" + steer.PinTCFastLearn, Link: plan.LinkPin(dir, "tcx-fast-out", v.NetNS, v.Name)},
			"attached", plan.DevLabel(v.NetNS, v.Name)+" tc egress", "learn where the kernel's path delivers each flow")
	}
	// The way out needs the underlay in the veths' namespace
	// (bpf_redirect), as the way in from it does: where none is, neither
	// way's programs run there.
	for _, u := range underlaysIn(t) {
		pl.Add(&attach.TCX{NetNS: u.NetNS, Device: u.Name, Direction: "egress", Prog: dir + "/" + steer.PinTCFastOutLearn, Link: plan.LinkPin(dir, "tcx-fast-out", u.NetNS, u.Name)},
			"attached", plan.DevLabel(u.NetNS, u.Name)+" tc egress", "learn how the kernel's path sends each flow out")
	}
	for _, u := range underlaysIn(t) {
		pl.Add(&attach.TCX{NetNS: u.NetNS, Device: u.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCFast, Link: plan.LinkPin(dir, "tcx-fast-in", u.NetNS, u.Name)},
			"attached", plan.DevLabel(u.NetNS, u.Name)+" tc ingress", "take learned flows straight into their container")
	}
	for i := range t.VXLANs {
		if v := &t.VXLANs[i]; FromVXLAN(t, v) {
			pl.Add(&attach.TCX{NetNS: t.NetNS, Device: v.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCFastVX, Link: plan.LinkPin(dir, "tcx-fast-in", t.NetNS, v.Name)},
				"attached", plan.DevLabel(t.NetNS, v.Name)+" tc ingress", "take learned flows straight into their container once the kernel decapsulated them (the underlay lives in "+onpath.Label(v.UnderlayNetNS)+")")
		}
	}
	for _, v := range hostVeths(t) {
		if len(underlaysIn(t)) == 0 {
			break
		}
		pl.Add(&attach.TCX{NetNS: v.NetNS, Device: v.Name, Direction: "ingress", Prog: dir + "/" + steer.PinTCFastOut, Link: plan.LinkPin(dir, "tcx-fast-in", v.NetNS, v.Name)},
			"attached", plan.DevLabel(v.NetNS, v.Name)+" tc ingress", "send learned flows straight out the underlay")
	}
}

// Notes say where the fast path can run on t and what it takes.
func Notes(t *topology.Topology, o Options) []string {
	var out []string
	p := PathOf(t, onpath.ReadFilters(t))
	out = append(out, p.Notes...)
	what := "nowhere now"
	if len(p.FastPath.Veths) > 0 {
		what = "to " + strings.Join(p.Veths, ", ")
	}
	from := "nowhere now"
	if len(p.Out.Veths) > 0 {
		from = "from " + strings.Join(p.OutVeths, ", ")
	}
	out = append(out, fmt.Sprintf("fast path out possible %s; TCP GSO frames take it, encapsulated as UDP-tunnel GSO with an outer UDP checksum of 0", from))
	out = append(out, fmt.Sprintf("fast path possible %s; it admits nothing until `lanes agent` runs, which vouches for the path every %v and on each change (its lease lapses %v after its last round); GSO frames (GRO'd TCP) take the kernel's path in from the underlay",
		what, o.Interval, leaseTTL(o.Interval)))
	for i := range t.VXLANs {
		if v := &t.VXLANs[i]; FromVXLAN(t, v) {
			gso := "GSO frames too"
			if o.NoGSO {
				gso = "not for GSO frames (" + keyGSO + "=false)"
			}
			out = append(out, fmt.Sprintf("fast path in from %s's tc ingress: its underlay lives in %s, so the kernel's path keeps the outer IP/UDP and the VXLAN device; the fast path skips the bridge, the veth and the backlog queue, %s",
				v.Name, onpath.Label(v.UnderlayNetNS), gso))
		}
	}
	return out
}

// underlaysIn are the underlays of t's VXLAN devices whose fast path starts
// there (not FromVXLAN): a frame is counted in flight at one place only.
func underlaysIn(t *topology.Topology) []*topology.Device {
	var out []*topology.Device
	for i := range t.VXLANs {
		v := &t.VXLANs[i]
		if u := t.UnderlayOf(v); u != nil && !FromVXLAN(t, v) && !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out
}

// hostVeths are t's veths whose peers are in a namespace of their own:
// the containers' host-side veths.
func hostVeths(t *topology.Topology) []*topology.Veth {
	var out []*topology.Veth
	for i := range t.Veths {
		if v := &t.Veths[i]; v.PeerNetNS != "" && v.PeerNetNS != "unknown" {
			out = append(out, v)
		}
	}
	return out
}
