//go:build linux

package steer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/bpfstats"
	"golang.org/x/sys/unix"
)

// Pin names of the programs inside a pin directory. Maps are pinned under
// their own names (steer_cfg, steer_table, ...).
const (
	PinXDP       = steerProgSteerXdp
	PinTCIngress = steerProgSteerTcIngress
	PinTCEgress  = steerProgSteerTcEgress
	PinTCSeen    = steerProgSteerTcSeen
	// PinTCSplitSeen ends the split stage's queue on the underlay's tc
	// ingress where steer_tc_ingress (which does the same) is not attached.
	PinTCSplitSeen = steerProgSteerTcSplitSeen
	// PinTCVethClass picks a frame's container-veth receive queue by its
	// class, on a host-side veth's tc egress (Config.VethClass);
	// PinTCVethSeen counts the frames out on the container side's tc
	// ingress.
	PinTCVethClass = steerProgSteerTcVethClass
	PinTCVethSeen  = steerProgSteerTcVethSeen
	// PinNotify counts the changes lanes agent's netlink sockets are
	// told of, which void PRISM-sync's destinations and the fast path's
	// entries (Datapath.CountChanges).
	PinNotify = steerProgSteerNotify
	// PinTCFast is the fast path into the container, for the underlay's
	// tc ingress, PinTCFastVX for a VXLAN device's where the underlay
	// lives in another namespace; PinTCFastLearn learns their entries,
	// on a host-side veth's tc egress (Config.Fast). PinTCFastSeen keeps
	// a flow's frames in order, on each container interface's tc ingress.
	PinTCFast      = steerProgSteerTcFast
	PinTCFastVX    = steerProgSteerTcFastVx
	PinTCFastLearn = steerProgSteerTcFastLearn
	PinTCFastSeen  = steerProgSteerTcFastSeen
	// PinTCFastOut is the fast path out of the container, for a
	// host-side veth's tc ingress; PinTCFastOutLearn learns its entries,
	// on the underlay's tc egress (Config.Fast).
	PinTCFastOut      = steerProgSteerTcOut
	PinTCFastOutLearn = steerProgSteerTcOutLearn
)

// Datapath is one loaded (or reopened) copy of the steer programs and
// their maps: a small core (loading, pinning, the config, the programs,
// the flows and counters, the change count) and one facet per concern of
// the programs, each in the file named after its header under bpf/:
// Placement (place.h), Order (order.h), Prio (prio.h, veth.c), Sync
// (sync.h), Fast (fast.h), Micro (mflow.h), and the split stage's cpumap
// queues (CPUMap, HiCPUMap).
// Attaching the programs is the caller's business; the pins are how a
// restarted control plane finds the same maps the attached programs use.
type Datapath struct{ *core }

// core is what the facets share: the loaded objects and what they were
// loaded for.
type core struct {
	objs steerObjects
	// modeMap holds the load-time constants the programs run (their
	// .rodata, pinned as PinMode), and mode its value (bpf/mode.h).
	modeMap *ebpf.Map
	mode    steerSteerMode
	// loaded: this process loaded the programs, so SetConfig may load
	// them again for another mode; reopened ones may run anywhere.
	loaded bool
	// pinDir is where the datapath is pinned ("": nowhere), and tracked
	// says TrackQueues attached its drop tracepoints there.
	pinDir  string
	tracked bool
	// dropsSkbErr: why steer_drops_skb could not load (a stub took its
	// place), or nil.
	dropsSkbErr error
	// rulesMu is withRules' lock within this process.
	rulesMu sync.Mutex
}

// Load loads the embedded object for Falcon's placement alone (the zero
// Config's mode; SetConfig loads the programs again for another). Nothing
// is pinned or attached, and the config is disabled until SetConfig.
func Load() (*Datapath, error) {
	return load(steerSteerMode{})
}

func load(m steerSteerMode) (*Datapath, error) {
	d := &Datapath{&core{loaded: true}}
	if err := d.loadObjects(m); err != nil {
		return nil, fmt.Errorf("loading steer datapath: %w", err)
	}
	return d, nil
}

