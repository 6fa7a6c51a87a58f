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
	"fmt"
	"sort"
	"strings"
	"sync"

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
}

// Change sets one knob.
type Change struct {
	Knob  knobs.Knob
	Value []byte
	// Target names what the knob belongs to for people: "NETNS/DEV rx-0",
	// "kthread napi/eth0-8195".
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

// DeviceTarget is the Target label of a device's rx queue.
func DeviceTarget(d *topology.Device, queue int) string {
	ns := d.NetNS
	if ns == "" {
		ns = "host"
	}
	return fmt.Sprintf("%s/%s rx-%d", ns, d.Name, queue)
}
