package mflow_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/bench/stress"
	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/testbed"
)

func TestMain(m *testing.M) { modetest.Main(m, "tu") }

// The elephant of the integration tests: 30000 packets/s (3x the default
// threshold) for a second, from the live-frame generator on core 0 at
// SCHED_IDLE, so receive work placed on core 0 preempts it.
const (
	elephantRate = 30000
	elephantTime = time.Second
	genSrcPort   = 20000
)

// TestMflowIRQ applies mflow with its defaults (split at the NIC poll over
// cores 0 and 1) to a Docker testbed: a mouse keeps the vanilla path, an
// elephant's micro-flows run on both cores (the datapath's counts, the
// metadata read back on each core, and the receiving socket's
// SO_INCOMING_CPU agree), the last micro-flow's sequence number reaches
// the skb side, and reset restores every knob byte for byte.
func TestMflowIRQ(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	r := tb.Receiver()
	before := modetest.Snapshot(t, tb)
	// Without reassembly: this test is about the split, micro-flows
	// delivered by both cores (TestReassembly* are about order).
	a := modetest.Apply(t, tb, "mflow", map[string]string{"reorder": "off"})
	dp := a.Open(t)
	if id, err := attach.Attached(r.NetNS, r.Underlay); err != nil || id == 0 || id != progID(t, dp.XDP()) {
		t.Errorf("XDP on %s: program %d (%v), want the pinned steer_xdp", r.Underlay, id, err)
	}
	after := modetest.Snapshot(t, tb)
	if got, want := after["tcx:"+r.NetNS+":"+r.Underlay+":ingress"], strconv.Itoa(int(progID(t, dp.TCSplitSeen()))); got != want {
		t.Errorf("tc ingress on %s: programs %q, want steer_tc_split_seen %s", r.Underlay, got, want)
	}
	cfg, err := dp.Config()
	if err != nil {
		t.Fatal(err)
	}
	if m := cfg.MFlow; m.At != steer.SplitAtIRQ || m.Batch != 256 || !slices.Equal(m.Cores, []int{0, 1}) {
		t.Errorf("datapath split %+v, want at irq, 256 frames, cores 0 and 1", m)
	}
	if cm, err := dp.CPUMap().Entries(); err != nil || !slices.Equal(cm, []int{0, 1}) {
		t.Errorf("cpumap entries %v (%v), want both split cores", cm, err)
	}

	res, f, perCore := mouseThenElephant(t, tb, dp, steer.StageSplit)
	// The cpumap kthreads may still hold the last frames.
	waitLastSeen(t, func() steer.MicroFlowState { return elephantFlow(t, dp, res, steer.StageSplit).MicroFlow })
	cores, err := dp.CoreStats()
	if err != nil {
		t.Fatal(err)
	}
	st, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	split := st[steer.StageSplit]
	t.Logf("elephant: %+v; flow %+v; micro-flows per core %v; arrived per core %d/%d, late %d",
		res, f.MicroFlow, perCore[:2], cores[0][steer.StageSplit].MicroArrived, cores[1][steer.StageSplit].MicroArrived, split.MicroLate)
	for _, c := range []int{0, 1} {
		if perCore[c] == 0 {
			t.Errorf("no micro-flow sent to core %d", c)
		}
		if cores[c][steer.StageSplit].MicroArrived == 0 {
			t.Errorf("no micro-flow frame arrived on core %d (metadata read back by tc ingress)", c)
		}
	}
	if split.MicroArrived*10 < split.MicroFrames*9 {
		t.Errorf("%d of %d micro-flow frames read back on the skb side", split.MicroArrived, split.MicroFrames)
	}
	bothCoresDeliver(t, res)
	statusShowsElephant(t, a, res, elephantFlow(t, dp, res, steer.StageSplit).MicroFlow.Elephant)
	// Micro-flow frames count in and out of their core's queues like any
	// other (steer.c, struct steer_queue): once the stream is over, every
	// tracked core balances.
	var qs []steer.Queue
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if qs, _, err = dp.Order().Queues(); err != nil {
			t.Fatal(err)
		}
		balanced := len(qs) > 0
		for _, q := range qs {
			balanced = balanced && (q.Untracked || q.Enqueued == q.Out())
		}
		if balanced || time.Now().After(deadline) {
			if !balanced {
				t.Errorf("queue accounting does not balance after the stream: %+v", qs)
			}
			break
		}
	}
	t.Logf("queues: %+v", qs)
	dp.Close()
	a.ResetAndCheck(t, before)
	overlaytest.UDPMost(t, tb.Sender().Containers[0].NetNS, r.Containers[0].NetNS, r.Containers[0].Addr.Addr(), 1000)
}

