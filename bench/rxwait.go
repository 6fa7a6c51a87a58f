package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/internal/kthread"
)

// rxStall measures the longest stretch a receive kthread of the stress
// generator's core (its ksoftirqd, which runs the softirq work that
// overflows an interrupt's exit, and its cpumap kthreads, Falcon's split
// stage there) stayed runnable without running while a run went on. A
// sender on another machine takes nothing from them, and the generator,
// which stands in for one, yields its core (SCHED_IDLE) for that reason.
// On 6.18 it does not always: sched_switch traces showed the generator's
// thread, looping inside BPF_PROG_RUN, keep that core for over a second
// while its ksoftirqd and a cpumap kthread with frames queued stayed
// runnable (1.4-2.9 s; SCHED_BATCH at nice 19 did the same), and a stage
// placed there lost most of its frames. A run with a long stall measured
// the apparatus as much as the mode.
//
// Sampled every stallEvery: a thread seen runnable (state R) whose run
// time has not grown since the sample before waited all that while (a
// runnable thread cannot sleep without running), so a stall is measured
// to within one interval, never longer than it was.
type rxStall struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	longest map[string]time.Duration // by kind: "cpumap", "ksoftirqd"
}

const stallEvery = 20 * time.Millisecond

// stallFlagMs is the stall the progress line points out: 5 intervals, far
// beyond a scheduler slice (a few ms), which no yielding sender causes.
const stallFlagMs = 100

// coreRxKthread says whether comm names a receive kthread bound to core.
func coreRxKthread(comm string, core int) bool {
	c := strconv.Itoa(core)
	return comm == "ksoftirqd/"+c || strings.HasPrefix(comm, "cpumap/"+c+"/")
}

// threadSample is one thread at one sample: runnable, and its run time.
type threadSample struct {
	runnable bool
	run      uint64
}

// sampleThread reads a thread's state and run time; ok false once it is
// gone.
func sampleThread(pid int) (threadSample, bool) {
	th := kthread.Thread{PID: pid}
	st, err := th.ProcStat()
	if err != nil {
		return threadSample{}, false
	}
	run, _, err := th.Schedstat()
	if err != nil {
		return threadSample{}, false
	}
	return threadSample{runnable: st.State == 'R', run: run}, true
}

// stallTracker follows threads from sample to sample.
type stallTracker struct {
	prev  map[int]threadSample
	since map[int]time.Time // runnable without running since
}

// observe takes a thread's sample at now and returns how long it has
// been runnable without running (0: it ran or slept since the sample
// before, or this is its first).
func (tr *stallTracker) observe(pid int, cur threadSample, now time.Time) time.Duration {
	was, seen := tr.prev[pid]
	tr.prev[pid] = cur
	if !seen || !was.runnable || cur.run != was.run {
		delete(tr.since, pid)
		if cur.runnable {
			tr.since[pid] = now
		}
		return 0
	}
	if !cur.runnable {
		// Cannot be: a runnable thread sleeps only after running.
		delete(tr.since, pid)
		return 0
	}
	return now.Sub(tr.since[pid])
}

// startRxStall starts sampling core's receive kthreads; nil if it has
// none.
func startRxStall(core int) *rxStall {
	ths, err := kthread.List(func(comm string) bool { return coreRxKthread(comm, core) })
	if err != nil || len(ths) == 0 {
		return nil
	}
	s := &rxStall{stop: make(chan struct{}), done: make(chan struct{}), longest: map[string]time.Duration{}}
	go func() {
		defer close(s.done)
		tr := stallTracker{prev: map[int]threadSample{}, since: map[int]time.Time{}}
		tick := time.NewTicker(stallEvery)
		defer tick.Stop()
		for {
			now := time.Now()
			for _, th := range ths {
				cur, ok := sampleThread(th.PID)
				if !ok {
					continue
				}
				if d := tr.observe(th.PID, cur, now); d > 0 {
					kind, _, _ := strings.Cut(th.Comm, "/")
					s.mu.Lock()
					s.longest[kind] = max(s.longest[kind], d)
					s.mu.Unlock()
				}
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// end stops sampling and returns the longest stall seen of a cpumap
// kthread and of ksoftirqd.
func (s *rxStall) end() (cpumap, ksoftirqd time.Duration, ok bool) {
	if s == nil {
		return 0, 0, false
	}
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.longest["cpumap"], s.longest["ksoftirqd"], true
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
