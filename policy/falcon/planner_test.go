package falcon

import (
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/lanesnet/lanes/control/baseline" // rps, for the refusal test
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/policy/prism"
	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
)

// needsSplit skips a test whose plans are checked with splitting on: the
// planners switch it off on kernels whose cpumap has no GRO (before 6.15),
// as documented, and these tests would then check a different plan.
func needsSplit(t *testing.T) {
	t.Helper()
	if ok, why := steer.KernelSupport(); !ok {
		t.Skip("splitting is off on this kernel: " + why)
	}
}

// fixture is a receiving host as discovery reports the testbed's: underlay
// NAPI pinned to core 1, a VXLAN device, one container.
func fixture() *topology.Topology { return topotest.Receiver() }

func planFor(t *testing.T, mode string, params map[string]string) (*plan.Plan, error) {
	t.Helper()
	p, err := plan.Lookup(mode)
	if err != nil {
		t.Fatal(err)
	}
	if err := plan.CheckParams(p, params); err != nil {
		return nil, err
	}
	return p.Plan(fixture(), plan.Config{CPUs: []int{0, 1}, Online: []int{0, 1}, Params: params})
}

// kinds counts a plan's changes by knob kind and returns the table values.
func kinds(p *plan.Plan) (map[string]int, map[int]string) {
	n := map[string]int{}
	tables := map[int]string{}
	for _, c := range p.Changes {
		n[c.Knob.Kind()]++
		if tk, ok := c.Knob.(*steer.TableKnob); ok {
			tables[tk.Stage] = string(c.Value)
		}
	}
	return n, tables
}

func TestPlanModes(t *testing.T) {
	needsSplit(t)
	for _, tc := range []struct {
		mode          string
		xdp, tcx, rps int
		tables        []int
		agent         bool
	}{
		// spread=busy (the default): every stage starts where the kernel
		// runs it; the agent spreads them once the IRQ core is busy.
		{"falcon", 1, 3, 2, nil, true},
		{"falcon-pipeline", 0, 3, 2, []int{steer.StageBridge, steer.StageContainer}, false},
		{"falcon-split", 1, 0, 0, []int{steer.StageSplit}, false},
		{"falcon-balance", 0, 3, 2, nil, true},
		// prio: the split stage's table names the IRQ core's queues.
		{"falcon-prism", 1, 3, 2, []int{steer.StageSplit}, true},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			p, err := planFor(t, tc.mode, nil)
			if err != nil {
				t.Fatal(err)
			}
			n, tables := kinds(p)
			if n[attach.KindXDP] != tc.xdp || n[attach.KindTCX] != tc.tcx || n["sysfs"] != tc.rps {
				t.Errorf("xdp %d tcx %d rps %d, want %d %d %d", n[attach.KindXDP], n[attach.KindTCX], n["sysfs"], tc.xdp, tc.tcx, tc.rps)
			}
			if len(tables) != len(tc.tables) {
				t.Errorf("tables %v, want stages %v", tables, tc.tables)
			}
			if (p.Agent != "") != tc.agent {
				t.Errorf("agent %q", p.Agent)
			}
			// bpffs, pin dir and datapath first: restored last.
			if p.Changes[0].Knob.Kind() != attach.KindBPFFS || p.Changes[1].Knob.Kind() != attach.KindPinDir || p.Changes[2].Knob.Kind() != steer.KindDatapath {
				t.Errorf("first changes: %s %s %s", p.Changes[0].Knob.Kind(), p.Changes[1].Knob.Kind(), p.Changes[2].Knob.Kind())
			}
			// Tables last: placement switches on once everything is in.
			if len(tc.tables) > 0 && p.Changes[len(p.Changes)-1].Knob.Kind() != steer.KindTable {
				t.Errorf("last change is %s, want a table", p.Changes[len(p.Changes)-1].Knob.Kind())
			}
			// Attached from the end of the path to its start: each queue's
			// seen-counting program is in before anything counts frames in.
			var order []string
			for _, c := range p.Changes {
				switch k := c.Knob.(type) {
				case *attach.TCX:
					order = append(order, k.Prog[strings.LastIndex(k.Prog, "/")+1:])
				case *attach.XDP:
					order = append(order, k.Prog[strings.LastIndex(k.Prog, "/")+1:])
				}
			}
			want := map[string][]string{
				"falcon":          {steer.PinTCSeen, steer.PinTCEgress, steer.PinTCIngress, steer.PinXDP},
				"falcon-pipeline": {steer.PinTCSeen, steer.PinTCEgress, steer.PinTCIngress},
				"falcon-balance":  {steer.PinTCSeen, steer.PinTCEgress, steer.PinTCIngress},
				"falcon-split":    {steer.PinXDP},
				"falcon-prism":    {steer.PinTCSeen, steer.PinTCEgress, steer.PinTCIngress, steer.PinXDP},
			}[tc.mode]
			if !slices.Equal(order, want) {
				t.Errorf("attach order %v, want %v", order, want)
			}
			for _, c := range p.Changes {
				if c.Knob.Kind() == "sysfs" && string(c.Value) != "3" {
					t.Errorf("%s = %q, want mask 3", c.Target, c.Value)
				}
			}
		})
	}
}

