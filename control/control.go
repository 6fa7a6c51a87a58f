// Package control is lanes' engine: it applies a mode to a namespace's
// overlay, undoes it, and reports what runs where.
//
// Apply validates everything first, discovers the topology, asks the mode's
// planner (package plan) for a list of knob changes, undoes the previous
// mode, then journals and applies the changes (package knobs). Nothing is
// left half-applied: a failed change rolls back what came before it, and a
// process killed mid-apply leaves a journal from which Reset or the next
// Apply restores every original value.
package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	_ "github.com/lanesnet/lanes/control/baseline" // the vanilla and rps modes
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/topology"
)

// DefaultStateDir holds one directory per target: its journal and state.
const DefaultStateDir = "/run/lanes"

// StateFile is the state file's name next to the journal.
const StateFile = "state.json"

// Options say what to apply where.
type Options struct {
	Mode  string
	NetNS string // "" = the namespace lanes runs in
	// CPUs is a CPU list ("0-3,6") of the cores the mode may use; "" = all
	// online cores.
	CPUs     string
	StateDir string // "" = DefaultStateDir
	// Params are mode settings (see plan.ParamPlanner); they are kept in
	// the state file so `lanes agent` runs the mode as it was applied.
	Params map[string]string
}

// Target is the name of a namespace's state directory, distinct for
// distinct namespaces (plan.Target).
func Target(netns string) string { return plan.Target(netns) }

// Dir is the state directory of a namespace.
func Dir(stateDir, netns string) string {
	if stateDir == "" {
		stateDir = DefaultStateDir
	}
	return filepath.Join(stateDir, Target(netns))
}

// legacyTarget is the target a former lanes gave a namespace: its name
// with the slashes of a path and the colon of "pid:N" made underscores,
// whatever that reads back as. Target differs from it for a name that
// holds a '.' or a '%', or whose flat form reads back as another
// namespace; a former lanes kept such a namespace's state under this one.
func legacyTarget(netns string) string {
	if netns == "" {
		return "host"
	}
	if strings.HasPrefix(netns, "pid:") {
		netns, _, _ = strings.Cut(netns, "@")
	}
	return strings.NewReplacer("/", "_", ":", "_").Replace(strings.TrimPrefix(netns, "/"))
}

// stateDirOf is where a namespace's state is: Dir, or, where that holds
// none, the directory of its legacy target when that one's state file
// names the namespace. unsure names the legacy directory when it holds
// state with no state file to say whose it is (it may be another
// namespace's of the same flat name): lanes reset --all restores it.
func stateDirOf(stateDir, netns string) (dir, unsure string) {
	dir = Dir(stateDir, netns)
	old := filepath.Join(filepath.Dir(dir), legacyTarget(netns))
	if old == dir || isTargetDir(dir) || !isTargetDir(old) {
		return dir, ""
	}
	st, err := ReadState(old)
	switch {
	case err == nil && st != nil && Target(st.NetNS) == Target(netns):
		return old, ""
	case err == nil && st != nil:
		return dir, "" // another namespace's
	}
	return dir, old
}

// legacyNote says what to do about state stateDirOf could not place.
func legacyNote(unsure string) string {
	return fmt.Sprintf("a former lanes kept state under the old name %s, which may be this namespace's: run lanes reset --all", filepath.Base(unsure))
}

// State is what state.json says about the mode applied to a target.
type State struct {
	Mode   string `json:"mode"`
	NetNS  string `json:"netns"`
	Target string `json:"target"`
	// Phase is "applying" until every change is in, then "applied"; a
	// state left "applying" means the applying process died.
	Phase   string            `json:"phase"`
	PID     int               `json:"pid"`
	Started time.Time         `json:"started"`
	Applied time.Time         `json:"applied,omitzero"`
	CPUs    string            `json:"cpus"`
	Params  map[string]string `json:"params,omitempty"`
	Plan    Summary           `json:"plan"`
	// IRQCPUs are the cores polling the underlay's NIC when the plan was
	// made, which placed its stages for them: lanes agent adopts no new
	// container once they moved. Always written (an empty list is "none
	// known"); absent in state files of older builds.
	IRQCPUs []int `json:"irq_cpus"`
}

