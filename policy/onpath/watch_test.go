package onpath

import (
	"encoding/binary"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// What withdraws the destinations at once, and what only makes the agent
// look again.
func TestClassify(t *testing.T) {
	macs := MACs{Targets: map[string]bool{"02:00:00:00:02:01": true}, Sources: map[string]bool{"02:00:00:00:01:01": true}}
	neigh := func(typ uint16, family byte, mac []byte, flags ...byte) syscall.NetlinkMessage {
		d := make([]byte, 12)
		d[0] = family
		if len(flags) > 0 {
			d[10] = flags[0]
		}
		attr := make([]byte, 4+8)
		binary.NativeEndian.PutUint16(attr[0:], 10)
		binary.NativeEndian.PutUint16(attr[2:], unix.NDA_LLADDR)
		copy(attr[4:], mac)
		return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: typ}, Data: append(d, attr...)}
	}
	msg := func(typ uint16) syscall.NetlinkMessage {
		return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: typ}, Data: make([]byte, 16)}
	}
	for _, c := range []struct {
		name     string
		proto    int
		m        syscall.NetlinkMessage
		withdraw bool
	}{
		{"nftables rule added", unix.NETLINK_NETFILTER, msg(0xa06), true},
		{"IPsec policy", unix.NETLINK_XFRM, msg(0x13), true},
		{"route", unix.NETLINK_ROUTE, msg(unix.RTM_NEWROUTE), true},
		{"forwarding turned off", unix.NETLINK_ROUTE, msg(unix.RTM_NEWNETCONF), true},
		{"address gone", unix.NETLINK_ROUTE, msg(unix.RTM_DELADDR), true},
		{"link", unix.NETLINK_ROUTE, msg(unix.RTM_NEWLINK), true},
		{"tc filter", unix.NETLINK_ROUTE, msg(unix.RTM_NEWTFILTER), true},
		{"a destination's forwarding entry deleted", unix.NETLINK_ROUTE, neigh(unix.RTM_DELNEIGH, unix.AF_BRIDGE, []byte{2, 0, 0, 0, 2, 1}), true},
		{"another MAC learned", unix.NETLINK_ROUTE, neigh(unix.RTM_NEWNEIGH, unix.AF_BRIDGE, []byte{2, 0, 0, 0, 9, 9}), false},
		{"a source's VTEP changed", unix.NETLINK_ROUTE, neigh(unix.RTM_NEWNEIGH, unix.AF_BRIDGE, []byte{2, 0, 0, 0, 1, 1}, unix.NTF_SELF), true},
		{"a source's bridge entry aged out", unix.NETLINK_ROUTE, neigh(unix.RTM_DELNEIGH, unix.AF_BRIDGE, []byte{2, 0, 0, 0, 1, 1}, unix.NTF_MASTER), false},
		{"an ARP neighbour", unix.NETLINK_ROUTE, neigh(unix.RTM_NEWNEIGH, unix.AF_INET, []byte{2, 0, 0, 0, 2, 1}), false},
	} {
		if got := Classify(c.proto, c.m, macs); got.Withdraw != c.withdraw {
			t.Errorf("%s: %+v, want withdraw %v", c.name, got, c.withdraw)
		}
	}
}
