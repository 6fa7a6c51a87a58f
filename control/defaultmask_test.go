package control_test

import (
	"testing"

	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/testbed"
)

// A container's host-side veth made while rps is applied starts with the
// plan's RPS map, from lanes' net.core.rps_default_mask. lanes agent
// adopts it, and reset must leave it as it would be without lanes (the
// default mask's original), not with lanes' map it started with.
func TestFollowedRPSMapResetsToTheDefault(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Flannel)
	r := tb.Receiver()
	mask := knobs.Sysctl(r.NetNS, "net.core.rps_default_mask")
	orig, err := mask.Read()
	if err != nil {
		t.Skipf("no rps_default_mask in this kernel's namespaces: %v", err)
	}
	a := modetest.Apply(t, tb, "rps", nil)
	ag, _ := a.StartAgent(t)
	c3, err := testbed.AddContainer(tb.Config.Prefix, 2)
	if err != nil {
		t.Fatal(err)
	}
	waitFollowed(t, ag, "adopting "+c3.Name, adopted(c3, 1))
	rps := knobs.Sysfs(r.NetNS, "/sys/class/net/"+c3.HostVeth+"/queues/rx-0/rps_cpus")
	cpus := func() string {
		t.Helper()
		b, err := rps.Read()
		if err != nil {
			t.Fatal(err)
		}
		c, err := cpuset.ParseMask(string(b))
		if err != nil {
			t.Fatal(err)
		}
		return cpuset.FormatList(c)
	}
	plan := cpus()
	a.Reset(t)
	want, _ := cpuset.ParseMask(string(orig))
	if got := cpus(); got != cpuset.FormatList(want) {
		t.Errorf("after reset %s's RPS map is %q (the plan's was %q), want the default's original %q", c3.HostVeth, got, plan, cpuset.FormatList(want))
	}
}
