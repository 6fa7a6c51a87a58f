package falcon_test

import (
	"slices"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/modetest"
	"github.com/lanesnet/lanes/internal/overlaytest"
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
		t.Run(spread, func(t *testing.T) { testFalconPrism(t, map[string]string{"spread": spread}) })
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
