package mflow

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/reorder"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
)

// host is a receiving host as discovery reports one: an underlay whose
// NAPI thread is pinned to core irq (none: -1), and a VXLAN device with
// two rx queues, so the bridge split must set RPS on each.
func host(irq int) *topology.Topology {
	ul := topology.Device{Name: "ul2", NetNS: "h2", RxQueues: []topology.RxQueue{{Index: 0}}}
	if irq >= 0 {
		ul.NAPIThreads = []kthread.Info{{PID: 10, Comm: "napi/ul2-8193", CPUs: []int{irq}}}
	}
	return &topology.Topology{
		NetNS: "h2",
		VXLANs: []topology.VXLAN{{
			Device: topology.Device{Name: "vxlan0", NetNS: "h2", RxQueues: []topology.RxQueue{{Index: 0}, {Index: 1}}},
			VNI:    42, Port: 4789, Underlay: "ul2", UnderlayNetNS: "h2",
		}},
		Underlays: []topology.Device{ul},
	}
}

// planned is a plan with its datapath setup and the programs it attaches,
// in order.
type planned struct {
	*plan.Plan
	setup steer.Setup
	progs []string
	rps   map[string]string // target -> rps_cpus value
}

func planOn(t *testing.T, top *topology.Topology, cpus []int, params map[string]string) (planned, error) {
	t.Helper()
	if err := plan.CheckParams(planner{}, params); err != nil {
		return planned{}, err
	}
	p, err := planner{}.Plan(top, plan.Config{CPUs: cpus, Online: []int{0, 1, 2, 3}, Params: params})
	if err != nil {
		return planned{}, err
	}
	out := planned{Plan: p, rps: map[string]string{}}
	for _, c := range p.Changes {
		switch k := c.Knob.(type) {
		case *steer.DatapathKnob:
			if out.setup, err = steer.DecodeSetup(string(c.Value)); err != nil {
				t.Fatal(err)
			}
		case *attach.TCX:
			out.progs = append(out.progs, "tcx:"+k.Prog[strings.LastIndex(k.Prog, "/")+1:])
		case *attach.XDP:
			out.progs = append(out.progs, "xdp:"+k.Prog[strings.LastIndex(k.Prog, "/")+1:])
		default:
			if strings.HasSuffix(c.Knob.Key(), "/rps_cpus") {
				out.rps[c.Target] = string(c.Value)
				out.progs = append(out.progs, "rps")
			}
		}
	}
	return out, nil
}

func mustPlan(t *testing.T, top *topology.Topology, cpus []int, params map[string]string) planned {
	t.Helper()
	p, err := planOn(t, top, cpus, params)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func notesSay(t *testing.T, p planned, want ...string) {
	t.Helper()
	all := strings.Join(p.Notes, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("notes %q do not say %q", p.Notes, w)
		}
	}
}

// kernelReorders makes the planner see a kernel with the BPF qdisc (ok) or
// this host's kind, without it, for the rest of t.
func kernelReorders(t *testing.T, ok bool) {
	old := reorderSupported
	t.Cleanup(func() { reorderSupported = old })
	reorderSupported = func() error {
		if ok {
			return nil
		}
		return &reorder.UnsupportedError{Release: "6.18.44", Why: "this kernel (6.18.44) was built without it"}
	}
}

// TestPlanDefaults: at the NIC poll, elephants from 10000 packets/s (100
// frames per 10 ms), batches of 256 over both cores of a 2-core host, the
// IRQ core included; the datapath and its pins first, the program that
// reads micro-flows back before the one that makes them.
func TestPlanDefaults(t *testing.T) {
	kernelReorders(t, false)
	p := mustPlan(t, host(1), []int{0, 1}, nil)
	want := steer.MFlow{At: steer.SplitAtIRQ, Batch: 256, Cores: []int{0, 1}, Threshold: 100, Window: 10 * time.Millisecond}
	m := p.setup.Config.MFlow
	if m.At != want.At || m.Batch != want.Batch || !slices.Equal(m.Cores, want.Cores) || m.Threshold != want.Threshold || m.Window != want.Window {
		t.Errorf("split %+v, want %+v", m, want)
	}
	c := p.setup.Config
	if !c.Enabled || c.CountSplit || c.NoBridgeCount || c.Prio || !slices.Equal(c.CPUs, []int{0, 1}) || c.VXLANPort != 4789 || !slices.Equal(c.VNIs, []uint32{42}) {
		t.Errorf("config %+v", c)
	}
	if !slices.Equal(p.setup.CPUMap, []int{0, 1}) || p.setup.QueueSize != 2048 {
		t.Errorf("cpumap %v of %d frames, want both cores, 2048", p.setup.CPUMap, p.setup.QueueSize)
	}
	if k := p.Changes; k[0].Knob.Kind() != attach.KindBPFFS || k[1].Knob.Kind() != attach.KindPinDir || k[2].Knob.Kind() != steer.KindDatapath {
		t.Errorf("first changes %s %s %s", k[0].Knob.Kind(), k[1].Knob.Kind(), k[2].Knob.Kind())
	}
	if want := []string{"tcx:" + steer.PinTCSplitSeen, "xdp:" + steer.PinXDP}; !slices.Equal(p.progs, want) {
		t.Errorf("attached %v, want %v", p.progs, want)
	}
	if p.Agent != "" {
		t.Errorf("agent %q: mflow is static", p.Agent)
	}
	notesSay(t, p, "from 10000 packets/s (100 frames within 10ms)", "micro-flows of 256 frames", "cores 0-1", "reorders")
}

