package mflow

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/topology"
)

// host is a receiving host as discovery reports one: an underlay whose
// NAPI thread is pinned to core irq (none: -1), and a VXLAN device with
// two rx queues, so the bridge split must set RPS on each.
func host(irq int) *topology.Topology {
	ul := topology.Device{Name: "ul2", NetNS: "h2", RxQueues: []topology.RxQueue{{Index: 0}}}
	if irq >= 0 {
		ul.NAPIThreads = []knobs.KthreadInfo{{PID: 10, Comm: "napi/ul2-8193", CPUs: []int{irq}}}
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

// TestPlanDefaults: at the NIC poll, elephants from 10000 packets/s (100
// frames per 10 ms), batches of 256 over both cores of a 2-core host, the
// IRQ core included; the datapath and its pins first, the program that
// reads micro-flows back before the one that makes them.
func TestPlanDefaults(t *testing.T) {
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
		`batch="0": want 1..65536`:      {"batch": "0"},
		`batch="65537"`:                 {"batch": "65537"},
		`batch="many"`:                  {"batch": "many"},
		`threshold="5": want packets/s`: {"threshold": "5"},
		`threshold="-1"`:                {"threshold": "-1"},
		`at="nic": want irq or bridge`:  {"at": "nic"},
		"split core 7 is not online":    {"split-cpus": "7"},
		`queue-size="3": want 8..16384`: {"queue-size": "3"},
		`has no setting "batches"`:      {"batches": "8"},
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
	o := Options{Batch: 64, SplitCPUs: []int{1, 3}, Threshold: 0, At: steer.SplitAtBridge, QueueSize: 4096}
	back, err := Parse(Defaults(), o.Params())
	if err != nil {
		t.Fatal(err)
	}
	if back.Batch != 64 || !slices.Equal(back.SplitCPUs, o.SplitCPUs) || back.Threshold != 0 || back.At != o.At || back.QueueSize != 4096 {
		t.Errorf("round trip %+v, want %+v", back, o)
	}
}
