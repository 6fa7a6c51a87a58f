package prism_test

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/prism"
	"github.com/lanesnet/lanes/testbed"
	"github.com/lanesnet/lanes/topology"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { modetest.Main(m, "tp") }

// TestPrismBatch applies prism-batch to the docker testbed's receiver and
// checks, with real traffic, that a flow a rule marks takes the
// high-priority queue while others take the bulk one, that rules change at
// runtime, that the receive kthreads get the ladder, and that reset
// restores every knob byte for byte.
func TestPrismBatch(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]

	// The ladder, checked below; bulk-quiet=0: the marked datagrams below
	// come with no bulk beside them, and would otherwise run in the NIC
	// poll (TestPrismBulkQuiet), not in the queue this test is about.
	a := modetest.Apply(t, tb, "prism-batch", map[string]string{"streamline": "true", "bulk-quiet": "0"})
	dp := a.Open(t)
	for name, get := range map[string]func() ([]int, error){"bulk": dp.CPUMap().Entries, "high-priority": dp.HiCPUMap().Entries} {
		if cm, err := get(); err != nil || len(cm) != 1 || cm[0] != 1 {
			t.Errorf("%s cpumap entries %v (%v), want the IRQ core [1]", name, cm, err)
		}
	}
	cfg, err := dp.Config()
	if err != nil || !cfg.Prio {
		t.Fatalf("config %+v (%v): priority classes off", cfg, err)
	}

	// The ladder on the receiver's NAPI threads.
	topo, err := topology.Discover(r.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	lad := func(d *topology.Device, want int) {
		t.Helper()
		for _, th := range d.NAPIThreads {
			checked++
			b, err := knobs.Sched(th.Comm, th.Index).Read()
			if err != nil {
				t.Fatal(err)
			}
			if w := fmt.Sprintf("policy=fifo prio=%d nice=0", want); string(b) != w {
				t.Errorf("%s %s: %q, want %q", d.Name, th.Comm, b, w)
			}
		}
	}
	lad(&topo.Underlays[0], 50)
	lad(&topo.VXLANs[0].Device, 51)
	lad(&topo.Containers[0].Interfaces[0].Device, 52)
	// The testbed threads the underlay's NAPI only; the other stages run
	// in softirq, which the plan says in a note.
	if len(topo.Underlays[0].NAPIThreads) == 0 || checked == 0 {
		t.Errorf("no NAPI thread checked (underlay threads %v)", topo.Underlays[0].NAPIThreads)
	}

	// lanes prio: a UDP port of the destination container is high priority.
	set := modetest.Prio(t, r.NetNS)
	hiPort := uint16(0) // filled once the stream's port is known
	st0, _ := dp.Stats()
	overlaytest.UDPMost(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200)
	st1, _ := dp.Stats()
	if st1[steer.StageSplit].High != st0[steer.StageSplit].High {
		t.Errorf("frames classified high with no rule: %+v", st1[steer.StageSplit])
	}
	// No rule yet: nothing to preempt for, so bulk keeps the NIC poll
	// (PrioIdleInline).
	if d := st1[steer.StageSplit].Steered - st0[steer.StageSplit].Steered; d != 0 {
		t.Errorf("%d frames took the bulk queue with no rule: %+v", d, st1[steer.StageSplit])
	}
	if st1[steer.StageSplit].Stayed == st0[steer.StageSplit].Stayed {
		t.Errorf("no frame stayed in the NIC poll with no rule: %+v", st1[steer.StageSplit])
	}
	if !cfg.PrioIdleInline {
		t.Error("prism-batch without bulk=inline: PrioIdleInline off")
	}

	rule := modetest.Rule(t, "dst "+dst.Addr.Addr().String()+" udp")
	if err := set.Add(rule); err != nil {
		t.Fatal(err)
	}
	if rules, err := set.List(); err != nil || len(rules) != 1 || rules[0] != rule {
		t.Errorf("rules %v (%v), want [%v]", rules, err, rule)
	}
	res := overlaytest.UDPMost(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200)
	st2, _ := dp.Stats()
	if d := st2[steer.StageSplit].High - st1[steer.StageSplit].High; d < uint64(res) {
		t.Errorf("%d frames classified high, %d datagrams arrived", d, res)
	}
	flows, err := dp.Flows()
	if err != nil {
		t.Fatal(err)
	}
	high := 0
	for _, f := range flows {
		if f.Stage == steer.StageSplit && f.High {
			high++
			if f.Dst != dst.Addr.Addr() || f.Proto != 17 {
				t.Errorf("flow %v:%d -> %v:%d proto %d is high priority, the rule says UDP to %v", f.Src, f.SrcPort, f.Dst, f.DstPort, f.Proto, dst.Addr.Addr())
			}
			hiPort = f.DstPort
		}
	}
	if high == 0 {
		t.Error("no flow in the high-priority queue after the rule was added")
	}
	// TCP to the same address is not matched by a UDP rule: bulk, in
	// the bulk queue now that a rule exists.
	st3, _ := dp.Stats()
	overlaytest.TCP(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 1<<20)
	if st4, _ := dp.Stats(); st4[steer.StageSplit].Steered == st3[steer.StageSplit].Steered {
		t.Errorf("no frame took the bulk queue with a rule in place: %+v", st4[steer.StageSplit])
	}
	flows, _ = dp.Flows()
	for _, f := range flows {
		if f.Proto == 6 && f.High {
			t.Errorf("TCP flow %v:%d -> %v:%d classified high by a UDP rule", f.Src, f.SrcPort, f.Dst, f.DstPort)
		}
	}
	// Every frame XDP counted into a queue was counted out of it by
	// steer_tc_split_seen (XDP metadata reached the skb), and no class
	// change had to give up waiting for a queue.
	var left []steer.Flow
	for range 50 {
		flows, _ = dp.Flows()
		left = left[:0]
		for _, f := range flows {
			if f.InFlight != 0 {
				left = append(left, f)
			}
		}
		if len(left) == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("frames still counted in flight after the traffic: %+v", left)
	}
	if st, _ := dp.Stats(); st[steer.StageSplit].Undrained != 0 {
		t.Errorf("split stage: %d undrained moves", st[steer.StageSplit].Undrained)
	}
	if err := set.Del(rule); err != nil {
		t.Fatal(err)
	}
	t.Logf("high-priority flows seen: %d (last port %d)", high, hiPort)

	// The set survives the process that changed it: reopen it.
	if err := set.Add(rule); err != nil {
		t.Fatal(err)
	}
	set2, err := control.OpenPrio(r.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	if rules, _ := set2.List(); len(rules) != 1 {
		t.Errorf("reopened set has %v", rules)
	}
	set2.Close()

	a.ResetAndCheck(t, before)
	if _, err := control.OpenPrio(r.NetNS); err == nil || !strings.Contains(err.Error(), "lanes apply --mode prism") {
		t.Errorf("prio after reset: %v, want an error saying to apply prism", err)
	}
}

// TestPrismIdleInline: while no rule exists bulk keeps the NIC poll, and
// with a rule it takes the bulk queue. A bulk stream with no idle gap long
// enough for the flowlet rule (1 ms) moves between the two while a rule
// for another address comes and goes every 3 ms, and still arrives in
// order: it moves only once none of its frames is left in the NIC poll's
// GRO or the queue.
func TestPrismIdleInline(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	a := modetest.Apply(t, tb, "prism-batch", nil)
	dp := a.Open(t)
	set := modetest.Prio(t, r.NetNS)
	other := modetest.Rule(t, "dst 198.19.0.99 udp")

	flipDuring(t, dp, src, dst, "bulk stream while a rule comes and goes", "rule changes", false, func(i int) error {
		if i%2 == 1 {
			return set.Del(other)
		}
		return set.Add(other)
	})
	a.ResetAndCheck(t, before)
}

// flipDuring sends a sequence-numbered stream from src to dst while flip
// runs every 3 ms, checks it arrived in order, and that the split stage
// took both paths and moved between them (tookBothPaths).
func flipDuring(t *testing.T, dp *steer.Datapath, src, dst testbed.Container, what, flips string, high bool, flip func(i int) error) (split steer.Counters) {
	t.Helper()
	st0, _ := dp.Stats()
	stop := modetest.Every(3*time.Millisecond, flip)
	overlaytest.Stream{Count: 20000, Size: 200, Burst: 50, Pause: 200 * time.Microsecond, CPU: 0}.Delivered(t, what, true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	n, err := stop()
	if err != nil {
		t.Fatalf("%s: %v", flips, err)
	}
	st1, _ := dp.Stats()
	tookBothPaths(t, fmt.Sprintf("%d %s", n, flips), st0[steer.StageSplit], st1[steer.StageSplit], high)
	return st1[steer.StageSplit].Sub(st0[steer.StageSplit])
}

// tookBothPaths logs what the split stage did between two readings of its
// counters and fails t unless bulk took both the NIC poll and the bulk
// queue and moved between them (and, with high, marked frames were seen).
func tookBothPaths(t *testing.T, what string, d0, d steer.Counters, high bool) {
	t.Helper()
	t.Logf("%s; split stage: high %d, steered %d, stayed %d, moved %d, held %d, undrained %d", what,
		d.High-d0.High, d.Steered-d0.Steered, d.Stayed-d0.Stayed, d.Moved-d0.Moved, d.Held-d0.Held, d.Undrained-d0.Undrained)
	if d.Steered == d0.Steered || d.Stayed == d0.Stayed || d.Moved == d0.Moved || (high && d.High == d0.High) {
		t.Errorf("bulk did not take both paths and move between them, or no marked frame was seen: %+v", d)
	}
}

// quietBed is the quiet tests' setup: prism-batch with quiet=5ms (and
// params) applied to a testbed, and a marked UDP flow (a rule for its
// port) from the sender's first container to the receiver's. Reset and
// the check that every knob came back run at the test's end.
type quietBed struct {
	a        *modetest.Applied
	dp       *steer.Datapath
	rc, sc   *net.UDPConn
	src, dst testbed.Container
}

func newQuietBed(t *testing.T, params map[string]string) *quietBed {
	t.Helper()
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	r, s := tb.Receiver(), tb.Sender()
	q := &quietBed{src: s.Containers[0], dst: r.Containers[0]}
	p := map[string]string{"quiet": "5ms"}
	maps.Copy(p, params)
	q.a = modetest.Apply(t, tb, "prism-batch", p)
	t.Cleanup(func() { q.a.ResetAndCheck(t, before) })
	q.dp = q.a.Open(t)
	q.rc, q.sc = overlaytest.UDPPair(t, q.src.NetNS, q.dst.NetNS, q.dst.Addr.Addr(), 0)
	t.Cleanup(func() { q.rc.Close(); q.sc.Close() })
	port := q.rc.LocalAddr().(*net.UDPAddr).Port
	if err := modetest.Prio(t, r.NetNS).Add(modetest.Rule(t, fmt.Sprintf("dst %s port %d udp", q.dst.Addr.Addr(), port))); err != nil {
		t.Fatal(err)
	}
	return q
}

// warmUp sends one marked datagram and waits for it: until the
// neighbours on the path are resolved, the kernel may send a stream's
// first datagrams out of order (what it queued while resolving, behind
// what came after), whatever lanes does.
func (q *quietBed) warmUp(t *testing.T) {
	t.Helper()
	q.rc.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := q.sc.Write([]byte("warm-up")); err != nil {
		t.Fatal(err)
	}
	if _, err := q.rc.Read(make([]byte, 64)); err != nil {
		t.Fatalf("warm-up datagram: %v", err)
	}
}

// marks sends a marked datagram each time the class would have gone
// quiet (5 ms after the last one, plus two ticks of the coarse clock: 13
// ms at HZ=250), 12 ms after, until the returned stop.
func (q *quietBed) marks() (stop func() (int, error)) {
	return modetest.Every(steer.QuietAfter(5*time.Millisecond)+12*time.Millisecond, func(int) error {
		_, err := q.sc.Write([]byte("marked"))
		return err
	})
}

// TestPrismQuiet: with quiet set, a bulk stream moves between the NIC
// poll and the bulk queue as a marked flow sends now and then (quiet 5 ms
// after its last frame, plus two ticks of the coarse clock: 13 ms at
// HZ=250; one frame 12 ms after that), and arrives in order; the
// marked datagrams arrive too, and status says whether the class is quiet.
func TestPrismQuiet(t *testing.T) {
	q := newQuietBed(t, nil)
	a, dp, rc, src, dst := q.a, q.dp, q.rc, q.src, q.dst
	if cfg, err := dp.Config(); err != nil || cfg.PrioQuiet != 5*time.Millisecond {
		t.Fatalf("config %+v (%v), want a 5ms quiet time", cfg, err)
	}
	status := func() *control.StatusReport {
		t.Helper()
		st, err := control.Status(control.StatusOptions{NetNS: a.NS, StateDir: a.StateDir, Sample: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := status(); st.Steering == nil || !st.Steering.Quiet || st.Steering.SinceHighMs != nil {
		t.Errorf("before any marked frame: status %+v, want quiet with none seen", st.Steering)
	}

	q.warmUp(t)

	// A vCPU stalled for a few milliseconds overflows a ring before
	// anything classifies a frame, marked or not: a round that lost
	// datagrams runs again with the bulk at a fifth of the rate, twice at
	// most, as overlaytest.Stream.Delivered does. A loss that stays at a
	// gentle rate is the datapath's; order is judged on every round.
	const bulk = "bulk stream while a marked flow comes and goes"
	for try, pause := 0, 200*time.Microsecond; ; try, pause = try+1, pause*5 {
		st0, _ := dp.Stats()
		stop := q.marks()
		res := overlaytest.Stream{Count: 20000, Size: 200, Burst: 50, Pause: pause, CPU: 0}.Run(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
		sent, sendErr := stop()
		if sendErr != nil {
			t.Fatalf("sending marked datagrams: %v", sendErr)
		}
		st1, _ := dp.Stats()
		got := 0
		rc.SetReadDeadline(time.Now().Add(time.Second))
		for buf := make([]byte, 64); got < sent; got++ {
			if _, err := rc.Read(buf); err != nil {
				break
			}
		}
		if res.Reordered != 0 || try == 2 || (got == sent && res.Received == res.Sent) {
			overlaytest.InOrder(t, bulk, res)
			tookBothPaths(t, fmt.Sprintf("%d marked datagrams", sent), st0[steer.StageSplit], st1[steer.StageSplit], true)
			if got < sent {
				t.Errorf("%d of %d marked datagrams arrived", got, sent)
			}
			break
		}
		t.Logf("%s: %d of %d bulk and %d of %d marked datagrams arrived, none out of order: again with the bulk at a fifth of the rate", bulk, res.Received, res.Sent, got, sent)
	}
	if st := status(); st.Steering == nil || st.Steering.SinceHighMs == nil || st.Steering.QuietMs != 5 {
		t.Errorf("after marked frames: status %+v, want the last one's time", st.Steering)
	}
}

// TestPrismQuietTCP: a paced TCP stream (400 Mbit/s, no loss on the
// testbed) moves between the NIC poll and the bulk queue as a marked flow
// comes and goes, hundreds of times, and no segment arrives out of order
// (the receiver's tcpi_rcv_ooopack, the sender's tcpi_reord_seen). TCP
// puts GRO to work where UDP does not: a move must not split a GRO
// segment. (The first version of the queue accounting gave a flow's
// frames different XDP metadata on the two paths; this test passed with
// it too, 3 of 3 runs, so it does not show whether GRO in the VXLAN cell
// compares that metadata; the accounting keeps it equal anyway.) A run
// with retransmissions (a loss) cannot tell reordering from loss and only
// logs.
func TestPrismQuietTCP(t *testing.T) {
	q := newQuietBed(t, nil)
	dp, src, dst := q.dp, q.src, q.dst
	st0, _ := dp.Stats()
	stop := q.marks()
	res := overlaytest.TCPStream{Rate: 400e6, Duration: 2 * time.Second}.Run(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
	sent, sendErr := stop()
	if sendErr != nil {
		t.Fatalf("sending marked datagrams: %v", sendErr)
	}
	st1, _ := dp.Stats()
	tookBothPaths(t, fmt.Sprintf("%d marked datagrams", sent), st0[steer.StageSplit], st1[steer.StageSplit], true)
	t.Logf("TCP stream: %d bytes, sender retransmitted %d, saw reordering %d times; receiver got %d packets out of order", res.Bytes, res.Retrans, res.ReordSeen, res.OutOfOrder)
	switch {
	case res.Retrans > 0:
		t.Logf("inconclusive: the stream lost segments, and loss looks like reordering to these counters")
	case res.OutOfOrder > 0 || res.ReordSeen > 0:
		t.Errorf("TCP segments arrived out of order: %d at the receiver, %d reorderings seen by the sender", res.OutOfOrder, res.ReordSeen)
	}
}

// TestPrismQuietStarvedQueue: TestPrismQuiet while a busy thread of
// normal priority holds the receive core, which leaves the SCHED_IDLE bulk
// queue's kthread next to nothing, so bulk frames sit in its ring (or are
// dropped there) far longer than the drain time. The stream pauses 40 ms
// between bursts, longer than the drain time plus the coarse clock's lag:
// before the queues were tracked, a flow idle that long left the queue
// with frames still in it, and its next burst, taken in the NIC poll,
// overtook them (docs/prism.md, "Under CPU contention a path change can
// reorder"). Now it waits until the queue has been seen empty. Datagrams
// may be lost (the ring overflows while starved); none may come out of
// order, no move may be made on the drain time, and every queue's
// accounting must balance once the stream is over: each frame counted in
// came out seen or was reported dropped by the kernel. Twice: with the
// default ring (2048 frames), which holds the starved frames (without the
// accounting this reordered in 3 of 3 runs), and with a 64-frame ring,
// which overflows, so the kernel's drop reports are part of the balance
// (without the accounting: 1 of 3 runs reordered, the others only moved
// on the drain time).
func TestPrismQuietStarvedQueue(t *testing.T) {
	for _, ring := range []string{"2048", "64"} {
		t.Run("ring "+ring, func(t *testing.T) { prismQuietStarved(t, ring) })
	}
}

func prismQuietStarved(t *testing.T, ring string) {
	q := newQuietBed(t, map[string]string{"queue-size": ring})
	dp, src, dst := q.dp, q.src, q.dst
	cfg, err := dp.Config()
	if err != nil {
		t.Fatal(err)
	}
	if _, tracked, err := dp.Order().Queues(); err != nil || !tracked {
		t.Fatalf("queues not tracked (%v)", err)
	}
	q.warmUp(t)

	st0, _ := dp.Stats()
	stop := q.marks()
	// The sender shares core 0 with the NIC poll (the veth's NAPI runs
	// where the sender transmits), which is the receive core.
	hogged := cfg.CPUs[0]
	res := overlaytest.Stream{Count: 12000, Size: 200, Burst: 400, Pause: 40 * time.Millisecond, CPU: hogged,
		During: func() {
			unhog := modetest.Hog(t, hogged)
			time.Sleep(500 * time.Millisecond)
			unhog()
		}}.Run(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
	sent, sendErr := stop()
	if sendErr != nil {
		t.Fatalf("sending marked datagrams: %v", sendErr)
	}
	t.Logf("bulk stream with core %d hogged for 500 ms: sent %d, received %d, reordered %d %v", hogged, res.Sent, res.Received, res.Reordered, res.Examples)
	if res.Reordered != 0 {
		t.Errorf("%d datagrams arrived out of order", res.Reordered)
	}
	st1, _ := dp.Stats()
	d0, d1 := st0[steer.StageSplit], st1[steer.StageSplit]
	tookBothPaths(t, fmt.Sprintf("%d marked datagrams", sent), d0, d1, true)
	t.Logf("settled %d", d1.Settled-d0.Settled)
	if d1.Undrained != d0.Undrained {
		t.Errorf("%d moves made on the drain time from a tracked queue", d1.Undrained-d0.Undrained)
	}
	balanced := func() ([]steer.Queue, bool) {
		qs, _, err := dp.Order().Queues()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Untracked || q.Enqueued != q.Out() {
				return qs, false
			}
		}
		return qs, len(qs) > 0
	}
	var qs []steer.Queue
	ok := false
	for deadline := time.Now().Add(3 * time.Second); !ok && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		qs, ok = balanced()
	}
	t.Logf("queues: %+v", qs)
	if !ok {
		t.Errorf("queue accounting does not balance (in = seen + dropped) or no queue was used: %+v", qs)
	}
	// The short ring must have overflowed, and flows whose dropped
	// frames held them must have settled: else this run did not test the
	// drop reports.
	if ring == "64" {
		var dropped uint64
		for _, q := range qs {
			dropped += q.DroppedRing
		}
		if dropped == 0 || d1.Settled == d0.Settled {
			t.Errorf("64-frame ring: %d frames dropped at the ring, %d waits settled; want both > 0 (was the kthread starved?)", dropped, d1.Settled-d0.Settled)
		}
	}
}

// TestPrismIdleInlineNeedsUDPGROOff: where the underlay's GRO may merge
// inner UDP datagrams (rx-udp-gro-forwarding on), a UDP datagram need not
// end a GRO segment, so prism does not keep bulk in the NIC poll while no
// rule exists, and its plan says why. lanes leaves the feature as found.
func TestPrismIdleInlineNeedsUDPGROOff(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	r := tb.Receiver()
	topo, err := topology.Discover(r.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	ul := topo.Underlays[0]
	if len(ul.UDPGRO) != 0 || ul.FeaturesUnread != "" {
		t.Fatalf("testbed underlay %s: UDP GRO %v (unread: %q), want both off and read", ul.Name, ul.UDPGRO, ul.FeaturesUnread)
	}
	const feature = "rx-udp-gro-forwarding"
	t.Cleanup(func() {
		if err := ethtool.SetNamed(ul.NetNS, ul.Name, feature, false); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := ethtool.SetNamed(ul.NetNS, ul.Name, feature, true); err != nil {
		t.Fatal(err)
	}
	before := modetest.Snapshot(t, tb)
	dir := t.TempDir()
	_, err = control.Apply(control.Options{Mode: "prism-batch", NetNS: r.NetNS, StateDir: dir, Params: map[string]string{"quiet": "1s"}})
	modetest.OneLine(t, "quiet=1s", err, "has "+feature+" on")
	modetest.NoState(t, dir)
	a := modetest.Apply(t, tb, "prism-batch", nil)
	cfg, err := a.Open(t).Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PrioIdleInline {
		t.Errorf("%s on the underlay, and bulk still stays in the NIC poll while no flow is marked", feature)
	}
	said := false
	for _, n := range a.State.Plan.Notes {
		said = said || strings.Contains(n, ul.Name+" has "+feature+" on")
	}
	if !said {
		t.Errorf("no plan note names %s on %s: %q", feature, ul.Name, a.State.Plan.Notes)
	}
	a.ResetAndCheck(t, before)
	if got, err := ethtool.GetNamed(ul.NetNS, ul.Name, feature); err != nil || !got[feature] {
		t.Errorf("after reset %s of %s: %v (%v), want it left on", feature, ul.Name, got, err)
	}
}

// TestPrismFlannel: on a routed overlay (Flannel: the receiving host
// forwards every inner packet from flannel.1 into the cni0 bridge),
// prism-sync says the shortcut needs a bridged overlay and keeps batch
// mode: a marked stream takes the high-priority queue and arrives in
// order, bulk takes the bulk queue, and reset restores every knob.
func TestPrismFlannel(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Flannel)
	before := modetest.Snapshot(t, tb)
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	// The neighbours on the forwarding path are resolved already
	// (modetest.UpTestbed): datagrams that wait for ARP there arrive after
	// later ones, in vanilla too.
	a := modetest.Apply(t, tb, "prism-sync", nil)
	if notes := strings.Join(a.State.Plan.Notes, "\n"); !strings.Contains(notes, "routed overlay") {
		t.Errorf("plan notes %q do not say the shortcut needs a bridged overlay", a.State.Plan.Notes)
	}
	dp := a.Open(t)
	if ts, err := dp.Sync().Targets(); err != nil || len(ts) != 0 {
		t.Errorf("sync destinations %v (%v) on a routed overlay, want none", ts, err)
	}
	if err := modetest.Prio(t, r.NetNS).Add(modetest.Rule(t, "dst "+dst.Addr.Addr().String()+" udp")); err != nil {
		t.Fatal(err)
	}
	st0, _ := dp.Stats()
	res := overlaytest.Stream{Count: 5000, Size: 200, Burst: 100, Pause: time.Millisecond, CPU: 0}.Delivered(t, "high-priority stream through Flannel", true, src.NetNS, dst.NetNS, dst.Addr.Addr())
	overlaytest.TCP(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 1<<20)
	st1, _ := dp.Stats()
	d, d0 := st1[steer.StageSplit], st0[steer.StageSplit]
	if d.High-d0.High < uint64(res.Received) {
		t.Errorf("%d frames classified high, %d datagrams arrived", d.High-d0.High, res.Received)
	}
	if d.Sync != d0.Sync {
		t.Errorf("%d frames took the sync shortcut on a routed overlay", d.Sync-d0.Sync)
	}
	if d.Steered == d0.Steered {
		t.Errorf("nothing took a queue: %+v", d)
	}
	a.ResetAndCheck(t, before)
}

// TestPrismRefuses: bad settings fail in one line and leave nothing.
func TestPrismRefuses(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	for params, want := range map[string]string{
		"sync-interval=5ms":                   "want 10ms..1m",
		"prio-mode=fast":                      "want batch or sync",
		"rt=99":                               "want 2..96",
		"bulk-rt=60":                          "must be below rt",
		"cpu=7":                               "not among the cores",
		"split=true":                          "has no setting",
		"high=fast":                           "want queue, inline or auto",
		"bulk=fast":                           "want queue, inline or auto",
		"bulk=auto,high=queue":                "drop bulk=auto or set high=auto",
		"bulk=auto,cpu=0":                     "high=auto cannot run here",
		"bulk=inline,high=inline":             "leave no class queued",
		"bulk=inline,streamline=true":         "real-time NIC poll",
		"bulk-sched=lowest":                   "want normal, batch or idle",
		"bulk-sched=idle,bulk-rt=10":          "makes it real-time",
		"bulk-sched=idle,bulk=inline":         "has no bulk queue",
		"bulk-sched=idle,streamline=true":     "drop one of them",
		"guard-nice=5,bulk-sched=normal":      "set bulk-sched=idle",
		"bulk-sched=idle,guard-nice=20":       "from 0 to 19",
		"guard-tasks=10,bulk-sched=normal":    "set bulk-sched=idle",
		"guard-tasks=150":                     "from 0 to 100",
		"high-rt=0,bulk-sched=normal":         "add bulk-sched=idle",
		"high-rt=-1":                          "want 0 (normal scheduling)",
		"high=inline,high-rt=60":              "has no such queue",
		"streamline=true,high-rt=51":          "container veths at 52",
		"bulk-rt=20,high-rt=20":               "above bulk-rt 20",
		"quiet=1s,cpu=0":                      "receive on the one IRQ core",
		"quiet=1s,bulk=inline":                "drop quiet or the inline setting",
		"high=auto,cpu=0":                     "the underlay's IRQ core is 1",
		"high-auto-pps=9000,cpu=0":            "the underlay's IRQ core is 1",
		"high-auto-pps=9000,bulk=inline":      "bulk=inline leaves no such move",
		"high=queue,high-auto-pps=100":        "set high=auto",
		"netdev-budget=-1":                    "want 0 (leave it as it is)",
		"netdev-budget=200000":                "from 1 to 100000",
		"netdev-budget=64,high=inline":        "has no such queue",
		"sync-netfilter=trust":                "sync-netfilter is gone: PRISM-sync takes its shortcut only where no netfilter table",
		"prio-mode=sync,sync-netfilter=check": "sync-netfilter is gone: PRISM-sync takes its shortcut only where no netfilter table",
	} {
		m := map[string]string{}
		for _, kv := range strings.Split(params, ",") {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		dir := t.TempDir()
		_, err := control.Apply(control.Options{Mode: "prism", NetNS: tb.Receiver().NetNS, StateDir: dir, Params: m})
		modetest.OneLine(t, params, err, want)
		modetest.NoState(t, dir)
	}
	modetest.SameSnapshot(t, "after refused applies", modetest.Snapshot(t, tb), before)
	if modetest.Exists(plan.PinDir(tb.Receiver().NetNS)) {
		t.Error("a refused apply left a pin directory")
	}
}

// TestPrismNetdevBudget: netdev-budget sets the host's
// net.core.netdev_budget while the mode is applied, both classes still
// flow, and reset puts the kernel's value back (Snapshot reads it).
func TestPrismNetdevBudget(t *testing.T) {
	before, err := knobs.Sysctl("", "net.core.netdev_budget").Read()
	if err != nil {
		t.Fatal(err)
	}
	want := "64"
	if strings.TrimSpace(string(before)) == want {
		want = "65" // a value that differs from the host's
	}
	c := newClassCase(t, map[string]string{"netdev-budget": want, "bulk-quiet": "0"})
	got, err := knobs.Sysctl("", "net.core.netdev_budget").Read()
	if err != nil || strings.TrimSpace(string(got)) != want {
		t.Errorf("net.core.netdev_budget %q (%v) while applied, want %s", got, err, want)
	}
	// A second target may not set the host-wide value too: each would
	// put back what the other set. Refused before anything is applied.
	sender := c.bed.Sender().NetNS
	_, err = control.Apply(control.Options{Mode: "prism-batch", NetNS: sender, StateDir: c.a.StateDir, Params: map[string]string{"netdev-budget": "32"}})
	modetest.OneLine(t, "netdev-budget on a second target", err, "reset that target first")
	if got, _ := knobs.Sysctl("", "net.core.netdev_budget").Read(); strings.TrimSpace(string(got)) != want {
		t.Errorf("net.core.netdev_budget %q after the refused second apply, want %s", got, want)
	}
	if modetest.Exists(plan.PinDir(sender)) {
		t.Error("the refused apply left a pin directory")
	}
	c.checkClasses(t, true, true)
	c.reset(t)
	if got, _ := knobs.Sysctl("", "net.core.netdev_budget").Read(); string(got) != string(before) {
		t.Errorf("net.core.netdev_budget %q after reset, want %q", got, before)
	}
}

// TestPrismBulkInline: with bulk=inline there is no bulk queue: bulk
// frames pass XDP and run in the NIC poll as under vanilla, a marked
// flow's frames take the real-time high-priority queue, and reset
// restores every knob.
func TestPrismBulkInline(t *testing.T) {
	c := newClassCase(t, map[string]string{"bulk": "inline"})
	dp := c.dp
	if cm, err := dp.CPUMap().Entries(); err != nil || len(cm) != 0 {
		t.Errorf("bulk cpumap entries %v (%v), want none", cm, err)
	}
	if cm, err := dp.HiCPUMap().Entries(); err != nil || len(cm) != 1 || cm[0] != 1 {
		t.Errorf("high-priority cpumap entries %v (%v), want the IRQ core [1]", cm, err)
	}

	c.checkClasses(t, true, false)
	c.reset(t)
}

// TestPrismBulkSched: with bulk-sched=idle (the default) the bulk queue's
// cpumap kthread runs SCHED_IDLE while the high-priority queue stays
// real-time (normal with high-rt=0) and the NIC poll keeps normal
// scheduling, both classes still flow, and reset restores every knob.
func TestPrismBulkSched(t *testing.T) {
	// bulk-quiet=0: the marked datagrams go first, with no bulk yet,
	// which would otherwise run them in the NIC poll (TestPrismBulkQuiet).
	t.Run("defaults", func(t *testing.T) { bulkSched(t, map[string]string{"bulk-quiet": "0"}, unix.SCHED_FIFO) })
	t.Run("high-rt=0", func(t *testing.T) {
		bulkSched(t, map[string]string{"high-rt": "0", "bulk-quiet": "0"}, unix.SCHED_NORMAL)
	})
}

func bulkSched(t *testing.T, params map[string]string, hiPolicy uint32) {
	c := newClassCase(t, params)
	nicPollSched(t, c.ns, "policy=other prio=0 nice=0", "it classifies both classes")
	if c.a.State.Plan.Agent != prism.GuardAgentName {
		t.Errorf("plan agent %q, want the starvation guard %q", c.a.State.Plan.Agent, prism.GuardAgentName)
	}
	// This datapath's cpumap kthreads (other packages' tests may run
	// cpumaps of their own meanwhile): the bulk queue's idle, the
	// high-priority queue's real-time, or normal with high-rt=0.
	for _, q := range []struct {
		what   string
		get    func() ([]kthread.Info, error)
		policy uint32
	}{
		{"bulk", c.dp.CPUMap().Kthreads, unix.SCHED_IDLE},
		{"high-priority", c.dp.HiCPUMap().Kthreads, hiPolicy},
	} {
		ths, err := q.get()
		if err != nil || len(ths) != 1 || !strings.HasPrefix(ths[0].Comm, "cpumap/1/") {
			t.Fatalf("%s queue kthreads %v (%v), want one on core 1", q.what, ths, err)
		}
		attr, err := unix.SchedGetAttr(ths[0].PID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if attr.Policy != q.policy {
			t.Errorf("%s queue %s: policy %d, want %d", q.what, ths[0].Comm, attr.Policy, q.policy)
		}
	}

	c.checkClasses(t, true, true)
	c.reset(t)
}

// TestPrismHighInline: with high=inline there is no high-priority queue:
// a marked flow's frames pass XDP and run in the NIC poll (real-time on
// the streamlined ladder), bulk frames still take the bulk queue, and
// reset restores every knob.
func TestPrismHighInline(t *testing.T) {
	c := newClassCase(t, map[string]string{"high": "inline", "streamline": "true"})
	dp := c.dp
	if cm, err := dp.CPUMap().Entries(); err != nil || len(cm) != 1 || cm[0] != 1 {
		t.Errorf("bulk cpumap entries %v (%v), want the IRQ core [1]", cm, err)
	}
	if cm, err := dp.HiCPUMap().Entries(); err != nil || len(cm) != 0 {
		t.Errorf("high-priority cpumap entries %v (%v), want none", cm, err)
	}
	nicPollSched(t, c.ns, "policy=fifo prio=50 nice=0", "the ladder's first rung")
	if c.a.State.Plan.Agent != prism.GuardAgentName {
		t.Errorf("plan agent %q, want the overload guard %q", c.a.State.Plan.Agent, prism.GuardAgentName)
	}

	c.checkClasses(t, false, true)
	c.reset(t)
}

// classCase is prism-batch applied with some settings to a fresh docker
// testbed's receiver, for the tests of where each class runs.
type classCase struct {
	a        *modetest.Applied
	dp       *steer.Datapath
	before   map[string]string
	ns       string
	src, dst testbed.Container
	bed      *testbed.Testbed
}

func newClassCase(t *testing.T, params map[string]string) classCase {
	t.Helper()
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	c := classCase{before: modetest.Snapshot(t, tb), ns: tb.Receiver().NetNS, src: tb.Sender().Containers[0], dst: tb.Receiver().Containers[0], bed: tb}
	c.a = modetest.Apply(t, tb, "prism-batch", params)
	c.dp = c.a.Open(t)
	return c
}

// traffic is classTraffic from the sender's container to the receiver's.
func (c classCase) traffic(t *testing.T) (hi, bulk steer.Counters, n uint64) {
	t.Helper()
	return classTraffic(t, c.dp, c.ns, c.src, c.dst)
}

// checkClasses sends both classes' traffic and checks where each ran at
// the split stage: queued (steered to a cpumap) or inline (stayed in the
// NIC poll).
func (c classCase) checkClasses(t *testing.T, hiQueued, bulkQueued bool) {
	t.Helper()
	hi, bulk, n := c.traffic(t)
	hiWhere, how := hi.Steered, "queued"
	if !hiQueued {
		hiWhere, how = hi.Stayed, "passed inline"
	}
	if hi.High < n || hiWhere < n {
		t.Errorf("split stage %+v for %d datagrams: want them all high and %s", hi, n, how)
	}
	switch {
	case bulkQueued && bulk.Steered == 0:
		t.Errorf("bulk TCP took no queue: %+v", bulk)
	case !bulkQueued && (bulk.Steered != 0 || bulk.Stayed == 0):
		t.Errorf("bulk TCP: split stage %+v, want every frame inline (stayed), none queued", bulk)
	}
}

// reset resets the mode and checks every knob is back.
func (c classCase) reset(t *testing.T) { c.a.ResetAndCheck(t, c.before) }

// classTraffic marks UDP to dst high priority, sends a datagram stream
// (high) and then a TCP transfer (bulk) from src to dst, and returns the
// split stage's counters for each and how many datagrams arrived.
func classTraffic(t *testing.T, dp *steer.Datapath, ns string, src, dst testbed.Container) (hi, bulk steer.Counters, n uint64) {
	t.Helper()
	if err := modetest.Prio(t, ns).Add(modetest.Rule(t, "dst "+dst.Addr.Addr().String()+" udp")); err != nil {
		t.Fatal(err)
	}
	st0, _ := dp.Stats()
	n = uint64(overlaytest.UDPMost(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 200))
	st1, _ := dp.Stats()
	overlaytest.TCP(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 1<<20)
	st2, _ := dp.Stats()
	return st1[steer.StageSplit].Sub(st0[steer.StageSplit]), st2[steer.StageSplit].Sub(st1[steer.StageSplit]), n
}

// nicPollSched checks the scheduling of every NAPI thread of ns's
// underlay (the NIC poll) against want; why says why it should be so.
func nicPollSched(t *testing.T, ns, want, why string) {
	t.Helper()
	topo, err := topology.Discover(ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Underlays) == 0 || len(topo.Underlays[0].NAPIThreads) == 0 {
		t.Fatal("the testbed's underlay has no NAPI thread to check")
	}
	for _, th := range topo.Underlays[0].NAPIThreads {
		b, err := knobs.Sched(th.Comm, th.Index).Read()
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != want {
			t.Errorf("NIC poll %s: %q, want %q (%s)", th.Comm, b, want, why)
		}
	}
}

// TestPrismHighAuto: high=auto keeps the high-priority queue (the class
// starts there and the plan names lanes agent, which switches it), and a
// marked stream arrives in order while the switch flips between the queue
// and the NIC poll every few milliseconds: each flow moves only once none
// of its frames is left on the old path.
func TestPrismHighAuto(t *testing.T) {
	c := newClassCase(t, map[string]string{"high": "auto", "bulk-quiet": "0"})
	dp := c.dp
	if cm, err := dp.HiCPUMap().Entries(); err != nil || len(cm) != 1 || cm[0] != 1 {
		t.Errorf("high-priority cpumap entries %v (%v), want the IRQ core [1]", cm, err)
	}
	if cfg, err := dp.Config(); err != nil || !cfg.PrioIdleInline || cfg.HighAutoPPS != 5000 {
		t.Errorf("config %+v (%v): high=auto needs PrioIdleInline, and its threshold (5000)", cfg, err)
	}
	if c.a.State.Plan.Agent != prism.GuardAgentName {
		t.Errorf("plan agent %q, want %q (high=auto's switch)", c.a.State.Plan.Agent, prism.GuardAgentName)
	}
	rule := modetest.Rule(t, "dst "+c.dst.Addr.Addr().String()+" udp")
	if err := modetest.Prio(t, c.ns).Add(rule); err != nil {
		t.Fatal(err)
	}
	d := flipDuring(t, dp, c.src, c.dst, "marked stream while high=auto's switch flips", "switches", true, func(i int) error { return dp.Prio().SetHighInline(rule, switchUntil(i%2 == 0)) })
	// Every move the fast one: none waited out the drain time.
	if d.Moved < 10 || d.Undrained != 0 {
		t.Errorf("split stage %+v: want many moves, none after the drain time", d)
	}
	if err := dp.Prio().SetHighInline(rule, 0); err != nil {
		t.Fatal(err)
	}
	c.reset(t)
}

// TestPrismBulkQuiet: with high=auto's bulk quiet (the default, here 1ms)
// a marked flow runs in the NIC poll while no bulk frame comes and in its
// real-time queue while bulk does, moving between the two as bulk comes
// and goes in bursts, and arrives in order; with no bulk at all it never
// takes its queue.
func TestPrismBulkQuiet(t *testing.T) {
	c := newClassCase(t, map[string]string{"bulk-quiet": "1ms"})
	dp := c.dp
	if cfg, err := dp.Config(); err != nil || cfg.BulkQuiet != time.Millisecond || cfg.HighAutoPPS == 0 {
		t.Fatalf("config %+v (%v): want high=auto with a bulk quiet of 1ms", cfg, err)
	}
	rule := modetest.Rule(t, "dst "+c.dst.Addr.Addr().String()+" udp")
	if err := modetest.Prio(t, c.ns).Add(rule); err != nil {
		t.Fatal(err)
	}
	st0, _ := dp.Stats()
	alone := overlaytest.Stream{Count: 500, Size: 200, Burst: 50, Pause: time.Millisecond, CPU: 0}.Delivered(t, "marked stream with no bulk", true, c.src.NetNS, c.dst.NetNS, c.dst.Addr.Addr())
	st1, _ := dp.Stats()
	if d := st1[steer.StageSplit].Sub(st0[steer.StageSplit]); d.Steered != 0 || d.Stayed < uint64(alone.Received) {
		t.Errorf("split stage %+v for %d marked datagrams and no bulk: want them all in the NIC poll", d, alone.Received)
	}
	// lanes status says so: bulk quiet, the flow in the NIC poll, marked
	// by the rule.
	st, err := control.Status(control.StatusOptions{NetNS: c.a.NS, StateDir: c.a.StateDir, Sample: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if st.Steering == nil || !st.Steering.BulkQuiet || st.Steering.BulkQuietMs != 1 {
		t.Errorf("status %+v: want bulk quiet (1ms)", st.Steering)
	} else if !slices.ContainsFunc(st.Steering.Stay, func(f control.FlowStage) bool {
		return f.Stage == "split" && f.Marked && f.Inline && f.Rule == rule.String() && strings.Contains(f.Flow, "> "+alone.Dst.String()+" udp")
	}) {
		t.Errorf("status stays %+v: want the marked stream in the NIC poll, marked by %s", st.Steering.Stay, rule)
	}
	// Bulk to the other container (unmarked) in bursts 30 ms apart.
	other := c.bed.Receiver().Containers[1]
	var bulk overlaytest.StreamResult
	res := overlaytest.Stream{Count: 20000, Size: 200, Burst: 50, Pause: 200 * time.Microsecond, CPU: 0, During: func() {
		bulk = overlaytest.Stream{Count: 600, Size: 200, Burst: 20, Pause: 30 * time.Millisecond, CPU: 1}.Run(t, c.src.NetNS, other.NetNS, other.Addr.Addr())
	}}.Run(t, c.src.NetNS, c.dst.NetNS, c.dst.Addr.Addr())
	movedInOrder(t, dp, "bulk in bursts", res, bulk, st1)
	c.reset(t)
}

// flipEvery runs send while it flips a switch every 20 ms (off first),
// and fails t if a flip failed.
func flipEvery(t *testing.T, flip func(on bool) error, send func() overlaytest.StreamResult) overlaytest.StreamResult {
	t.Helper()
	stop := modetest.Every(20*time.Millisecond, func(i int) error { return flip(i%2 == 1) })
	res := send()
	if _, err := stop(); err != nil {
		t.Fatal(err)
	}
	return res
}

// movedInOrder checks that a marked stream and the bulk stream beside it
// arrived in order, and that since st1 bulk took both paths (its queue and
// the NIC poll) without a move waiting out the drain time.
func movedInOrder(t *testing.T, dp *steer.Datapath, what string, marked, bulk overlaytest.StreamResult, st1 [steer.NumStages]steer.Counters) {
	t.Helper()
	overlaytest.InOrder(t, "marked stream, "+what, marked)
	overlaytest.InOrder(t, what, bulk)
	st2, _ := dp.Stats()
	tookBothPaths(t, what, st1[steer.StageSplit], st2[steer.StageSplit], true)
	if d := st2[steer.StageSplit].Sub(st1[steer.StageSplit]); d.Undrained != 0 {
		t.Errorf("split stage %+v: a move waited out the drain time", d)
	}
}

// TestPrismHighAutoFallsBack: where the NIC is not polled on the receive
// core, the default high=auto keeps the high-priority class in its queue
// and the plan says why (given explicitly, it is refused: TestPrismRefuses).
func TestPrismHighAutoFallsBack(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	before := modetest.Snapshot(t, tb)
	a := modetest.Apply(t, tb, "prism-batch", map[string]string{"cpu": "0"})
	if !slices.ContainsFunc(a.State.Plan.Notes, func(n string) bool { return strings.Contains(n, "keeps its queue (high=queue)") }) {
		t.Errorf("plan notes %q: want the fallback to high=queue said", a.State.Plan.Notes)
	}
	dp := a.Open(t)
	if cm, err := dp.HiCPUMap().Entries(); err != nil || len(cm) != 1 || cm[0] != 0 {
		t.Errorf("high-priority cpumap entries %v (%v), want the receive core [0]", cm, err)
	}
	if cfg, err := dp.Config(); err != nil || cfg.HighAutoPPS != 0 || cfg.BulkAuto != 0 {
		t.Errorf("config %+v (%v): high=auto's threshold or the default bulk=auto on a plan that fell back to the queue", cfg, err)
	}
	ag, stopAgent := a.StartAgent(t)
	var st prism.GuardStatus
	for range 100 {
		if st, _ = ag.Status().(prism.GuardStatus); st.High != nil && st.High.Off {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.High == nil || !st.High.Off || st.High.Err != "" {
		t.Errorf("agent status %+v: want high=auto's switch off (the plan fell back to the queue)", st.High)
	}
	stopAgent()
	a.ResetAndCheck(t, before)
}

// TestPrismBulkAuto: with bulk=auto, unmarked bulk runs in the NIC poll
// beside a marked flow whose rule's switch runs it there (a busy rule),
// and lanes status says so; as the switch flips back and forth, bulk
// moves between its queue and the NIC poll, and both flows arrive in
// order without a move waiting out the drain time.
func TestPrismBulkAuto(t *testing.T) {
	c := newClassCase(t, map[string]string{"bulk": "auto", "bulk-quiet": "0"})
	dp := c.dp
	if cfg, err := dp.Config(); err != nil || cfg.BulkAuto != prism.BulkAutoWindow || cfg.HighAutoPPS == 0 {
		t.Fatalf("config %+v (%v): want high=auto with bulk auto (%v)", cfg, err, prism.BulkAutoWindow)
	}
	rule := modetest.Rule(t, "dst "+c.dst.Addr.Addr().String()+" udp")
	if err := modetest.Prio(t, c.ns).Add(rule); err != nil {
		t.Fatal(err)
	}
	// What the agent does for a busy rule.
	if err := dp.Prio().SetHighInline(rule, switchUntil(true)); err != nil {
		t.Fatal(err)
	}
	other := c.bed.Receiver().Containers[1]
	// The marked stream outlasts the bulk one, so the status is read
	// while the marked flow still runs.
	marked := overlaytest.Stream{Count: 40000, Size: 200, Burst: 50, Pause: 200 * time.Microsecond, CPU: 0}
	bulkStream := overlaytest.Stream{Count: 1000, Size: 200, Burst: 20, Pause: time.Millisecond, CPU: 1}
	st0, _ := dp.Stats()
	var bulk overlaytest.StreamResult
	var besideBusy bool
	m := marked
	m.During = func() {
		bulk = bulkStream.Run(t, c.src.NetNS, other.NetNS, other.Addr.Addr())
		st, err := control.Status(control.StatusOptions{NetNS: c.a.NS, StateDir: c.a.StateDir, Sample: 10 * time.Millisecond})
		if err != nil {
			t.Error(err)
			return
		}
		if st.Steering == nil || st.Steering.BulkAutoMs != prism.BulkAutoWindow.Milliseconds() {
			t.Errorf("status %+v: want bulk auto (%v)", st.Steering, prism.BulkAutoWindow)
			return
		}
		besideBusy = st.Steering.BulkBesideBusy
	}
	// A stream a stalled vCPU cut short goes again, gentler (the
	// counters below then span every try, which their bounds allow).
	m.Delivered(t, "marked stream, its rule inline", true, c.src.NetNS, c.dst.NetNS, c.dst.Addr.Addr())
	overlaytest.InOrder(t, "bulk beside it", bulk)
	st1, _ := dp.Stats()
	if d := st1[steer.StageSplit].Sub(st0[steer.StageSplit]); d.Steered > uint64(bulk.Received)/4 {
		t.Errorf("split stage %+v: %d of %d bulk datagrams queued beside a busy rule's flow, want them in the NIC poll", d, d.Steered, bulk.Received)
	} else if d.BulkBeside < uint64(bulk.Received)/2 || d.BulkBeside > d.Stayed {
		t.Errorf("split stage %+v: %d bulk frames counted in the NIC poll beside busy of %d received (%d stayed)", d, d.BulkBeside, bulk.Received, d.Stayed)
	}
	if !besideBusy {
		t.Error("lanes status did not say bulk runs in the NIC poll beside the busy rule's flow")
	}
	// The switch flips every 20 ms: the marked flow takes its queue and
	// leaves it, and bulk follows.
	m.During = func() { bulk = bulkStream.Run(t, c.src.NetNS, other.NetNS, other.Addr.Addr()) }
	res := flipEvery(t, func(on bool) error { return dp.Prio().SetHighInline(rule, switchUntil(on)) }, func() overlaytest.StreamResult {
		return m.Run(t, c.src.NetNS, c.dst.NetNS, c.dst.Addr.Addr())
	})
	movedInOrder(t, dp, "bulk beside a flipping switch", res, bulk, st1)

	// A light rule's flow (its queue) while the agent's aside deadline
	// flips every 20 ms (aside-below): both classes leave their queues
	// for the NIC poll and come back, in order.
	if err := dp.Prio().SetHighInline(rule, 0); err != nil {
		t.Fatal(err)
	}
	st2, _ := dp.Stats()
	res = flipEvery(t, func(on bool) error {
		until := time.Duration(0)
		if on {
			until = steer.Now() + time.Second
		}
		return dp.Prio().SetAside(until)
	}, func() overlaytest.StreamResult { return m.Run(t, c.src.NetNS, c.dst.NetNS, c.dst.Addr.Addr()) })
	movedInOrder(t, dp, "bulk beside a marked flow, stepping aside and back", res, bulk, st2)
	if err := dp.Prio().SetAside(0); err != nil {
		t.Fatal(err)
	}
	if on, err := dp.Prio().Aside(); on || err != nil {
		t.Errorf("aside %v (%v) after SetAside(0)", on, err)
	}
	c.reset(t)
}

// switchUntil is the deadline of a high=auto switch (Prio.SetHighInline)
// on for the rest of a test, or off (0).
func switchUntil(on bool) time.Duration {
	if on {
		return steer.Now() + time.Hour
	}
	return 0
}