// TestPlanBridge: at the bridge stage the split is tc ingress plus RPS on
// every rx queue of the VXLAN device over the datapath's cores, set after
// the program; no XDP, no cpumap, bridge frames not counted in flight.
func TestPlanBridge(t *testing.T) {
	p := mustPlan(t, host(1), []int{0, 1}, map[string]string{"at": "bridge"})
	if p.setup.Config.MFlow.At != steer.SplitAtBridge || !p.setup.Config.NoBridgeCount || len(p.setup.CPUMap) != 0 {
		t.Errorf("setup %+v", p.setup)
	}
	if want := []string{"tcx:" + steer.PinTCIngress, "rps", "rps"}; !slices.Equal(p.progs, want) {
		t.Errorf("changes %v, want %v", p.progs, want)
	}
	for _, q := range []string{"h2/vxlan0 rx-0", "h2/vxlan0 rx-1"} {
		if p.rps[q] != "3" {
			t.Errorf("%s rps_cpus %q, want mask 3", q, p.rps[q])
		}
	}
	notesSay(t, p, "at the bridge stage")
}

// TestPlanSettings: every setting reaches the datapath.
func TestPlanSettings(t *testing.T) {
	for _, c := range []struct {
		params    map[string]string
		cpus      []int
		cores     []int
		threshold uint32
		window    time.Duration
		notes     []string
	}{
		{map[string]string{"batch": "16", "split-cpus": "0,2", "queue-size": "512"}, []int{0, 1}, []int{0, 2}, 100, 10 * time.Millisecond, nil},
		{map[string]string{"threshold": "0"}, []int{0, 1}, []int{0, 1}, 0, 10 * time.Millisecond, []string{"elephants: every flow"}},
		{map[string]string{"threshold": "1000"}, []int{0, 1}, []int{0, 1}, 16, 16 * time.Millisecond, nil},
		{map[string]string{"threshold": "16"}, []int{0, 1}, []int{0, 1}, 16, time.Second, nil},
		{map[string]string{"threshold": "1000000"}, []int{0, 1}, []int{0, 1}, 10000, 10 * time.Millisecond, nil},
		{nil, []int{3}, []int{3}, 100, 10 * time.Millisecond, []string{"one split core (3)"}},
	} {
		p := mustPlan(t, host(1), c.cpus, c.params)
		m := p.setup.Config.MFlow
		if !slices.Equal(m.Cores, c.cores) || m.Threshold != c.threshold || m.Window != c.window {
			t.Errorf("%v on %v: split %+v, want cores %v, %d frames per %v", c.params, c.cpus, m, c.cores, c.threshold, c.window)
		}
		// Split cores outside the set join the datapath's cores.
		for _, core := range c.cores {
			if !slices.Contains(p.setup.Config.CPUs, core) {
				t.Errorf("%v: split core %d not in the datapath's cores %v", c.params, core, p.setup.Config.CPUs)
			}
		}
		notesSay(t, p, c.notes...)
	}
	p := mustPlan(t, host(1), []int{0, 1}, map[string]string{"batch": "16", "queue-size": "512"})
	if p.setup.Config.MFlow.Batch != 16 || p.setup.QueueSize != 512 {
		t.Errorf("setup %+v, want batch 16, queues of 512", p.setup)
	}
}

