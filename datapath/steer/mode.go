//go:build linux

package steer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// The mode: what a config fixes for as long as it is applied, set as
// constants (bpf/mode.h, struct steer_mode) before the programs are
// loaded, so the verifier drops the code of every feature the mode leaves
// out. Its flags' bits are apart from steer_cfg.flags' (the runtime
// switches: enabled, home, the bare path), so both read as one set. Each
// is bpf/mode.h's MODE_* of its name; TestConstsMatchC checks them, and
// that every MODE_* has one.
const (
	modePrio           = 0x2
	modeCountSplit     = 0x4
	modeMFlow          = 0x8
	modeMFlowBridge    = 0x10
	modeNoBridgeCount  = 0x20
	modeSync           = 0x40
	modePrioIdleInline = 0x400
	modeVethClass      = 0x800
	modeStayQueued     = 0x1000
	modeFast           = 0x4000
	modeFastNoGSO      = 0x8000
	modeFastBeside     = 0x10000
)

// mflowFlag is the mode flag of each split point.
var mflowFlag = map[SplitAt]uint32{SplitAtIRQ: modeMFlow, SplitAtBridge: modeMFlowBridge}

// directOff is the mode flags under which the bridge stage never runs on
// (bpf/place.h's direct_ok).
const directOff = modeMFlow | modeMFlowBridge | modeNoBridgeCount | modeStayQueued

// PinMode is the pin of the programs' load-time constants (their .rodata
// map), so a reopened datapath knows what its programs were loaded for.
const PinMode = "steer_mode"

// modeOf is the load-time constants a (normalized) config needs.
func modeOf(c Config) steerSteerMode {
	var m steerSteerMode
	for _, f := range []struct {
		on   bool
		flag uint32
	}{
		{c.Prio, modePrio}, {c.CountSplit, modeCountSplit}, {c.NoBridgeCount, modeNoBridgeCount},
		{c.StayQueued, modeStayQueued}, {c.Sync, modeSync}, {c.PrioIdleInline, modePrioIdleInline},
		{c.VethClass, modeVethClass}, {c.Fast, modeFast}, {c.FastNoGSO, modeFastNoGSO}, {c.FastBeside, modeFastBeside},
	} {
		if f.on {
			m.Flags |= f.flag
		}
	}
	m.Flags |= mflowFlag[c.MFlow.At]
	m.PrioQuietMs = uint32(c.PrioQuiet / time.Millisecond)
	m.HighAutoPps = c.HighAutoPPS
	m.BulkQuietMs = uint32(c.BulkQuiet / time.Millisecond)
	m.BulkAutoMs = uint32(c.BulkAuto / time.Millisecond)
	m.InlineCpu = uint32(c.InlineCPU)
	m.AsidePct = c.AsideBelow
	m.AsideDepth = c.AsideDepth
	m.FastIdleMs = uint32(c.FastIdle / time.Millisecond)
	return m
}

// modeString names a mode's features, for errors.
func modeString(m steerSteerMode) string {
	var s []string
	for _, f := range []struct {
		flag uint32
		name string
	}{
		{modePrio, "prio"}, {modeCountSplit, "count-split"}, {modeMFlow, "mflow-irq"}, {modeMFlowBridge, "mflow-bridge"},
		{modeNoBridgeCount, "no-bridge-count"}, {modeSync, "sync"}, {modePrioIdleInline, "prio-idle-inline"},
		{modeVethClass, "veth-class"}, {modeStayQueued, "stay-queued"}, {modeFast, "fast"}, {modeFastNoGSO, "fast-no-gso"}, {modeFastBeside, "fast-beside"},
	} {
		if m.Flags&f.flag != 0 {
			s = append(s, f.name)
		}
	}
	for _, v := range []struct {
		n    uint32
		name string
	}{{m.PrioQuietMs, "prio-quiet-ms"}, {m.HighAutoPps, "high-auto-pps"}, {m.BulkQuietMs, "bulk-quiet-ms"}, {m.BulkAutoMs, "bulk-auto-ms"}, {m.InlineCpu, "inline-cpu"}, {m.AsidePct, "aside-pct"}, {m.AsideDepth, "aside-depth"}, {m.FastIdleMs, "fast-idle-ms"}} {
		if v.n != 0 {
			s = append(s, fmt.Sprintf("%s=%d", v.name, v.n))
		}
	}
	if len(s) == 0 {
		return "placement alone"
	}
	return strings.Join(s, ",")
}

// LoadFor loads the embedded object specialized for c's mode (every
// setting of Config but the core set, the move rules, the port and the
// VNIs): the verifier drops what c does not use. Nothing is pinned or
// attached, and the config is disabled until SetConfig(c).
func LoadFor(c Config) (*Datapath, error) {
	c, err := c.normalized()
	if err != nil {
		return nil, err
	}
	return load(modeOf(c))
}

// loadTarget is what a load assigns: the programs, the maps unless they
// are given, and the load-time constants' map.
type loadTarget struct {
	steerPrograms
	Mode *ebpf.Map `ebpf:".rodata"`
}

type loadTargetMaps struct {
	loadTarget
	steerMaps
}

