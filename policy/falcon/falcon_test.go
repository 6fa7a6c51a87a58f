package falcon_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/falcon"
	"github.com/lanesnet/lanes/testbed"
)

// TestFalconApplyReset applies the full falcon mode to the receiver of a
// testbed of each layout (Docker, Flannel, Calico), checks every mechanism is in place and
// the overlay still carries TCP and UDP, then resets and checks every knob
// is back byte for byte.
func TestFalconApplyReset(t *testing.T) {
	needsSplit(t)
	for _, topo := range testbed.Topologies {
		t.Run(string(topo), func(t *testing.T) {
			cpus := online(t)
			tb := upTestbed(t, topo)
			r, s := tb.Receiver(), tb.Sender()
			before := modetest.Snapshot(t, tb)
			if before["bpffs:/sys/fs/bpf"] == "true" {
				t.Log("bpffs was mounted before the apply: the test cannot see the plan mount it")
			}

			// spread=always: every stage placed by hash from the start,
			// so the transfers below cross the steered paths; split=true:
			// the testbed's underlay is a veth, where split=auto is off.
			a := apply(t, tb, "falcon", map[string]string{"spread": "always", "split": "true"})
			if a.State.Plan.Agent != falcon.AgentName {
				t.Errorf("plan agent %q, want %q", a.State.Plan.Agent, falcon.AgentName)
			}
			if !modetest.BPFFSMounted(t) {
				t.Error("bpffs not mounted at /sys/fs/bpf while falcon is applied")
			}
			for _, name := range []string{steer.PinXDP, steer.PinTCIngress, steer.PinTCEgress, "steer_cfg", "steer_table", "steer_flows", "steer_cpumap", "steer_stats", "steer_vni"} {
				if !modetest.Exists(filepath.Join(a.PinDir, name)) {
					t.Errorf("pin %s missing in %s", name, a.PinDir)
				}
			}
			xdp, err := attach.Attached(r.NetNS, r.Underlay)
			if err != nil {
				t.Fatal(err)
			}
			if want := pinnedProgID(t, filepath.Join(a.PinDir, steer.PinXDP)); xdp == 0 || xdp != want {
				t.Errorf("XDP on %s: program %d, want the pinned steer_xdp %d", r.Underlay, xdp, want)
			}
			after := modetest.Snapshot(t, tb)
			if got, want := after["tcx:"+r.NetNS+":"+r.Underlay+":ingress"], strconv.FormatUint(uint64(pinnedProgID(t, filepath.Join(a.PinDir, steer.PinTCIngress))), 10); got != want {
				t.Errorf("tcx ingress on %s: programs %q, want %q", r.Underlay, got, want)
			}
			egress := strconv.FormatUint(uint64(pinnedProgID(t, filepath.Join(a.PinDir, steer.PinTCEgress))), 10)
			for _, c := range r.Containers {
				if got := after["tcx:"+r.NetNS+":"+c.HostVeth+":egress"]; got != egress {
					t.Errorf("tcx egress on %s: programs %q, want %q", c.HostVeth, got, egress)
				}
			}
			// The sender host is not the target: untouched.
			for k, v := range before {
				if containsNS(k, s.NetNS) && after[k] != v {
					t.Errorf("sender host changed: %s = %q, was %q", k, after[k], v)
				}
			}
			if got := rpsCPUs(t, r.NetNS, r.VXLAN); !slices.Equal(got, cpus) {
				t.Errorf("rps_cpus of %s = %v, want all cores %v", r.VXLAN, got, cpus)
			}
			for _, c := range r.Containers {
				if got := rpsCPUs(t, c.NetNS, c.Veth); !slices.Equal(got, cpus) {
					t.Errorf("rps_cpus of %s in %s = %v, want all cores %v", c.Veth, c.NetNS, got, cpus)
				}
			}
			dp := a.Open(t)
			cfg, err := dp.Config()
			if err != nil {
				t.Fatal(err)
			}
			if !cfg.Enabled || !slices.Equal(cfg.CPUs, cpus) || cfg.VXLANPort != 4789 || !slices.Equal(cfg.VNIs, []uint32{tb.Config.VNI}) {
				t.Errorf("datapath config %+v", cfg)
			}
			if cm, err := dp.CPUMap().Entries(); err != nil || !slices.Equal(cm, []int{0}) {
				t.Errorf("cpumap entries %v (%v), want the split core [0]", cm, err)
			}
			st0, err := dp.Stats()
			if err != nil {
				t.Fatal(err)
			}

			sc, rc := s.Containers[0], r.Containers[0]
			tcpTransfer(t, sc.NetNS, rc.NetNS, rc.Addr.Addr(), 4<<20)
			udpTransfer(t, sc.NetNS, rc.NetNS, rc.Addr.Addr(), 1000)
			udpTransfer(t, rc.NetNS, sc.NetNS, sc.Addr.Addr(), 1000)
			// A second container on the receiver, reached through its own veth.
			rc2 := r.Containers[1]
			udpTransfer(t, sc.NetNS, rc2.NetNS, rc2.Addr.Addr(), 1000)

			st1, err := dp.Stats()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d knobs snapshotted, bpffs before: %s; plan: %d changes; steered during the transfers: split %d, bridge %d, container %d",
				len(before), before["bpffs:/sys/fs/bpf"], a.State.Plan.Changes,
				st1[0].Steered-st0[0].Steered, st1[1].Steered-st0[1].Steered, st1[2].Steered-st0[2].Steered)
			for stage := 0; stage < steer.NumStages; stage++ {
				if st1[stage].Steered <= st0[stage].Steered {
					t.Errorf("%s stage steered nothing during the transfers: %+v", steer.StageName(stage), st1[stage])
				}
			}
			dp.Close()

			a.ResetAndCheck(t, before)
			if modetest.BPFFSMounted(t) != (before["bpffs:/sys/fs/bpf"] == "true") {
				t.Error("bpffs mount state after reset differs from before")
			}
			// And the overlay still works after the reset.
			udpTransfer(t, sc.NetNS, rc.NetNS, rc.Addr.Addr(), 1000)
		})
	}
}