func TestDefaultSplitCPUs(t *testing.T) {
	for _, c := range []struct{ set, irq, want []int }{
		{[]int{0, 1}, []int{1}, []int{0, 1}},
		{[]int{0, 1, 2, 3}, []int{3}, []int{0, 3}},
		{[]int{2, 3}, []int{1}, []int{2, 3}}, // the IRQ core is not lanes' to use
		{[]int{0, 1, 2}, nil, []int{0, 1}},
		{[]int{5}, []int{5}, []int{5}},
	} {
		if got := DefaultSplitCPUs(c.set, c.irq); !slices.Equal(got, c.want) {
			t.Errorf("set %v, irq %v: %v, want %v", c.set, c.irq, got, c.want)
		}
	}
	p := mustPlan(t, host(-1), []int{0, 1, 2}, nil)
	if !slices.Equal(p.setup.Config.MFlow.Cores, []int{0, 1}) {
		t.Errorf("split cores %v with the IRQ core unknown", p.setup.Config.MFlow.Cores)
	}
	notesSay(t, p, "IRQ core is unknown")
}

// TestPlanOldKernel: without GRO in cpumap (before 6.15) splitting at the
// NIC poll would cost TCP its GRO: the plan splits at the bridge and says
// why.
func TestPlanOldKernel(t *testing.T) {
	defer func(f func() (bool, string)) { kernelSupport = f }(kernelSupport)
	kernelSupport = func() (bool, string) {
		return false, "kernel 6.8.0: cpumap passes packets up without GRO (needs >= 6.15)"
	}
	p := mustPlan(t, host(1), []int{0, 1}, nil)
	if p.setup.Config.MFlow.At != steer.SplitAtBridge || len(p.setup.CPUMap) != 0 || slices.Contains(p.progs, "xdp:"+steer.PinXDP) {
		t.Errorf("setup %+v, changes %v: want the bridge split", p.setup, p.progs)
	}
	notesSay(t, p, "needs >= 6.15", "splitting at the bridge stage instead")
}

// TestPlanBadSettings: every bad setting is one line saying what to fix.
func TestPlanBadSettings(t *testing.T) {
	for want, params := range map[string]map[string]string{
		`batch="0": want 1..65536`:                              {"batch": "0"},
		`batch="65537"`:                                         {"batch": "65537"},
		`batch="many"`:                                          {"batch": "many"},
		`threshold="5": want packets/s`:                         {"threshold": "5"},
		`threshold="-1"`:                                        {"threshold": "-1"},
		`at="nic": want irq or bridge`:                          {"at": "nic"},
		"split core 7 is not online":                            {"split-cpus": "7"},
		`queue-size="3": want 8..16384`:                         {"queue-size": "3"},
		`has no setting "batches"`:                              {"batches": "8"},
		`reorder="maybe": want on or off`:                       {"reorder": "maybe"},
		`reorder-timeout="0s": want a duration from 1ms to 10s`: {"reorder-timeout": "0s"},
		`reorder-timeout="1h"`:                                  {"reorder-timeout": "1h"},
	} {
		_, err := planOn(t, host(1), []int{0, 1}, params)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want one line with %q", params, err, want)
		}
	}
	top := host(1)
	top.Underlays = nil
	if _, err := planOn(t, top, []int{0, 1}, nil); err == nil || !strings.Contains(err.Error(), "no underlay") {
		t.Errorf("without an underlay: %v", err)
	}
}

func TestParamsRoundTrip(t *testing.T) {
	o := Options{Batch: 64, SplitCPUs: []int{1, 3}, Threshold: 0, At: steer.SplitAtBridge, QueueSize: 4096, ReorderTimeout: 50 * time.Millisecond}
	back, err := Parse(Defaults(), o.Params())
	if err != nil {
		t.Fatal(err)
	}
	if back.Batch != 64 || !slices.Equal(back.SplitCPUs, o.SplitCPUs) || back.Threshold != 0 || back.At != o.At || back.QueueSize != 4096 ||
		back.Reorder || back.ReorderTimeout != o.ReorderTimeout {
		t.Errorf("round trip %+v, want %+v", back, o)
	}
}

