package prism_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/prism"
	"github.com/lanesnet/lanes/testbed"
	"golang.org/x/sys/unix"
)

// pollerRuns is how many times the NAPI poller of receive queue q of a
// container veth has run (schedstat's third field): a queue's poller runs
// only when a frame arrived on that queue.
func pollerRuns(t *testing.T, ns, dev string, q int) (pid int, runs uint64) {
	t.Helper()
	pid, err := knobs.QueueSched(ns, dev, q).PID()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		t.Fatalf("schedstat of %d: %q", pid, b)
	}
	fmt.Sscan(f[2], &runs)
	return pid, runs
}

// TestPrismVethQueues applies prism-batch with veth-queues=class and checks
// with real frames that a marked flow reaches the container on receive
// queue 1 (its poller runs) and bulk on queue 0, that a flow whose class
// flips every few milliseconds arrives in order, and that reset puts the
// queue counts, TSO, GRO and threaded NAPI back.
func TestPrismVethQueues(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	a := modetest.Apply(t, tb, "prism-batch", map[string]string{"veth-queues": "class"})
	dp := a.Open(t)
	if cfg, err := dp.Config(); err != nil || !cfg.VethClass {
		t.Fatalf("config %+v (%v): per-class container queues off", cfg, err)
	}

	for k, want := range map[knobs.Knob]string{
		knobs.Channels(dst.NetNS, dst.Veth):                            "rx=2 tx=1",
		knobs.Channels(r.NetNS, dst.HostVeth):                          "rx=1 tx=2",
		knobs.Feature(r.NetNS, dst.HostVeth, ethtool.TSO):              "off",
		knobs.Feature(dst.NetNS, dst.Veth, ethtool.GRO):                "on",
		knobs.Sysfs(dst.NetNS, "/sys/class/net/"+dst.Veth+"/threaded"): "1\n",
		knobs.QueueSched(dst.NetNS, dst.Veth, 0):                       "policy=other prio=0 nice=0",
		knobs.QueueSched(dst.NetNS, dst.Veth, 1):                       "policy=fifo prio=53 nice=0",
		knobs.QueueAffinity(dst.NetNS, dst.Veth, 0):                    "1",
		knobs.QueueAffinity(dst.NetNS, dst.Veth, 1):                    "1",
	} {
		if b, err := k.Read(); err != nil || string(b) != want {
			t.Errorf("%s: %q (%v), want %q", k.Key(), b, err, want)
		}
	}

	overlaytest.Warm(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
	set := modetest.Prio(t, r.NetNS)
	rule := modetest.Rule(t, "dst "+dst.Addr.Addr().String()+" udp")
	if err := set.Add(rule); err != nil {
		t.Fatal(err)
	}
	_, bulk0 := pollerRuns(t, dst.NetNS, dst.Veth, 0)
	_, high0 := pollerRuns(t, dst.NetNS, dst.Veth, 1)
	res := overlaytest.Stream{Count: 3000, Size: 200, Burst: 50, Pause: time.Millisecond, CPU: 0}.Delivered(t, "high-priority stream", true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	// Let the marked stream's poller finish before the bulk transfer's
	// baseline is read.
	time.Sleep(50 * time.Millisecond)
	_, bulk1 := pollerRuns(t, dst.NetNS, dst.Veth, 0)
	_, high1 := pollerRuns(t, dst.NetNS, dst.Veth, 1)
	if high1 == high0 {
		t.Errorf("the high-priority queue's poller did not run for %d marked datagrams", res.Received)
	}
	overlaytest.TCP(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 4<<20)
	_, bulk2 := pollerRuns(t, dst.NetNS, dst.Veth, 0)
	_, high2 := pollerRuns(t, dst.NetNS, dst.Veth, 1)
	if bulk2 == bulk1 {
		t.Error("the bulk queue's poller did not run for a TCP transfer")
	}
	// A wake-up or two of the idle high-priority poller happens (seen
	// once in 10 runs: 1); TCP on the wrong queue would make it run about
	// as often as the bulk one (about 100 times here).
	if high2-high1 > 2 {
		t.Errorf("the high-priority queue's poller ran %d times during a bulk TCP transfer (the bulk one %d)", high2-high1, bulk2-bulk1)
	}
	t.Logf("poller runs: bulk %d, %d; high %d, %d", bulk1-bulk0, bulk2-bulk1, high1-high0, high2-high1)

	// Every frame of the marked stream and of the TCP transfer was
	// counted out of its queue: seen on the container side, or dropped
	// (the veth's 256-frame ring drops what does not fit, which
	// steer_drops_skb counts out of the flow's count).
	var vf []steer.VethFlow
	var hiFlow *steer.VethFlow
	for range 50 {
		var err error
		if vf, err = dp.Prio().VethFlows(); err != nil {
			t.Fatal(err)
		}
		hiFlow = nil
		tcpBusy := false
		for i, f := range vf {
			if f.Proto == 17 && f.Src == res.Src.Addr() && f.SrcPort == res.Src.Port() {
				hiFlow = &vf[i]
			}
			tcpBusy = tcpBusy || (f.Proto == 6 && f.InFlight != 0)
		}
		if hiFlow != nil && hiFlow.InFlight == 0 && !tcpBusy {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	switch {
	case hiFlow == nil:
		t.Errorf("container-queue flows %+v: the marked stream is missing", vf)
	case hiFlow.Queue != 1 || hiFlow.InFlight != 0:
		t.Errorf("marked stream %+v: want queue 1, nothing in flight", *hiFlow)
	}
	sawTCP := false
	for _, f := range vf {
		if f.Proto == 6 {
			sawTCP = true
			if f.Queue != 0 {
				t.Errorf("TCP flow %+v on queue %d, want 0", f, f.Queue)
			}
			if f.InFlight != 0 {
				t.Errorf("TCP flow %+v: %d frames still counted in flight after the transfer", f, f.InFlight)
			}
		}
	}
	if !sawTCP {
		t.Errorf("container-queue flows %+v: the TCP transfer is missing", vf)
	}

	// Marked frames dropped on the container side before
	// steer_tc_veth_seen counts them (as the ring drops what does not
	// fit) are counted out of their flow's count (steer_drops_skb).
	const dropSize = 333
	dropped := modetest.DropFrames(t, dst.NetNS, dst.Veth, ebpf.AttachTCXIngress, 14+20+8+dropSize)
	stD0, _ := dp.Stats()
	resD := overlaytest.Stream{Count: 1000, Size: dropSize, Burst: 50, Pause: time.Millisecond, CPU: 0}.Run(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
	var dFlow *steer.VethFlow
	for range 50 {
		vf, _ = dp.Prio().VethFlows()
		dFlow = nil
		for i, f := range vf {
			if f.Proto == 17 && f.Src == resD.Src.Addr() && f.SrcPort == resD.Src.Port() {
				dFlow = &vf[i]
			}
		}
		if dFlow != nil && dFlow.InFlight == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stD1, _ := dp.Stats()
	// Every drop the kernel reports is counted out; the few it may not
	// report stay in flight (modetest.Dropper.Reported).
	nd, reported := dropped.Dropped(t), dropped.Reported(t)
	switch {
	case resD.Received != 0 || nd < 900 || reported < nd/2:
		t.Errorf("dropper: %d of %d datagrams dropped, %d reported by the kernel, %d received", nd, resD.Sent, reported, resD.Received)
	case dFlow == nil || dFlow.Queue != 1 || dFlow.InFlight != int64(nd-reported):
		t.Errorf("marked stream dropped in the container: state %+v, want queue 1 and %d in flight (the drops the kernel did not report)", dFlow, nd-reported)
	}
	if got := stD1[steer.StageContainer].Dropped - stD0[steer.StageContainer].Dropped; got != reported {
		t.Errorf("container stage: %d drops counted out, the dropper dropped %d, the kernel reported %d", got, nd, reported)
	}
	dropped.Detach()

	// Frames from a local container reach the host-side veth without
	// their sender's socket (Linux 6.18), so they are classified like the
	// overlay's: counted, on their class's queue.
	local := r.Containers[1]
	stL0, _ := dp.Stats()
	nLocal := overlaytest.UDPMost(t, local.NetNS, dst.NetNS, dst.Addr.Addr(), 200)
	stL1, _ := dp.Stats()
	d := stL1[steer.StageContainer].Sub(stL0[steer.StageContainer])
	if d.High < uint64(nLocal) {
		t.Errorf("container stage %+v for %d marked datagrams from a local container: want them all on the high-priority queue", d, nLocal)
	}
	localSeen := false
	vf, _ = dp.Prio().VethFlows()
	for _, f := range vf {
		if f.Src == local.Addr.Addr() {
			localSeen = true
			if f.Queue != 1 {
				t.Errorf("local container's marked flow %+v on queue %d, want 1", f, f.Queue)
			}
		}
	}
	if !localSeen {
		t.Errorf("container-queue flows %+v: the local container's flow is missing", vf)
	}

	// A flow whose class flips every 3 ms moves between the queues only
	// once none of its frames is left in the old one: in order.
	st0, _ := dp.Stats()
	stop := modetest.Every(3*time.Millisecond, func(i int) error {
		if i%2 == 1 {
			return set.Add(rule)
		}
		return set.Del(rule)
	})
	res = overlaytest.Stream{Count: 20000, Size: 200, Burst: 50, Pause: 200 * time.Microsecond, CPU: 0}.Delivered(t, "stream while its class flips", true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	flips, flipErr := stop()
	if flipErr != nil {
		t.Fatalf("changing rules: %v", flipErr)
	}
	st1, _ := dp.Stats()
	d = st1[steer.StageContainer].Sub(st0[steer.StageContainer])
	t.Logf("%d rule changes: container stage %+v", flips, d)
	if d.Settled == 0 || d.High == 0 || d.Stayed == 0 {
		t.Errorf("container stage %+v: want frames on both queues and moves between them", d)
	}
	if d.Undrained != 0 {
		t.Errorf("container stage: %d moves on the drain time", d.Undrained)
	}

	a.ResetAndCheck(t, before)
}

// TestPrismVethQueuesRefused: veth-queues=class is refused where it cannot
// work, with a line saying what to do, before anything changes.
func TestPrismVethQueuesRefused(t *testing.T) {
	if _, err := prism.Parse(prism.Defaults(), map[string]string{"veth-queues": "class", "prio-mode": "sync"}); err == nil || !strings.Contains(err.Error(), "drop one of them") {
		t.Errorf("veth-queues=class with sync: %v", err)
	}
	if _, err := prism.Parse(prism.Defaults(), map[string]string{"veth-queues": "two"}); err == nil || !strings.Contains(err.Error(), "want shared or class") {
		t.Errorf("veth-queues=two: %v", err)
	}
	// The high-priority poller must run above the bulk one.
	for _, params := range []map[string]string{
		{"veth-queues": "class", "high": "inline"},
		{"veth-queues": "class", "high-rt": "0"},
	} {
		if _, err := prism.Parse(prism.Defaults(), params); err == nil || !strings.Contains(err.Error(), "not above the bulk one") {
			t.Errorf("%v: %v", params, err)
		}
	}
	if _, err := prism.Parse(prism.Defaults(), map[string]string{"veth-queues": "class", "pin": "false"}); err == nil || !strings.Contains(err.Error(), "needs pin=true") {
		t.Errorf("veth-queues=class pin=false: %v", err)
	}
	if _, err := prism.Parse(prism.Defaults(), map[string]string{"veth-queues": "class", "high": "inline", "streamline": "true", "bulk-sched": "normal"}); err != nil {
		t.Errorf("high=inline with the ladder: %v", err)
	}
}

// TestPrismVethQueuesUnnamedContainer: a container whose namespace has no
// name (only its process holds it, as with Docker and other runtimes: lanes
// finds it as pid:N) gets its per-class queues too, and reset puts them
// back. Every knob here enters that namespace by its pid form.
func TestPrismVethQueuesUnnamedContainer(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	holder := exec.Command("sleep", "600")
	if err := nsx.Start(dst.NetNS, holder); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	if err := nsx.Delete(dst.NetNS); err != nil {
		t.Fatal(err)
	}
	renamed := false
	rename := func() {
		if renamed {
			return
		}
		renamed = true
		// Bind the name again, as `ip netns attach` does.
		path := nsx.Path(dst.NetNS)
		if f, err := os.Create(path); err == nil {
			f.Close()
		}
		if err := unix.Mount(fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid), path, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("binding %s again: %v", dst.NetNS, err)
		}
	}
	t.Cleanup(rename)
	pidNS := fmt.Sprintf("pid:%d", holder.Process.Pid)

	a := modetest.Apply(t, tb, "prism-batch", map[string]string{"veth-queues": "class"})
	dp := a.Open(t)
	for k, want := range map[knobs.Knob]string{
		knobs.Channels(pidNS, dst.Veth):             "rx=2 tx=1",
		knobs.Feature(pidNS, dst.Veth, ethtool.GRO): "on",
		knobs.QueueSched(pidNS, dst.Veth, 1):        "policy=fifo prio=53 nice=0",
	} {
		if b, err := k.Read(); err != nil || string(b) != want {
			t.Errorf("%s: %q (%v), want %q", k.Key(), b, err, want)
		}
	}
	if err := modetest.Prio(t, r.NetNS).Add(modetest.Rule(t, "dst "+dst.Addr.Addr().String()+" udp")); err != nil {
		t.Fatal(err)
	}
	// The traffic helpers enter namespaces by name: give it back (the
	// knobs were planned and journaled in the pid form).
	rename()
	overlaytest.Warm(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
	st0, _ := dp.Stats()
	res := overlaytest.Stream{Count: 500, Size: 200, Burst: 50, Pause: time.Millisecond, CPU: 0}.Delivered(t, "marked stream into the once-unnamed container", true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	st1, _ := dp.Stats()
	if d := st1[steer.StageContainer].Sub(st0[steer.StageContainer]); d.High < uint64(res.Received) {
		t.Errorf("container stage %+v for %d marked datagrams: want them on the high-priority queue", d, res.Received)
	}
	a.ResetAndCheck(t, before)
}
