package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/internal/kthread"
)

// A repeat's stall figure: the longest stretch a cpumap kthread on the
// stress generator's core stayed runnable without running
// (kthread.Stalls). The generator stands in for a sender on another
// machine and yields its core (SCHED_IDLE) so that a stage placed there
// runs as it would on a receiver of its own; a long stall says it did not
// (docs/testbed.md: on this kernel it held such a kthread off for
// seconds), and that repeat measured the testbed's sender as much as the
// mode. The core's ksoftirqd is left out: the generator runs the softirqs
// pending on its core itself at every batch, so a waiting ksoftirqd there
// holds nothing back.

const stallEvery = 20 * time.Millisecond

// stallFlagMs is the stall the progress line points out: 5 intervals, far
// beyond a scheduler slice (a few ms), which no yielding sender causes.
const stallFlagMs = 100

// startRxStall samples core's cpumap kthreads; nil if it has none (those
// a mode creates during the run are not followed: apply comes first).
func startRxStall(core int) *kthread.Stalls {
	return kthread.StartStalls(func(comm string) bool { return kthread.CPUMapOn(comm, core) }, stallEvery)
}

// longestStall is the longest stall among ss, and whether there was
// anything to sample.
func longestStall(ss *kthread.Stalls) (time.Duration, bool) {
	stalls, ok := ss.End()
	var d time.Duration
	for _, st := range stalls {
		d = max(d, st.Longest)
	}
	return d, ok
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
	return fmt.Sprintf("A cpumap kthread on the stress generator's core stayed runnable for %d ms or more without running (a task on that core held it; in sched_switch traces of such repeats, the stress generator, which a sender on another machine would not be: docs/testbed.md): %s repeats. Those repeats measured the testbed's sender as much as the mode (gen_core_cpumap_stall_ms in results.json; bench/rxwait.go).", stallFlagMs, strings.Join(parts, "; "))
}