// containsNS says whether a snapshot key belongs to ns or one of its
// containers (ns-cN).
func containsNS(key, ns string) bool {
	return strings.Contains(key, ":"+ns+":") || strings.Contains(key, ":"+ns+"-c")
}

// TestFalconSubModes applies each single-mechanism mode and checks that it
// sets up exactly its mechanism, then resets.
func TestFalconSubModes(t *testing.T) {
	cpus := online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	before := modetest.Snapshot(t, tb)
	rpsKey := func(ns, dev string) string {
		return knobs.Sysfs(ns, "/sys/class/net/"+dev+"/queues/rx-0/rps_cpus").Key()
	}

	t.Run("falcon-pipeline", func(t *testing.T) {
		a := apply(t, tb, "falcon-pipeline", nil)
		if a.State.Plan.Agent != "" {
			t.Errorf("agent %q, want none", a.State.Plan.Agent)
		}
		if id, _ := attach.Attached(r.NetNS, r.Underlay); id != 0 {
			t.Errorf("XDP program %d on %s: pipeline alone must not split", id, r.Underlay)
		}
		dp := a.Open(t)
		tabs := tables(t, dp)
		if !allEqual(tabs[steer.StageSplit], steer.Stay) {
			t.Error("split table is not all stay")
		}
		for _, st := range []int{steer.StageBridge, steer.StageContainer} {
			if allEqual(tabs[st], steer.Stay) {
				t.Errorf("%s table is all stay: nothing pipelined", steer.StageName(st))
			}
			// Falcon's cpus[hash % n]: every core of the set gets buckets.
			for i := range cpus {
				if !slices.Contains(tabs[st][:], uint32(i)) {
					t.Errorf("%s table never names core index %d", steer.StageName(st), i)
				}
			}
		}
		if cm, _ := dp.CPUMap().Entries(); len(cm) != 0 {
			t.Errorf("cpumap entries %v without split", cm)
		}
		if got := rpsCPUs(t, r.NetNS, r.VXLAN); !slices.Equal(got, cpus) {
			t.Errorf("rps_cpus of %s = %v, want %v", r.VXLAN, got, cpus)
		}
		after := modetest.Snapshot(t, tb)
		if after["tcx:"+r.NetNS+":"+r.Underlay+":ingress"] == "" {
			t.Error("no tcx ingress program on the underlay")
		}
		udpTransfer(t, s.Containers[0].NetNS, r.Containers[0].NetNS, r.Containers[0].Addr.Addr(), 1000)
		dp.Close()
		a.ResetAndCheck(t, before)
	})

	t.Run("falcon-split", func(t *testing.T) {
		needsSplit(t)
		a := apply(t, tb, "falcon-split", nil)
		if a.State.Plan.Agent != "" {
			t.Errorf("agent %q, want none", a.State.Plan.Agent)
		}
		if id, _ := attach.Attached(r.NetNS, r.Underlay); id == 0 || id != pinnedProgID(t, filepath.Join(a.PinDir, steer.PinXDP)) {
			t.Errorf("XDP on %s: program %d, want steer_xdp", r.Underlay, id)
		}
		dp := a.Open(t)
		cfg, err := dp.Config()
		if err != nil {
			t.Fatal(err)
		}
		idx0 := slices.Index(cfg.CPUs, 0)
		if idx0 < 0 {
			t.Fatalf("core 0 not in the datapath's cores %v", cfg.CPUs)
		}
		tabs := tables(t, dp)
		if !allEqual(tabs[steer.StageSplit], uint32(idx0)) {
			t.Errorf("split table %s, want every bucket at core 0 (index %d)", steer.FormatTable(tabs[steer.StageSplit]), idx0)
		}
		for _, st := range []int{steer.StageBridge, steer.StageContainer} {
			if !allEqual(tabs[st], steer.Stay) {
				t.Errorf("%s table %s, want all stay", steer.StageName(st), steer.FormatTable(tabs[st]))
			}
		}
		if cm, _ := dp.CPUMap().Entries(); !slices.Equal(cm, []int{0}) {
			t.Errorf("cpumap entries %v, want [0]", cm)
		}
		// No RPS and no tcx: the only changes are XDP and the pins.
		after := modetest.Snapshot(t, tb)
		for k, v := range before {
			if k == "xdp:"+r.NetNS+":"+r.Underlay || k == "bpffs:/sys/fs/bpf" || k == "pindir:"+a.PinDir {
				continue
			}
			if after[k] != v {
				t.Errorf("split changed %s: %q -> %q", k, v, after[k])
			}
		}
		if after[rpsKey(r.NetNS, r.VXLAN)] != before[rpsKey(r.NetNS, r.VXLAN)] {
			t.Error("split changed RPS of the VXLAN device")
		}
		st0, _ := dp.Stats()
		udpTransfer(t, s.Containers[0].NetNS, r.Containers[0].NetNS, r.Containers[0].Addr.Addr(), 1000)
		st1, _ := dp.Stats()
		if st1[steer.StageSplit].Steered <= st0[steer.StageSplit].Steered {
			t.Errorf("split stage steered nothing: %+v", st1[steer.StageSplit])
		}
		dp.Close()
		a.ResetAndCheck(t, before)
	})

	t.Run("falcon-balance", func(t *testing.T) {
		a := apply(t, tb, "falcon-balance", nil)
		if a.State.Plan.Agent != falcon.AgentName {
			t.Errorf("agent %q, want %q", a.State.Plan.Agent, falcon.AgentName)
		}
		if id, _ := attach.Attached(r.NetNS, r.Underlay); id != 0 {
			t.Errorf("XDP program %d on %s: balance alone must not split", id, r.Underlay)
		}
		dp := a.Open(t)
		tabs := tables(t, dp)
		for st := 0; st < steer.NumStages; st++ {
			if !allEqual(tabs[st], steer.Stay) {
				t.Errorf("%s table %s, want all stay", steer.StageName(st), steer.FormatTable(tabs[st]))
			}
		}
		// The balancer moves stages through the tc hooks and RPS.
		after := modetest.Snapshot(t, tb)
		if after["tcx:"+r.NetNS+":"+r.Underlay+":ingress"] == "" {
			t.Error("no tcx ingress program on the underlay")
		}
		if got := rpsCPUs(t, r.NetNS, r.VXLAN); !slices.Equal(got, cpus) {
			t.Errorf("rps_cpus of %s = %v, want %v", r.VXLAN, got, cpus)
		}
		udpTransfer(t, s.Containers[0].NetNS, r.Containers[0].NetNS, r.Containers[0].Addr.Addr(), 1000)
		dp.Close()
		a.ResetAndCheck(t, before)
	})
}