func TestPlanTables(t *testing.T) {
	needsSplit(t)
	p, err := planFor(t, "falcon", map[string]string{"spread": "always"})
	if err != nil {
		t.Fatal(err)
	}
	_, tables := kinds(p)
	// Split core defaults to the set minus the IRQ core (1): core 0, index 0.
	if tables[steer.StageSplit] != "0*256" {
		t.Errorf("split table %q, want all core 0", tables[steer.StageSplit])
	}
	// Falcon's cpus[hash % n]: buckets alternate over the set.
	want := strings.TrimSuffix(strings.Repeat("0,1,", steer.Buckets/2), ",")
	if tables[steer.StageBridge] != want || tables[steer.StageContainer] != want {
		t.Errorf("bridge %q container %q", tables[steer.StageBridge], tables[steer.StageContainer])
	}
	for _, c := range p.Changes {
		if dk, ok := c.Knob.(*steer.DatapathKnob); ok {
			s, err := steer.DecodeSetup(string(c.Value))
			if err != nil {
				t.Fatal(err)
			}
			if dk.Dir != plan.PinDir("h2") || len(s.CPUMap) != 1 || s.CPUMap[0] != 0 || s.Config.VXLANPort != 4789 || len(s.Config.VNIs) != 1 || s.Config.VNIs[0] != 42 {
				t.Errorf("setup %+v in %s", s, dk.Dir)
			}
		}
	}
}

