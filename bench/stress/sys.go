package stress

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/kthread"
)

// progTestRunAttr is the BPF_PROG_TEST_RUN part of union bpf_attr.
type progTestRunAttr struct {
	progFD      uint32
	retval      uint32
	dataSizeIn  uint32
	dataSizeOut uint32
	dataIn      uint64
	dataOut     uint64
	repeat      uint32
	duration    uint32
	ctxSizeIn   uint32
	ctxSizeOut  uint32
	ctxIn       uint64
	ctxOut      uint64
	flags       uint32
	cpu         uint32
	batchSize   uint32
	_           uint32
}

// liveRun makes one BPF_PROG_RUN call in live-frame mode on the calling
// thread. It is ours rather than ebpf.Program.Run because that one retries
// on EINTR until the full repeat count is done, while the generator stops a
// run by signalling its thread (the kernel checks for pending signals
// between batches and returns EINTR).
func liveRun(progFD int, frame []byte, repeat, batch uint32) error {
	attr := progTestRunAttr{
		progFD:     uint32(progFD),
		dataSizeIn: uint32(len(frame)),
		dataIn:     uint64(uintptr(unsafe.Pointer(&frame[0]))),
		repeat:     repeat,
		flags:      unix.BPF_F_TEST_XDP_LIVE_FRAMES,
		batchSize:  batch,
	}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN,
		uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(frame)
	if errno != 0 {
		return errno
	}
	return nil
}

// pinThread restricts the calling OS thread (which the caller has locked)
// to cpus; a nil or empty list leaves it alone.
func pinThread(cpus ...int) error {
	if len(cpus) == 0 {
		return nil
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pinning thread to cpus %v: %w", cpus, err)
	}
	return nil
}

// yieldThread puts the calling OS thread (which the caller has locked) at
// SCHED_IDLE, below every normal task of its core.
func yieldThread() error {
	if err := kthread.SetPolicy(unix.SCHED_IDLE); err != nil {
		return fmt.Errorf("making the generator thread SCHED_IDLE: %w", err)
	}
	// Sleep once: accounting that classifies a task as it is switched in
	// (datapath/cpuload's scheduler-event sampler) sees the new policy only
	// from its next switch, which a thread that never blocks may not make
	// for a long time on a core with nothing else to run.
	_ = unix.Nanosleep(&unix.Timespec{Nsec: 50_000}, nil)
	return nil
}

// monotonicNs reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monotonicNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
