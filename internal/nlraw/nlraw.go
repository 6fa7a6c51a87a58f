// Package nlraw sends one netlink dump request and collects the replies,
// for the families vishvananda/netlink does not speak (or speaks wrongly):
// the netdev generic-netlink family and nftables.
//
// Requests are built by hand: vishvananda/netlink's nl.Genlmsg leaves the
// genlmsghdr's reserved field uninitialised, and the kernel rejects most
// such requests with EINVAL ("genlmsghdr.reserved field is not 0").
package nlraw

import (
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Native is the host byte order netlink uses.
var Native = nl.NativeEndian()

// Dump sends a dump request of msgType on a socket of protocol proto (in
// the calling thread's network namespace) whose payload starts with the
// 4-byte family header hdr (genlmsghdr, nfgenmsg), and returns each
// reply's payload, that header included (nfgenmsg names the reply's
// family; attributes start at byte 4). Replies are read with a buffer sized
// by MSG_PEEK|MSG_TRUNC, so large dumps are not cut.
func Dump(proto int, msgType uint16, hdr [4]byte) ([][]byte, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	const seq = 1
	req := make([]byte, unix.NLMSG_HDRLEN+4)
	Native.PutUint32(req[0:], uint32(len(req)))
	Native.PutUint16(req[4:], msgType)
	Native.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	Native.PutUint32(req[8:], seq)
	copy(req[unix.NLMSG_HDRLEN:], hdr[:])
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
			case unix.NLMSG_DONE, unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := int32(Native.Uint32(m.Data)); e < 0 {
						return nil, syscall.Errno(-e)
					}
				}
				return out, nil
			}
			if len(m.Data) >= 4 {
				out = append(out, append([]byte(nil), m.Data...))
			}
		}
	}
}
