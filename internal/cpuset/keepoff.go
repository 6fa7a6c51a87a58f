package cpuset

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// KeepOff locks the calling goroutine to its OS thread and lets that
// thread run only on the online cores outside avoid, so that a control
// loop's periodic work does not take the cores whose latency it guards.
// Where no online core is left outside avoid it changes nothing (off is
// nil). release gives the thread its former cores back and unlocks it;
// call it on the same goroutine. Threads the goroutine's work starts
// inherit the narrowed set.
func KeepOff(avoid []int) (off []int, release func(), err error) {
	online, err := Online()
	if err != nil {
		return nil, func() {}, err
	}
	for _, c := range online {
		if !slices.Contains(avoid, c) {
			off = append(off, c)
		}
	}
	if len(off) == 0 {
		return nil, func() {}, nil
	}
	runtime.LockOSThread()
	var was, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		runtime.UnlockOSThread()
		return nil, func() {}, fmt.Errorf("reading the thread's cores: %w", err)
	}
	for _, c := range off {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		return nil, func() {}, fmt.Errorf("keeping the thread on cores %s: %w", FormatList(off), err)
	}
	return off, func() {
		// A thread that cannot get its cores back must not run other
		// goroutines: leaving it locked makes the runtime end it with
		// this goroutine.
		if unix.SchedSetaffinity(0, &was) == nil {
			runtime.UnlockOSThread()
		}
	}, nil
}

// KeepProcessOff lets every thread of this process run only on the
// online cores outside avoid (off; nil where none is left, and nothing
// changes). Threads started later inherit it from the thread that starts
// them. For a daemon whose work must not take the cores it manages.
func KeepProcessOff(avoid []int) (off []int, err error) {
	online, err := Online()
	if err != nil {
		return nil, err
	}
	for _, c := range online {
		if !slices.Contains(avoid, c) {
			off = append(off, c)
		}
	}
	if len(off) == 0 || len(avoid) == 0 {
		return nil, nil
	}
	var set unix.CPUSet
	for _, c := range off {
		set.Set(c)
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
