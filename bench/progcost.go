package bench

import (
	"io"
	"maps"
	"slices"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/datapath/reorder"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/bpfstats"
)

// progCostNote says, in the results, what --bpf-stats measured and what it
// cost.
const progCostNote = "BPF run-time statistics were on over udp_stress (--bpf-stats): lanes' programs' time and runs per delivered datagram, every copy of a program summed (the kernel's BPF_STATS_RUN_TIME); they add two clock reads to every program run, in every mode that has programs, so this run's rates and CPU figures carry that cost."

// progCost measures what lanes' own programs (the steering object's and
// the reassembler's, every copy in every namespace) ran over one
// measurement: the kernel's run-time statistics, on from start to stop.
type progCost struct {
	stats  io.Closer
	names  map[string]bool
	before bpfstats.Snapshot
}

// checkProgCost says whether this kernel and process can take the
// statistics, before a run depends on them.
func checkProgCost() error {
	c, err := bpfstats.Enable()
	if err != nil {
		return err
	}
	return c.Close()
}

// startProgCost turns the statistics on and takes the first snapshot.
func startProgCost() (*progCost, error) {
	names := map[string]bool{}
	for _, list := range []func() ([]string, error){steer.ProgramNames, reorder.ProgramNames} {
		l, err := list()
		if err != nil {
			return nil, err
		}
		for _, n := range l {
			names[n] = true
		}
	}
	c, err := bpfstats.Enable()
	if err != nil {
		return nil, err
	}
	before, err := bpfstats.Take(names)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &progCost{stats: c, names: names, before: before}, nil
}

// stop takes the second snapshot and turns the statistics off: what ran
// in between, per program name (nil for a nil progCost).
func (p *progCost) stop() (bpfstats.Snapshot, error) {
	if p == nil {
		return nil, nil
	}
	defer p.stats.Close()
	after, err := bpfstats.Take(p.names)
	if err != nil {
		return nil, err
	}
	return after.Sub(p.before), nil
}

// recordProgCost puts ran, per delivered datagram, into extra (the keys
// of results.BPFNsPerMsg): lanes' programs' time and runs in all (zero in
// a mode without programs), and each program's time.
func recordProgCost(extra map[string]float64, ran bpfstats.Snapshot, delivered float64) {
	t := ran.Total()
	extra[results.BPFNsPerMsg] = float64(t.Runtime.Nanoseconds()) / delivered
	extra[results.BPFRunsPerMsg] = float64(t.Count) / delivered
	for _, name := range slices.Sorted(maps.Keys(ran)) {
		extra[results.BPFNsPerMsg+":"+name] = float64(ran[name].Runtime.Nanoseconds()) / delivered
	}
}