// stubDropsSkb replaces the CO-RE programs (steer_drops_skb,
// steer_sync_xmit) by programs that return at once.
func stubDropsSkb(spec *ebpf.CollectionSpec) {
	for _, name := range []string{steerProgSteerDropsSkb, steerProgSteerSyncXmit} {
		if p := spec.Programs[name]; p != nil {
			p.Instructions = asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}
		}
	}
}

// Close releases this process's handles. Pinned or attached objects stay
// in the kernel.
func (d *Datapath) Close() error {
	err := d.objs.Close()
	if d.modeMap != nil {
		err = errors.Join(err, d.modeMap.Close())
	}
	return err
}

// XDP is the STAGE_SPLIT program, for the underlay NIC's XDP hook.
func (d *Datapath) XDP() *ebpf.Program { return d.objs.SteerXdp }

// TCIngress is the STAGE_BRIDGE program, for the underlay NIC's tc ingress.
func (d *Datapath) TCIngress() *ebpf.Program { return d.objs.SteerTcIngress }

// TCEgress is the STAGE_CONTAINER program, for a container's host-side
// veth's tc egress.
func (d *Datapath) TCEgress() *ebpf.Program { return d.objs.SteerTcEgress }

// TCSeen ends the container stage: for the container-side veth's tc
// ingress, where it counts the frames the container stage queued as seen.
func (d *Datapath) TCSeen() *ebpf.Program { return d.objs.SteerTcSeen }

// TCSplitSeen ends the split stage where TCIngress is not attached: for the
// underlay's tc ingress, where it counts queued frames seen and reads
// micro-flows' sequence numbers back from the skb metadata.
func (d *Datapath) TCSplitSeen() *ebpf.Program { return d.objs.SteerTcSplitSeen }

// TCVethClass is PRISM's per-class container queue, for a host-side veth's
// tc egress (Config.VethClass).
func (d *Datapath) TCVethClass() *ebpf.Program { return d.objs.SteerTcVethClass }

// TCVethSeen ends TCVethClass's queues, on the container-side veth's tc
// ingress.
func (d *Datapath) TCVethSeen() *ebpf.Program { return d.objs.SteerTcVethSeen }

// TCFast is the fast path into the container, for the underlay's tc
// ingress (Config.Fast).
func (d *Datapath) TCFast() *ebpf.Program { return d.objs.SteerTcFast }

// TCFastVX is the fast path from a VXLAN device's tc ingress, for tests.
func (d *Datapath) TCFastVX() *ebpf.Program { return d.objs.SteerTcFastVx }

// TCFastLearn learns the fast path's entries, for a host-side veth's tc
// egress (Config.Fast).
func (d *Datapath) TCFastLearn() *ebpf.Program { return d.objs.SteerTcFastLearn }

// TCFastSeen keeps the fast path's flows in order, for a container
// interface's tc ingress (Config.Fast).
func (d *Datapath) TCFastSeen() *ebpf.Program { return d.objs.SteerTcFastSeen }

type pinnedMap struct {
	name string
	m    **ebpf.Map
}

// spec is the map's name in the object: the pin's, but for the mode's.
func (m pinnedMap) spec() string {
	if m.name == PinMode {
		return ".rodata"
	}
	return m.name
}

type pinnedProg struct {
	name string
	p    **ebpf.Program
}

