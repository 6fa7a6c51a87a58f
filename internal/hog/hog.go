// Package hog burns a core at a scheduling policy: the CPU-bound task that
// tests of load accounting and of PRISM's starvation guard need beside
// them.
package hog

import (
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/pinned"
)

// Start runs a thread on core at policy (unix.SCHED_NORMAL,
// unix.SCHED_IDLE, ...) until stop is called (once or more), and returns
// once the thread runs there.
func Start(core int, policy uint32) (stop func(), err error) {
	ready, quit, done := make(chan error), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		// The thread, its affinity and its policy die with the
		// goroutine (pinned.Here).
		if err := pinned.Here(core); err != nil {
			ready <- err
			return
		}
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: policy}, 0); err != nil {
			ready <- err
			return
		}
		ready <- nil
		x := 1.0
		for {
			select {
			case <-quit:
				_ = x
				return
			default:
			}
			for range 10000 {
				x = x*1.0000001 + 1e-9
			}
		}
	}()
	if err := <-ready; err != nil {
		<-done
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }, nil
}
