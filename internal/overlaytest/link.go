package overlaytest

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/lanesnet/lanes/internal/nsx"
)

// LinkStats are the statistics of device dev in namespace ns.
func LinkStats(t testing.TB, ns, dev string) netlink.LinkStatistics {
	t.Helper()
	var st netlink.LinkStatistics
	if err := nsx.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err == nil {
			st = *l.Attrs().Statistics
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return st
}