// TestFalconUDPInOrder sends sequence-numbered UDP streams while every
// stage's table flips between cores (and the split stage between staying
// and core 0), then while the balancer runs: no datagram may overtake
// another.
func TestFalconUDPInOrder(t *testing.T) {
	needsSplit(t)
	online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	// spread=always: the tables start at Falcon's hash, so the stream
	// crosses cores from its first datagram; split=true: the testbed's
	// veth underlay would leave splitting off (split=auto).
	a := apply(t, tb, "falcon", map[string]string{"spread": "always", "split": "true"})
	dp := a.Open(t)
	static := tables(t, dp)
	if !allEqual(static[steer.StageSplit], 0) {
		t.Fatalf("split table %s, want all at core index 0", steer.FormatTable(static[steer.StageSplit]))
	}
	src, dst := s.Containers[0], r.Containers[0]
	// Warm up ARP and the bridge FDB so the stream's first datagrams are
	// not queued behind resolution.
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200)
	st0, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}

	// The hard case: every core also runs a busy loop, so the cpumap
	// kthread and the backlogs wait for their core, and 2 ms pauses give
	// the flowlet rule (1 ms) its chance to move a flow whose old queue
	// has not drained. Only the drain count keeps order then: with
	// drain=0 (idle gap alone) the same stream reordered in runs tried on
	// the development VM (19 datagrams with no pauses); with it, none in
	// any run. One try, no retries.
	const pause = 2 * time.Millisecond
	stopHogs := hogEveryCore(t)
	stop := modetest.Every(3*time.Millisecond, func(i int) error {
		v := uint32(i % 2)
		split := steer.Stay
		if i%2 == 1 {
			split = 0
		}
		return errors.Join(
			dp.Placement().SetTable(steer.StageBridge, fill(v)),
			dp.Placement().SetTable(steer.StageContainer, fill(1-v)),
			dp.Placement().SetTable(steer.StageSplit, fill(split)))
	})
	overlaytest.Stream{Count: 20000, Size: 200, Burst: 100, Pause: pause, CPU: 0}.Delivered(t, "stream with tables flipping", true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	flips, flipErr := stop()
	stopHogs()
	drained(t, dp)
	if flipErr != nil {
		t.Fatalf("flipping tables: %v", flipErr)
	}
	st1, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d flips; counters: split %+v bridge %+v container %+v", flips,
		sub(st1[0], st0[0]), sub(st1[1], st0[1]), sub(st1[2], st0[2]))
	for stage := 0; stage < steer.NumStages; stage++ {
		d := sub(st1[stage], st0[stage])
		if d.Steered == 0 {
			t.Errorf("%s stage: nothing steered", steer.StageName(stage))
		}
		if d.Moved == 0 {
			t.Errorf("%s stage: no flow moved: the stream proves nothing about moves", steer.StageName(stage))
		}
		if d.Undrained != 0 {
			t.Errorf("%s stage: %d moves gave up waiting for the old queue, with nothing dropped", steer.StageName(stage), d.Undrained)
		}
	}

	// Back to the static placement, then the balancer.
	for st := range static {
		if err := dp.Placement().SetTable(st, static[st]); err != nil {
			t.Fatal(err)
		}
	}
	ag, state, err := control.NewAgent(control.AgentOptions{NetNS: r.NetNS, StateDir: a.StateDir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if state.Plan.Agent != falcon.AgentName {
		t.Errorf("agent state %+v", state.Plan)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- ag.Run(ctx) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-runErr
		}
	})
	overlaytest.Stream{Count: 10000, Size: 200, Burst: 100, Pause: pause, CPU: 0}.Delivered(t, "stream with the balancer running", true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	status, ok := ag.Status().(falcon.AgentStatus)
	if !ok {
		t.Errorf("agent status is %T, want falcon.AgentStatus", ag.Status())
	} else {
		t.Logf("agent status: %+v", status)
		if status.At.IsZero() {
			t.Error("the balancer never sampled")
		}
	}
	cancel()
	select {
	case err := <-runErr:
		stopped = true
		if err != nil {
			t.Errorf("agent Run returned %v after cancel, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not stop within 5s of cancel")
	}
	if now := tables(t, dp); now != static {
		for st := range now {
			if now[st] != static[st] {
				t.Errorf("after the agent stopped, %s table is %s, want the static %s", steer.StageName(st), steer.FormatTable(now[st]), steer.FormatTable(static[st]))
			}
		}
	}
}

func sub(a, b steer.Counters) steer.Counters { return a.Sub(b) }

// TestFalconPlacementObserved checks that the RPS hash trick runs the
// bridge and container stages where the tables say. Three observers:
//
//   - per-core packet counters of tcx ingress programs on the VXLAN device
//     and on the container's eth0: they run in __netif_receive_skb_core of
//     that device, on the core that runs its stage (exact, per packet);
//   - SO_INCOMING_CPU of the receiving socket: the core of UDP receive;
//   - /proc/net/softnet_stat's processed count per core, as the brief
//     asks. It is global: other traffic on the machine adds to it, so only
//     measurements whose total matches this stream's packet budget (4 per
//     datagram) are judged, on their difference to vanilla.
func TestFalconPlacementObserved(t *testing.T) {
	online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	const n = 20000
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200) // ARP, FDB

	bridgeCtr := countPackets(t, r.NetNS, r.VXLAN)
	contCtr := countPackets(t, dst.NetNS, dst.Veth)

	// measure sends the stream until softnet_stat gives a clean reading
	// (at most 4 tries) and checks the exact observers on every try.
	measure := func(what string, core int) (map[int]uint64, overlaytest.StreamResult, bool) {
		for try := 0; try < 4; try++ {
			b0, c0 := bridgeCtr.read(t), contCtr.read(t)
			before := softnet(t)
			res := overlaytest.Stream{Count: n, Size: 200, Burst: 100, Pause: time.Millisecond, CPU: 0}.Run(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
			d := softnetDelta(before, softnet(t))
			bd, cd := diff(bridgeCtr.read(t), b0), diff(contCtr.read(t), c0)
			var total uint64
			for _, v := range d {
				total += v
			}
			clean := total <= 4*uint64(res.Sent)+uint64(res.Sent)/5
			t.Logf("%s: received %d; bridge stage per core %v, container stage per core %v, SO_INCOMING_CPU %d; softnet processed %v (clean %v)",
				what, res.Received, bd, cd, res.IncomingCPU, d, clean)
			if res.Received*10 < n*9 {
				t.Fatalf("%s: only %d of %d datagrams arrived", what, res.Received, n)
			}
			for _, st := range []struct {
				name string
				per  []uint64
			}{{"bridge", bd}, {"container", cd}} {
				if st.per[core] < uint64(res.Received) {
					t.Errorf("%s: %s stage ran %d times on core %d, %d datagrams arrived", what, st.name, st.per[core], core, res.Received)
				}
				for c, v := range st.per {
					if c != core && v > n/100 {
						t.Errorf("%s: %s stage ran %d times on core %d, want (almost) none", what, st.name, v, c)
					}
				}
			}
			if res.IncomingCPU != core {
				t.Errorf("%s: UDP receive ran on core %d, want %d", what, res.IncomingCPU, core)
			}
			if clean {
				return d, res, true
			}
		}
		t.Logf("%s: softnet_stat stayed busy with other traffic on this machine: no clean reading", what)
		return nil, overlaytest.StreamResult{}, false
	}

	// Vanilla: the sender's own container veth backlog on core 0 is the
	// baseline; the receiver's NIC, bridge and container stages all run
	// on the IRQ core 1.
	v := apply(t, tb, "vanilla", nil)
	base, _, baseOK := measure("vanilla", 1)
	v.Reset(t)

	a := apply(t, tb, "falcon-pipeline", nil)
	dp := a.Open(t)
	cfg, err := dp.Config()
	if err != nil {
		t.Fatal(err)
	}
	for _, core := range []int{0, 1} {
		idx := slices.Index(cfg.CPUs, core)
		if idx < 0 {
			t.Fatalf("core %d not in the datapath's cores %v", core, cfg.CPUs)
		}
		for _, st := range []int{steer.StageBridge, steer.StageContainer} {
			if err := dp.Placement().SetTable(st, fill(uint32(idx))); err != nil {
				t.Fatal(err)
			}
		}
		what := "stages on core " + strconv.Itoa(core)
		d, res, ok := measure(what, core)
		if !ok {
			continue
		}
		for _, st := range []int{steer.StageBridge, steer.StageContainer} {
			f, found := flowAt(t, dp, res, st)
			switch {
			case !found:
				t.Errorf("%s: no %s flow entry for %v -> %v", what, steer.StageName(st), res.Src, res.Dst)
			case f.CPUIndex != uint32(idx):
				t.Errorf("%s: %s flow entry at core index %d, want %d", what, steer.StageName(st), f.CPUIndex, idx)
			case f.Packets < uint64(res.Received):
				t.Errorf("%s: %s flow entry counted %d packets, %d arrived", what, steer.StageName(st), f.Packets, res.Received)
			}
		}
		if !baseOK {
			continue
		}
		rcv := uint64(res.Received)
		switch core {
		case 0:
			// Bridge and container backlogs on core 0: 2 per datagram
			// on top of the sender's share.
			if d[0] < n || d[0] < base[0]+rcv*3/2 {
				t.Errorf("%s: core 0 processed %d, vanilla %d: want about %d more", what, d[0], base[0], 2*rcv)
			}
		case 1:
			if d[0] >= base[0]+n/2 || d[1] < 2*rcv {
				t.Errorf("%s: core 0 processed %d (vanilla %d), core 1 %d: want core 0 at vanilla, core 1 >= %d", what, d[0], base[0], d[1], 2*rcv)
			}
		}
	}

	dp.Close()
	a.Reset(t)

	// split=rps: the underlay's RPS sends every skb to core 0 before
	// decapsulation, so the VXLAN device's stage, the container stage and
	// UDP receive all run there, in order, and no XDP hook is attached.
	before := modetest.Snapshot(t, tb)
	rps := apply(t, tb, "falcon-split", map[string]string{"split": "rps"})
	if id, _ := attach.Attached(r.NetNS, r.Underlay); id != 0 {
		t.Errorf("split=rps: XDP program %d on %s, want none", id, r.Underlay)
	}
	if got := rpsCPUs(t, r.NetNS, r.Underlay); !slices.Equal(got, []int{0}) {
		t.Errorf("split=rps: rps_cpus of %s = %v, want [0]", r.Underlay, got)
	}
	if _, res, ok := measure("split=rps", 0); ok && res.Reordered != 0 {
		t.Errorf("split=rps: %d of %d datagrams out of order: %v", res.Reordered, res.Received, res.Examples)
	}
	rps.ResetAndCheck(t, before)
}

func diff(a, b []uint64) []uint64 {
	out := make([]uint64, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}

// TestFalconRefusesForeignXDP puts someone else's XDP program on the
// receiver's underlay: falcon must refuse to replace it and roll back
// every change it made before it got there.
func TestFalconRefusesForeignXDP(t *testing.T) {
	needsSplit(t)
	tb := upTestbed(t, testbed.Docker)
	r := tb.Receiver()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "foreign_pass",
		Type: ebpf.XDP,
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 2), // XDP_PASS
			asm.Return(),
		},
		License: "MIT",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	setXDP := func(fd int) error {
		return nsx.Do(r.NetNS, func() error {
			l, err := netlink.LinkByName(r.Underlay)
			if err != nil {
				return err
			}
			return netlink.LinkSetXdpFd(l, fd)
		})
	}
	if err := setXDP(prog.FD()); err != nil {
		t.Fatalf("attaching the foreign XDP program: %v", err)
	}
	t.Cleanup(func() {
		if err := setXDP(-1); err != nil {
			t.Errorf("detaching the foreign XDP program: %v", err)
		}
	})
	info, _ := prog.Info()
	ours, _ := info.ID()
	if id, _ := attach.Attached(r.NetNS, r.Underlay); id != uint32(ours) {
		t.Fatalf("XDP on %s is %d, want the foreign program %d", r.Underlay, id, ours)
	}
	before := modetest.Snapshot(t, tb)
	stateDir := t.TempDir()
	// split=true: on the testbed's veth underlay split=auto attaches no XDP.
	_, err = control.Apply(control.Options{Mode: "falcon", NetNS: r.NetNS, StateDir: stateDir, Params: map[string]string{"split": "true"}})
	t.Cleanup(func() { control.Reset(r.NetNS, stateDir) })
	modetest.OneLine(t, "apply over a foreign XDP program", err, "already has XDP program")
	modetest.SameSnapshot(t, "after the refused apply", modetest.Snapshot(t, tb), before)
	if id, _ := attach.Attached(r.NetNS, r.Underlay); id != uint32(ours) {
		t.Errorf("XDP on %s is %d after the refused apply, want the foreign program %d", r.Underlay, id, ours)
	}
	dir := control.Dir(stateDir, r.NetNS)
	if knobs.Exists(dir) {
		t.Errorf("journal left in %s after the rolled-back apply", dir)
	}
	if st, err := control.ReadState(dir); st != nil || err != nil {
		t.Errorf("state file left in %s after the rolled-back apply: %+v %v", dir, st, err)
	}
	if modetest.Exists(dir) {
		// control.Apply's rollback removes the state file but not the
		// target directory it created (Reset does remove it).
		t.Errorf("BUG (control/control.go Apply rollback): state directory %s left behind after a rolled-back apply", dir)
	} else {
		modetest.NoState(t, stateDir)
	}
	// The namespace stays usable: with the foreign program gone, falcon
	// applies.
	if err := setXDP(-1); err != nil {
		t.Fatal(err)
	}
	before = modetest.Snapshot(t, tb)
	a := apply(t, tb, "falcon", map[string]string{"split": "true"})
	a.ResetAndCheck(t, before)
}

