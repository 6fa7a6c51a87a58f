package ethtool_test

import (
	"testing"

	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/lanesnet/lanes/topology/topotest"
)

// A veth has both UDP GRO features, off by default, so the named reads
// and writes can be checked against the kernel's own defaults and against
// the legacy GRO command.
func TestNamedFeatures(t *testing.T) {
	testenv.Root(t)
	ns := topotest.VethNamespace(t, "-eth", "va", "vb")
	names := []string{"rx-gro-list", "rx-udp-gro-forwarding", "rx-gro"}
	got, err := ethtool.GetNamed(ns, "va", names...)
	if err != nil {
		t.Fatal(err)
	}
	if got["rx-gro-list"] || got["rx-udp-gro-forwarding"] {
		t.Errorf("fresh veth: %v, want both UDP GRO features off", got)
	}
	if legacy, err := ethtool.Get(ns, "va", ethtool.GRO); err != nil || legacy != got["rx-gro"] {
		t.Errorf("rx-gro by name %v, legacy GRO %v (%v)", got["rx-gro"], legacy, err)
	}
	for _, on := range []bool{true, false} {
		if err := ethtool.SetNamed(ns, "va", "rx-udp-gro-forwarding", on); err != nil {
			t.Fatal(err)
		}
		got, err := ethtool.GetNamed(ns, "va", names...)
		if err != nil {
			t.Fatal(err)
		}
		if got["rx-udp-gro-forwarding"] != on || got["rx-gro-list"] {
			t.Errorf("after setting rx-udp-gro-forwarding %v: %v", on, got)
		}
	}
	if _, err := ethtool.GetNamed(ns, "va", "no-such-feature"); err == nil {
		t.Error("an unknown feature name read without an error")
	}
	if _, err := ethtool.GetNamed(ns, "nodev", "rx-gro-list"); err == nil {
		t.Error("a missing device read without an error")
	}
}
