package mflow_test

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/reorder"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/mflow"
	"github.com/lanesnet/lanes/testbed"
)

// tagProbe counts, on tc egress of a device, the frames whose
// skb->priority is a micro-flow tag, and keeps the last tag: it sits
// where the reassembler sits (before the root qdisc), so it sees what the
// reassembler would.
type tagProbe struct {
	count *ebpf.Map // per-CPU
	last  *ebpf.Map
}

// skbPriorityOffset is priority's offset in struct __sk_buff: after len,
// pkt_type, mark, queue_mapping, protocol, vlan_present, vlan_tci,
// vlan_proto.
const skbPriorityOffset = 32

func newTagProbe(t *testing.T, ns, dev string) *tagProbe {
	t.Helper()
	p := &tagProbe{count: modetest.PerCPUCounter(t)}
	var err error
	p.last, err = ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.last.Close() })
	insns := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, skbPriorityOffset, asm.Word),
		asm.Mov.Reg32(asm.R2, asm.R6),
		asm.And.Imm32(asm.R2, -0x20000000),         // 0xe0000000
		asm.JNE.Imm32(asm.R2, -0x60000000, "pass"), // 0xa0000000
		// last = priority
		asm.StoreImm(asm.R10, -4, 0, asm.Word),
		asm.StoreMem(asm.R10, -8, asm.R6, asm.Word),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -4),
		asm.Mov.Reg(asm.R3, asm.R10),
		asm.Add.Imm(asm.R3, -8),
		asm.LoadMapPtr(asm.R1, p.last.FD()),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnMapUpdateElem.Call(),
	}
	insns = append(insns, modetest.IncCounter(p.count, "pass")...)
	insns = append(insns,
		asm.Mov.Imm(asm.R0, -1).WithSymbol("pass"), // TCX_NEXT
		asm.Return(),
	)
	modetest.AttachTCX(t, ns, dev, "tag_probe", insns, ebpf.AttachTCXEgress, nil)
	return p
}

func (p *tagProbe) read(t *testing.T) (n uint64, last uint32) {
	t.Helper()
	if err := p.last.Lookup(uint32(0), &last); err != nil {
		t.Fatal(err)
	}
	return modetest.SumPerCPU(t, p.count), last
}

