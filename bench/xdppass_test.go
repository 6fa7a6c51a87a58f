package bench

import (
	"testing"

	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/lanesnet/lanes/topology/topotest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// The pass-through program attaches to a veth in native mode and goes
// again with its detach.
func TestXDPPassAttachDetach(t *testing.T) {
	testenv.Root(t)
	ns := topotest.VethNamespace(t, "-xp", "xa", "xb")
	attached := func() bool {
		t.Helper()
		var on bool
		if err := nsx.Do(ns, func() error {
			l, err := netlink.LinkByName("xa")
			if err == nil && l.Attrs().Xdp != nil {
				// Native (driver) mode, the modes' own: generic XDP would
				// run after GRO, on merged skbs.
				on = l.Attrs().Xdp.Attached && l.Attrs().Xdp.AttachMode == nl.XDP_ATTACHED_DRV
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return on
	}
	detach, err := attachXDPPass(ns, "xa")
	if err != nil {
		t.Fatal(err)
	}
	if !attached() {
		t.Error("no XDP program on xa after attaching")
	}
	if err := detach(); err != nil {
		t.Fatal(err)
	}
	if attached() {
		t.Error("an XDP program is left on xa after detaching")
	}
	if _, err := attachXDPPass(ns, "nodev"); err == nil {
		t.Error("attaching to a missing device did not fail")
	}
}
