// Package kver tells which kernel lanes runs on, for the features that
// depend on its version (tcx links since 6.6, GRO in cpumap since 6.15):
// one place that reads uname and compares releases.
package kver

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Release is the running kernel's release ("6.18.44-fc-v445"), as uname -r
// prints it.
func Release() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// AtLeast says whether release is major.minor or newer; an error when the
// release does not start with MAJOR.MINOR.
func AtLeast(release string, major, minor int) (bool, error) {
	var ma, mi int
	if n, _ := fmt.Sscanf(release, "%d.%d", &ma, &mi); n != 2 {
		return false, fmt.Errorf("cannot tell the kernel version from release %q", release)
	}
	return ma > major || ma == major && mi >= minor, nil
}