// TestMflowBridge: a bad setting is refused before anything changes; then
// mflow splitting at the bridge stage (tc ingress + RPS on the VXLAN
// device, no XDP) runs an elephant's micro-flows on both cores while a
// mouse stays, and reset restores every knob.
func TestMflowBridge(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	r := tb.Receiver()
	before := modetest.Snapshot(t, tb)
	stateDir := t.TempDir()
	_, err := control.Apply(control.Options{Mode: "mflow", NetNS: r.NetNS, StateDir: stateDir, Params: map[string]string{"at": "bridge", "batch": "0"}})
	modetest.OneLine(t, "mflow with batch 0", err, `bad mflow setting batch="0"`)
	modetest.NoState(t, stateDir)
	modetest.SameSnapshot(t, "after the refused apply", modetest.Snapshot(t, tb), before)

	a := modetest.Apply(t, tb, "mflow", map[string]string{"at": "bridge", "reorder": "off"})
	dp := a.Open(t)
	if id, _ := attach.Attached(r.NetNS, r.Underlay); id != 0 {
		t.Errorf("XDP program %d on %s: the bridge split needs none", id, r.Underlay)
	}
	after := modetest.Snapshot(t, tb)
	if got, want := after["tcx:"+r.NetNS+":"+r.Underlay+":ingress"], strconv.Itoa(int(progID(t, dp.TCIngress()))); got != want {
		t.Errorf("tc ingress on %s: programs %q, want steer_tc_ingress %s", r.Underlay, got, want)
	}
	for k, v := range before {
		if k == "tcx:"+r.NetNS+":"+r.Underlay+":ingress" || k == "bpffs:/sys/fs/bpf" || k == "pindir:"+a.PinDir {
			continue
		}
		rps := k == knobs.Sysfs(r.NetNS, "/sys/class/net/"+r.VXLAN+"/queues/rx-0/rps_cpus").Key()
		if changed := after[k] != v; changed != rps {
			t.Errorf("%s: %q -> %q", k, v, after[k])
		}
	}
	res, f, perCore := mouseThenElephant(t, tb, dp, steer.StageBridge)
	t.Logf("elephant: %+v; flow %+v; micro-flows per core %v", res, f.MicroFlow, perCore[:2])
	if !f.MicroFlow.Elephant || f.MicroFlow.Started < 2 || f.InFlight != 0 {
		t.Errorf("elephant's bridge-stage state %+v: want split, nothing counted in flight", f)
	}
	if perCore[0] == 0 || perCore[1] == 0 {
		t.Errorf("micro-flows per core %v: want both cores", perCore[:2])
	}
	bothCoresDeliver(t, res)
	dp.Close()
	a.ResetAndCheck(t, before)
}

