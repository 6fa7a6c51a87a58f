// Package plan is the contract between lanes' policies and its engine. A
// Planner (one per mode: vanilla, rps, later falcon, mflow, prism under
// policy/) looks at a discovered topology and says which knobs to set to
// which values; the engine (package control) journals and applies that list
// and can always undo it. Planners never touch the kernel.
//
// BPF programs, links, pins and map entries will enter plans the same way,
// as knob kinds (present/absent or an entry's value), so the engine, the
// journal and crash recovery stay as they are.
package plan

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/topology"
)

// Config is what the user chose, validated before a planner sees it.
type Config struct {
	// CPUs are the cores the mode may place receive work on (online,
	// sorted, not empty).
	CPUs []int
	// Online are all online cores.
	Online []int
	// Params are mode-specific settings ("threshold" -> "80"), as the user
	// gave them; a planner rejects keys it does not know (see
	// ParamPlanner), so a typo never passes silently.
	Params map[string]string
}

// ParamPlanner is a Planner with settings of its own. Apply refuses params
// for a planner that is not one, and checks keys against Params before
// planning.
type ParamPlanner interface {
	Planner
	// Params lists the keys the mode accepts, with one-line help each.
	Params() []Param
}

// Retired is a ParamPlanner that no longer takes some settings it once
// did. CheckParams refuses such a key with the line RetiredParams gives
// for it (what took its place, and to remove the setting) rather than as
// an unknown one: a file or command line written for the older lanes
// then says what changed.
type Retired interface {
	ParamPlanner
	// RetiredParams maps each retired key to its one-line refusal.
	RetiredParams() map[string]string
}

// Prioritizer is a Planner whose plans can classify flows by the `lanes
// prio` rules (prism modes, falcon with prio): the benchmark marks its
// high-priority service under exactly these.
type Prioritizer interface {
	Planner
	// Prioritizes says whether the mode, with these settings, has
	// priority classes.
	Prioritizes(params map[string]string) bool
}

// Prioritizes says whether mode with params has priority classes; false
// for unknown modes.
func Prioritizes(mode string, params map[string]string) bool {
	p, err := Lookup(mode)
	if err != nil {
		return false
	}
	pr, ok := p.(Prioritizer)
	return ok && pr.Prioritizes(params)
}

// Takes says whether mode has the setting key (false for unknown modes).
func Takes(mode, key string) bool {
	p, err := Lookup(mode)
	if err != nil {
		return false
	}
	pp, ok := p.(ParamPlanner)
	return ok && slices.ContainsFunc(pp.Params(), func(q Param) bool { return q.named(key) })
}

// ComparisonPrefix starts the key of a setting that exists only to compare
// variants or to diagnose: it switches off a mechanism to measure what the
// mechanism saves, or has it count what a test checks. Listings show such
// settings apart from the mode's own.
const ComparisonPrefix = "x-"

// Param is one mode setting.
type Param struct {
	Key     string
	Default string
	Help    string
	// OldKeys are other names the setting is accepted under, read as
	// Key: state files written with them keep them in their saved
	// params, and `lanes agent` parses those again. Listings and error
	// messages name Key alone.
	OldKeys []string
}

// Comparison says whether q exists only to compare variants or to
// diagnose (ComparisonPrefix).
func (q Param) Comparison() bool { return strings.HasPrefix(q.Key, ComparisonPrefix) }

// named says whether key names q, by its key or an old one.
func (q Param) named(key string) bool { return q.Key == key || slices.Contains(q.OldKeys, key) }

// CurrentKeys returns m with every old key (Param.OldKeys) of params
// renamed to its current one, for a planner to parse. A setting given
// under two of its names is an error, also with equal values: one of them
// is left over from something else.
func CurrentKeys(params []Param, m map[string]string) (map[string]string, error) {
	out := maps.Clone(m)
	from := map[string]string{} // current key -> the old key it was given as
	for _, k := range slices.Sorted(maps.Keys(m)) {
		i := slices.IndexFunc(params, func(q Param) bool { return slices.Contains(q.OldKeys, k) })
		if i < 0 {
			continue
		}
		cur := params[i].Key
		other, twice := from[cur]
		if _, given := m[cur]; given {
			other, twice = cur, true
		}
		if twice {
			return nil, fmt.Errorf("settings %s and %s both given: both name the setting %s; give it once, as %s", k, other, cur, cur)
		}
		from[cur] = k
		out[cur] = m[k]
		delete(out, k)
	}
	return out, nil
}

