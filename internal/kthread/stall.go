package kthread

import (
	"sync"
	"time"
)

// Stalls finds stretches in which a kernel thread stayed runnable without
// running, by sampling: a thread seen runnable (state R) at one sample
// whose run time has not grown by the next waited all that while (a
// runnable thread cannot sleep without running). Each sample reads the
// run time before the state, and a stall counts from just after the
// first sample's state read to just before the last one's run-time read,
// so it is measured to within one interval and never longer than it was,
// as long as the run time of a running thread keeps up: the scheduler
// brings it up to date at every tick, so a core without ticks (nohz_full)
// is not measured right.

// Stall is the longest stretch one thread stayed runnable without running.
type Stall struct {
	PID     int
	Comm    string
	CPU     int // the core it was on when that stretch was seen
	Longest time.Duration
}

// Stalls samples a set of kernel threads until End.
type Stalls struct {
	stop    chan struct{}
	once    sync.Once
	done    chan struct{}
	mu      sync.Mutex
	by      map[int]*Stall
	samples map[int]int // usable samples, by pid
}

// StartStalls samples the kernel threads whose comm satisfies match every
// interval (threads that appear later are not followed); nil if there are
// none.
func StartStalls(match func(comm string) bool, every time.Duration) *Stalls {
	ths, err := List(match)
	if err != nil || len(ths) == 0 {
		return nil
	}
	s := &Stalls{stop: make(chan struct{}), done: make(chan struct{}), by: map[int]*Stall{}, samples: map[int]int{}}
	for _, th := range ths {
		s.by[th.PID] = &Stall{PID: th.PID, Comm: th.Comm, CPU: th.LastCPU}
	}
	go func() {
		defer close(s.done)
		tr := stallTracker{prev: map[int]threadSample{}, since: map[int]time.Time{}}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			for _, th := range ths {
				cur, ok := sampleThread(th.PID)
				if !ok {
					continue
				}
				d := tr.observe(th.PID, cur)
				s.mu.Lock()
				s.samples[th.PID]++
				if st := s.by[th.PID]; d > st.Longest {
					st.Longest, st.CPU = d, cur.cpu
				}
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

// End stops sampling and returns the longest stall of each thread that
// was sampled at least twice (ok false if none was: nothing measured). It
// may be called again.
func (s *Stalls) End() (stalls []Stall, ok bool) {
	if s == nil {
		return nil, false
	}
	s.once.Do(func() { close(s.stop) })
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid, st := range s.by {
		if s.samples[pid] >= 2 {
			stalls = append(stalls, *st)
		}
	}
	return stalls, len(stalls) > 0
}

// threadSample is one thread at one sample.
type threadSample struct {
	run      uint64    // run time, read first
	runAt    time.Time // just before that read
	runnable bool      // state R, read second
	stateAt  time.Time // just after that read
	cpu      int
}

// sampleThread reads a thread's run time, then its state; ok false once
// it is gone, or where the kernel keeps no run time (schedstat all 0).
func sampleThread(pid int) (threadSample, bool) {
	th := Thread{PID: pid}
	at := time.Now()
	run, _, err := th.Schedstat()
	if err != nil || run == 0 {
		return threadSample{}, false
	}
	st, err := th.ProcStat()
	if err != nil {
		return threadSample{}, false
	}
	return threadSample{run: run, runAt: at, runnable: st.State == 'R', stateAt: time.Now(), cpu: st.CPU}, true
}

// stallTracker follows threads from sample to sample.
type stallTracker struct {
	prev  map[int]threadSample
	since map[int]time.Time // runnable without running since
}

// observe takes a thread's sample and returns how long it has been
// runnable without running (0: it ran or slept since the sample before,
// or this is its first).
func (tr *stallTracker) observe(pid int, cur threadSample) time.Duration {
	was, seen := tr.prev[pid]
	tr.prev[pid] = cur
	if !seen || !was.runnable || cur.run != was.run || !cur.runnable {
		// Ran, or slept (which a runnable thread does only after
		// running), since the sample before.
		delete(tr.since, pid)
		if cur.runnable {
			tr.since[pid] = cur.stateAt
		}
		return 0
	}
	return max(0, cur.runAt.Sub(tr.since[pid]))
}
