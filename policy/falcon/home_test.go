package falcon_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/falcon"
	"github.com/lanesnet/lanes/testbed"
	"golang.org/x/sys/unix"
)

// TestFalconHome: with spread=busy (the default) and an idle IRQ core, the
// agent puts every stage on its at-home fast path once no flow runs
// elsewhere; traffic then crosses on vanilla placement without per-flow
// work (the Home counters grow, nothing is steered), and reset restores
// every knob.
func TestFalconHome(t *testing.T) {
	needsSplit(t)
	online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	before := modetest.Snapshot(t, tb)
	a := apply(t, tb, "falcon", map[string]string{"split": "true"}) // the XDP stage's home too
	dp := a.Open(t)
	src, dst := s.Containers[0], r.Containers[0]
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200) // flow states at "stay"

	_, stopAgent := a.StartAgent(t)
	want := [steer.NumStages]bool{true, true, true}
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, err := dp.Placement().Home()
		if err != nil {
			t.Fatal(err)
		}
		if h == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stages at home after 5 s: %v, want all", h)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st0, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200)
	st1, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for stage := range steer.NumStages {
		d := sub(st1[stage], st0[stage])
		if d.Home == 0 || d.Steered != 0 {
			t.Errorf("%s stage at home: %+v, want frames on the fast path and none steered", steer.StageName(stage), d)
		}
	}
	// No flow queues at home: the bridge stage takes its bare path (no
	// flow lookup), and a stream still arrives complete and in order.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if bare, err := dp.Placement().HomeBare(); err != nil {
			t.Fatal(err)
		} else if bare {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the bridge stage at home did not take its bare path in 5 s")
		}
	}
	flows0, err := dp.Flows()
	if err != nil {
		t.Fatal(err)
	}
	overlaytest.Stream{Count: 2000, Size: 64, Burst: 50, Pause: 200 * time.Microsecond}.
		Delivered(t, "stream on the bare path", true, s.Containers[1].NetNS, r.Containers[1].NetNS, r.Containers[1].Addr.Addr())
	if flows1, err := dp.Flows(); err != nil || len(flows1) != len(flows0) {
		t.Errorf("flow states %d before the stream, %d after (%v): the bare path keeps none", len(flows0), len(flows1), err)
	}
	stopAgent()
	a.ResetAndCheck(t, before)
}

// TestFalconSplitAutoOnVeth: the default falcon on the testbed, whose
// underlay is a veth, attaches no XDP program (split=auto), says so in the
// plan, steers the later stages with the agent running, carries traffic,
// and reset restores every knob.
func TestFalconSplitAutoOnVeth(t *testing.T) {
	online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	before := modetest.Snapshot(t, tb)
	a := apply(t, tb, "falcon", nil)
	if id, _ := attach.Attached(r.NetNS, r.Underlay); id != 0 {
		t.Errorf("XDP program %d on the veth underlay %s with split=auto", id, r.Underlay)
	}
	if notes := strings.Join(a.State.Plan.Notes, "\n"); !strings.Contains(notes, "split=auto: off") {
		t.Errorf("plan notes do not say splitting is off: %q", notes)
	}
	dp := a.Open(t)
	if cm, _ := dp.CPUMap().Entries(); len(cm) != 0 {
		t.Errorf("cpumap entries %v with splitting off", cm)
	}
	_, stopAgent := a.StartAgent(t)
	src, dst := s.Containers[0], r.Containers[0]
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 1000)
	tcpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 1<<20)
	stopAgent()
	a.ResetAndCheck(t, before)
}

// TestFalconLeavesHome: the whole spread=busy cycle under real load, with
// the load read from the scheduler's events and from /proc. With the
// stages at home, a busy loop on the IRQ core makes the agent leave home
// and send the active (flow, stage) pairs to the other core while a
// sequence-numbered stream runs (in order throughout); once the loop stops
// and the traffic ends, every stage comes home again.
// The sched sampler's agent runs its rounds SCHED_BATCH (agent-sched),
// on a thread of their own.
func TestFalconLeavesHome(t *testing.T) {
	for _, sampler := range []string{falcon.SamplerSched, falcon.SamplerProc} {
		t.Run("sampler="+sampler, func(t *testing.T) { leavesHome(t, sampler) })
	}
}

