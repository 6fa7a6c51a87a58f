package control_test

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/testbed"
)

// follows is what lanes agent's container follower reports.
type follows interface{ FollowStatus() control.FollowStatus }

// waitFollowed waits until the follower's status satisfies ok.
func waitFollowed(t *testing.T, ag plan.Agent, what string, ok func(control.FollowStatus) bool) control.FollowStatus {
	t.Helper()
	f, is := ag.(follows)
	if !is {
		t.Fatalf("agent %T has no container follower", ag)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := f.FollowStatus()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: follower status after 10 s: %+v", what, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// adopted: the follower's status names the container's host-side veth.
func adopted(c testbed.Container, times int) func(control.FollowStatus) bool {
	return func(st control.FollowStatus) bool {
		n := 0
		for _, a := range st.Adopted {
			if strings.HasSuffix(a, "/"+c.HostVeth) {
				n++
			}
		}
		return n >= times
	}
}

// journaledOn lists the journal's keys on a device (name in namespace).
func journaledOn(t *testing.T, a *modetest.Applied, ns, dev string) []string {
	t.Helper()
	ents, err := knobs.ReadEntries(control.Dir(a.StateDir, a.NS))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.Contains(e.Key, ":"+ns+":") && (strings.Contains(e.Key, ":"+dev+":") || strings.Contains(e.Key, "/"+dev+"/")) {
			out = append(out, e.Key)
		}
	}
	return out
}

// TestFollowContainers: containers started after apply are adopted by
// lanes agent, on every layout. A container started before the agent
// (between apply and agent) is adopted by the agent's first round while a
// sequence-numbered stream runs into it, in order; one started while the
// agent runs is adopted on the link event, and its container stage then
// runs on the core the plan picks for the flow; a container that goes is
// let go of (its journal entries and link pins leave with it), and one
// started again under the same names is adopted afresh; reset restores
// the adopted knobs too, and with the added containers gone every knob is
// as before the apply. Falcon with spread=always: the container stage is
// placed by hash from the start, so the adoption window is what keeps
// the running stream in order; without balancing, so that no load on the
// machine sends the set back to vanilla placement mid-test.
func TestFollowContainers(t *testing.T) {
	for _, topo := range testbed.Topologies {
		t.Run(string(topo), func(t *testing.T) {
			tb := modetest.UpTestbed(t, topo)
			prefix := tb.Config.Prefix
			before := modetest.Snapshot(t, tb)
			a := modetest.Apply(t, tb, "falcon", map[string]string{"spread": "always", "balance": "false"})
			s := tb.Sender()
			src := s.Containers[0]

			c3, err := testbed.AddContainer(prefix, 2)
			if err != nil {
				t.Fatal(err)
			}
			if k := journaledOn(t, a, c3.NetNS, c3.Veth); len(k) != 0 {
				t.Fatalf("journal has %v on a container added after apply", k)
			}
			overlaytest.Warm(t, src.NetNS, c3.NetNS, c3.Addr.Addr())
			var ag plan.Agent
			res := overlaytest.Stream{Count: 20000, Size: 64, Burst: 20, Pause: time.Millisecond, CPU: 0,
				During: func() {
					ag, _ = a.StartAgent(t)
					waitFollowed(t, ag, "adopting "+c3.Name, adopted(c3, 1))
				}}.Run(t, src.NetNS, c3.NetNS, c3.Addr.Addr())
			overlaytest.InOrder(t, "stream across the adoption of "+c3.Name, res)
			for _, d := range []struct{ ns, dev string }{{a.NS, c3.HostVeth}, {c3.NetNS, c3.Veth}} {
				if k := journaledOn(t, a, d.ns, d.dev); len(k) == 0 {
					t.Errorf("nothing journaled on %s/%s after its adoption", d.ns, d.dev)
				}
			}

			// Added while the agent runs: the link event brings it in.
			c4, err := testbed.AddContainer(prefix, 2)
			if err != nil {
				t.Fatal(err)
			}
			waitFollowed(t, ag, "adopting "+c4.Name, adopted(c4, 1))
			time.Sleep(1200 * time.Millisecond) // past the adoption window
			dp := a.Open(t)
			cfg, err := dp.Config()
			if err != nil {
				t.Fatal(err)
			}
			// Warm: datagrams the sender queued while it resolved the
			// new address can be overtaken by the next ones (seen
			// here, on Docker's layout), lanes or not.
			overlaytest.Warm(t, src.NetNS, c4.NetNS, c4.Addr.Addr())
			res = overlaytest.Stream{Count: 2000, Size: 64, Burst: 50, Pause: time.Millisecond, CPU: 0}.Delivered(t, "stream into "+c4.Name, true, src.NetNS, c4.NetNS, c4.Addr.Addr())
			fl := containerFlow(t, dp, res)
			if fl.CPUIndex == steer.Stay || int(fl.CPUIndex) >= len(cfg.CPUs) {
				t.Errorf("%s's flow at the container stage: %+v, want a core of the table", c4.Name, fl)
			} else if core := cfg.CPUs[fl.CPUIndex]; res.IncomingCPU != core {
				t.Errorf("%s's UDP receive ran on core %d, the plan placed it on core %d", c4.Name, res.IncomingCPU, core)
			}

			// Gone: let go of; back under the same names: adopted again.
			if err := testbed.RemoveContainer(prefix, 2, c3.Name); err != nil {
				t.Fatal(err)
			}
			waitFollowed(t, ag, "letting go of "+c3.Name, func(st control.FollowStatus) bool {
				return len(st.Dropped) > 0 && len(journaledOn(t, a, a.NS, c3.HostVeth)) == 0
			})
			if k := journaledOn(t, a, c3.NetNS, c3.Veth); len(k) != 0 {
				t.Errorf("journal still has %v of a container that is gone", k)
			}
			for _, name := range pinsOf(t, a.PinDir, c3.HostVeth) {
				t.Errorf("pin %s of a container that is gone", name)
			}
			again, err := testbed.AddContainer(prefix, 2)
			if err != nil {
				t.Fatal(err)
			}
			if again.HostVeth != c3.HostVeth {
				t.Fatalf("the container added again is %+v, want %s's names", again, c3.Name)
			}
			waitFollowed(t, ag, "adopting "+again.Name+" again", adopted(again, 2))
			overlaytest.Warm(t, src.NetNS, again.NetNS, again.Addr.Addr())
			overlaytest.Stream{Count: 2000, Size: 64, Burst: 50, Pause: time.Millisecond}.Delivered(t, "stream into "+again.Name+" again", true, src.NetNS, again.NetNS, again.Addr.Addr())

			// Replaced under the same names faster than a round: the
			// old devices' entries are let go of all the same, and the
			// new ones taken in afresh.
			if err := testbed.RemoveContainer(prefix, 2, again.Name); err != nil {
				t.Fatal(err)
			}
			if again, err = testbed.AddContainer(prefix, 2); err != nil {
				t.Fatal(err)
			}
			st := waitFollowed(t, ag, "adopting "+again.Name+" a third time", adopted(again, 3))
			drops := 0
			for _, d := range st.Dropped {
				if strings.HasSuffix(d, "/"+again.HostVeth) {
					drops++
				}
			}
			if drops < 2 {
				t.Errorf("dropped %v: want %s let go of twice (removed, then replaced)", st.Dropped, again.HostVeth)
			}
			if tcxOn(t, a.NS, again.HostVeth) == "" {
				t.Errorf("no programs on %s after it was replaced", again.HostVeth)
			}

			a.Reset(t)
			for _, c := range []testbed.Container{again, c4} {
				for _, d := range []struct{ ns, dev string }{{a.NS, c.HostVeth}, {c.NetNS, c.Veth}} {
					if p := tcxOn(t, d.ns, d.dev); p != "" {
						t.Errorf("after reset: tcx programs %s on %s/%s", p, d.ns, d.dev)
					}
				}
				if err := testbed.RemoveContainer(prefix, 2, c.Name); err != nil {
					t.Fatal(err)
				}
			}
			modetest.SameSnapshot(t, "after reset, the added containers gone", modetest.Snapshot(t, tb), before)
		})
	}
}

// containerFlow finds a stream's container-stage flow state.
func containerFlow(t *testing.T, dp *steer.Datapath, res overlaytest.StreamResult) steer.Flow {
	t.Helper()
	flows, err := dp.Flows()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Stage == steer.StageContainer && f.Src == res.Src.Addr() && f.Dst == res.Dst.Addr() && f.SrcPort == res.Src.Port() && f.DstPort == res.Dst.Port() {
			return f
		}
	}
	t.Fatalf("no container-stage state for the stream %v -> %v", res.Src, res.Dst)
	return steer.Flow{}
}

