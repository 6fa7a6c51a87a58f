package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lanesnet/lanes/internal/nsx"
)

// Stray is a process running inside one of a testbed's namespaces.
type Stray struct {
	PID   int
	Comm  string
	NetNS string
}

func (s Stray) String() string { return fmt.Sprintf("%s (pid %d, %s)", s.Comm, s.PID, s.NetNS) }

// Strays lists the processes inside the namespaces of the testbed with
// this prefix. A workload started by a run that was killed outlives it
// (lanes starts tools without a parent-death signal: see bench/workload)
// and keeps its sockets in a testbed that the next run reuses.
func Strays(prefix string) []Stray {
	if prefix == "" {
		prefix = "lanes"
	}
	// The daemons that build a real overlay (dockerd, flanneld, etcd)
	// run in the hosts' namespaces too, and are the testbed's own.
	own := map[int]bool{}
	for _, pid := range ownedPIDs(prefix) {
		own[pid] = true
	}
	nss := slices.DeleteFunc(nsx.List(prefix+"-h"), func(ns string) bool { return !IsTestbedNS(prefix, ns) })
	// A runtime's containers are in namespaces it named (dockerd's).
	if tb, err := Load(prefix); err == nil {
		for _, h := range tb.Hosts {
			for _, c := range h.Containers {
				if !slices.Contains(nss, c.NetNS) {
					nss = append(nss, c.NetNS)
				}
			}
		}
	}
	var out []Stray
	for _, ns := range nss {
		for _, pid := range inside(ns) {
			if own[pid] {
				continue
			}
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			out = append(out, Stray{PID: pid, Comm: strings.TrimSpace(string(comm)), NetNS: ns})
		}
	}
	return out
}

// StopStrays kills the processes Strays lists, waits (bounded) until they
// are gone, and returns them.
func StopStrays(prefix string) []Stray {
	st := Strays(prefix)
	var pids []int
	for _, s := range st {
		if syscall.Kill(s.PID, syscall.SIGKILL) == nil {
			pids = append(pids, s.PID)
		}
	}
	waitGone(pids, 5*time.Second)
	return st
}

// killInside kills every process whose network namespace is ns, so a
// workload left over from a crashed run cannot keep the namespace alive.
func killInside(ns string) {
	for _, pid := range inside(ns) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// inside lists the processes (not lanes itself) whose network namespace is
// ns, found as `ip netns pids` finds them: by the namespace file's inode.
func inside(ns string) []int {
	var target syscall.Stat_t
	if err := syscall.Stat(nsx.Path(ns), &target); err != nil {
		return nil
	}
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil || st.Ino != target.Ino || st.Dev != target.Dev {
			continue
		}
		var pid int
		if _, err := fmt.Sscan(filepath.Base(filepath.Dir(filepath.Dir(p))), &pid); err == nil && pid != os.Getpid() && !zombie(pid) {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// zombie: the process has exited (its sockets are closed) and waits to be
// reaped by a parent lanes does not control.
func zombie(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// "pid (comm) S ...": the state follows the last ')'.
	i := strings.LastIndexByte(string(raw), ')')
	return i < 0 || i+2 >= len(raw) || raw[i+2] == 'Z' || raw[i+2] == 'X'
}

// waitGone waits up to limit for the processes (or kernel threads) to exit
// or turn zombie.
func waitGone(pids []int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for _, pid := range pids {
		for time.Now().Before(deadline) && !zombie(pid) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}
