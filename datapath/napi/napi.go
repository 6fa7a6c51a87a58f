// Package napi lists a device's NAPI instances through the kernel's netdev
// generic-netlink family (Linux >= 6.8 reports the poller thread's pid).
//
// Threaded NAPI pollers are named "napi/<dev>-<napi id>", but comm is cut
// at 15 bytes and device names repeat across namespaces, so only the
// (ifindex -> napi id -> pid) mapping the kernel reports identifies the
// thread that polls a given device.
package napi

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
)

// From include/uapi/linux/netdev.h (Debian 12's headers predate them).
const (
	cmdNAPIGet  = 11
	attrIfindex = 1
	attrID      = 2
	attrIRQ     = 3
	attrPID     = 4
)

// ErrUnsupported means the kernel has no netdev NAPI query (Linux < 6.8).
var ErrUnsupported = errors.New("kernel cannot list NAPI instances over netlink (needs Linux >= 6.8)")

// Instance is one NAPI context of a device.
type Instance struct {
	ID      uint32 `json:"id"`
	IfIndex int    `json:"ifindex"`
	IRQ     int    `json:"irq,omitempty"`
	// PID of the poller kthread when the device runs threaded NAPI, else 0.
	PID int `json:"pid,omitempty"`
}

// List returns the NAPI instances of the device with ifindex in netns
// (ifindex 0: every device's).
func List(netns string, ifindex int) ([]Instance, error) { return list(netns, ifindex) }

func list(netns string, ifindex int) ([]Instance, error) {
	var out []Instance
	err := nsx.Do(netns, func() error {
		fam, err := netlink.GenlFamilyGet("netdev")
		if err != nil {
			return fmt.Errorf("%w: family lookup: %v", ErrUnsupported, err)
		}
		msgs, err := dump(fam.ID, cmdNAPIGet)
		if err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("%w: napi dump: %w", ErrUnsupported, err)
			}
			return fmt.Errorf("listing NAPI instances: %w", err)
		}
		for _, m := range msgs {
			attrs, err := nl.ParseRouteAttr(m)
			if err != nil {
				return fmt.Errorf("parsing NAPI reply: %w", err)
			}
			var in Instance
			for _, a := range attrs {
				if len(a.Value) < 4 {
					continue
				}
				v := native.Uint32(a.Value[:4])
				switch a.Attr.Type {
				case attrIfindex:
					in.IfIndex = int(v)
				case attrID:
					in.ID = v
				case attrIRQ:
					in.IRQ = int(int32(v))
				case attrPID:
					in.PID = int(v)
				}
			}
			if ifindex == 0 || in.IfIndex == ifindex {
				out = append(out, in)
			}
		}
		return nil
	})
	return out, err
}

// dump sends one generic-netlink dump request and returns each reply's
// attribute bytes. The request is built by hand: vishvananda/netlink's
// nl.Genlmsg leaves the genlmsghdr's reserved field uninitialised, and the
// kernel rejects most such requests with EINVAL ("genlmsghdr.reserved field
// is not 0"). Replies are read with a buffer sized by MSG_PEEK|MSG_TRUNC.
func dump(family uint16, cmd uint8) ([][]byte, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	const seq = 1
	req := make([]byte, unix.NLMSG_HDRLEN+4)
	native.PutUint32(req[0:], uint32(len(req)))
	native.PutUint16(req[4:], family)
	native.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	native.PutUint32(req[8:], seq)
	req[unix.NLMSG_HDRLEN] = cmd
	req[unix.NLMSG_HDRLEN+1] = 1 // version
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out [][]byte
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_PEEK|unix.MSG_TRUNC)
		if err != nil {
			return nil, err
		}
		if n > len(buf) {
			buf = make([]byte, n)
		}
		n, _, err = unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("parsing netlink reply: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				if len(m.Data) >= 4 {
					if e := int32(native.Uint32(m.Data)); e < 0 {
						return nil, syscall.Errno(-e)
					}
				}
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := int32(native.Uint32(m.Data)); e < 0 {
						return nil, syscall.Errno(-e)
					}
				}
				return out, nil
			}
			if len(m.Data) >= 4 {
				out = append(out, append([]byte(nil), m.Data[4:]...)) // skip genlmsghdr
			}
		}
	}
}

var native = nl.NativeEndian()
