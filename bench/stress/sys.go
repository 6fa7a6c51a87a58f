package stress

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/lanesnet/lanes/internal/nsx"
	"golang.org/x/sys/unix"
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

// SetGRO switches generic receive offload on dev in netns (ETHTOOL_SGRO).
// A veth only receives frames that XDP redirects into its peer while it
// runs NAPI, which it does when GRO is on or an XDP program is attached;
// otherwise the peer drops them silently.
func SetGRO(netns, dev string, on bool) error {
	return nsx.Do(netns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("ethtool socket: %w", err)
		}
		defer unix.Close(fd)
		v := ethtoolValue{cmd: unix.ETHTOOL_SGRO}
		if on {
			v.data = 1
		}
		if err := ethtoolIoctl(fd, dev, &v); err != nil {
			return fmt.Errorf("setting gro on %s: %w", dev, err)
		}
		return nil
	})
}

// GRO reports whether generic receive offload is on for dev in netns.
func GRO(netns, dev string) (bool, error) {
	var on bool
	err := nsx.Do(netns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("ethtool socket: %w", err)
		}
		defer unix.Close(fd)
		v := ethtoolValue{cmd: unix.ETHTOOL_GGRO}
		if err := ethtoolIoctl(fd, dev, &v); err != nil {
			return fmt.Errorf("reading gro of %s: %w", dev, err)
		}
		on = v.data != 0
		return nil
	})
	return on, err
}

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

func ethtoolIoctl(fd int, dev string, v *ethtoolValue) error {
	// struct ifreq: the name, then ifr_data pointing at the ethtool command.
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}
	if len(dev) >= unix.IFNAMSIZ {
		return fmt.Errorf("device name %q too long", dev)
	}
	copy(ifr.name[:], dev)
	ifr.data = uintptr(unsafe.Pointer(v))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(v)
	if errno != 0 {
		return errno
	}
	return nil
}

// monotonicNs reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monotonicNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
