// Package kthread reads and moves one thread by pid: its affinity, last
// CPU and flags. Finding the thread is elsewhere: datapath/napi maps a
// device to its NAPI pollers' pids, and datapath/knobs looks threads up by
// name for the journal (pids change across a device's life).
package kthread

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Thread is one kernel thread.
type Thread struct {
	PID  int
	Comm string
}

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
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// LastCPU is the core t last ran on (field 39 of /proc/PID/stat).
func (t Thread) LastCPU() (int, error) {
	_, cpu, err := t.Stat()
	return cpu, err
}

// Stat returns the flags (field 9, e.g. PF_KTHREAD) and the last CPU
// (field 39) of /proc/PID/stat. comm may contain spaces and parentheses,
// so fields are counted from the last ')'.
func (t Thread) Stat() (flags uint64, cpu int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", t.PID))
	if err != nil {
		return 0, -1, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, -1, fmt.Errorf("malformed /proc/%d/stat", t.PID)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 37 {
		return 0, -1, fmt.Errorf("short /proc/%d/stat", t.PID)
	}
	if flags, err = strconv.ParseUint(f[6], 10, 64); err != nil {
		return 0, -1, err
	}
	cpu, err = strconv.Atoi(f[36])
	return flags, cpu, err
}
