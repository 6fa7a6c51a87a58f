// Package ethtool toggles the few offload features lanes needs on a device
// through the SIOCETHTOOL ioctl, so neither the product nor its testbed
// shells out to ethtool(8).
//
// The legacy one-feature commands are used on purpose: they are stable since
// 2.6, need no string-set lookup, and the kernel routes them through
// netdev_update_features like the newer ETHTOOL_SFEATURES.
package ethtool

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/lanesnet/lanes/internal/nsx"
	"golang.org/x/sys/unix"
)

// Feature is one offload toggled by a legacy get/set command pair.
type Feature struct {
	Name     string
	get, set uint32
}

// The features lanes touches. A veth underlay must carry what a real NIC
// puts on the wire: MTU-sized frames (no TSO/GSO) with complete checksums
// (no tx checksum offload, which would leave CHECKSUM_PARTIAL frames that
// XDP and cpumap paths cannot finish). GRO on a veth also turns on its NAPI.
var (
	TxChecksum = Feature{"tx-checksumming", 0x16, 0x17}
	SG         = Feature{"scatter-gather", 0x18, 0x19}
	TSO        = Feature{"tcp-segmentation-offload", 0x1e, 0x1f}
	GSO        = Feature{"generic-segmentation-offload", 0x23, 0x24}
	GRO        = Feature{"generic-receive-offload", 0x2b, 0x2c}
)

// ByName returns the feature with the given Name (as ethtool(8) calls it).
func ByName(name string) (Feature, bool) {
	for _, f := range []Feature{TxChecksum, SG, TSO, GSO, GRO} {
		if f.Name == name {
			return f, true
		}
	}
	return Feature{}, false
}

type value struct{ cmd, data uint32 }

type ifreq struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [16]byte
}

func ioctl(netns, dev string, v *value) error {
	return ioctlPtr(netns, dev, unsafe.Pointer(v))
}

// ioctlPtr runs SIOCETHTOOL with data pointing at a command buffer (its
// first word the command), which the caller keeps alive.
func ioctlPtr(netns, dev string, data unsafe.Pointer) error {
	if len(dev) >= unix.IFNAMSIZ {
		return fmt.Errorf("device name %q too long", dev)
	}
	return nsx.Do(netns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var req ifreq
		copy(req.name[:], dev)
		req.data = data
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&req)))
		runtime.KeepAlive(data)
		if errno != 0 {
			return errno
		}
		return nil
	})
}

// Get reports whether f is on for dev in netns.
func Get(netns, dev string, f Feature) (bool, error) {
	v := value{cmd: f.get}
	if err := ioctl(netns, dev, &v); err != nil {
		return false, fmt.Errorf("reading %s of %s: %w", f.Name, dev, err)
	}
	return v.data != 0, nil
}

// Set turns f on or off for dev in netns and checks that the kernel took it
// (a dependent feature can veto a change silently).
func Set(netns, dev string, f Feature, on bool) error {
	v := value{cmd: f.set}
	if on {
		v.data = 1
	}
	if err := ioctl(netns, dev, &v); err != nil {
		return fmt.Errorf("setting %s of %s: %w", f.Name, dev, err)
	}
	got, err := Get(netns, dev, f)
	if err != nil {
		return err
	}
	if got != on {
		return fmt.Errorf("setting %s of %s to %v: the kernel kept %v", f.Name, dev, on, got)
	}
	return nil
}

// Channels is a device's queue counts as ETHTOOL_GCHANNELS reports them:
// the maxima the driver allows and the counts in use.
type Channels struct {
	cmd                                 uint32
	MaxRX, MaxTX, MaxOther, MaxCombined uint32
	RX, TX, Other, Combined             uint32
}

const (
	cmdGChannels = 0x3c
	cmdSChannels = 0x3d
)

// GetChannels reads dev's queue counts. A veth reports as maxima the queues
// allocated when the pair was made (one per possible CPU unless the creator
// said otherwise) and uses one of each until told more.
func GetChannels(netns, dev string) (Channels, error) {
	c := Channels{cmd: cmdGChannels}
	if err := ioctlPtr(netns, dev, unsafe.Pointer(&c)); err != nil {
		return Channels{}, fmt.Errorf("reading the channels of %s: %w", dev, err)
	}
	return c, nil
}

// SetRXTX sets dev's rx and tx queue counts (other and combined unchanged).
func SetRXTX(netns, dev string, rx, tx uint32) error {
	c, err := GetChannels(netns, dev)
	if err != nil {
		return err
	}
	c.cmd, c.RX, c.TX = cmdSChannels, rx, tx
	if err := ioctlPtr(netns, dev, unsafe.Pointer(&c)); err != nil {
		return fmt.Errorf("setting %s to %d rx and %d tx queues: %w", dev, rx, tx, err)
	}
	return nil
}