// tcxOn lists the tcx programs on a device, both directions.
func tcxOn(t *testing.T, ns, dev string) string {
	t.Helper()
	return strings.Trim(modetest.TCXProgs(t, ns, dev, ebpf.AttachTCXIngress)+","+modetest.TCXProgs(t, ns, dev, ebpf.AttachTCXEgress), ",")
}

// pinsOf lists the pins in dir named for a device (plan.LinkPin).
func pinsOf(t *testing.T, dir, dev string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), "_"+dev) {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestFollowRefusesHostChanges: what the follower does not follow (here a
// second VXLAN device, which the plan would steer too) is reported, with
// the fix, and nothing of that round is applied, not even a container
// added at the same time; once the device is gone, the container is
// adopted.
func TestFollowRefusesHostChanges(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Docker)
	r := tb.Receiver()
	// Not parked: the follower waits while Falcon is, and this test
	// waits for it.
	a := modetest.Apply(t, tb, "falcon", map[string]string{"x-park": "false"})
	// The IRQ cores the plan was made for are in the state, so an agent
	// started after they moved still knows (the testbed polls its
	// underlay on the last core).
	if st, err := control.ReadState(control.Dir(a.StateDir, a.NS)); err != nil || !slices.Equal(st.IRQCPUs, []int{tb.Config.IRQCPU}) {
		t.Fatalf("state's irq_cpus: %v (%v), want [%d]", st, err, tb.Config.IRQCPU)
	}
	ag, _ := a.StartAgent(t)
	waitFollowed(t, ag, "first round", func(st control.FollowStatus) bool { return st.Rounds > 0 })

	nh, ul := linkIn(t, r.NetNS, r.Underlay)
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan9"}, VxlanId: 99, VtepDevIndex: ul.Attrs().Index, Port: 4790}
	if err := nh.LinkAdd(vx); err != nil {
		t.Fatal(err)
	}
	c3, err := testbed.AddContainer(tb.Config.Prefix, 2)
	if err != nil {
		t.Fatal(err)
	}
	st := waitFollowed(t, ag, "refusing", func(st control.FollowStatus) bool { return st.Refused != "" })
	if !strings.Contains(st.Refused, "vxlan9") || !strings.Contains(st.Refused, "run lanes apply --mode falcon --netns "+r.NetNS+" ") || !strings.Contains(st.Refused, "restart lanes agent") || strings.Contains(st.Refused, "\n") {
		t.Errorf("refusal %q: want one line naming vxlan9 and the fix", st.Refused)
	}
	if p := tcxOn(t, r.NetNS, c3.HostVeth); p != "" || len(st.Adopted) != 0 {
		t.Errorf("refused round adopted %v (tcx %q on %s)", st.Adopted, p, c3.HostVeth)
	}
	if !slices.Contains(st.Summary(), "containers: NOT FOLLOWED: "+st.Refused) {
		t.Errorf("status lines %q do not show the refusal", st.Summary())
	}

	// A device that is down is not adopted (a runtime names a
	// container's veth while it is down): c3's container side waits
	// until it is up, its host side goes ahead.
	ch, cl := linkIn(t, c3.NetNS, c3.Veth)
	if err := ch.LinkSetDown(cl); err != nil {
		t.Fatal(err)
	}
	if err := nh.LinkDel(vx); err != nil {
		t.Fatal(err)
	}
	st = waitFollowed(t, ag, "adopting the host side once the host is back", adopted(c3, 1))
	if st.Refused != "" {
		t.Errorf("refusal %q stays after the device went", st.Refused)
	}
	if !strings.Contains(st.Waiting, c3.Veth) || !strings.Contains(st.Waiting, "to come up") {
		t.Errorf("waiting %q: want it to name %s, which is down", st.Waiting, c3.Veth)
	}
	if k := journaledOn(t, a, c3.NetNS, c3.Veth); len(k) != 0 {
		t.Errorf("journaled %v on %s while it is down", k, c3.Veth)
	}
	if err := ch.LinkSetUp(cl); err != nil {
		t.Fatal(err)
	}
	waitFollowed(t, ag, "adopting "+c3.Veth+" once it is up", func(st control.FollowStatus) bool {
		return st.Waiting == "" && len(journaledOn(t, a, c3.NetNS, c3.Veth)) > 0
	})
}

// linkIn is a netlink handle in namespace ns (closed with the test) and
// its link dev.
func linkIn(t *testing.T, ns, dev string) (*netlink.Handle, netlink.Link) {
	t.Helper()
	h, err := netlink.NewHandleAt(nsHandle(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	l, err := h.LinkByName(dev)
	if err != nil {
		t.Fatalf("%s in %s: %v", dev, ns, err)
	}
	return h, l
}

func nsHandle(t *testing.T, name string) netns.NsHandle {
	t.Helper()
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestFollowReplacedWhileNoAgent: a container the apply covered, removed
// and started again under the same names while no agent runs, is told
// from the journaled one by the next agent (apply kept the devices'
// idents in the state dir): the old devices' entries are let go of and
// the new devices taken in afresh; reset then leaves every knob as before.
func TestFollowReplacedWhileNoAgent(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Docker)
	prefix := tb.Config.Prefix
	before := modetest.Snapshot(t, tb)
	c3, err := testbed.AddContainer(prefix, 2)
	if err != nil {
		t.Fatal(err)
	}
	a := modetest.Apply(t, tb, "falcon", map[string]string{"spread": "always"})
	if k := journaledOn(t, a, a.NS, c3.HostVeth); len(k) == 0 {
		t.Fatalf("nothing journaled on %s by the apply", c3.HostVeth)
	}
	if _, err := os.Stat(control.Dir(a.StateDir, a.NS) + "/" + control.DevicesFile); err != nil {
		t.Fatalf("apply kept no device idents: %v", err)
	}
	if err := testbed.RemoveContainer(prefix, 2, c3.Name); err != nil {
		t.Fatal(err)
	}
	again, err := testbed.AddContainer(prefix, 2)
	if err != nil {
		t.Fatal(err)
	}
	if again.HostVeth != c3.HostVeth {
		t.Fatalf("the container added again is %+v, want %s's names", again, c3.Name)
	}
	ag, stop := a.StartAgent(t)
	st := waitFollowed(t, ag, "adopting "+again.Name+" afresh", adopted(again, 1))
	if !slices.ContainsFunc(st.Dropped, func(d string) bool { return strings.HasSuffix(d, "/"+again.HostVeth) }) {
		t.Errorf("dropped %v: want %s's old entries let go of (replaced while no agent ran)", st.Dropped, again.HostVeth)
	}
	stop()
	a.Reset(t)
	if err := testbed.RemoveContainer(prefix, 2, again.Name); err != nil {
		t.Fatal(err)
	}
	modetest.SameSnapshot(t, "after reset, the added container gone", modetest.Snapshot(t, tb), before)
}