// ParseQueueSize reads a queue-length setting (cpumap entries): 8..16384
// frames.
func ParseQueueSize(v string) (uint32, error) {
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n < 8 || n > 16384 {
		return 0, fmt.Errorf("want 8..16384")
	}
	return uint32(n), nil
}

// CheckParams returns an error naming the first key p does not accept.
func CheckParams(p Planner, params map[string]string) error {
	if len(params) == 0 {
		return nil
	}
	pp, ok := p.(ParamPlanner)
	if !ok {
		for k := range params {
			return fmt.Errorf("mode %s takes no settings, but %s was given: drop it or pick a mode that uses it", p.Mode(), k)
		}
	}
	known := map[string]bool{}
	var names []string
	for _, q := range pp.Params() {
		known[q.Key] = true
		for _, k := range q.OldKeys {
			known[k] = true
		}
		names = append(names, q.Key)
	}
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	retired := map[string]string{}
	if r, ok := p.(Retired); ok {
		retired = r.RetiredParams()
	}
	for _, k := range keys {
		if why, gone := retired[k]; gone && !known[k] {
			return errors.New(why)
		}
		if !known[k] {
			return fmt.Errorf("mode %s has no setting %q: it takes %s", p.Mode(), k, strings.Join(names, ", "))
		}
	}
	return nil
}

// Change sets one knob.
type Change struct {
	Knob  knobs.Knob
	Value []byte
	// Target names what the knob belongs to for people: "NETNS/DEV rx-0",
	// "kthread napi/eth0-8195". A device's knob has a target that starts
	// with DevLabel(ns, dev) and a space (or is just that): lanes agent's
	// container follower finds a container's changes by it.
	Target string
	// Why says what the change is for.
	Why string
}

// Plan is an ordered list of changes; the engine applies them in order and
// undoes them in reverse.
type Plan struct {
	Mode    string
	Changes []Change
	// Notes explain choices a reader might question (devices skipped, a
	// knob deliberately left alone).
	Notes []string
	// Agent names the long-running part of the mode ("falcon-balancer"),
	// empty when the plan is static: `lanes agent` (or the benchmark) runs
	// it against the applied state.
	Agent string
}

// Add appends a change.
func (p *Plan) Add(k knobs.Knob, value, target, why string) {
	p.Changes = append(p.Changes, Change{Knob: k, Value: []byte(value), Target: target, Why: why})
}

// Planner turns a topology into a plan for one mode.
type Planner interface {
	// Mode is the name users pass to `lanes apply --mode`.
	Mode() string
	// Summary is one line for help texts.
	Summary() string
	Plan(t *topology.Topology, cfg Config) (*Plan, error)
}

var (
	mu       sync.Mutex
	planners = map[string]Planner{}
)

// Register makes a mode available; call it from the planner package's init.
func Register(p Planner) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := planners[p.Mode()]; dup {
		panic("plan: mode registered twice: " + p.Mode())
	}
	planners[p.Mode()] = p
}

// Lookup returns the planner of a mode, or an error listing the modes.
func Lookup(mode string) (Planner, error) {
	mu.Lock()
	p := planners[mode]
	mu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("unknown mode %q: use one of %s", mode, strings.Join(Modes(), ", "))
	}
	return p, nil
}

