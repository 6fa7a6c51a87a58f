//go:build linux

package steer

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Changes is the count of the changes announced on a shortcut's path to
// a socket CountChanges watches (bpf/maps.h's steer_changes): PRISM-sync's
// destinations (SyncSet.Changes) and the fast path's entries hold only
// while it is the count they were vouched for under.
func (d *core) Changes() (uint64, error) {
	var n uint64
	if err := d.objs.SteerChanges.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("reading the path's change count: %w", err)
	}
	return n, nil
}

// CountChanges makes every message the kernel sends to the netlink socket
// fd (one subscribed to changes on a shortcut's path: nftables, IPsec)
// count a change (bpf/notify.c): the kernel counts it as it sends the
// notification, before the process that made the change gets its answer,
// and every destination and entry vouched for before is void from then
// on. The socket gets every message whole.
func (d *core) CountChanges(fd int) error {
	if d.objs.SteerNotify == nil {
		return errors.New("counting the path's changes: the datapath has no steer_notify")
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_BPF, d.objs.SteerNotify.FD()); err != nil {
		return fmt.Errorf("counting the path's changes: attaching steer_notify to the socket: %w", err)
	}
	return nil
}

// countChange moves the change count on by one, as a change announced on
// the path does: whatever was vouched for under an earlier count is void.
// A notification counted at the same time moves it on too; either way the
// count is no longer the one anything was vouched for under.
func (d *core) countChange() error {
	n, err := d.Changes()
	if err != nil {
		return err
	}
	if err := d.objs.SteerChanges.Put(uint32(0), n+1); err != nil {
		return fmt.Errorf("moving the path's change count on: %w", err)
	}
	return nil
}