func (d *core) pinnedMaps() []pinnedMap {
	o := &d.objs
	return []pinnedMap{
		{steerMapSteerCfg, &o.SteerCfg},
		{steerMapSteerVni, &o.SteerVni},
		{steerMapSteerTable, &o.SteerTable},
		{steerMapSteerFlows, &o.SteerFlows},
		{steerMapSteerEpochs, &o.SteerEpochs},
		{steerMapSteerCpumap, &o.SteerCpumap},
		{steerMapSteerCpumapHi, &o.SteerCpumapHi},
		{steerMapSteerPrio, &o.SteerPrio},
		{steerMapSteerPrioShapes, &o.SteerPrioShapes},
		{steerMapSteerStats, &o.SteerStats},
		{steerMapSteerMfCores, &o.SteerMfCores},
		{steerMapSteerSync, &o.SteerSync},
		{steerMapSteerSyncDev, &o.SteerSyncDev},
		{steerMapSteerSyncSrc, &o.SteerSyncSrc},
		{steerMapSteerSyncLocal, &o.SteerSyncLocal},
		{steerMapSteerChanges, &o.SteerChanges},
		{steerMapSteerFast, &o.SteerFast},
		{steerMapSteerFastNotes, &o.SteerFastNotes},
		{steerMapSteerFastFlight, &o.SteerFastFlight},
		{steerMapSteerFastFrags, &o.SteerFastFrags},
		{steerMapSteerFastLease, &o.SteerFastLease},
		{steerMapSteerFastVxlan, &o.SteerFastVxlan},
		{steerMapSteerFastDev, &o.SteerFastDev},
		{steerMapSteerFastout, &o.SteerFastout},
		{steerMapSteerFastoutNotes, &o.SteerFastoutNotes},
		{steerMapSteerFastoutVxlan, &o.SteerFastoutVxlan},
		{steerMapSteerFastoutDev, &o.SteerFastoutDev},
		{steerMapSteerPrioSeen, &o.SteerPrioSeen},
		{steerMapSteerHighInline, &o.SteerHighInline},
		{steerMapSteerAside, &o.SteerAside},
		{steerMapSteerAsidePass, &o.SteerAsidePass},
		{steerMapSteerHighFrames, &o.SteerHighFrames},
		{steerMapSteerBulkSeen, &o.SteerBulkSeen},
		{steerMapSteerHighSeen, &o.SteerHighSeen},
		{steerMapSteerPassedTick, &o.SteerPassedTick},
		{steerMapSteerQueues, &o.SteerQueues},
		{steerMapSteerQmaps, &o.SteerQmaps},
		{steerMapSteerQueueLost, &o.SteerQueueLost},
		{steerMapSteerVethClass, &o.SteerVethClass},
		{steerMapSteerAdopt, &o.SteerAdopt},
		{PinMode, &d.modeMap},
	}
}

func (d *core) pinnedProgs() []pinnedProg {
	o := &d.objs
	return []pinnedProg{
		{PinXDP, &o.SteerXdp},
		{PinTCIngress, &o.SteerTcIngress},
		{PinTCEgress, &o.SteerTcEgress},
		{PinTCSeen, &o.SteerTcSeen},
		{PinTCSplitSeen, &o.SteerTcSplitSeen},
		{PinTCVethClass, &o.SteerTcVethClass},
		{PinTCVethSeen, &o.SteerTcVethSeen},
		{PinNotify, &o.SteerNotify},
		{PinTCFast, &o.SteerTcFast},
		{PinTCFastVX, &o.SteerTcFastVx},
		{PinTCFastLearn, &o.SteerTcFastLearn},
		{PinTCFastSeen, &o.SteerTcFastSeen},
		{PinTCFastOut, &o.SteerTcOut},
		{PinTCFastOutLearn, &o.SteerTcOutLearn},
	}
}

// pinNames lists every pin this package creates in a directory.
func pinNames() []string {
	d := Datapath{&core{}}
	var names []string
	for _, m := range d.pinnedMaps() {
		names = append(names, m.name)
	}
	for _, p := range d.pinnedProgs() {
		names = append(names, p.name)
	}
	for _, tr := range dropTraces {
		names = append(names, tr.pin)
	}
	return names
}

