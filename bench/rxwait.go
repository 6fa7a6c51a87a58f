package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/internal/kthread"
)

// The stress generator stands in for a sender on another machine and
// yields its core (SCHED_IDLE) for that reason. On 6.18 it does not
// always: sched_switch traces showed its thread, looping inside
// BPF_PROG_RUN, keep that core for over a second while a cpumap kthread
// with frames queued there stayed runnable (1.4-4.4 s; SCHED_BATCH at
// nice 19 did the same), and a stage placed there lost most of its frames.
// So each repeat records the longest stretch a cpumap kthread on the
// generator's core stayed runnable without running (kthread.Stalls); a
// repeat with a long stall measured the apparatus as much as the mode.
// The core's ksoftirqd is left out: the generator runs the softirqs
// pending on its core itself at every batch, so a stalled ksoftirqd
// there holds nothing back.

const stallEvery = 20 * time.Millisecond

// stallFlagMs is the stall the progress line points out: 5 intervals, far
// beyond a scheduler slice (a few ms), which no yielding sender causes.
const stallFlagMs = 100

// coreCPUMap says whether comm names a cpumap kthread bound to core.
func coreCPUMap(comm string, core int) bool {
	return strings.HasPrefix(comm, "cpumap/"+strconv.Itoa(core)+"/")
}

// startRxStall samples core's cpumap kthreads; nil if it has none (those
// a mode creates during the run are not followed: apply comes first).
func startRxStall(core int) *kthread.Stalls {
	return kthread.StartStalls(func(comm string) bool { return coreCPUMap(comm, core) }, stallEvery)
}

// longestStall is the longest stall among ss, and whether there was
// anything to sample.
func longestStall(ss *kthread.Stalls) (time.Duration, bool) {
	if ss == nil {
		return 0, false
	}
	var d time.Duration
	for _, st := range ss.End() {
		d = max(d, st.Longest)
	}
	return d, true
}

// stallNote says, per mode and point, how many repeats had a cpumap
// kthread on the generator's core stalled stallFlagMs or more: "" if none.
func stallNote(runs []results.Run) string {
	type key struct{ mode, point string }
	stalled, all := map[key]int{}, map[key]int{}
	var keys []key
	for _, r := range runs {
		ms, ok := r.Extra["gen_core_cpumap_stall_ms"]
		if !ok {
			continue
		}
		k := key{r.Mode, point{workload: r.Workload, proto: r.Proto, msgSize: r.MsgSize, flows: r.Flows, background: r.Background, rate: r.Rate, awake: r.Awake}.String()}
		if all[k] == 0 {
			keys = append(keys, k)
		}
		all[k]++
		if ms >= stallFlagMs {
			stalled[k]++
		}
	}
	var parts []string
	for _, k := range keys {
		if stalled[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s at %s in %d of %d", k.mode, k.point, stalled[k], all[k]))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	slices.Sort(parts)
	return fmt.Sprintf("A cpumap kthread on the stress generator's core stayed runnable for %d ms or more without running (the generator held the core; a sender on another machine would not): %s repeats. Those repeats measured the testbed's sender as much as the mode (gen_core_cpumap_stall_ms in results.json; bench/rxwait.go).", stallFlagMs, strings.Join(parts, "; "))
}
