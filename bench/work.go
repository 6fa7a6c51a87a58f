package bench

import (
	"time"

	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/internal/cpuset"
)

// workMeter measures how much CPU a run's receive path and receiving
// application took, the generator excluded: the scheduler-event accounting
// the balancer uses (cpuload.SchedSampler), whose "contended" time is every
// core's busy time less that of SCHED_IDLE threads (the generator runs
// there) with softirqs on top of them counted as busy. Everything else that
// ran is in it too: the mode's agent (Falcon's balancer runs in the
// benchmark's process), the benchmark's own bookkeeping, other tenants;
// so is the work on frames dropped after they entered the receive path.
// Divided by the datagrams delivered, it is the work one datagram costs in
// a mode, and cores / work is the most that mode could deliver if nothing
// else ran: the receive capacity a placement can reach at best. The IRQ
// core's share alone bounds it too: that core polls the NIC in every mode,
// and a mode whose rate is 1/(its share) keeps it saturated.
type workMeter struct{ s *cpuload.SchedSampler }

// startWork begins a measurement; nil when the kernel has no BTF or
// tracing programs (the run then records no work figures).
func startWork() *workMeter {
	s, err := cpuload.NewSchedSampler()
	if err != nil {
		return nil
	}
	return &workMeter{s: s}
}

// stop ends the measurement: the contended CPU time summed over cores,
// that of core irq alone, and the window they were taken over.
func (w *workMeter) stop(irq int) (work, irqWork, window time.Duration, ok bool) {
	if w == nil {
		return 0, 0, 0, false
	}
	defer w.s.Close()
	smp, err := w.s.Sample()
	if err != nil || smp.Interval <= 0 {
		return 0, 0, 0, false
	}
	// A core whose reading was torn is left out of a sample: then the
	// sum would fall short, so the run records nothing.
	online, err := cpuset.Online()
	if err != nil || len(smp.Cores) != len(online) {
		return 0, 0, 0, false
	}
	var pct, irqPct float64
	seenIRQ := false
	for _, c := range smp.Cores {
		pct += c.Contended()
		if c.CPU == irq {
			irqPct, seenIRQ = c.Contended(), true
		}
	}
	if !seenIRQ {
		return 0, 0, 0, false
	}
	ns := func(p float64) time.Duration { return time.Duration(p / 100 * float64(smp.Interval)) }
	return ns(pct), ns(irqPct), smp.Interval, true
}