// loadObjects loads the programs for mode m into d: with d's own maps if
// it has them (the programs are replaced, the maps kept), else with new
// ones. steer_drops_skb and steer_sync_xmit read kernel structs through
// CO-RE, which needs the kernel's BTF; every other program works without.
// Where they cannot load (no BTF, a relocation that fails), stubs that
// count nothing take their place, never attached (TrackQueues reports
// it), and the rest of the datapath works. Only vmlinux's types are
// searched, not every module's.
func (d *core) loadObjects(m steerSteerMode) error {
	spec, err := hostSpec()
	if err != nil {
		return err
	}
	if err := spec.Variables[steerVarSteerMode].Set(m); err != nil {
		return fmt.Errorf("setting the mode: %w", err)
	}
	opts := &ebpf.CollectionOptions{}
	reuse := d.objs.SteerCfg != nil
	if reuse {
		opts.MapReplacements = map[string]*ebpf.Map{}
		for _, pm := range d.pinnedMaps() {
			if pm.name != PinMode {
				opts.MapReplacements[pm.name] = *pm.m
			}
		}
	}
	var stubErr error
	if kt, err := btf.LoadKernelSpec(); err != nil {
		stubErr = fmt.Errorf("no kernel BTF: %w", err)
		stubDropsSkb(spec)
	} else {
		opts.Programs = ebpf.ProgramOptions{KernelTypes: kt}
	}
	var fresh loadTargetMaps
	assign := func() error {
		if reuse {
			return spec.LoadAndAssign(&fresh.loadTarget, opts)
		}
		return spec.LoadAndAssign(&fresh, opts)
	}
	err = assign()
	if err != nil && stubErr == nil {
		first := err
		stubDropsSkb(spec)
		if err = assign(); err == nil {
			stubErr = first
		}
	}
	if err != nil {
		return err
	}
	if reuse {
		_ = d.objs.steerPrograms.Close()
		if d.modeMap != nil {
			d.modeMap.Close()
		}
	} else {
		d.objs.steerMaps = fresh.steerMaps
	}
	d.objs.steerPrograms = fresh.steerPrograms
	d.modeMap = fresh.Mode
	d.mode = m
	d.dropsSkbErr = stubErr
	return nil
}

// setMode makes the programs run mode m. A datapath this process loaded
// has its programs loaded again over the same maps, its pins (Pin) and its
// drop tracepoints (TrackQueues) replaced; the programs handed out before
// (XDP, TCIngress, ...), and links that run them elsewhere, keep the old
// mode: attach them after the last SetConfig. A reopened datapath (Open)
// refuses, since links anywhere may run its programs.
func (d *core) setMode(m steerSteerMode) error {
	if m == d.mode {
		return nil
	}
	if !d.loaded {
		return fmt.Errorf("the steer programs pinned in %s run %s, and this config needs %s: lanes reset, then apply it", d.pinDir, modeString(d.mode), modeString(m))
	}
	if err := d.loadObjects(m); err != nil {
		return fmt.Errorf("loading the steer programs for %s: %w", modeString(m), err)
	}
	if d.pinDir == "" {
		return nil
	}
	pins := []struct {
		name string
		obj  interface{ Pin(string) error }
	}{{PinMode, d.modeMap}}
	for _, p := range d.pinnedProgs() {
		pins = append(pins, struct {
			name string
			obj  interface{ Pin(string) error }
		}{p.name, *p.p})
	}
	for _, p := range pins {
		path := filepath.Join(d.pinDir, p.name)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("replacing the pin %s: %w", path, err)
		}
		if err := p.obj.Pin(path); err != nil {
			return fmt.Errorf("replacing the pin %s: %w", path, err)
		}
	}
	if d.tracked {
		var nt *NoDropTracesError
		if err := (Order{d}).TrackQueues(d.pinDir); err != nil && !errors.As(err, &nt) {
			return err
		}
	}
	return nil
}

// readMode reads the load-time constants from the mode map (the value of
// .rodata, at steer_mode's place in it).
func (d *core) readMode(spec *ebpf.CollectionSpec) error {
	v := spec.Variables[steerVarSteerMode]
	buf := make([]byte, d.modeMap.ValueSize())
	if err := d.modeMap.Lookup(uint32(0), buf); err != nil {
		return fmt.Errorf("reading the steer programs' mode: %w", err)
	}
	end := v.Offset + v.Size()
	if end > uint32(len(buf)) {
		return fmt.Errorf("reading the steer programs' mode: %d bytes, want %d", len(buf), end)
	}
	if _, err := binary.Decode(buf[v.Offset:end], binary.NativeEndian, &d.mode); err != nil {
		return fmt.Errorf("reading the steer programs' mode: %w", err)
	}
	return nil
}

// compatible checks a pinned map against the spec's, allowing what the
// loader adds at load time (BPF_F_MMAPABLE on a data section).
func compatible(ms *ebpf.MapSpec, pm *ebpf.Map) error {
	if strings.HasPrefix(ms.Name, ".") {
		ms = ms.Copy()
		ms.Flags |= pm.Flags() & unix.BPF_F_MMAPABLE
	}
	return ms.Compatible(pm)
}