// Modes lists the registered modes, sorted.
func Modes() []string {
	mu.Lock()
	defer mu.Unlock()
	out := make([]string, 0, len(planners))
	for m := range planners {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// Target is the name a namespace's lanes state goes by: "host" for the
// namespace lanes runs in, the namespace's name otherwise, with the slashes
// of a path and the colon of "pid:N" made underscores ("pid:N@C" is the
// same as "pid:N"). It names the state directory under /run/lanes and the
// BPF pin directory under /sys/fs/bpf/lanes, so two namespaces must never
// share one: a name whose underscores would read back as something else
// (the name run_netns_a_b, read back as the path /run/netns/a_b), or that
// holds a character bpffs refuses ('.') or the escape '%', is written as
// "%" and its escaped form instead. Targets are therefore distinct for
// distinct namespaces, and the usual ones keep the names they always had.
func Target(netns string) string {
	if netns == "" {
		return "host"
	}
	// "pid:N@C" is pid:N checked against its cookie: the same target.
	if strings.HasPrefix(netns, "pid:") {
		netns, _, _ = strings.Cut(netns, "@")
	}
	flat := targetFlat.Replace(strings.TrimPrefix(netns, "/"))
	if !strings.ContainsAny(netns, "%.") && unflatTarget(flat) == netns {
		return flat
	}
	return "%" + targetEscape.Replace(netns)
}

var (
	targetFlat = strings.NewReplacer("/", "_", ":", "_")
	// targetEscape is reversible: '_' stands for '/' alone, every other
	// character it changes becomes a %XX no name holds.
	targetEscape = strings.NewReplacer("%", "%25", ".", "%2E", "_", "%5F", ":", "%3A", "/", "_")
	// targetDirs are directories whose namespace files keep their own
	// underscores in a target (Docker's ingress_sbox): after the prefix a
	// flat target is one file name.
	targetDirs = []string{"/run/netns/", "/var/run/netns/", "/run/docker/netns/", "/var/run/docker/netns/"}
	// targetRoots are the top directories a flat target is read back as a
	// path under, every underscore a slash (/proc/N/ns/net).
	targetRoots = []string{"run", "var", "proc", "tmp"}
	pidTarget   = regexp.MustCompile(`^pid_[0-9]+$`)
)

// unflatTarget is the namespace a flat target reads back as: the one
// namespace Target gives that target to.
func unflatTarget(t string) string {
	switch {
	case t == "host":
		return ""
	case pidTarget.MatchString(t):
		return "pid:" + strings.TrimPrefix(t, "pid_")
	}
	for _, d := range targetDirs {
		if rest, ok := strings.CutPrefix(t, targetFlat.Replace(d[1:])); ok {
			return d + rest
		}
	}
	if root, _, ok := strings.Cut(t, "_"); ok && slices.Contains(targetRoots, root) {
		return "/" + strings.ReplaceAll(t, "_", "/")
	}
	return t
}

// BPFFS is where lanes mounts (or finds) bpffs for its pins.
const BPFFS = attach.DefaultBPFFS

// PinDir is where a namespace's BPF objects are pinned: one directory per
// target, so reset removes exactly what lanes pinned for it. A target
// holds no '.', which bpffs refuses in a name.
func PinDir(netns string) string {
	return BPFFS + "/lanes/" + Target(netns)
}

// RPSByHash adds the knobs that make RPS on receive queue q of d pick its
// core from the skb hash alone, over mask: its rps_cpus, and rps_flow_cnt
// 0 where RFS was on (RFS would send a flow to the core its application
// last read it on, not where lanes' hash says, and lanes' order-keeping
// counts which core's backlog a flow's frames are in). why says what the
// hash carries.
func (p *Plan) RPSByHash(d *topology.Device, q topology.RxQueue, mask, why string) {
	p.Add(knobs.Sysfs(d.NetNS, d.QueuePath(q.Index)+"/rps_cpus"), mask, DeviceTarget(d, q.Index), why)
	if q.RPSFlowCnt != 0 {
		p.Add(knobs.Sysfs(d.NetNS, d.QueuePath(q.Index)+"/rps_flow_cnt"), "0", DeviceTarget(d, q.Index),
			"RFS off on this queue: it would override the core the hash picks")
	}
}

// DeviceTarget is the Target label of a device's rx queue.
func DeviceTarget(d *topology.Device, queue int) string {
	return fmt.Sprintf("%s rx-%d", DevLabel(d.NetNS, d.Name), queue)
}