func leavesHome(t *testing.T, sampler string) {
	sched := falcon.AgentNormal
	if sampler == falcon.SamplerSched {
		sched = falcon.AgentBatch
	}
	cpus := online(t)
	if sampler == falcon.SamplerSched {
		s, err := cpuload.NewSchedSampler()
		if err != nil {
			t.Skip("no scheduler accounting on this kernel:", err)
		}
		s.Close()
	}
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	before := modetest.Snapshot(t, tb)
	batchBefore := batchThreads(t)
	a := apply(t, tb, "falcon", map[string]string{"x-sampler": sampler, "x-agent-sched": sched})
	dp := a.Open(t)
	src, dst := s.Containers[0], r.Containers[0]
	// Resolve ARP first: datagrams a sender queues behind resolution are
	// released while newer ones pass them, a reordering of the sender's.
	udpTransfer(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200)
	ag, stopAgent := a.StartAgent(t)
	later := []int{steer.StageBridge, steer.StageContainer}
	waitHome := func(what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			h, err := dp.Placement().Home()
			if err != nil {
				t.Fatal(err)
			}
			if h[steer.StageBridge] && h[steer.StageContainer] {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: stages at home after 10 s: %v, want bridge and container", what, h)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitHome("idle")
	if got := ag.Status().(falcon.AgentStatus).Sampler; got != sampler {
		t.Errorf("agent reads load from %q, want %q", got, sampler)
	}
	if got, want := batchThreads(t)-batchBefore, map[string]int{falcon.AgentNormal: 0, falcon.AgentBatch: 1}[sched]; got != want {
		t.Errorf("x-agent-sched=%s: %d more SCHED_BATCH threads in this process, want %d", sched, got, want)
	}

	irq := tb.Config.IRQCPU
	if irq < 0 || !slices.Contains(cpus, irq) {
		t.Skipf("IRQ core %d is not online (%v)", irq, cpus)
	}
	stopHog := hogCores(t, []int{irq})
	irqIdx := uint32(slices.Index(cpus, irq))
	spread := false
	for try := 0; try < 20 && !spread; try++ {
		overlaytest.Stream{Count: 2000, Size: 200, Burst: 50, Pause: 2 * time.Millisecond, CPU: cpus[0]}.Delivered(t, fmt.Sprintf("stream %d with the IRQ core busy", try), true, src.NetNS, dst.NetNS, dst.Addr.Addr())
		tabs := tables(t, dp)
		h, err := dp.Placement().Home()
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range later {
			for _, v := range tabs[st] {
				if v != steer.Stay && v != irqIdx && !h[st] {
					spread = true
				}
			}
		}
	}
	if !spread {
		t.Fatal("the IRQ core was busy for 20 streams and no bridge or container bucket left it")
	}
	stopHog()
	overlaytest.Stream{Count: 2000, Size: 200, Burst: 50, Pause: 2 * time.Millisecond, CPU: cpus[0]}.Delivered(t, "stream after the busy loop stopped", true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	waitHome("after the load")
	stopAgent()
	// The rounds' thread exits a moment after the agent returns.
	left := batchThreads(t) - batchBefore
	for deadline := time.Now().Add(2 * time.Second); left != 0 && time.Now().Before(deadline); left = batchThreads(t) - batchBefore {
		time.Sleep(10 * time.Millisecond)
	}
	if left != 0 {
		t.Errorf("%d SCHED_BATCH threads left after the agent stopped", left)
	}
	a.ResetAndCheck(t, before)
}

// batchThreads counts this process's threads at SCHED_BATCH.
func batchThreads(t *testing.T) int {
	t.Helper()
	n, err := kthread.ThreadsAt(unix.SCHED_BATCH)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFalconMiceStayHome: with mice set, a light flow stays on the IRQ
// core when its stages leave it, while a heavy flow's move: with the IRQ
// core busy, a stream of about 40 Kpps to one container and one of about
// 200 packets/s to another run together; the heavy one's bridge or
// container stage runs elsewhere at some point, the light one's never
// (unless it shares a hash bucket with the heavy one), both in order.
func TestFalconMiceStayHome(t *testing.T) {
	cpus := online(t)
	tb := upTestbed(t, testbed.Docker)
	r, s := tb.Receiver(), tb.Sender()
	before := modetest.Snapshot(t, tb)
	a := apply(t, tb, "falcon", map[string]string{"mice": "2k"})
	dp := a.Open(t)
	ag, stopAgent := a.StartAgent(t)
	heavyDst, lightDst := r.Containers[0], r.Containers[1]
	irq := tb.Config.IRQCPU
	if irq < 0 || !slices.Contains(cpus, irq) {
		t.Skipf("IRQ core %d is not online (%v)", irq, cpus)
	}
	stopHog := hogCores(t, []int{irq})
	later := map[int]bool{steer.StageBridge: true, steer.StageContainer: true}
	heavyAway, lightAway, mice := false, false, 0
	for try := 0; try < 5 && !heavyAway; try++ {
		lightDone := make(chan overlaytest.StreamResult, 1)
		go func() {
			// Sent from a defer: a t.Fatal in Run ends this goroutine,
			// and the test must not wait for it for ever.
			var res overlaytest.StreamResult
			defer func() { lightDone <- res }()
			res = overlaytest.Stream{Count: 300, Size: 64, Burst: 1, Pause: 5 * time.Millisecond, CPU: cpus[0]}.Run(t, s.Containers[1].NetNS, lightDst.NetNS, lightDst.Addr.Addr())
		}()
		heavy := overlaytest.Stream{Count: 60000, Size: 64, Burst: 50, Pause: time.Millisecond, CPU: cpus[0]}
		heavy.During = func() {
			for end := time.Now().Add(1200 * time.Millisecond); time.Now().Before(end); time.Sleep(40 * time.Millisecond) {
				flows, err := dp.Flows()
				if err != nil {
					t.Error(err)
					return
				}
				heavyBuckets := map[[2]int]bool{}
				for _, f := range flows {
					if later[f.Stage] && f.Dst == heavyDst.Addr.Addr() {
						heavyBuckets[[2]int{f.Stage, f.Bucket}] = true
						heavyAway = heavyAway || f.CPUIndex != steer.Stay
					}
				}
				for _, f := range flows {
					if later[f.Stage] && f.Dst == lightDst.Addr.Addr() && f.CPUIndex != steer.Stay {
						if heavyBuckets[[2]int{f.Stage, f.Bucket}] {
							t.Logf("the light flow shares bucket %d of the %s stage with the heavy one: it moves with it", f.Bucket, steer.StageName(f.Stage))
							continue
						}
						lightAway = true
					}
				}
				mice = max(mice, ag.Status().(falcon.AgentStatus).MiceHome)
			}
		}
		res := heavy.Run(t, s.Containers[0].NetNS, heavyDst.NetNS, heavyDst.Addr.Addr())
		overlaytest.InOrder(t, fmt.Sprintf("heavy stream %d", try), res)
		overlaytest.InOrder(t, fmt.Sprintf("light stream %d", try), <-lightDone)
	}
	stopHog()
	if !heavyAway {
		t.Fatal("the IRQ core was busy for 5 heavy streams and the heavy flow's stages never left it")
	}
	if lightAway {
		t.Error("the light flow's stages left the IRQ core with mice=2k")
	}
	if mice == 0 {
		t.Error("the agent's status never counted a bucket kept at home as a mouse")
	}
	t.Logf("heavy flow away: %v, light flow away: %v, mice kept home (max per round): %d", heavyAway, lightAway, mice)
	stopAgent()
	a.ResetAndCheck(t, before)
}
