package falcon_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/falcon"
	"github.com/lanesnet/lanes/testbed"
)

// followStatus is the container follower's status beside the agent.
func followStatus(t *testing.T, ag plan.Agent) control.FollowStatus {
	t.Helper()
	f, ok := ag.(interface{ FollowStatus() control.FollowStatus })
	if !ok {
		t.Fatalf("agent %T has no container follower", ag)
	}
	return f.FollowStatus()
}

// TestFalconParkedFollow: a container started while Falcon is parked is
// not adopted while it is (the follower waits: what it adopts must be what
// parking takes off and puts back), is adopted once a busy IRQ core has
// the agent unpark, and is parked with the rest when the load is gone:
// its programs and RPS map come off the path too. A stream into it stays
// in order throughout; reset restores its knobs with the others.
func TestFalconParkedFollow(t *testing.T) {
	cpus := online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	src := s.Containers[0]
	before := modetest.Snapshot(t, tb)
	a := apply(t, tb, "falcon", nil)
	ag, stopAgent := a.StartAgent(t)
	waitParked(t, ag, true, 10*time.Second, "idle")

	c3, err := testbed.AddContainer(tb.Config.Prefix, 2)
	if err != nil {
		t.Fatal(err)
	}
	progs := func() string {
		return modetest.TCXProgs(t, r.NetNS, c3.HostVeth, ebpf.AttachTCXEgress)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(followStatus(t, ag).Waiting, "parked") {
		if time.Now().After(deadline) {
			t.Fatalf("container added while parked: follower status %+v, want it waiting", followStatus(t, ag))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p := progs(); p != "" {
		t.Errorf("while parked, the new container's host veth has tcx programs %s", p)
	}
	overlaytest.Warm(t, src.NetNS, c3.NetNS, c3.Addr.Addr())

	// Busy: the agent unparks (stages leave home), and the follower
	// adopts the container then.
	irq := tb.Config.IRQCPU
	if !slices.Contains(cpus, irq) {
		t.Skipf("IRQ core %d is not online (%v)", irq, cpus)
	}
	stopHog := hogCores(t, []int{irq})
	adopted := false
	for try := 0; try < 30 && !adopted; try++ {
		overlaytest.Stream{Count: 2000, Size: 200, Burst: 50, Pause: 2 * time.Millisecond, CPU: cpus[0]}.Delivered(t, "stream into the new container, the IRQ core busy", true, src.NetNS, c3.NetNS, c3.Addr.Addr())
		adopted = len(followStatus(t, ag).Adopted) > 0
	}
	if !adopted {
		t.Fatalf("the IRQ core was busy for 30 streams and the container was not adopted: %+v", followStatus(t, ag))
	}
	if p := progs(); p == "" && !ag.Status().(falcon.AgentStatus).Parked {
		t.Error("adopted and unparked, and the new container's host veth has no tcx program")
	}
	stopHog()
	overlaytest.Stream{Count: 2000, Size: 200, Burst: 50, Pause: 2 * time.Millisecond, CPU: cpus[0]}.Delivered(t, "stream into the new container after the load", true, src.NetNS, c3.NetNS, c3.Addr.Addr())
	waitParked(t, ag, true, 15*time.Second, "after the load")
	if p := progs(); p != "" {
		t.Errorf("parked again, and the adopted container's host veth still has tcx programs %s", p)
	}
	mask, err := knobs.Sysfs(c3.NetNS, "/sys/class/net/"+c3.Veth+"/queues/rx-0/rps_cpus").Read()
	if err != nil {
		t.Fatal(err)
	}
	if cpus, err := cpuset.ParseMask(string(mask)); err != nil || len(cpus) != 0 {
		t.Errorf("parked again, and the adopted container's RPS map is %q", mask)
	}
	stopAgent()
	if p := progs(); p == "" {
		t.Error("agent stopped (unparked), and the adopted container's host veth has no tcx program")
	}
	a.Reset(t)
	if p := progs(); p != "" {
		t.Errorf("after reset, the adopted container's host veth has tcx programs %s", p)
	}
	if err := testbed.RemoveContainer(tb.Config.Prefix, 2, c3.Name); err != nil {
		t.Fatal(err)
	}
	modetest.SameSnapshot(t, "after reset, the added container gone", modetest.Snapshot(t, tb), before)
}