// With spread=busy the hashed tables are the balancer's targets, not
// what apply writes: nothing leaves the IRQ core before it is busy.
func TestPlanSpreadBusy(t *testing.T) {
	p, err := planFor(t, "falcon", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, tables := kinds(p); len(tables) != 0 {
		t.Errorf("tables %v, want none written (all stay)", tables)
	}
	o, err := OptionsFor("falcon", nil)
	if err != nil {
		t.Fatal(err)
	}
	lay := Layout{CPUs: []int{0, 1}, Set: []int{0, 1}, SplitCPUs: []int{0}, IRQCPUs: []int{1}}
	init, static := InitialTables(o, lay), StaticTables(o, lay)
	for s := range steer.NumStages {
		if !allStay(init[s]) {
			t.Errorf("stage %d starts %v, want all stay", s, init[s][:4])
		}
		if allStay(static[s]) {
			t.Errorf("stage %d: no hashed placement for the balancer", s)
		}
	}
	if st := HomeFirstStages(o); len(st) != 3 {
		t.Errorf("home-first stages %v, want all three", st)
	}
	// With prio the split stage's home is the IRQ core's queues (index 1).
	o.Prio = true
	if init := InitialTables(o, lay); init[steer.StageSplit] != allOf(1) || !allStay(init[steer.StageBridge]) {
		t.Errorf("prio: split stage starts %v, bridge %v", init[steer.StageSplit][:4], init[steer.StageBridge][:4])
	}
	if st := HomeFirstStages(o); len(st) != 3 {
		t.Errorf("prio: home-first stages %v, want all three", st)
	}
	lay.IRQCPUs = nil // no home known: the split stage keeps its static table
	if init := InitialTables(o, lay); init[steer.StageSplit] != static[steer.StageSplit] {
		t.Errorf("prio, IRQ core unknown: split stage starts %v", init[steer.StageSplit][:4])
	}
	o.Prio = false
	o.Balance = false // without the balancer nobody would spread them
	if st := HomeFirstStages(o); st != nil {
		t.Errorf("home-first stages without balance: %v", st)
	}
}

func TestPlanSplitCPUsAndIRQUnknown(t *testing.T) {
	needsSplit(t)
	p, err := planFor(t, "falcon-split", map[string]string{"split-cpus": "1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, tables := kinds(p); tables[steer.StageSplit] != "1*256" {
		t.Errorf("split table %q, want index of core 1", tables[steer.StageSplit])
	}
	top := fixture()
	top.Underlays[0].NAPIThreads = nil
	pl, _ := plan.Lookup("falcon")
	p, err = pl.Plan(top, plan.Config{CPUs: []int{0, 1}, Online: []int{0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(p.Notes, "\n"), "IRQ core is unknown") {
		t.Errorf("notes %v: want the unknown IRQ core said", p.Notes)
	}
}

func TestPlanBadParams(t *testing.T) {
	for params, want := range map[string]map[string]string{
		"percentage":       {"threshold": "abc"},
		"has no setting":   {"treshold": "70"},
		"below the thresh": {"threshold": "50", "hysteresis": "60"},
		"not online":       {"split-cpus": "7"},
		"want rx or busy":  {"load": "idle"},
		"does nothing":     {"pipeline": "false", "split": "false", "balance": "false"},
		"duration":         {"interval": "fast"},
		"above rt":         {"prio": "true", "rt": "60", "prio-rt": "53"},
		"from 1 to 99":     {"prio": "true", "high-rt": "0"},
		"and prio is off":  {"high": "auto"},
		"no queue for the": {"prio": "true", "bulk": "inline"},
		"at most the thr":  {"home-room": "90"},
		"want normal or":   {"x-agent-sched": "fifo"},
		"split=rps with p": {"split": "rps", "prio": "true"},
		"split=rps with s": {"split": "rps", "spread": "busy"},
		"auto or rps":      {"split": "maybe"},
		"packets per seco": {"mice": "lots"},
		"use spread=busy":  {"mice": "10k", "spread": "always"},
		"or use spread=bu": {"mice": "10k", "balance": "false"},
	} {
		_, err := planFor(t, "falcon", want)
		if err == nil || !strings.Contains(err.Error(), params) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want one line with %q", want, err, params)
		}
	}
	if err := plan.CheckParams(mustLookup(t, "rps"), map[string]string{"threshold": "70"}); err == nil || !strings.Contains(err.Error(), "takes no settings") {
		t.Errorf("rps with a falcon setting: %v", err)
	}
}

func mustLookup(t *testing.T, m string) plan.Planner {
	p, err := plan.Lookup(m)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParamsRoundTrip(t *testing.T) {
	o := Defaults()
	o.SplitCPUs = []int{0}
	o.Threshold = 70
	o.Mice = 10000
	back, err := Parse(Options{}, o.Params())
	if err != nil {
		t.Fatal(err)
	}
	if back.Threshold != 70 || back.Interval != o.Interval || back.Flowlet != o.Flowlet || len(back.SplitCPUs) != 1 || !back.Split || back.Load != "busy" || back.Spread != SpreadBusy || back.QueueSize != o.QueueSize || back.Mice != 10000 {
		t.Errorf("round trip: %+v", back)
	}
}

// PRISM-batch on Falcon: both classes get a queue on the split core and
// on the IRQ core, the high one real-time. With spread=busy (the default)
// the split table starts every bucket at home, in the IRQ core's queues;
// with spread=always, on the split core.
func TestPlanPrio(t *testing.T) {
	needsSplit(t)
	setupOf := func(p *plan.Plan) (steer.Setup, map[int]string) {
		t.Helper()
		_, tables := kinds(p)
		for _, c := range p.Changes {
			if _, ok := c.Knob.(*steer.DatapathKnob); ok {
				s, err := steer.DecodeSetup(string(c.Value))
				if err != nil {
					t.Fatal(err)
				}
				return s, tables
			}
		}
		t.Fatal("no datapath in the plan")
		return steer.Setup{}, nil
	}
	p, err := planFor(t, "falcon-prism", nil)
	if err != nil {
		t.Fatal(err)
	}
	s, tables := setupOf(p)
	if !s.Config.Prio || !s.Config.CountSplit || !slices.Equal(s.CPUMap, []int{0, 1}) || !slices.Equal(s.HiCPUMap, []int{0, 1}) || s.HiRTPriority != 53 || s.RTPriority != 0 {
		t.Errorf("setup %+v", s)
	}
	if tables[steer.StageSplit] != "1*256" {
		t.Errorf("split table %q, want all at home, the IRQ core 1's queues", tables[steer.StageSplit])
	}
	// PRISM's bulk placement: bulk at home runs in the IRQ core's NIC
	// poll while no flow is marked.
	if !s.Config.PrioIdleInline || s.Config.InlineCPU != 1 {
		t.Errorf("setup %+v, want bulk inline while idle on the IRQ core 1", s.Config)
	}
	if !slices.ContainsFunc(p.Notes, func(n string) bool { return strings.Contains(n, "core 1's NIC poll") }) {
		t.Errorf("notes %q do not say where bulk runs while no flow is marked", p.Notes)
	}
	// PRISM's own step at home: high=auto, bulk=auto and bulk-quiet at
	// their defaults, with PRISM's switch beside the balancer.
	if s.Config.HighAutoPPS != 5000 || s.Config.BulkAuto != prism.BulkAutoWindow || s.Config.BulkQuiet != 20*time.Millisecond {
		t.Errorf("setup %+v, want PRISM's high=auto, bulk=auto and bulk-quiet at their defaults", s.Config)
	}
	if want := plan.Agents(AgentName, prism.HighAgentName); p.Agent != want {
		t.Errorf("agent %q, want %q", p.Agent, want)
	}
	p, err = planFor(t, "falcon-prism", map[string]string{"x-bulk-inline": "false"})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := setupOf(p); s.Config.PrioIdleInline || s.Config.HighAutoPPS != 0 || s.Config.BulkAuto != 0 || p.Agent != AgentName {
		t.Errorf("x-bulk-inline=false: setup %+v, agent %q, want both classes in their queues and the balancer alone", s.Config, p.Agent)
	}
	if !slices.ContainsFunc(p.Notes, func(n string) bool { return strings.Contains(n, "keeps its queue (high=queue)") }) {
		t.Errorf("x-bulk-inline=false: notes %q do not say high=auto fell back", p.Notes)
	}
	// Given where it cannot run: an error, nothing planned.
	if _, err := planFor(t, "falcon-prism", map[string]string{"x-bulk-inline": "false", "high": "auto"}); err == nil || !strings.Contains(err.Error(), "use high=queue,") {
		t.Errorf("high=auto without the fast move: %v", err)
	}
	p, err = planFor(t, "falcon-prism", map[string]string{"high": "queue", "high-rt": "60"})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := setupOf(p); s.Config.HighAutoPPS != 0 || s.Config.BulkAuto != 0 || s.HiRTPriority != 60 || !s.Config.PrioIdleInline || p.Agent != AgentName {
		t.Errorf("high=queue high-rt=60: setup %+v, agent %q", s, p.Agent)
	}
	p, err = planFor(t, "falcon-prism", map[string]string{"spread": "always"})
	if err != nil {
		t.Fatal(err)
	}
	if _, tables = setupOf(p); tables[steer.StageSplit] != "0*256" {
		t.Errorf("spread=always: split table %q, want all on the split core 0", tables[steer.StageSplit])
	}
	// Without splitting the first stage stays on the IRQ core, in two
	// queues; tc ingress only counts them out.
	p, err = planFor(t, "falcon-pipeline", map[string]string{"prio": "true"})
	if err != nil {
		t.Fatal(err)
	}
	s, tables = setupOf(p)
	if !s.Config.Prio || !slices.Equal(s.HiCPUMap, []int{1}) || tables[steer.StageSplit] != "1*256" {
		t.Errorf("pipeline+prio: setup %+v, split table %q", s, tables[steer.StageSplit])
	}
	// Split alone steers no later stage: a program that only counts the
	// first stage's frames out.
	p, err = planFor(t, "falcon-split", map[string]string{"prio": "true"})
	if err != nil {
		t.Fatal(err)
	}
	var progs []string
	for _, c := range p.Changes {
		switch k := c.Knob.(type) {
		case *attach.TCX:
			progs = append(progs, k.Prog[strings.LastIndex(k.Prog, "/")+1:])
		case *attach.XDP:
			progs = append(progs, k.Prog[strings.LastIndex(k.Prog, "/")+1:])
		}
	}
	if !slices.Equal(progs, []string{steer.PinTCSplitSeen, steer.PinXDP}) {
		t.Errorf("split+prio programs %v", progs)
	}
	// Plain falcon has no classes.
	p, err = planFor(t, "falcon", nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := setupOf(p); s.Config.Prio || len(s.HiCPUMap) != 0 {
		t.Errorf("falcon without prio: %+v", s)
	}
}

// TestPlanSplitAuto: split=auto (the default) leaves the XDP hook off on a
// veth underlay, says so, and keeps it where the underlay is a NIC;
// split=true and falcon-split force it; nothing left is refused.
func TestPlanSplitAuto(t *testing.T) {
	needsSplit(t)
	planOn := func(typ, mode string, params map[string]string) (*plan.Plan, error) {
		t.Helper()
		p, err := plan.Lookup(mode)
		if err != nil {
			t.Fatal(err)
		}
		top := fixture()
		top.Underlays[0].Type = typ
		return p.Plan(top, plan.Config{CPUs: []int{0, 1}, Online: []int{0, 1}, Params: params})
	}
	hasXDP := func(p *plan.Plan) bool {
		for _, c := range p.Changes {
			if _, ok := c.Knob.(*attach.XDP); ok {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		typ, mode string
		params    map[string]string
		xdp       bool
	}{
		{"veth", "falcon", nil, false},
		{"veth", "falcon", map[string]string{"split": "auto"}, false},
		{"veth", "falcon", map[string]string{"split": "true"}, true},
		{"veth", "falcon-split", nil, true},
		{"veth", "falcon-prism", nil, true}, // prio: XDP classifies anyway, so auto splits
		{"device", "falcon", nil, true},
		{"device", "falcon", map[string]string{"split": "false"}, false},
	} {
		p, err := planOn(c.typ, c.mode, c.params)
		if err != nil {
			t.Fatalf("%s %s %v: %v", c.typ, c.mode, c.params, err)
		}
		if got := hasXDP(p); got != c.xdp {
			t.Errorf("%s underlay, %s %v: XDP attached %v, want %v", c.typ, c.mode, c.params, got, c.xdp)
		}
		noted := strings.Contains(strings.Join(p.Notes, "\n"), "split=auto: off, the underlay ul2 is a veth")
		if want := c.typ == "veth" && (c.params["split"] == "" || c.params["split"] == "auto") && c.mode == "falcon"; noted != want {
			t.Errorf("%s underlay, %s %v: split=auto note %v, want %v (notes %q)", c.typ, c.mode, c.params, noted, want, p.Notes)
		}
	}
	_, err := planOn("veth", "falcon", map[string]string{"pipeline": "false", "balance": "false"})
	if err == nil || !strings.Contains(err.Error(), "give split=true") || strings.Contains(err.Error(), "\n") {
		t.Errorf("falcon with only split=auto on a veth: %v, want a one-line refusal naming split=true", err)
	}
	if o, err := OptionsFor("falcon", map[string]string{"split": "maybe"}); err == nil {
		t.Errorf("split=maybe accepted: %+v", o)
	} else if !strings.Contains(err.Error(), "want true, false, auto or rps") {
		t.Errorf("split=maybe: %v", err)
	}
}

// TestPlanTurnsRFSOff: where RFS is on for a queue whose RPS lanes sets,
// the plan turns it off (journaled): RFS would send a flow to its
// application's core, not the one the hash names, and the order-keeping
// counts follow the hash's core. Queues without RFS get no such change.
func TestPlanTurnsRFSOff(t *testing.T) {
	top := fixture()
	top.VXLANs[0].RxQueues = []topology.RxQueue{{Index: 0, RPSFlowCnt: 256}}
	p, err := plan.Lookup("falcon")
	if err != nil {
		t.Fatal(err)
	}
	pl, err := p.Plan(top, plan.Config{CPUs: []int{0, 1}, Online: []int{0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	var flowCnt []string
	for _, c := range pl.Changes {
		if f, ok := c.Knob.(*knobs.SysfsFile); ok && strings.HasSuffix(f.Path, "/rps_flow_cnt") {
			flowCnt = append(flowCnt, f.NetNS+":"+f.Path+"="+string(c.Value))
		}
	}
	if want := []string{"h2:/sys/class/net/vxlan0/queues/rx-0/rps_flow_cnt=0"}; !slices.Equal(flowCnt, want) {
		t.Errorf("rps_flow_cnt changes %v, want %v", flowCnt, want)
	}
}

// split=rps: RPS on every underlay queue to the split cores (the set
// minus the IRQ core), no XDP hook, no split-stage table; the setting
// survives the state file's round trip.
func TestPlanSplitRPS(t *testing.T) {
	for _, mode := range []string{"falcon", "falcon-split"} {
		p, err := planFor(t, mode, map[string]string{"split": "rps"})
		if err != nil {
			t.Fatal(err)
		}
		n, tables := kinds(p)
		if n[attach.KindXDP] != 0 {
			t.Errorf("%s split=rps: %d XDP attachments, want none", mode, n[attach.KindXDP])
		}
		if _, ok := tables[steer.StageSplit]; ok {
			t.Errorf("%s split=rps: a split-stage table %q", mode, tables[steer.StageSplit])
		}
		found := false
		for _, c := range p.Changes {
			if c.Target == "h2/ul2 rx-0" {
				found = true
				if string(c.Value) != "1" {
					t.Errorf("%s split=rps: %s = %q, want mask 1 (core 0, off the IRQ core)", mode, c.Target, c.Value)
				}
			}
		}
		if !found {
			t.Errorf("%s split=rps: no RPS map on the underlay: %v", mode, p.Changes)
		}
		if !strings.Contains(strings.Join(p.Notes, "\n"), "split=rps: the NIC poll allocates each skb") {
			t.Errorf("%s split=rps: no note saying what it does: %q", mode, p.Notes)
		}
	}
	o, err := Parse(Defaults(), map[string]string{"split": "rps"})
	if err != nil {
		t.Fatal(err)
	}
	if o.Spread != SpreadAlways {
		t.Errorf("split=rps: spread %q, want %q (the later stages start on the split core)", o.Spread, SpreadAlways)
	}
	back, err := Parse(Options{}, o.Params())
	if err != nil || !back.SplitRPS || back.Split || back.SplitAuto || back.Spread != SpreadAlways {
		t.Errorf("split=rps round trip: %+v (%v)", back, err)
	}
	// Split cores outside the set are in the datapath's core list: tc
	// ingress runs there and must find its own core.
	params := map[string]string{"split": "rps", "split-cpus": "0"}
	p, err := mustLookup(t, "falcon").Plan(fixture(), plan.Config{CPUs: []int{1}, Online: []int{0, 1}, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Changes {
		if c.Knob.Kind() != steer.KindDatapath {
			continue
		}
		s, err := steer.DecodeSetup(string(c.Value))
		if err != nil || !slices.Contains(s.Config.CPUs, 0) {
			t.Errorf("datapath cores %v (%v): want split core 0 among them", s.Config.CPUs, err)
		}
	}
}

// Where lanes cannot read the underlay's IRQ core (a veth without
// threaded NAPI polls on its sender's core), falcon at its defaults
// (spread=busy) could never see the IRQ core busy: it leaves the path as
// vanilla's, no change and no agent, and says so; told the core, or
// spread=always, it steers.
func TestPlanIRQUnknownLeavesPathAlone(t *testing.T) {
	top := fixture()
	top.Underlays[0].NAPIThreads = nil
	pl, _ := plan.Lookup("falcon")
	cfg := plan.Config{CPUs: []int{0, 1}, Online: []int{0, 1}}
	p, err := pl.Plan(top, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Changes) != 0 || p.Agent != "" {
		t.Errorf("falcon with the IRQ core unknown: %d changes, agent %q; want none", len(p.Changes), p.Agent)
	}
	if notes := strings.Join(p.Notes, "\n"); !strings.Contains(notes, "IRQ core is unknown") || !strings.Contains(notes, "vanilla's") {
		t.Errorf("notes %v: want the unknown IRQ core and vanilla's path said", p.Notes)
	}
	for _, params := range []map[string]string{{"irq-cpus": "1"}, {"spread": "always"}} {
		cfg.Params = params
		p, err := pl.Plan(top, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Changes) == 0 {
			t.Errorf("falcon %v with the IRQ core unknown: no changes, want it to steer", params)
		}
	}
}

// x-fast=true runs the fast path beside Falcon: its programs come first on
// every hook the two share (the fast path sees each frame first), under
// link pins of their own, its agent runs beside the balancer, and the
// datapath is loaded with it. Where the fast path would start at the
// VXLAN device (its underlay in another namespace), past Falcon's bridge
// stage, the plan is refused.
func TestPlanFast(t *testing.T) {
	p, err := planFor(t, "falcon", map[string]string{"x-fast": "true"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Agent != plan.Agents(AgentName, "fast") {
		t.Errorf("agent %q, want the balancer and the fast path's", p.Agent)
	}
	hooks := map[string][]string{} // device and direction: programs in attach order
	links := map[string]bool{}
	for _, c := range p.Changes {
		switch k := c.Knob.(type) {
		case *steer.DatapathKnob:
			s, err := steer.DecodeSetup(string(c.Value))
			if err != nil || !s.Config.Fast || !s.Config.FastBeside || s.Config.FastIdle == 0 {
				t.Errorf("datapath %+v, %v: want the fast path on, beside Falcon", s.Config, err)
			}
		case *attach.TCX:
			h := k.NetNS + "/" + k.Device + " " + k.Direction
			hooks[h] = append(hooks[h], k.Prog[strings.LastIndex(k.Prog, "/")+1:])
			if links[k.Link] {
				t.Errorf("link pin %s used twice", k.Link)
			}
			links[k.Link] = true
		}
	}
	for h, want := range map[string][]string{
		"h2/ul2 ingress":     {steer.PinTCFast, steer.PinTCIngress},
		"h2/veth1 egress":    {steer.PinTCFastLearn, steer.PinTCEgress},
		"h2-c1/eth0 ingress": {steer.PinTCFastSeen, steer.PinTCSeen},
	} {
		if got := hooks[h]; !slices.Equal(got, want) {
			t.Errorf("%s: programs %v, want %v", h, got, want)
		}
	}

	topo := fixture()
	topo.VXLANs[0].UnderlayNetNS = "host"
	p2, err := plan.Lookup("falcon")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Plan(topo, plan.Config{CPUs: []int{0, 1}, Online: []int{0, 1}, Params: map[string]string{"x-fast": "true"}}); err == nil || !strings.Contains(err.Error(), "use --mode fast there") {
		t.Errorf("x-fast=true with the underlay in another namespace: %v, want a refusal", err)
	}
}