// Pin pins every map and program as dir/<name>, creating dir. Pins of
// another datapath already there are an error (reopen them with Open, or
// Unpin them first), and nothing of this one is left pinned; pinning the
// same Datapath in the same place again changes nothing.
func (d *Datapath) Pin(dir string) error {
	if err := checkBPFFS(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating pin directory: %w", err)
	}
	var done []interface{ Unpin() error }
	undo := func() {
		for _, o := range done {
			_ = o.Unpin()
		}
	}
	for _, m := range d.pinnedMaps() {
		if err := (*m.m).Pin(filepath.Join(dir, m.name)); err != nil {
			undo()
			return fmt.Errorf("pinning map %s: %w", m.name, err)
		}
		done = append(done, *m.m)
	}
	for _, p := range d.pinnedProgs() {
		if err := (*p.p).Pin(filepath.Join(dir, p.name)); err != nil {
			undo()
			return fmt.Errorf("pinning program %s: %w", p.name, err)
		}
		done = append(done, *p.p)
	}
	d.pinDir = dir
	return nil
}

// checkBPFFS fails unless dir is, or would be created, on a bpf
// filesystem: pinning anywhere else fails with an errno that does not say
// why.
func checkBPFFS(dir string) error {
	p := filepath.Clean(dir)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			if st.Type != unix.BPF_FS_MAGIC {
				return fmt.Errorf("pin directory %s: %s is not on a bpf filesystem (mount -t bpf bpf /sys/fs/bpf)", dir, p)
			}
			return nil
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("pin directory %s: %w", dir, err)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return fmt.Errorf("pin directory %s: %w", dir, err)
		}
		p = parent
	}
}

// Open reopens a datapath pinned in dir by Pin, for example by a
// restarted control plane. Maps whose layout differs from this build's are
// refused: the programs and the control plane must agree on them.
func Open(dir string) (*Datapath, error) {
	d, spec, err := openMaps(dir, nil)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Datapath, error) {
		d.Close()
		return nil, err
	}
	for _, p := range d.pinnedProgs() {
		path := filepath.Join(dir, p.name)
		pp, err := ebpf.LoadPinnedProgram(path, nil)
		if err != nil {
			return fail(fmt.Errorf("opening pinned program %s: %w", path, err))
		}
		*p.p = pp
		if want := spec.Programs[p.name].Type; pp.Type() != want {
			return fail(fmt.Errorf("pinned program %s is %s, want %s", path, pp.Type(), want))
		}
	}
	d.pinDir = dir
	return d, nil
}

// openMaps reopens the pinned maps of dir that only names (nil: every
// one), leaving the others nil, and checks each against this build's
// layout. A knob that touches one map opens only that one, so it can still
// restore it when the datapath was pinned by a lanes whose other maps
// differ (upgraded while a mode was applied; `lanes reset` then unpins the
// rest).
func openMaps(dir string, only []string) (*Datapath, *ebpf.CollectionSpec, error) {
	spec, err := steerSpec()
	if err != nil {
		return nil, nil, err
	}
	d := &Datapath{&core{pinDir: dir}}
	// The config is read with the mode the programs run (configOnly).
	if slices.Contains(only, steerMapSteerCfg) && !slices.Contains(only, PinMode) {
		only = append(slices.Clone(only), PinMode)
	}
	for _, m := range d.pinnedMaps() {
		if only != nil && !slices.Contains(only, m.name) {
			continue
		}
		path := filepath.Join(dir, m.name)
		pm, err := ebpf.LoadPinnedMap(path, nil)
		if err == nil {
			*m.m = pm
			err = compatible(spec.Maps[m.spec()], pm)
		}
		if err != nil {
			d.Close()
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil, &OtherVersionError{Dir: dir, Map: m.name, Err: err}
			}
			return nil, nil, &OtherVersionError{Dir: dir, Map: m.name, Err: err, Layout: true}
		}
	}
	if d.modeMap != nil {
		if err := d.readMode(spec); err != nil {
			d.Close()
			return nil, nil, err
		}
	}
	return d, spec, nil
}

// steerSpec is the embedded object's spec as this host loads it, parsed
// once: openMaps only reads it (map layouts, program types), and scrapes
// open maps often.
var steerSpec = sync.OnceValues(hostSpec)

