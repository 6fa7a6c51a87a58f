package stress

// A few rtnetlink requests, enough to build the throwaway two-host setup
// the tests need without shelling out to ip(8) or adding a dependency.

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
)

type nlAttr struct {
	typ    uint16
	data   []byte
	nested []nlAttr
}

func nlStr(typ uint16, s string) nlAttr { return nlAttr{typ: typ, data: append([]byte(s), 0)} }

func nlU32(typ uint16, v uint32) nlAttr {
	return nlAttr{typ: typ, data: binary.NativeEndian.AppendUint32(nil, v)}
}

func nlNest(typ uint16, as ...nlAttr) nlAttr { return nlAttr{typ: typ | unix.NLA_F_NESTED, nested: as} }

func encodeAttrs(as []nlAttr) []byte {
	var b []byte
	for _, a := range as {
		payload := a.data
		if a.nested != nil {
			payload = encodeAttrs(a.nested)
		}
		hdr := make([]byte, unix.SizeofRtAttr)
		binary.NativeEndian.PutUint16(hdr[0:], uint16(unix.SizeofRtAttr+len(payload)))
		binary.NativeEndian.PutUint16(hdr[2:], a.typ)
		b = append(b, hdr...)
		b = append(b, payload...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	return b
}

func ifinfomsg(index int32, flags, change uint32) []byte {
	m := unix.IfInfomsg{Family: unix.AF_UNSPEC, Index: index, Flags: flags, Change: change}
	return (*[unix.SizeofIfInfomsg]byte)(unsafe.Pointer(&m))[:]
}

// nlDo sends one request on a fresh socket in the calling thread's
// namespace and waits for its ack.
func nlDo(typ, flags uint16, body []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], 1)
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == unix.NLMSG_ERROR {
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					return unix.Errno(-e)
				}
				return nil
			}
		}
	}
}

// addVeth creates name (with mac) in ns and its peer (with peerMAC) in peerNS.
func addVeth(ns, name string, mac net.HardwareAddr, peerNS, peer string, peerMAC net.HardwareAddr) error {
	f, err := os.Open(nsx.Path(peerNS))
	if err != nil {
		return err
	}
	defer f.Close()
	const vethInfoPeer = 1
	peerMsg := append(ifinfomsg(0, 0, 0), encodeAttrs([]nlAttr{
		nlStr(unix.IFLA_IFNAME, peer),
		{typ: unix.IFLA_ADDRESS, data: peerMAC},
		nlU32(unix.IFLA_NET_NS_FD, uint32(f.Fd())),
	})...)
	body := append(ifinfomsg(0, 0, 0), encodeAttrs([]nlAttr{
		nlStr(unix.IFLA_IFNAME, name),
		{typ: unix.IFLA_ADDRESS, data: mac},
		nlNest(unix.IFLA_LINKINFO,
			nlStr(unix.IFLA_INFO_KIND, "veth"),
			nlNest(unix.IFLA_INFO_DATA, nlAttr{typ: vethInfoPeer, data: peerMsg})),
	})...)
	return nsx.Do(ns, func() error {
		if err := nlDo(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body); err != nil {
			return fmt.Errorf("creating veth %s/%s: %w", name, peer, err)
		}
		return nil
	})
}

// addVXLAN creates a VXLAN device listening on port for vni.
func addVXLAN(ns, name string, mac net.HardwareAddr, vni uint32, port uint16) error {
	body := append(ifinfomsg(0, 0, 0), encodeAttrs([]nlAttr{
		nlStr(unix.IFLA_IFNAME, name),
		{typ: unix.IFLA_ADDRESS, data: mac},
		nlNest(unix.IFLA_LINKINFO,
			nlStr(unix.IFLA_INFO_KIND, "vxlan"),
			nlNest(unix.IFLA_INFO_DATA,
				nlU32(unix.IFLA_VXLAN_ID, vni),
				nlAttr{typ: unix.IFLA_VXLAN_PORT, data: binary.BigEndian.AppendUint16(nil, port)})),
	})...)
	return nsx.Do(ns, func() error {
		if err := nlDo(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body); err != nil {
			return fmt.Errorf("creating vxlan %s: %w", name, err)
		}
		return nil
	})
}

// upWithAddr sets dev up and, when p is valid, gives it the address p.
func upWithAddr(ns, dev string, p netip.Prefix) error {
	return nsx.Do(ns, func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		if p.IsValid() {
			m := unix.IfAddrmsg{Family: unix.AF_INET, Prefixlen: uint8(p.Bits()), Index: uint32(ifc.Index)}
			a := p.Addr().As4()
			body := append((*[unix.SizeofIfAddrmsg]byte)(unsafe.Pointer(&m))[:],
				encodeAttrs([]nlAttr{{typ: unix.IFA_LOCAL, data: a[:]}, {typ: unix.IFA_ADDRESS, data: a[:]}})...)
			if err := nlDo(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body); err != nil {
				return fmt.Errorf("adding %v to %s: %w", p, dev, err)
			}
		}
		if err := nlDo(unix.RTM_NEWLINK, 0, ifinfomsg(int32(ifc.Index), unix.IFF_UP, unix.IFF_UP)); err != nil {
			return fmt.Errorf("setting %s up: %w", dev, err)
		}
		return nil
	})
}
