package metrics

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/lanesnet/lanes/bench/results"
)

// Sample is the per-CPU split over one sampling interval.
type Sample struct {
	At  time.Time
	CPU []results.CPUUse // NetRX and Kthreads are not sampled (zero)
}

// String is a one-line progress summary: busy percent per CPU with the
// softirq share in parentheses, e.g. "cpu0 97% (si 61%)  cpu1 12% (si 3%)".
func (s Sample) String() string {
	var b strings.Builder
	for i, c := range s.CPU {
		if i > 0 {
			b.WriteString("  ")
		}
		fmt.Fprintf(&b, "cpu%d %3.0f%% (si %2.0f%%)", c.CPU, 100-c.Idle, c.SoftIRQ)
	}
	return b.String()
}

// Sampler reads /proc/stat every interval in the background, for progress
// lines while a measurement runs. It reads one file per tick and never
// enters a namespace, so it does not perturb the run it watches.
type Sampler struct {
	mu   sync.Mutex
	last Sample
	once sync.Once
	stop chan struct{}
	done chan struct{}
}

// StartSampler starts sampling. fn, if not nil, is called with each sample
// from the sampler's goroutine; Last returns the latest one too.
func StartSampler(interval time.Duration, fn func(Sample)) *Sampler {
	s := &Sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go s.loop(interval, fn)
	return s
}

func (s *Sampler) loop(interval time.Duration, fn func(Sample)) {
	defer close(s.done)
	prev, prevAt := readStat()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		cur, at := readStat()
		if cur == nil || prev == nil {
			prev, prevAt = cur, at
			continue
		}
		smp := Sample{At: at, CPU: Diff(&Snapshot{At: prevAt, CPU: prev}, &Snapshot{At: at, CPU: cur}).CPU}
		prev, prevAt = cur, at
		s.mu.Lock()
		s.last = smp
		s.mu.Unlock()
		if fn != nil {
			fn(smp)
		}
	}
}

func readStat() (map[int]CPUTimes, time.Time) {
	at := time.Now()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, at
	}
	m, err := parseStat(b)
	if err != nil {
		return nil, at
	}
	return m, at
}

// Last returns the latest sample (zero before the first interval ends).
func (s *Sampler) Last() Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Stop ends sampling and waits for the goroutine; fn is not called after
// Stop returns. Stop may be called more than once.
func (s *Sampler) Stop() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}