// Summary describes an applied plan.
type Summary struct {
	Changes int      `json:"changes"`
	Targets []string `json:"targets,omitempty"` // what was changed, in order
	Notes   []string `json:"notes,omitempty"`
	// Agent is the plan's long-running part, if any (plan.Plan.Agent).
	Agent string `json:"agent,omitempty"`
}

// Phases of State.
const (
	Applying = "applying"
	Applied  = "applied"
)

// testAfterChange lets crash tests kill the process after change i is in.
var testAfterChange func(i int)

// validated is Options after validation.
type validated struct {
	Options
	planner plan.Planner
	cfg     plan.Config
}

func (o Options) validate() (*validated, error) {
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.Mode == "" {
		return nil, fmt.Errorf("no mode given: use --mode with one of %s", strings.Join(plan.Modes(), ", "))
	}
	if err := netnsx.CheckName(o.NetNS); err != nil {
		return nil, err
	}
	p, err := plan.Lookup(o.Mode)
	if err != nil {
		return nil, err
	}
	online, err := cpuset.Online()
	if err != nil {
		return nil, err
	}
	cpus := online
	if strings.TrimSpace(o.CPUs) != "" {
		if cpus, err = cpuset.ParseList(o.CPUs); err != nil {
			return nil, fmt.Errorf("%w: this machine has cores %s", err, cpuset.FormatList(online))
		}
		if err := cpuset.Check(cpus); err != nil {
			return nil, fmt.Errorf("bad CPU list %q: %w", o.CPUs, err)
		}
	}
	if !netnsx.Exists(o.NetNS) {
		return nil, netnsx.NotFoundError(o.NetNS)
	}
	// A process's namespace is kept with its cookie, so the agent and
	// reset never act on another namespace whose process got the PID.
	if o.NetNS, err = netnsx.Pin(o.NetNS); err != nil {
		return nil, err
	}
	if err := plan.CheckParams(p, o.Params); err != nil {
		return nil, err
	}
	if v, ok := o.Params[plan.IRQKey]; ok {
		irq, err := cpuset.ParseList(v)
		if err == nil {
			err = cpuset.Check(irq)
		}
		if err != nil {
			return nil, fmt.Errorf("--set %s=%s: %w", plan.IRQKey, v, err)
		}
	}
	return &validated{Options: o, planner: p, cfg: plan.Config{CPUs: cpus, Online: online, Params: o.Params}}, nil
}

// lockWait is how long apply and reset wait for the state directory while
// another lanes process holds it: lanes agent holds it for a round of
// following containers or for parking, each well under a second.
const lockWait = 10 * time.Second

