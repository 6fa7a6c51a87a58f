package falcon_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/falcon"
	"github.com/lanesnet/lanes/policy/prism"
	"github.com/lanesnet/lanes/testbed"
)

// TestFalconPrism: PRISM-batch composed with Falcon. Both classes get a
// queue on the split core and on the IRQ core; a flow the rule marks takes
// the high-priority one; a sequence-numbered stream arrives in order while
// its class flips (rule added and removed) and the balancer runs; reset
// restores every knob and removes the rules with the pins. With spread=busy
// (the default) the first stage starts in the IRQ core's queues; with
// spread=always on the split core, from where the hogs' fallback brings it
// home: a move between cores while classes flip.
func TestFalconPrism(t *testing.T) {
	for _, spread := range []string{"busy", "always"} {
		// bulk-quiet=0: with no bulk frame but the stream's own while
		// its rule is away, the quiet would keep the marked flow in the
		// NIC poll, and the class changes would move nothing.
		t.Run(spread, func(t *testing.T) { testFalconPrism(t, map[string]string{"spread": spread, "bulk-quiet": "0"}) })
	}
}

func testFalconPrism(t *testing.T, params map[string]string) {
	needsSplit(t)
	cpus := online(t)
	tb := upTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]

	a := apply(t, tb, "falcon-prism", params)
	dp := a.Open(t)
	cfg, err := dp.Config()
	if err != nil || !cfg.Prio {
		t.Fatalf("config %+v (%v): priority classes off", cfg, err)
	}
	for name, get := range map[string]func() ([]int, error){"bulk": dp.CPUMap().Entries, "high-priority": dp.HiCPUMap().Entries} {
		if cm, err := get(); err != nil || !slices.Equal(cm, cpus) {
			t.Errorf("%s cpumap entries %v (%v), want every core %v (split and IRQ)", name, cm, err, cpus)
		}
	}
	set := modetest.Prio(t, r.NetNS)
	rule := modetest.Rule(t, "dst "+dst.Addr.Addr().String()+" udp")
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200)
	// Marked: the flow's frames are classified high.
	if err := set.Add(rule); err != nil {
		t.Fatal(err)
	}
	sa, _ := dp.Stats()
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200)
	sb, _ := dp.Stats()
	if d := sub(sb[steer.StageSplit], sa[steer.StageSplit]); d.High == 0 {
		t.Errorf("rule %v: no frame classified high (%+v)", rule, d)
	}
	if err := set.Del(rule); err != nil {
		t.Fatal(err)
	}
	st0, _ := dp.Stats()

	// The balancer runs, and the rule comes and goes every 5 ms: each
	// change moves the flow's first stage between the classes' queues,
	// which must wait until the old queue drained.
	_, stopAgent := a.StartAgent(t)
	stop := modetest.Every(5*time.Millisecond, func(i int) error {
		if i%2 == 1 {
			return set.Del(rule)
		}
		return set.Add(rule)
	})
	stopHogs := hogEveryCore(t)
	overlaytest.Stream{Count: 20000, Size: 200, Burst: 100, Pause: 2 * time.Millisecond, CPU: 0}.Delivered(t, "stream changing class while the balancer runs", true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	flips, flipErr := stop()
	stopHogs()
	stopAgent()
	if flipErr != nil {
		t.Fatalf("changing the rule: %v", flipErr)
	}
	drained(t, dp)
	st1, _ := dp.Stats()
	d := sub(st1[steer.StageSplit], st0[steer.StageSplit])
	t.Logf("%d rule flips; split stage %+v", flips, d)
	// Bulk frames take the bulk queue, or, at home while the rule is
	// away, the NIC poll (bulk inline): both moves are class changes.
	if d.High == 0 || d.Steered+d.Stayed <= d.High {
		t.Errorf("split stage %+v: want frames in both classes", d)
	}
	if d.Moved == 0 {
		t.Error("no class change happened: the stream proves nothing about them")
	}
	if d.Undrained != 0 {
		t.Errorf("%d class changes gave up waiting for the old queue, with nothing dropped", d.Undrained)
	}
	a.ResetAndCheck(t, before)
	if _, err := control.OpenPrio(r.NetNS); err == nil {
		t.Error("lanes prio still works after reset")
	}
}

// TestFalconPrismHighAuto: falcon-prism takes PRISM's high=auto (its
// parser, its planner step, its switch): the plan names Falcon's balancer
// and PRISM's switch, and with both running a busy marked stream whose
// first stage is at home moves from its real-time queue into the IRQ
// core's NIC poll and arrives in order. bulk-quiet=0, so only the switch
// can run it there.
func TestFalconPrismHighAuto(t *testing.T) {
	needsSplit(t)
	tb := upTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]

	a := apply(t, tb, "falcon-prism", map[string]string{"bulk-quiet": "0"})
	if want := plan.Agents(falcon.AgentName, prism.HighAgentName); a.State.Plan.Agent != want {
		t.Fatalf("plan agent %q, want %q (notes %q)", a.State.Plan.Agent, want, a.State.Plan.Notes)
	}
	dp := a.Open(t)
	cfg, err := dp.Config()
	if err != nil || !cfg.PrioIdleInline || cfg.HighAutoPPS != 5000 || cfg.BulkAuto == 0 || cfg.BulkQuiet != 0 {
		t.Fatalf("config %+v (%v): want PRISM's high=auto and bulk=auto at home, no bulk quiet", cfg, err)
	}
	rule := modetest.Rule(t, "dst "+dst.Addr.Addr().String()+" udp")
	if err := modetest.Prio(t, r.NetNS).Add(rule); err != nil {
		t.Fatal(err)
	}
	ag, stopAgent := a.StartAgent(t)
	st0, _ := dp.Stats()
	// About 50,000 frames/s for most of a second: busy for the switch
	// (5,000) from its third 100 ms sample.
	res := overlaytest.Stream{Count: 40000, Size: 200, Burst: 100, Pause: 2 * time.Millisecond, CPU: 0}.Delivered(t, "busy marked stream under high=auto", true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	st1, _ := dp.Stats()
	b, _ := json.Marshal(ag.Status())
	stopAgent()
	d := sub(st1[steer.StageSplit], st0[steer.StageSplit])
	t.Logf("%d datagrams; split stage %+v; agent %s", res.Received, d, b)
	if d.High == 0 || d.Stayed == 0 || d.Steered == 0 {
		t.Errorf("split stage %+v: want the marked stream in its queue first, then in the NIC poll", d)
	}
	if d.Undrained != 0 {
		t.Errorf("split stage %+v: a move waited out the drain time", d)
	}
	var st struct {
		High struct {
			HighAuto *prism.HighStatus `json:"high_auto"`
		} `json:"prism-high"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.High.HighAuto == nil || st.High.HighAuto.Switches == 0 {
		t.Errorf("agent status %s (%v): want PRISM's switch under prism-high, having switched", b, err)
	}
	// Stopped, the switch put the rule's flows back in their queue.
	if _, inline, err := dp.Prio().HighAuto(); err != nil || len(inline) != 0 {
		t.Errorf("after the agent stopped: rules inline %v (%v), want none", inline, err)
	}
	a.ResetAndCheck(t, before)
}