// statusShowsElephant: `lanes status` shows micro-flows sent to both cores
// and lists the elephant with its micro-flows, if it still is one (still).
func statusShowsElephant(t *testing.T, a *modetest.Applied, res elephantResult, still bool) {
	t.Helper()
	s, err := control.Status(control.StatusOptions{NetNS: a.NS, StateDir: a.StateDir, Sample: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if s.Steering == nil {
		t.Fatal("status shows no steering datapath")
	}
	if mf := s.Steering.MicroFlows; mf[0] == 0 || mf[1] == 0 {
		t.Errorf("status: micro-flows per core %v, want both cores", mf)
	}
	want := res.Src.String() + " > " + res.Dst.String() + " udp"
	if !still {
		// Status lists the flows split now. A sender stalled by the
		// shared machine closes a rate window short near the end and
		// the flow falls back to a mouse: a timing the test cannot own.
		t.Logf("the elephant fell back before the stream ended (a rate window closed short); status lists current elephants only: %+v", s.Steering.Elephants)
		return
	}
	for _, e := range s.Steering.Elephants {
		if e.Flow == want {
			if e.MicroFlows < 2 || e.Frames == 0 {
				t.Errorf("status: elephant %+v", e)
			}
			return
		}
	}
	t.Errorf("status: elephants %+v, want %s", s.Steering.Elephants, want)
}

// mouseThenElephant sends a mouse, then the elephant, and returns what the
// receiver saw of the elephant, its flow state at the stage that splits and
// the micro-flows sent to each core.
func mouseThenElephant(t *testing.T, tb *testbed.Testbed, dp *steer.Datapath, stage int) (elephantResult, steer.Flow, [steer.MaxCPUs]uint64) {
	t.Helper()
	mouseKeepsItsPath(t, tb, dp, stage)
	res := sendElephant(t, tb)
	perCore, err := dp.Micro().PerCore()
	if err != nil {
		t.Fatal(err)
	}
	return res, elephantFlow(t, dp, res, stage), perCore
}

// mouseKeepsItsPath sends a burst of 50 datagrams (below the threshold in
// any window) and checks the splitting stage passed them on as a mouse.
func mouseKeepsItsPath(t *testing.T, tb *testbed.Testbed, dp *steer.Datapath, stage int) {
	t.Helper()
	st0, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// Also warms up ARP and the bridge's FDB for the elephant.
	src, dst := tb.Sender().Containers[0], tb.Receiver().Containers[0]
	got := overlaytest.UDPMost(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 1000)
	st1, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	b, a := st0[stage], st1[stage]
	if a.MicroFrames != b.MicroFrames || a.Elephants != b.Elephants || a.Stayed-b.Stayed < uint64(got) {
		t.Errorf("mouse of %d datagrams: %s counters went from %+v to %+v; want it left in place, nothing split", got, steer.StageName(stage), b, a)
	}
}

// elephantResult is what the receiving socket saw of the elephant.
type elephantResult struct {
	Sent      uint64
	Received  int
	Reordered int         // arrivals below the highest sequence number so far
	ByCore    map[int]int // SO_INCOMING_CPU after each read
	Src, Dst  netip.AddrPort
	// Displaced are the first arrivals below the highest so far, for
	// the log: where in the stream an overtake happened and which core
	// the socket said queued the datagrams around it.
	Displaced []displaced
}

// displaced is one arrival below the highest sequence number so far.
type displaced struct {
	Seq, Highest uint64
	Read         int // reads before it
	CPU, PrevCPU int // SO_INCOMING_CPU after this read and after the one before (-1: unknown)
}

func (d displaced) String() string {
	return fmt.Sprintf("#%d %d after %d (%d behind), socket core %d after %d", d.Read, d.Seq, d.Highest, d.Highest-d.Seq, d.CPU, d.PrevCPU)
}

// sendElephant sends the elephant from the sender's underlay to a socket
// in the receiver's first container and reads it there. The socket is
// connected to the flow's source, so the kernel updates its
// SO_INCOMING_CPU (the core that queued the latest datagram, i.e. ran the
// flow's socket delivery) on every datagram; it is read after each one.
func sendElephant(t *testing.T, tb *testbed.Testbed) elephantResult {
	t.Helper()
	return sendElephantAt(t, tb, elephantRate, 0.9)
}

// sendElephantAt is sendElephant at rate packets/s, failing t unless at
// least share of the datagrams arrive.
func sendElephantAt(t *testing.T, tb *testbed.Testbed, rate float64, share float64) elephantResult {
	t.Helper()
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	rc, sc := overlaytest.UDPPair(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 8<<20)
	sc.Close()
	defer rc.Close()
	res := elephantResult{
		ByCore: map[int]int{},
		Src:    netip.AddrPortFrom(src.Addr.Addr(), genSrcPort),
		Dst:    netip.AddrPortFrom(dst.Addr.Addr(), uint16(rc.LocalAddr().(*net.UDPAddr).Port)),
	}
	raw, err := rc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cerr error
	raw.Control(func(fd uintptr) {
		cerr = unix.Connect(int(fd), &unix.SockaddrInet4{Addr: res.Src.Addr().As4(), Port: genSrcPort})
	})
	if cerr != nil {
		t.Fatalf("connecting the receiver to %v: %v", res.Src, cerr)
	}
	g, err := stress.NewGenerator(stress.Target{
		SenderNetNS: s.NetNS, SenderDev: s.Underlay, SrcMAC: s.UnderlayMAC, DstMAC: r.UnderlayMAC,
		SrcIP: s.UnderlayAddr.Addr(), DstIP: r.UnderlayAddr.Addr(), VNI: tb.Config.VNI,
		InnerSrcMAC: src.MAC, InnerDstMAC: dst.MAC, InnerSrcIP: src.Addr.Addr(), InnerDstIP: dst.Addr.Addr(),
	}, stress.GenConfig{CPU: 0, Yield: true, Rate: rate, SrcPort: genSrcPort, DstPort: res.Dst.Port()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	var sending atomic.Bool
	sending.Store(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		res.read(rc, raw, &sending)
	}()
	gs, err := g.Run(context.Background(), elephantTime)
	sending.Store(false)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	res.Sent = gs.Sent
	if float64(res.Received) < float64(res.Sent)*share {
		t.Fatalf("elephant: %d of %d datagrams arrived", res.Received, res.Sent)
	}
	return res
}

// read takes datagrams until the sender has stopped and nothing came for
// 300 ms.
func (res *elephantResult) read(rc *net.UDPConn, raw syscall.RawConn, sending *atomic.Bool) {
	buf := make([]byte, 2048)
	var highest uint64
	prevCPU := -1
	for {
		rc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := rc.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && sending.Load() {
			continue
		}
		if err != nil {
			return
		}
		if n < 8 {
			continue
		}
		res.Received++
		cpu := -1
		raw.Control(func(fd uintptr) {
			if c, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_INCOMING_CPU); err == nil {
				cpu = c
				res.ByCore[c]++
			}
		})
		if seq := binary.BigEndian.Uint64(buf); res.Received > 1 && seq < highest {
			res.Reordered++
			if len(res.Displaced) < maxDisplaced {
				res.Displaced = append(res.Displaced, displaced{Seq: seq, Highest: highest, Read: res.Received - 1, CPU: cpu, PrevCPU: prevCPU})
			}
		} else {
			highest = seq
		}
		prevCPU = cpu
	}
}

// maxDisplaced is how many displaced arrivals a result keeps for the log.
const maxDisplaced = 8

// bothCoresDeliver: the receiving socket saw datagrams queued by each
// core, a tenth of them at least (micro-flows alternate between the two).
func bothCoresDeliver(t *testing.T, res elephantResult) {
	t.Helper()
	for _, c := range []int{0, 1} {
		if res.ByCore[c]*10 < res.Received {
			t.Errorf("SO_INCOMING_CPU was core %d after %d of %d reads: want micro-flows delivered by both cores", c, res.ByCore[c], res.Received)
		}
	}
}

// elephantFlow is the elephant's flow state at a stage.
func elephantFlow(t *testing.T, dp *steer.Datapath, res elephantResult, stage int) steer.Flow {
	t.Helper()
	flows, err := dp.Flows()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Stage == stage && f.Proto == unix.IPPROTO_UDP && f.Src == res.Src.Addr() && f.SrcPort == res.Src.Port() &&
			f.Dst == res.Dst.Addr() && f.DstPort == res.Dst.Port() {
			return f
		}
	}
	t.Fatalf("no %s-stage state for the elephant %v -> %v", steer.StageName(stage), res.Src, res.Dst)
	return steer.Flow{}
}

// waitLastSeen waits until the skb side (tc ingress on the underlay) has
// read back the elephant's last micro-flow, or, where a queue on the way
// dropped that micro-flow's last frames, until what it read back stops
// changing for half a second: the split's drops are not what the callers
// test.
func waitLastSeen(t *testing.T, read func() steer.MicroFlowState) {
	t.Helper()
	last, since := read(), time.Now()
	waitFor(t, "the last micro-flow to reach tc ingress, or the skb side to settle", func() bool {
		m := read()
		if m.SeenAny && m.Seen == m.Started-1 {
			return true
		}
		if m != last {
			last, since = m, time.Now()
		}
		return m.SeenAny && time.Since(since) > 500*time.Millisecond
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5s for %s", what)
		}
	}
}

// progID is the kernel's id of a program.
func progID(t *testing.T, p *ebpf.Program) uint32 {
	t.Helper()
	var id ebpf.ProgramID
	info, err := p.Info()
	if err == nil {
		var ok bool
		if id, ok = info.ID(); !ok {
			err = errors.New("the kernel reports no program ids")
		}
	}
	if err != nil {
		t.Fatalf("id of %s: %v", p, err)
	}
	return uint32(id)
}
