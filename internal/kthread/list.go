package kthread

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Info is a kernel thread as /proc and the scheduler show it.
type Info struct {
	PID      int    `json:"pid"`
	Comm     string `json:"comm"`
	Index    int    `json:"index,omitempty"` // among threads with the same comm, in pid order
	CPUs     []int  `json:"cpus"`            // affinity
	Policy   string `json:"policy"`          // other, fifo, rr, batch, idle, deadline
	Priority int    `json:"priority"`        // RT priority (fifo, rr), 0 otherwise
	Nice     int    `json:"nice"`
	LastCPU  int    `json:"last_cpu"` // the CPU it last ran on
	// Started is its start time (boot-relative ticks): with PID, what
	// tells it from a thread that took its pid since.
	Started uint64 `json:"started,omitempty"`
}

// List returns the kernel threads whose comm satisfies match, in pid
// order, with their affinity and scheduling. /proc/PID/comm of a kernel
// thread holds its full name, not the 15-character task comm.
func List(match func(comm string) bool) ([]Info, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing /proc: %w", err)
	}
	var out []Info
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil {
			continue // exited meanwhile
		}
		comm := strings.TrimSuffix(string(b), "\n")
		if !match(comm) {
			continue
		}
		ps, err := Thread{PID: pid}.ProcStat()
		if err != nil || !ps.Kthread {
			continue
		}
		info := Info{PID: pid, Comm: comm, LastCPU: ps.CPU, Started: ps.StartTime}
		if cpus, err := (Thread{PID: pid}).Affinity(); err == nil {
			info.CPUs = cpus
		}
		if a, err := unix.SchedGetAttr(pid, 0); err == nil {
			info.Policy = PolicyName(a.Policy)
			info.Priority = int(a.Priority)
			info.Nice = int(a.Nice)
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	seen := map[string]int{}
	for i := range out {
		out[i].Index = seen[out[i].Comm]
		seen[out[i].Comm]++
	}
	return out, nil
}

// policies names the kernel's scheduling policies.
var policies = map[uint32]string{
	unix.SCHED_NORMAL:   "other",
	unix.SCHED_FIFO:     "fifo",
	unix.SCHED_RR:       "rr",
	unix.SCHED_BATCH:    "batch",
	unix.SCHED_IDLE:     "idle",
	unix.SCHED_DEADLINE: "deadline",
}

// PolicyName is the short name of scheduling policy p (Info.Policy, the
// policy= of a kthread-sched knob), or its number when it has none.
func PolicyName(p uint32) string {
	if n, ok := policies[p]; ok {
		return n
	}
	return strconv.FormatUint(uint64(p), 10)
}

// PolicyByName is the inverse of PolicyName for the named policies.
func PolicyByName(name string) (uint32, bool) {
	for p, n := range policies {
		if n == name {
			return p, true
		}
	}
	return 0, false
}