// TestTagReachesVeth: the micro-flow tag the split writes into
// skb->priority at the underlay's tc ingress arrives at the container's
// host-side veth, past VXLAN decap and the bridge, where the reassembler
// reads it: on the elephant's frames, with the flow's hash bits and the
// micro-flow numbers the datapath counted; never on a mouse's. Runs on
// any kernel (no reassembler involved).
func TestTagReachesVeth(t *testing.T) {
	modetest.Online(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	r := tb.Receiver()
	a := modetest.Apply(t, tb, "mflow", map[string]string{"reorder": "off"})
	dp := a.Open(t)
	probe := newTagProbe(t, r.NetNS, r.Containers[0].HostVeth)

	mouseKeepsItsPath(t, tb, dp, steer.StageSplit)
	if n, last := probe.read(t); n != 0 {
		t.Errorf("the mouse's frames reached %s tagged (%d, last %#x)", r.Containers[0].HostVeth, n, last)
	}
	// What the receiver drops (a slow guest) is not the question here.
	res := sendElephantAt(t, tb, elephantRate, 0.3)
	waitLastSeen(t, func() steer.MicroFlowState { return elephantFlow(t, dp, res, steer.StageSplit).MicroFlow })
	mf := elephantFlow(t, dp, res, steer.StageSplit).MicroFlow
	n, last := probe.read(t)
	flow, seq, ok := reorder.Tagged(last)
	want := steer.FlowHash(res.Src.Addr(), res.Dst.Addr(), res.Src.Port(), res.Dst.Port(), unix.IPPROTO_UDP) & 0x7ff
	t.Logf("elephant: %d datagrams received, %d micro-flows of %d frames; at %s: %d frames tagged, last tag %#x (flow %#x, micro-flow %d)",
		res.Received, mf.Started, mf.Frames, r.Containers[0].HostVeth, n, last, flow, seq)
	if !ok || flow != want {
		t.Errorf("last tag %#x: want the flow bits %#x", last, want)
	}
	// The last frame through the veth is from one of the last micro-flows
	// (two cores: the last or the one before).
	if end := mf.Started - 1; seq > end&0xffff || seq+2 < end&0xffff {
		t.Errorf("last tag's micro-flow %d, want one of the last ones (%d started)", seq, mf.Started)
	}
	// Every split frame, less what a queue on the way may drop; the
	// frames before the flow became an elephant are not split.
	if n*10 < mf.Frames*9 || n > mf.Frames {
		t.Errorf("%d frames tagged at the veth, %d split: want the split frames tagged", n, mf.Frames)
	}
}

// requireReorder skips t on a kernel without the BPF qdisc (this host),
// saying why; it runs in a guest of scripts/vm.
func requireReorder(t *testing.T) {
	t.Helper()
	if err := reorder.Supported(); err != nil {
		t.Skip(err)
	}
}

// qdiscs is the root qdisc of every device of the testbed's hosts and
// containers: the part of a snapshot the reassembler changes, which
// modetest.Snapshot does not read.
func qdiscs(t *testing.T, tb *testbed.Testbed) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, h := range tb.Hosts {
		devs := map[string][]string{h.NetNS: {h.Underlay, h.VXLAN}}
		if h.Bridge != "" {
			devs[h.NetNS] = append(devs[h.NetNS], h.Bridge)
		}
		for _, c := range h.Containers {
			devs[h.NetNS] = append(devs[h.NetNS], c.HostVeth)
			devs[c.NetNS] = append(devs[c.NetNS], c.Veth)
		}
		for ns, names := range devs {
			for _, d := range names {
				r, err := reorder.RootQdisc(ns, d)
				if err != nil {
					t.Fatal(err)
				}
				out["qdisc:"+ns+":"+d] = r.String()
			}
		}
	}
	return out
}