// TestFalconBadParams: every bad setting is refused with one line before
// anything is touched.
func TestFalconBadParams(t *testing.T) {
	cpus := online(t)
	tb := upTestbed(t, testbed.Docker)
	r := tb.Receiver()
	offline := 7
	if slices.Contains(cpus, offline) {
		offline = slices.Max(cpus) + 1
	}
	before := modetest.Snapshot(t, tb)
	stateDir := t.TempDir()
	t.Cleanup(func() { control.Reset(r.NetNS, stateDir) })
	for _, c := range []struct {
		mode   string
		params map[string]string
		want   string
	}{
		{"falcon", map[string]string{"threshold": "abc"}, `bad falcon setting threshold="abc"`},
		{"falcon-balance", map[string]string{"threshold": "abc"}, `bad falcon setting threshold="abc"`},
		{"falcon", map[string]string{"tresholds": "80"}, `has no setting "tresholds"`},
		{"falcon", map[string]string{"hysteresis": "80"}, "must be below the threshold"},
		{"falcon", map[string]string{"threshold": "50", "hysteresis": "60"}, "must be below the threshold"},
		{"falcon", map[string]string{"split-cpus": strconv.Itoa(offline)}, "split core " + strconv.Itoa(offline) + " is not online"},
		{"falcon-split", map[string]string{"split-cpus": strconv.Itoa(offline)}, "split core " + strconv.Itoa(offline) + " is not online"},
	} {
		_, err := control.Apply(control.Options{Mode: c.mode, NetNS: r.NetNS, StateDir: stateDir, Params: c.params})
		modetest.OneLine(t, c.mode+" "+strconv.Quote(formatParams(c.params)), err, c.want)
		modetest.NoState(t, stateDir)
		if _, err := os.Stat(control.Dir(stateDir, r.NetNS)); err == nil {
			t.Errorf("%v: state directory created", c.params)
		}
	}
	modetest.SameSnapshot(t, "after rejected applies", modetest.Snapshot(t, tb), before)
}

func formatParams(m map[string]string) string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}
