// Package pinned pins the calling goroutine's thread to one core, for the
// senders, hogs and spinners of tests and benchmarks that must run there.
package pinned

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Here locks the calling goroutine to its thread and pins the thread to
// core. It is never unlocked: the runtime retires the thread, narrowed
// affinity and all, when the goroutine ends, so call it from a goroutine
// of its own.
func Here(core int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(core)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pinning a thread to core %d: %w", core, err)
	}
	return nil
}