// hostSpec is the embedded object's spec with the maps sized for this host
// (FlowEntries).
func hostSpec() (*ebpf.CollectionSpec, error) {
	spec, err := loadSteer()
	if err != nil {
		return nil, err
	}
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("counting possible CPUs: %w", err)
	}
	spec.Maps[steerMapSteerFlows].MaxEntries = FlowEntries(n)
	return spec, nil
}

// FlowEntries is steer_flows' size on a host with cpus possible CPUs: the
// three stages' states of every flow, with room for 4096 flows per CPU
// (at least 16384 states, a power of two, at most 2^20). The kernel's LRU
// keeps part of its free entries on each CPU's own list and evicts per
// CPU, so a map of fixed size on a large host evicts busy flows long
// before it is full; an evicted flow's next frame makes its state anew
// where the old one's frames went, in another count epoch (bpf/order.h's
// remake).
func FlowEntries(cpus int) uint32 {
	n := uint32(16384)
	for n < uint32(cpus)*4096 && n < 1<<20 {
		n <<= 1
	}
	return n
}

// OtherVersionError is a pinned datapath whose maps this build cannot use:
// one is missing or laid out differently, so another version of lanes
// pinned it. Knobs that restore one map open only that map (openMaps);
// `lanes reset` unpins the rest.
type OtherVersionError struct {
	Dir, Map string
	Layout   bool // the map exists with another layout
	Err      error
}

func (e *OtherVersionError) Error() string {
	if e.Layout {
		return fmt.Sprintf("pinned map %s in %s: %v (another version of lanes pinned this datapath: lanes reset removes it)", e.Map, e.Dir, e.Err)
	}
	return fmt.Sprintf("the datapath pinned in %s has no map %s: another version of lanes pinned it (lanes reset removes it)", e.Dir, e.Map)
}

func (e *OtherVersionError) Unwrap() error { return e.Err }

// openForRestore opens only names for a knob's restore. Pins of another
// version whose own such map this build cannot use count as gone: the
// restore has nothing it could write there, and the reset unpins them.
func openForRestore(dir string, names ...string) (*Datapath, error) {
	if !Pinned(dir) {
		return nil, fmt.Errorf("steer datapath in %s: %w", dir, knobs.ErrGone)
	}
	d, _, err := openMaps(dir, names)
	var ov *OtherVersionError
	if errors.As(err, &ov) {
		return nil, fmt.Errorf("%w: %w", knobs.ErrGone, err)
	}
	return d, err
}

// retiredPins are maps earlier builds pinned and this one no longer has:
// a reset after an upgrade removes them too, so the pin directory goes.
var retiredPins = []string{
	"steer_backlog",          // until 5ee276d (the RPS backlog samples, reverted)
	"steer_busy_high_seen",   // until a78ce34: now steer_high_seen
	"steer_queued_high_seen", // until a78ce34: now steer_high_seen
	"steer_sync_changes",     // now steer_changes, which the fast path shares
	"steer_sync_notify",      // now steer_notify
}

// Unpin removes the pins Pin creates in dir (and those of earlier builds,
// retiredPins), the rule set's lock (PinRulesLock), and dir if that
// leaves it empty. Missing pins are not an error. Attached programs keep
// running until detached.
func Unpin(dir string) error {
	var errs []error
	for _, name := range slices.Concat(pinNames(), retiredPins, []string{PinRulesLock}) {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpinning: %w", err))
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		errs = append(errs, fmt.Errorf("removing pin directory: %w", err))
	}
	return errors.Join(errs...)
}

// ProgramNames is the name of every program in the steering object, as
// the kernel keeps it (cut to 15 characters): what a reader of the kernel's
// per-program statistics looks for (internal/bpfstats).
func ProgramNames() ([]string, error) {
	spec, err := steerSpec()
	if err != nil {
		return nil, err
	}
	return bpfstats.SpecNames(spec), nil
}