// Apply applies a mode. Everything that can be checked is checked before
// the first kernel write; the previous mode, if any, is restored first.
func Apply(opts Options) (*State, error) {
	v, err := opts.validate()
	if err != nil {
		return nil, err
	}
	topo, err := topology.Discover(v.NetNS)
	if err != nil {
		return nil, err
	}
	p, err := v.planner.Plan(topo, v.cfg)
	if err != nil {
		return nil, fmt.Errorf("planning %s for netns %s: %w", v.Mode, label(v.NetNS), err)
	}

	dir := Dir(v.StateDir, v.NetNS)
	if err := hostSysctlsHeld(v.StateDir, dir, p); err != nil {
		return nil, err
	}
	// The journal first: an apply that cannot have it (another lanes
	// process holds it) leaves no agent lock behind, which would make
	// the directory a target; and with it held, no reset removes the
	// agent lock held next (removeState runs under the journal's lock).
	j, err := knobs.OpenWait(dir, Target(v.NetNS), lockWait)
	if err != nil {
		return nil, err
	}
	defer j.Close()
	release, err := holdAgentOff(dir, "apply", true)
	if err != nil {
		return nil, err
	}
	defer release()
	if j.Len() > 0 {
		if _, err := j.Restore(); err != nil {
			return nil, fmt.Errorf("restoring the previous mode before applying %s: %w (nothing new applied; see `lanes reset`)", v.Mode, err)
		}
		// What the previous mode's agent kept (Falcon's parked values)
		// is for a plan that is gone.
		os.Remove(filepath.Join(dir, plan.AgentStateFile))
		// The plan above saw the host as the previous mode left it
		// (threads it made, queues it added); the one applied must see
		// it as restored. The first plan checked the settings against
		// the same host, so this one fails only if the restore changed
		// what the new mode needs.
		topo, err = topology.Discover(v.NetNS)
		if err == nil {
			p, err = v.planner.Plan(topo, v.cfg)
		}
		if err != nil {
			// Nothing of any mode is left: no state may say otherwise.
			removeState(dir)
			os.Remove(dir) // while locked: a waiter must not find it between the two
			j.Close()
			removeDefaultDir(v.StateDir)
			return nil, fmt.Errorf("planning %s for netns %s after restoring the previous mode: %w (the previous mode was restored; nothing new applied)", v.Mode, label(v.NetNS), err)
		}
	}
	st := &State{
		Mode:    v.Mode,
		NetNS:   v.NetNS,
		Target:  Target(v.NetNS),
		Phase:   Applying,
		PID:     os.Getpid(),
		Started: time.Now().UTC(),
		CPUs:    cpuset.FormatList(v.cfg.CPUs),
		Params:  v.Params,
		Plan:    Summary{Changes: len(p.Changes), Notes: append(slices.Clone(p.Notes), plan.GROCellNotes(topo)...), Agent: p.Agent},
		IRQCPUs: append([]int{}, plan.IRQCPUsFor(topo, v.Params)...),
	}
	for _, c := range p.Changes {
		st.Plan.Targets = append(st.Plan.Targets, c.Target)
	}
	if err := writeState(dir, st); err != nil {
		return nil, err
	}
	for i, c := range p.Changes {
		if err := j.Set(c.Knob, c.Value); err != nil {
			rep, rerr := j.Restore()
			if rerr != nil {
				return nil, fmt.Errorf("applying %s: %s: %w; rolling back failed too: %v", v.Mode, c.Target, err, rerr)
			}
			removeState(dir)
			os.Remove(dir) // while locked: a waiter must not find it between the two
			j.Close()
			removeDefaultDir(v.StateDir)
			return nil, fmt.Errorf("applying %s: %s: %w (rolled back %d changes)", v.Mode, c.Target, err, len(rep.Restored))
		}
		if testAfterChange != nil {
			testAfterChange(i)
		}
	}
	// The container devices the journal now holds knobs of, so a later
	// lanes agent tells them from devices replaced under the same name;
	// with the journal's generation, so an agent that read the previous
	// apply's state cannot pair it with this file.
	if err := writeDevices(dir, knobs.Generation(j.Entries()), containerDevices(topo).ident); err != nil {
		return nil, err
	}
	st.Phase = Applied
	st.Applied = time.Now().UTC()
	if n := untrackedNote(v.NetNS); n != "" {
		st.Plan.Notes = append(st.Plan.Notes, n)
	}
	if err := writeState(dir, st); err != nil {
		return nil, err
	}
	return st, nil
}

