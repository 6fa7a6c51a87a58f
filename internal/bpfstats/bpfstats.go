// Package bpfstats reads the kernel's run-time statistics of BPF
// programs (BPF_ENABLE_STATS with BPF_STATS_RUN_TIME: per program, how
// often it ran and the time it took), summed per program name: lanes'
// programs run as one copy per device or namespace, each with its own ID.
//
// The statistics cost two clock reads per program run while enabled, and
// that cost is in every figure taken with them on: compare modes within a
// run that had them on, never with a run that had them off.
package bpfstats

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Run is what programs of one name did: runs and time in all.
type Run struct {
	Count   uint64
	Runtime time.Duration
}

// Snapshot is a Run per program name.
type Snapshot map[string]Run

// Enable turns the kernel's run-time statistics on until the Closer is
// closed (the kernel counts the holders: closing ours leaves another
// holder's, or the sysctl kernel.bpf_stats_enabled, in force). Needs
// Linux >= 5.8 and CAP_SYS_ADMIN.
func Enable() (io.Closer, error) {
	c, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		return nil, fmt.Errorf("enabling BPF run-time statistics: %w", err)
	}
	return c, nil
}

// Take reads every loaded program whose kernel name is in names (a
// kernel name is the program's function name cut to 15 characters: see
// KernelName) and sums their statistics by name. A program that goes away
// while it is read is skipped.
func Take(names map[string]bool) (Snapshot, error) {
	s := Snapshot{}
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return s, nil
		}
		if err != nil {
			return nil, fmt.Errorf("listing BPF programs: %w", err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone since it was listed
		}
		info, err := p.Info()
		if err != nil || !names[info.Name] {
			p.Close()
			continue
		}
		st, err := p.Stats()
		p.Close()
		if err != nil {
			continue
		}
		r := s[info.Name]
		r.Count += st.RunCount
		r.Runtime += st.Runtime
		s[info.Name] = r
	}
}

// Sub is what ran between before and s, per name. A program loaded in
// between counts whole (its statistics started at zero); one unloaded in
// between is missing from s, and with it what it ran since before.
func (s Snapshot) Sub(before Snapshot) Snapshot {
	d := Snapshot{}
	for name, r := range s {
		b := before[name]
		if r.Count < b.Count || r.Runtime < b.Runtime {
			// Copies unloaded in between took their counts with them.
			b = Run{}
		}
		if r.Count > b.Count {
			d[name] = Run{Count: r.Count - b.Count, Runtime: r.Runtime - b.Runtime}
		}
	}
	return d
}

// Total sums a snapshot over its names.
func (s Snapshot) Total() Run {
	var t Run
	for _, r := range s {
		t.Count += r.Count
		t.Runtime += r.Runtime
	}
	return t
}

// SpecNames is the kernel name of every program in spec, sorted.
func SpecNames(spec *ebpf.CollectionSpec) []string {
	names := make([]string, 0, len(spec.Programs))
	for name := range spec.Programs {
		names = append(names, KernelName(name))
	}
	slices.Sort(names)
	return names
}

// KernelName is the name the kernel keeps for a program called name: at
// most BPF_OBJ_NAME_LEN-1 (15) characters.
func KernelName(name string) string {
	if len(name) > unix.BPF_OBJ_NAME_LEN-1 {
		return name[:unix.BPF_OBJ_NAME_LEN-1]
	}
	return name
}
