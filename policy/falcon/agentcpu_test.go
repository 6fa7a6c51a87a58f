package falcon

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// The agent's round thread keeps off the IRQ core where another core is
// allowed, and stays put with agent-irq=true.
func TestAgentAvoidsIRQCore(t *testing.T) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	if all.Count() < 2 {
		t.Skip("needs two allowed cores")
	}
	home := -1
	for c := 0; c < 1024 && home < 0; c++ {
		if all.IsSet(c) {
			home = c
		}
	}
	for _, agentIRQ := range []bool{false, true} {
		done := make(chan unix.CPUSet)
		go func() {
			runtime.LockOSThread() // the thread ends with the goroutine
			a := &agent{home: home, o: Options{AgentIRQ: agentIRQ}}
			a.avoidIRQCore()
			var got unix.CPUSet
			unix.SchedGetaffinity(0, &got)
			done <- got
		}()
		got := <-done
		if got.IsSet(home) == !agentIRQ || got.Count() != all.Count()-map[bool]int{false: 1, true: 0}[agentIRQ] {
			t.Errorf("agent-irq=%v: affinity %d cores, IRQ core %d in it: %v", agentIRQ, got.Count(), home, got.IsSet(home))
		}
	}
}