// untrackedNote says so when the applied steering datapath could not
// attach its drop tracepoints (steer.TrackQueues degrades): its flows then
// leave a split-stage queue after the drain time, as before the queue
// accounting, and can be reordered behind a starved kthread; without
// skb:kfree_skb, a later stage's flow with a dropped frame waits for the
// drain time.
func untrackedNote(netns string) string {
	dir := plan.PinDir(netns)
	if !steer.Pinned(dir) {
		return ""
	}
	d, err := steer.OpenQueues(dir)
	if err != nil {
		return ""
	}
	defer d.Close()
	var notes []string
	if _, tracked, err := d.Order().Queues(); err == nil && !tracked {
		notes = append(notes, "the kernel's cpumap drop tracepoints (xdp:xdp_cpumap_enqueue, xdp:xdp_cpumap_kthread) could not be attached: flows leave a split-stage queue after the drain time, and a kthread starved longer than that can see a flow reordered")
	}
	if !steer.LaterDropsTracked(dir) {
		notes = append(notes, "the kernel's skb drop tracepoint (skb:kfree_skb) could not be attached: a flow whose frames a later stage's queue (RPS backlog, GRO cell, veth ring) dropped leaves it after the drain time")
	}
	return strings.Join(notes, "; ")
}

// ResetResult says what Reset did for one target.
type ResetResult struct {
	Target string `json:"target"`
	Dir    string `json:"dir"`
	// Mode is the mode that was in place, from the state file ("" if none).
	Mode    string        `json:"mode,omitempty"`
	Nothing bool          `json:"nothing"` // no journal: nothing to restore
	Report  *knobs.Report `json:"report,omitempty"`
}

// Reset restores everything lanes changed for a namespace and removes its
// state. Without a journal it does nothing and says so (Nothing).
func Reset(netns, stateDir string) (*ResetResult, error) {
	// The name reaches the state directory's path: ".." would reach out.
	if err := netnsx.CheckName(netns); err != nil {
		return nil, err
	}
	dir, unsure := stateDirOf(stateDir, netns)
	release, err := holdAgentOff(dir, "reset", false)
	if err != nil {
		return nil, err
	}
	res, err := resetDir(dir)
	release()
	removeDefaultDir(stateDir)
	if err == nil && unsure != "" {
		err = errors.New(legacyNote(unsure))
	}
	return res, err
}

// removeDefaultDir removes /run/lanes once no target is left in it; a
// directory the user named stays.
func removeDefaultDir(stateDir string) {
	if stateDir == "" || filepath.Clean(stateDir) == DefaultStateDir {
		os.Remove(DefaultStateDir) // fails, as intended, unless empty
	}
}

// ResetAll resets every target that has state under stateDir.
func ResetAll(stateDir string) ([]*ResetResult, error) {
	if stateDir == "" {
		stateDir = DefaultStateDir
	}
	ents, err := os.ReadDir(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing state dir: %w", err)
	}
	// Every target's agent is held off before any is reset: with one
	// running, nothing is.
	var dirs []string
	for _, e := range ents {
		if dir := filepath.Join(stateDir, e.Name()); e.IsDir() && isTargetDir(dir) {
			release, err := holdAgentOff(dir, "reset --all", false)
			if err != nil {
				return nil, err
			}
			defer release()
			dirs = append(dirs, dir)
		}
	}
	var out []*ResetResult
	var errs []error
	for _, dir := range dirs {
		r, err := resetDir(dir)
		if r != nil {
			out = append(out, r)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	removeDefaultDir(stateDir)
	return out, errors.Join(errs...)
}

// isTargetDir: a target's directory holds its journal, its state file or
// its agent's lock; other directories under the state dir (the testbed's
// records) are not targets, and reset --all does not list them.
func isTargetDir(dir string) bool {
	for _, f := range []string{knobs.JournalFile, StateFile, AgentLockFile} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return true
		}
	}
	return false
}

