//go:build linux

package steer

import (
	"fmt"

	"github.com/lanesnet/lanes/internal/kver"
)

// KernelSupport says whether the running kernel's cpumap runs GRO on the
// core it redirects to (Linux >= 6.15). Without it the split stage hands
// the target core unaggregated packets, so placing STAGE_SPLIT elsewhere
// costs TCP throughput that the planner should weigh.
func KernelSupport() (cpumapGRO bool, reason string) {
	rel, err := kver.Release()
	if err != nil {
		return false, fmt.Sprintf("%v: assuming cpumap without GRO", err)
	}
	return cpumapGROSupport(rel)
}

func cpumapGROSupport(release string) (bool, string) {
	ok, err := kver.AtLeast(release, 6, 15)
	switch {
	case err != nil:
		return false, fmt.Sprintf("kernel %q: unrecognised release, assuming cpumap without GRO", release)
	case ok:
		return true, fmt.Sprintf("kernel %s: cpumap runs GRO on the target core (>= 6.15)", release)
	}
	return false, fmt.Sprintf("kernel %s: cpumap passes packets up without GRO (needs >= 6.15)", release)
}
