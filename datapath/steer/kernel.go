//go:build linux

package steer

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// KernelSupport says whether the running kernel's cpumap runs GRO on the
// core it redirects to (Linux >= 6.15). Without it the split stage hands
// the target core unaggregated packets, so placing STAGE_SPLIT elsewhere
// costs TCP throughput that the planner should weigh.
func KernelSupport() (cpumapGRO bool, reason string) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false, fmt.Sprintf("uname: %v: assuming cpumap without GRO", err)
	}
	return cpumapGROSupport(unix.ByteSliceToString(u.Release[:]))
}

func cpumapGROSupport(release string) (bool, string) {
	var major, minor int
	if n, _ := fmt.Sscanf(release, "%d.%d", &major, &minor); n != 2 {
		return false, fmt.Sprintf("kernel %q: unrecognised release, assuming cpumap without GRO", release)
	}
	if major > 6 || major == 6 && minor >= 15 {
		return true, fmt.Sprintf("kernel %s: cpumap runs GRO on the target core (>= 6.15)", release)
	}
	return false, fmt.Sprintf("kernel %s: cpumap passes packets up without GRO (needs >= 6.15)", release)
}