func resetDir(dir string) (*ResetResult, error) {
	res := &ResetResult{Target: filepath.Base(dir), Dir: dir}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		res.Nothing = true
		return res, nil
	}
	target := res.Target
	if st, err := ReadState(dir); err == nil && st != nil {
		res.Mode = st.Mode
		target = st.Target
	}
	// Open checks the journal's own target; take it from the journal so a
	// state file lost in a crash does not block recovery.
	if ents, err := readJournalTarget(dir); err == nil && ents != "" {
		target = ents
	}
	j, err := knobs.OpenWait(dir, target, lockWait)
	if err != nil {
		return res, err
	}
	defer j.Close()
	res.Nothing = j.Len() == 0
	if !res.Nothing {
		rep, err := j.Restore()
		res.Report = rep
		if err != nil {
			return res, fmt.Errorf("resetting %s: %w", res.Target, err)
		}
	}
	removeState(dir)
	os.Remove(dir) // only when empty; the lock is on the open directory, not in it
	return res, nil
}

// hostSysctlsHeld refuses a plan that sets a sysctl of lanes' own (the
// host's) namespace, such as prism's net.core.netdev_budget, while another
// target's journal holds it: each target restores what it found at its
// apply, so two targets sharing one host-wide value would put back each
// other's setting, not the host's.
func hostSysctlsHeld(stateDir, self string, p *plan.Plan) error {
	want := map[string]string{} // key -> what it is
	for _, c := range p.Changes {
		if k, ok := c.Knob.(*knobs.ProcSysFile); ok && k.NetNS == "" {
			want[k.Key()] = k.String()
		}
	}
	if len(want) == 0 {
		return nil
	}
	ents, err := os.ReadDir(stateDir)
	if err != nil {
		return nil // no state dir: no other target
	}
	for _, e := range ents {
		other := filepath.Join(stateDir, e.Name())
		if !e.IsDir() || other == self {
			continue
		}
		held, _ := knobs.ReadEntries(other) // unreadable: reset reports it
		for _, en := range held {
			if what, ok := want[en.Key]; ok {
				target, _ := readJournalTarget(other)
				return fmt.Errorf("%s is host-wide and lanes already set it for target %s: reset that target first (lanes reset) or drop the setting here", what, target)
			}
		}
	}
	return nil
}

func readJournalTarget(dir string) (string, error) {
	b, err := knobs.ReadFileNoFollow(filepath.Join(dir, knobs.JournalFile))
	if err != nil {
		return "", err
	}
	var doc struct {
		Target string `json:"target"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return "", err
	}
	return doc.Target, nil
}

// ReadState reads a target directory's state file; nil when there is none.
func ReadState(dir string) (*State, error) {
	return readJSONFile[State](filepath.Join(dir, StateFile))
}

// readJSONFile parses the JSON file at path; nil, nil when there is none.
func readJSONFile[T any](path string) (*T, error) {
	b, err := knobs.ReadFileNoFollow(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	return &v, nil
}

// writeState replaces the state file atomically (temp file, fsync, rename).
func writeState(dir string, st *State) error {
	return writeJSONFile(filepath.Join(dir, StateFile), st, "state")
}

// writeJSONFile replaces the file at path with v as indented JSON,
// atomically; what names it in the error.
func writeJSONFile(path string, v any, what string) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := knobs.WriteFileAtomic(path, append(b, '\n')); err != nil {
		return fmt.Errorf("writing %s: %w", what, err)
	}
	return nil
}

// removeState removes the state file last: until it goes, `lanes reset
// --all` still finds a directory a crash left half cleaned.
func removeState(dir string) {
	os.Remove(filepath.Join(dir, plan.AgentStateFile))
	os.Remove(filepath.Join(dir, plan.AgentStateFile+".tmp"))
	os.Remove(filepath.Join(dir, DevicesFile))
	os.Remove(filepath.Join(dir, DevicesFile+".tmp"))
	removeAgentReport(dir)
	os.Remove(filepath.Join(dir, AgentLockFile))
	os.Remove(filepath.Join(dir, StateFile+".tmp"))
	os.Remove(filepath.Join(dir, StateFile))
}

func label(ns string) string {
	if ns == "" {
		return "host"
	}
	return ns
}
