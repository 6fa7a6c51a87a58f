package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
)

// A core with nothing to run enters an idle state, and leaving it delays
// the first packet or wake-up that arrives: on the VMs lanes is measured
// on, a halted vCPU wakes slowly (docs/testbed.md). A priority workload's
// idle point then carries that wake-up, which a loaded point does not (its
// core never idles), so vanilla's latency under load can come out lower
// than idle, and "within 1.3x of idle" compares against the wrong thing.
// So the priority workloads also run with every core kept out of idle
// states: idle then means no competing packets, not a sleeping core.
//
// The way is the kernel's CPU latency request (PM QoS), the one cyclictest
// uses: while a process holds /dev/cpu_dma_latency open with 0 written to
// it, cpuidle picks only the polling state. It takes no scheduler time
// (the idle task polls), so it competes with nothing a mode runs (a
// SCHED_IDLE spinner on the receive core would share it with prism's
// SCHED_IDLE bulk queue), it acts on every mode and load alike, and the
// kernel drops the request when the file is closed, also when the bench
// is killed: nothing to journal or restore.

// Awake modes (Options.Awake).
const (
	AwakeBoth = "both" // each priority point as-is and awake
	AwakeOn   = "on"   // awake only
	AwakeOff  = "off"  // as-is only
)

var AwakeModes = []string{AwakeBoth, AwakeOn, AwakeOff}

const cpuLatencyDev = "/dev/cpu_dma_latency"

// awakeAvailable says why the cores cannot be kept awake here (nil: they
// can). A variable: Options.Validate's own tests run without root.
var awakeAvailable = func() error {
	f, err := os.OpenFile(cpuLatencyDev, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("cannot hold the cores out of idle states: %w", err)
	}
	return f.Close()
}

// holdAwake keeps every core out of idle states until release is called.
func holdAwake() (release func(), err error) {
	f, err := os.OpenFile(cpuLatencyDev, os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("keeping the cores awake: %w", err)
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], 0) // microseconds of exit latency allowed
	if n, err := f.Write(b[:]); err != nil || n != len(b) {
		f.Close()
		return nil, fmt.Errorf("keeping the cores awake: writing %s: %w", cpuLatencyDev, errors.Join(err, errShort(n)))
	}
	return func() { f.Close() }, nil
}

func errShort(n int) error {
	if n == 4 {
		return nil
	}
	return fmt.Errorf("short write (%d bytes)", n)
}

// awakePoints is a priority workload's points as the awake mode asks:
// each as-is, awake, or both (the awake one first, as the baseline).
func awakePoints(pts []point, mode string) []point {
	var out []point
	for _, p := range pts {
		if mode != AwakeOff {
			q := p
			q.awake = true
			out = append(out, q)
		}
		if mode != AwakeOn {
			out = append(out, p)
		}
	}
	return out
}