// TestReassemblyApplyReset: on a kernel with the BPF qdisc, mflow puts the
// reassembler at the root of each container's host-side veth of the
// receiver, RPS on each container-side veth onto one core, and says so;
// reset removes the qdisc and its pins and restores every knob byte for
// byte, also after a crash (a journal left by a killed apply).
func TestReassemblyApplyReset(t *testing.T) {
	modetest.Online(t)
	requireReorder(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	r := tb.Receiver()
	before, qBefore := modetest.Snapshot(t, tb), qdiscs(t, tb)
	a := modetest.Apply(t, tb, "mflow", map[string]string{"batch": "16"})
	if !slices.ContainsFunc(a.State.Plan.Notes, func(n string) bool { return strings.Contains(n, "reassembly at the root of 2 container veths") }) {
		t.Errorf("plan notes %q: want the reassembly on both containers", a.State.Plan.Notes)
	}
	for i, c := range r.Containers {
		kind := reorder.Kind(r.NetNS, c.HostVeth)
		if root, err := reorder.RootQdisc(r.NetNS, c.HostVeth); err != nil || root.Kind != kind {
			t.Errorf("root qdisc of %s: %v (%v), want %s", c.HostVeth, root, err, kind)
		}
		if !reorder.Present(mflow.ReorderDir(r.NetNS, c.HostVeth)) {
			t.Errorf("no reassembler pinned for %s", c.HostVeth)
		}
		rps, err := knobs.Sysfs(c.NetNS, "/sys/class/net/"+c.Veth+"/queues/rx-0/rps_cpus").Read()
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%x", 1<<(i%2)); strings.TrimLeft(strings.TrimSpace(string(rps)), "0,") != want {
			t.Errorf("rps_cpus of %s in %s: %q, want core %d alone", c.Veth, c.NetNS, rps, i%2)
		}
	}
	st, err := control.Status(control.StatusOptions{NetNS: a.NS, StateDir: a.StateDir, Sample: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != "mflow" {
		t.Errorf("status mode %q", st.Mode)
	}
	rs, err := mflow.ReorderStatus(a.NS)
	if err != nil || len(rs) != len(r.Containers) {
		t.Errorf("reassembler status %+v (%v): want one per container", rs, err)
	}
	a.ResetAndCheck(t, before)
	modetest.SameSnapshot(t, "root qdiscs after reset", qdiscs(t, tb), qBefore)
	for _, c := range r.Containers {
		if modetest.Exists(mflow.ReorderDir(r.NetNS, c.HostVeth)) {
			t.Errorf("reassembler pins of %s left after reset", c.HostVeth)
		}
	}
	overlaytest.UDPMost(t, tb.Sender().Containers[0].NetNS, r.Containers[0].NetNS, r.Containers[0].Addr.Addr(), 1000)
}

// The reassembly tests' elephant: 3000 packets/s (an elephant from 1000),
// which a guest under TCG receives; the watchdog waits 500 ms, as a
// TCG vCPU can stall for tens of milliseconds without any frame lost.
const (
	slowElephantRate = 3000
	slowThreshold    = "1000"
	slowTimeout      = "500ms"
)

// reassembled applies mflow with a small batch (many micro-flow
// boundaries to reorder at: a quarter of the default) over both cores,
// the reassembler on or off.
func reassembled(t *testing.T, tb *testbed.Testbed, on bool, extra map[string]string) *modetest.Applied {
	t.Helper()
	params := map[string]string{"batch": "64", "reorder": map[bool]string{true: "on", false: "off"}[on],
		"threshold": slowThreshold, "reorder-timeout": slowTimeout}
	if on {
		// The qdisc counts what it lets out behind a later micro-flow
		// (selfCheck tells the qdisc's own disorder from what follows).
		params["x-reorder-check"] = "true"
	}
	for k, v := range extra {
		params[k] = v
	}
	return modetest.Apply(t, tb, "mflow", params)
}

// selfCheck fails t where the qdisc let out more frames behind a later
// micro-flow of their flow than it passed late or unordered (collisions):
// disorder of the qdisc's own, which its merge rule forbids.
func selfCheck(t *testing.T, st reorder.Stats) {
	t.Helper()
	if st.Backward > st.Late+st.Collisions {
		t.Errorf("qdisc %+v: %d frames let out behind a later micro-flow of their flow, more than the %d late and %d unordered ones: the qdisc's own disorder", st, st.Backward, st.Late, st.Collisions)
	}
}

// veth0Stats is the reassembler's counters on the first container's veth.
func veth0Stats(t *testing.T, a *modetest.Applied) reorder.Stats {
	t.Helper()
	rs, err := mflow.ReorderStatus(a.NS)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range rs {
		if d.Device == a.TB.Receiver().Containers[0].HostVeth {
			return d.Stats
		}
	}
	t.Fatalf("no reassembler on %s: %+v", a.TB.Receiver().Containers[0].HostVeth, rs)
	return reorder.Stats{}
}

// TestReassemblyUDP: an elephant UDP stream split into micro-flows of 64
// frames over both cores reaches the receiving socket through the
// reassembler in order, the reassembler having held frames to get there;
// the same stream without it arrives out of order (else the test proves
// nothing). Counts only: the guest runs under TCG.
func TestReassemblyUDP(t *testing.T) {
	modetest.Online(t)
	requireReorder(t)
	without := 0
	for _, on := range []bool{false, true} {
		t.Run(map[bool]string{true: "reassembled", false: "without"}[on], func(t *testing.T) {
			tb := modetest.UpTestbed(t, testbed.Docker)
			a := reassembled(t, tb, on, nil)
			res := sendElephantAt(t, tb, slowElephantRate, 0.5)
			if !on {
				t.Logf("without reassembly: %d of %d datagrams, %d out of order", res.Received, res.Sent, res.Reordered)
				without = res.Reordered
				if res.Reordered == 0 {
					t.Errorf("no datagram out of order without the reassembler: the test proves nothing")
				}
				return
			}
			st := veth0Stats(t, a)
			t.Logf("reassembled: %d of %d datagrams, %d out of order, socket cores %v; qdisc %+v", res.Received, res.Sent, res.Reordered, res.ByCore, st)
			if res.Reordered != 0 {
				t.Errorf("%d datagrams out of order through the reassembler (%d without it); qdisc gaps %d, late %d, overflows %d; socket cores %v; %v", res.Reordered, without, st.Gaps, st.Late, st.Overflows, res.ByCore, res.Displaced)
			}
			if st.Held == 0 || st.HeldNow != 0 || st.Released+st.Overflows == 0 {
				t.Errorf("qdisc %+v: want frames held, then released, nothing left", st)
			}
			selfCheck(t, st)
		})
	}
}

// vxlanHeaders are the outer headers of a VXLAN frame over IPv4 before
// its inner Ethernet header: Ethernet, IPv4, UDP, VXLAN.
const vxlanHeaders = 14 + 20 + 8 + 8

// lossyTries is how many streams TestReassemblyTCP runs to get one without
// a loss.
const lossyTries = 4

// TestReassemblyTCP: a TCP stream split into micro-flows of 64 frames
// (every flow split: threshold 0) over both cores: without the reassembler
// the receiver's TCP counts thousands of out-of-order segments; through it,
// in a stream that lost nothing and left the sending host in order, none
// (up to lossyTries streams are run to get one; none such fails the test).
// The probes log where segments fell behind, to tell the qdisc's doing
// from what comes before or after it.
func TestReassemblyTCP(t *testing.T) {
	modetest.Online(t)
	requireReorder(t)
	var without uint32
	for _, on := range []bool{false, true} {
		t.Run(map[bool]string{true: "reassembled", false: "without"}[on], func(t *testing.T) {
			tb := modetest.UpTestbed(t, testbed.Docker)
			a := reassembled(t, tb, on, map[string]string{"threshold": "0"})
			src, dst := tb.Sender().Containers[0], tb.Receiver().Containers[0]
			overlaytest.Warm(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
			// The writer on the core where the sending host takes the
			// ACKs, so the stream leaves that host in order: what
			// reaches the receiver out of order is the split's doing.
			stream := overlaytest.TCPStream{Rate: 200e6, Duration: 2 * time.Second, Pin: true, CPU: tb.Config.PollCPU(0)}
			probe := newSeqProbe(t, dst.NetNS, dst.Veth, ebpf.AttachTCXIngress)
			// Where segments enter the qdisc (tc egress runs before it,
			// on the core that transmits): an order already broken there
			// is not the qdisc's doing.
			enq := newSeqProbe(t, tb.Receiver().NetNS, dst.HostVeth, ebpf.AttachTCXEgress)
			gro := newMetaProbe(t, tb.Receiver().NetNS, tb.Receiver().VXLAN)
			xmit := newXmitProbe(t, tb.Receiver().NetNS, dst.HostVeth, 0)
			// Where the stream leaves the sending host: what that host
			// sent out of order, before any split.
			wire := newXmitProbe(t, tb.Sender().NetNS, tb.Sender().Underlay, vxlanHeaders)
			res := stream.Run(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
			if !on {
				t.Logf("without reassembly: %+v; segments behind one seen before: %s, %s, %s, %s", res, wire.says(t, "leaving the sending host"), enq.says(t, "at "+dst.HostVeth+"'s tc egress"), xmit.says(t, "at "+dst.HostVeth+"'s transmit"), probe.says(t, "at "+dst.Veth+"'s ingress"))
				without = res.OutOfOrder
				if res.OutOfOrder == 0 {
					t.Errorf("the receiver saw no out-of-order segment without the reassembler: the test proves nothing")
				}
				return
			}
			// TCP counts as out of order every segment that comes
			// after a hole, and a hole is also a loss (a guest under
			// TCG drops now and then, before the split or after the
			// reassembler): only a stream without a retransmission
			// says whether the reassembler delivered in order. Nor
			// does one the sending host already sent out of order
			// (its underlay's probe saw a segment behind: a writer's
			// segment and one from the ACK's softirq on two cores'
			// backlogs), which no receiver can undo. Such a stream
			// is run again, a few times.
			sentOutOfOrder := func() bool { return wire != nil && wire.read(t).regressions() != 0 }
			for try := 1; (res.Retrans != 0 || sentOutOfOrder()) && try < lossyTries; try++ {
				t.Logf("reassembled, try %d: %+v, %s: a loss, or sent out of order, so its out-of-order count says nothing; again", try, res, wire.says(t, "leaving the sending host"))
				probe.reset(t)
				enq.reset(t)
				for _, p := range []*seqProbe{xmit, wire} {
					if p != nil {
						p.reset(t)
					}
				}
				res = stream.Run(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
			}
			st := veth0Stats(t, a)
			t.Logf("reassembled: %+v; qdisc %+v; segments behind one seen before: %s, %s, %s, %s; %s",
				res, st, wire.says(t, "leaving the sending host"), enq.says(t, "entering the qdisc ("+dst.HostVeth+"'s tc egress)"), xmit.says(t, "leaving it ("+dst.HostVeth+"'s transmit)"), probe.says(t, "past it ("+dst.Veth+"'s ingress)"), gro.says(t, tb.Receiver().VXLAN))
			switch {
			case res.Retrans != 0 || sentOutOfOrder():
				t.Errorf("every one of %d streams lost a segment or left the sending host out of order: none says whether the reassembler kept order", lossyTries)
			case res.OutOfOrder != 0:
				t.Errorf("the receiver's TCP saw %d out-of-order segments through the reassembler, with no loss (%d without it)", res.OutOfOrder, without)
			}
			if st.Held == 0 {
				t.Errorf("qdisc %+v: want frames held", st)
			}
			selfCheck(t, st)
		})
	}
}

const (
	crashEnvNetNS = "LANES_MFLOW_CRASH_NETNS"
	crashEnvDir   = "LANES_MFLOW_CRASH_DIR"
)

// TestReassemblyCrashHelper is the child of TestReassemblyKilled: it
// applies mflow with the reassembler and SIGKILLs itself, holding every
// link and map lanes opened.
func TestReassemblyCrashHelper(t *testing.T) {
	ns := os.Getenv(crashEnvNetNS)
	if ns == "" {
		t.Skip("helper process for TestReassemblyKilled")
	}
	if _, err := control.Apply(control.Options{Mode: "mflow", NetNS: ns, StateDir: os.Getenv(crashEnvDir), Params: map[string]string{"batch": "16"}}); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// TestReassemblyKilled: lanes killed (SIGKILL) with the reassembler
// applied leaves it running from its pins; a reset from a new process
// removes the qdisc, its pins and every other knob, byte for byte.
func TestReassemblyKilled(t *testing.T) {
	modetest.Online(t)
	requireReorder(t)
	tb := modetest.UpTestbed(t, testbed.Docker)
	r := tb.Receiver()
	before, qBefore := modetest.Snapshot(t, tb), qdiscs(t, tb)
	stateDir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestReassemblyCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnvNetNS+"="+r.NetNS, crashEnvDir+"="+stateDir)
	out, err := cmd.CombinedOutput()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		control.Reset(r.NetNS, stateDir)
		t.Fatalf("helper did not die by SIGKILL: %v\n%s", err, out)
	}
	kind := reorder.Kind(r.NetNS, r.Containers[0].HostVeth)
	if root, err := reorder.RootQdisc(r.NetNS, r.Containers[0].HostVeth); err != nil || root.Kind != kind {
		t.Errorf("after the kill: root qdisc %v (%v), want the reassembler %s still running", root, err, kind)
	}
	// It still reassembles: the pinned link keeps its kind.
	overlaytest.UDPMost(t, tb.Sender().Containers[0].NetNS, r.Containers[0].NetNS, r.Containers[0].Addr.Addr(), 1000)
	res, err := control.Reset(r.NetNS, stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if res.Nothing {
		t.Errorf("reset after the kill found nothing to restore")
	}
	modetest.SameSnapshot(t, "after reset of a killed apply", modetest.Snapshot(t, tb), before)
	modetest.SameSnapshot(t, "root qdiscs after reset of a killed apply", qdiscs(t, tb), qBefore)
	if modetest.Exists(plan.PinDir(r.NetNS)) {
		t.Errorf("pin directory %s left after reset", plan.PinDir(r.NetNS))
	}
	modetest.NoState(t, stateDir)
}
