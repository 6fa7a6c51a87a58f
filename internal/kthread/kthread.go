// Package kthread finds kernel threads by name (NAPI pollers are
// "napi/<dev>-<napi id>", cpumap workers "cpumap/<cpu>/map:<id>") and moves
// them between cores. Kernel threads have no stable pid across a device's
// life, so they are always looked up by name.
package kthread

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Thread is one kernel thread.
type Thread struct {
	PID  int
	Comm string
}

// Find returns the threads whose comm starts with prefix, ordered by pid.
// For kernel threads /proc/PID/comm shows the full name, but names repeat
// across namespaces: prefer the kernel's device -> NAPI -> pid mapping
// (datapath/napi) where one exists.
func Find(prefix string) ([]Thread, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Thread
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		comm := strings.TrimSpace(string(b))
		if strings.HasPrefix(comm, prefix) {
			out = append(out, Thread{PID: pid, Comm: comm})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

// NAPI returns the NAPI poller threads of a device (one per NAPI instance).
func NAPI(dev string) ([]Thread, error) { return Find("napi/" + dev + "-") }

// Pin restricts t to the given cores.
func (t Thread) Pin(cpus ...int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(t.PID, &set); err != nil {
		return fmt.Errorf("pinning %s (pid %d) to %v: %w", t.Comm, t.PID, cpus, err)
	}
	return nil
}

// Affinity returns the cores t may run on.
func (t Thread) Affinity() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(t.PID, &set); err != nil {
		return nil, err
	}
	var out []int
	for c := 0; c < 1024; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// LastCPU is the core t last ran on (field 39 of /proc/PID/stat).
func (t Thread) LastCPU() (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", t.PID))
	if err != nil {
		return -1, err
	}
	// comm may contain spaces: fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1, fmt.Errorf("malformed stat for pid %d", t.PID)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); field 39 is f[36].
	if len(f) < 37 {
		return -1, fmt.Errorf("short stat for pid %d", t.PID)
	}
	return strconv.Atoi(f[36])
}
