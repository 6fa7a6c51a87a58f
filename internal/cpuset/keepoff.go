package cpuset

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// KeepProcessOff lets every thread of this process run only on the
// online cores outside avoid (off; nil where avoid is empty or no core
// is left outside it, and nothing changes). Threads started later inherit
// it from the thread that starts them. For a daemon whose own work must
// not take the cores it manages.
func KeepProcessOff(avoid []int) (off []int, err error) {
	if len(avoid) == 0 {
		return nil, nil
	}
	online, err := Online()
	if err != nil {
		return nil, err
	}
	var set unix.CPUSet
	for _, c := range online {
		if !slices.Contains(avoid, c) {
			off = append(off, c)
			set.Set(c)
		}
	}
	if len(off) == 0 {
		return nil, nil
	}
	// Twice: a thread the runtime starts during the first pass may have
	// been cloned from one not yet narrowed.
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return nil, fmt.Errorf("listing this process's threads: %w", err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return nil, fmt.Errorf("keeping thread %d on cores %s: %w", tid, FormatList(off), err)
			}
		}
	}
	return off, nil
}