// TestPlanReorder: on a kernel with the BPF qdisc every container's
// host-side veth gets the reassembler (after the datapath and its
// programs), configured for the split, and the container side of each
// gets RPS onto one core, so nothing spreads the merged flow again.
func TestPlanReorder(t *testing.T) {
	kernelReorders(t, true)
	top := topotest.Receiver()
	p := mustPlan(t, top, []int{0, 1}, map[string]string{"batch": "64", "reorder-timeout": "50ms"})
	var qk *reorder.QdiscKnob
	var val string
	for i, c := range p.Changes {
		if k, ok := c.Knob.(*reorder.QdiscKnob); ok {
			qk, val = k, string(c.Value)
			if i < 4 {
				t.Errorf("the reassembler is change %d: want it after the datapath and its programs", i)
			}
		}
	}
	if qk == nil || qk.Device != "veth1" || qk.NetNS != "h2" || qk.Dir != ReorderDir("h2", "veth1") || !strings.HasPrefix(qk.Dir, plan.PinDir("h2")+"/") {
		t.Fatalf("reassembler knob %+v: want veth1 of h2, pinned under the target's directory", qk)
	}
	cfg, err := reorder.DecodeConfig(val)
	if err != nil || cfg.Batch != 64 || cfg.Cores != 2 || cfg.Timeout != 50*time.Millisecond {
		t.Errorf("reassembler config %+v (%v), want batch 64 over 2 cores, 50ms", cfg, err)
	}
	if got := p.rps["h2-c1/eth0 rx-0"]; got != "1" {
		t.Errorf("container-side RPS %v, want eth0 rx-0 on core 0 alone (mask 1)", p.rps)
	}
	// GRO off on the VXLAN device: its GRO cell would take a micro-flow's
	// aggregates for other flows and could let a later one pass.
	gro := knobs.Feature("h2", "vxlan0", ethtool.GRO).Key()
	if !slices.ContainsFunc(p.Changes, func(c plan.Change) bool { return c.Knob.Key() == gro && string(c.Value) == "off" }) {
		t.Errorf("no change turns GRO off on h2/vxlan0")
	}
	notesSay(t, p, "reassembly at the root of 1 container veths", "held, released, gaps skipped, overflows", plan.PinDir("h2")+"/reorder")
	// An elephant stays split until it pauses for twice the timeout: its
	// untagged frames would pass what the reassembler holds.
	if q := p.setup.Config.MFlow.Quiet; q != 100*time.Millisecond {
		t.Errorf("elephant quiet time %v, want 100ms (twice the reassembler's timeout)", q)
	}
	for _, n := range p.Notes {
		if strings.Contains(n, "reorders") {
			t.Errorf("note %q: with the reassembler mflow does not reorder", n)
		}
	}

	// Off by request; and not on a veth someone gave a qdisc, or with
	// several transmit queues.
	p = mustPlan(t, top, []int{0, 1}, map[string]string{"reorder": "off"})
	if len(p.rps) != 0 || hasQdisc(p) {
		t.Errorf("reorder=off: changes %v", p.progs)
	}
	notesSay(t, p, "reassembly off")
	if q := p.setup.Config.MFlow.Quiet; q != 0 {
		t.Errorf("reorder=off: elephant quiet time %v, want 0 (falls back by rate)", q)
	}
	top.Veths[0].Hooks = &topology.Hooks{Egress: []string{"qdisc:htb"}}
	p = mustPlan(t, top, []int{0, 1}, nil)
	if hasQdisc(p) {
		t.Error("the reassembler replaces htb")
	}
	notesSay(t, p, "not on veth1 (root qdisc htb)")
	if q := p.setup.Config.MFlow.Quiet; q != 0 {
		t.Errorf("no veth reassembles: elephant quiet time %v, want 0", q)
	}
	top.Veths[0].Hooks, top.Veths[0].TxQueues = nil, 2
	p = mustPlan(t, top, []int{0, 1}, nil)
	if hasQdisc(p) {
		t.Error("the reassembler on a veth with 2 transmit queues")
	}
	notesSay(t, p, "not on veth1 (2 transmit queues)")

	// A routed overlay forwards: IPv4 forwarding must keep skb->priority.
	top = topotest.Receiver()
	top.Kind = topology.Flannel
	p = mustPlan(t, top, []int{0, 1}, nil)
	found := false
	for _, c := range p.Changes {
		if c.Knob.Key() == knobs.Sysctl("h2", "net.ipv4.ip_forward_update_priority").Key() && string(c.Value) == "0" {
			found = true
		}
	}
	if !found || !hasQdisc(p) {
		t.Errorf("flannel: want ip_forward_update_priority 0 and the reassembler")
	}
}

// TestPlanNoReorder: without the BPF qdisc the plan says so in one line,
// naming the kernel it needs, and mflow reorders.
func TestPlanNoReorder(t *testing.T) {
	kernelReorders(t, false)
	p := mustPlan(t, topotest.Receiver(), []int{0, 1}, nil)
	if hasQdisc(p) || len(p.rps) != 0 {
		t.Errorf("changes %v: want no reassembler and no container-side RPS", p.progs)
	}
	var lines []string
	for _, n := range p.Notes {
		if strings.Contains(n, "reassembly") {
			lines = append(lines, n)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "unavailable") || !strings.Contains(lines[0], "6.16") ||
		!strings.Contains(lines[0], "CONFIG_NET_SCH_BPF") || !strings.Contains(lines[0], "reorders") {
		t.Errorf("notes on reassembly %q: want one line saying it is unavailable and why", lines)
	}
}

func hasQdisc(p planned) bool {
	for _, c := range p.Changes {
		if _, ok := c.Knob.(*reorder.QdiscKnob); ok {
			return true
		}
	}
	return false
}
