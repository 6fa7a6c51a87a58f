package kthread

import (
	"strings"
	"sync"
	"time"
)

// A kernel thread that stays runnable without running for long starves:
// on 6.18 a low-weight thread looping in the kernel (SCHED_IDLE, or
// SCHED_BATCH at nice 19) kept a woken receive kthread of its core off the
// core for seconds now and then. Stalls finds such stretches by sampling:
// a thread seen runnable (state R) whose run time has not grown since the
// sample before waited all that while (a runnable thread cannot sleep
// without running), so a stall is measured to within one interval, never
// longer than it was.

// Stall is the longest stretch one thread stayed runnable without running.
type Stall struct {
	PID     int
	Comm    string
	CPU     int // the core it last ran on
	Longest time.Duration
}

// Stalls samples a set of kernel threads until End.
type Stalls struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	by   map[int]*Stall
}

// StartStalls samples the kernel threads whose comm satisfies match every
// interval (threads that appear later are not followed); nil if there are
// none.
func StartStalls(match func(comm string) bool, every time.Duration) *Stalls {
	ths, err := List(match)
	if err != nil || len(ths) == 0 {
		return nil
	}
	s := &Stalls{stop: make(chan struct{}), done: make(chan struct{}), by: map[int]*Stall{}}
	for _, th := range ths {
		s.by[th.PID] = &Stall{PID: th.PID, Comm: th.Comm, CPU: th.LastCPU}
	}
	go func() {
		defer close(s.done)
		tr := stallTracker{prev: map[int]threadSample{}, since: map[int]time.Time{}}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			now := time.Now()
			for _, th := range ths {
				cur, cpu, ok := sampleThread(th.PID)
				if !ok {
					continue
				}
				d := tr.observe(th.PID, cur, now)
				s.mu.Lock()
				st := s.by[th.PID]
				st.CPU = cpu
				st.Longest = max(st.Longest, d)
				s.mu.Unlock()
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

// End stops sampling and returns each thread's longest stall, by pid.
func (s *Stalls) End() []Stall {
	if s == nil {
		return nil
	}
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Stall, 0, len(s.by))
	for _, st := range s.by {
		out = append(out, *st)
	}
	return out
}

// Kind is a kthread's comm up to its first '/': "cpumap", "napi",
// "ksoftirqd".
func (s Stall) Kind() string {
	k, _, _ := strings.Cut(s.Comm, "/")
	return k
}

// threadSample is one thread at one sample: runnable, and its run time.
type threadSample struct {
	runnable bool
	run      uint64
}

// sampleThread reads a thread's state, run time and last core; ok false
// once it is gone.
func sampleThread(pid int) (threadSample, int, bool) {
	th := Thread{PID: pid}
	st, err := th.ProcStat()
	if err != nil {
		return threadSample{}, 0, false
	}
	run, _, err := th.Schedstat()
	if err != nil {
		return threadSample{}, 0, false
	}
	return threadSample{runnable: st.State == 'R', run: run}, st.CPU, true
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
	if !seen || !was.runnable || cur.run != was.run || !cur.runnable {
		// Ran, or slept (which a runnable thread does only after
		// running), since the sample before.
		delete(tr.since, pid)
		if cur.runnable {
			tr.since[pid] = now
		}
		return 0
	}
	return now.Sub(tr.since[pid])
}
